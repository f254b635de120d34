"""companion.families' RoPE/NoPE hybrids against Hugging Face transformers (the oracle):
SmolLM3 (NoPE where ``no_rope_layers`` is 0, every 4th layer by default) and Cohere2
(Command R7B / Command A: interleaved RoPE in the sliding layers, none in the full
ones, a parallel block from one bias-free LayerNorm, scaled logits), on small random
configs (no download).

As the other families (tests/test_decoder_modern.py, whose helpers these reuse): logits
within 1e-4 (float32) on 24 tokens (almost five windows of 5), 20 greedy KV-cache tokens
identical to Hugging Face's ``generate`` for one prompt and for a left-padded batch of
prompts of lengths 12, 7 and 3, and with an EOS token the same tokens up to each row's
EOS; the rolling cache decodes past the window as the full forward; in bfloat16 the
copy stays within twice Hugging Face's own bfloat16-float32 distance. The NoPE layers
skip RoPE (a layer's output with no causal mask is equivariant under a permutation of
its tokens, a RoPE layer's is not; Hugging Face's own per-layer switch agrees), and a
copy that ignores the NoPE layers or Cohere's pairing moves the logits, so the
comparison can fail. Bad specs raise naming the field.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

pytest.importorskip("transformers")

import transformers
from test_decoder import NEW, PROMPT, TOL, randomize, tokens
from test_decoder_modern import (
    BASE,
    WINDOW,
    assert_padded_batch_with_eos_matches,
    hf_generate,
    hf_logits,
    left_padded,
)

from companion import _architecture, decoder, families
from companion.decoder import DecoderSpec, from_hf, generate

transformers.logging.set_verbosity_error()

T = transformers
FOUR = {**BASE, "num_hidden_layers": 4}  # one NoPE/global layer in the default pattern

HYBRIDS = {
    "smollm3": (  # NoPE: layer 3 (Hugging Face's default pattern)
        T.SmolLM3ForCausalLM,
        T.SmolLM3Config(**FOUR, tie_word_embeddings=False),  # tied: greedy repeats
    ),
    "smollm3-sliding-untied": (  # NoPE layers 0 and 2 slide (Hugging Face's rule)
        T.SmolLM3ForCausalLM,
        T.SmolLM3Config(
            **FOUR,
            no_rope_layers=[0, 1, 0, 1],
            use_sliding_window=True,
            sliding_window=WINDOW,
            tie_word_embeddings=False,
        ),
    ),
    "cohere2": (  # layers 0-2 slide with RoPE, layer 3 is global NoPE
        T.Cohere2ForCausalLM,
        T.Cohere2Config(
            **FOUR, sliding_window=WINDOW, logit_scale=0.25, tie_word_embeddings=False
        ),
    ),
    "cohere2-bias-tied": (  # Cohere's default: tied embeddings
        T.Cohere2ForCausalLM,
        T.Cohere2Config(
            **FOUR,
            sliding_window=WINDOW,
            logit_scale=0.5,
            attention_bias=True,
            layer_types=["full_attention", "sliding_attention"] * 2,
        ),
    ),
}
SLIDING = ["smollm3-sliding-untied", "cohere2", "cohere2-bias-tied"]
# tied embeddings echo the input token: greedy decoding repeats one or two tokens per
# row; their tokens are compared, and the untied variants carry the varied ones
REPEATING = ("cohere2-bias-tied",)


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


def build(name: str, seed: int = 0) -> torch.nn.Module:
    cls, cfg = HYBRIDS[name]
    torch.manual_seed(seed)
    return randomize(cls(copy.deepcopy(cfg)), seed)


def hf_nope_layers(hf: torch.nn.Module) -> tuple[int, ...]:
    """The layers Hugging Face's attention does not rotate, read from its modules:
    SmolLM3's ``use_rope`` flag, Cohere2's RoPE only where ``sliding_window`` is set."""
    out = []
    for i, layer in enumerate(hf.model.layers):
        a = layer.self_attn
        rotates = a.use_rope if hasattr(a, "use_rope") else a.sliding_window is not None
        if not rotates:
            out.append(i)
    return tuple(out)


# ---- the registry entries ------------------------------------------------------------


def test_both_hybrids_are_found_without_a_port() -> None:
    assert set(families.HYBRID_PORTS) == {"SmolLM3ForCausalLM", "Cohere2ForCausalLM"}
    assert not set(families.HYBRID_PORTS) & set(decoder.PORTS)
    for port in families.HYBRID_PORTS.values():  # Llama's weight layout, no loader
        assert port.load is families.load_llama and port.block is decoder.DecoderBlock


@pytest.mark.parametrize("name", list(HYBRIDS))
def test_the_nope_layers_are_hugging_faces(name: str) -> None:
    hf = build(name)
    spec = from_hf(hf).spec
    assert spec.nope_layers == hf_nope_layers(hf)
    expected = {
        "smollm3": (3,),  # HF's default: (i + 1) % 4 == 0 is NoPE
        "smollm3-sliding-untied": (0, 2),
        "cohere2": (3,),
        "cohere2-bias-tied": (0, 2),
    }[name]
    assert spec.nope_layers == expected


def test_cohere2_reads_its_block() -> None:
    spec = from_hf(build("cohere2-bias-tied")).spec
    assert (spec.norm, spec.layer_norm_bias, spec.shared_norm) == ("layer", False, True)
    assert spec.parallel_residual and spec.rope_layout == "interleaved"
    assert spec.logit_scale == 0.5 and spec.tied_embeddings and spec.qkv_bias
    assert spec.sliding_window == WINDOW
    blocks = from_hf(build("cohere2")).blocks
    assert all(b.norm2 is None and b.norm1.bias is None for b in blocks)


# ---- the oracle: logits and greedy tokens --------------------------------------------


@pytest.mark.parametrize("name", list(HYBRIDS))
def test_logits_match_hugging_face(name: str) -> None:
    hf = build(name)
    ids = tokens(2, 24)  # almost five windows of 5
    expected = hf_logits(hf, ids)
    got = from_hf(hf)(ids)
    assert expected.abs().max() > 1.0
    torch.testing.assert_close(got, expected, atol=TOL, rtol=0)


@pytest.mark.parametrize("name", list(HYBRIDS))
def test_left_padded_batch_logits_match_on_the_real_tokens(name: str) -> None:
    hf = build(name)
    ids, mask = left_padded([14, 9, 3], 14)
    expected = hf_logits(hf, ids, mask)
    got = from_hf(hf)(ids, attention_mask=mask)
    real = mask.bool()
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got[real], expected[real], atol=TOL, rtol=0)


@pytest.mark.parametrize("name", list(HYBRIDS))
def test_greedy_tokens_of_one_prompt_match_hugging_face(name: str) -> None:
    ids = tokens(1, PROMPT, seed=2)
    expected = hf_generate(build(name), ids, torch.ones_like(ids))
    got = generate(from_hf(build(name)), ids, NEW)
    assert torch.equal(got, expected)
    if name not in REPEATING:  # varied tokens: a wrong cache would show
        assert len(set(got[0, PROMPT:].tolist())) >= 4


@pytest.mark.parametrize("name", list(HYBRIDS))
def test_greedy_tokens_of_a_left_padded_batch_match_hugging_face(name: str) -> None:
    ids, mask = left_padded([PROMPT, 7, 3], PROMPT, seed=3)
    expected = hf_generate(build(name), ids, mask)
    got = generate(from_hf(build(name)), ids, NEW, attention_mask=mask)
    assert got.shape == (3, PROMPT + NEW)
    assert torch.equal(got, expected)
    if name not in REPEATING:
        assert max(len(set(row.tolist())) for row in got[:, PROMPT:]) >= 4


@pytest.mark.parametrize("name", list(HYBRIDS))
def test_a_padded_batch_with_eos_matches_up_to_each_rows_eos(name: str) -> None:
    assert_padded_batch_with_eos_matches(build, name)


@pytest.mark.parametrize("name", list(HYBRIDS))
def test_bfloat16_copy_is_as_close_to_hugging_face_as_its_rounding(name: str) -> None:
    # as tests/test_decoder.py's: within twice the distance between Hugging Face's
    # bfloat16 and float32 logits (Cohere2 rotates in float32, the copy in bfloat16)
    hf = build(name).to(torch.bfloat16)
    ids = tokens(2, 24)
    with torch.no_grad():
        expected = hf(ids).logits.float()
        got = from_hf(hf)(ids)
        exact = from_hf(build(name))(ids)
    assert got.dtype == torch.bfloat16
    rounding = (expected - exact).abs().max()
    assert (got.float() - expected).abs().max() <= 2 * rounding


@pytest.mark.parametrize("name", SLIDING)
def test_rolling_cache_decodes_past_the_window_as_the_full_forward(name: str) -> None:
    ours = from_hf(build(name))
    ids = tokens(2, 23, seed=4)
    full = ours(ids)
    with torch.no_grad():
        logits, past = ours.decode(ids[:, :11])
        parts = [logits]
        for start, stop in ((11, 12), (12, 15), (15, 23)):
            logits, past = ours.decode(ids[:, start:stop], past)
            parts.append(logits)
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=TOL, rtol=0)
    windows = [b.window for b in ours.blocks]
    assert [c[0].shape[2] for c in past] == [WINDOW - 1 if w else 23 for w in windows]


# ---- the NoPE layers really skip RoPE ------------------------------------------------


def _permuted_gap(block, rope, n: int = 10) -> float:
    """How far ``block``'s attention, with every key visible, is from permutation
    equivariance: ``max |attn(x[p]) - attn(x)[p]|`` for a fixed permutation ``p``."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(1, n, block.spec.hidden_size, generator=gen)
    perm = torch.randperm(n, generator=gen)
    mask = torch.zeros(1, 1, n, n)  # no causal mask: attention sees a set of tokens
    with torch.no_grad():
        out = block.attention(x, rope, mask, None)[0]
        moved = block.attention(x[:, perm], rope, mask, None)[0]
    return (moved - out[:, perm]).abs().max().item()


@pytest.mark.parametrize("name", ["smollm3", "cohere2"])
def test_a_nope_layer_sees_no_positions_and_a_rope_layer_does(name: str) -> None:
    ours = from_hf(build(name))
    s = ours.spec
    positions = torch.arange(10)[None]
    rope = _architecture._rope_table(s, s.rope, positions, 10, torch.float32)
    nope, turning = s.nope_layers[0], 0  # layer 0 rotates in both configs
    assert turning not in s.nope_layers
    assert _permuted_gap(ours.blocks[nope], rope) < 1e-5  # a set: order invisible
    assert _permuted_gap(ours.blocks[turning], rope) > 100 * TOL


@pytest.mark.parametrize(
    ("name", "change"),
    [
        ("smollm3", dict(nope_layers=())),  # every layer rotated
        ("cohere2", dict(nope_layers=())),
        ("cohere2", dict(rope_layout="half")),  # Llama's pairs, not Cohere's
        ("cohere2", dict(logit_scale=1.0)),
    ],
)
def test_a_wrong_spec_moves_the_logits(name: str, change: dict) -> None:
    hf = build(name)
    right = from_hf(hf)
    wrong = decoder.Decoder(dataclasses.replace(right.spec, **change))
    wrong.load_state_dict(right.state_dict())
    ids = tokens(1, 16)
    with torch.no_grad():
        assert (wrong(ids) - hf_logits(hf, ids)).abs().max() > 100 * TOL


# ---- bad specs and configs -----------------------------------------------------------

_SPEC: list[DecoderSpec] = []


def _spec(**changes: object) -> DecoderSpec:
    if not _SPEC:
        _SPEC.append(from_hf(build("cohere2")).spec)
    return dataclasses.replace(_SPEC[0], **changes)


BAD_SPECS = [
    (dict(nope_layers=(4,)), ValueError, r"^nope_layers\[0\] must be .*<= 3.*got 4"),
    (dict(nope_layers=(2, 1)), ValueError, r"^nope_layers must be increasing"),
    (dict(nope_layers=(1, 1)), ValueError, r"^nope_layers must be increasing"),
    (dict(nope_layers=3), TypeError, r"^nope_layers must be a tuple or list"),
    (dict(nope_layers=(1.0,)), TypeError, r"^nope_layers\[0\] must be an int"),
    (
        dict(positions="alibi", rotary_dim=0, rope={}, nope_layers=(1,)),
        ValueError,
        r"^nope_layers must be empty with positions 'alibi'",
    ),
    (dict(rope_layout="complex"), ValueError, r"^rope_layout must be one of"),
    (
        dict(parallel_residual=False),
        ValueError,
        r"^shared_norm must be False when parallel_residual is False",
    ),
    (dict(shared_norm=1), TypeError, r"^shared_norm must be a bool"),
    (
        dict(norm="rms", layer_norm_bias=False, shared_norm=False),
        ValueError,
        r"^layer_norm_bias must be True with norm 'rms'",
    ),
    (
        dict(logit_scale=0.0),
        ValueError,
        r"^logit_scale must be a real number > 0, got 0.0",
    ),
    (dict(logit_scale="2"), TypeError, r"^logit_scale must be a"),
]


@pytest.mark.parametrize(("changes", "error", "match"), BAD_SPECS)
def test_a_bad_spec_is_refused_naming_the_field(changes, error, match) -> None:
    with pytest.raises(error, match=match):
        _spec(**changes)


@pytest.mark.parametrize(
    ("name", "changes", "match"),
    [
        ("smollm3", dict(no_rope_layers=[1, 1, 0]), r"^no_rope_layers \[1, 1, 0\]"),
        ("smollm3", dict(no_rope_layers=[1, 2, 1, 0]), r"^no_rope_layers \[1, 2"),
        (
            "smollm3-sliding-untied",
            dict(use_sliding_window=False),
            r"^sliding layers with use_sliding_window=False in SmolLM3",
        ),
        (
            "cohere2",
            dict(layer_types=["chunked_attention"] * 4),
            r"^layer_types \['chunked_attention'\]",
        ),
        ("cohere2", dict(hidden_act="mish"), r"^activation 'mish'"),
    ],
)
def test_a_config_the_copy_does_not_follow_is_refused(name, changes, match) -> None:
    model = build(name)
    for key, value in changes.items():
        setattr(model.config, key, value)
    with pytest.raises(ValueError, match=match + r".* not supported by companion"):
        from_hf(model)
