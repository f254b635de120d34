"""Tests of companion.rope: oracles (a float64 loop over 2x2 rotations, Hugging Face
transformers, a Meta-style complex implementation), hypothesis properties, the
validation
table, and the chapter's checkers."""

from __future__ import annotations

import math
import os
import shutil

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from companion import _rope_fast, checks, rope
from companion.checks import CheckError
from companion.rope import (
    apply_rope,
    apply_rope_complex,
    half_to_interleaved_permutation,
    interleaved_to_half_permutation,
    rope_cos_sin,
    rope_freqs_cis,
    rope_frequencies,
    rotate_half,
    rotate_interleaved,
)

transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig  # noqa: E402
from transformers.models.llama.modeling_llama import (  # noqa: E402
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)
from transformers.models.llama.modeling_llama import (  # noqa: E402
    rotate_half as hf_rotate_half,
)

LAYOUTS = ["half", "interleaved"]
TOL = {
    torch.float64: {"atol": 1e-12, "rtol": 1e-12},
    torch.float32: {"atol": 2e-6, "rtol": 1e-5},
    torch.bfloat16: {"atol": 3e-2, "rtol": 2e-2},
}


# ---- independent references ----------------------------------------------------------


def loop_rope(
    x: torch.Tensor, positions: torch.Tensor, base: float, layout: str
) -> torch.Tensor:
    """Float64 oracle from the formula: one explicit 2x2 rotation per (position,
    pair)."""
    x = x.to(torch.float64)
    out = torch.empty_like(x)
    dim = x.shape[-1]
    for row, m in enumerate(positions.tolist()):
        for i in range(dim // 2):
            theta = base ** (-2.0 * i / dim)
            c, s = math.cos(m * theta), math.sin(m * theta)
            a_idx, b_idx = (i, i + dim // 2) if layout == "half" else (2 * i, 2 * i + 1)
            a, b = x[..., row, a_idx], x[..., row, b_idx]
            out[..., row, a_idx] = c * a - s * b
            out[..., row, b_idx] = s * a + c * b
    return out


def meta_precompute_freqs_cis(
    dim: int, end: int, theta: float = 10000.0
) -> torch.Tensor:
    """Meta's LLaMA reference ``precompute_freqs_cis`` (float32 angles, as
    published)."""
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    t = torch.arange(end, device=freqs.device)
    freqs = torch.outer(t, freqs).float()
    return torch.polar(torch.ones_like(freqs), freqs)  # complex64


def meta_apply_rotary_emb(x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    """Meta's ``apply_rotary_emb`` for one tensor of shape (B, L, H, D), interleaved
    pairs."""
    x_ = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    shape = [d if i in (1, x_.ndim - 1) else 1 for i, d in enumerate(x_.shape)]
    out = torch.view_as_real(x_ * freqs_cis.view(*shape)).flatten(3)
    return out.type_as(x)


def hf_cos_sin(
    head_dim: int, positions: torch.Tensor, x: torch.Tensor, base: float = 10000.0
):
    config = LlamaConfig(
        hidden_size=2 * head_dim,
        num_attention_heads=2,
        head_dim=head_dim,
        max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": base},
    )
    emb = LlamaRotaryEmbedding(config).to(x.device)
    return emb(x, positions[None].to(x.device))  # (1, L, D) each, in x.dtype


# ---- oracle tests --------------------------------------------------------------------


def test_frequencies_match_formula_and_hf_inv_freq() -> None:
    theta = rope_frequencies(16, base=10000.0)
    assert theta.dtype == torch.float64 and theta.shape == (8,)
    expected = torch.tensor(
        [10000.0 ** (-2 * i / 16) for i in range(8)], dtype=torch.float64
    )
    torch.testing.assert_close(theta, expected, atol=0, rtol=1e-15)
    config = LlamaConfig(hidden_size=32, num_attention_heads=2, head_dim=16)
    inv_freq = LlamaRotaryEmbedding(config).inv_freq
    torch.testing.assert_close(theta.float(), inv_freq)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_apply_rope_matches_float64_loop(
    layout: str, dtype: torch.dtype, device
) -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 5, 8, generator=gen, dtype=torch.float64)
    positions = torch.tensor([0, 1, 7, 100, 1000])
    cos, sin = rope_cos_sin(
        positions, rope_frequencies(8), dtype=torch.float64, device=device
    )
    got = apply_rope(x.to(device, dtype), cos, sin, layout=layout)
    assert got.dtype == dtype and got.device.type == device.type
    expected = loop_rope(x.to(dtype), positions, 10000.0, layout)
    torch.testing.assert_close(got.cpu().double(), expected, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_half_layout_matches_hugging_face(dtype: torch.dtype, device) -> None:
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, 12, 16, generator=gen).to(device, dtype)
    k = torch.randn(2, 4, 12, 16, generator=gen).to(device, dtype)
    positions = torch.arange(12) + 5
    hf_cos, hf_sin = hf_cos_sin(
        16, positions, q
    )  # (1, L, D), float32 angles, cast to dtype
    hf_q, hf_k = apply_rotary_pos_emb(q, k, hf_cos, hf_sin, unsqueeze_dim=1)
    cos, sin = rope_cos_sin(positions, rope_frequencies(16), device=device)  # (L, D/2)
    torch.testing.assert_close(apply_rope(q, cos, sin), hf_q, **TOL[dtype])
    torch.testing.assert_close(apply_rope(k, cos, sin), hf_k, **TOL[dtype])
    # our layout-independent table is HF's first half; HF repeats it
    torch.testing.assert_close(
        hf_cos[0], torch.cat((cos, cos), -1).to(dtype), **TOL[dtype]
    )


def test_hugging_face_with_position_ids_and_bhld_vs_blhd(device) -> None:
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(2, 6, 3, 8, generator=gen).to(device)  # (B, L, H, D)
    position_ids = torch.tensor([[0, 1, 2, 3, 4, 5], [10, 11, 12, 13, 14, 15]])
    config = LlamaConfig(hidden_size=16, num_attention_heads=2, head_dim=8)
    hf_cos, hf_sin = LlamaRotaryEmbedding(config).to(device)(q, position_ids.to(device))
    hf_q, _ = apply_rotary_pos_emb(q, q, hf_cos, hf_sin, unsqueeze_dim=2)
    cos, sin = rope_cos_sin(
        position_ids, rope_frequencies(8), device=device
    )  # (B, L, D/2)
    torch.testing.assert_close(apply_rope(q, cos, sin, seq_dim=1), hf_q)
    torch.testing.assert_close(apply_rope(q, cos, sin, seq_dim=-3), hf_q)
    bhld = apply_rope(q.transpose(1, 2), cos, sin)  # (B, H, L, D)
    torch.testing.assert_close(bhld.transpose(1, 2), hf_q)


def test_rotate_half_is_hugging_face_rotate_half(device) -> None:
    x = torch.randn(3, 5, 10, device=device)
    assert torch.equal(rotate_half(x), hf_rotate_half(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_interleaved_layout_matches_meta_complex_reference(
    dtype: torch.dtype, device
) -> None:
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 9, 4, 16, generator=gen).to(
        device, dtype
    )  # (B, L, H, D) as in Meta
    freqs_cis = meta_precompute_freqs_cis(16, 9).to(device)
    expected = meta_apply_rotary_emb(x, freqs_cis)
    cos, sin = rope_cos_sin(torch.arange(9), rope_frequencies(16), device=device)
    torch.testing.assert_close(
        apply_rope(x, cos, sin, layout="interleaved", seq_dim=1), expected, **TOL[dtype]
    )
    ours_cis = rope_freqs_cis(torch.arange(9), rope_frequencies(16), device=device)
    torch.testing.assert_close(
        apply_rope_complex(x, ours_cis, seq_dim=1), expected, **TOL[dtype]
    )


def test_interleaved_layout_matches_hugging_face_after_permutation(device) -> None:
    """Meta (interleaved) and HF (half) agree once the coordinates are permuted."""
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(1, 2, 7, 12, generator=gen).to(device)
    p = interleaved_to_half_permutation(12).to(device)
    cos, sin = rope_cos_sin(torch.arange(7), rope_frequencies(12), device=device)
    hf_cos, hf_sin = hf_cos_sin(12, torch.arange(7), x)
    hf_half, _ = apply_rotary_pos_emb(x[..., p], x[..., p], hf_cos, hf_sin)
    torch.testing.assert_close(
        apply_rope(x, cos, sin, layout="interleaved")[..., p], hf_half
    )


def test_rope_cos_sin_is_float32_accurate_at_two_to_the_twenty() -> None:
    positions = torch.arange(2**20 - 4096, 2**20 + 1, 7)
    theta = rope_frequencies(128)
    cos, sin = rope_cos_sin(positions, theta)
    angle = positions[:, None].double() * theta
    assert cos.dtype == torch.float32 and cos.shape == (positions.numel(), 64)
    assert (cos.double() - angle.cos()).abs().max() <= 2**-24
    assert (sin.double() - angle.sin()).abs().max() <= 2**-24
    # the float32-angle computation (as in HF) is far worse there: the reason for
    # float64 angles
    hf_angle = positions[:, None].float() * theta.float()
    assert (hf_angle.cos().double() - angle.cos()).abs().max() > 1e-3


def test_rope_cos_sin_float64_carries_the_angle_rounding_at_two_to_the_twenty() -> None:
    """The docstring's float64 claim, against 50-digit arithmetic (mpmath): the error is
    the float64 angle's rounding, about m theta_i 2**-53, not float64's 1.1e-16."""
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 50
    m, dim = 2**20 - 1, 128
    cos, sin = rope_cos_sin(
        torch.tensor([m]), rope_frequencies(dim), dtype=torch.float64
    )
    err = 0.0
    for i, (c, s) in enumerate(zip(cos[0].tolist(), sin[0].tolist(), strict=True)):
        angle = m * mpmath.power(10000, mpmath.mpf(-2 * i) / dim)
        err = max(err, abs(c - mpmath.cos(angle)), abs(s - mpmath.sin(angle)))
    assert 1e-12 < float(err) < 4 * m * 2.0**-53  # 5.9e-11 here


def test_rope_cos_sin_shapes_dtype_device_and_fractional_positions(device) -> None:
    theta = rope_frequencies(8)
    cos, sin = rope_cos_sin(
        torch.zeros(2, 3, dtype=torch.int32), theta, dtype=torch.bfloat16, device=device
    )
    assert cos.shape == sin.shape == (2, 3, 4)
    assert cos.dtype == torch.bfloat16 and cos.device.type == device.type
    assert torch.equal(cos.cpu(), torch.ones(2, 3, 4, dtype=torch.bfloat16))
    half, _ = rope_cos_sin(torch.tensor([0.5]), theta, dtype=torch.float64)
    torch.testing.assert_close(half[0], torch.cos(0.5 * theta))


def test_positions_gather_rows_of_a_precomputed_table(device) -> None:
    theta = rope_frequencies(8)
    table = rope_cos_sin(torch.arange(64), theta, device=device)
    x = torch.randn(2, 3, 4, 8, device=device)
    ids = torch.tensor([[3, 4, 5, 6], [60, 61, 62, 63]])
    direct = apply_rope(x, *rope_cos_sin(ids, theta, device=device))
    torch.testing.assert_close(apply_rope(x, *table, positions=ids), direct)
    shared = apply_rope(
        x, *rope_cos_sin(ids[0], theta, device=device)
    )  # (L,) ids: one row set
    torch.testing.assert_close(apply_rope(x, *table, positions=ids[0]), shared)


def test_permutations_are_inverse_and_map_layouts() -> None:
    p = interleaved_to_half_permutation(8)
    q = half_to_interleaved_permutation(8)
    assert p.tolist() == [0, 2, 4, 6, 1, 3, 5, 7]
    assert torch.equal(p[q], torch.arange(8)) and torch.equal(q[p], torch.arange(8))
    x = torch.randn(3, 8)
    assert torch.equal(rotate_interleaved(x)[..., p], rotate_half(x[..., p]))


def test_weight_permutation_gives_identical_scores() -> None:
    """Converters permute each head's rows of W_q and W_k: scores in the other
    layout agree."""
    gen = torch.Generator().manual_seed(5)
    heads, head_dim, d_model, length = 2, 8, 12, 6
    w_q, w_k = (
        torch.randn(heads * head_dim, d_model, generator=gen, dtype=torch.float64)
        for _ in range(2)
    )
    tokens = torch.randn(length, d_model, generator=gen, dtype=torch.float64)
    cos, sin = rope_cos_sin(
        torch.arange(length), rope_frequencies(head_dim), dtype=torch.float64
    )
    p = interleaved_to_half_permutation(head_dim)

    def scores(wq: torch.Tensor, wk: torch.Tensor, layout: str) -> torch.Tensor:
        q = (tokens @ wq.T).view(length, heads, head_dim).transpose(0, 1)  # (H, L, D)
        k = (tokens @ wk.T).view(length, heads, head_dim).transpose(0, 1)
        q, k = (
            apply_rope(q, cos, sin, layout=layout),
            apply_rope(k, cos, sin, layout=layout),
        )
        return q @ k.transpose(-2, -1)  # (H, L, L)

    def convert(w: torch.Tensor) -> torch.Tensor:
        return w.view(heads, head_dim, d_model)[:, p].reshape(heads * head_dim, d_model)

    meta = scores(w_q, w_k, "interleaved")
    torch.testing.assert_close(scores(convert(w_q), convert(w_k), "half"), meta)
    assert (
        scores(w_q, w_k, "half") - meta
    ).abs().max() > 1e-2  # mixing layouts changes scores


# ---- property tests ------------------------------------------------------------------

dims = st.sampled_from([2, 4, 8, 16, 64])
pos = st.integers(min_value=0, max_value=100_000)


def _vec(seed: int, dim: int, n: int = 1) -> torch.Tensor:
    return torch.randn(
        n, dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64
    )


def _rot(
    x: torch.Tensor, m: int, layout: str = "half", base: float = 10000.0
) -> torch.Tensor:
    cos, sin = rope_cos_sin(
        torch.tensor([m]), rope_frequencies(x.shape[-1], base=base), dtype=torch.float64
    )
    return apply_rope(x, cos, sin, layout=layout)


@given(
    dim=dims,
    m=pos,
    n=pos,
    shift=pos,
    seed=st.integers(0, 10_000),
    layout=st.sampled_from(LAYOUTS),
)
def test_scores_depend_only_on_relative_position(
    dim, m, n, shift, seed, layout
) -> None:
    q, k = _vec(seed, dim), _vec(seed + 1, dim)
    a = (_rot(q, m, layout) * _rot(k, n, layout)).sum()
    b = (_rot(q, m + shift, layout) * _rot(k, n + shift, layout)).sum()
    assert abs(a - b) <= 1e-8 * (q.norm() * k.norm())


@given(dim=dims, m=pos, seed=st.integers(0, 10_000), layout=st.sampled_from(LAYOUTS))
def test_norm_is_preserved(dim, m, seed, layout) -> None:
    x = _vec(seed, dim, n=3)[:, None]  # (3, L=1, D): three vectors at position m
    torch.testing.assert_close(_rot(x, m, layout).norm(dim=-1), x.norm(dim=-1))


@given(dim=dims, m=pos, seed=st.integers(0, 10_000))
def test_layouts_agree_under_the_permutation(dim, m, seed) -> None:
    x = _vec(seed, dim)
    p = interleaved_to_half_permutation(dim)
    torch.testing.assert_close(
        _rot(x, m, "interleaved")[..., p], _rot(x[..., p], m, "half")
    )


@given(dim=dims, seed=st.integers(0, 10_000), layout=st.sampled_from(LAYOUTS))
def test_position_zero_is_the_identity(dim, seed, layout) -> None:
    x = _vec(seed, dim)
    assert torch.equal(_rot(x, 0, layout), x)


@given(dim=dims, m=pos, seed=st.integers(0, 10_000))
def test_complex_form_equals_interleaved(dim, m, seed) -> None:
    x = _vec(seed, dim)
    cis = rope_freqs_cis(torch.tensor([m]), rope_frequencies(dim))
    torch.testing.assert_close(
        apply_rope_complex(x.float(), cis), _rot(x, m, "interleaved").float()
    )


@given(dim=dims, m=pos, seed=st.integers(0, 10_000), layout=st.sampled_from(LAYOUTS))
def test_rotation_composes(dim, m, seed, layout) -> None:
    """R(m) R(n) = R(m + n): rotating twice adds the angles."""
    x = _vec(seed, dim)
    torch.testing.assert_close(
        _rot(_rot(x, m, layout), 17, layout), _rot(x, m + 17, layout)
    )


# ---- validation table ----------------------------------------------------------------

X = torch.randn(2, 3, 4, 8)
COS, SIN = rope_cos_sin(torch.arange(4), rope_frequencies(8))
CIS = rope_freqs_cis(torch.arange(4), rope_frequencies(8))
TABLE = rope_cos_sin(torch.arange(16), rope_frequencies(8))

F64 = rope_frequencies(8)
# a checkpoint-style table on the CPU; tests that need another device use `device`

# (public name, call, exception, message): the bad-input contract, also run by
# tests/test_contract.py for every name in companion.rope.__all__
BAD_INPUTS = [
    (
        "apply_rope",
        lambda: apply_rope(X, COS, SIN, positions=torch.tensor([0, 1, 2])),
        ValueError,
        r"^positions must have size 4 \(L, x's size along seq_dim\)",
    ),
    (
        "apply_rope",
        lambda: apply_rope(X, COS, SIN, backend="cuda"),
        ValueError,
        r"^backend must be one of 'torch', 'triton', got 'cuda'",
    ),
    (
        "apply_rope",
        lambda: apply_rope(X, COS, SIN, fused=True, backend="triton"),
        ValueError,
        r"^fused must be False with backend='triton'",
    ),
    (
        "rope_frequencies",
        lambda: rope_frequencies(7),
        ValueError,
        r"head_dim must be an even int, got 7",
    ),
    (
        "rope_frequencies",
        lambda: rope_frequencies(0),
        ValueError,
        r"head_dim must be a positive even int, got 0",
    ),
    (
        "rope_frequencies",
        lambda: rope_frequencies(8.0),
        TypeError,
        r"head_dim must be an even int, got 8.0",
    ),
    (
        "rope_frequencies",
        lambda: rope_frequencies(True),
        TypeError,
        r"head_dim must be an even int, got True",
    ),
    (
        "rope_frequencies",
        lambda: rope_frequencies(8, base=1.0),
        ValueError,
        r"base must be a real number > 1, got 1.0",
    ),
    (
        "rope_frequencies",
        lambda: rope_frequencies(8, base="1e4"),
        TypeError,
        r"base must be a real number, got '1e4'",
    ),
    (
        "rope_cos_sin",
        lambda: rope_cos_sin([0, 1], F64),
        TypeError,
        r"positions must be a torch.Tensor, got a list",
    ),
    (
        "rope_cos_sin",
        lambda: rope_cos_sin(torch.tensor([True]), F64),
        TypeError,
        r"positions must be an integer or floating tensor, got a tensor of dtype "
        r"torch.bool",
    ),
    (
        "rope_cos_sin",
        lambda: rope_cos_sin(torch.zeros(2, dtype=torch.complex64), F64),
        TypeError,
        r"positions must be an integer or floating tensor, got a tensor of dtype "
        r"torch.complex64",
    ),
    (
        "rope_cos_sin",
        lambda: rope_cos_sin(torch.arange(3, device="meta"), F64),
        ValueError,
        r"positions must hold values, got a tensor on the 'meta' device",
    ),
    (
        "rope_cos_sin",
        lambda: rope_cos_sin(torch.arange(3), torch.ones(2, 4)),
        ValueError,
        r"frequencies must have 1 dimensions \(D/2,\), got shape \(2, 4\)",
    ),
    (
        "rope_cos_sin",
        lambda: rope_cos_sin(torch.arange(3), F64.to(torch.complex128)),
        TypeError,
        r"frequencies must be a floating-point tensor, got a tensor of dtype "
        r"torch.complex128",
    ),
    (
        "rope_cos_sin",
        lambda: rope_cos_sin(torch.arange(3), F64.long()),
        TypeError,
        r"frequencies must be a floating-point tensor, got a tensor of dtype "
        r"torch.int64",
    ),
    (
        "rope_cos_sin",
        lambda: rope_cos_sin(torch.arange(3), F64, dtype=torch.int64),
        TypeError,
        r"dtype must be a floating torch.dtype, got torch.int64",
    ),
    (
        "rope_cos_sin",
        lambda: rope_cos_sin(torch.arange(3), F64, dtype="float32"),
        TypeError,
        r"dtype must be a torch.dtype such as torch.float32, got the string 'float32'",
    ),
    (
        "rope_cos_sin",
        lambda: rope_cos_sin(torch.arange(3), F64, device="cuda:9"),
        ValueError,
        r"device must be a device this machine has, got 'cuda:9'",
    ),
    (
        "rope_cos_sin",
        lambda: rope_cos_sin(torch.arange(3), F64, device="tpu"),
        ValueError,
        r"device must be a device such as 'cpu' or 'cuda', got 'tpu'",
    ),
    (
        "rope_freqs_cis",
        lambda: rope_freqs_cis(torch.arange(3), F64, device="cuda:9"),
        ValueError,
        r"device must be a device this machine has, got 'cuda:9'",
    ),
    (
        "rope_freqs_cis",
        lambda: rope_freqs_cis(torch.arange(3.0), [1.0, 0.1]),
        TypeError,
        r"frequencies must be a torch.Tensor, got a list",
    ),
    (
        "rope_freqs_cis",
        lambda: rope_freqs_cis(torch.tensor([1j]), F64),
        TypeError,
        r"positions must be an integer or floating tensor",
    ),
    (
        "apply_rope",
        lambda: apply_rope(torch.randn(2, 4, 7), COS, SIN),
        ValueError,
        r"x must have an even, positive size in dimension -1 \(head_dim: RoPE rotates "
        r"pairs\), "
        r"got shape \(2, 4, 7\)",
    ),
    (
        "apply_rope",
        lambda: apply_rope(X.long(), COS, SIN),
        TypeError,
        r"x must be a floating-point tensor, got a tensor of dtype torch.int64",
    ),
    (
        "apply_rope",
        lambda: apply_rope(X.to(torch.complex64), COS, SIN),
        TypeError,
        r"x must be a floating-point tensor, got a tensor of dtype torch.complex64",
    ),
    (
        "apply_rope",
        lambda: apply_rope(X.to("meta"), COS, SIN),
        ValueError,
        r"x must hold values, got a tensor on the 'meta' device",
    ),
    (
        "apply_rope",
        lambda: apply_rope(X[0, 0, 0], COS, SIN),
        ValueError,
        r"x must have at least 2 dimensions \(..., L, D\), got shape \(8,\)",
    ),
    (
        "apply_rope",
        lambda: apply_rope(X.numpy(), COS, SIN),
        TypeError,
        r"x must be a torch.Tensor, got a ndarray",
    ),
    (
        "apply_rope",
        lambda: apply_rope(X, *TABLE),
        ValueError,
        r"cos must have size 4 \(L, x's size along seq_dim\) in dimension -2, got "
        r"shape "
        r"\(16, 4\)",
    ),
    (
        "apply_rope",
        lambda: apply_rope(X, COS, SIN[:3]),
        ValueError,
        r"sin must have shape of cos \(4, 4\), got shape \(3, 4\)",
    ),
    (
        "apply_rope",
        lambda: apply_rope(X, COS, SIN.double()),
        TypeError,
        r"sin must have cos's dtype torch.float32, got a tensor of dtype torch.float64",
    ),
    (
        "apply_rope",
        lambda: apply_rope(X, COS[:, :2], SIN[:, :2]),
        ValueError,
        r"cos must have size 4 \(D/2, half of x's last dimension\) in dimension -1",
    ),
    (
        "apply_rope",
        lambda: apply_rope(X, COS.expand(3, 4, 4), SIN.expand(3, 4, 4)),
        ValueError,
        r"cos of shape \(B, L, D/2\) must have B = 1 or B = x.shape\[0\] = 2",
    ),
    (
        "apply_rope",
        lambda: apply_rope(X[0, 0], COS[None], SIN[None]),
        ValueError,
        r"cos of shape \(B, L, D/2\) must have B = 1 or B = x.shape\[0\] = 4 with a "
        r"batch axis "
        r"before L",
    ),
    (
        "apply_rope",
        lambda: apply_rope(X, COS[None, None], SIN[None, None]),
        ValueError,
        r"cos must have at most 3 dimensions, got shape \(1, 1, 4, 4\)",
    ),
    (
        "apply_rope",
        lambda: apply_rope(X, COS[0], SIN[0]),
        ValueError,
        r"cos must have at least 2 dimensions, got shape \(4,\)",
    ),
    (
        "apply_rope",
        lambda: apply_rope(X, COS.long(), SIN),
        TypeError,
        r"cos must be a floating-point tensor, got a tensor of dtype torch.int64",
    ),
    (
        "apply_rope",
        lambda: apply_rope(X, COS.to(torch.complex64), SIN),
        TypeError,
        r"cos must be a floating-point tensor, got a tensor of dtype torch.complex64",
    ),
    (
        "apply_rope",
        lambda: apply_rope(X, COS, SIN.to("meta")),
        ValueError,
        r"sin must hold values, got a tensor on the 'meta' device",
    ),
    (
        "apply_rope",
        lambda: apply_rope(X, COS, SIN, seq_dim=-1),
        ValueError,
        r"seq_dim must be an axis of a 4-dimensional tensor \(not the last, "
        r"head_dim\), got -1",
    ),
    (
        "apply_rope",
        lambda: apply_rope(X, COS, SIN, seq_dim=4),
        ValueError,
        r"seq_dim must be an axis of a 4-dimensional tensor .*, got 4",
    ),
    (
        "apply_rope",
        lambda: apply_rope(X, COS, SIN, seq_dim=1.0),
        TypeError,
        r"seq_dim must be an int, got 1.0",
    ),
    (
        "apply_rope",
        lambda: apply_rope(X, *TABLE, positions=torch.arange(13, 17)),
        ValueError,
        r"positions must lie in \[0, 16\) for a table of 16 rows, got values in \[13, "
        r"16\]",
    ),
    (
        "apply_rope",
        lambda: apply_rope(X, *TABLE, positions=torch.tensor([-1, 0, 1, 2])),
        ValueError,
        r"positions must lie in \[0, 16\)",
    ),
    (
        "apply_rope",
        lambda: apply_rope(X, *TABLE, positions=torch.arange(4.0)),
        TypeError,
        r"positions must be an integer tensor, got a tensor of dtype torch.float32",
    ),
    (
        "apply_rope",
        lambda: apply_rope(X, *TABLE, positions=torch.tensor(True)),
        TypeError,
        r"positions must be an integer tensor, got a tensor of dtype torch.bool",
    ),
    (
        "apply_rope",
        lambda: apply_rope(X, *TABLE, positions=torch.tensor(3)),
        ValueError,
        r"positions must have at least 1 dimensions",
    ),
    (
        "apply_rope",
        lambda: apply_rope(X, *TABLE, positions=torch.arange(5)),
        ValueError,
        r"positions must have size 4 \(L, x's size along seq_dim\) in dimension -1, "
        r"got shape \(5,\)",
    ),
    (
        "apply_rope",
        lambda: apply_rope(X, COS[None], SIN[None], positions=torch.arange(4)),
        ValueError,
        r"cos must have at most 2 dimensions",
    ),
    (
        "apply_rope",
        lambda: apply_rope(X, COS, SIN, fused="yes"),
        TypeError,
        r"fused must be a bool, got 'yes'",
    ),
    (
        "apply_rope",
        lambda: apply_rope(X, COS, SIN, fused=1),
        TypeError,
        r"fused must be a bool, got 1",
    ),
    (
        "apply_rope_complex",
        lambda: apply_rope_complex(X, COS),
        TypeError,
        r"freqs_cis must be a complex tensor, got a tensor of dtype torch.float32",
    ),
    (
        "apply_rope_complex",
        lambda: apply_rope_complex(X.long(), CIS),
        TypeError,
        r"x must be a floating-point tensor, got a tensor of dtype torch.int64",
    ),
    (
        "apply_rope_complex",
        lambda: apply_rope_complex(X, CIS[:3]),
        ValueError,
        r"freqs_cis must have size 4 \(L, x's size along seq_dim\)",
    ),
    (
        "apply_rope_complex",
        lambda: apply_rope_complex(X, CIS, seq_dim=3),
        ValueError,
        r"seq_dim must be an axis of a 4-dimensional tensor",
    ),
    (
        "apply_rope_complex",
        lambda: apply_rope_complex(X, CIS.to("meta")),
        ValueError,
        r"freqs_cis must hold values, got a tensor on the 'meta' device",
    ),
    (
        "rotate_half",
        lambda: rotate_half(torch.randn(3, 5)),
        ValueError,
        r"x must have an even, positive size in dimension -1 \(the two halves\), got "
        r"shape "
        r"\(3, 5\)",
    ),
    (
        "rotate_half",
        lambda: rotate_half(torch.ones(3, 4, dtype=torch.complex64)),
        TypeError,
        r"x must be a floating-point tensor, got a tensor of dtype torch.complex64",
    ),
    (
        "rotate_half",
        lambda: rotate_half(torch.tensor(1.0)),
        ValueError,
        r"x must have at least 1 dimensions",
    ),
    (
        "rotate_interleaved",
        lambda: rotate_interleaved(torch.randn(3, 5)),
        ValueError,
        r"x must have an even, positive size in dimension -1 \(pairs side by side\)",
    ),
    (
        "rotate_interleaved",
        lambda: rotate_interleaved([1.0, 2.0]),
        TypeError,
        r"x must be a torch.Tensor, got a list",
    ),
    (
        "interleaved_to_half_permutation",
        lambda: interleaved_to_half_permutation(5),
        ValueError,
        r"head_dim must be an even int, got 5",
    ),
    (
        "interleaved_to_half_permutation",
        lambda: interleaved_to_half_permutation("8"),
        TypeError,
        r"head_dim must be an even int, got '8'",
    ),
    (
        "half_to_interleaved_permutation",
        lambda: half_to_interleaved_permutation(-2),
        ValueError,
        r"head_dim must be a positive even int, got -2",
    ),
    (
        "apply_rope",
        lambda: apply_rope(X, *TABLE, positions=torch.zeros(2, 1, 4, dtype=torch.long)),
        ValueError,
        r"positions must have at most 2 dimensions, got shape \(2, 1, 4\)",
    ),
    # LAYOUTS names the pairings apply_rope accepts; anything else is refused
    (
        "LAYOUTS",
        lambda: apply_rope(X, COS, SIN, layout="neox"),
        ValueError,
        r"layout must be one of 'half', 'interleaved', got 'neox'",
    ),
    (
        "LAYOUTS",
        lambda: apply_rope(X, COS, SIN, layout=None),
        TypeError,
        r"layout must be one of 'half', 'interleaved', got None",
    ),
]


@pytest.mark.parametrize(
    ("name", "call", "error", "match"),
    BAD_INPUTS,
    ids=[f"{row[0]}-{i}" for i, row in enumerate(BAD_INPUTS)],
)
def test_bad_input_raises_named_error(name, call, error, match) -> None:
    with pytest.raises(error, match=match):
        call()


def test_every_public_name_has_a_bad_input_case() -> None:
    assert set(rope.__all__) <= {row[0] for row in BAD_INPUTS}


def test_checker_rejects_an_unknown_layout() -> None:
    with pytest.raises(ValueError, match=r"layout must be one of"):
        checks.check_apply_rope(lambda x, positions, base: x, layout="neox")


def test_tables_on_another_device_are_named(device) -> None:
    """cos/sin/positions on another device than x: a ValueError naming the argument.

    With one device only, the meta device stands in for the other one in the positions
    case (positions hold no values there: the check must come before any indexing).
    """
    x = torch.randn(1, 2, 4, 8, device=device)
    cos, sin = rope_cos_sin(torch.arange(4), F64, device=device)
    if device.type == "cuda":
        with pytest.raises(ValueError, match=r"cos must be on x's device cuda"):
            apply_rope(x, cos.cpu(), sin.cpu())
        with pytest.raises(ValueError, match=r"freqs_cis must be on x's device cuda"):
            apply_rope_complex(x, rope_freqs_cis(torch.arange(4), F64))
        with pytest.raises(ValueError, match=r"positions must be on cos's device"):
            apply_rope(x, cos, sin, positions=torch.arange(4))
    with pytest.raises(ValueError, match=r"positions must hold values"):
        apply_rope(x, cos, sin, positions=torch.arange(4, device="meta"))


def test_empty_inputs_give_the_empty_answer() -> None:
    """L = 0 rows (an empty prompt, an empty cache slice): the empty result, no
    error."""
    cos, sin = rope_cos_sin(torch.arange(0), F64)
    assert cos.shape == sin.shape == (0, 4)
    for layout in LAYOUTS:
        out = apply_rope(torch.randn(2, 3, 0, 8), cos, sin, layout=layout)
        assert out.shape == (2, 3, 0, 8)
    empty_ids = torch.zeros(0, dtype=torch.long)
    assert apply_rope(torch.randn(2, 0, 8), *TABLE, positions=empty_ids).shape == (
        2,
        0,
        8,
    )
    cis = rope_freqs_cis(torch.arange(0), F64)
    assert apply_rope_complex(torch.randn(1, 0, 8), cis).shape == (1, 0, 8)


@given(
    batch=st.integers(0, 3),
    heads=st.integers(1, 3),
    length=st.integers(0, 9),
    pairs=st.integers(1, 8),
    base=st.one_of(st.floats(1.5, 1e6), st.integers(2, 10**6)),
    dtype=st.sampled_from(
        [torch.float32, torch.float64, torch.bfloat16, torch.float16]
    ),
    table_dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16]),
    layout=st.sampled_from(LAYOUTS),
    seq_first=st.booleans(),
    per_batch=st.booleans(),
    offset=st.integers(0, 10**6),
)
def test_valid_random_inputs_never_raise(
    batch,
    heads,
    length,
    pairs,
    base,
    dtype,
    table_dtype,
    layout,
    seq_first,
    per_batch,
    offset,
) -> None:
    head_dim = 2 * pairs
    theta = rope_frequencies(head_dim, base=base)
    shape = (
        (batch, length, heads, head_dim)
        if seq_first
        else (batch, heads, length, head_dim)
    )
    x = torch.randn(shape).to(dtype)
    ids = torch.arange(length) + offset
    if per_batch:
        ids = ids.expand(batch, length)
    cos, sin = rope_cos_sin(ids, theta, dtype=table_dtype)
    seq_dim = 1 if seq_first else -2
    out = apply_rope(x, cos, sin, layout=layout, seq_dim=seq_dim)
    assert out.shape == x.shape and out.dtype == dtype
    cis = rope_freqs_cis(ids, theta)
    assert apply_rope_complex(x, cis, seq_dim=seq_dim).shape == x.shape
    table = rope_cos_sin(torch.arange(length + 1), theta, dtype=table_dtype)
    rows = (
        torch.arange(length)
        if not per_batch
        else torch.arange(length).expand(batch, -1)
    )
    assert apply_rope(x, *table, seq_dim=seq_dim, positions=rows).shape == x.shape
    assert rotate_half(x).shape == rotate_interleaved(x).shape == x.shape
    p = interleaved_to_half_permutation(head_dim)
    assert torch.equal(
        p[half_to_interleaved_permutation(head_dim)], torch.arange(head_dim)
    )


# ---- checkers ------------------------------------------------------------------------


def _learner_apply(layout: str, *, exponent: float = 2.0, sign: float = 1.0):
    def fn(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
        dim = x.shape[-1]
        theta = base ** (-exponent * torch.arange(dim // 2, dtype=torch.float64) / dim)
        cos, sin = rope_cos_sin(positions, theta)
        return apply_rope(x, cos, sign * sin, layout=layout)

    return fn


def _raises_mistake(call, name: str) -> None:
    with pytest.raises(CheckError) as info:
        call()
    assert info.value.mistake == name
    assert name in str(info.value)


def test_check_rope_frequencies_both_ways() -> None:
    assert checks.check_rope_frequencies(
        lambda head_dim, base: rope_frequencies(head_dim, base=base)
    )

    def wrong(head_dim, base):
        return base ** (-torch.arange(head_dim // 2, dtype=torch.float64) / head_dim)

    _raises_mistake(
        lambda: checks.check_rope_frequencies(wrong), "frequencies base^(-i/D)"
    )

    def flipped(head_dim, base):
        return base ** (2 * torch.arange(head_dim // 2, dtype=torch.float64) / head_dim)

    _raises_mistake(
        lambda: checks.check_rope_frequencies(flipped), "exponent with the wrong sign"
    )


@pytest.mark.parametrize("layout", LAYOUTS)
def test_check_apply_rope_both_ways(layout: str) -> None:
    other = "interleaved" if layout == "half" else "half"
    assert checks.check_apply_rope(_learner_apply(layout), layout=layout)
    _raises_mistake(
        lambda: checks.check_apply_rope(_learner_apply(other), layout=layout),
        "rotating the wrong pairs for the declared layout",
    )
    _raises_mistake(
        lambda: checks.check_apply_rope(
            _learner_apply(layout, sign=-1.0), layout=layout
        ),
        "the sign of the rotation flipped",
    )
    _raises_mistake(
        lambda: checks.check_apply_rope(
            _learner_apply(layout, exponent=1.0), layout=layout
        ),
        "frequencies base^(-i/D)",
    )
    _raises_mistake(
        lambda: checks.check_apply_rope(
            lambda x, positions, base: _learner_apply(layout)(
                x, torch.arange(x.shape[-2]), base
            ),
            layout=layout,
        ),
        "positions ignored",
    )


def _learner_attention(rotate_v: bool = False, rotate_qk: bool = True):
    def fn(query, key, value, positions, base):
        cos, sin = rope_cos_sin(
            positions, rope_frequencies(query.shape[-1], base=base), dtype=query.dtype
        )
        if rotate_qk:
            query, key = apply_rope(query, cos, sin), apply_rope(key, cos, sin)
        if rotate_v:
            value = apply_rope(value, cos, sin)
        return torch.nn.functional.scaled_dot_product_attention(query, key, value)

    return fn


def test_check_rope_attention_both_ways() -> None:
    assert checks.check_rope_attention(_learner_attention())
    _raises_mistake(
        lambda: checks.check_rope_attention(_learner_attention(rotate_v=True)),
        "rotating v",
    )
    _raises_mistake(
        lambda: checks.check_rope_attention(_learner_attention(rotate_qk=False)),
        "RoPE left out",
    )


def test_check_rope_weight_permutation_both_ways() -> None:
    def right(weight, num_heads):
        d = weight.shape[0] // num_heads
        return weight.view(num_heads, d, -1)[
            :, interleaved_to_half_permutation(d)
        ].reshape(weight.shape)

    def backwards(weight, num_heads):
        d = weight.shape[0] // num_heads
        return weight.view(num_heads, d, -1)[
            :, half_to_interleaved_permutation(d)
        ].reshape(weight.shape)

    def global_perm(weight, num_heads):
        return weight[interleaved_to_half_permutation(weight.shape[0])]

    assert checks.check_rope_weight_permutation(right)
    _raises_mistake(
        lambda: checks.check_rope_weight_permutation(backwards),
        "permutation in the wrong direction",
    )
    _raises_mistake(
        lambda: checks.check_rope_weight_permutation(global_perm),
        "one permutation over all rows instead of one per head",
    )


def test_check_rope_cos_sin_both_ways() -> None:
    def right(positions, head_dim, base):
        return rope_cos_sin(positions, rope_frequencies(head_dim, base=base))

    def float32_angles(positions, head_dim, base):
        angle = (
            positions[:, None].float() * rope_frequencies(head_dim, base=base).float()
        )
        return angle.cos(), angle.sin()

    def wrong_freqs(positions, head_dim, base):
        return rope_cos_sin(
            positions,
            base ** (-torch.arange(head_dim // 2, dtype=torch.float64) / head_dim),
        )

    assert checks.check_rope_cos_sin(right)
    _raises_mistake(
        lambda: checks.check_rope_cos_sin(float32_angles), "angles computed in float32"
    )
    _raises_mistake(
        lambda: checks.check_rope_cos_sin(wrong_freqs), "frequencies base^(-i/D)"
    )
    with pytest.raises(CheckError, match="Return a pair"):
        checks.check_rope_cos_sin(
            lambda positions, head_dim, base: right(positions, head_dim, base)[0]
        )


def notebook_hf_cos_sin():
    """The chapter's own ``hf_cos_sin`` (the precision study), read from the notebook."""
    import ast
    import json
    from pathlib import Path

    notebook = Path(__file__).resolve().parents[1] / "book" / "02_rope.ipynb"
    for cell in json.loads(notebook.read_text(encoding="utf-8"))["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "code" and "def hf_cos_sin(" in source:
            for node in ast.parse(source).body:
                if isinstance(node, ast.FunctionDef) and node.name == "hf_cos_sin":
                    namespace = {"torch": torch}
                    exec(ast.get_source_segment(source, node), namespace)
                    return namespace["hf_cos_sin"]
    raise AssertionError("book/02_rope.ipynb no longer defines hf_cos_sin")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chapter_replica_of_hf_table_is_bit_exact(dtype: torch.dtype) -> None:
    positions = torch.randint(
        0, 2**20, (64,), generator=torch.Generator().manual_seed(6)
    )
    hf_cos, hf_sin = hf_cos_sin(128, positions, torch.zeros(1, dtype=dtype))
    cos, sin = notebook_hf_cos_sin()(positions, 128, 10000.0, dtype)
    assert torch.equal(cos, hf_cos[0]) and torch.equal(sin, hf_sin[0])


def test_error_vs_position_plot_helper() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from companion import plotting

    fig, ax = plt.subplots()
    out = plotting.error_vs_position(
        ax,
        torch.tensor([1.0, 2.0, 4.0]),
        {"a": torch.tensor([1e-8, 1e-7, 1e-6])},
        levels={"f32": 3e-8},
    )
    assert out is ax and ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert len(ax.lines) == 2 and ax.get_xlabel() == "position m"
    with pytest.raises(ValueError, match="errors 'b' has shape"):
        plotting.error_vs_position(ax, torch.tensor([1.0, 2.0]), {"b": torch.ones(3)})
    with pytest.raises(ValueError, match="positions must be 1-D and positive"):
        plotting.error_vs_position(ax, torch.tensor([0.0, 2.0]), {"b": torch.ones(2)})
    with pytest.raises(TypeError, match="ax must be a matplotlib Axes"):
        plotting.error_vs_position(None, torch.tensor([1.0]), {})
    plt.close(fig)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_gradients_flow_through_both_layouts(layout: str) -> None:
    """apply_rope is differentiable (training uses it); the gradient of a rotation
    is R^T."""
    x = torch.randn(1, 2, 3, 4, dtype=torch.float64, requires_grad=True)
    cos, sin = rope_cos_sin(
        torch.arange(3) + 2, rope_frequencies(4), dtype=torch.float64
    )
    assert torch.autograd.gradcheck(
        lambda t: apply_rope(t, cos, sin, layout=layout), (x,)
    )
    grad = torch.randn(1, 2, 3, 4, dtype=torch.float64)
    (apply_rope(x, cos, sin, layout=layout) * grad).sum().backward()
    torch.testing.assert_close(
        x.grad, apply_rope(grad, cos, -sin, layout=layout)
    )  # R^T = R(-angle)
    with torch.no_grad():
        torch.testing.assert_close(
            apply_rope(x, cos, sin, layout=layout),
            apply_rope(x.detach(), cos, sin, layout=layout),
        )


@pytest.mark.parametrize("block", [1, 7, 64, 1000])
@pytest.mark.parametrize(
    ("x_shape", "table", "seq_dim"),
    [
        ((2, 3, 5, 8), "shared", -2),  # (B, H, L, D), table (L, D/2)
        ((2, 3, 5, 8), "per_batch", -2),  # table (B, L, D/2)
        ((2, 5, 3, 8), "per_batch", 1),  # (B, L, H, D)
        ((1, 4, 5, 8), "shared", -2),  # leading size-1 axis
        ((5, 8), "shared", -2),  # (L, D)
    ],
)
def test_blocked_half_layout_matches_the_formula(
    monkeypatch, block, x_shape, table, seq_dim
) -> None:
    """The CPU fast path rotates block by block; every split must give the plain
    formula."""
    monkeypatch.setattr(_rope_fast, "BLOCK", block)
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(x_shape, generator=gen, dtype=torch.float64)
    ids = (
        torch.arange(5)
        if table == "shared"
        else torch.tensor([[0, 1, 2, 3, 4], [9, 3, 100, 7, 2]])
    )
    cos, sin = rope_cos_sin(ids, rope_frequencies(8), dtype=torch.float64)
    got = apply_rope(x, cos, sin, seq_dim=seq_dim)
    c = cos if table == "shared" else cos[:, None] if seq_dim == -2 else cos
    s = sin if table == "shared" else sin[:, None] if seq_dim == -2 else sin
    if seq_dim == 1:  # (B, L, H, D): the table needs a heads axis after L
        c, s = c.unsqueeze(-2), s.unsqueeze(-2)
    x1, x2 = x.chunk(2, dim=-1)
    expected = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
    torch.testing.assert_close(got, expected, atol=1e-14, rtol=0)


# ---- fused=True: the half layout compiled by torch.compile ---------------------------

# torch.compile's CPU backend builds C++; a learner's machine may have no compiler.
# Under CI the
# machine has one, so there a missing compiler fails instead of skipping.
_CXX = next(
    (
        c
        for c in (os.environ.get("CXX"), "g++", "c++", "clang++")
        if c and shutil.which(c)
    ),
    None,
)
needs_compiler = pytest.mark.skipif(
    _CXX is None and not os.environ.get("CI"),
    reason="torch.compile needs a C++ compiler (g++, clang++) and none is on PATH",
)


def _rope_inputs(x_shape, table: str, seq_dim: int):
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(x_shape, generator=gen, dtype=torch.float64)
    length = x_shape[seq_dim]
    ids = (
        torch.arange(length)
        if table == "shared"
        else torch.randint(0, 300, (2, length), generator=gen)
    )
    return x, ids


@needs_compiler
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("x_shape", "table", "seq_dim"),
    [
        ((2, 3, 5, 8), "shared", -2),  # (B, H, L, D), table (L, D/2)
        ((2, 5, 3, 8), "per_batch", 1),  # (B, L, H, D), table (B, L, D/2)
    ],
)
def test_fused_half_layout_matches_float64_loop_and_eager(
    x_shape, table, seq_dim, dtype: torch.dtype, device
) -> None:
    x, ids = _rope_inputs(x_shape, table, seq_dim)
    cos, sin = rope_cos_sin(
        ids, rope_frequencies(8), dtype=torch.float64, device=device
    )
    xd = x.to(device, dtype)
    got = apply_rope(xd, cos, sin, seq_dim=seq_dim, fused=True)
    assert (
        got.dtype == dtype and got.device.type == device.type and got.shape == x.shape
    )
    eager = apply_rope(xd, cos, sin, seq_dim=seq_dim)
    torch.testing.assert_close(got, eager, **TOL[dtype])
    # the oracle: (B, L, H, D) inputs are moved to (B, H, L, D) for the loop, which
    # wants L at -2
    xl = xd.double().cpu() if seq_dim == -2 else xd.double().cpu().transpose(1, 2)
    rows = ids if table == "shared" else None
    if rows is not None:
        expected = loop_rope(xl, rows, 10000.0, "half")
    else:
        expected = torch.stack(
            [loop_rope(xl[b], ids[b], 10000.0, "half") for b in range(2)]
        )
    if seq_dim == 1:
        expected = expected.transpose(1, 2)
    torch.testing.assert_close(got.cpu().double(), expected, **TOL[dtype])


@needs_compiler
def test_fused_reuses_its_kernel_for_new_lengths_batches_and_heads() -> None:
    """Only the head width is static: other shapes must not compile again."""
    theta = rope_frequencies(16)
    gen = torch.Generator().manual_seed(3)

    def run(b: int, h: int, length: int) -> None:
        x = torch.randn(b, h, length, 16, generator=gen)
        cos, sin = rope_cos_sin(torch.arange(length), theta)
        torch.testing.assert_close(
            apply_rope(x, cos, sin, fused=True),
            apply_rope(x, cos, sin),
            atol=2e-6,
            rtol=1e-5,
        )

    with torch.no_grad():
        run(2, 3, 7)  # compiles
        run(
            3, 4, 9
        )  # the first change of sizes may compile once more (sizes become dynamic)
        with torch.compiler.set_stance("fail_on_recompile"):
            run(2, 5, 33)
            run(4, 2, 120)


@needs_compiler
def test_fused_gradients_match_eager() -> None:
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, 3, 6, 8, generator=gen, requires_grad=True)
    cos, sin = rope_cos_sin(torch.arange(6), rope_frequencies(8))
    weight = torch.randn(2, 3, 6, 8, generator=gen)
    (apply_rope(x, cos, sin, fused=True) * weight).sum().backward()
    fused_grad, x.grad = x.grad, None
    (apply_rope(x, cos, sin) * weight).sum().backward()
    torch.testing.assert_close(fused_grad, x.grad, atol=1e-6, rtol=1e-6)
    # the gradient of a rotation is the inverse rotation of the upstream gradient
    torch.testing.assert_close(
        fused_grad, apply_rope(weight, cos, -sin), atol=1e-6, rtol=1e-6
    )


@needs_compiler
def test_fused_does_not_touch_the_callers_tensors() -> None:
    """Dynamic-shape marks go on fresh views, never on the tensors passed in."""
    x = torch.randn(1, 2, 5, 8)
    cos, sin = rope_cos_sin(torch.arange(5), rope_frequencies(8))
    apply_rope(x, cos, sin, fused=True)
    for t in (x, cos, sin):
        assert not hasattr(t, "_dynamo_dynamic_indices")


def test_fused_reports_a_compiler_failure_with_the_way_out(monkeypatch) -> None:
    def broken_compile(fn, **kwargs):
        def run(*args):
            raise OSError("no C++ compiler found")

        return run

    monkeypatch.setattr(_rope_fast, "COMPILED", {})
    monkeypatch.setattr(_rope_fast.torch, "compile", broken_compile)
    x = torch.randn(1, 2, 5, 8)
    cos, sin = rope_cos_sin(torch.arange(5), rope_frequencies(8))
    with pytest.raises(
        RuntimeError,
        match=r"torch.compile, which failed on cpu "
        r"\(OSError: no C\+\+ compiler found\); use fused=False",
    ) as info:
        apply_rope(x, cos, sin, fused=True)
    assert isinstance(info.value.__cause__, OSError)
    # the interleaved layout is one complex multiplication already: fused=True compiles
    # nothing
    torch.testing.assert_close(
        apply_rope(x, cos, sin, layout="interleaved", fused=True),
        apply_rope(x, cos, sin, layout="interleaved"),
    )


@needs_compiler
@pytest.mark.parametrize(
    ("layout", "fused", "with_positions"),
    [("half", False, False), ("half", True, True), ("interleaved", False, True)],
)
def test_apply_rope_traces_inside_a_callers_torch_compile(
    layout, fused, with_positions
) -> None:
    """Learners compile whole models: apply_rope must trace without a graph break."""
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(2, 6, 3, 8, generator=gen)  # (B, L, H, D)
    table = rope_cos_sin(torch.arange(32), rope_frequencies(8))
    ids = torch.tensor([[0, 1, 2, 3, 4, 5], [7, 9, 11, 2, 30, 31]])

    def block(x: torch.Tensor) -> torch.Tensor:
        if with_positions:
            return 2 * apply_rope(
                x, *table, layout=layout, seq_dim=1, positions=ids, fused=fused
            )
        cos, sin = table[0][:6], table[1][:6]
        return 2 * apply_rope(x, cos, sin, layout=layout, seq_dim=1, fused=fused)

    compiled = torch.compile(block, fullgraph=True)  # raises on any graph break
    torch.testing.assert_close(compiled(x), block(x), atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_apply_rope_under_torch_func_vmap_and_grad(layout: str) -> None:
    """Per-sample tricks (vmap, torch.func.grad) must see the same rotation."""
    gen = torch.Generator().manual_seed(13)
    x = torch.randn(5, 3, 7, 8, generator=gen)  # (samples, H, L, D)
    cos, sin = rope_cos_sin(torch.arange(7), rope_frequencies(8))
    with torch.no_grad():  # the no-grad path writes with out=, which vmap cannot batch
        mapped = torch.vmap(lambda t: apply_rope(t, cos, sin, layout=layout))(x)
    torch.testing.assert_close(mapped, apply_rope(x, cos, sin, layout=layout))
    weight = torch.randn(3, 7, 8, generator=gen)
    per_sample = torch.vmap(
        torch.func.grad(
            lambda t: (apply_rope(t, cos, sin, layout=layout) * weight).sum()
        )
    )(x)
    # the gradient of a rotation is the inverse rotation of the upstream gradient
    expected = apply_rope(weight.expand_as(x), cos, -sin, layout=layout)
    torch.testing.assert_close(per_sample, expected, atol=1e-6, rtol=1e-6)
