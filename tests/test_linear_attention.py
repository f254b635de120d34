"""Tests of companion.linear_attention: linear attention, the gated delta rule, Qwen3-Next's
convolution and output gate.

Oracles: float64 loops written from the formulas (the papers' ``(Dv, D)`` state for the
delta rule, so the storage convention is checked too), autograd for the
gradient-descent reading, ``nn.Conv1d`` for the convolution, and Hugging Face
transformers 5.23's Qwen3-Next reference functions (``torch_recurrent_gated_delta_rule``,
``torch_chunk_gated_delta_rule``, ``causal_conv1d_fn``, ``causal_conv1d_update``,
``l2norm``, ``Qwen3NextRMSNormGated``). Measured (this file's inputs): chunked vs recurrent
in float64 <= 2.5e-15; float32 vs the float64 loop <= 3.2e-7 (recurrent) and 5.8e-7
(chunked) on unit q/k, |o| <= 1.8; vs Hugging Face (float32 both) <= 6e-7
(3e-8 with HF's L2 norm inside, unit q/k).
"""

from __future__ import annotations

import logging
import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from companion import experiments
from companion import linear_attention as la
from companion import stability as _stab
from companion.model import CausalSelfAttention, ModelConfig, TinyTransformer

hf = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")

F64 = torch.float64
B, HK, H, L, D, DV = 2, 2, 4, 13, 8, 6


@pytest.fixture(autouse=True)
def _quiet_hf_fallback():
    # HF logs once that flash-linear-attention is missing and it uses the torch reference
    logging.getLogger("transformers").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _inputs(seed=0, *, b=B, hk=HK, h=H, length=L, d=D, dv=DV, dtype=F64, unit=True):
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=F64)

    q, k = rand(b, hk, length, d), rand(b, hk, length, d)
    if unit:
        q, k = la.l2_normalize(q), la.l2_normalize(k)
    v = rand(b, h, length, dv)
    g = -2 * torch.rand(b, h, length, generator=gen, dtype=F64)
    beta = torch.rand(b, h, length, generator=gen, dtype=F64)
    s0 = rand(b, h, d, dv)
    return [x.to(dtype) for x in (q, k, v, g, beta, s0)]


def _delta_rule_loop(q, k, v, g, beta, s0, scale=1.0):
    """The papers' form, one head at a time: S (Dv, D), S_t = S_{t-1} alpha (I - beta k
    k^T) + beta v k^T, o_t = S_t q_t. Returns outputs and the final S^T."""
    b, hk, length, d = q.shape
    h, dv = v.shape[1], v.shape[-1]
    out = torch.zeros(b, h, length, dv, dtype=F64)
    final = torch.zeros(b, h, d, dv, dtype=F64)
    eye = torch.eye(d, dtype=F64)
    for i in range(b):
        for j in range(h):
            jk = j // (h // hk)
            s = s0[i, j].double().T.clone()  # (Dv, D)
            for t in range(length):
                kt, qt = k[i, jk, t].double(), q[i, jk, t].double() * scale
                alpha, bt = torch.exp(g[i, j, t].double()), beta[i, j, t].double()
                s = s @ (alpha * (eye - bt * torch.outer(kt, kt)))
                s = s + bt * torch.outer(v[i, j, t].double(), kt)
                out[i, j, t] = s @ qt
            final[i, j] = s.T
    return out, final


def _bhld(x):  # (B, H, L, ...) <-> Hugging Face's (B, L, H, ...)
    return x.transpose(1, 2)


# ---- linear attention ----------------------------------------------------------------


def _linear_loop(q, k, v, causal):
    """o_t = sum_s phi(q_t).phi(k_s) v_s / sum_s phi(q_t).phi(k_s), s <= t if causal."""
    fq, fk = F.elu(q) + 1, F.elu(k) + 1
    out = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=F64)
    for t in range(q.shape[-2]):
        stop = t + 1 if causal else k.shape[-2]
        w = (fq[..., t, None, :] * fk[..., :stop, :]).sum(-1)  # (..., s)
        out[..., t, :] = (w[..., None] * v[..., :stop, :]).sum(-2) / w.sum(-1)[
            ..., None
        ]
    return out


@pytest.mark.parametrize("causal", [True, False])
def test_linear_attention_parallel_equals_recurrent_and_the_formula(causal):
    gen = torch.Generator().manual_seed(1)
    q, k = (torch.randn(B, H, L, D, generator=gen, dtype=F64) for _ in range(2))
    v = torch.randn(B, H, L, DV, generator=gen, dtype=F64)
    par = la.linear_attention(q, k, v, causal=causal)
    rec = la.linear_attention(q, k, v, causal=causal, mode="recurrent")
    torch.testing.assert_close(par, rec, rtol=0, atol=1e-12)
    torch.testing.assert_close(par, _linear_loop(q, k, v, causal), rtol=0, atol=1e-12)
    # causal: output t ignores later keys (change the last key and value)
    k2, v2 = k.clone(), v.clone()
    k2[..., -1, :] += 3
    v2[..., -1, :] -= 5
    changed = la.linear_attention(q, k2, v2, causal=causal)
    same = (changed[..., :-1, :] - par[..., :-1, :]).abs().max()
    assert (same == 0) if causal else (same > 1e-3)


def test_linear_attention_non_causal_other_lengths_broadcast_and_dtype():
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(B, H, 5, D, generator=gen)
    k = torch.randn(1, H, 9, D, generator=gen)  # broadcast batch, S != L
    v = torch.randn(1, H, 9, DV, generator=gen)
    out = la.linear_attention(q, k, v, causal=False)
    assert out.dtype == torch.float32 and out.shape == (B, H, 5, DV)
    rec = la.linear_attention(q, k, v, causal=False, mode="recurrent")
    torch.testing.assert_close(out, rec, rtol=1e-5, atol=1e-6)
    ref = _linear_loop(q.double(), k.expand(B, -1, -1, -1).double(), v.double(), False)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-6)
    # a callable feature map: relu + 1 gives another answer than elu + 1
    other = la.linear_attention(q, k, v, lambda x: F.relu(x) + 1, causal=False)
    assert (other - out).abs().max() > 1e-3


# ---- the gated delta rule ------------------------------------------------------------


@pytest.mark.parametrize("chunk_size", [1, 4, 5, 13, 16])
def test_chunked_equals_recurrent_and_the_papers_loop_float64(chunk_size):
    q, k, v, g, beta, s0 = _inputs(chunk_size)
    rec, s_rec = la.gated_delta_rule(
        q, k, v, g, beta, mode="recurrent", initial_state=s0, scale=0.7
    )
    chk, s_chk = la.gated_delta_rule(
        q, k, v, g, beta, chunk_size=chunk_size, initial_state=s0, scale=0.7
    )
    torch.testing.assert_close(chk, rec, rtol=0, atol=1e-12)
    torch.testing.assert_close(s_chk, s_rec, rtol=0, atol=1e-12)
    loop, s_loop = _delta_rule_loop(q, k, v, g, beta, s0, scale=0.7)
    torch.testing.assert_close(rec, loop, rtol=0, atol=1e-12)
    torch.testing.assert_close(s_rec, s_loop, rtol=0, atol=1e-12)  # stored as S^T


@settings(max_examples=20, deadline=None)
@given(
    length=st.integers(1, 12),
    chunk=st.integers(1, 8),
    group=st.sampled_from([(1, 1), (1, 3), (2, 2)]),
    seed=st.integers(0, 2**16),
)
def test_chunked_equals_recurrent_for_random_lengths_chunks_and_heads(
    length, chunk, group, seed
):
    hk, h = group[0], group[0] * group[1]
    q, k, v, g, beta, s0 = _inputs(seed, b=1, hk=hk, h=h, length=length, d=3, dv=2)
    rec = la.gated_delta_rule(q, k, v, g, beta, mode="recurrent", initial_state=s0)
    chk = la.gated_delta_rule(q, k, v, g, beta, chunk_size=chunk, initial_state=s0)
    torch.testing.assert_close(chk, rec, rtol=0, atol=1e-12)


def test_float32_within_the_measured_bound():
    q, k, v, g, beta, s0 = _inputs(3, length=50, d=16, dv=16, hk=H)
    ref, s_ref = la.gated_delta_rule(
        q, k, v, g, beta, mode="recurrent", initial_state=s0
    )
    f = [x.float() for x in (q, k, v, g, beta, s0)]
    for mode, c in (("recurrent", 1), ("chunked", 16), ("chunked", 7)):
        out, s = la.gated_delta_rule(
            *f[:5], mode=mode, chunk_size=c, initial_state=f[5]
        )
        assert out.dtype == torch.float32 and s.dtype == torch.float32
        assert (out.double() - ref).abs().max() < 2e-6  # measured <= 5.8e-7
        assert (s.double() - s_ref).abs().max() < 2e-6


@pytest.mark.parametrize("l2_inside", [True, False])
def test_equals_hugging_face_recurrent_and_chunked(l2_inside):
    """HF takes (B, L, H, D), scales q by D^-1/2 always, normalises q and k inside when
    use_qk_l2norm_in_kernel, computes in float32; grouped heads by repeat_interleave."""
    q, k, v, g, beta, s0 = _inputs(4, dtype=torch.float32, unit=False)
    hq, hk_ = (la.l2_normalize(x) for x in (q, k)) if l2_inside else (q, k)
    ours = {
        mode: la.gated_delta_rule(
            hq, hk_, v, g, beta, mode=mode, chunk_size=4, initial_state=s0,
            scale=D**-0.5,
        )
        for mode in ("recurrent", "chunked")
    }  # fmt: skip
    args = [_bhld(x) for x in (q, k, v, g, beta)]
    kw = dict(
        initial_state=s0, output_final_state=True, use_qk_l2norm_in_kernel=l2_inside
    )
    theirs = {
        "recurrent": hf.torch_recurrent_gated_delta_rule(*args, **kw),
        "chunked": hf.torch_chunk_gated_delta_rule(*args, chunk_size=4, **kw),
    }
    for mode in ours:
        for mine, other in ((ours[mode][0], _bhld(theirs[mode][0])), (ours[mode][1], theirs[mode][1])):  # fmt: skip
            torch.testing.assert_close(
                mine, other, rtol=0, atol=2e-6
            )  # measured <= 6e-7
    # the scale matters: the rule as written (scale 1) is not HF's
    plain, _ = la.gated_delta_rule(hq, hk_, v, g, beta, initial_state=s0)
    assert (plain - _bhld(theirs["chunked"][0])).abs().max() > 1e-2


def test_transposed_views_are_normal_inputs():
    q, k, v, g, beta, s0 = _inputs(5)
    views = [_bhld(_bhld(x).contiguous()) for x in (q, k, v)]  # HF layout, viewed back
    assert not views[0].is_contiguous()
    gv, bv = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (g, beta))
    for mode in ("recurrent", "chunked"):
        a = la.gated_delta_rule(
            q, k, v, g, beta, mode=mode, chunk_size=4, initial_state=s0
        )
        bb = la.gated_delta_rule(*views, gv, bv, mode=mode, chunk_size=4, initial_state=s0.mT.contiguous().mT)  # fmt: skip
        torch.testing.assert_close(a, bb, rtol=0, atol=1e-14)


def test_deltanet_is_g_zero_and_beta_zero_leaves_the_state():
    q, k, v, g, beta, s0 = _inputs(6)
    for mode in ("recurrent", "chunked"):
        a = la.gated_delta_rule(
            q, k, v, None, beta, mode=mode, chunk_size=4, initial_state=s0
        )
        z = la.gated_delta_rule(q, k, v, torch.zeros_like(g), beta, mode=mode, chunk_size=4, initial_state=s0)  # fmt: skip
        torch.testing.assert_close(a, z, rtol=0, atol=0)
        out, state = la.gated_delta_rule(
            q, k, v, None, torch.zeros_like(beta), mode=mode, chunk_size=5,
            initial_state=s0,
        )  # fmt: skip
        torch.testing.assert_close(state, s0, rtol=0, atol=1e-14)  # nothing written
        read = q.repeat_interleave(H // HK, dim=1) @ s0  # o_t = M_0^T q_t
        torch.testing.assert_close(out, read, rtol=0, atol=1e-14)
    # and the decay alone shrinks the state by exp(sum g)
    _, state = la.gated_delta_rule(q, k, v, g, torch.zeros_like(beta), initial_state=s0)
    torch.testing.assert_close(state, s0 * g.sum(-1).exp()[..., None, None])


def test_orthonormal_keys_store_and_overwrite_exactly():
    """alpha = 1, beta = 1, orthonormal keys: the state retrieves each stored value
    exactly, and writing a key again replaces its value (linear attention would add)."""
    d, dv = 8, 5
    gen = torch.Generator().manual_seed(7)
    keys = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=F64))[0].T  # rows
    order = [0, 1, 2, 3, 4, 5, 6, 7, 2, 5]  # keys 2 and 5 written twice
    k = keys[order][None, None]  # (1, 1, 10, D)
    v = torch.randn(1, 1, len(order), dv, generator=gen, dtype=F64)
    ones = torch.ones(1, 1, len(order), dtype=F64)
    for mode in ("recurrent", "chunked"):
        _, state = la.gated_delta_rule(k, k, v, None, ones, mode=mode, chunk_size=3)
        read = keys @ state[0, 0]  # M^T key_i for every key, (D, Dv)
        last = {key: v[0, 0, t] for t, key in enumerate(order)}
        expected = torch.stack([last[i] for i in range(d)])
        torch.testing.assert_close(read, expected, rtol=0, atol=1e-13)
    # the linear-attention state (sum of k v^T) holds v_2 + v_8 for key 2 instead
    added = (k[0, 0].T @ v[0, 0])[None]
    assert ((keys @ added[0])[2] - expected[2]).abs().max() > 1e-2


def test_one_step_is_gradient_descent_on_the_regression_loss():
    """alpha = 1: M_t = M - beta * grad_M 1/2 ||M^T k - v||^2 (online regression)."""
    q, k, v, _, beta, s0 = _inputs(8, length=1, hk=H)
    m = s0.clone().requires_grad_(True)
    loss = 0.5 * ((m.mT @ k[..., 0, :, None])[..., 0] - v[..., 0, :]).pow(2).sum()
    (grad,) = torch.autograd.grad(loss, m)
    descent = s0 - beta[..., 0, None, None] * grad
    for mode in ("recurrent", "chunked"):
        _, state = la.gated_delta_rule(q, k, v, None, beta, mode=mode, initial_state=s0)
        torch.testing.assert_close(state, descent, rtol=0, atol=1e-14)


def test_low_precision_input_computes_in_float32():
    q, k, v, g, beta, s0 = _inputs(9, dtype=torch.bfloat16)
    out, state = la.gated_delta_rule(q, k, v, g, beta, initial_state=s0, chunk_size=4)
    assert out.dtype == torch.bfloat16 and state.dtype == torch.float32
    ref, _ = la.gated_delta_rule(*[x.double() for x in (q, k, v, g, beta)], initial_state=s0.double())  # fmt: skip
    assert (out.double() - ref).abs().max() < 3e-2  # bf16 rounding of the output


# ---- Qwen3-Next's convolution, L2 norm and output gate ----------------------------------


def test_causal_conv1d_steps_equal_the_full_form_and_hugging_face():
    gen = torch.Generator().manual_seed(10)
    b, length, ch, kk = 2, 9, 6, 4
    x = torch.randn(b, length, ch, generator=gen)
    w = torch.randn(ch, kk, generator=gen)
    full, state = la.causal_conv1d(x, w)
    # nn.Conv1d as Qwen3-Next's layer holds it (padding K - 1, keep the first L)
    conv = torch.nn.Conv1d(ch, ch, kk, groups=ch, padding=kk - 1, bias=False)
    conv.weight.data.copy_(w[:, None])
    with torch.no_grad():
        ref = F.silu(conv(x.transpose(1, 2))[..., :length]).transpose(1, 2)
    torch.testing.assert_close(full, ref, rtol=0, atol=1e-6)
    torch.testing.assert_close(state, x[:, -(kk - 1) :])
    hf_full = hf.causal_conv1d_fn(x.transpose(1, 2), w, None, activation="silu")
    torch.testing.assert_close(full, hf_full.transpose(1, 2), rtol=0, atol=1e-6)
    # one step at a time (a prefill of 4, then single tokens), ours and HF's update
    head, st = la.causal_conv1d(x[:, :4], w)
    hf_state = torch.zeros(b, ch, kk)  # HF's cache keeps K columns
    hf_out = [
        hf.causal_conv1d_update(x[:, :4].transpose(1, 2), hf_state, w, None, "silu")
    ]
    steps = [head]
    for t in range(4, length):
        y, st = la.causal_conv1d(x[:, t : t + 1], w, st)
        steps.append(y)
        hf_out.append(hf.causal_conv1d_update(x[:, t : t + 1].transpose(1, 2), hf_state, w, None, "silu"))  # fmt: skip
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=0, atol=1e-6)
    torch.testing.assert_close(
        torch.cat(hf_out, 2).transpose(1, 2), full, rtol=0, atol=1e-6
    )
    torch.testing.assert_close(st, hf_state[..., 1:].transpose(1, 2))
    plain, _ = la.causal_conv1d(x, w, activation=None)
    torch.testing.assert_close(F.silu(plain), full)


def test_gated_rms_norm_and_l2_normalize_equal_hugging_face():
    gen = torch.Generator().manual_seed(11)
    x, z = (torch.randn(3, 5, 16, generator=gen) * 3 for _ in range(2))
    norm = hf.Qwen3NextRMSNormGated(16, eps=1e-6)
    norm.weight.data.copy_(torch.randn(16, generator=gen))
    for dtype in (torch.float32, torch.bfloat16):
        xd, zd = x.to(dtype), z.to(dtype)
        with torch.no_grad():
            ref = norm.to(dtype)(xd, zd)
        out = la.gated_rms_norm(xd, zd, norm.weight.detach(), eps=1e-6)
        assert out.dtype == dtype
        torch.testing.assert_close(out, ref, rtol=0, atol=0)
    torch.testing.assert_close(la.l2_normalize(x), hf.l2norm(x), rtol=0, atol=0)
    # eps inside the root, not F.normalize's max(||x||, eps): they differ on a small vector
    small = torch.full((1, 4), 1e-4)
    assert (la.l2_normalize(small) - F.normalize(small, dim=-1)).abs().max() > 0.1


# ---- bad input -------------------------------------------------------------------------

_q, _k, _v, _g, _b, _s = _inputs(0, dtype=torch.float32)
_x, _w = torch.randn(2, 5, 6), torch.randn(6, 4)

BAD_INPUTS = [
    ("linear_attention", lambda: la.linear_attention(_q.long(), _k, _v), TypeError, r"^query must be a floating-point tensor"),
    ("linear_attention", lambda: la.linear_attention(_q, _k.double(), _q), TypeError, r"^key must have query's dtype"),
    ("linear_attention", lambda: la.linear_attention(_q, _k, _v[..., :3, :]), ValueError, r"^key and value must have the same length"),
    ("linear_attention", lambda: la.linear_attention(_q, _k[..., :4, :], _k[..., :4, :]), ValueError, r"^query and key must have the same length when causal"),
    ("linear_attention", lambda: la.linear_attention(_q, _k, _k, feature_map="softmax"), ValueError, r"^feature_map must be one of 'elu1'"),
    ("linear_attention", lambda: la.linear_attention(_q, _k, _k, feature_map=3), TypeError, r"^feature_map must be callable"),
    ("linear_attention", lambda: la.linear_attention(_q, _k, _k, causal=1), TypeError, r"^causal must be a bool"),
    ("linear_attention", lambda: la.linear_attention(_q, _k, _k, mode="chunked"), ValueError, r"^mode must be one of 'parallel', 'recurrent'"),
    ("gated_delta_rule", lambda: la.gated_delta_rule(_q[0], _k, _v, _g, _b), ValueError, r"^query must have 4 dimensions \(B, Hk, L, D\)"),
    ("gated_delta_rule", lambda: la.gated_delta_rule(_q, _k.half(), _v, _g, _b), TypeError, r"^key must have query's dtype"),
    ("gated_delta_rule", lambda: la.gated_delta_rule(_q, _k[:, :, :5], _v, _g, _b), ValueError, r"^key must have shape \(query's shape\)"),
    ("gated_delta_rule", lambda: la.gated_delta_rule(_q, _k, _v[:, :3], _g[:, :3], _b[:, :3]), ValueError, r"^value's heads must be a positive multiple of query's heads \(Hk = 2\)"),
    ("gated_delta_rule", lambda: la.gated_delta_rule(_q, _k, _v[:, :, :5], _g, _b), ValueError, r"^query and value must have the same length \(L\) size"),
    ("gated_delta_rule", lambda: la.gated_delta_rule(_q, _k, _v, _g[:, :2], _b), ValueError, r"^g must have shape \(B, H, L\) \(2, 4, 13\)"),
    ("gated_delta_rule", lambda: la.gated_delta_rule(_q, _k, _v, -_g, _b), ValueError, r"^g must be <= 0 everywhere"),
    ("gated_delta_rule", lambda: la.gated_delta_rule(_q, _k, _v, _g, _b.long()), TypeError, r"^beta must be a floating-point tensor"),
    ("gated_delta_rule", lambda: la.gated_delta_rule(_q, _k, _v, _g, _b, chunk_size=0), ValueError, r"^chunk_size must be a positive int, got 0"),
    ("gated_delta_rule", lambda: la.gated_delta_rule(_q, _k, _v, _g, _b, chunk_size=4.0), TypeError, r"^chunk_size must be an int"),
    ("gated_delta_rule", lambda: la.gated_delta_rule(_q, _k, _v, _g, _b, mode="parallel"), ValueError, r"^mode must be one of 'recurrent', 'chunked'"),
    ("gated_delta_rule", lambda: la.gated_delta_rule(_q, _k, _v, _g, _b, initial_state=_s.mT), ValueError, r"^initial_state must have shape \(B, H, D, Dv\) \(2, 4, 8, 6\)"),
    ("gated_delta_rule", lambda: la.gated_delta_rule(_q, _k, _v, _g, _b, scale="1"), TypeError, r"^scale must be a real number"),
    ("l2_normalize", lambda: la.l2_normalize([1.0, 2.0]), TypeError, r"^x must be a torch.Tensor"),
    ("l2_normalize", lambda: la.l2_normalize(_q, eps=-1.0), ValueError, r"^eps must be a real number >= 0"),
    ("causal_conv1d", lambda: la.causal_conv1d(_x[0], _w), ValueError, r"^x must have 3 dimensions \(B, L, C\)"),
    ("causal_conv1d", lambda: la.causal_conv1d(_x, _w[:5]), ValueError, r"^x and weight must have the same channel \(C\) size"),
    ("causal_conv1d", lambda: la.causal_conv1d(_x, _w[:, :0]), ValueError, r"^weight must have a positive kernel size K"),
    ("causal_conv1d", lambda: la.causal_conv1d(_x, _w, torch.zeros(2, 4, 6)), ValueError, r"^state must have shape \(B, K - 1, C\) \(2, 3, 6\)"),
    ("causal_conv1d", lambda: la.causal_conv1d(_x, _w, activation="gelu"), ValueError, r"^activation must be one of 'silu'"),
    ("gated_rms_norm", lambda: la.gated_rms_norm(_x, _x[:, :4], _w[:, 0]), ValueError, r"^gate must have shape \(x's shape\)"),
    ("gated_rms_norm", lambda: la.gated_rms_norm(_x, _x, torch.ones(5)), ValueError, r"^x and weight must have the same feature \(D\) size"),
    ("gated_rms_norm", lambda: la.gated_rms_norm(_x, _x.long(), _w[:, 0]), TypeError, r"^gate must be a floating-point tensor"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "thunk", "exc", "match"), BAD_INPUTS)
def test_bad_input_raises_before_any_computation(name, thunk, exc, match):
    with pytest.raises(exc, match=match):
        thunk()


# ---- the tiny model with linear attention (chapter 11's trained comparison) -----------

_CFG = ModelConfig(
    vocab_size=11, dim=16, num_heads=2, num_layers=2, position="sinusoidal"
)


def _pair(seed=0):
    """A plain causal layer and a linear one with the same weights, float64."""
    torch.manual_seed(seed)
    plain = CausalSelfAttention(16, 4).double()
    linear = la.LinearSelfAttention(16, 4).double()
    linear.load_state_dict(plain.state_dict())
    return plain, linear


def test_linear_self_attention_is_the_plain_layer_with_the_op_replaced():
    plain, linear = _pair()
    x = torch.randn(3, 9, 16, dtype=F64, generator=torch.Generator().manual_seed(1))
    out = linear(x)
    assert out.shape == x.shape and out.dtype == F64
    q, k, v = (plain._split(p(x)) for p in (plain.q_proj, plain.k_proj, plain.v_proj))
    for mode in ("parallel", "recurrent"):  # the op in both forms
        heads = la.linear_attention(q, k, v, "elu1", mode=mode)  # (B, H, L, D/H)
        want = plain.out_proj(heads.transpose(1, 2).reshape(3, 9, 16))
        torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    assert (out - plain(x)).abs().max() > 1e-3  # the softmax layer is another function
    # causal: the output at t does not depend on later positions
    later = x.clone()
    later[:, 5:] += 1.0
    torch.testing.assert_close(linear(later)[:, :5], out[:, :5], rtol=0, atol=0)
    # the hook's non-causal form is linear_attention's non-causal form
    got = linear.attend(q, k, v, is_causal=False)
    torch.testing.assert_close(got, la.linear_attention(q, k, v, causal=False))


def test_linear_attention_weights_are_the_rows_of_the_op():
    q, k, v = [*_inputs(2, hk=4, unit=False)[:2], _inputs(3, h=4)[2]]
    for causal in (True, False):
        w = la.linear_attention_weights(q, k, causal=causal)  # (B, H, L, L)
        torch.testing.assert_close(
            w @ v, la.linear_attention(q, k, v, causal=causal), rtol=1e-12, atol=1e-12
        )
        torch.testing.assert_close(w.sum(-1), torch.ones_like(w[..., 0]))
        assert (w >= 0).all()
    assert (w.triu(1) != 0).any()
    causal_w = la.linear_attention_weights(q, k)
    assert (causal_w.triu(1) == 0).all()
    # one entry from the formula, in a float64 loop
    phi = la.FEATURE_MAPS["elu1"]
    t, s = 7, 3
    num = (phi(q[1, 2, t]) * phi(k[1, 2, s])).sum()
    den = sum((phi(q[1, 2, t]) * phi(k[1, 2, j])).sum() for j in range(t + 1))
    assert abs(causal_w[1, 2, t, s] - num / den) < 1e-14
    low = la.linear_attention_weights(q.float(), k.float())
    assert low.dtype == torch.float32


def test_linear_tiny_transformer_differs_from_the_base_in_attention_only():
    torch.manual_seed(0)
    base = TinyTransformer(_CFG)
    net = la.LinearTinyTransformer(_CFG)
    net.load_state_dict(base.state_dict())  # the same parameters, names and shapes
    layers = [m for m in net.modules() if isinstance(m, CausalSelfAttention)]
    assert len(layers) == 2 and all(type(m) is la.LinearSelfAttention for m in layers)
    ids = torch.randint(11, (3, 12), generator=torch.Generator().manual_seed(2))
    logits = net(ids)
    assert logits.shape == (3, 12, 11)
    assert (logits - base(ids)).abs().max() > 1e-3
    for name in ("none", "learned"):
        la.LinearTinyTransformer(ModelConfig(vocab_size=11, dim=16, position=name))


def test_batched_training_of_linear_models_is_one_at_a_time_training():
    """The comparison trains its models through experiments.train_batched (vmap over
    the models): the same updates as experiments.train, one model at a time."""
    task = {"batch_size": 4, "length": 10, "lag": 3}
    seeds = [0, 1]

    def make():
        return la.LinearTinyTransformer(_CFG)

    together = [experiments.build(make, s) for s in seeds]
    runs = experiments.train_batched(together, seeds=seeds, steps=3, lr=1e-2, **task)
    for s, m, r in zip(seeds, together, runs, strict=True):
        alone = experiments.build(make, s)
        want = experiments.train(alone, steps=3, lr=1e-2, seed=s, **task)
        assert r.losses == pytest.approx(want.losses, rel=1e-5)
        for p, q in zip(m.parameters(), alone.parameters(), strict=True):
            torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6)


def test_lag_weight_reads_softmax_as_chapter_9_does_and_linear_from_its_weights():
    torch.manual_seed(0)
    sizes = la.LINEAR_VS_SOFTMAX_SIZES
    plain, linear = TinyTransformer(sizes), la.LinearTinyTransformer(sizes)
    probe = la.lag_probe(8)
    assert probe.shape == (8, la.LINEAR_VS_SOFTMAX_TASK["length"])
    assert torch.equal(probe, la.lag_probe(8))  # no training seed: the same every time
    got = la.lag_weight([plain], probe, lag=3)  # (models, layers, H)
    assert got.shape == (1, 1, 4) and got.dtype == F64
    torch.testing.assert_close(got, _stab.lag_weight([plain], probe, lag=3))
    # linear: the diagonal t - lag of linear_attention_weights on the layer's input
    layer = next(m for m in linear.modules() if isinstance(m, la.LinearSelfAttention))
    seen = []
    hook = layer.register_forward_pre_hook(lambda _, a: seen.append(a[0]))
    linear(probe)
    hook.remove()
    q, k = layer._split(layer.q_proj(seen[0])), layer._split(layer.k_proj(seen[0]))
    w = la.linear_attention_weights(q, k)  # (B, H, L, L)
    want = torch.stack([w[:, :, t, t - 3] for t in range(3, w.shape[-1])], -1)
    torch.testing.assert_close(
        la.lag_weight([linear], probe, lag=3)[0, 0], want.mean(dim=(0, 2)).double()
    )
    assert la.lag_weight([plain, linear]).shape == (2, 1, 4)  # default probe and lag


_layer = la.LinearSelfAttention(16, 4)
_qh = torch.randn(2, 4, 5, 4)
_tiny = la.LinearTinyTransformer(_CFG)
_rope = TinyTransformer(ModelConfig(vocab_size=11, dim=16, position="rope"))

MODEL_BAD_INPUTS = [
    ("LinearSelfAttention", lambda: la.LinearSelfAttention(16, 5), ValueError, r"^dim must be divisible by num_heads, got dim=16, num_heads=5"),
    ("LinearSelfAttention", lambda: la.LinearSelfAttention(16.0, 4), TypeError, r"^dim must be an int"),
    ("LinearSelfAttention", lambda: _layer(torch.randn(5, 16)), ValueError, r"^x must have 3 dimensions"),
    ("LinearSelfAttention", lambda: _layer(torch.randn(2, 5, 8)), ValueError, r"^x must have size 16 \(dim\) in dimension -1, got shape \(2, 5, 8\)"),
    ("LinearSelfAttention", lambda: _layer.attend(_qh, _qh, _qh, mask=torch.ones(5, 5, dtype=torch.bool)), ValueError, r"^mask must be None: LinearSelfAttention builds its own mask"),
    ("LinearTinyTransformer", lambda: la.LinearTinyTransformer(ModelConfig(vocab_size=11, dim=16, position="rope")), ValueError, r"^config.position must be one of 'none', 'sinusoidal', 'learned' \(positions added to the embedding\), got 'rope'"),
    ("LinearTinyTransformer", lambda: la.LinearTinyTransformer({"vocab_size": 11}), TypeError, r"^config must be a ModelConfig"),
    ("LinearTinyTransformer", lambda: _tiny(torch.zeros(2, 5)), TypeError, r"^input_ids must be an integer tensor"),
    ("linear_attention_weights", lambda: la.linear_attention_weights(_qh.long(), _qh), TypeError, r"^query must be a floating-point tensor"),
    ("linear_attention_weights", lambda: la.linear_attention_weights(_qh, _qh[..., :3, :]), ValueError, r"^query and key must have the same length when causal"),
    ("linear_attention_weights", lambda: la.linear_attention_weights(_qh, _qh, feature_map="relu"), ValueError, r"^feature_map must be one of 'elu1'"),
    ("linear_attention_weights", lambda: la.linear_attention_weights(_qh, _qh, causal="yes"), TypeError, r"^causal must be a bool"),
    ("linear_vs_softmax_runs", lambda: la.linear_vs_softmax_runs([0, 0]), ValueError, r"^seed_list must not repeat a seed"),
    ("linear_vs_softmax_runs", lambda: la.linear_vs_softmax_runs(3), TypeError, r"^seed_list must be a non-empty sequence of ints"),
    ("linear_vs_softmax_runs", lambda: la.linear_vs_softmax_runs([0], steps=0), ValueError, r"^steps must be a positive int, got 0"),
    ("linear_vs_softmax_runs", lambda: la.linear_vs_softmax_runs([0], lr=-1.0), ValueError, r"^lr must be"),
    ("linear_vs_softmax_runs", lambda: la.linear_vs_softmax_runs([0], steps=10, warmup_steps=10), ValueError, r"^warmup_steps must be fewer than steps \(10\), got 10"),
    ("linear_vs_softmax_runs", lambda: la.linear_vs_softmax_runs([0], device="gpu0"), ValueError, r"^device must be a device such as 'cpu' or 'cuda', got 'gpu0'"),
    ("linear_vs_softmax_runs", lambda: la.linear_vs_softmax_runs([0], labels=["relu"]), ValueError, r"^labels\[0\] must be one of 'softmax', 'linear \(elu \+ 1\)', got 'relu'"),
    ("linear_vs_softmax_runs", lambda: la.linear_vs_softmax_runs([0], labels=["softmax", "softmax"]), ValueError, r"^labels must not repeat a name"),
    ("linear_vs_softmax_runs", lambda: la.linear_vs_softmax_runs([0], labels="softmax"), TypeError, r"^labels must be a non-empty sequence of names, got 'softmax'"),
    ("linear_vs_softmax_runs", lambda: la.linear_vs_softmax_runs([0], labels=[]), TypeError, r"^labels must be a non-empty sequence of names"),
    ("lag_probe", lambda: la.lag_probe(0), ValueError, r"^num_sequences must be a positive int, got 0"),
    ("lag_weight", lambda: la.lag_weight(_tiny), TypeError, r"^models must be a non-empty sequence of trained models"),
    ("lag_weight", lambda: la.lag_weight([]), TypeError, r"^models must be a non-empty sequence of trained models"),
    ("lag_weight", lambda: la.lag_weight([_tiny], torch.zeros(2, 9)), TypeError, r"^probe must be an integer tensor"),
    ("lag_weight", lambda: la.lag_weight([_tiny], lag=24), ValueError, r"^lag must be less than the probe's length \(24\), got 24"),
    ("lag_weight", lambda: la.lag_weight([_tiny], lag=0), ValueError, r"^lag must be a positive int, got 0"),
    ("lag_weight", lambda: la.lag_weight([_rope]), ValueError, r"^models\[0\] must use plain or linear attention, got a RotarySelfAttention"),
    ("lag_weight", lambda: la.lag_weight([_layer]), TypeError, r"^models\[0\] must be a TinyTransformer"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "thunk", "exc", "match"), MODEL_BAD_INPUTS)
def test_bad_model_input_raises_before_any_computation(name, thunk, exc, match):
    with pytest.raises(exc, match=match):
        thunk()


def test_linear_vs_softmax_runs_is_run_seeds_per_label():
    """The docstring's equivalent, run for a few steps: each label's runs are
    experiments.run_seeds on its class with the comparison's task and schedule (the same
    losses, bit for bit), ``labels`` picks which, and both come by default, in order."""
    kw = dict(steps=4, lr=1e-2, warmup_steps=1)
    linear = "linear (elu + 1)"
    runs = la.linear_vs_softmax_runs([3, 5], labels=[linear], **kw)
    assert list(runs) == [linear]
    direct = experiments.run_seeds(
        lambda: la.LinearTinyTransformer(la.LINEAR_VS_SOFTMAX_SIZES), [3, 5],
        schedule="cosine", **kw, **la.LINEAR_VS_SOFTMAX_TASK,
    )  # fmt: skip
    assert runs[linear].losses == direct.losses
    assert all(type(m) is la.LinearTinyTransformer for m in runs[linear].models)
    both = la.linear_vs_softmax_runs([3], **kw)
    assert list(both) == list(la.LINEAR_VS_SOFTMAX) == ["softmax", linear]
    assert type(both["softmax"].models[0]) is TinyTransformer
    assert both[linear].losses[0] == direct.losses[0]  # same seed, same run
