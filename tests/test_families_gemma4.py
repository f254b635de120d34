"""Gemma 4's ``proportional`` RoPE (issue 34) in companion.decoder's copies, against
Hugging Face transformers (the oracle), on small random configs (no download).

``proportional`` is p-RoPE over the whole head: the fastest ``int(p * D // 2)`` pairs
turn with RoPE's frequencies ``b^(-2i/D)``, the others not at all, every frequency
divided by ``factor`` (``partial_rotary_factor`` is ``p``, not a rotary width). The
reader maps it to :func:`companion.rope_variants.p_rope_frequencies`, whose pair count
is Hugging Face's (tests/test_rope_variants.py checks it on a grid). Here: the inverse
frequencies equal Hugging Face's (float32 rounding), a tiny Llama with the issue's
head (D = 24, p = 0.3: 3 pairs turn) and a Gemma 3 with proportional RoPE in its full
layers (Gemma 4's RoPE sets) give Hugging Face's logits within 1e-4 on 30 tokens (six
windows of 5) and its 20 greedy KV-cache tokens, for one prompt and a left-padded
batch; the same weights read with the rounded count (4 pairs) or without the factor
move the logits, so the comparison can fail; bad parameters raise naming the key.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

pytest.importorskip("transformers")

import transformers
from test_decoder import NEW, PROMPT, TOL, randomize, tokens
from test_decoder_modern import BASE, WINDOW, hf_generate, hf_logits, left_padded

from companion.decoder import Decoder, DecoderSpec, from_hf, generate
from companion.rope_variants import p_rope_frequencies

transformers.logging.set_verbosity_error()

T = transformers
LENGTH = 30  # six windows of 5


def _proportional(p: float, factor: float = 1.0, base: float = 100.0) -> dict:
    return {
        "rope_type": "proportional",
        "rope_theta": base,
        "partial_rotary_factor": p,
        "factor": factor,
    }


_LLAMA = dict(BASE, hidden_size=48, num_attention_heads=2, num_key_value_heads=1)
CONFIGS = {
    "llama-p0.3": (  # the head: D = 24, p = 0.3 -> 3 pairs (rounding: 4)
        T.LlamaForCausalLM,
        T.LlamaConfig(**_LLAMA, head_dim=24, rope_parameters=_proportional(0.3)),
    ),
    "llama-p0.3-factor2": (
        T.LlamaForCausalLM,
        T.LlamaConfig(**_LLAMA, head_dim=24, rope_parameters=_proportional(0.3, 2.0)),
    ),
    "gemma3-proportional-global": (  # Gemma 4's RoPE sets: p-RoPE in the full layers
        T.Gemma3ForCausalLM,
        T.Gemma3TextConfig(
            **BASE,
            head_dim=24,
            sliding_window=WINDOW,
            query_pre_attn_scalar=16,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                "full_attention": _proportional(0.3, base=1000.0),
            },
            tie_word_embeddings=False,
        ),
    ),
}


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def build(name: str, seed: int = 0) -> torch.nn.Module:
    cls, cfg = CONFIGS[name]
    torch.manual_seed(seed)
    return randomize(cls(copy.deepcopy(cfg)), seed).eval()


def hf_inv_freq(hf: torch.nn.Module, layer_type: str | None = None) -> torch.Tensor:
    rotary = hf.model.rotary_emb
    if layer_type is None:
        return rotary.inv_freq
    return getattr(rotary, f"{layer_type}_inv_freq")


# ---- the reader: rope_type proportional is p-RoPE -------------------------------------


@pytest.mark.parametrize("name", list(CONFIGS))
def test_proportional_is_read_as_p_rope_with_hugging_faces_frequencies(name) -> None:
    hf = build(name)
    spec = from_hf(hf).spec
    assert spec.rotary_dim == spec.head_dim == 24  # over the whole head, not 0.3 of it
    p = spec.rope
    assert p["rope_type"] == "proportional" and p["partial_rotary_factor"] == 0.3
    ours = p_rope_frequencies(24, 0.3, base=p["rope_theta"]) / p["factor"]
    hf_freq = hf_inv_freq(hf, "full_attention" if "gemma3" in name else None)
    assert int((hf_freq > 0).sum()) == int((ours > 0).sum()) == 3
    torch.testing.assert_close(ours.float(), hf_freq, rtol=1e-6, atol=0.0)
    if "gemma3" in name:  # the sliding layers keep plain RoPE
        assert spec.local_rope["rope_type"] == "default"


# ---- the oracle: logits and greedy tokens --------------------------------------------


@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_match_hugging_face(name: str) -> None:
    hf = build(name)
    ours = from_hf(hf)
    ids = tokens(2, LENGTH)
    ref = hf_logits(hf, ids)
    with torch.no_grad():
        gap = (ours(ids) - ref).abs().max().item()
    assert gap < TOL, gap
    assert ref.abs().max().item() > 1.0  # logits far from zero: the gap is relative


@pytest.mark.parametrize("name", list(CONFIGS))
def test_left_padded_logits_match_hugging_face(name: str) -> None:
    hf = build(name)
    ours = from_hf(hf)
    ids, mask = left_padded([LENGTH, 17, 6], LENGTH)
    ref = hf_logits(hf, ids, mask)
    with torch.no_grad():
        out = ours(ids, attention_mask=mask)
    keep = mask.bool()
    gap = (out[keep] - ref[keep]).abs().max().item()
    assert gap < TOL, gap


@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_tokens_match_hugging_face_generate(name: str) -> None:
    hf = build(name)
    ours = from_hf(hf)
    ids = tokens(1, PROMPT)
    expected = hf_generate(hf, ids, torch.ones_like(ids))
    got = generate(ours, ids, max_new_tokens=NEW)
    assert torch.equal(got, expected)
    assert len(set(got[0, PROMPT:].tolist())) > 2  # not one repeated token
    ids, mask = left_padded([PROMPT, 7, 3], PROMPT)
    expected = hf_generate(hf, ids, mask)
    got = generate(ours, ids, max_new_tokens=NEW, attention_mask=mask)
    assert torch.equal(got, expected)


# ---- the comparison can fail ---------------------------------------------------------


def _with_rope(model: Decoder, rope: dict) -> Decoder:
    spec = dataclasses.replace(model.spec, rope=rope)
    other = Decoder(spec)
    other.load_state_dict(model.state_dict())
    return other.eval()


def test_the_rounded_count_or_a_dropped_factor_moves_the_logits() -> None:
    for name, wrong in (
        ("llama-p0.3", {"partial_rotary_factor": 4 / 12}),  # 4 pairs, the old count
        ("llama-p0.3-factor2", {"factor": 1.0}),
    ):
        hf = build(name)
        ours = from_hf(hf)
        other = _with_rope(ours, {**ours.spec.rope, **wrong})
        ids = tokens(2, LENGTH)
        ref = hf_logits(hf, ids)
        with torch.no_grad():
            assert (ours(ids) - ref).abs().max().item() < TOL
            assert (other(ids) - ref).abs().max().item() > 1e-2, name


# ---- bad parameters ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (
            {"partial_rotary_factor": 1.5},
            r"rope\['partial_rotary_factor'\] must be .*1.*got 1\.5",
        ),
        ({"partial_rotary_factor": "half"}, r"rope\['partial_rotary_factor'\]"),
        ({"factor": -1.0}, r"rope\['factor'\] must be a real number > 0, got -1\.0"),
        ({"rope_theta": 0.0}, r"rope\['rope_theta'\]"),
    ],
)
def test_bad_proportional_parameters_are_refused_by_name(change, match) -> None:
    spec = from_hf(build("llama-p0.3")).spec
    with pytest.raises((ValueError, TypeError), match=match):
        DecoderSpec(**{**dataclasses.asdict(spec), "rope": {**spec.rope, **change}})
