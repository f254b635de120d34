"""companion.gpt_oss (GPT-OSS) against Hugging Face transformers (the oracle), on one
small random ``GptOssConfig`` (no download).

Four layers alternating sliding (window 5) and full attention, four heads of 16 on
two key heads, the published YaRN parameters scaled to the test's size (factor 4 over
32 positions, ``truncate=False``), four experts of which each token takes two, and a
SwiGLU clamp of 2 (the published 7 is rarely reached by random weights; here about a
sixth of the gate and up values lie beyond +-2, more than 5% asserted below). As the other families:
logits within 1e-4 (float32) on 24 tokens (past the window) and on a left-padded
batch, 20 greedy KV-cache tokens identical to Hugging Face's ``generate`` for a
left-padded batch of prompts of lengths 12, 7 and 3, the same up to each row's EOS.
Each of GPT-OSS's differences moves the logits (no sinks, the gate/up columns read as
two halves, no clamp, top-1, no window, YaRN truncated, YaRN without its attention
factor), so the comparison can fail. The two new functions match Hugging Face's modules; bad specs and
configs raise naming the field.
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
    assert_padded_batch_with_eos_matches,
    hf_generate,
    hf_logits,
    left_padded,
)

from companion import decoder, gpt_oss, masks
from companion.decoder import from_hf, generate
from companion.gpt_oss import (
    GptOssBlock,
    GptOssSpec,
    clamped_swiglu,
    route_softmax_top_k,
)

transformers.logging.set_verbosity_error()

T = transformers
WINDOW = 5
LIMIT = 2.0
_YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 32,
}
CONFIG = T.GptOssConfig(
    **dict(BASE, num_hidden_layers=4, intermediate_size=24),
    head_dim=16,
    num_local_experts=4,
    num_experts_per_tok=2,
    sliding_window=WINDOW,
    rope_parameters=_YARN,
    swiglu_limit=LIMIT,
    tie_word_embeddings=False,
    attn_implementation="eager",
)
LENGTH = 24
SEED = 0


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


def build(name: str = "gpt-oss") -> torch.nn.Module:
    torch.manual_seed(SEED)
    return randomize(T.GptOssForCausalLM(copy.deepcopy(CONFIG)), SEED)


@pytest.fixture(scope="module")
def hf() -> torch.nn.Module:
    return build()


# ---- the registry entry and the spec read from the config ----------------------------


def test_from_hf_finds_gpt_oss_and_reads_its_layers(hf) -> None:
    ours = from_hf(hf)  # no port: found in companion.gpt_oss.PORTS
    assert set(gpt_oss.PORTS) == {"GptOssForCausalLM"}
    assert not set(gpt_oss.PORTS) & set(decoder.PORTS)
    s = ours.spec
    assert isinstance(s, GptOssSpec)
    assert all(isinstance(b, GptOssBlock) for b in ours.blocks)
    assert s.layer_types == tuple(hf.config.layer_types)
    assert s.layer_types[:2] == ("sliding_attention", "full_attention")
    assert s.sliding_window == WINDOW and s.rope["rope_type"] == "yarn"
    assert s.rope["truncate"] is False
    assert (s.num_experts, s.num_experts_per_tok) == (4, 2)
    assert (s.swiglu_alpha, s.swiglu_limit) == (1.702, LIMIT)
    assert s.qkv_bias and s.out_bias and not s.tied_embeddings
    assert ours.blocks[0].gate_proj is None  # no dense MLP


# ---- logits, greedy tokens, a padded batch -------------------------------------------


def test_logits_match_hugging_face(hf) -> None:
    ours = from_hf(hf)
    ids = tokens(2, LENGTH)
    torch.testing.assert_close(ours(ids), hf_logits(hf, ids), rtol=0, atol=TOL)
    ids, mask = left_padded([PROMPT, 7, 3], PROMPT, seed=3)
    real = mask.bool()[..., None]  # a padding query's logits mean nothing
    got = ours(ids, attention_mask=mask) * real
    torch.testing.assert_close(got, hf_logits(hf, ids, mask) * real, rtol=0, atol=TOL)


def test_the_clamp_is_reached(hf) -> None:
    """The test's weights reach the clamp (else unclamping could not move anything)."""
    seen = []
    hooks = [
        layer.mlp.experts.register_forward_pre_hook(
            lambda m, args: seen.append(args[0])
        )
        for layer in hf.model.layers
    ]
    hf_logits(hf, tokens(2, LENGTH))
    for h in hooks:
        h.remove()
    e = hf.model.layers[0].mlp.experts
    gate_up = seen[0] @ e.gate_up_proj[0] + e.gate_up_proj_bias[0]
    gate, up = gate_up[..., ::2], gate_up[..., 1::2]
    # the values the clamp changes: a gate above the limit (clamped from above only),
    # an up projection beyond it either way (review R6-3)
    changed = torch.cat([(gate > LIMIT).flatten(), (up.abs() > LIMIT).flatten()])
    assert float(changed.float().mean()) > 0.05


def test_greedy_padded_batch_matches_hugging_face_generate() -> None:
    ids, mask = left_padded([PROMPT, 7, 3], PROMPT, seed=3)
    got = generate(from_hf(build()), ids, NEW, attention_mask=mask)
    expected = hf_generate(build(), ids, mask)
    assert torch.equal(got, expected)
    assert all(len(set(row[PROMPT:].tolist())) > 3 for row in got)  # varied


def test_padded_batch_with_eos_matches_hugging_face() -> None:
    assert_padded_batch_with_eos_matches(build, "gpt-oss")


# ---- the full layers through the FlashAttention kernel ---------------------------------


def test_full_layers_through_the_kernel_match_hugging_face(hf, monkeypatch) -> None:
    """GPT-OSS's full-attention layers run through the Triton kernel
    (:func:`companion.kernels.flash_attention` with ``sinks``, grouped key heads read in
    place) instead of the reference, and the logits still match Hugging Face's. The
    sliding layers keep the reference (the kernel has no window: their masks differ from
    the causal one at 24 tokens over a window of 5); the test counts that the kernel ran
    once per full layer. Triton's interpreter on CPU without a GPU."""
    kernels = pytest.importorskip("companion.kernels", reason="Triton is not installed")
    reference = masks.attention_with_sinks
    ran = []

    def through_the_kernel(query, key, value, sinks, mask=None, scale=None):
        """The kernel where the mask is the plain causal one (the model's additive
        mask: 0 on and below the diagonal, -inf above), else the reference."""
        B, _, L, _ = query.shape
        causal = torch.zeros(L, L).masked_fill(
            ~torch.ones(L, L).bool().tril(), -torch.inf
        )
        if (
            mask is None
            or key.shape[2] != L
            or not torch.equal(mask.expand(B, 1, L, L), causal.expand(B, 1, L, L))
        ):
            return reference(query, key, value, sinks, mask=mask, scale=scale)
        ran.append(L)
        out, _ = kernels.flash_attention(
            query,
            key,
            value,
            is_causal=True,
            scale=scale,
            sinks=sinks,
            block_m=16,
            block_n=16,
        )
        return out

    ours = from_hf(hf)
    ids = tokens(2, LENGTH)
    want = hf_logits(hf, ids)
    monkeypatch.setattr(masks, "attention_with_sinks", through_the_kernel)
    got = ours(ids)
    full = hf.config.layer_types.count("full_attention")
    assert ran == [LENGTH] * full  # every full layer, no sliding one
    torch.testing.assert_close(got, want, rtol=0, atol=TOL)


# ---- each difference moves the logits ------------------------------------------------


def _halves(w: torch.Tensor) -> torch.Tensor:
    """Columns [gate | up] read as if they were interleaved: the copy a reader makes
    who takes the fused projection for two halves."""
    inner = w.shape[-1] // 2
    out = torch.empty_like(w)
    out[..., 0::2], out[..., 1::2] = w[..., :inner], w[..., inner:]
    return out


def _no_sinks(ours) -> None:
    for b in ours.blocks:
        b.sinks.fill_(float("-inf"))  # e^{-inf} = 0: the plain softmax


def _two_halves(ours) -> None:
    for b in ours.blocks:
        b.experts_gate_up.copy_(_halves(b.experts_gate_up))
        b.experts_gate_up_bias.copy_(_halves(b.experts_gate_up_bias))


def _port_with(**changes: object):
    port = gpt_oss.PORTS["GptOssForCausalLM"]
    return dataclasses.replace(port, spec=lambda m: {**port.spec(m), **changes})


@pytest.mark.parametrize(
    "change",
    ["no-sinks", "halves", "no-clamp", "top-1", "no-window", "truncate", "no-mscale"],
)
def test_each_difference_moves_the_logits(hf, change: str) -> None:
    ids = tokens(2, LENGTH)
    expected = hf_logits(hf, ids)
    ports = {
        "no-clamp": _port_with(swiglu_limit=1e9),
        "top-1": _port_with(num_experts_per_tok=1),
        "no-window": _port_with(sliding_window=0, layer_types=()),
        "truncate": _port_with(rope={**_YARN, "truncate": True}),
        "no-mscale": _port_with(rope={**_YARN, "attention_factor": 1.0}),
    }
    ours = from_hf(hf, port=ports.get(change))
    with torch.no_grad():
        {"no-sinks": _no_sinks, "halves": _two_halves}.get(change, lambda m: 0)(ours)
        gap = float((ours(ids) - expected).abs().max())
    assert gap > 100 * TOL, gap


# ---- the two functions against Hugging Face's modules --------------------------------


def test_route_and_clamped_swiglu_equal_hugging_face_s_modules(hf) -> None:
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(10, CONFIG.hidden_size, generator=gen)
    mlp = hf.model.layers[1].mlp
    with torch.no_grad():
        _, hf_weights, hf_chosen = mlp.router(x)
        logits = torch.nn.functional.linear(x, mlp.router.weight, mlp.router.bias)
        weights, chosen = route_softmax_top_k(logits, 2)
        assert torch.equal(chosen, hf_chosen)
        torch.testing.assert_close(weights, hf_weights, rtol=0, atol=1e-7)
        torch.testing.assert_close(weights.sum(1), torch.ones(10))
        gate_up = 4 * torch.randn(10, 2 * CONFIG.intermediate_size, generator=gen)
        torch.testing.assert_close(
            clamped_swiglu(gate_up, 1.702, LIMIT),
            mlp.experts._apply_gate(gate_up),
            rtol=0,
            atol=0,
        )
        g, u = gate_up[:, 0::2], gate_up[:, 1::2]  # the formula, by hand
        gc = torch.minimum(g, torch.tensor(LIMIT))
        by_hand = (u.clamp(-LIMIT, LIMIT) + 1) * gc / (1 + torch.exp(-1.702 * gc))
        torch.testing.assert_close(clamped_swiglu(gate_up, limit=LIMIT), by_hand)


# ---- refused -------------------------------------------------------------------------


def _config(**changes: object):
    c = copy.deepcopy(CONFIG)
    for key, value in changes.items():
        setattr(c, key, value)
    return c


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"quantization_config": {"quant_method": "mxfp4"}}, "quantization_config"),
        (
            {"rope_parameters": {"rope_type": "made_up", "rope_theta": 1e4}},
            "'made_up'",
        ),
        (
            {"layer_types": ["chunked_attention"] * 4},
            "layer_types",
        ),
        ({"sliding_window": None}, "sliding_window None"),
    ],
    ids=["quantized", "rope-unknown", "chunked", "no-window"],
)
def test_unsupported_configs_are_refused_by_name(changes, message) -> None:
    hf = T.GptOssForCausalLM(copy.deepcopy(CONFIG))
    hf.config = _config(**changes)
    with pytest.raises(ValueError, match=message):
        from_hf(hf)


_SPEC: dict = {}


def _spec(**changes: object) -> GptOssSpec:
    """The test config's spec with ``changes`` (the fields read once, lazily)."""
    if not _SPEC:
        _SPEC.update(gpt_oss.PORTS["GptOssForCausalLM"].spec(build()))
    return GptOssSpec(**{**_SPEC, **changes})


def _plain_spec() -> decoder.DecoderSpec:
    fields = dataclasses.fields(decoder.DecoderSpec)
    return decoder.DecoderSpec(**{f.name: getattr(_spec(), f.name) for f in fields})


BAD_INPUTS = [
    ("GptOssSpec", lambda: _spec(num_experts=0), ValueError, r"num_experts"),
    (
        "GptOssSpec",
        lambda: _spec(num_experts_per_tok=5),
        ValueError,
        r"num_experts_per_tok",
    ),
    ("GptOssSpec", lambda: _spec(swiglu_limit=0.0), ValueError, r"swiglu_limit"),
    ("GptOssSpec", lambda: _spec(swiglu_alpha="1.7"), TypeError, r"swiglu_alpha"),
    (
        "GptOssSpec",
        lambda: _spec(qk_norm="head"),
        ValueError,
        r"qk_norm must be 'none' in a GptOssSpec",
    ),
    ("GptOssSpec", lambda: _spec(rotary_dim=8), ValueError, r"rotary_dim must be 16"),
    ("GptOssSpec", lambda: _spec(nope_layers=(1,)), ValueError, r"nope_layers"),
    ("GptOssBlock", lambda: GptOssBlock(_plain_spec(), 0), TypeError, r"spec"),
    ("GptOssBlock", lambda: GptOssBlock(_spec(), 4), ValueError, r"layer"),
    (
        "route_softmax_top_k",
        lambda: route_softmax_top_k(torch.zeros(3, 4), 5),
        ValueError,
        r"top_k",
    ),
    (
        "route_softmax_top_k",
        lambda: route_softmax_top_k(torch.zeros(3, 4, dtype=torch.long), 1),
        TypeError,
        r"logits",
    ),
    (
        "route_softmax_top_k",
        lambda: route_softmax_top_k(torch.zeros(4), 1),
        ValueError,
        r"logits",
    ),
    (
        "clamped_swiglu",
        lambda: clamped_swiglu(torch.zeros(3, 5)),
        ValueError,
        r"gate_up",
    ),
    (
        "clamped_swiglu",
        lambda: clamped_swiglu(torch.zeros(3, 4, dtype=torch.long)),
        TypeError,
        r"gate_up",
    ),
    (
        "clamped_swiglu",
        lambda: clamped_swiglu(torch.zeros(4), limit=0),
        ValueError,
        r"limit",
    ),
    (
        "clamped_swiglu",
        lambda: clamped_swiglu(torch.zeros(4), alpha=-1.0),
        ValueError,
        r"alpha",
    ),
]


@pytest.mark.parametrize(
    ("name", "thunk", "error", "match"), BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS]
)
def test_bad_input_raises_a_clear_error(name: str, thunk, error: type, match: str):
    with pytest.raises(error, match=match):
        thunk()


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_type": "default", "rope_theta": 1e4},
        {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0},
        {
            "rope_type": "longrope",
            "rope_theta": 1e4,
            "short_factor": [1.0, 1.1, 1.3, 1.5, 1.0, 1.2, 1.4, 1.6],
            "long_factor": [1.0, 2.0, 4.0, 8.0, 1.5, 3.0, 5.0, 9.0],
            "original_max_position_embeddings": 16,
        },
    ],
    ids=["default", "linear", "longrope"],
)
def test_other_rope_types_are_copied_as_in_every_family(rope) -> None:
    """The published GPT-OSS uses YaRN, but Hugging Face runs any RoPE type in it, and
    so does the copy (review R6-1: it refused them), past the original length too."""
    torch.manual_seed(SEED)
    config = copy.deepcopy(CONFIG)
    config.rope_parameters = rope
    hf = randomize(T.GptOssForCausalLM(config), SEED)
    ids = tokens(2, LENGTH)
    with torch.no_grad():
        got = from_hf(hf)(ids)
    assert from_hf(hf).spec.rope["rope_type"] == rope["rope_type"]
    torch.testing.assert_close(got, hf_logits(hf, ids), rtol=0, atol=TOL)
