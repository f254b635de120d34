"""Learned sinks and grouped-query attention in the FlashAttention kernels
(``flash_attention(..., sinks=...)`` with ``key``/``value`` of ``H_kv`` heads, issue 34)
against the reference, :func:`companion.masks.attention_with_sinks` (itself equal to Hugging
Face's GPT-OSS eager attention, tested in ``tests/test_masks.py``) on keys and values
repeated with ``repeat_interleave`` (Hugging Face's ``repeat_kv``: query head ``h`` reads KV
head ``h // (H // H_kv)``), differentiated by float64 autograd; against torch's SDPA with
``enable_gqa=True`` where there is no sink; and against the sink's closed-form gradient
:func:`companion.masks.sink_gradient`.

Without a GPU the kernels run through Triton's interpreter on CPU tensors (small sizes); it
takes bfloat16 inputs (loaded, then multiplied in float32), so the bfloat16 test runs there
too. The bad inputs (``sinks``, grouped heads) are in ``tests/test_kernels.py``'s
``BAD_INPUTS``, which the contract test reads."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from companion import masks

kernels = pytest.importorskip("companion.kernels", reason="Triton is not installed")

DEVICE = torch.device("cpu" if kernels.interpreted() else "cuda")


def _reference(q, k, v, sinks, grad_out, is_causal, scale):
    """Float64 autograd through the reference: output, log-sum-exp of the scores with
    the sink's column, the four gradients, and the log-sum-exp without the sink. Keys
    and values of ``H_kv < H`` heads are repeated to ``H`` (each KV head once per query
    head of its group, as Hugging Face's ``repeat_kv``) inside the graph, so their
    gradients are the sums over each group."""
    ins = [t.detach().double().requires_grad_() for t in (q, k, v, sinks)]
    q64, k64, v64, s64 = ins
    group = q.shape[1] // k.shape[1]
    k64, v64 = (t.repeat_interleave(group, dim=1) for t in (k64, v64))
    mask = None
    if is_causal:  # top-left, j <= i, as the kernel's is_causal
        mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device)
        mask = mask.tril()
    out = masks.attention_with_sinks(q64, k64, v64, s64, mask=mask, scale=scale)
    grads = torch.autograd.grad(out, ins, grad_out.double())
    with torch.no_grad():
        scores = q64 @ k64.transpose(-2, -1) * scale  # (B, H, L, S)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        column = s64[None, :, None, None].expand(*scores.shape[:3], 1)
        lse = torch.logsumexp(torch.cat([scores, column], -1), -1)  # (B, H, L)
        lse_plain = torch.logsumexp(scores, -1)
    return out.detach(), lse, grads, lse_plain


def _err(got: torch.Tensor, want: torch.Tensor) -> float:
    return (got.double() - want).abs().max().item()  # NaN fails every `< tol`


@pytest.mark.parametrize(
    ("is_causal", "q_len", "k_len"), [(False, 37, 41), (True, 33, 33), (True, 40, 24)]
)
def test_sinks_forward_and_gradients_match_the_reference(
    is_causal, q_len, k_len
) -> None:
    """Output, log-sum-exp (the sink included) and the gradients of query, key, value and
    sinks, on transposed inputs (``(B, L, H, D)`` viewed as ``(B, H, L, D)``), lengths
    that are not a multiple of the 16-row blocks, and sinks from -3 to 3 (a share of the
    mass from a few percent to most of it). The sinks' gradient also equals the closed
    form, from the forward's output and the log-sum-exp without the sink."""
    gen = torch.Generator().manual_seed(34)
    b, h, d, scale = 2, 3, 16, 0.4
    q = torch.randn(b, q_len, h, d, generator=gen).transpose(1, 2).to(DEVICE)
    k = torch.randn(b, k_len, h, d, generator=gen).transpose(1, 2).to(DEVICE)
    v = torch.randn(b, h, k_len, d, generator=gen).to(DEVICE)
    sinks = torch.tensor([-3.0, 0.5, 3.0], device=DEVICE)
    assert not q.is_contiguous() and not k.is_contiguous()
    ins = [t.requires_grad_() for t in (q, k, v, sinks)]
    out, lse = kernels.flash_attention(
        *ins[:3], is_causal=is_causal, scale=scale, block_m=16, block_n=16, sinks=ins[3]
    )
    assert out.requires_grad and not lse.requires_grad
    grad_out = torch.randn(out.shape, generator=gen).to(DEVICE)
    got = torch.autograd.grad(out, ins, grad_out)
    want_out, want_lse, want, lse_plain = _reference(
        q, k, v, sinks, grad_out, is_causal, scale
    )
    assert _err(out, want_out) < 2e-6, _err(out, want_out)
    assert _err(lse, want_lse) < 2e-6, _err(lse, want_lse)
    for name, g, w in zip(("query", "key", "value", "sinks"), got, want, strict=True):
        assert g.shape == w.shape and g.dtype == torch.float32
        assert _err(g, w) < 2e-5, (name, _err(g, w))
    closed = masks.sink_gradient(want_out, grad_out.double(), lse_plain, sinks.double())
    assert _err(got[3], closed) < 2e-5, _err(got[3], closed)
    # the sink takes mass: rows sum to 1 - p_sink < 1 (weights recovered from the output
    # of all-ones values would be the same test; the log-sum-exp says it directly)
    p_sink = torch.exp(sinks.detach()[None, :, None] - lse)  # (B, H, L)
    assert 0.0 < p_sink.min() and p_sink.max() < 1.0


def test_sinks_only_gradient_and_sinks_of_other_dtypes_and_layouts() -> None:
    """A sinks tensor that is a strided view (every other entry) and float64: its gradient
    comes back in float64, equal to the reference's, when it alone requires a gradient
    (the dQ and dK/dV kernels are skipped). A bfloat16 sinks tensor gives the output of
    its values read in float32."""
    gen = torch.Generator().manual_seed(35)
    q, k, v = (torch.randn(1, 2, 20, 8, generator=gen).to(DEVICE) for _ in "qkv")
    wide = torch.randn(4, generator=gen, dtype=torch.float64).to(DEVICE)
    sinks = wide[::2].requires_grad_()  # a view with stride 2
    assert not sinks.is_contiguous()
    out, _ = kernels.flash_attention(q, k, v, block_m=16, block_n=16, sinks=sinks)
    grad_out = torch.randn(out.shape, generator=gen).to(DEVICE)
    (got,) = torch.autograd.grad(out, sinks, grad_out)
    want_out, _, want, _ = _reference(q, k, v, sinks, grad_out, False, 8**-0.5)
    assert got.dtype == torch.float64 and _err(got, want[3]) < 2e-5
    assert _err(out, want_out) < 2e-6
    half = sinks.detach().to(torch.bfloat16)
    out_bf16, _ = kernels.flash_attention(q, k, v, block_m=16, block_n=16, sinks=half)
    out_f32, _ = kernels.flash_attention(
        q, k, v, block_m=16, block_n=16, sinks=half.float()
    )
    assert torch.equal(out_bf16, out_f32)


def test_very_negative_sinks_give_the_plain_kernel() -> None:
    """A sink of -inf is no sink, bit for bit (the running sum's 1 is multiplied by
    2^(-inf) = 0 at the first key block); -1e4 takes a weight e^(-1e4 - lse), 0 in float32,
    so the output and gradients of query, key and value are the plain kernel's, and
    ``sinks=None`` runs the kernel without the sink's code."""
    gen = torch.Generator().manual_seed(36)
    q, k, v = (
        torch.randn(1, 2, 24, 16, generator=gen).to(DEVICE).requires_grad_()
        for _ in "qkv"
    )
    plain, lse = kernels.flash_attention(q, k, v, is_causal=True, block_m=16)
    grad_out = torch.randn(plain.shape, generator=gen).to(DEVICE)
    want = torch.autograd.grad(plain, (q, k, v), grad_out)
    for value in (float("-inf"), -1e4):
        sinks = torch.full((2,), value, device=DEVICE)
        out, lse_s = kernels.flash_attention(
            q, k, v, is_causal=True, block_m=16, sinks=sinks
        )
        got = torch.autograd.grad(out, (q, k, v), grad_out)
        assert torch.equal(out, plain) and torch.equal(lse_s, lse), value
        for g, w in zip(got, want, strict=True):
            assert torch.equal(g, w), value


def test_a_row_with_no_key_puts_all_its_mass_on_the_sink() -> None:
    """With ``S = 0`` (the only way a row of this kernel sees no key: the causal mask
    ``j <= i`` always keeps key 0) the output is 0 and the log-sum-exp is the sink; the
    gradients are zero (the output does not depend on anything), as the reference's;
    without sinks the log-sum-exp is -inf."""
    q = torch.randn(1, 2, 5, 8, device=DEVICE).requires_grad_()
    k, v = (torch.zeros(1, 2, 0, 8, device=DEVICE).requires_grad_() for _ in "kv")
    sinks = torch.tensor([0.3, -2.0], device=DEVICE).requires_grad_()
    out, lse = kernels.flash_attention(q, k, v, sinks=sinks)
    assert not out.any()
    assert torch.equal(lse, sinks.detach()[None, :, None].expand(1, 2, 5))
    grad_out = torch.randn(out.shape, device=DEVICE)
    got = torch.autograd.grad(out, (q, k, v, sinks), grad_out)
    want_out, _, want, _ = _reference(q, k, v, sinks, grad_out, False, 8**-0.5)
    assert not want_out.any()
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and not g.any() and not w.any()
    _, lse_plain = kernels.flash_attention(q, k, v)
    assert torch.isneginf(lse_plain).all()


# ---- grouped-query attention: H_kv KV heads, each read by H / H_kv query heads ----------


@pytest.mark.parametrize(
    ("kv_heads", "is_causal", "with_sinks", "q_len", "k_len"),
    [
        (1, True, True, 21, 21),  # multi-query: one KV head for all four
        (2, False, True, 19, 23),
        (2, True, False, 20, 18),
        (4, False, False, 17, 19),  # H_kv = H: one KV head each
    ],
)
def test_grouped_query_attention_matches_the_reference(
    kv_heads, is_causal, with_sinks, q_len, k_len
) -> None:
    """Output, log-sum-exp and the gradients of query, key, value (and sinks) with 4 query
    heads on 1, 2 or 4 KV heads, on transposed inputs (``(B, L, H, D)`` viewed as
    ``(B, H, L, D)``), lengths that are not a multiple of the 16-row blocks, two batch
    rows, and distinct sinks per query head (sinks are per query head: the heads of one
    group get different ones). dK and dV of a KV head are the sums over its group's query
    heads. Without sinks, torch's SDPA with ``enable_gqa=True`` is a second oracle."""
    gen = torch.Generator().manual_seed(340 + kv_heads)
    b, h, d, scale = 2, 4, 16, 0.4
    q = torch.randn(b, q_len, h, d, generator=gen).transpose(1, 2).to(DEVICE)
    k = torch.randn(b, k_len, kv_heads, d, generator=gen).transpose(1, 2).to(DEVICE)
    v = torch.randn(b, kv_heads, k_len, d, generator=gen).to(DEVICE)
    sinks = torch.tensor([-2.0, 1.0, 0.0, 2.5], device=DEVICE)
    # (one KV head transposed is contiguous by torch's rule: its head stride is unused)
    assert not q.is_contiguous() and (kv_heads == 1 or not k.is_contiguous())
    ins = [t.requires_grad_() for t in (q, k, v, sinks)]
    out, lse = kernels.flash_attention(
        *ins[:3],
        is_causal=is_causal,
        scale=scale,
        block_m=16,
        block_n=16,
        sinks=ins[3] if with_sinks else None,
    )
    assert out.shape == (b, h, q_len, d)
    grad_out = torch.randn(out.shape, generator=gen).to(DEVICE)
    got = torch.autograd.grad(out, ins if with_sinks else ins[:3], grad_out)
    # no sink: a sink of -inf takes no mass, and the reference's sink gradient is 0
    ref_sinks = sinks if with_sinks else torch.full((h,), float("-inf"), device=DEVICE)
    want_out, want_lse, want, _ = _reference(
        q, k, v, ref_sinks, grad_out, is_causal, scale
    )
    assert _err(out, want_out) < 2e-6, _err(out, want_out)
    assert _err(lse, want_lse) < 2e-6, _err(lse, want_lse)
    for name, g, w in zip(("query", "key", "value", "sinks"), got, want, strict=False):
        assert g.shape == w.shape and g.dtype == torch.float32
        assert _err(g, w) < 2e-5, (name, _err(g, w))
    if not with_sinks:  # the second oracle: torch's own grouped-query attention
        ins64 = [t.detach().double().requires_grad_() for t in ins[:3]]
        sdpa = F.scaled_dot_product_attention(
            *ins64, is_causal=is_causal, scale=scale, enable_gqa=True
        )
        sdpa_grads = torch.autograd.grad(sdpa, ins64, grad_out.double())
        assert _err(out, sdpa) < 2e-6, _err(out, sdpa)
        for name, g, w in zip("qkv", got, sdpa_grads, strict=True):
            assert _err(g, w) < 2e-5, (name, _err(g, w))


def test_grouped_query_attention_in_bfloat16() -> None:
    """bfloat16 inputs (8 significant bits), two query heads per KV head, causal, with
    sinks: output and gradients against float64 autograd of the reference on the same
    (bfloat16-rounded) inputs. Under the interpreter the kernel loads bfloat16, multiplies
    and sums in float32 and converts to bfloat16 on store (by truncation: one bfloat16 ulp,
    up to 2^-7 of the value); the backward starts from that rounded output (its
    Delta = rowsum(dO * O)), so the gradients err a little more. Bound: each tensor's
    largest error under 2^-6 times its largest |reference| (two ulps of 2^-7 at the top
    binade); measured (interpreter, CPU): 4.4e-3 for the output, 6.8e-3 for dQ (the
    largest), where float32 inputs err by 1e-7 to 6e-7 of the largest |reference| (the
    test above's cases); the log-sum-exp stays float32 (error 3e-7, bound 2e-6)."""
    gen = torch.Generator().manual_seed(3416)
    b, h, kv_heads, length, d = 1, 4, 2, 20, 16
    q, k, v = (
        torch.randn(b, n, length, d, generator=gen).to(DEVICE, torch.bfloat16)
        for n in (h, kv_heads, kv_heads)
    )
    sinks = torch.tensor([-1.0, 0.5, 1.5, -0.5], device=DEVICE)
    ins = [t.requires_grad_() for t in (q, k, v, sinks)]
    out, lse = kernels.flash_attention(
        *ins[:3], is_causal=True, block_m=16, block_n=16, sinks=ins[3]
    )
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    grad_out = torch.randn(out.shape, generator=gen).to(DEVICE, torch.bfloat16)
    got = torch.autograd.grad(out, ins, grad_out)
    assert [g.dtype for g in got] == [torch.bfloat16] * 3 + [torch.float32]
    want_out, want_lse, want, _ = _reference(q, k, v, sinks, grad_out, True, d**-0.5)
    assert _err(lse, want_lse) < 2e-6, _err(lse, want_lse)
    names = ("output", "query", "key", "value", "sinks")
    for name, g, w in zip(names, (out, *got), (want_out, *want), strict=True):
        rel = _err(g, w) / w.abs().max().item()
        assert rel < 2**-6, (name, rel)
