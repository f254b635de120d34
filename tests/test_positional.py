"""Tests for companion.positional (chapter ch-sinusoidal) and its exercise checkers.

Three kinds: oracle tests (a float64 double loop written from the formula, Hugging
Face's DistilBERT table, T(k) built entry by entry), hypothesis properties (bounded,
unit circle per pair, shift theorem, dot product a function of the offset, symmetry),
and a validation table.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from companion import checks
from companion.positional import (
    SinusoidalPositionalEncoding,
    inverse_frequencies,
    shift_matrix,
    sinusoidal_dot_products,
    sinusoidal_encoding,
    sinusoidal_frequencies,
    sinusoidal_wavelengths,
)

F32_HALF_ULP_AT_1 = 2.0**-25  # largest float32 rounding error for values in [-1, 1]


def loop_encoding(num_positions: int, dim: int, base: float = 10000.0) -> torch.Tensor:
    """The formula of Vaswani et al. (2017), one entry at a time, in float64."""
    out = torch.empty(num_positions, dim, dtype=torch.float64)
    for pos in range(num_positions):
        for i in range(dim // 2):
            angle = pos / base ** (2 * i / dim)
            out[pos, 2 * i] = math.sin(angle)
            out[pos, 2 * i + 1] = math.cos(angle)
    return out


def loop_shift_matrix(k: float, dim: int, base: float = 10000.0) -> torch.Tensor:
    """T(k) entry by entry: block i = [[cos, -sin], [sin, cos]] of k * w_i."""
    out = torch.zeros(dim, dim, dtype=torch.float64)
    for i in range(dim // 2):
        b = k / base ** (2 * i / dim)
        out[2 * i, 2 * i] = math.cos(b)
        out[2 * i, 2 * i + 1] = -math.sin(b)
        out[2 * i + 1, 2 * i] = math.sin(b)
        out[2 * i + 1, 2 * i + 1] = math.cos(b)
    return out


# ---- oracles -------------------------------------------------------------------------


@pytest.mark.parametrize(("num_positions", "dim"), [(1, 2), (3, 4), (50, 16), (33, 64)])
def test_encoding_matches_float64_loop(num_positions: int, dim: int) -> None:
    expected = loop_encoding(num_positions, dim)
    got = sinusoidal_encoding(num_positions, dim, dtype=torch.float64)
    torch.testing.assert_close(got, expected, atol=1e-13, rtol=0.0)


def test_encoding_other_base_matches_loop() -> None:
    torch.testing.assert_close(
        sinusoidal_encoding(20, 8, base=500.0, dtype=torch.float64),
        loop_encoding(20, 8, base=500.0),
        atol=1e-13,
        rtol=0.0,
    )


def test_worked_example_of_the_notes() -> None:
    """D = 4, positions 0, 1, 2: the values the chapter prints."""
    pe = sinusoidal_encoding(3, 4, dtype=torch.float64)
    expected = torch.tensor(
        [
            [0.0, 1.0, 0.0, 1.0],
            [math.sin(1), math.cos(1), math.sin(0.01), math.cos(0.01)],
            [math.sin(2), math.cos(2), math.sin(0.02), math.cos(0.02)],
        ],
        dtype=torch.float64,
    )
    torch.testing.assert_close(pe, expected, atol=1e-15, rtol=0.0)


def test_matches_hugging_face_distilbert_table() -> None:
    modeling = pytest.importorskip("transformers.models.distilbert.modeling_distilbert")
    out = torch.empty(64, 32)
    modeling.create_sinusoidal_embeddings(64, 32, out)
    torch.testing.assert_close(sinusoidal_encoding(64, 32), out, atol=1e-7, rtol=0.0)


def test_float32_accurate_to_rounding_at_a_million() -> None:
    """Float64 angles: every float32 entry is the correctly rounded value, up to pos
    = 1e6."""
    dim = 8
    table = sinusoidal_encoding(1_000_001, dim)
    rows = torch.tensor([0, 1, 999_983, 1_000_000])
    expected = torch.empty(len(rows), dim, dtype=torch.float64)
    for r, pos in enumerate(rows.tolist()):
        for i in range(dim // 2):
            angle = pos / 10000.0 ** (2 * i / dim)
            expected[r, 2 * i], expected[r, 2 * i + 1] = (
                math.sin(angle),
                math.cos(angle),
            )
    err = (table[rows].double() - expected).abs().max().item()
    assert err <= F32_HALF_ULP_AT_1 + 1e-9
    # The float32 recipe of the notes is not: its angle at pos = 1e6 is off by ~1e-2
    # radians.
    pos32 = torch.tensor([1_000_000.0])
    div32 = torch.exp(torch.arange(0, dim, 2) * (-math.log(10000.0) / dim))
    naive = torch.sin(pos32[:, None] * div32)
    assert (naive.double() - expected[3, 0::2]).abs().max().item() > 1e-3


def test_float64_table_carries_the_angle_rounding_at_a_million() -> None:
    """The docstring's float64 claim, against 50-digit arithmetic (mpmath): the float64
    angle's own rounding, about pos * omega_i * 2**-53, dominates - far above float64's
    rounding of values near 1 (1.1e-16), and within a few of those angle roundings."""
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 50
    pos, dim = 10**6, 128
    row = sinusoidal_encoding(pos + 1, dim, dtype=torch.float64)[pos].tolist()
    err = 0.0
    for i in range(dim // 2):
        angle = pos * mpmath.power(10000, mpmath.mpf(-2 * i) / dim)
        err = max(
            err,
            abs(row[2 * i] - mpmath.sin(angle)),
            abs(row[2 * i + 1] - mpmath.cos(angle)),
        )
    assert 1e-12 < float(err) < 4 * pos * 2.0**-53  # 5.2e-11 here


def test_frequencies_and_wavelengths() -> None:
    omega = sinusoidal_frequencies(512)
    assert omega.dtype == torch.float64 and omega.shape == (256,)
    assert omega[0].item() == 1.0
    torch.testing.assert_close(
        omega[-1], torch.tensor(10000.0 ** (-510 / 512), dtype=torch.float64)
    )
    ratios = omega[1:] / omega[:-1]  # geometric progression
    torch.testing.assert_close(ratios, torch.full_like(ratios, 10000.0 ** (-2 / 512)))
    torch.testing.assert_close(sinusoidal_wavelengths(512), 2 * math.pi / omega)


@pytest.mark.parametrize(("k", "dim"), [(0, 2), (1, 4), (7, 8), (-3, 6), (2.5, 16)])
def test_shift_matrix_matches_loop(k: float, dim: int) -> None:
    torch.testing.assert_close(shift_matrix(k, dim), loop_shift_matrix(k, dim))


def test_shift_matrix_group_properties() -> None:
    dim = 16
    eye = torch.eye(dim, dtype=torch.float64)
    t3, t5 = shift_matrix(3, dim), shift_matrix(5, dim)
    torch.testing.assert_close(t3 @ t3.mT, eye)  # orthogonal
    torch.testing.assert_close(t3 @ t5, shift_matrix(8, dim))  # T(j) T(k) = T(j + k)
    torch.testing.assert_close(t3.mT, shift_matrix(-3, dim))  # T(k)^T = T(-k)
    torch.testing.assert_close(shift_matrix(0, dim), eye)
    # zero outside the 2x2 diagonal blocks
    mask = torch.block_diag(*[torch.ones(2, 2)] * (dim // 2)).bool()
    assert (t5[~mask] == 0).all()


def test_dot_products_match_the_gram_matrix() -> None:
    pe = sinusoidal_encoding(40, 32, dtype=torch.float64)
    gram = pe @ pe.mT  # (L, L)
    offsets = torch.arange(40, dtype=torch.float64)
    expected = sinusoidal_dot_products(offsets[:, None] - offsets[None, :], 32)
    torch.testing.assert_close(gram, expected)
    assert sinusoidal_dot_products(torch.tensor(0.0), 32).item() == pytest.approx(16.0)


# ---- dtype and device ----------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16]
)
def test_encoding_dtype_and_device(device: torch.device, dtype: torch.dtype) -> None:
    pe = sinusoidal_encoding(30, 8, dtype=dtype, device=device)
    assert pe.dtype == dtype and pe.device.type == device.type
    # within rounding of dtype of the exact values (half an ulp is at most eps/2 on [-1,
    # 1])
    err = (pe.cpu().double() - loop_encoding(30, 8)).abs().max().item()
    assert err <= torch.finfo(dtype).eps / 2 + 1e-12


def test_shift_matrix_dtype_and_device(device: torch.device) -> None:
    t = shift_matrix(4, 8, dtype=torch.float32, device=device)
    assert t.dtype == torch.float32 and t.device.type == device.type
    pe = sinusoidal_encoding(20, 8, device=device)
    torch.testing.assert_close(pe[:-4] @ t, pe[4:], atol=1e-6, rtol=0.0)


def test_dot_products_keep_offsets_device(device: torch.device) -> None:
    g = sinusoidal_dot_products(torch.arange(5, device=device), 8)
    assert g.device.type == device.type and g.dtype == torch.float64


# ---- module --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_module_adds_the_table(device: torch.device, dtype: torch.dtype) -> None:
    module = SinusoidalPositionalEncoding(16, max_len=32).to(device)
    x = torch.randn(2, 10, 16, device=device).to(dtype)
    y = module(x)
    assert y.dtype == dtype and y.device.type == device.type and y.shape == x.shape
    expected = x + sinusoidal_encoding(10, 16, device=device).to(dtype)
    torch.testing.assert_close(y, expected)
    torch.testing.assert_close(module(x[0]), expected[0])  # (L, D) input


def test_module_rejects_inputs_longer_than_its_table() -> None:
    """Never a silently truncated sum: a longer input names its length and max_len."""
    module = SinusoidalPositionalEncoding(8, max_len=4)
    torch.testing.assert_close(
        module(torch.zeros(1, 4, 8))[0], sinusoidal_encoding(4, 8)
    )
    with pytest.raises(ValueError, match=r"at most max_len=4 positions, got length 11"):
        module(torch.zeros(1, 11, 8))
    assert module.max_len == 4 and "max_len=4" in repr(module)


def test_module_buffer_is_not_persistent_and_not_trainable() -> None:
    module = SinusoidalPositionalEncoding(8, max_len=4)
    assert dict(module.state_dict()) == {}
    assert list(module.parameters()) == []
    assert "pe" in dict(module.named_buffers())


def test_module_backpropagates_to_the_input() -> None:
    module = SinusoidalPositionalEncoding(8, max_len=4)
    x = torch.randn(2, 3, 8, requires_grad=True)
    module(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.ones_like(x))


# ---- properties ----------------------------------------------------------------------

dims = st.integers(min_value=1, max_value=64).map(lambda n: 2 * n)


@given(num_positions=st.integers(1, 300), dim=dims, base=st.floats(2.0, 1e5))
def test_bounded_and_on_the_unit_circle(
    num_positions: int, dim: int, base: float
) -> None:
    pe = sinusoidal_encoding(num_positions, dim, base=base, dtype=torch.float64)
    assert pe.abs().max().item() <= 1.0
    radius2 = (
        pe[:, 0::2] ** 2 + pe[:, 1::2] ** 2
    )  # each (sin, cos) pair on the unit circle
    torch.testing.assert_close(radius2, torch.ones_like(radius2))


@given(
    pos=st.integers(0, 10_000),
    k=st.one_of(st.integers(-5_000, 5_000), st.floats(-100.0, 100.0)),
    dim=dims,
)
def test_shift_theorem(pos: int, k: float, dim: int) -> None:
    omega = sinusoidal_frequencies(dim)

    def pe_at(p: float) -> torch.Tensor:  # PE at any real position, float64
        a = p * omega
        return torch.stack((torch.sin(a), torch.cos(a)), -1).flatten()

    torch.testing.assert_close(
        pe_at(pos) @ shift_matrix(k, dim), pe_at(pos + k), atol=1e-9, rtol=0
    )


@given(
    m=st.integers(0, 2_000), n=st.integers(0, 2_000), s=st.integers(0, 2_000), dim=dims
)
def test_dot_product_depends_only_on_the_offset(
    m: int, n: int, s: int, dim: int
) -> None:
    pe = sinusoidal_encoding(4_001, dim, dtype=torch.float64)
    here, shifted = pe[m] @ pe[n], pe[m + s] @ pe[n + s]
    assert here.item() == pytest.approx(shifted.item(), abs=1e-9)
    g = sinusoidal_dot_products(torch.tensor(float(m - n)), dim)
    assert here.item() == pytest.approx(g.item(), abs=1e-9)


@given(k=st.floats(-1e4, 1e4), dim=dims)
def test_dot_product_is_symmetric_and_bounded(k: float, dim: int) -> None:
    g = sinusoidal_dot_products(torch.tensor([k, -k, 0.0]), dim)
    assert g[0].item() == g[1].item()
    assert g[2].item() == pytest.approx(dim / 2)
    assert abs(g[0].item()) <= dim / 2 + 1e-9


# ---- validation table ----------------------------------------------------------------

X = torch.zeros(2, 3, 8)
MODULE = SinusoidalPositionalEncoding(8, max_len=4)

# (public name, call, exception, message): the bad-input contract, also run by
# tests/test_contract.py for every name in companion.positional.__all__
BAD_INPUTS = [
    (
        "inverse_frequencies",
        lambda: inverse_frequencies(7, name="head_dim"),
        ValueError,
        "head_dim must be an even int, got 7",
    ),
    (
        "inverse_frequencies",
        lambda: inverse_frequencies(0),
        ValueError,
        "^dim must be a positive even int, got 0",
    ),
    (
        "inverse_frequencies",
        lambda: inverse_frequencies(8, base=1.0),
        ValueError,
        "base must be a real number > 1",
    ),
    (
        "inverse_frequencies",
        lambda: inverse_frequencies(8, name=3),
        TypeError,
        "^name must be a str, got 3",
    ),
    (
        "sinusoidal_encoding",
        lambda: sinusoidal_encoding(10**20, 4),
        ValueError,
        "num_positions must be an int that fits in 64 bits",
    ),
    (
        "sinusoidal_encoding",
        lambda: sinusoidal_encoding(4, 5),
        ValueError,
        "dim must be an even int, got 5",
    ),
    (
        "sinusoidal_encoding",
        lambda: sinusoidal_encoding(4, 0),
        ValueError,
        "dim must be a positive even int, got 0",
    ),
    (
        "sinusoidal_encoding",
        lambda: sinusoidal_encoding(4, 4.0),
        TypeError,
        "dim must be an even int, got 4.0",
    ),
    (
        "sinusoidal_encoding",
        lambda: sinusoidal_encoding(4, True),
        TypeError,
        "dim must be an even int, got True",
    ),
    (
        "sinusoidal_encoding",
        lambda: sinusoidal_encoding(-3, 4),
        ValueError,
        "num_positions must be an int >= 0, got -3",
    ),
    (
        "sinusoidal_encoding",
        lambda: sinusoidal_encoding(2.5, 4),
        TypeError,
        "num_positions must be an int, got 2.5",
    ),
    (
        "sinusoidal_encoding",
        lambda: sinusoidal_encoding(4, 4, dtype=torch.int64),
        TypeError,
        "dtype must be a floating torch.dtype, got torch.int64",
    ),
    (
        "sinusoidal_encoding",
        lambda: sinusoidal_encoding(4, 4, dtype=torch.complex64),
        TypeError,
        "dtype must be a floating torch.dtype, got torch.complex64",
    ),
    (
        "sinusoidal_encoding",
        lambda: sinusoidal_encoding(4, 4, dtype="float32"),
        TypeError,
        r"dtype must be a torch.dtype such as torch.float32, got the string 'float32'",
    ),
    (
        "sinusoidal_encoding",
        lambda: sinusoidal_encoding(4, 4, device="cuda:7"),
        ValueError,
        "device must be a device this machine has, got 'cuda:7'",
    ),
    (
        "sinusoidal_encoding",
        lambda: sinusoidal_encoding(4, 4, device="meta"),
        ValueError,
        "device must be a 'cpu', 'cuda' or 'mps' device, got device 'meta'",
    ),
    (
        "sinusoidal_encoding",
        lambda: sinusoidal_encoding(4, 4, device="gpu"),
        ValueError,
        "device must be a device such as 'cpu' or 'cuda', got 'gpu'",
    ),
    (
        "sinusoidal_encoding",
        lambda: sinusoidal_encoding(4, 4, base=1.0),
        ValueError,
        r"base must be a real number > 1, got 1.0",
    ),
    (
        "sinusoidal_encoding",
        lambda: sinusoidal_encoding(4, 4, base=-5),
        ValueError,
        r"base must be a real number > 1, got -5.0",
    ),
    (
        "sinusoidal_encoding",
        lambda: sinusoidal_encoding(4, 4, base=math.inf),
        ValueError,
        "base must be a finite real number, got inf",
    ),
    (
        "sinusoidal_encoding",
        lambda: sinusoidal_encoding(4, 4, base="1e4"),
        TypeError,
        "base must be a real number, got '1e4'",
    ),
    (
        "sinusoidal_encoding",
        lambda: sinusoidal_encoding(4, 4, base=1e4 + 0j),
        TypeError,
        r"base must be a real number, got \(10000\+0j\)",
    ),
    (
        "sinusoidal_frequencies",
        lambda: sinusoidal_frequencies(7),
        ValueError,
        "dim must be an even int, got 7",
    ),
    (
        "sinusoidal_frequencies",
        lambda: sinusoidal_frequencies(8, base=math.nan),
        ValueError,
        "base must be a finite real number, got nan",
    ),
    (
        "sinusoidal_wavelengths",
        lambda: sinusoidal_wavelengths(-2),
        ValueError,
        "dim must be a positive even int, got -2",
    ),
    (
        "sinusoidal_wavelengths",
        lambda: sinusoidal_wavelengths("8"),
        TypeError,
        "dim must be an even int, got '8'",
    ),
    (
        "shift_matrix",
        lambda: shift_matrix(1, 3),
        ValueError,
        "dim must be an even int, got 3",
    ),
    (
        "shift_matrix",
        lambda: shift_matrix(math.nan, 4),
        ValueError,
        "k must be a finite real number, got nan",
    ),
    (
        "shift_matrix",
        lambda: shift_matrix("1", 4),
        TypeError,
        "k must be a real number, got '1'",
    ),
    (
        "shift_matrix",
        lambda: shift_matrix(1j, 4),
        TypeError,
        "k must be a real number, got 1j",
    ),
    (
        "shift_matrix",
        lambda: shift_matrix(1, 4, dtype=torch.int32),
        TypeError,
        "dtype must be a floating torch.dtype, got torch.int32",
    ),
    (
        "shift_matrix",
        lambda: shift_matrix(1, 4, device="cuda:7"),
        ValueError,
        "device must be a device this machine has",
    ),
    (
        "sinusoidal_dot_products",
        lambda: sinusoidal_dot_products([0, 1], 4),
        TypeError,
        "offsets must be a torch.Tensor, got a list",
    ),
    (
        "sinusoidal_dot_products",
        lambda: sinusoidal_dot_products(torch.zeros(2, dtype=torch.complex64), 4),
        TypeError,
        "offsets must be an integer or floating tensor, got a tensor of dtype "
        "torch.complex64",
    ),
    (
        "sinusoidal_dot_products",
        lambda: sinusoidal_dot_products(torch.tensor([True]), 4),
        TypeError,
        "offsets must be an integer or floating tensor, got a tensor of dtype "
        "torch.bool",
    ),
    (
        "sinusoidal_dot_products",
        lambda: sinusoidal_dot_products(torch.zeros(2, device="meta"), 4),
        ValueError,
        "offsets must hold values, got a tensor on the 'meta' device",
    ),
    (
        "sinusoidal_dot_products",
        lambda: sinusoidal_dot_products(torch.zeros(2), 5),
        ValueError,
        "dim must be an even int, got 5",
    ),
    (
        "SinusoidalPositionalEncoding",
        lambda: SinusoidalPositionalEncoding(7),
        ValueError,
        "dim must be an even int, got 7",
    ),
    (
        "SinusoidalPositionalEncoding",
        lambda: SinusoidalPositionalEncoding(8, max_len=0),
        ValueError,
        "max_len must be a positive int, got 0",
    ),
    (
        "SinusoidalPositionalEncoding",
        lambda: SinusoidalPositionalEncoding(8, max_len=4.0),
        TypeError,
        "max_len must be an int, got 4.0",
    ),
    (
        "SinusoidalPositionalEncoding",
        lambda: SinusoidalPositionalEncoding(8, dtype=torch.int64),
        TypeError,
        "dtype must be a floating torch.dtype, got torch.int64",
    ),
    (
        "SinusoidalPositionalEncoding",
        lambda: SinusoidalPositionalEncoding(8, dtype="float32"),
        TypeError,
        "dtype must be a torch.dtype such as torch.float32",
    ),
    (
        "SinusoidalPositionalEncoding",
        lambda: MODULE(torch.zeros(2, 3, 6)),
        ValueError,
        r"x must have size 8 \(dim\) in dimension -1, got shape \(2, 3, 6\)",
    ),
    (
        "SinusoidalPositionalEncoding",
        lambda: MODULE(torch.zeros(1, 2, 3, 8)),
        ValueError,
        r"x must have at most 3 dimensions \(B, L, D\) or \(L, D\), got shape \(1, 2, "
        r"3, 8\)",
    ),
    (
        "SinusoidalPositionalEncoding",
        lambda: MODULE(torch.zeros(8)),
        ValueError,
        r"x must have at least 2 dimensions",
    ),
    # longer than the table: rejected, never a silently truncated sum
    (
        "SinusoidalPositionalEncoding",
        lambda: MODULE(torch.zeros(1, 5, 8)),
        ValueError,
        r"x must have at most max_len=4 positions, got length 5",
    ),
    (
        "SinusoidalPositionalEncoding",
        lambda: MODULE(torch.zeros(3, 8, dtype=torch.complex64)),
        TypeError,
        "x must be a floating-point tensor, got a tensor of dtype torch.complex64",
    ),
    (
        "SinusoidalPositionalEncoding",
        lambda: MODULE(torch.zeros(3, 8, dtype=torch.long)),
        TypeError,
        "x must be a floating-point tensor, got a tensor of dtype torch.int64",
    ),
    (
        "SinusoidalPositionalEncoding",
        lambda: MODULE(torch.zeros(3, 8, device="meta")),
        ValueError,
        "x must hold values, got a tensor on the 'meta' device",
    ),
    (
        "SinusoidalPositionalEncoding",
        lambda: MODULE([[0.0] * 8]),
        TypeError,
        "x must be a torch.Tensor, got a list",
    ),
]


@pytest.mark.parametrize(
    ("name", "call", "error", "message"),
    BAD_INPUTS,
    ids=[f"{row[0]}-{i}" for i, row in enumerate(BAD_INPUTS)],
)
def test_bad_input_raises_a_clear_error(name: str, call, error, message: str) -> None:
    with pytest.raises(error, match=message):
        call()


def test_every_public_name_has_a_bad_input_case() -> None:
    from companion import positional

    assert set(positional.__all__) <= {row[0] for row in BAD_INPUTS}


def test_module_on_another_device_than_its_input_is_named() -> None:
    module = SinusoidalPositionalEncoding(8, max_len=4)
    x = torch.zeros(1, 2, 8)
    # a table on a device x is not on: only checkable with two devices; the check itself
    # is the shared one, so here its message is checked through the same call on a copy
    module.pe = module.pe.to("meta")
    with pytest.raises(ValueError, match="x must be on the table pe's device meta"):
        module(x)


def test_empty_inputs_give_the_empty_answer() -> None:
    assert sinusoidal_encoding(0, 4).shape == (0, 4)
    module = SinusoidalPositionalEncoding(8, max_len=4)
    assert module(torch.zeros(2, 0, 8)).shape == (2, 0, 8)
    assert sinusoidal_dot_products(torch.zeros(0, 3), 8).shape == (0, 3)


@given(
    num_positions=st.integers(0, 64),
    dim=st.integers(1, 32).map(lambda n: 2 * n),
    base=st.one_of(st.floats(1.001, 1e6), st.integers(2, 10**6)),
    dtype=st.sampled_from(
        [torch.float32, torch.float64, torch.bfloat16, torch.float16]
    ),
    k=st.one_of(st.integers(-(10**6), 10**6), st.floats(-1e6, 1e6)),
)
def test_valid_random_inputs_never_raise(num_positions, dim, base, dtype, k) -> None:
    pe = sinusoidal_encoding(num_positions, dim, base=base, dtype=dtype)
    assert pe.shape == (num_positions, dim) and pe.dtype == dtype
    assert bool(torch.isfinite(pe).all())
    assert sinusoidal_frequencies(dim, base=base).shape == (dim // 2,)
    assert sinusoidal_wavelengths(dim, base=base).shape == (dim // 2,)
    assert shift_matrix(k, dim, base=base, dtype=dtype).shape == (dim, dim)
    offsets = torch.arange(-num_positions, num_positions + 1)
    assert sinusoidal_dot_products(offsets, dim, base=base).shape == offsets.shape
    module = SinusoidalPositionalEncoding(dim, max_len=max(num_positions, 1), base=base)
    x = torch.zeros(2, num_positions, dim, dtype=dtype)
    assert module(x).shape == x.shape


# ---- checkers ------------------------------------------------------------------------


def _table(
    num_positions: int, dim: int, exponent, *, base=10000.0, swap=False, halves=False
):
    """A learner-style table: ``exponent(j, i, dim)`` gives the exponent for column
    j, pair i."""
    pos = torch.arange(num_positions, dtype=torch.float64)[:, None]
    cols = []
    for j in range(dim):
        w = base ** (-exponent(j, j // 2, dim))
        a = pos[:, 0] * w
        is_sin = (j % 2 == 0) != swap
        cols.append(torch.sin(a) if is_sin else torch.cos(a))
    out = torch.stack(cols, -1)
    if halves:
        out = torch.cat((out[:, 0::2], out[:, 1::2]), -1)
    return out.float()


def _right(j, i, d):
    return 2 * i / d


WRONG_ENCODINGS = [
    ("sin and cos swapped", lambda L, D: _table(L, D, _right, swap=True)),
    ("exponent i/D instead of 2i/D", lambda L, D: _table(L, D, lambda j, i, d: i / d)),
    (
        "pair index running over all D dims",
        lambda L, D: _table(L, D, lambda j, i, d: 2 * j / d),
    ),
    (
        "column index j/D in the exponent",
        lambda L, D: _table(L, D, lambda j, i, d: j / d),
    ),
    ("base 1000 instead of 10000", lambda L, D: _table(L, D, _right, base=1000.0)),
    (
        "exponent with the wrong sign",
        lambda L, D: _table(L, D, lambda j, i, d: -2 * i / d),
    ),
    (
        "halves layout instead of interleaved",
        lambda L, D: _table(L, D, _right, halves=True),
    ),
]


def test_check_sinusoidal_encoding_accepts_reference_and_loop() -> None:
    assert checks.check_sinusoidal_encoding(
        lambda num_positions, dim: sinusoidal_encoding(num_positions, dim)
    )
    assert checks.check_sinusoidal_encoding(
        lambda num_positions, dim: _table(num_positions, dim, _right)
    )


@pytest.mark.parametrize(
    ("mistake", "fn"), WRONG_ENCODINGS, ids=[m for m, _ in WRONG_ENCODINGS]
)
def test_check_sinusoidal_encoding_names_each_mistake(mistake: str, fn) -> None:
    with pytest.raises(checks.CheckError, match=re.escape(mistake)) as info:
        checks.check_sinusoidal_encoding(
            lambda num_positions, dim: fn(num_positions, dim)
        )
    assert info.value.mistake == mistake


def test_check_sinusoidal_encoding_names_the_float32_recipe() -> None:
    def annotated_transformer(num_positions: int, dim: int) -> torch.Tensor:
        pe = torch.zeros(num_positions, dim)
        position = torch.arange(0, num_positions).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, dim, 2) * -(math.log(10000.0) / dim))
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        return pe

    with pytest.raises(checks.CheckError, match="angles computed in float32") as info:
        checks.check_sinusoidal_encoding(annotated_transformer)
    assert "accurate at large positions" in str(info.value)


def test_check_sinusoidal_encoding_reports_crash_and_shape() -> None:
    def crashes(num_positions: int, dim: int) -> torch.Tensor:
        raise RuntimeError("boom")

    with pytest.raises(checks.CheckError, match="runs without error"):
        checks.check_sinusoidal_encoding(crashes)
    with pytest.raises(checks.CheckError, match="shapes differ"):
        checks.check_sinusoidal_encoding(
            lambda num_positions, dim: sinusoidal_encoding(num_positions, dim).mT
        )


def test_check_wavelengths_both_ways() -> None:
    assert checks.check_wavelengths(lambda dim: sinusoidal_wavelengths(dim))
    wrong = {
        "frequency instead of wavelength": lambda dim: sinusoidal_frequencies(dim),
        "wavelength without the 2*pi": lambda dim: 1 / sinusoidal_frequencies(dim),
        "exponent i/D instead of 2i/D": lambda dim: (
            2 * math.pi * 10000 ** (torch.arange(dim // 2) / dim)
        ),
    }
    for name, fn in wrong.items():
        with pytest.raises(checks.CheckError, match=re.escape(name)):
            checks.check_wavelengths(fn)


def test_check_shift_matrix_both_ways() -> None:
    assert checks.check_shift_matrix(lambda k, dim: shift_matrix(k, dim))
    assert checks.check_shift_matrix(lambda k, dim: loop_shift_matrix(k, dim).float())
    with pytest.raises(
        checks.CheckError, match=re.escape("sin entries with the wrong sign")
    ):
        checks.check_shift_matrix(lambda k, dim: shift_matrix(k, dim).mT)
    with pytest.raises(
        checks.CheckError, match=re.escape("angle k instead of k * w_i")
    ):
        # with D = 2 the only frequency is 1: one block rotating by k, repeated
        checks.check_shift_matrix(
            lambda k, dim: torch.block_diag(*[loop_shift_matrix(k, 2)] * (dim // 2))
        )

    def pe_k_on_diagonal(k: float, dim: int) -> torch.Tensor:
        a = k * sinusoidal_frequencies(dim)
        return torch.diag(_interleave(torch.sin(a), torch.cos(a)))

    with pytest.raises(checks.CheckError, match=re.escape("PE(k) on the diagonal")):
        checks.check_shift_matrix(pe_k_on_diagonal)


def test_check_dot_product_curve_both_ways() -> None:
    assert checks.check_dot_product_curve(
        lambda offsets, dim: sinusoidal_dot_products(offsets, dim)
    )
    omega = sinusoidal_frequencies
    wrong = {
        "sum of sines instead of cosines": lambda o, d: torch.sin(
            o[:, None] * omega(d)
        ).sum(-1),
        "each pair counted twice": lambda o, d: (
            2 * torch.cos(o[:, None] * omega(d)).sum(-1)
        ),
        "cosine similarity instead of the dot product": lambda o, d: torch.cos(
            o[:, None] * omega(d)
        ).mean(-1),
    }
    for name, fn in wrong.items():
        with pytest.raises(checks.CheckError, match=re.escape(name)):
            checks.check_dot_product_curve(lambda offsets, dim, fn=fn: fn(offsets, dim))


def _interleave(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.stack((a, b), -1).flatten(-2)


def test_check_shift_recurrence_both_ways() -> None:
    def right(pe_pos: torch.Tensor, pe_k: torch.Tensor) -> torch.Tensor:
        sp, cp, sk, ck = pe_pos[:, 0::2], pe_pos[:, 1::2], pe_k[0::2], pe_k[1::2]
        return _interleave(sp * ck + cp * sk, cp * ck - sp * sk)

    def notes(pe_pos: torch.Tensor, pe_k: torch.Tensor) -> torch.Tensor:
        sp, cp, sk, ck = pe_pos[:, 0::2], pe_pos[:, 1::2], pe_k[0::2], pe_k[1::2]
        return _interleave(sp * sk + cp * ck, cp * sk + sp * ck - sp * sk)

    def plus_sign(pe_pos: torch.Tensor, pe_k: torch.Tensor) -> torch.Tensor:
        sp, cp, sk, ck = pe_pos[:, 0::2], pe_pos[:, 1::2], pe_k[0::2], pe_k[1::2]
        return _interleave(sp * ck + cp * sk, cp * ck + sp * sk)

    assert checks.check_shift_recurrence(right)
    with pytest.raises(checks.CheckError, match="the recurrence printed in the notes"):
        checks.check_shift_recurrence(notes)
    with pytest.raises(checks.CheckError, match=re.escape("cos(a+b) with a plus sign")):
        checks.check_shift_recurrence(plus_sign)


def test_check_normalized_positions_both_ways() -> None:
    assert checks.check_normalized_positions(
        lambda num_positions: torch.arange(num_positions) / (num_positions - 1)
    )
    with pytest.raises(checks.CheckError, match="divided by L instead of L - 1"):
        checks.check_normalized_positions(
            lambda num_positions: torch.arange(num_positions) / num_positions
        )
    with pytest.raises(checks.CheckError, match="positions counted from 1"):
        checks.check_normalized_positions(
            lambda num_positions: torch.arange(1, num_positions + 1) / num_positions
        )


# ---- plot helpers --------------------------------------------------------------------


def test_plot_helpers_draw_and_validate() -> None:
    from matplotlib.figure import (
        Figure,
    )  # no pyplot: no backend or global state involved

    from companion import plotting

    ax = Figure().subplots()
    assert plotting.encoding_columns(ax, sinusoidal_encoding(20, 8), [0, 3]) is ax
    assert len(ax.get_lines()) == 2 and ax.get_xlabel() == "position"
    with pytest.raises(ValueError, match=r"columns must lie in \[0, 8\), got 8"):
        plotting.encoding_columns(ax, sinusoidal_encoding(20, 8), [8])
    with pytest.raises(ValueError, match="encoding must be 2-D"):
        plotting.encoding_columns(ax, torch.zeros(3), [0])
    x = torch.arange(5)
    assert plotting.curves(ax, x, {"a": x * 2.0, "b": x * 3.0}, logy=True) is ax
    assert ax.get_yscale() == "log"
    with pytest.raises(ValueError, match="series 'a' has shape"):
        plotting.curves(ax, x, {"a": torch.zeros(4)})
    with pytest.raises(TypeError, match="ax must be a matplotlib Axes"):
        plotting.curves(None, x, {"a": x})


# ---- the shared progression ------------------------------------------------------------


@pytest.mark.parametrize(("dim", "base"), [(2, 10000.0), (8, 10000.0), (128, 5e5)])
def test_inverse_frequencies_is_metas_formula(dim, base) -> None:
    """Against Meta's ``1 / theta ** (arange(0, dim, 2) / dim)``, in NumPy float64."""
    theirs = 1.0 / base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    ours = inverse_frequencies(dim, base=base)
    assert ours.dtype == torch.float64 and ours.device.type == "cpu"
    np.testing.assert_allclose(ours.numpy(), theirs, rtol=1e-15, atol=0)


def test_inverse_frequencies_serves_the_sinusoids_and_rope() -> None:
    from companion.rope import rope_frequencies

    assert torch.equal(inverse_frequencies(64), sinusoidal_frequencies(64))
    assert torch.equal(
        inverse_frequencies(64, base=5e5), rope_frequencies(64, base=5e5)
    )
    with pytest.raises(ValueError, match=r"^head_dim must be an even int, got 63"):
        rope_frequencies(63)  # RoPE's callers report their own argument name
