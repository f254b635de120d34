"""Tests of companion.decoder against Hugging Face transformers (the oracle).

Every architecture and every variation ``from_hf`` supports is built as a tiny Hugging
Face model with random weights (no download), copied with ``from_hf``, and compared:
logits within 1e-4 (float32) on a sequence longer than the original context where
positions are scaled, and greedy KV-cache tokens identical to Hugging Face's
``generate(do_sample=False)`` for 20 new tokens. Weights are drawn larger than Hugging
Face's initialization (std 0.02 gives almost uniform attention, where a wrong position
scheme would hardly show); a companion test checks that each variation moves the logits
by far more than the tolerance, so the comparison can fail.
"""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch
from torch import nn

pytest.importorskip("transformers")

import transformers
from transformers import (
    BloomConfig,
    BloomForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
)

from companion import _architecture, decoder
from companion.decoder import Decoder, from_hf, generate

transformers.logging.set_verbosity_error()  # "exceeded the predefined maximum length"

VOCAB = 61
TOL = 1e-4
PROMPT = 12  # greedy: 12 + 20 tokens = 32, twice the context of the scaled configs
NEW = 20
SCALED_CONTEXT = 16  # max_position_embeddings of the configs whose RoPE is scaled
LONG = 40  # logits compared on 40 tokens: 2.5x the scaled context

IDS = dict(bos_token_id=0, eos_token_id=1, pad_token_id=2)


def _llama(**kw: object) -> tuple[type, object]:
    cfg = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        **IDS,
    )
    cfg.update(kw)
    return LlamaForCausalLM, LlamaConfig(**cfg)


def _rope(kind: str, **kw: object) -> dict:
    return {"rope_type": kind, "rope_theta": 10000.0, **kw}


def _gpt2(**kw: object) -> tuple[type, object]:
    cfg = dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, **IDS)
    cfg.update(kw)
    return GPT2LMHeadModel, GPT2Config(**cfg)


def _neox(**kw: object) -> tuple[type, object]:
    cfg = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=64,
        **IDS,
    )
    cfg.update(kw)
    return GPTNeoXForCausalLM, GPTNeoXConfig(**cfg)


def _bloom(**kw: object) -> tuple[type, object]:
    cfg = dict(vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=4, **IDS)
    cfg.update(kw)
    return BloomForCausalLM, BloomConfig(**cfg)


C = SCALED_CONTEXT
VARIANTS = {
    # Llama: RoPE with the four scaling types of chapter 3 (LongRoPE, the fifth type
    # from_hf copies, in test_decoder_modern.py's LONGROPE), GQA/MQA, biases, tied
    # embeddings
    "llama": _llama(),
    "llama-gqa": _llama(num_key_value_heads=2),
    "llama-mqa": _llama(num_key_value_heads=1),
    "llama-bias": _llama(attention_bias=True, mlp_bias=True),
    "llama-tied": _llama(tie_word_embeddings=True),
    "llama-head-dim": _llama(head_dim=16),  # heads * head_dim != hidden_size
    "llama-linear": _llama(
        max_position_embeddings=C, rope_parameters=_rope("linear", factor=4.0)
    ),
    "llama-dynamic": _llama(
        max_position_embeddings=C, rope_parameters=_rope("dynamic", factor=2.0)
    ),
    "llama-yarn": _llama(
        max_position_embeddings=C,
        num_key_value_heads=2,
        rope_parameters=_rope("yarn", factor=4.0, original_max_position_embeddings=C),
    ),
    "llama-yarn-mscale": _llama(
        max_position_embeddings=C,
        rope_parameters=_rope(
            "yarn",
            factor=4.0,
            original_max_position_embeddings=C,
            mscale=0.7,
            mscale_all_dim=1.0,
            beta_fast=16.0,
            beta_slow=2.0,
        ),
    ),
    "llama-llama3": _llama(
        max_position_embeddings=C,
        rope_parameters=_rope(
            "llama3",
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=C,
        ),
    ),
    # GPT-2: learned positions, Conv1D weights, tied or untied, attention scale options
    "gpt2": _gpt2(),
    "gpt2-untied": _gpt2(tie_word_embeddings=False),
    "gpt2-inverse-layer-scale": _gpt2(scale_attn_by_inverse_layer_idx=True),
    "gpt2-unscaled": _gpt2(scale_attn_weights=False),
    "gpt2-n-inner-relu": _gpt2(n_inner=48, activation_function="relu"),
    # GPT-NeoX: partial rotary, parallel or serial residual, biases, tied, scaling
    "neox": _neox(),  # partial_rotary_factor 0.25, parallel residual
    "neox-serial": _neox(use_parallel_residual=False),
    "neox-full-rotary": _neox(
        rope_parameters=_rope("default", partial_rotary_factor=1.0)
    ),
    "neox-half-rotary": _neox(
        rope_parameters=_rope("default", partial_rotary_factor=0.5)
    ),
    "neox-no-bias": _neox(attention_bias=False),
    "neox-tied": _neox(tie_word_embeddings=True),
    "neox-dynamic": _neox(
        max_position_embeddings=C,
        rope_parameters=_rope("dynamic", factor=2.0, partial_rotary_factor=0.5),
    ),
    "neox-yarn": _neox(
        max_position_embeddings=C,
        rope_parameters=_rope(
            "yarn",
            factor=4.0,
            original_max_position_embeddings=C,
            partial_rotary_factor=0.5,
        ),
    ),
    # BLOOM: ALiBi with power-of-two and other head counts, residual from the norm
    "bloom": _bloom(),
    "bloom-6-heads": _bloom(hidden_size=48, n_head=6),
    "bloom-5-heads": _bloom(hidden_size=40, n_head=5),
    "bloom-12-heads": _bloom(hidden_size=48, n_head=12),
    "bloom-residual-post-ln": _bloom(apply_residual_connection_post_layernorm=True),
    "bloom-untied": _bloom(tie_word_embeddings=False),
}


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


def randomize(model: nn.Module, seed: int = 0) -> nn.Module:
    """Weights large enough for attention to be far from uniform (module docstring)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if p.ndim == 1 and ("norm" in name or "ln" in name):
                if name.endswith("weight"):
                    p.copy_(1.0 + 0.2 * noise)  # gains near one
                else:
                    p.copy_(0.2 * noise)
            elif p.ndim == 1:
                p.copy_(0.2 * noise)  # biases
            else:
                fan_in = p.shape[0] if "Conv1D" in _owner(model, name) else p.shape[1]
                if "embed" in name or "wte" in name or "wpe" in name:
                    fan_in = 1
                p.copy_(noise * 1.5 / math.sqrt(fan_in))
    return model.eval()


def _owner(model: nn.Module, name: str) -> str:
    return type(model.get_submodule(name.rsplit(".", 1)[0])).__name__


def build(name: str, seed: int = 0) -> nn.Module:
    """A fresh Hugging Face model of variant ``name`` (dynamic NTK keeps state)."""
    cls, cfg = VARIANTS[name]
    torch.manual_seed(seed)
    return randomize(
        cls(copy.deepcopy(cfg)), seed
    )  # a copy: tests may change the config


def length(name: str) -> int:
    return LONG if "-" in name and name.split("-", 1)[1] in _SCALED else 24


_SCALED = {"linear", "dynamic", "yarn", "yarn-mscale", "llama3"}


def tokens(batch: int, n: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(
        3, VOCAB, (batch, n), generator=torch.Generator().manual_seed(seed)
    )


def hf_generate(hf: nn.Module, ids: torch.Tensor, new: int) -> torch.Tensor:
    return hf.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=new,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=IDS["pad_token_id"],
    )


# ---- the oracle: Hugging Face --------------------------------------------------------


@pytest.mark.parametrize("name", list(VARIANTS))
def test_logits_match_hugging_face(name: str) -> None:
    hf = build(name)
    ours = from_hf(hf)
    ids = tokens(2, length(name))
    with torch.no_grad():
        expected = hf(ids).logits
        got = ours(ids)
    assert got.shape == (2, ids.shape[1], VOCAB)
    assert got.dtype == torch.float32
    assert expected.abs().max() > 1.0  # logits of a sensible size, not all near zero
    torch.testing.assert_close(got, expected, atol=TOL, rtol=0)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_greedy_tokens_match_hugging_face_generate(name: str) -> None:
    ids = tokens(2, PROMPT, seed=2)
    expected = hf_generate(build(name), ids, NEW)
    got = generate(from_hf(build(name)), ids, NEW)
    assert got.shape == (2, PROMPT + NEW) and got.dtype == torch.long
    assert torch.equal(got, expected)


# Each variation against its base, the same weights loaded: the logits move by far more
# than the tolerance, so the comparisons above can fail.
CONTRASTS = [
    ("llama-linear", "llama"),
    ("llama-dynamic", "llama"),
    ("llama-yarn", "llama-gqa"),
    ("llama-llama3", "llama"),
    ("llama-yarn-mscale", "llama-linear"),
    ("gpt2-inverse-layer-scale", "gpt2"),
    ("gpt2-unscaled", "gpt2"),
    ("neox-serial", "neox"),
    ("neox-full-rotary", "neox"),
    ("neox-half-rotary", "neox"),
    ("neox-dynamic", "neox-half-rotary"),
    ("neox-yarn", "neox-half-rotary"),
    ("bloom-residual-post-ln", "bloom"),
]


@pytest.mark.parametrize(("variant", "base"), CONTRASTS)
def test_each_variation_changes_the_logits(variant: str, base: str) -> None:
    hf = build(variant)
    cls, cfg = VARIANTS[base]
    other = cls(copy.deepcopy(cfg)).eval()
    other.load_state_dict(hf.state_dict())  # the same weights, the base's architecture
    ids = tokens(1, LONG if base.startswith("llama") else 24)
    with torch.no_grad():
        gap = (from_hf(hf)(ids) - from_hf(other)(ids)).abs().max().item()
    assert gap > 100 * TOL


def test_non_power_of_two_alibi_uses_the_interleaved_slopes() -> None:
    # 6 heads: 4 slopes of the 4-head rule, then slopes 1 and 3 of the 8-head rule
    hf = build("bloom-6-heads")
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    from companion.extension import alibi_slopes

    expected = [2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3]
    torch.testing.assert_close(
        alibi_slopes(6, dtype=torch.float64),
        torch.tensor(expected, dtype=torch.float64),
    )
    torch.testing.assert_close(
        # HF's public bias m_h * j at j = 1: the slopes (the private helper varies by
        # version)
        build_alibi_tensor(torch.ones(1, 2, dtype=torch.long), 6, torch.float64)[
            :, 0, 1
        ],
        torch.tensor(expected, dtype=torch.float64),
    )
    assert from_hf(hf).spec.num_heads == 6


def assert_bfloat16_within_rounding(build, name: str, length: int = 24) -> None:
    """In bfloat16 the two implementations round differently: the copy of ``build(name)``
    in bfloat16 keeps the dtype and stays within twice the distance between Hugging
    Face's bfloat16 and float32 logits (used by the newer families' tests too)."""
    hf = build(name).to(torch.bfloat16)
    ids = tokens(2, length)
    with torch.no_grad():
        expected = hf(ids).logits.float()
        got = from_hf(hf)(ids)
        exact = from_hf(build(name))(ids)
    assert got.dtype == torch.bfloat16
    rounding = (expected - exact).abs().max()
    assert (got.float() - expected).abs().max() <= 2 * rounding, rounding


@pytest.mark.parametrize("name", ["llama-gqa", "gpt2", "neox", "bloom", "llama-yarn"])
def test_bfloat16_copy_is_as_close_to_hugging_face_as_its_rounding(name: str) -> None:
    assert_bfloat16_within_rounding(build, name)


# ---- the KV cache --------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["llama-gqa", "gpt2", "neox", "bloom-6-heads", "llama-yarn"]
)
def test_decode_with_cache_equals_the_full_forward(name: str) -> None:
    model = from_hf(build(name))
    ids = tokens(2, 30)
    with torch.no_grad():
        full = model(ids)
        logits, past = model.decode(ids[:, :10])  # prefill
        chunk, past = model.decode(ids[:, 10:17], past)  # 7 new tokens at once
        steps = [model.decode(ids[:, t : t + 1], past) for t in range(17, 18)]
        one, past = steps[0]
    torch.testing.assert_close(logits, full[:, :10], atol=TOL, rtol=0)
    torch.testing.assert_close(chunk, full[:, 10:17], atol=TOL, rtol=0)
    torch.testing.assert_close(one, full[:, 17:18], atol=TOL, rtol=0)
    assert past[0][0].shape[2] == 18


def test_cache_keeps_keys_after_rotation() -> None:
    model = from_hf(build("llama"))
    ids = tokens(1, 6)
    with torch.no_grad():
        _, past = model.decode(ids)
        block = model.blocks[0]
        h = block.norm1(model.embed(ids))
        raw = block.k_proj(h).view(1, 6, 4, 8).transpose(1, 2)  # (B, Hkv, L, D)
    cached = past[0][0]
    assert not torch.allclose(cached[:, :, 1:], raw[:, :, 1:], atol=1e-3)
    torch.testing.assert_close(cached[:, :, 0], raw[:, :, 0])  # position 0: no turn
    # each cached key has the norm of its unrotated self (a rotation keeps lengths)
    torch.testing.assert_close(cached.norm(dim=-1), raw.norm(dim=-1))


@pytest.mark.parametrize(
    ("name", "kv_heads"), [("llama", 4), ("llama-gqa", 2), ("llama-mqa", 1)]
)
def test_cache_bytes_per_token_follow_the_formula(name: str, kv_heads: int) -> None:
    model = from_hf(build(name))
    ids = tokens(3, 10)
    with torch.no_grad():
        _, past = model.decode(ids)
    stored = sum(t.numel() * t.element_size() for kv in past for t in kv)
    spec = model.spec
    per_token = 2 * spec.num_layers * kv_heads * spec.head_dim * 4  # K and V, float32
    assert stored == per_token * 3 * 10


@pytest.mark.parametrize(
    "name", ["llama-mqa", "gpt2", "neox", "bloom-5-heads", "llama-llama3"]
)
def test_generate_without_cache_gives_the_same_tokens(name: str) -> None:
    model = from_hf(build(name))
    ids = tokens(2, 8)
    assert torch.equal(
        generate(model, ids, 10), generate(model, ids, 10, use_cache=False)
    )


def test_dynamic_ntk_cache_keeps_keys_of_earlier_frequencies() -> None:
    # past the context, recomputing everything rotates old keys with the new base; the
    # cache keeps the base each key was made with (Hugging Face does the same): logits
    # differ
    model = from_hf(build("llama-dynamic"))
    ids = tokens(1, 30)
    with torch.no_grad():
        _, past = model.decode(ids[:, :29])
        cached, _ = model.decode(ids[:, 29:], past)
        full = model(ids)[:, 29:]
        _, past = model.decode(ids[:, :10])  # below the context: one base for all
        below, _ = model.decode(ids[:, 10:11], past)
    assert (cached - full).abs().max() > 100 * TOL
    torch.testing.assert_close(below, model(ids[:, :11])[:, 10:], atol=TOL, rtol=0)


def test_generate_returns_the_prompt_for_zero_new_tokens() -> None:
    model = from_hf(build("gpt2"))
    ids = tokens(1, 5)
    assert torch.equal(generate(model, ids, 0), ids)


def test_tied_embeddings_stay_one_parameter() -> None:
    tied = from_hf(build("llama-tied"))
    untied = from_hf(build("llama"))
    assert tied.lm_head.weight is tied.embed.weight
    assert untied.lm_head.weight is not untied.embed.weight
    n_tied = sum(p.numel() for p in tied.parameters())
    assert n_tied == sum(p.numel() for p in build("llama-tied").parameters())


def test_the_copy_uses_companion_functions(monkeypatch: pytest.MonkeyPatch) -> None:
    # attention goes through companion.attention, RoPE through companion.rope
    calls = {"attention": 0, "rope": 0}
    parts = _architecture  # where the copy's model is built
    real_attention, real_rope = parts.scaled_dot_product_attention, parts.apply_rope

    def attention(*a, **k):
        calls["attention"] += 1
        return real_attention(*a, **k)

    def rope(*a, **k):
        calls["rope"] += 1
        return real_rope(*a, **k)

    monkeypatch.setattr(parts, "scaled_dot_product_attention", attention)
    monkeypatch.setattr(parts, "apply_rope", rope)
    from_hf(build("llama"))(tokens(1, 4))
    assert calls == {"attention": 2, "rope": 4}  # 2 layers; q and k in each


# ---- what the copy accepts -----------------------------------------------------------


@pytest.mark.parametrize(
    "dtype", [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
)
def test_input_ids_of_every_integer_dtype_give_the_same_logits(dtype) -> None:
    model = from_hf(build("llama-gqa"))
    ids = tokens(2, 6)
    with torch.no_grad():
        expected = model(ids)
        _, past = model.decode(ids[:, :5])
        step = model.decode(ids[:, 5:].to(dtype), past)[0]
        torch.testing.assert_close(model(ids.to(dtype)), expected, atol=0, rtol=0)
    torch.testing.assert_close(step, expected[:, 5:], atol=TOL, rtol=0)
    assert torch.equal(generate(model, ids.to(dtype), 3), generate(model, ids, 3))


def test_a_bad_cache_is_refused_before_any_computation() -> None:
    # the last layer's value is wrong: nothing is embedded or attended before the error
    model = from_hf(build("llama-gqa"))
    ids = tokens(1, 4)
    with torch.no_grad():
        _, past = model.decode(ids)
    calls = []
    model.embed.register_forward_hook(lambda *a: calls.append("embed"))
    bad = (*past[:-1], (past[-1][0], past[-1][1][..., :4]))
    with pytest.raises(ValueError, match=r"past\[1\]\[1\] \(value of layer 1\)"):
        model.decode(ids[:, :1], bad)
    assert calls == []
    model.decode(ids[:, :1], past)  # the good cache goes through
    assert calls == ["embed"]


def test_spec_fields_are_normalised() -> None:
    spec = dataclasses.replace(_SPEC, scales=[0.5, 0.25], num_heads=torch.tensor(4))
    assert spec.scales == (0.5, 0.25) and type(spec.num_heads) is int
    assert Decoder(spec).blocks[1].scale == 0.25


def _bloom_tp(slow_but_exact: bool) -> nn.Module:
    """BLOOM trained with 2-way tensor parallelism (its modules read the flags once)."""
    cls, cfg = _bloom(pretraining_tp=2, slow_but_exact=slow_but_exact)
    torch.manual_seed(0)
    return randomize(cls(cfg))


def test_bloom_slow_but_exact_is_another_model() -> None:
    # why from_hf refuses it: Hugging Face's slow_but_exact path (pretraining_tp > 1)
    # drops the output biases, so its logits are not the model's; without the flag the
    # same config copies exactly
    exact = _bloom_tp(slow_but_exact=False)
    slow = _bloom_tp(slow_but_exact=True)
    slow.load_state_dict(exact.state_dict())
    ids = tokens(2, 12)
    with torch.no_grad():
        gap = (slow(ids).logits - exact(ids).logits).abs().max().item()
        torch.testing.assert_close(
            from_hf(exact)(ids), exact(ids).logits, atol=TOL, rtol=0
        )
    assert gap > 100 * TOL
    with pytest.raises(ValueError, match=r"slow_but_exact=True and pretraining_tp=2"):
        from_hf(slow)


@pytest.mark.parametrize("name", ["llama", "gpt2-inverse-layer-scale", "neox", "bloom"])
def test_a_cut_layer_list_copies_once_the_config_says_so(name: str) -> None:
    # refused while the config disagrees (BAD_INPUTS); with the count set, the copy
    # is the first layer's model, as Hugging Face runs it
    hf = _truncated(name)
    field = "n_layer" if name.startswith(("gpt2", "bloom")) else "num_hidden_layers"
    setattr(hf.config, field, 1)
    ids = tokens(2, 10)
    with torch.no_grad():
        expected = hf(ids).logits
        got = from_hf(hf)(ids)
    assert from_hf(hf).spec.num_layers == 1
    torch.testing.assert_close(got, expected, atol=TOL, rtol=0)


# ---- porting a family: a Port ----------------------------------------------------


def _qwen2() -> nn.Module:
    """Qwen2: Llama's block with biases on the query, key and value projections."""
    cfg = transformers.Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        **IDS,
    )
    torch.manual_seed(0)
    return randomize(transformers.Qwen2ForCausalLM(cfg))


def _qwen2_spec(model: nn.Module) -> dict:
    fields = decoder.PORTS["LlamaForCausalLM"].spec(model)
    return {**fields, "family": "qwen2", "qkv_bias": True, "out_bias": False}


QWEN2 = decoder.Port(
    spec=_qwen2_spec, load=decoder.PORTS["LlamaForCausalLM"].load, layers="model.layers"
)


def test_a_hand_made_port_copies_qwen2() -> None:
    """Qwen2 is built in now; a hand-made port (Llama's, with the q/k/v biases) passed
    as port= copies it as well."""
    hf = _qwen2()
    ours = from_hf(hf, port=QWEN2)
    ids = tokens(2, 24)
    with torch.no_grad():
        expected = hf(ids).logits
        torch.testing.assert_close(ours(ids), expected, atol=TOL, rtol=0)
    assert sum(p.numel() for p in ours.parameters()) == sum(
        p.numel() for p in hf.parameters()
    )
    prompt = tokens(2, PROMPT, seed=2)
    assert torch.equal(generate(ours, prompt, NEW), hf_generate(hf, prompt, NEW))
    # the biases matter: without them the logits move far beyond the tolerance
    no_bias = from_hf(_qwen2(), port=QWEN2)
    for block in no_bias.blocks:
        for proj in (block.q_proj, block.k_proj, block.v_proj):
            proj.bias.data.zero_()
    with torch.no_grad():
        assert (no_bias(ids) - expected).abs().max() > 100 * TOL


# StarCoder 2: the chapter's port of a family from_hf does not know (its cell, as is)


def _starcoder2_spec(model: nn.Module) -> dict:
    c = model.config
    if c.rope_parameters["rope_type"] != "default":  # the only type compared here
        raise ValueError(f"rope_type {c.rope_parameters['rope_type']!r} is not ported")
    head_dim = c.hidden_size // c.num_attention_heads
    n, window = c.num_hidden_layers, c.sliding_window  # window None: none
    return dict(
        family="starcoder2",
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        num_layers=n,
        num_heads=c.num_attention_heads,
        num_kv_heads=c.num_key_value_heads,
        head_dim=head_dim,
        intermediate_size=c.intermediate_size,
        positions="rope",
        norm="layer",
        eps=c.norm_epsilon,
        mlp="plain",
        activation=c.hidden_act,
        parallel_residual=False,
        tied_embeddings=model.lm_head.weight is model.model.embed_tokens.weight,
        qkv_bias=c.use_bias,
        out_bias=c.use_bias,
        mlp_bias=c.use_bias,
        max_positions=c.max_position_embeddings,
        rotary_dim=head_dim,
        rope=dict(c.rope_parameters),
        scales=(head_dim**-0.5,) * n,
        sliding_window=window or 0,
        layer_types=("sliding_attention" if window else "full_attention",) * n,
    )


def _starcoder2_load(dst: Decoder, model: nn.Module) -> None:
    def take(ours: nn.Module, theirs: nn.Module) -> None:
        ours.load_state_dict(theirs.state_dict())

    base = model.model
    take(dst.embed, base.embed_tokens)
    take(dst.final_norm, base.norm)
    for block, layer in zip(dst.blocks, base.layers, strict=True):
        take(block.norm1, layer.input_layernorm)
        take(block.norm2, layer.post_attention_layernorm)
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            take(getattr(block, name), getattr(layer.self_attn, name))
        take(block.up_proj, layer.mlp.c_fc)
        take(block.down_proj, layer.mlp.c_proj)
    if not dst.spec.tied_embeddings:
        take(dst.lm_head, model.lm_head)


STARCODER2 = decoder.Port(
    spec=_starcoder2_spec, load=_starcoder2_load, layers="model.layers"
)


def _starcoder2(**kw: object) -> nn.Module:
    cfg = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        sliding_window=5,
        **IDS,
    )
    cfg.update(kw)
    torch.manual_seed(0)
    return randomize(
        transformers.Starcoder2ForCausalLM(transformers.Starcoder2Config(**cfg))
    )


@pytest.mark.parametrize(
    "changes",
    [{}, dict(sliding_window=None), dict(use_bias=False, tie_word_embeddings=False)],
    ids=["window-5", "no-window", "no-bias-untied"],
)
def test_a_port_copies_starcoder2(changes: dict) -> None:
    hf = _starcoder2(**changes)
    with pytest.raises(ValueError, match=r"got Starcoder2ForCausalLM \(unsupported"):
        from_hf(hf)
    ours = from_hf(hf, port=STARCODER2)
    assert ours.spec.sliding_window == (0 if "sliding_window" in changes else 5)
    assert sum(p.numel() for p in ours.parameters()) == sum(
        p.numel() for p in hf.parameters()
    )
    ids = tokens(2, 24)
    with torch.no_grad():
        expected = hf(ids).logits
        torch.testing.assert_close(ours(ids), expected, atol=TOL, rtol=0)
    prompt = tokens(2, PROMPT, seed=2)  # 12 + 20 tokens: the window rolls
    assert torch.equal(generate(ours, prompt, NEW), hf_generate(hf, prompt, NEW))
    if changes:
        return
    # the window matters: the same weights without it move the logits far
    no_window = dataclasses.replace(
        STARCODER2,
        spec=lambda m: {**_starcoder2_spec(m), "sliding_window": 0, "layer_types": ()},
    )
    with torch.no_grad():
        assert (from_hf(hf, port=no_window)(ids) - expected).abs().max() > 100 * TOL


def test_the_starcoder2_port_refuses_what_it_was_not_compared_with() -> None:
    hf = _starcoder2(rope_parameters={"rope_type": "linear", "factor": 2.0})
    with pytest.raises(ValueError, match=r"rope_type 'linear' is not ported"):
        from_hf(hf, port=STARCODER2)
    # Llama's weight copy on the right spec: it copies the LayerNorms (their biases
    # too), then looks for a gated MLP that Starcoder 2 does not have
    wrong = dataclasses.replace(STARCODER2, load=decoder.PORTS["LlamaForCausalLM"].load)
    with pytest.raises(
        AttributeError, match=r"'Starcoder2MLP' object has no attribute 'gate_proj'"
    ):
        from_hf(_starcoder2(), port=wrong)
    # a norm whose bias has no place in the copy is refused by name
    rms = dataclasses.replace(
        wrong, spec=lambda m: {**_starcoder2_spec(m), "norm": "rms"}
    )
    with pytest.raises(
        ValueError,
        match=r"has a bias in Hugging Face's model and none in the copy \(a norm: "
        r"the spec's norm, here RMSNorm\)",
    ):
        from_hf(_starcoder2(), port=rms)


def test_the_built_in_ports_are_the_eleven_families() -> None:
    assert list(decoder.PORTS) == [
        "LlamaForCausalLM",
        "GPT2LMHeadModel",
        "GPTNeoXForCausalLM",
        "BloomForCausalLM",
        "MistralForCausalLM",
        "Qwen2ForCausalLM",
        "Qwen3ForCausalLM",
        "Olmo2ForCausalLM",
        "Gemma2ForCausalLM",
        "Gemma3ForCausalLM",
        "Phi3ForCausalLM",
    ]
    hf = build("gpt2")  # the default port and the named one give the same copy
    ids = tokens(1, 8)
    with torch.no_grad():
        torch.testing.assert_close(
            from_hf(hf)(ids), from_hf(hf, port=decoder.PORTS["GPT2LMHeadModel"])(ids)
        )


# ---- unsupported architectures and options -------------------------------------------


def _stablelm() -> nn.Module:
    cfg = transformers.StableLmConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        **IDS,
    )
    return transformers.StableLmForCausalLM(cfg)


def _with(name: str, **attrs: object) -> nn.Module:
    hf = build(name)
    for key, value in attrs.items():
        setattr(hf.config, key, value)
    return hf


def _longrope() -> nn.Module:
    """LongRoPE whose two training lengths disagree (a config changed after loading:
    Hugging Face reads the key, then the attribute)."""
    hf = build("llama")
    hf.config.rope_parameters = _rope(
        "longrope",
        short_factor=[1.0] * 4,
        long_factor=[2.0] * 4,
        original_max_position_embeddings=16,
    )
    hf.config.original_max_position_embeddings = 32
    return hf


UNSUPPORTED = [
    (_stablelm, r"got StableLmForCausalLM \(unsupported architecture\)"),
    (
        lambda: _with("llama", sliding_window=8),
        r"sliding-window attention \(sliding_window=8\)",
    ),
    (
        _longrope,
        r"'longrope' with rope_parameters\['original_max_position_embeddings'\]=16 "
        r"and config.original_max_position_embeddings=32",
    ),
    (lambda: _with("gpt2", add_cross_attention=True), r"cross-attention"),
    (lambda: _with("llama", hidden_act="quick_gelu"), r"activation 'quick_gelu'"),
    (
        lambda: _with(
            "llama", rope_parameters=_rope("default", partial_rotary_factor=0.5)
        ),
        r"partial_rotary_factor 0.5 in a llama model",
    ),
]


@pytest.mark.parametrize(("make", "match"), UNSUPPORTED)
def test_unsupported_options_raise_naming_them(make, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        from_hf(make())


# ---- validation table ----------------------------------------------------------------


def _model() -> Decoder:
    return from_hf(build("gpt2"))


_IDS = tokens(1, 4)


def _past(layer: int = 0, part: int = 0, change=lambda t: t, drop_value=None):
    """A gpt2 copy's cache of 4 tokens (B 1, H_kv 4, S 4, D 8), one tensor changed."""
    past = [list(kv) for kv in _model().decode(_IDS)[1]]
    past[layer][part] = change(past[layer][part])
    if drop_value is not None:
        past[drop_value] = past[drop_value][:1]
    return tuple(tuple(kv) for kv in past)


def _truncated(name: str) -> nn.Module:
    hf = build(name)
    path = {"llama": "model.layers", "neox": "gpt_neox.layers"}.get(
        name, "transformer.h"
    )
    layers = hf.get_submodule(path)
    del layers[1:]  # a layer list cut after loading; the config still says 2
    return hf


_SPEC = from_hf(build("llama-gqa")).spec  # 4 query heads, 2 key/value heads, D 8


def _spec(**changes: object) -> decoder.DecoderSpec:
    return dataclasses.replace(_SPEC, **changes)


_LONGROPE = {
    "rope_type": "longrope",
    "rope_theta": 1e4,
    "factor": 4.0,
    "original_max_position_embeddings": 16,
    "short_factor": [1.0] * 4,
    "long_factor": [2.0] * 4,
}

# DecoderSpec: every field checked, naming it (changes to the llama-gqa spec)
SPEC_CASES = [
    (dict(family=""), ValueError, r"family must be a non-empty str, got ''"),
    (dict(family=None), TypeError, r"family must be a str \(the family's name\)"),
    (dict(vocab_size=-1), ValueError, r"vocab_size must be a positive int, got -1"),
    (dict(num_heads=0), ValueError, r"num_heads must be a positive int, got 0"),
    (dict(num_layers=2.0), TypeError, r"num_layers must be an int, got 2.0"),
    (dict(head_dim=0), ValueError, r"head_dim must be a positive int, got 0"),
    (dict(hidden_size=True), TypeError, r"hidden_size must be an int, got True"),
    (
        dict(intermediate_size=-4),
        ValueError,
        r"intermediate_size must be a positive int, got -4",
    ),
    (
        dict(num_kv_heads=3),
        ValueError,
        r"num_kv_heads must divide num_heads \(4\), got 3",
    ),
    (dict(num_kv_heads=0), ValueError, r"num_kv_heads must be a positive int, got 0"),
    (
        dict(positions="xpos"),
        ValueError,
        r"positions must be one of 'rope', 'alibi', 'learned', got 'xpos'",
    ),
    (
        dict(norm="batch"),
        ValueError,
        r"norm must be one of 'rms', 'layer', got 'batch'",
    ),
    (
        dict(mlp="swiglu"),
        ValueError,
        r"mlp must be one of 'gated', 'plain', got 'swiglu'",
    ),
    (dict(activation="quick_gelu"), ValueError, r"activation must be one of 'silu'"),
    (dict(eps=0.0), ValueError, r"eps must be a real number > 0, got 0.0"),
    (dict(qkv_bias=1), TypeError, r"qkv_bias must be a bool, got 1"),
    (dict(parallel_residual="no"), TypeError, r"parallel_residual must be a bool"),
    (
        dict(parallel_residual=True, residual_from_norm=True),
        ValueError,
        r"residual_from_norm must be False when parallel_residual is True",
    ),
    (dict(max_positions=-1), ValueError, r"max_positions must be an int >= 0, got -1"),
    (
        dict(positions="learned", max_positions=0),
        ValueError,
        r"max_positions must be a positive int, got 0",
    ),
    (
        dict(scales=()),
        ValueError,
        r"scales must hold 2 score scales \(one per layer, num_layers\), got 0",
    ),
    (dict(scales=0.35), TypeError, r"scales must be a tuple or list of 2 score scales"),
    (
        dict(scales=(0.35, -0.35)),
        ValueError,
        r"scales\[1\] must be a real number > 0, got -0.35",
    ),
    (
        dict(rope=None),
        TypeError,
        r"rope must be a dict \(Hugging Face's rope_parameters\)",
    ),
    (dict(rotary_dim=10), ValueError, r"rotary_dim must be an even int <= 8, got 10"),
    (dict(rotary_dim=3), ValueError, r"rotary_dim must be an even int, got 3"),
    (dict(rotary_dim=0), ValueError, r"rotary_dim must be an even int >= 2, got 0"),
    (
        dict(rope={"rope_type": "su", "rope_theta": 1e4}),
        ValueError,
        r"rope\['rope_type'\] must be one of 'default', 'linear', 'dynamic', 'yarn', "
        r"'llama3', 'longrope', 'proportional', got 'su'",
    ),
    (
        dict(rope=_LONGROPE | {"short_factor": [1.0] * 3}),
        ValueError,
        r"rope\['short_factor'\] must hold 4 positive reals \(one per pair, "
        r"rotary_dim / 2\), got 3",
    ),
    (
        dict(rope=_LONGROPE | {"long_factor": [1.0, 2.0, 0.0, 1.0]}),
        ValueError,
        r"rope\['long_factor'\]\[2\] must be a real number > 0, got 0",
    ),
    (
        dict(rope=_LONGROPE | {"attention_factor": -1.0}),
        ValueError,
        r"rope\['attention_factor'\] must be a real number > 0, got -1",
    ),
    (
        dict(local_rope={"rope_type": "default"}),
        TypeError,
        r"local_rope\['rope_theta'\] must be a real number, got None",
    ),
    (dict(local_rope=[1]), TypeError, r"local_rope must be a dict \(RoPE parameters\)"),
    (
        dict(rms_variant="olmo"),
        ValueError,
        r"rms_variant must be one of 'llama', 'torch', 'gemma', got 'olmo'",
    ),
    (
        dict(block_norms="peri"),
        ValueError,
        r"block_norms must be one of 'pre', 'post', 'sandwich', got 'peri'",
    ),
    (
        dict(block_norms="post", parallel_residual=True),
        ValueError,
        r"block_norms must be 'pre' with parallel_residual or residual_from_norm",
    ),
    (
        dict(qk_norm="layer"),
        ValueError,
        r"qk_norm must be one of 'none', 'head', 'projection', got 'layer'",
    ),
    (
        dict(qk_norm="head", norm="layer"),
        ValueError,
        r"qk_norm must be 'none' with norm 'layer'",
    ),
    (
        dict(embedding_scale=0.0),
        ValueError,
        r"embedding_scale must be a real number > 0, got 0",
    ),
    (
        dict(attn_softcap=-1.0),
        ValueError,
        r"attn_softcap must be a real number >= 0, got -1",
    ),
    (
        dict(final_softcap="30"),
        TypeError,
        r"final_softcap must be a real number, got '30'",
    ),
    (
        dict(sliding_window=-1),
        ValueError,
        r"sliding_window must be an int >= 0, got -1",
    ),
    (
        dict(layer_types=("full_attention",)),
        ValueError,
        r"layer_types must hold 2 layer types \(one per layer, num_layers, or none "
        r"for all full\), got 1",
    ),
    (
        dict(layer_types="full_attention"),
        TypeError,
        r"layer_types must be a tuple or list of layer types",
    ),
    (
        dict(layer_types=("full_attention", "chunked_attention"), sliding_window=4),
        ValueError,
        r"layer_types\[1\] must be one of 'full_attention', 'sliding_attention', "
        r"got 'chunked_attention'",
    ),
    (
        dict(layer_types=("sliding_attention", "full_attention")),
        ValueError,
        r"sliding_window must be positive when a layer is 'sliding_attention' and 0 "
        r"when none is, got 0",
    ),
    (
        dict(sliding_window=4),
        ValueError,
        r"sliding_window must be positive when a layer is 'sliding_attention' and 0 "
        r"when none is, got 4",
    ),
    (
        dict(rope={"rope_type": "default"}),
        TypeError,
        r"rope\['rope_theta'\] must be a real number, got None",
    ),
    (
        dict(rope={"rope_type": "linear", "rope_theta": 1e4}),
        TypeError,
        r"rope\['factor'\] must be a real number, got None",
    ),
    (
        dict(
            rope={
                "rope_type": "yarn",
                "rope_theta": 1e4,
                "factor": 4.0,
                "original_max_position_embeddings": 16,
                "beta_fast": "32",
            }
        ),
        TypeError,
        r"rope\['beta_fast'\] must be a real number, got '32'",
    ),
    (
        dict(rope={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}),
        TypeError,
        r"rope\['original_max_position_embeddings'\] must be an int, got None",
    ),
    (
        dict(
            rope={
                "rope_type": "llama3",
                "rope_theta": 1e4,
                "factor": 8.0,
                "original_max_position_embeddings": 16,
                "low_freq_factor": 1.0,
            }
        ),
        TypeError,
        r"rope\['high_freq_factor'\] must be a real number, got None",
    ),
    (
        dict(
            rope={"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0},
            rotary_dim=2,
        ),
        ValueError,
        r"rotary_dim must be an int >= 4, got 2",
    ),
]
BAD_INPUTS = [
    (
        "from_hf",
        lambda: from_hf("llama"),
        TypeError,
        r"model must be a Module, got 'llama'",
    ),
    (
        "from_hf",
        lambda: from_hf(nn.Linear(2, 2)),
        ValueError,
        r"got Linear \(unsupported",
    ),
    (
        "generate",
        lambda: generate(build("gpt2"), _IDS, 3),
        TypeError,
        r"model must be a Decoder \(from from_hf\), got a GPT2LMHeadModel",
    ),
    (
        "generate",
        lambda: generate(_model(), _IDS.float(), 3),
        TypeError,
        r"input_ids must be an integer tensor, got a tensor of dtype torch.float32",
    ),
    (
        "generate",
        lambda: generate(_model(), _IDS[0], 3),
        ValueError,
        r"input_ids must have 2 dimensions \(B, L\), got shape \(4,\)",
    ),
    (
        "generate",
        lambda: generate(_model(), _IDS + VOCAB, 3),
        ValueError,
        r"input_ids must lie in \[0, 61\) \(vocab_size\), got values in \[\d+, \d+\]",
    ),
    (
        "generate",
        lambda: generate(_model(), _IDS, -1),
        ValueError,
        r"max_new_tokens must be an int >= 0, got -1",
    ),
    (
        "generate",
        lambda: generate(_model(), _IDS, 2.0),
        TypeError,
        r"max_new_tokens must be an int, got 2.0",
    ),
    (
        "generate",
        lambda: generate(_model(), _IDS, 61),
        ValueError,
        r"max_new_tokens must be at most 60 here: the learned position table has 64 "
        "rows",
    ),
    (
        "generate",
        lambda: generate(_model(), _IDS, 3, use_cache=1),
        TypeError,
        r"use_cache must be a bool, got 1",
    ),
    (
        "generate",
        lambda: generate(
            _model(), _IDS, 3, attention_mask=torch.tensor([[1, 1, 1, 0]])
        ),
        ValueError,
        r"attention_mask must be left padding for generate \(each row's zeros "
        r"before its ones; new tokens follow the last column\), got rows \[0\]",
    ),
    (
        "generate",
        lambda: generate(_model(), tokens(2, 4), 3, attention_mask=torch.ones(2, 3)),
        TypeError,
        r"attention_mask must be",
    ),
    (
        "Decoder",
        lambda: Decoder({"family": "llama"}),
        TypeError,
        r"spec must be a DecoderSpec \(use from_hf\), got a dict",
    ),
    (
        "DecoderBlock",
        lambda: decoder.DecoderBlock(_model().spec, 2),
        ValueError,
        r"layer must be an int <= 1, got 2",
    ),
    (
        "DecoderBlock",
        lambda: decoder.DecoderBlock("gpt2", 0),
        TypeError,
        r"spec must be a DecoderSpec \(use from_hf\), got 'gpt2'",
    ),
    (
        "Decoder",
        lambda: _model()(_IDS, attention_mask=torch.ones(1, 5, dtype=torch.long)),
        ValueError,
        r"attention_mask must have shape \(1, 4\) \(B, the cached plus the new "
        r"tokens\), got shape \(1, 5\)",
    ),
    (
        "Decoder",
        lambda: _model()(_IDS, attention_mask=torch.ones(1, 4)),
        TypeError,
        r"attention_mask must be",
    ),
    (
        "Decoder",
        lambda: _model()(_IDS, attention_mask=torch.tensor([[0, 1, 2, 1]])),
        ValueError,
        r"attention_mask must hold only 0 \(padding\) and 1 \(token\), got values "
        r"\[0, 1, 2\]",
    ),
    (
        "Decoder",
        lambda: _model()(
            tokens(2, 4), attention_mask=torch.tensor([[0, 1, 1, 1], [0] * 4])
        ),
        ValueError,
        r"attention_mask must give every row at least one token, got rows \[1\] "
        r"all padding",
    ),
    (
        "Decoder",
        lambda: _model().decode(
            _IDS[:, :1], _past(), attention_mask=torch.ones(1, 4, dtype=torch.long)
        ),
        ValueError,
        r"attention_mask must have shape \(1, 5\)",
    ),
    (
        "Decoder",
        lambda: _model()(torch.zeros(1, 65, dtype=torch.long)),
        ValueError,
        r"input_ids must hold at most 64 tokens here",
    ),
    (
        "Decoder",
        lambda: _model().decode(_IDS, past={"layers": 2}),
        TypeError,
        r"past must be a tuple or list of 2 layer caches, one per layer "
        r"\(num_layers\), as decode returns them, got a dict",
    ),
    (
        "Decoder",
        lambda: _model().decode(_IDS, past=[1, 2]),
        TypeError,
        r"past\[0\] must be a tuple or list of 2 tensors \(key, value of layer 0\), "
        r"got 1",
    ),
    # the whole cache is checked, every layer's key and value, before any computation
    (
        "Decoder",
        lambda: _model().decode(_IDS, past=_past()[:1]),
        ValueError,
        r"past must hold 2 layer caches, one per layer \(num_layers\), as "
        r"decode returns them, got 1",
    ),
    (
        "Decoder",
        lambda: _model().decode(_IDS, past=_past(drop_value=1)),
        ValueError,
        r"past\[1\] must hold 2 tensors \(key, value of layer 1\), got 1",
    ),
    (
        "Decoder",
        lambda: _model().decode(tokens(2, 3), past=_past()),
        ValueError,
        r"past\[0\]\[0\] \(key of layer 0\) must have size 2 \(B, input_ids' "
        r"batch\) in dimension 0, got shape \(1, 4, 4, 8\)",
    ),
    (
        "Decoder",
        lambda: _model().decode(_IDS, past=_past(1, 1, lambda t: t[..., :4])),
        ValueError,
        r"past\[1\]\[1\] \(value of layer 1\) must have size 8 \(D, head_dim\) in "
        r"dimension 3, got shape \(1, 4, 4, 4\)",
    ),
    (
        "Decoder",
        lambda: _model().decode(_IDS, past=_past(1, 0, lambda t: t[:, :2])),
        ValueError,
        r"past\[1\]\[0\] \(key of layer 1\) must have size 4 \(H_kv, "
        r"num_kv_heads\) in dimension 1, got shape \(1, 2, 4, 8\)",
    ),
    (
        "Decoder",
        lambda: _model().decode(_IDS, past=_past(1, 1, lambda t: t[:, :, :3])),
        ValueError,
        r"past\[1\]\[1\] \(value of layer 1\) must have size 4 \(S, past\[1\]\[0\]'s "
        r"length\) in dimension 2, got shape \(1, 4, 3, 8\)",
    ),
    (
        "Decoder",
        lambda: _model().decode(
            _IDS, past=(_past()[0], tuple(t[:, :, :3] for t in _past()[1]))
        ),
        ValueError,
        r"past\[1\] must have seen as many tokens as past\[0\] \(4\), got 3",
    ),
    (
        "Decoder",
        lambda: Decoder(_model().spec, block=nn.Linear),
        TypeError,
        r"block must be DecoderBlock or a subclass of it \(the class, not an "
        r"instance\), got",
    ),
    (
        "Decoder",
        lambda: _model().decode(_IDS, past=_past(0, 1, lambda t: t.double())),
        TypeError,
        r"past\[0\]\[1\] \(value of layer 0\) must have the model's dtype "
        r"torch.float32, got a tensor of dtype torch.float64",
    ),
    (
        "Decoder",
        lambda: _model().decode(_IDS, past=_past(1, 0, lambda t: t[0])),
        ValueError,
        r"past\[1\]\[0\] \(key of layer 1\) must have 4 dimensions \(B, H_kv, S, D\), "
        r"got shape \(4, 4, 8\)",
    ),
    (
        "Decoder",
        lambda: _model().decode(_IDS, past=_past(0, 0, lambda t: t.long())),
        TypeError,
        r"past\[0\]\[0\] \(key of layer 0\) must be a floating-point tensor",
    ),
    (
        "Decoder",
        lambda: _model().decode(_IDS, past=_past(0, 1, lambda t: None)),
        TypeError,
        r"past\[0\]\[1\] \(value of layer 0\) must be a torch.Tensor, got None",
    ),
    (
        "Decoder",
        lambda: _model().decode(_IDS, past=_past(0, 0, lambda t: t.to("meta"))),
        ValueError,
        r"past\[0\]\[0\] \(key of layer 0\) must hold values",
    ),
    (
        "Decoder",
        lambda: _model().decode(torch.tensor([[1, 200]], dtype=torch.uint8)),
        ValueError,
        r"input_ids must lie in \[0, 61\) \(vocab_size\), got values in \[1, 200\]",
    ),
    (
        "Decoder",
        lambda: _model()(torch.tensor([[-1, 3]], dtype=torch.int8)),
        ValueError,
        r"input_ids must lie in \[0, 61\) \(vocab_size\), got values in \[-1, 3\]",
    ),
    (
        "Decoder",
        lambda: _model()(_IDS.bool()),
        TypeError,
        r"input_ids must be an integer tensor, got a tensor of dtype torch.bool",
    ),
    # BLOOM's slow_but_exact path and a cut layer list: refused by name
    (
        "from_hf",
        lambda: from_hf(_bloom_tp(slow_but_exact=True)),
        ValueError,
        r"model with BLOOM's slow_but_exact=True and pretraining_tp=2 \(Hugging Face's "
        r"path then drops the biases of dense and dense_4h_to_h\) is not supported",
    ),
    (
        "from_hf",
        lambda: from_hf(_truncated("llama")),
        ValueError,
        r"model must hold as many layers as its config says: model.layers has 1, the "
        r"config gives num_layers = 2",
    ),
    (
        "from_hf",
        lambda: from_hf(_truncated("gpt2")),
        ValueError,
        r"transformer.h has 1, the config gives num_layers = 2",
    ),
    (
        "from_hf",
        lambda: from_hf(_truncated("neox")),
        ValueError,
        r"gpt_neox.layers has 1, the config gives num_layers = 2",
    ),
    (
        "from_hf",
        lambda: from_hf(_truncated("bloom")),
        ValueError,
        r"transformer.h has 1, the config gives num_layers = 2",
    ),
    # a Port: what it is made of, and a port that does not fit the model
    (
        "Port",
        lambda: decoder.Port(spec={}, load=_qwen2_spec, layers="model.layers"),
        TypeError,
        r"spec must be callable, got a dict",
    ),
    (
        "Port",
        lambda: decoder.Port(spec=_qwen2_spec, load=None, layers="model.layers"),
        TypeError,
        r"load must be callable, got None",
    ),
    (
        "Port",
        lambda: decoder.Port(spec=_qwen2_spec, load=_qwen2_spec, layers=3),
        TypeError,
        r"layers must be the path of a layer list, e.g. 'model.layers', got 3",
    ),
    (
        "Port",
        lambda: decoder.Port(
            spec=_qwen2_spec, load=_qwen2_spec, layers="model.layers", block=object
        ),
        TypeError,
        r"block must be DecoderBlock or a subclass of it \(the class, not an "
        r"instance\), got",
    ),
    (
        "Port",
        lambda: decoder.Port(
            spec=_qwen2_spec, load=_qwen2_spec, layers="m", spec_type=dict
        ),
        TypeError,
        r"spec_type must be DecoderSpec or a subclass of it, got",
    ),
    (
        "from_hf",
        lambda: from_hf(_stablelm()),
        ValueError,
        r"model must be one of LlamaForCausalLM, GPT2LMHeadModel, GPTNeoXForCausalLM, "
        r"BloomForCausalLM, MistralForCausalLM, .*Phi3ForCausalLM.* \(or come with a "
        r"port\), got StableLmForCausalLM \(unsupported architecture\)",
    ),
    (
        "from_hf",
        lambda: from_hf(_qwen2(), port="llama"),
        TypeError,
        r"port must be a Port or None, got 'llama'",
    ),
    (
        "from_hf",
        lambda: from_hf(_qwen2(), port=decoder.PORTS["LlamaForCausalLM"]),
        ValueError,
        r"model's weights must fit the spec: a layer of shape \(32, 32\) has a bias in "
        r"Hugging Face's model and none in the copy \(the spec's qkv_bias",
    ),
    (
        "from_hf",
        lambda: from_hf(_qwen2(), port=dataclasses.replace(QWEN2, layers="model.norm")),
        ValueError,
        r"port.layers must name model's list of layers \(an nn.ModuleList\), got "
        r"'model.norm', which in a Qwen2ForCausalLM is a Qwen2RMSNorm",
    ),
    (
        "from_hf",
        lambda: from_hf(_qwen2(), port=dataclasses.replace(QWEN2, layers="model.h")),
        ValueError,
        r"got 'model.h', which in a Qwen2ForCausalLM is nothing",
    ),
    (
        "from_hf",
        lambda: from_hf(_qwen2(), port=dataclasses.replace(QWEN2, spec=lambda m: 1)),
        TypeError,
        r"port.spec\(model\) must be a dict of DecoderSpec fields, got 1",
    ),
    (
        "from_hf",
        lambda: from_hf(
            _qwen2(),
            port=dataclasses.replace(
                QWEN2, spec=lambda m: {**_qwen2_spec(m), "out_bias": True}
            ),
        ),
        ValueError,
        r"has a bias in the copy and none in Hugging Face's model",
    ),
] + [("DecoderSpec", lambda c=c: _spec(**c[0]), c[1], c[2]) for c in SPEC_CASES]


BAD_INPUTS += [
    (
        "cache_bytes",
        lambda: decoder.cache_bytes(nn.Linear(2, 2), _past()),
        TypeError,
        r"model must be a Decoder \(from from_hf\), got",
    ),
    (
        "cache_bytes",
        lambda: decoder.cache_bytes(_model(), _past()[:1]),
        ValueError,
        r"past must hold 2 layer caches \(num_layers\), got 1",
    ),
    (
        "cache_bytes",
        lambda: decoder.cache_bytes(_model(), ((None,), ())),
        TypeError,
        r"past\[0\]\[0\] must be a torch.Tensor, got None",
    ),
    (
        "cache_bytes",
        lambda: decoder.cache_bytes(_model(), _past(1, 1, lambda t: t[..., :4])),
        ValueError,
        r"past\[1\]\[1\] \(value of layer 1\) must have size 8 \(D, head_dim\)",
    ),
]


@pytest.mark.parametrize(
    ("name", "thunk", "error", "match"), BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS]
)
def test_bad_input_raises_a_clear_error(
    name: str, thunk, error: type, match: str
) -> None:
    with pytest.raises(error, match=match):
        thunk()


NO_BAD_INPUTS = {
    "PORTS": "a mapping of the built-in ports, read, not called",
    "CacheBytes": "a result record that cache_bytes fills in",
}


def test_validation_table_covers_the_public_api() -> None:
    covered = {b[0].split(".")[0] for b in BAD_INPUTS} | set(NO_BAD_INPUTS)
    assert covered == set(decoder.__all__)


class _CountingBlock(decoder.DecoderBlock):
    """A block subclass: the same math, counting its calls."""

    calls = 0

    def attention(self, x, rope, mask, past):
        type(self).calls += 1
        return super().attention(x, rope, mask, past)


def test_a_port_builds_its_own_block_class_and_companion_mla_is_looked_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hf = build("llama")
    port = dataclasses.replace(decoder.PORTS["LlamaForCausalLM"], block=_CountingBlock)

    class Other(type(hf)):  # a class only companion.mla's table names
        pass

    monkeypatch.setattr(decoder.mla, "PORTS", {"Other": port})
    monkeypatch.setattr(decoder, "PORTS", {})  # as if the built-in table lacked it
    hf.__class__ = Other
    copy = from_hf(hf)
    assert all(type(b) is _CountingBlock for b in copy.blocks)
    ids = tokens(1, 6)
    with torch.no_grad():
        got = copy(ids)
        want = hf(ids).logits
    assert _CountingBlock.calls == 2
    assert (got - want).abs().max() < TOL
