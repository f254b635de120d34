"""check_softmax (chapter 00): correct answers in several styles pass, each named
mistake is named."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from companion import checks


def softmax_loops(x, dim):
    """Python loops over the rows of the reduced axis, max subtracted."""
    moved = x.movedim(dim, -1)
    rows = moved.reshape(-1, moved.shape[-1]).tolist()
    out = []
    for row in rows:
        top = max(row)
        e = [math.exp(v - top) for v in row]
        out.append([v / sum(e) for v in e])
    return torch.tensor(out).reshape(moved.shape).movedim(-1, dim)


def softmax_numpy(x, dim):
    a = np.asarray(x, dtype=np.float64)
    e = np.exp(a - a.max(axis=dim, keepdims=True))
    return e / e.sum(axis=dim, keepdims=True)  # a NumPy array


def softmax_in_place(x, dim):
    x.sub_(x.amax(dim=dim, keepdim=True)).exp_()
    return x.div_(x.sum(dim=dim, keepdim=True))


def softmax_positional_only(logits, axis, /):
    return torch.nn.functional.softmax(logits, axis)


@pytest.mark.parametrize(
    "answer",
    [
        softmax_loops,
        softmax_numpy,
        softmax_in_place,
        softmax_positional_only,
        torch.softmax,
        lambda x, dim: torch.exp(torch.log_softmax(x, dim)),
    ],
    ids=[
        "loops",
        "numpy",
        "in-place",
        "positional-only",
        "torch.softmax",
        "log_softmax",
    ],
)
def test_correct_answers_pass(answer) -> None:
    assert checks.check_softmax(answer).passed is True


def test_names_the_wrong_axis(named) -> None:
    err = named(
        lambda: checks.check_softmax(
            lambda x, dim: torch.softmax(x, 0 if dim == -1 else -1)
        ),
        "softmax over the wrong axis",
    )
    assert "along dim=-1" in str(err)


def test_names_normalizing_by_the_sum_of_x(named) -> None:
    named(
        lambda: checks.check_softmax(
            lambda x, dim: torch.exp(x) / x.sum(dim, keepdim=True)
        ),
        "normalized by the sum of x instead of the sum of exp(x)",
    )


def test_explains_the_overflow() -> None:
    def overflowing(x, dim):
        e = torch.exp(x)
        return e / e.sum(dim=dim, keepdim=True)

    with pytest.raises(checks.CheckError) as info:
        checks.check_softmax(overflowing)
    assert info.value.prop == "stays finite for large logits"
    assert "NaN or inf" in str(info.value)
