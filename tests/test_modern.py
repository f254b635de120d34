"""Tests for companion.modern: soft-capping, QK-norm bounds, sliding windows, attention
sinks and padding.

Oracles: ``torch.tanh`` written out, Hugging Face transformers' configurations and
modeling code built from small configs (no download), float64 loops from the formulas.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from companion import modern

F64 = torch.float64


# ---- soft-capping --------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("cap", [1.0, 30.0, 50.0])
def test_softcap_matches_tanh(dtype: torch.dtype, cap: float) -> None:
    x = torch.linspace(-500, 500, 1001, dtype=F64).to(dtype)
    got = modern.softcap(x, cap)
    assert got.dtype == dtype and got.shape == x.shape
    torch.testing.assert_close(got, cap * torch.tanh(x / cap))


def test_softcap_bounded_and_near_identity() -> None:
    x = torch.tensor([-math.inf, -1e6, -1.0, 0.0, 1e-3, 1e6, math.inf], dtype=F64)
    got = modern.softcap(x, 50.0)
    assert got.abs().max() <= 50.0
    assert got[0] == -50.0 and got[-1] == 50.0
    assert abs(got[4] - 1e-3) < 1e-12  # x - x^3 / (3 cap^2)


@settings(max_examples=50, deadline=None)
@given(
    st.floats(-1e4, 1e4, allow_nan=False),
    st.floats(0.1, 100.0, allow_nan=False),
)
def test_softcap_odd_increasing_bounded(x: float, cap: float) -> None:
    t = torch.tensor([x, x + 1.0], dtype=F64)
    y = modern.softcap(t, cap)
    assert torch.allclose(modern.softcap(-t, cap), -y)
    assert y[1] >= y[0]
    assert y.abs().max() <= cap


BAD_INPUTS = [
    ("softcap", lambda: modern.softcap([1.0], 50.0), TypeError, r"^x must be a torch"),
    (
        "softcap",
        lambda: modern.softcap(torch.ones(2, dtype=torch.long), 50.0),
        TypeError,
        r"^x must be a floating",
    ),
    ("softcap", lambda: modern.softcap(torch.ones(2), 0.0), ValueError, r"^cap must"),
    ("softcap", lambda: modern.softcap(torch.ones(2), "50"), TypeError, r"^cap must"),
]
