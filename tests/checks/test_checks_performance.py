"""The appendix's checkers (performance): correct answers in several styles pass, each
named mistake is named, a stub is "not attempted yet"."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from companion import checks
from companion.performance import attention_flops, ulp

# ---- check_ulp32 ------------------------------------------------------------------------


def _ulp_loop(x):
    """A loop over math.frexp: |x| = m 2^e with 0.5 <= m < 1, spacing 2^(e - 24)."""
    return [2.0 ** (math.frexp(abs(v))[1] - 24) for v in x.tolist()]


@pytest.mark.parametrize(
    "answer",
    [
        lambda x: 2.0 ** (torch.floor(torch.log2(x.abs())) - 23),
        lambda x: np.spacing(np.abs(x.numpy()).astype(np.float32)),
        _ulp_loop,
        lambda x: ulp(x),
    ],
    ids=["torch", "numpy-spacing", "frexp-loop", "companion"],
)
def test_ulp32_accepts(answer) -> None:
    assert checks.check_ulp32(answer)


def test_ulp32_names(named) -> None:
    def half(x):
        return 2.0 ** (torch.floor(torch.log2(x.abs())) - 24)

    def double(x):
        return 2.0 ** (torch.floor(torch.log2(x.abs())) - 52)

    named(lambda: checks.check_ulp32(half), "half an ulp")
    named(lambda: checks.check_ulp32(double), "float64's spacing")
    named(
        lambda: checks.check_ulp32(lambda x: x.abs() * 2.0**-23),
        "relative spacing |x| 2^-23",
    )
    named(
        lambda: checks.check_ulp32(lambda x: torch.full_like(x, 2.0**-23)),
        "machine epsilon for every x",
    )


def test_ulp32_without_abs_fails() -> None:
    with pytest.raises(checks.CheckError, match="negative"):
        checks.check_ulp32(lambda x: 2.0 ** (torch.floor(torch.log2(x)) - 23))


# ---- check_roofline_time ----------------------------------------------------------------


@pytest.mark.parametrize(
    "answer",
    [
        lambda f, b, p, w: max(f / p, b / w),
        lambda f, b, p, w: torch.maximum(torch.tensor(f / p), torch.tensor(b / w)),
        lambda f, b, p, w: f / p if f / b > p / w else b / w,  # the balance test
    ],
    ids=["max", "torch", "balance"],
)
def test_roofline_time_accepts(answer) -> None:
    assert checks.check_roofline_time(answer)


def test_roofline_time_names(named) -> None:
    named(
        lambda: checks.check_roofline_time(lambda f, b, p, w: f / p + b / w),
        "sum of the two floors",
    )
    named(
        lambda: checks.check_roofline_time(lambda f, b, p, w: min(f / p, b / w)),
        "the smaller floor",
    )
    named(
        lambda: checks.check_roofline_time(lambda f, b, p, w: max(f / w, b / p)),
        "flops over bandwidth",
    )


# ---- check_tiled_attention_intensity ----------------------------------------------------


def _intensity(length, head_dim, block, size):
    blocks = -(-length // block)
    moved = size * (2 * length * head_dim + 2 * length * head_dim * blocks)
    return attention_flops(1, 1, length, length, head_dim) / moved


def _intensity_loop(length, head_dim, block, size):
    moved = size * length * head_dim * 2  # read Q, write O
    for _ in range(0, length, block):
        moved += size * 2 * length * head_dim  # this query block reads all of K and V
    return 4 * length * length * head_dim / moved


@pytest.mark.parametrize(
    "answer", [_intensity, _intensity_loop], ids=["formula", "loop"]
)
def test_tiled_attention_intensity_accepts(answer) -> None:
    assert checks.check_tiled_attention_intensity(answer)


def test_tiled_attention_intensity_names(named) -> None:
    def once(length, head_dim, block, size):
        return 4 * length**2 * head_dim / (size * 4 * length * head_dim)

    def half_flops(length, head_dim, block, size):
        return _intensity(length, head_dim, block, size) / 2

    def no_ceil(length, head_dim, block, size):
        moved = size * (2 * length * head_dim + 2 * length * head_dim * length / block)
        return 4 * length**2 * head_dim / moved

    check = checks.check_tiled_attention_intensity
    named(lambda: check(once), "K and V read only once")
    named(lambda: check(half_flops), "multiply-adds counted as one flop")
    named(lambda: check(no_ceil), "no ceiling for a partial block")


# ---- stubs ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "check",
    [
        checks.check_ulp32,
        checks.check_roofline_time,
        checks.check_tiled_attention_intensity,
    ],
)
def test_stub_is_not_attempted(check, capsys) -> None:
    def stub(*args):
        raise NotImplementedError

    assert check(stub).passed is False
    assert "not attempted yet" in capsys.readouterr().out


def test_tiled_attention_intensity_names_floor_and_standard_traffic(named) -> None:
    def floor_blocks(length, head_dim, block, size):
        moved = size * (
            2 * length * head_dim + 2 * length * head_dim * (length // block)
        )
        return 4 * length**2 * head_dim / moved

    def standard(length, head_dim, block, size):
        moved = size * (4 * length * head_dim + 2 * length * length)
        return 4 * length**2 * head_dim / moved

    check = checks.check_tiled_attention_intensity
    named(lambda: check(floor_blocks), "no ceiling for a partial block")
    named(lambda: check(standard), "standard attention's traffic")
