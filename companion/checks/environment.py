r"""Checker for chapter 00 (:ref:`ch-environment`): a first exercise, ``softmax``."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from companion import environment  # noqa: F401  (the chapter's module: seeding, device)
from companion.checks._core import Case, Mistake, checker

__all__ = ["check_softmax"]


@checker
def check_softmax(softmax: Callable[..., torch.Tensor]) -> Iterator[Case]:
    r"""Check a learner's ``softmax(x, dim)`` against :func:`torch.softmax`.

    Properties checked: the values on small inputs; the normalization along ``dim`` (not
    another axis); no overflow for logits of size ``1e4`` (subtract the maximum first).
    Named mistakes: "softmax over the wrong axis", "normalized by the sum of x instead
    of the sum of exp(x)".

    Args:
        softmax: a function ``softmax(x, dim) -> Tensor``, called positionally.
    """
    gen = torch.Generator().manual_seed(0)
    cases = [
        (
            "matches the definition exp(x_i) / sum_j exp(x_j)",
            torch.randn(2, 5, generator=gen),
            -1,
        ),
        ("normalizes along dim, not another axis", torch.randn(3, 4, generator=gen), 0),
        (
            "stays finite for large logits",
            torch.tensor([[1.0e4, 0.0, -1.0e4], [1000.0, 1000.0, 999.0]]),
            -1,
        ),
    ]
    for prop, x, dim in cases:
        other = 0 if dim in (-1, x.ndim - 1) else -1
        mistakes = [
            Mistake(
                "softmax over the wrong axis",
                f"your weights sum to one along dim={other}; they must sum to one "
                f"along dim={dim}.",
                torch.softmax(x, dim=other),
            ),
            Mistake(
                "normalized by the sum of x instead of the sum of exp(x)",
                "divide exp(x) by exp(x).sum(dim, keepdim=True).",
                torch.exp(x) / x.sum(dim=dim, keepdim=True),
            ),
        ]
        yield Case(
            prop,
            {"x": x, "dim": dim},
            torch.softmax(x, dim),
            mistakes,
            atol=1e-6,
            rtol=1e-5,
        )
