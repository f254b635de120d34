"""Tests of companion.mla: DeepSeek-V3's multi-head latent attention against Hugging Face.

Every variation is a tiny ``DeepseekV3ForCausalLM`` with random weights (no download),
copied with ``from_hf`` (which finds :data:`companion.mla.PORTS` itself) and compared:
logits within 1e-4 (float32) on both inference paths, greedy KV-cache tokens identical
to Hugging Face's ``generate(do_sample=False)`` for 20 new tokens, the cache equal to
the one Hugging Face keeps. The absorbed path equals the naive one to float64 rounding.
Weights are drawn larger than Hugging Face's initialization so that attention is far
from uniform; a test checks that each variation moves the logits by far more than the
tolerance, so the comparisons can fail.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import types

import pytest
import torch
from torch import nn

pytest.importorskip("transformers")

import transformers
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM, DynamicCache

from companion import mla
from companion.decoder import Decoder, DecoderBlock, cache_bytes, from_hf, generate
from companion.mla import (
    MLABlock,
    MLASpec,
    cache_bytes_per_token,
    mla_softmax_scale,
    use_absorbed,
)

transformers.logging.set_verbosity_error()  # "exceeded the predefined maximum length"

VOCAB = 61
TOL = 1e-4
PROMPT = 12
NEW = 20
CONTEXT = 16  # max_position_embeddings of the YaRN configs: 12 + 20 tokens pass it
LONG = 40
IDS = dict(bos_token_id=0, eos_token_id=1, pad_token_id=2)


def _config(**kw: object) -> DeepseekV3Config:
    cfg = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        moe_intermediate_size=16,
        num_hidden_layers=2,
        first_k_dense_replace=2,  # every layer dense
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=12,
        kv_lora_rank=8,
        qk_rope_head_dim=4,
        qk_nope_head_dim=6,
        v_head_dim=5,
        max_position_embeddings=64,
        **IDS,
    )
    cfg.update(kw)
    return DeepseekV3Config(**cfg)


def _yarn(**kw: object) -> dict:
    return dict(
        rope_type="yarn",
        rope_theta=10000.0,
        factor=4.0,
        original_max_position_embeddings=CONTEXT,
        **kw,
    )


def _longrope(**kw: object) -> dict:
    """max_position_embeddings 64 / L0 16: Hugging Face's factor 4, its attention
    factor sqrt(1 + ln 4 / ln 16) on cos and sin."""
    return dict(
        rope_type="longrope",
        rope_theta=10000.0,
        short_factor=[1.0, 1.3],  # qk_rope_head_dim / 2 entries
        long_factor=[2.5, 6.0],
        original_max_position_embeddings=CONTEXT,
        **kw,
    )


VARIANTS = {
    "q-lora": _config(),  # q_a_proj -> q_a_layernorm -> q_b_proj; interleaved RoPE
    "q-proj": _config(q_lora_rank=None),  # one q_proj
    "half-layout": _config(rope_interleave=False),
    "q-proj-half": _config(q_lora_rank=None, rope_interleave=False),
    "tied": _config(tie_word_embeddings=True),
    "bias": _config(attention_bias=True),  # q_a_proj, kv_a_proj_with_mqa, o_proj
    "wide-rope": _config(qk_rope_head_dim=8, qk_nope_head_dim=4, kv_lora_rank=16),
    # DeepSeek's YaRN: cos/sin times m(mscale)/m(mscale_all_dim), the softmax scale
    # times m(mscale_all_dim)^2; factor read from the config or from the two lengths
    "yarn-mscale": _config(
        max_position_embeddings=CONTEXT,
        rope_parameters=_yarn(mscale=0.7, mscale_all_dim=1.0),
    ),
    "yarn-deepseek": _config(  # DeepSeek-V3's own: mscale = mscale_all_dim = 1
        max_position_embeddings=CONTEXT,
        rope_parameters=_yarn(mscale=1.0, mscale_all_dim=1.0, beta_fast=16.0),
    ),
    "yarn-plain": _config(
        max_position_embeddings=CONTEXT, q_lora_rank=None, rope_parameters=_yarn()
    ),
    # the other scaling types; HF multiplies the softmax scale by m(mscale_all_dim)^2
    # for any type but "default"
    "dynamic": _config(
        max_position_embeddings=CONTEXT,
        rope_parameters=dict(rope_type="dynamic", rope_theta=10000.0, factor=2.0),
    ),
    "linear-mscale": _config(
        max_position_embeddings=CONTEXT,
        rope_parameters=dict(
            rope_type="linear", rope_theta=10000.0, factor=4.0, mscale_all_dim=1.0
        ),
    ),
    "llama3": _config(
        max_position_embeddings=CONTEXT,
        rope_interleave=False,
        rope_parameters=dict(
            rope_type="llama3",
            rope_theta=10000.0,
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=CONTEXT,
        ),
    ),
    # LongRoPE (issue 27): short factors up to L0 = 16 positions, long ones past it;
    # prompts of 12 plus 20 new tokens cross L0, 24-token logits use the long set
    "longrope": _config(rope_parameters=_longrope()),
    "longrope-mscale": _config(  # the softmax scale times m(mscale_all_dim)^2 too
        q_lora_rank=None,
        rope_interleave=False,
        rope_parameters=_longrope(factor=4.0, mscale_all_dim=1.0),
    ),
    # DeepSeekMoE: sigmoid router, group-limited top-k, correction bias, shared experts
    "moe": _config(
        num_hidden_layers=3,
        first_k_dense_replace=1,
        n_routed_experts=8,
        n_group=4,
        topk_group=2,
        num_experts_per_tok=3,
        n_shared_experts=1,
        norm_topk_prob=True,
        routed_scaling_factor=2.5,
    ),
    "moe-all": _config(  # every layer MoE, one group, unnormalized, two shared
        first_k_dense_replace=0,
        n_routed_experts=6,
        n_group=1,
        topk_group=1,
        num_experts_per_tok=2,
        n_shared_experts=2,
        norm_topk_prob=False,
        routed_scaling_factor=1.5,
        q_lora_rank=None,
    ),
}
_SCALED = {
    "yarn-mscale",
    "yarn-deepseek",
    "yarn-plain",
    "dynamic",
    "linear-mscale",
    "llama3",
}


def randomize(model: nn.Module, seed: int = 0) -> nn.Module:
    """Weights large enough for attention to be far from uniform (module docstring);
    the routers' correction biases (zeros at initialization) random too."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.5 * torch.randn(b.shape, generator=gen))
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if p.ndim == 1 and "norm" in name:
                p.copy_(1.0 + 0.2 * noise)  # gains near one
            elif p.ndim == 1:
                p.copy_(0.2 * noise)  # biases
            else:
                fan_in = 1 if "embed" in name else p.shape[1]
                p.copy_(noise * 1.5 / math.sqrt(fan_in))
    return model.eval()


def build(name: str, seed: int = 0, dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(seed)
    hf = DeepseekV3ForCausalLM(copy.deepcopy(VARIANTS[name]))
    return randomize(hf, seed).to(dtype)


def tokens(batch: int, n: int, seed: int = 1) -> torch.Tensor:
    """Ids from 3 up: Hugging Face's generate reads pad_token_id (2) as padding."""
    return torch.randint(
        3, VOCAB, (batch, n), generator=torch.Generator().manual_seed(seed)
    )


def length(name: str) -> int:
    return LONG if name in _SCALED else 24


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


@pytest.mark.parametrize("absorbed", [False, True], ids=["naive", "absorbed"])
@pytest.mark.parametrize("name", list(VARIANTS))
def test_logits_match_hugging_face(name: str, absorbed: bool) -> None:
    hf = build(name)
    ours = use_absorbed(from_hf(hf), absorbed)
    assert isinstance(ours.blocks[0], MLABlock)
    assert isinstance(ours.spec, MLASpec)
    ids = tokens(2, length(name))
    with torch.no_grad():
        expected = hf(ids).logits
        got = ours(ids)
    assert expected.abs().max() > 1.0  # logits of a sensible size
    torch.testing.assert_close(got, expected, atol=TOL, rtol=0)


@pytest.mark.parametrize("absorbed", [False, True], ids=["naive", "absorbed"])
@pytest.mark.parametrize("name", list(VARIANTS))
def test_greedy_tokens_match_hugging_face_generate(name: str, absorbed: bool) -> None:
    hf = build(name)
    ours = use_absorbed(from_hf(hf), absorbed)
    for batch in (1, 2):  # one prompt; two of the same length
        ids = tokens(batch, PROMPT, seed=batch)
        with torch.no_grad():
            expected = hf_generate(hf, ids, NEW)
        got = generate(ours, ids, NEW)
        assert got.shape == (batch, PROMPT + NEW)
        assert torch.equal(got, expected)


def left_padded(lengths: list[int], n: int, seed: int = 3):
    """Prompts of the given lengths, left-padded to ``n``: ids and the 0/1 mask."""
    ids = tokens(len(lengths), n, seed=seed)
    mask = torch.zeros(len(lengths), n, dtype=torch.long)
    for row, k in enumerate(lengths):
        mask[row, n - k :] = 1
        ids[row, : n - k] = IDS["pad_token_id"]
    return ids, mask


PADDED = ["q-lora", "q-proj-half", "yarn-mscale", "moe", "longrope", "longrope-mscale"]


@pytest.mark.parametrize("absorbed", [False, True], ids=["naive", "absorbed"])
@pytest.mark.parametrize("name", PADDED)
def test_left_padded_batch_logits_match_on_the_real_tokens(name, absorbed) -> None:
    """Positions as Hugging Face's generate gives them: cumsum(mask) - 1."""
    hf = build(name)
    ours = use_absorbed(from_hf(hf), absorbed)
    ids, mask = left_padded([14, 9, 3], 14)
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    with torch.no_grad():
        expected = hf(ids, attention_mask=mask, position_ids=positions).logits
        got = ours(ids, attention_mask=mask)
        alone = ours(ids[1:2, -9:])  # row 1 alone, unpadded
    real = mask.bool()
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got[real], expected[real], atol=TOL, rtol=0)
    torch.testing.assert_close(got[1, -9:], alone[0], atol=TOL, rtol=0)


@pytest.mark.parametrize("absorbed", [False, True], ids=["naive", "absorbed"])
@pytest.mark.parametrize("name", PADDED)
def test_greedy_tokens_of_a_left_padded_batch_match_hugging_face(name, absorbed):
    hf = build(name)
    ours = use_absorbed(from_hf(hf), absorbed)
    ids, mask = left_padded([PROMPT, 7, 3], PROMPT)
    with torch.no_grad():
        expected = hf.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=NEW,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=IDS["pad_token_id"],
        )
    got = generate(ours, ids, NEW, attention_mask=mask)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("name", ["q-lora", "q-proj-half", "yarn-mscale"])
def test_cache_holds_what_hugging_face_caches(name: str) -> None:
    """Per layer one tensor [c, k^R] (B, 1, S, r + d_R): Hugging Face's compressed
    cache, its keys (the normalized latents) and values (the rotated shared rope key)."""
    hf = build(name)
    ours = from_hf(hf)
    ids = tokens(2, 10)
    with torch.no_grad():
        cache = DynamicCache(config=hf.config)
        hf(ids, past_key_values=cache, use_cache=True)
        _, past = ours.decode(ids)
    assert len(past) == hf.config.num_hidden_layers
    for layer, (latent,) in zip(cache.layers, past, strict=True):
        expected = torch.cat((layer.keys, layer.values), dim=-1)
        assert latent.shape == (2, 1, 10, 8 + hf.config.qk_rope_head_dim)
        torch.testing.assert_close(latent, expected, atol=1e-5, rtol=0)


def test_softmax_scale_is_hugging_faces() -> None:
    for name in VARIANTS:
        hf = build(name)
        spec = from_hf(hf).spec
        expected = hf.model.layers[0].self_attn.scaling
        n = spec.num_layers
        assert spec.scales == (pytest.approx(expected, rel=1e-12),) * n, name
    # DeepSeek-V3: 1/sqrt(192) * (0.1 ln 40 + 1)^2
    p = dict(rope_type="yarn", factor=40.0, mscale=1.0, mscale_all_dim=1.0)
    assert mla_softmax_scale(192, p) == pytest.approx(
        192**-0.5 * (0.1 * math.log(40) + 1) ** 2, rel=1e-15
    )
    assert mla_softmax_scale(192) == 192**-0.5
    assert mla_softmax_scale(192, dict(rope_type="yarn", factor=40.0)) == 192**-0.5


@pytest.mark.parametrize(
    ("name", "field", "value"),
    [
        ("q-lora", "rope_interleave", False),  # the layout of the rope pairs
        ("half-layout", "rope_interleave", True),
        ("yarn-mscale", "latent_eps", 0.5),  # the latent norms' epsilon
        ("q-lora", "qk_rope_head_dim", 4),  # sanity: same value, same logits
        ("moe", "routed_scaling_factor", 1.0),
        ("moe", "norm_topk_prob", False),
        ("moe", "topk_group", 4),  # the group limit
        ("moe", "num_experts_per_tok", 2),
    ],
)
def test_each_option_changes_the_logits(name: str, field: str, value: object) -> None:
    """A copy with one field changed (weights kept) differs from Hugging Face by far more
    than the tolerance, so the parity tests above can fail."""
    hf = build(name)
    ours = from_hf(hf)
    changed = Decoder(dataclasses.replace(ours.spec, **{field: value}), block=MLABlock)
    changed.load_state_dict(ours.state_dict())
    ids = tokens(1, length(name))
    with torch.no_grad():
        diff = (changed(ids) - hf(ids).logits).abs().max().item()
    if getattr(ours.spec, field) == value:
        assert diff < TOL
    else:
        assert diff > 100 * TOL


def test_mscale_changes_the_logits() -> None:
    """mscale and mscale_all_dim each move the logits (the scale and the cos/sin)."""
    ids = tokens(1, LONG)
    base = build("yarn-mscale")
    with torch.no_grad():
        ref = from_hf(base)(ids)
        for key in ("mscale", "mscale_all_dim"):
            hf = build("yarn-mscale")
            hf.config.rope_parameters = {**hf.config.rope_parameters, key: 2.0}
            assert (from_hf(hf)(ids) - ref).abs().max() > 100 * TOL, key


@pytest.mark.parametrize("absorbed", [False, True], ids=["naive", "absorbed"])
@pytest.mark.parametrize("name", ["longrope", "longrope-mscale"])
def test_longrope_logits_match_on_both_sides_of_l0(name: str, absorbed: bool) -> None:
    """12 tokens take the short factors, 24 the long ones (max(position_ids) + 1 vs
    L0 = 16, per call); each set moves the logits it governs and only those."""
    hf = build(name)
    ours = use_absorbed(from_hf(hf), absorbed)
    p = ours.spec.rope
    for n, key, other in ((12, "short_factor", "long_factor"), (24, "long_factor", "")):
        ids = tokens(2, n)
        with torch.no_grad():
            expected = hf(ids).logits
            torch.testing.assert_close(ours(ids), expected, atol=TOL, rtol=0)
            for k, moves in ((key, True), (other, False)):
                if not k:
                    continue
                rope = {**p, k: [2.0 * x for x in p[k]]}
                changed = Decoder(dataclasses.replace(ours.spec, rope=rope), MLABlock)
                changed.load_state_dict(ours.state_dict())
                diff = (changed(ids) - expected).abs().max().item()
                assert (diff > 100 * TOL) if moves else (diff < TOL), (n, k)


@pytest.mark.parametrize("name", ["longrope", "longrope-mscale"])
def test_longrope_cached_keys_keep_their_rotation(name: str) -> None:
    """Hugging Face's generate keeps the rope keys cached with the short factors once
    the sequence passes L0; recomputing every position each step (no cache) re-rotates
    them with the long set and picks other tokens, so the greedy parity above can fail."""
    hf = build(name)
    ours = from_hf(hf)
    ids = tokens(1, PROMPT, seed=1)
    with torch.no_grad():
        expected = hf_generate(hf, ids, NEW)
        x = ids
        for _ in range(NEW):
            x = torch.cat((x, ours(x)[:, -1].argmax(-1, keepdim=True)), dim=1)
    assert torch.equal(generate(ours, ids, NEW), expected)
    assert not torch.equal(x, expected)


def test_longrope_softmax_scale_reads_the_factor() -> None:
    """Hugging Face's yarn_apply_mscale for any type but "default": with
    mscale_all_dim 1 and factor 4 the scale is D^-1/2 (0.1 ln 4 + 1)^2."""
    spec = from_hf(build("longrope-mscale")).spec
    assert spec.scales[0] == pytest.approx(10**-0.5 * (0.1 * math.log(4) + 1) ** 2)
    assert from_hf(build("longrope")).spec.scales[0] == 10**-0.5  # no mscale_all_dim


# ---- mixture of experts --------------------------------------------------------------


def test_moe_layers_are_where_the_config_puts_them() -> None:
    ours = from_hf(build("moe"))
    assert [b.moe for b in ours.blocks] == [False, True, True]
    assert [ours.spec.is_moe(i) for i in range(3)] == [False, True, True]
    assert not any(from_hf(build("q-lora")).spec.is_moe(i) for i in range(2))


@pytest.mark.parametrize("name", ["moe", "moe-all"])
def test_router_chooses_as_hugging_face(name: str) -> None:
    """Same experts and weights as DeepseekV3TopkRouter on 200 random tokens."""
    hf = build(name)
    ours = from_hf(hf)
    layer, block = hf.model.layers[-1].mlp.gate, ours.blocks[-1]
    x = torch.randn(200, 32, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        _, w_hf, i_hf = layer(x)
    s = ours.spec
    w, i = mla.route_tokens(
        x,
        block.router,
        block.correction_bias,
        top_k=s.num_experts_per_tok,
        n_group=s.n_group,
        topk_group=s.topk_group,
        norm_topk_prob=s.norm_topk_prob,
        routed_scaling_factor=s.routed_scaling_factor,
    )
    order_hf, order = i_hf.argsort(dim=-1), i.argsort(dim=-1)
    assert torch.equal(i.gather(1, order), i_hf.gather(1, order_hf))
    torch.testing.assert_close(w.gather(1, order), w_hf.gather(1, order_hf))
    # the bias steers which experts, but the weights are the plain sigmoid scores
    scores = torch.sigmoid(x @ block.router.t())
    if not s.norm_topk_prob:
        expected = scores.gather(1, i) * s.routed_scaling_factor
        torch.testing.assert_close(w, expected.float())


def test_correction_bias_stays_float32_in_half_precision() -> None:
    """Hugging Face keeps e_score_correction_bias in float32 in a bfloat16 checkpoint;
    the copy does too (in bfloat16, 0.5 + 1e-3 would round to 0.5)."""
    hf = build("moe", dtype=torch.bfloat16)
    for layer in hf.model.layers[1:]:
        gate = layer.mlp.gate
        gate.e_score_correction_bias = gate.e_score_correction_bias.float() + 1e-3
    ours = from_hf(hf)
    for block, layer in zip(ours.blocks[1:], hf.model.layers[1:], strict=True):
        assert block.correction_bias.dtype == torch.float32
        assert torch.equal(
            block.correction_bias, layer.mlp.gate.e_score_correction_bias
        )
    assert ours.double().blocks[1].correction_bias.dtype == torch.float64


def test_router_options_change_the_choice() -> None:
    """The correction bias and the group limit each change which experts are chosen."""
    x = torch.randn(500, 16, generator=torch.Generator().manual_seed(0))
    weight = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    zero = torch.zeros(8)
    base = mla.route_tokens(x, weight, zero, top_k=2, n_group=4, topk_group=4)[1]
    biased = mla.route_tokens(
        x, weight, torch.linspace(-1, 1, 8), top_k=2, n_group=4, topk_group=4
    )[1]
    limited = mla.route_tokens(x, weight, zero, top_k=2, n_group=4, topk_group=1)[1]

    def same(a, b):
        return (a.sort(dim=-1).values == b.sort(dim=-1).values).all(dim=-1)

    assert (~same(base, biased)).sum() > 50
    assert (~same(base, limited)).sum() > 50
    # topk_group = 1: both experts of every token in one group of 2
    assert (limited // 2)[:, 0].eq((limited // 2)[:, 1]).all()


# ---- the two inference paths ---------------------------------------------------------


def _steps(model: Decoder, ids: torch.Tensor, split: int) -> list[torch.Tensor]:
    """Logits of a prefill of ``split`` tokens, then one token at a time."""
    logits, past = model.decode(ids[:, :split])
    out = [logits]
    for t in range(split, ids.shape[1]):
        logits, past = model.decode(ids[:, t : t + 1], past)
        out.append(logits)
    return out


@pytest.mark.parametrize(
    ("dtype", "tol"), [(torch.float64, 1e-12), (torch.float32, 1e-5)]
)
@pytest.mark.parametrize(
    "name", ["q-lora", "q-proj-half", "yarn-mscale", "bias", "moe-all"]
)
def test_absorbed_path_equals_naive_path(name, dtype, tol) -> None:
    hf = build(name, dtype=dtype)
    naive = from_hf(hf)
    absorbed = use_absorbed(copy.deepcopy(naive))
    ids = tokens(2, 30)
    with torch.no_grad():
        a = _steps(naive, ids, 10)
        b = _steps(absorbed, ids, 10)
        full_a, full_b = naive(ids), absorbed(ids)
    for x, y in zip(a, b, strict=True):
        assert x.dtype == dtype
        torch.testing.assert_close(y, x, atol=tol, rtol=0)
    torch.testing.assert_close(full_b, full_a, atol=tol, rtol=0)


def test_absorbed_block_never_forms_per_head_keys() -> None:
    """The absorbed path reads the cache as one key head: kv_b_proj is never called as
    a layer (its weight is used as W_UK and W_UV directly)."""
    ours = use_absorbed(from_hf(build("q-lora")))
    calls = []
    hooks = [
        b.kv_b_proj.register_forward_hook(lambda *a: calls.append(1))
        for b in ours.blocks
    ]
    with torch.no_grad():
        ours(tokens(1, 8))
        use_absorbed(ours, False)(tokens(1, 8))
    for h in hooks:
        h.remove()
    assert len(calls) == 2  # only the naive call, once per layer


def test_use_absorbed_switches_every_layer_and_back() -> None:
    ours = from_hf(build("q-lora"))
    assert not any(b.absorbed for b in ours.blocks)
    assert use_absorbed(ours) is ours
    assert all(b.absorbed for b in ours.blocks)
    use_absorbed(ours, absorbed=False)
    assert not any(b.absorbed for b in ours.blocks)


# ---- cache size ----------------------------------------------------------------------


def _bytes(past: tuple) -> int:
    return sum(t.numel() * t.element_size() for layer in past for t in layer)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_cache_bytes_per_token_is_what_the_cache_holds(dtype) -> None:
    hf = build("q-lora", dtype=dtype)
    ours = from_hf(hf)
    B, L = 3, 7
    with torch.no_grad():
        _, past = ours.decode(tokens(B, L))
        _, past = ours.decode(tokens(B, 1, seed=2), past)
    measured = _bytes(past) / (B * (L + 1))
    assert cache_bytes_per_token(hf.config, dtype=dtype) == measured
    assert cache_bytes_per_token(ours.spec, dtype=dtype) == measured
    assert cache_bytes(ours, past).per_token == measured  # decoder's measurement
    # the naive path would up-project to what "mha" counts: every head's key and value
    latent = past[0][0]
    block = ours.blocks[0]
    s = ours.spec
    kv = block.kv_b_proj(latent[:, 0, :, : s.kv_lora_rank])
    per_head = kv.numel() + latent[..., s.kv_lora_rank :].numel() * s.num_heads
    assert cache_bytes_per_token(hf.config, "mha", dtype=dtype) == (
        per_head * kv.element_size() * s.num_layers / (B * (L + 1))
    )


def test_cache_bytes_of_deepseek_v3() -> None:
    """Hugging Face's DeepseekV3Config defaults are the published DeepSeek-V3 sizes
    (61 layers, 128 heads, kv_lora_rank 512, qk_rope 64, qk_nope 128, v 128)."""
    c = DeepseekV3Config()
    sizes = (c.num_hidden_layers, c.num_attention_heads, c.kv_lora_rank)
    assert sizes == (61, 128, 512)
    assert (c.qk_rope_head_dim, c.qk_nope_head_dim, c.v_head_dim) == (64, 128, 128)
    bf16 = {k: cache_bytes_per_token(c, k) for k in ("mla", "mha", "mqa")}
    bf16["gqa"] = cache_bytes_per_token(c, "gqa", num_kv_heads=8)
    assert bf16 == {
        "mla": 61 * 576 * 2,  # 70 272
        "mha": 61 * 128 * 320 * 2,  # 4 997 120
        "gqa": 61 * 8 * 320 * 2,
        "mqa": 61 * 320 * 2,  # one head of 192 + 128: smaller than MLA's 576
    }
    assert bf16["mha"] / bf16["mla"] == pytest.approx(71.1, abs=0.05)
    assert cache_bytes_per_token(c, dtype=torch.float32) == 2 * bf16["mla"]


# ---- what is refused -----------------------------------------------------------------


def test_fewer_key_value_heads_are_refused_by_name() -> None:
    hf = DeepseekV3ForCausalLM(_config())
    hf.config.num_key_value_heads = 2
    with pytest.raises(ValueError, match=r"num_key_value_heads=2"):
        from_hf(hf)


def test_port_is_found_without_being_passed() -> None:
    assert "DeepseekV3ForCausalLM" in mla.PORTS
    port = mla.PORTS["DeepseekV3ForCausalLM"]
    assert port.block is MLABlock and port.spec_type is MLASpec
    assert issubclass(MLABlock, DecoderBlock)


def test_cache_is_checked_before_any_computation() -> None:
    ours = from_hf(build("q-lora"))
    _, past = ours.decode(tokens(2, 5))
    with pytest.raises(ValueError, match=r"past\[1\]\[0\].*kv_lora_rank"):
        ours.decode(tokens(2, 1), (past[0], (past[1][0][..., :-1],)))
    with pytest.raises(ValueError, match=r"past\[0\]\[0\].*batch"):
        ours.decode(tokens(1, 1), past)
    with pytest.raises(ValueError, match=r"past\[0\] must hold 1"):
        ours.decode(tokens(2, 1), ((past[0][0], past[0][0]), past[1]))


# ---- bad input -----------------------------------------------------------------------

_SPEC = None


def _spec(**kw: object) -> MLASpec:
    """A valid MLASpec (from the q-lora variant) with fields replaced."""
    global _SPEC
    if _SPEC is None:
        _SPEC = from_hf(build("q-lora")).spec
    return dataclasses.replace(_SPEC, **kw)


def _decoder_spec():
    from companion.decoder import DecoderSpec

    fields = {f.name: getattr(_spec(), f.name) for f in dataclasses.fields(DecoderSpec)}
    return DecoderSpec(**fields)


BAD_INPUTS = [
    ("MLASpec", lambda: _spec(kv_lora_rank=0), ValueError, r"kv_lora_rank"),
    ("MLASpec", lambda: _spec(q_lora_rank=1.5), TypeError, r"q_lora_rank"),
    ("MLASpec", lambda: _spec(qk_rope_head_dim=3), ValueError, r"qk_rope_head_dim"),
    ("MLASpec", lambda: _spec(v_head_dim=-1), ValueError, r"v_head_dim"),
    ("MLASpec", lambda: _spec(rope_interleave=1), TypeError, r"rope_interleave"),
    ("MLASpec", lambda: _spec(latent_eps=0.0), ValueError, r"latent_eps"),
    (
        "MLASpec",
        lambda: _spec(head_dim=12),
        ValueError,
        r"head_dim must be 10 .*qk_nope_head_dim \+ qk_rope_head_dim",
    ),
    (
        "MLASpec",
        lambda: _spec(num_kv_heads=2),
        ValueError,
        r"num_kv_heads must be 4",
    ),
    (
        "MLASpec",
        lambda: _spec(rope={"rope_type": "bogus", "rope_theta": 1e4, "factor": 2.0}),
        ValueError,
        r"rope",
    ),
    (
        "MLASpec",
        lambda: _spec(n_routed_experts=8, moe_intermediate_size=4, n_group=3),
        ValueError,
        r"num_experts_per_tok must be",
    ),
    (
        "MLASpec",
        lambda: _spec(
            n_routed_experts=8,
            moe_intermediate_size=4,
            num_experts_per_tok=2,
            n_group=3,
        ),
        ValueError,
        r"n_group must divide n_routed_experts \(8\)",
    ),
    (
        "MLASpec",
        lambda: _spec(
            n_routed_experts=8,
            moe_intermediate_size=4,
            num_experts_per_tok=2,
            n_group=8,
        ),
        ValueError,
        r"n_group must leave at least 2 experts per group",
    ),
    (
        "MLASpec",
        lambda: _spec(
            n_routed_experts=8,
            moe_intermediate_size=4,
            num_experts_per_tok=5,
            n_group=4,
            topk_group=2,
        ),
        ValueError,
        r"num_experts_per_tok must be at most 4",
    ),
    (
        "MLASpec",
        lambda: _spec(
            n_routed_experts=8,
            moe_intermediate_size=4,
            num_experts_per_tok=2,
            first_k_dense_replace=3,
        ),
        ValueError,
        r"first_k_dense_replace",
    ),
    ("MLASpec", lambda: _spec(n_routed_experts=-1), ValueError, r"n_routed_experts"),
    ("MLASpec.is_moe", lambda: _spec().is_moe(2), ValueError, r"layer"),
    (
        "route_tokens",
        lambda: mla.route_tokens(
            torch.ones(3, 4), torch.ones(8, 5), torch.zeros(8), top_k=2
        ),
        ValueError,
        r"weight",
    ),
    (
        "route_tokens",
        lambda: mla.route_tokens(
            torch.ones(3, 4), torch.ones(8, 4), torch.zeros(7), top_k=2
        ),
        ValueError,
        r"correction_bias",
    ),
    (
        "route_tokens",
        lambda: mla.route_tokens(
            torch.ones(3, 4), torch.ones(8, 4), torch.zeros(8), top_k=2, n_group=8
        ),
        ValueError,
        r"n_group must leave",
    ),
    (
        "route_tokens",
        lambda: mla.route_tokens(
            torch.ones(3, 4), torch.ones(8, 4), torch.zeros(8), top_k=3, n_group=4
        ),
        ValueError,
        r"top_k",
    ),
    (
        "route_tokens",
        lambda: mla.route_tokens(
            torch.ones(4), torch.ones(8, 4), torch.zeros(8), top_k=2
        ),
        ValueError,
        r"x",
    ),
    ("MLABlock", lambda: MLABlock(_decoder_spec(), 0), TypeError, r"spec must be an"),
    ("MLABlock", lambda: MLABlock(_spec(), 2), ValueError, r"layer"),
    (
        "mla_softmax_scale",
        lambda: mla_softmax_scale(0),
        ValueError,
        r"qk_head_dim",
    ),
    (
        "mla_softmax_scale",
        lambda: mla_softmax_scale(192, [("factor", 40)]),
        TypeError,
        r"rope_parameters must be a dict",
    ),
    (
        "mla_softmax_scale",
        lambda: mla_softmax_scale(192, {"rope_type": "yarn", "mscale_all_dim": 1.0}),
        TypeError,
        r"rope_parameters\['factor'\]",
    ),
    (
        "use_absorbed",
        lambda: use_absorbed(nn.Linear(2, 2)),
        TypeError,
        r"model must be a Decoder",
    ),
    (
        "use_absorbed",
        lambda: use_absorbed(Decoder(_decoder_spec())),
        ValueError,
        r"model must have MLABlock layers .* got DecoderBlock layers",
    ),
    (
        "use_absorbed",
        lambda: use_absorbed(from_hf(build("q-lora")), 1),
        TypeError,
        r"absorbed must be a bool",
    ),
    (
        "cache_bytes_per_token",
        lambda: cache_bytes_per_token(DeepseekV3Config(), "mhla"),
        ValueError,
        r"attention must be one of",
    ),
    (
        "cache_bytes_per_token",
        lambda: cache_bytes_per_token(DeepseekV3Config(), "gqa"),
        TypeError,
        r"num_kv_heads",
    ),
    (
        "cache_bytes_per_token",
        lambda: cache_bytes_per_token(DeepseekV3Config(), "gqa", num_kv_heads=3),
        ValueError,
        r"num_kv_heads must divide num_heads \(128\)",
    ),
    (
        "cache_bytes_per_token",
        lambda: cache_bytes_per_token(DeepseekV3Config(), num_kv_heads=8),
        ValueError,
        r"num_kv_heads must be None unless attention='gqa'",
    ),
    (
        "cache_bytes_per_token",
        lambda: cache_bytes_per_token(DeepseekV3Config(), dtype=torch.int8),
        TypeError,
        r"dtype",
    ),
    (
        "cache_bytes_per_token",
        lambda: cache_bytes_per_token({"kv_lora_rank": 512}),
        TypeError,
        r"config must be a config object",
    ),
    (
        "cache_bytes_per_token",
        lambda: cache_bytes_per_token(types.SimpleNamespace(kv_lora_rank=512)),
        ValueError,
        r"config must give num_hidden_layers",
    ),
]


@pytest.mark.parametrize(
    ("name", "thunk", "error", "match"), BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS]
)
def test_bad_input_raises_a_clear_error(name: str, thunk, error: type, match: str):
    with pytest.raises(error, match=match):
        thunk()
