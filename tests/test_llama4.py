"""companion.llama4 (Llama 4's text model: iRoPE) against Hugging Face transformers (the
oracle), on small random ``Llama4TextConfig``s (no download).

Two configs of four layers (layer 3 NoPE, Hugging Face's default pattern): chunks of 5
keys in the RoPE layers, the NoPE layer's temperature with ``floor_scale=4`` (so that it
changes every 4 slots here, not every 8192), four experts in layers 1 and 3 (top-1, and
top-2 in every layer in the second config, with tied embeddings, biases and no
QK-norm), the published ``llama3`` RoPE scaling in the first. As the other families:
logits within 1e-4 (float32) on 24 tokens (almost five chunks) and on a left-padded
batch, 20 greedy KV-cache tokens identical to Hugging Face's ``generate`` for a
left-padded batch of prompts of lengths 12, 7 and 3 (32 slots: the cache crosses six
chunk boundaries), the same tokens up to each row's EOS; the cached decode equals the
full forward token by token. Each of Llama 4's differences moves the logits (all layers
RoPE, no temperature, no chunks, no QK-norm, half-layout RoPE, another top-k), so the
comparison can fail. The two new functions match loops written from their formulas;
bad specs and configs raise naming the field.
"""

from __future__ import annotations

import copy
import dataclasses
import math

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

from companion import decoder, llama4
from companion.decoder import DecoderSpec, from_hf, generate
from companion.llama4 import (
    Llama4Block,
    Llama4Spec,
    attention_temperature,
    route_sigmoid_top_k,
)

transformers.logging.set_verbosity_error()

T = transformers
CHUNK = 5
_LLAMA3 = {
    "rope_type": "llama3",
    "rope_theta": 10000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}
_COMMON = dict(
    BASE,
    num_hidden_layers=4,
    intermediate_size=24,  # an expert's and the shared expert's width
    intermediate_size_mlp=40,  # the dense layers'
    num_local_experts=4,
    attention_chunk_size=CHUNK,
    floor_scale=4,
    attn_scale=0.5,
)
CONFIGS = {
    "llama3-top1": T.Llama4TextConfig(
        **_COMMON,
        num_experts_per_tok=1,
        interleave_moe_layer_step=2,  # experts in layers 1 and 3
        rope_parameters=_LLAMA3,
        tie_word_embeddings=False,
    ),
    "top2-tied-bias": T.Llama4TextConfig(  # experts everywhere, no QK-norm
        **_COMMON,
        num_experts_per_tok=2,
        interleave_moe_layer_step=1,
        use_qk_norm=False,
        attention_bias=True,
        tie_word_embeddings=True,
    ),
}
LENGTH = 24  # almost five chunks of 5


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


# weights whose greedy continuations vary (4+ distinct tokens in each row of the batch)
SEEDS = {"llama3-top1": 2, "top2-tied-bias": 4}


def build(name: str) -> torch.nn.Module:
    torch.manual_seed(SEEDS[name])
    return randomize(T.Llama4ForCausalLM(copy.deepcopy(CONFIGS[name])), SEEDS[name])


# ---- the registry entry and the spec read from the config ----------------------------


def test_from_hf_finds_llama4_and_reads_its_layers() -> None:
    hf = build("llama3-top1")
    copy_ = from_hf(hf)  # no port: found in companion.llama4.PORTS
    assert set(llama4.PORTS) == {"Llama4ForCausalLM"}
    assert not set(llama4.PORTS) & set(decoder.PORTS)
    s = copy_.spec
    assert isinstance(s, Llama4Spec)
    assert all(isinstance(b, Llama4Block) for b in copy_.blocks)
    layers = hf.model.layers
    assert s.nope_layers == tuple(
        i for i, la in enumerate(layers) if not la.self_attn.use_rope
    )
    assert s.nope_layers == (3,)
    assert s.chunked_layers == (0, 1, 2) and s.chunk_size == CHUNK
    assert s.moe_layers == tuple(i for i, la in enumerate(layers) if la.is_moe_layer)
    assert s.moe_layers == (1, 3)
    assert s.rope_layout == "interleaved" and s.rope["rope_type"] == "llama3"
    for block, layer in zip(copy_.blocks, layers, strict=True):  # MLP widths
        ff = (
            layer.feed_forward.shared_expert
            if layer.is_moe_layer
            else layer.feed_forward
        )
        assert block.gate_proj.weight.shape == ff.gate_proj.weight.shape
    assert s.qk_l2_norm and s.temperature_tuning


# ---- logits, greedy tokens, a padded batch -------------------------------------------


@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_match_hugging_face(name: str) -> None:
    hf = build(name)
    ours = from_hf(hf)
    ids = tokens(2, LENGTH)
    torch.testing.assert_close(ours(ids), hf_logits(hf, ids), rtol=0, atol=TOL)
    ids, mask = left_padded([PROMPT, 7, 3], PROMPT, seed=3)
    real = mask.bool()[..., None]  # a padding query's logits mean nothing
    got = ours(ids, attention_mask=mask) * real
    torch.testing.assert_close(got, hf_logits(hf, ids, mask) * real, rtol=0, atol=TOL)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_padded_batch_matches_hugging_face_generate(name: str) -> None:
    ids, mask = left_padded([PROMPT, 7, 3], PROMPT, seed=3)
    got = generate(from_hf(build(name)), ids, NEW, attention_mask=mask)
    expected = hf_generate(build(name), ids, mask)
    assert torch.equal(got, expected)
    assert all(len(set(row[PROMPT:].tolist())) > 3 for row in got)  # varied


def test_padded_batch_with_eos_matches_hugging_face() -> None:
    assert_padded_batch_with_eos_matches(build, "llama3-top1")


def test_cached_decode_equals_the_full_forward_across_chunks() -> None:
    """Token by token through the cache, past six chunk boundaries, as the forward;
    a chunked layer holds only the last ``CHUNK - 1`` keys, the NoPE layer all."""
    ours = from_hf(build("llama3-top1"))
    ids = tokens(1, 32, seed=5)
    full = ours(ids)
    logits, past = ours.decode(ids[:, :3])
    steps = [logits]
    for t in range(3, 32):
        logits, past = ours.decode(ids[:, t : t + 1], past)
        steps.append(logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=TOL)
    held = [layer[0].shape[2] for layer in past]  # chunked: the last C - 1 keys
    assert held == [CHUNK - 1] * 3 + [32] and int(past[0][2]) == 32


# ---- each difference moves the logits ------------------------------------------------


def _port_with(**changes: object):
    port = llama4.PORTS["Llama4ForCausalLM"]
    return dataclasses.replace(port, spec=lambda m: {**port.spec(m), **changes})


@pytest.mark.parametrize(
    "changes",
    [
        {"nope_layers": ()},  # all layers RoPE
        {"temperature_tuning": False},
        {"chunked_layers": (), "chunk_size": 0},  # full attention everywhere
        {"qk_l2_norm": False},
        {"rope_layout": "half"},
        {"num_experts_per_tok": 2},
    ],
    ids=["all-rope", "no-temperature", "no-chunks", "no-qk-norm", "half", "top2"],
)
def test_each_difference_moves_the_logits(changes: dict) -> None:
    hf = build("llama3-top1")
    ids = tokens(2, LENGTH)
    expected = hf_logits(hf, ids)
    right = (from_hf(hf)(ids) - expected).abs().max()
    wrong = (from_hf(hf, port=_port_with(**changes))(ids) - expected).abs().max()
    assert right < TOL < 100 * TOL < wrong


# ---- the two functions against loops of their formulas -------------------------------


def test_attention_temperature_matches_its_formula() -> None:
    m = torch.arange(40)
    got = attention_temperature(m, floor_scale=4, attn_scale=0.5)
    loop = [1 + 0.5 * math.log(1 + math.floor((i + 1) / 4)) for i in range(40)]
    torch.testing.assert_close(got, torch.tensor(loop), rtol=1e-6, atol=0)
    assert got.dtype == torch.float32
    assert bool((got[:3] == 1).all()) and bool((got[3:] > 1).all())


def test_route_sigmoid_top_k_matches_a_loop() -> None:
    logits = torch.randn(7, 5, generator=torch.Generator().manual_seed(0))
    got = route_sigmoid_top_k(logits, 2)
    for t in range(7):
        row = logits[t].tolist()
        best = sorted(range(5), key=lambda e: -row[e])[:2]
        for e in range(5):
            want = 1 / (1 + math.exp(-row[e])) if e in best else 0.0
            assert abs(float(got[t, e]) - want) < 1e-6


# ---- refusals ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"layer_types": ["sliding_attention"] * 4}, r"layer_types"),
        ({"attention_chunk_size": None}, r"attention_chunk_size=None"),
        ({"no_rope_layers": [1, 2, 1, 0]}, r"no_rope_layers"),
        (
            {
                "rope_parameters": {
                    "rope_type": "default",
                    "rope_theta": 1e4,
                    "partial_rotary_factor": 0.5,
                }
            },
            r"partial_rotary_factor",
        ),
        ({"hidden_act": "tanh"}, r"activation 'tanh'"),
    ],
    ids=["sliding", "no-chunk-size", "no-rope-flag", "partial", "activation"],
)
def test_from_hf_refuses_by_name(changes: dict, match: str) -> None:
    hf = build("llama3-top1")
    for key, value in changes.items():
        setattr(hf.config, key, value)
    with pytest.raises(ValueError, match=match):
        from_hf(hf)


def _spec(**changes: object) -> Llama4Spec:
    fields = dict(
        family="llama4",
        vocab_size=11,
        hidden_size=8,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        head_dim=4,
        intermediate_size=6,
        positions="rope",
        norm="rms",
        eps=1e-5,
        mlp="gated",
        activation="silu",
        parallel_residual=False,
        rotary_dim=4,
        rope={"rope_type": "default", "rope_theta": 1e4},
        scales=(0.5, 0.5),
        rope_layout="interleaved",
        nope_layers=(1,),
        chunk_size=3,
        chunked_layers=(0,),
        moe_layers=(1,),
        num_experts=2,
    )
    return Llama4Spec(**{**fields, **changes})


def _plain_spec() -> DecoderSpec:
    """The same fields without Llama 4's: a plain DecoderSpec."""
    spec = _spec()
    return DecoderSpec(
        **{k: getattr(spec, k) for k in DecoderSpec.__dataclass_fields__}
    )


def test_a_spec_builds_a_model() -> None:
    model = decoder.Decoder(_spec(), block=Llama4Block)
    assert model(torch.zeros(1, 5, dtype=torch.long)).shape == (1, 5, 11)


BAD_INPUTS = [
    ("Llama4Spec", lambda: _spec(chunk_size=-1), ValueError, r"chunk_size"),
    (
        "Llama4Spec",
        lambda: _spec(chunk_size=0),
        ValueError,
        r"chunk_size must be positive when chunked_layers",
    ),
    ("Llama4Spec", lambda: _spec(chunked_layers=(2,)), ValueError, r"chunked_layers"),
    ("Llama4Spec", lambda: _spec(moe_layers=(1, 0)), ValueError, r"moe_layers"),
    (
        "Llama4Spec",
        lambda: _spec(num_experts_per_tok=3),
        ValueError,
        r"num_experts_per",
    ),
    ("Llama4Spec", lambda: _spec(num_experts=0), ValueError, r"num_experts"),
    ("Llama4Spec", lambda: _spec(floor_scale=0.0), ValueError, r"floor_scale"),
    ("Llama4Spec", lambda: _spec(qk_l2_norm=1), TypeError, r"qk_l2_norm"),
    (
        "Llama4Spec",
        lambda: _spec(qk_norm="head"),
        ValueError,
        r"qk_norm must be 'none'",
    ),
    ("Llama4Spec", lambda: _spec(rotary_dim=2), ValueError, r"rotary_dim must be 4"),
    (
        "Llama4Spec",
        lambda: _spec(dense_intermediate_size=-2),
        ValueError,
        r"dense_intermediate_size",
    ),
    (
        "Llama4Block",
        lambda: Llama4Block(_plain_spec(), 0),
        TypeError,
        r"spec must be a Llama4Spec",
    ),
    ("Llama4Block", lambda: Llama4Block(_spec(), 2), ValueError, r"layer"),
    (
        "attention_temperature",
        lambda: attention_temperature(torch.ones(3), floor_scale=4, attn_scale=0.1),
        TypeError,
        r"positions",
    ),
    (
        "attention_temperature",
        lambda: attention_temperature(
            torch.tensor([-1]), floor_scale=4, attn_scale=0.1
        ),
        ValueError,
        r"positions must be >= 0",
    ),
    (
        "attention_temperature",
        lambda: attention_temperature(torch.arange(3), floor_scale=0, attn_scale=0.1),
        ValueError,
        r"floor_scale",
    ),
    (
        "route_sigmoid_top_k",
        lambda: route_sigmoid_top_k(torch.zeros(3, 4), 5),
        ValueError,
        r"top_k",
    ),
    (
        "route_sigmoid_top_k",
        lambda: route_sigmoid_top_k(torch.zeros(4), 1),
        ValueError,
        r"logits",
    ),
]


@pytest.mark.parametrize(
    ("name", "thunk", "error", "match"), BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS]
)
def test_bad_input_raises_a_clear_error(name: str, thunk, error: type, match: str):
    with pytest.raises(error, match=match):
        thunk()
