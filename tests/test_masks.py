"""Tests for companion.masks: mask predicates, FlexAttention's score modifiers and the
learned sink column.

Oracles: Hugging Face transformers 5.23's ``masking_utils`` (the mask functions,
``sdpa_mask``, ``eager_mask``) and GPT-OSS's ``eager_attention_forward``; NumPy float64
loops written from the formulas; ``torch.nn.functional.scaled_dot_product_attention``;
``torch.nn.attention.flex_attention`` run eagerly on the CPU; float64 autograd.
"""

from __future__ import annotations

import types
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from companion import masks
from companion.extension import alibi_bias
from companion.modern import softcapped_attention

mu = pytest.importorskip("transformers.masking_utils")
gpt_oss = pytest.importorskip("transformers.models.gpt_oss.modeling_gpt_oss")
flex = pytest.importorskip("torch.nn.attention.flex_attention")

F64 = torch.float64
# sequences longer than every window and chunk below, with a KV cache before the queries
B, H, CACHE, L = 3, 4, 5, 19
S = CACHE + L
WINDOW, CHUNK = 4, 6


def _left_padded(lengths: list[int], total: int) -> torch.Tensor:
    """HF's 2-D attention_mask of left-padded rows of the given lengths."""
    return torch.tensor([[0] * (total - n) + [1] * n for n in lengths])


ATTENTION_MASK = _left_padded([S, S - 3, S - 8], S)  # (B, S) int64
LEFT_PADDING = (ATTENTION_MASK.cumsum(-1) == 0).sum(-1)  # HF's count: [0, 3, 8]
DOCS = torch.tensor(
    [[0] * 7 + [1] * 10 + [2] * 7, [0] * 24, [0] * 3 + [1] * 3 + [2] * 18]
)  # (B, S), documents of lengths 7/10/7, 24, 3/3/18


def _hf_sdpa(
    mask_function, attention_mask=None, q_length=L, kv_length=S, q_offset=CACHE
):
    return mu.sdpa_mask(
        batch_size=B, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
        mask_function=mask_function, attention_mask=attention_mask,
        allow_is_causal_skip=False,
    )  # fmt: skip


def _mine(mod, **kw):
    return masks.materialize_mask(mod, B, L, S, cache_length=CACHE, **kw)


# ---- the predicates against transformers.masking_utils ----------------------------------

PAIRS = {  # name -> (ours, HF's), on the same inputs
    "causal": (masks.causal, mu.causal_mask_function),
    "sliding": (
        masks.sliding_window_causal(WINDOW),
        mu.sliding_window_causal_mask_function(WINDOW),
    ),
    "sliding_1": (
        masks.sliding_window_causal(1),
        mu.sliding_window_causal_mask_function(1),
    ),
    "chunked": (
        masks.chunked_causal(CHUNK, left_padding=LEFT_PADDING),
        mu.chunked_causal_mask_function(CHUNK, LEFT_PADDING),
    ),
    "chunked_unpadded": (
        masks.chunked_causal(CHUNK),
        mu.chunked_causal_mask_function(CHUNK, torch.zeros(B, dtype=torch.long)),
    ),
    "padding": (
        masks.padding(ATTENTION_MASK),
        mu.padding_mask_function(ATTENTION_MASK.bool()),
    ),
    "documents": (
        masks.and_masks(masks.causal, masks.same_document(DOCS)),
        mu.and_masks(mu.causal_mask_function, mu.packed_sequence_mask_function(DOCS)),
    ),
    "sliding_or_documents": (
        masks.or_masks(masks.sliding_window_causal(WINDOW), masks.same_document(DOCS)),
        mu.or_masks(
            mu.sliding_window_causal_mask_function(WINDOW),
            mu.packed_sequence_mask_function(DOCS),
        ),
    ),
}


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_predicate_equals_hf_with_a_cache_offset(name: str) -> None:
    ours, theirs = PAIRS[name]
    got = _mine(ours)
    want = _hf_sdpa(theirs)
    assert got.shape == want.shape == (B, 1, L, S) and got.dtype == torch.bool
    assert torch.equal(got, want)
    assert got.any(-1).any() and not got.all()  # neither empty nor full


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (masks.causal, mu.causal_mask_function),
        (masks.sliding_window_causal(WINDOW), mu.sliding_window_causal_mask_function(WINDOW)),
        (
            masks.chunked_causal(CHUNK, left_padding=LEFT_PADDING),
            mu.chunked_causal_mask_function(CHUNK, LEFT_PADDING),
        ),
    ],
    ids=["causal", "sliding", "chunked"],
)  # fmt: skip
def test_with_left_padding_equals_hf_sdpa_and_eager_mask(ours, theirs) -> None:
    """HF adds the 2-D attention_mask itself; ours is an explicit and_masks."""
    mine = _mine(masks.and_masks(ours, masks.padding(ATTENTION_MASK)))
    assert torch.equal(mine, _hf_sdpa(theirs, attention_mask=ATTENTION_MASK.bool()))
    eager = mu.eager_mask(
        batch_size=B, q_length=L, kv_length=S, q_offset=CACHE,
        mask_function=theirs, attention_mask=ATTENTION_MASK.bool(), dtype=torch.float32,
    )  # fmt: skip
    assert torch.equal(eager == 0, mine)
    assert (eager[~mine] == torch.finfo(torch.float32).min).all()


def _hf_cache():
    """A DynamicCache that already holds CACHE tokens (HF reads q_offset from it)."""
    from transformers.cache_utils import DynamicCache

    cache = DynamicCache()
    cache.update(torch.zeros(B, 1, CACHE, 2), torch.zeros(B, 1, CACHE, 2), 0)
    return cache


def test_equal_to_hf_create_mask_from_configs() -> None:
    """HF's own entry points, from a GPT-OSS config (sliding), a Llama 4 config
    (chunked: HF counts the left padding itself) and packed position_ids (documents)."""
    from transformers import GptOssConfig, Llama4TextConfig, LlamaConfig

    def sdpa(config):
        config._attn_implementation = "sdpa"
        return config

    emb = torch.zeros(B, L, 4)
    hf = mu.create_sliding_window_causal_mask(
        config=sdpa(GptOssConfig(sliding_window=WINDOW, num_hidden_layers=1)),
        inputs_embeds=emb, attention_mask=ATTENTION_MASK, past_key_values=_hf_cache(),
        allow_is_causal_skip=False,
    )  # fmt: skip
    pad = masks.padding(ATTENTION_MASK)
    assert torch.equal(
        hf, _mine(masks.and_masks(masks.sliding_window_causal(WINDOW), pad))
    )
    hf = mu.create_chunked_causal_mask(
        config=sdpa(Llama4TextConfig(attention_chunk_size=CHUNK, num_hidden_layers=1)),
        inputs_embeds=emb, attention_mask=ATTENTION_MASK, past_key_values=_hf_cache(),
    )  # fmt: skip
    chunked = masks.chunked_causal(CHUNK, left_padding=LEFT_PADDING)
    assert torch.equal(hf, _mine(masks.and_masks(chunked, pad)))
    positions = torch.cat([torch.arange(n) for n in (7, 10, 7)]).expand(B, S)
    hf = mu.create_causal_mask(
        config=sdpa(LlamaConfig(num_hidden_layers=1)), inputs_embeds=torch.zeros(B, S, 4),
        attention_mask=None, past_key_values=None, position_ids=positions,
    )  # fmt: skip
    docs = masks.same_document(DOCS[:1].expand(B, S))
    want = masks.materialize_mask(masks.and_masks(masks.causal, docs), B, S, S)
    assert torch.equal(hf, want)


def test_offset_queries_is_the_cache_length() -> None:
    mod = masks.sliding_window_causal(WINDOW)
    shifted = masks.materialize_mask(masks.offset_queries(mod, CACHE), B, L, S)
    assert torch.equal(shifted, _mine(mod))
    want = mu.sdpa_mask(
        batch_size=B, q_length=L, kv_length=S,
        mask_function=mu.add_offsets_to_mask_function(
            mu.sliding_window_causal_mask_function(WINDOW), CACHE, 0
        ),
        allow_is_causal_skip=False,
    )  # fmt: skip
    assert torch.equal(shifted, want)


@given(
    window=st.integers(1, 12),
    chunk=st.integers(1, 12),
    length=st.integers(1, 20),
    cache=st.integers(0, 15),
    pad=st.integers(0, 10),
)
def test_random_windows_chunks_and_offsets_equal_hf(window, chunk, length, cache, pad):
    """Any window, chunk, query length, cache length and left padding: HF's sdpa_mask."""
    kv = cache + length
    am = _left_padded([kv, max(kv - pad, 0)], kv).bool()  # (2, S)
    left = (am.cumsum(-1) == 0).sum(-1)
    for ours, theirs in (
        (
            masks.sliding_window_causal(window),
            mu.sliding_window_causal_mask_function(window),
        ),
        (
            masks.chunked_causal(chunk, left_padding=left),
            mu.chunked_causal_mask_function(chunk, left),
        ),
    ):
        got = masks.materialize_mask(
            masks.and_masks(ours, masks.padding(am)), 2, length, kv, cache_length=cache
        )
        want = mu.sdpa_mask(
            batch_size=2,
            q_length=length,
            kv_length=kv,
            q_offset=cache,
            mask_function=theirs,
            attention_mask=am,
            allow_is_causal_skip=False,
        )
        assert torch.equal(got, want)


def _loop(allowed) -> torch.Tensor:
    """The mask from a Python loop over (b, i, j), i the absolute query position."""
    out = np.zeros((B, 1, L, S), dtype=bool)
    for b in range(B):
        for row in range(L):
            for j in range(S):
                out[b, 0, row, j] = allowed(b, CACHE + row, j)
    return torch.from_numpy(out)


def test_sliding_window_allows_offsets_zero_to_window_minus_one() -> None:
    """HF's convention: W keys, the query's own included (GPT-OSS: 128)."""
    got = _mine(masks.sliding_window_causal(WINDOW))
    assert torch.equal(got, _loop(lambda b, i, j: 0 <= i - j <= WINDOW - 1))
    assert (got.sum(-1) == WINDOW).all()  # every query is past the first window
    hf_128 = mu.sdpa_mask(
        batch_size=1, q_length=300, kv_length=300, allow_is_causal_skip=False,
        mask_function=mu.sliding_window_causal_mask_function(128),
    )  # fmt: skip
    mine_128 = masks.materialize_mask(masks.sliding_window_causal(128), 1, 300, 300)
    assert torch.equal(mine_128, hf_128) and mine_128.sum(-1).max() == 128


def test_chunked_and_prefix_lm_against_loops() -> None:
    pad = LEFT_PADDING.tolist()
    chunked = _loop(
        lambda b, i, j: j <= i and (j - pad[b]) // CHUNK == (i - pad[b]) // CHUNK
    )
    assert torch.equal(
        _mine(masks.chunked_causal(CHUNK, left_padding=LEFT_PADDING)), chunked
    )
    prefix = [0, 9, S]
    want = _loop(lambda b, i, j: j <= i or j < prefix[b])
    assert torch.equal(_mine(masks.prefix_lm(torch.tensor(prefix))), want)
    assert torch.equal(_mine(masks.prefix_lm(0)), _mine(masks.causal))
    assert _mine(masks.prefix_lm(S)).all()  # a prefix over everything: bidirectional
    docs = DOCS.tolist()
    want = _loop(lambda b, i, j: docs[b][i] == docs[b][j])
    assert torch.equal(_mine(masks.same_document(DOCS)), want)


def test_right_padding_and_head_dependent_predicates() -> None:
    right = torch.flip(ATTENTION_MASK, dims=[1]).bool()
    want = _hf_sdpa(mu.bidirectional_mask_function, attention_mask=right)
    assert torch.equal(_mine(masks.padding(right)), want)
    assert not want[2].all() and want[0].all()
    per_head = masks.and_masks(masks.causal, lambda b, h, q, kv: kv >= h)
    got = _mine(per_head, num_heads=H)
    assert got.shape == (B, H, L, S)
    assert torch.equal(got, _loop(lambda b, i, j: j <= i).expand(B, H, L, S) & (
        torch.arange(S) >= torch.arange(H)[:, None, None]))  # fmt: skip


def test_transposed_index_tensors_are_normal_inputs() -> None:
    ids_t = DOCS.T.contiguous().T  # a transposed view of the same values
    assert not ids_t.is_contiguous()
    assert torch.equal(
        _mine(masks.same_document(ids_t)), _mine(masks.same_document(DOCS))
    )
    am_t = ATTENTION_MASK.T.contiguous().T
    assert torch.equal(_mine(masks.padding(am_t)), _mine(masks.padding(ATTENTION_MASK)))


# ---- used by SDPA and by FlexAttention -----------------------------------------------------


def _eager64(q, k, v, allowed, bias=None, cap=None) -> torch.Tensor:
    """float64 NumPy attention; a fully masked row gives zeros (torch's convention)."""
    q, k, v = (t.detach().double().numpy() for t in (q, k, v))
    s = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    if cap is not None:
        s = cap * np.tanh(s / cap)
    if bias is not None:
        s = s + bias
    allowed = np.broadcast_to(allowed.numpy(), s.shape)
    s = np.where(allowed, s, -np.inf)
    top = np.max(s, axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    e = np.where(allowed, np.exp(s - top), 0.0)
    total = e.sum(-1, keepdims=True)
    p = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    return torch.from_numpy(p @ v)


def _qkv(seed: int, length: int = L, kv_length: int = S, d: int = 8):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(B, H, length, d, generator=g),
        torch.randn(B, H, kv_length, d, generator=g),
        torch.randn(B, H, kv_length, d, generator=g),
    )


FLEX_CASES = {
    "causal": masks.causal,
    "sliding_padded": masks.and_masks(
        masks.sliding_window_causal(WINDOW), masks.padding(ATTENTION_MASK)
    ),
    "chunked_padded": masks.and_masks(
        masks.chunked_causal(CHUNK, left_padding=LEFT_PADDING),
        masks.padding(ATTENTION_MASK),
    ),
    "documents": masks.and_masks(masks.causal, masks.same_document(DOCS)),
    "prefix_lm": masks.prefix_lm(torch.tensor([0, 9, 14])),
}


def _flex(q, k, v, mod, cache=CACHE, **kw):
    block = flex.create_block_mask(
        masks.offset_queries(mod, cache), B, None, q.shape[2], k.shape[2], device="cpu"
    )
    with (
        warnings.catch_warnings()
    ):  # "called without torch.compile()": eager on purpose
        warnings.simplefilter("ignore", UserWarning)
        return flex.flex_attention(q, k, v, block_mask=block, **kw)


@pytest.mark.parametrize("name", sorted(FLEX_CASES))
def test_sdpa_and_flex_equal_the_float64_reference(name: str) -> None:
    mod = FLEX_CASES[name]
    q, k, v = _qkv(1)
    allowed = _mine(mod)
    want = _eager64(q, k, v, allowed)
    vmapped = flex.create_mask(
        masks.offset_queries(mod, CACHE), B, 1, L, S, device="cpu"
    )
    assert torch.equal(vmapped, allowed)  # torch's own materialiser (vmap) agrees
    sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
    torch.testing.assert_close(sdpa.double(), want, atol=1e-5, rtol=1e-5)
    got = _flex(q, k, v, mod)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    empty = ~allowed.any(-1, keepdim=True)  # fully masked rows (left padding)
    if name.endswith("padded"):
        assert empty.any()
        assert (sdpa.masked_select(empty) == 0).all() and (
            got.masked_select(empty) == 0
        ).all()


def test_flex_attention_on_cpu_runs_forward_and_refuses_backward() -> None:
    """torch 2.13: the eager forward runs on CPU; any input requiring grad is refused."""
    q, k, v = _qkv(2)
    assert torch.isfinite(_flex(q, k, v, masks.causal)).all()
    with pytest.raises(NotImplementedError, match="does not support backward on CPU"):
        _flex(q.requires_grad_(), k, v, masks.causal)


def test_score_mods_equal_their_eager_references() -> None:
    q, k, v = _qkv(3)
    q = q * 4  # scores of a few tens, where a cap of 5 bends them
    allowed = _mine(masks.causal)
    got = _flex(q, k, v, masks.causal, score_mod=masks.softcap_score_mod(5.0))
    want = _eager64(q, k, v, allowed, cap=5.0)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    q0, k0, v0 = (
        t[..., CACHE:, :] for t in (q, k, v)
    )  # no cache: Gemma's own function
    plain = _flex(
        q0, k0, v0, masks.causal, cache=0, score_mod=masks.softcap_score_mod(5.0)
    )
    torch.testing.assert_close(
        plain, softcapped_attention(q0, k0, v0, cap=5.0, is_causal=True)
    )

    alibi = masks.alibi_score_mod(H, query_offset=CACHE)
    got = _flex(q, k, v, masks.causal, score_mod=alibi)
    bias = alibi_bias(
        H, L, S, dtype=F64
    ).numpy()  # queries at the last L keys, -inf after
    want = _eager64(q, k, v, allowed, bias=np.where(np.isfinite(bias), bias, 0.0))
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


# ---- the learned sink column ---------------------------------------------------------------


def _sink_reference(q, k, v, sinks, allowed) -> torch.Tensor:
    """float64 autograd, written from the formula: softmax over [scores, sink], column dropped."""
    s = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    s = s.masked_fill(~allowed, float("-inf"))
    col = sinks[None, :, None, None].expand(*s.shape[:3], 1)
    z = torch.cat([s, col], -1)
    e = torch.exp(z - z.max(-1, keepdim=True).values)
    return (e / e.sum(-1, keepdim=True))[..., :-1] @ v


def _hf_gpt_oss(q, k, v, sinks, float_mask):
    kv_groups = q.shape[1] // k.shape[1]
    module = types.SimpleNamespace(
        num_key_value_groups=kv_groups, sinks=sinks, training=False
    )
    out, _ = gpt_oss.eager_attention_forward(
        module, q, k, v, float_mask, scaling=q.shape[-1] ** -0.5
    )
    return out.transpose(1, 2)  # HF returns (B, L, H, D)


def _gpt_oss_mask():
    """HF's GPT-OSS sliding layer mask (eager: 0 / finfo.min), left padded, after a cache;
    row 2's first queries are padding: fully masked."""
    return mu.eager_mask(
        batch_size=B, q_length=L, kv_length=S, q_offset=CACHE, dtype=torch.float32,
        mask_function=mu.sliding_window_causal_mask_function(WINDOW),
        attention_mask=ATTENTION_MASK.bool(),
    )  # fmt: skip


@pytest.mark.parametrize("kv_heads", [H, 2])
def test_sinks_equal_hf_gpt_oss_eager(kv_heads: int) -> None:
    q, k, v = _qkv(4)
    k, v = k[:, :kv_heads], v[:, :kv_heads]
    sinks = torch.randn(H, generator=torch.Generator().manual_seed(5)) * 2
    hf_mask = _gpt_oss_mask()
    allowed = _mine(
        masks.and_masks(
            masks.sliding_window_causal(WINDOW), masks.padding(ATTENTION_MASK)
        )
    )
    assert torch.equal(allowed, hf_mask == 0)
    empty = ~allowed.any(-1)  # (B, 1, L)
    assert empty.sum() == 3  # row 2: its 8 padding tokens, 5 of them in the cache
    want = _hf_gpt_oss(q, k, v, sinks, hf_mask)
    for mask in (allowed, hf_mask):  # our bool mask and HF's additive one
        got = masks.attention_with_sinks(q, k, v, sinks, mask)
        torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)
        assert (got[empty.expand(B, H, L)] == 0).all()  # all mass on the sink: zeros
    assert (want[empty.expand(B, H, L)] == 0).all()  # HF gives zeros too
    assert torch.softmax(torch.full((S,), -torch.inf), 0).isnan().all()  # no sink: NaN


def test_sink_gradients_equal_float64_autograd_and_the_closed_form() -> None:
    q, k, v = _qkv(6)
    q, k, v = (
        t[:, :, :, :].transpose(2, 3).contiguous().transpose(2, 3) for t in (q, k, v)
    )
    q = (
        q.transpose(1, 2).contiguous().transpose(1, 2)
    )  # transposed views: normal inputs
    assert not q.is_contiguous()
    sinks = torch.randn(H, generator=torch.Generator().manual_seed(7))
    allowed = _mine(
        masks.and_masks(
            masks.sliding_window_causal(WINDOW), masks.padding(ATTENTION_MASK)
        )
    )
    grad_out = torch.randn(B, H, L, 8, generator=torch.Generator().manual_seed(8))
    inputs = [t.detach().clone().requires_grad_() for t in (q, k, v, sinks)]
    out = masks.attention_with_sinks(*inputs, allowed)
    out.backward(grad_out)
    refs = [t.detach().double().requires_grad_() for t in (q, k, v, sinks)]
    ref = _sink_reference(*refs, allowed)
    ref.backward(grad_out.double())
    torch.testing.assert_close(out.double(), ref, atol=1e-6, rtol=1e-5)
    for mine, theirs in zip(inputs, refs, strict=True):
        assert torch.isfinite(mine.grad).all()
        torch.testing.assert_close(
            mine.grad.double(), theirs.grad, atol=1e-5, rtol=1e-5
        )
    # the identity the kernel backward uses: d sink_h = -sum_i p_sink_i * D_i
    s = (q.double() @ k.double().transpose(-2, -1)) * 8**-0.5
    lse = s.masked_fill(~allowed, float("-inf")).logsumexp(-1)  # (B, H, L), no sink
    closed = masks.sink_gradient(ref.detach(), grad_out.double(), lse, sinks.double())
    torch.testing.assert_close(closed, refs[3].grad, atol=1e-10, rtol=1e-10)


def test_apply_sinks_after_flex_equals_attention_with_sinks() -> None:
    q, k, v = _qkv(9)
    sinks = torch.randn(H, generator=torch.Generator().manual_seed(10))
    mod = FLEX_CASES["sliding_padded"]
    out, aux = _flex(q, k, v, mod, return_aux=flex.AuxRequest(lse=True))
    got = masks.apply_sinks(out, aux.lse, sinks)
    want = masks.attention_with_sinks(q, k, v, sinks, _mine(mod))
    torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)
    assert torch.isinf(aux.lse).any()  # the fully masked rows: lse = -inf, output zero


@given(sink=st.floats(-30.0, 30.0), seed=st.integers(0, 2**16))
def test_the_sink_takes_mass_and_gives_no_value(sink: float, seed: int) -> None:
    """Rows of weights sum to 1 - p_sink = sigmoid(lse - sink) (read with value = 1);
    a sink of -inf is attention without it."""
    g = torch.Generator().manual_seed(seed)
    q, k = (
        torch.randn(1, 2, 5, 4, generator=g, dtype=F64),
        torch.randn(1, 2, 7, 4, generator=g, dtype=F64),
    )
    sinks = torch.tensor([sink, -sink], dtype=F64)
    ones = torch.ones(1, 2, 7, 1, dtype=F64)
    mass = masks.attention_with_sinks(q, k, ones, sinks)[..., 0]  # (1, 2, 5)
    lse = (q @ k.transpose(-2, -1) / 2).logsumexp(-1)
    torch.testing.assert_close(mass, torch.sigmoid(lse - sinks[None, :, None]))
    v = torch.randn(1, 2, 7, 3, generator=g, dtype=F64)
    none = masks.attention_with_sinks(q, k, v, torch.full((2,), -torch.inf, dtype=F64))
    torch.testing.assert_close(none, F.scaled_dot_product_attention(q, k, v))


def test_sinks_half_precision_keeps_dtype() -> None:
    q, k, v = (t.to(torch.bfloat16) for t in _qkv(11))
    sinks = torch.zeros(H, dtype=torch.bfloat16)
    got = masks.attention_with_sinks(q, k, v, sinks, _mine(masks.causal))
    assert got.dtype == torch.bfloat16
    want = masks.attention_with_sinks(
        *(t.float() for t in (q, k, v, sinks)), _mine(masks.causal)
    )
    torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2e-2)


# ---- bad input -----------------------------------------------------------------------------

Q, K, V = _qkv(0)
SINKS = torch.zeros(H)
OUT, LSE = torch.zeros(B, H, L, 8), torch.zeros(B, H, L)

BAD_INPUTS = [
    ("sliding_window_causal", lambda: masks.sliding_window_causal(-3), ValueError, r"^window must be a positive int, got -3"),
    ("sliding_window_causal", lambda: masks.sliding_window_causal(0), ValueError, r"^window must be a positive"),
    ("sliding_window_causal", lambda: masks.sliding_window_causal(4.0), TypeError, r"^window must be an int"),
    ("chunked_causal", lambda: masks.chunked_causal(0), ValueError, r"^chunk_size must be a positive"),
    ("chunked_causal", lambda: masks.chunked_causal(4, left_padding=torch.ones(3)), TypeError, r"^left_padding must be an integer tensor"),
    ("chunked_causal", lambda: masks.chunked_causal(4, left_padding=torch.tensor([0, -1])), ValueError, r"^left_padding must be >= 0"),
    ("same_document", lambda: masks.same_document(torch.zeros(S, dtype=torch.long)), ValueError, r"^document_ids must have 2 dimensions \(B, S\)"),
    ("same_document", lambda: masks.same_document([[0, 1]]), TypeError, r"^document_ids must be a torch.Tensor"),
    ("prefix_lm", lambda: masks.prefix_lm(-1), ValueError, r"^prefix_lengths must be an int >= 0"),
    ("prefix_lm", lambda: masks.prefix_lm(torch.tensor([[1]])), ValueError, r"^prefix_lengths must have 1 dimensions"),
    ("padding", lambda: masks.padding(torch.ones(B, S)), TypeError, r"^attention_mask must be a integer or bool tensor|^attention_mask must be an integer or bool"),
    ("padding", lambda: masks.padding(torch.full((B, S), 2)), ValueError, r"^attention_mask must hold only 0 and 1"),
    ("and_masks", lambda: masks.and_masks(masks.causal, "causal"), TypeError, r"^mask_mods\[1\] must be callable"),
    ("and_masks", lambda: masks.and_masks(), TypeError, r"^mask_mods must hold at least one predicate \(and_masks\), got none"),
    ("and_masks", lambda: masks.and_masks(masks.padding(ATTENTION_MASK), masks.same_document(DOCS[:2])), ValueError, r"^mask_mods must read tensors of one batch size"),
    ("or_masks", lambda: masks.or_masks(None), TypeError, r"^mask_mods\[0\] must be callable"),
    ("offset_queries", lambda: masks.offset_queries(masks.causal, -1), ValueError, r"^offset must be an int >= 0"),
    ("offset_queries", lambda: masks.offset_queries(3, 1), TypeError, r"^mask_mod must be callable"),
    ("materialize_mask", lambda: masks.materialize_mask(masks.padding(ATTENTION_MASK), B + 1, L, S), ValueError, r"^batch_size must be the batch of the tensors mask_mod reads \(3\), got 4"),
    ("materialize_mask", lambda: masks.materialize_mask(masks.same_document(DOCS), B, L, S, cache_length=S), ValueError, r"^cache_length \+ query_length and key_length must be <= the 24 positions"),
    ("materialize_mask", lambda: masks.materialize_mask(masks.causal, 0, L, S), ValueError, r"^batch_size must be a positive"),
    ("materialize_mask", lambda: masks.materialize_mask(masks.causal, B, -1, S), ValueError, r"^query_length must be an int >= 0"),
    ("materialize_mask", lambda: masks.materialize_mask(masks.causal, B, L, S, num_heads=0), ValueError, r"^num_heads must be a positive"),
    ("materialize_mask", lambda: masks.materialize_mask(lambda b, h, q, kv: kv - q, B, L, S), TypeError, r"^mask_mod must return a bool tensor"),
    ("softcap_score_mod", lambda: masks.softcap_score_mod(0.0), ValueError, r"^cap must be a real number > 0"),
    ("alibi_score_mod", lambda: masks.alibi_score_mod(0), ValueError, r"^num_heads must be a positive"),
    ("alibi_score_mod", lambda: masks.alibi_score_mod(4, query_offset=-2), ValueError, r"^query_offset must be an int >= 0"),
    ("attention_with_sinks", lambda: masks.attention_with_sinks(Q, K, V, torch.zeros(H + 1)), ValueError, r"^sinks must have shape \(H,\) \(4,\), got shape \(5,\)"),
    ("attention_with_sinks", lambda: masks.attention_with_sinks(Q, K, V, SINKS.double()), TypeError, r"^sinks must have query's dtype"),
    ("attention_with_sinks", lambda: masks.attention_with_sinks(Q.long(), K, V, SINKS), TypeError, r"^query must be a floating-point tensor"),
    ("attention_with_sinks", lambda: masks.attention_with_sinks(Q[0], K, V, SINKS), ValueError, r"^query must have 4 dimensions \(B, H, L, D\)"),
    ("attention_with_sinks", lambda: masks.attention_with_sinks(Q, K[:, :3], V[:, :3], SINKS), ValueError, r"^key must have a number of heads that divides query's \(4\)"),
    ("attention_with_sinks", lambda: masks.attention_with_sinks(Q, K, V[:, :, :-1], SINKS), ValueError, r"^key and value must have the same length \(S\) size"),
    ("attention_with_sinks", lambda: masks.attention_with_sinks(Q, K, V, SINKS, mask=torch.ones(L, S, dtype=torch.long)), TypeError, r"^mask must be a bool or floating tensor"),
    ("attention_with_sinks", lambda: masks.attention_with_sinks(Q, K, V, SINKS, mask=torch.ones(L + 1, S, dtype=torch.bool)), ValueError, r"^mask must broadcast to"),
    ("attention_with_sinks", lambda: masks.attention_with_sinks(Q, K, V, SINKS, scale=-1.0), ValueError, r"^scale must be a real number > 0"),
    ("apply_sinks", lambda: masks.apply_sinks(OUT, LSE[..., :-1], SINKS), ValueError, r"^lse must have shape \(B, H, L\)"),
    ("apply_sinks", lambda: masks.apply_sinks(OUT, LSE, SINKS[:2]), ValueError, r"^sinks must have shape \(H,\)"),
    ("sink_gradient", lambda: masks.sink_gradient(OUT, OUT[..., :4], LSE, SINKS), ValueError, r"^grad_output must have shape \(B, H, L, Dv\)"),
    ("sink_gradient", lambda: masks.sink_gradient(OUT, OUT.double(), LSE, SINKS), TypeError, r"^grad_output must have output's dtype"),
]  # fmt: skip


NO_BAD_INPUTS = {
    "causal": "a predicate: materialize_mask and FlexAttention call it with index tensors",
}
