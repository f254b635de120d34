r"""Checkers for chapter 7 (:ref:`ch-tiny-transformer`): the tasks of the capstone."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from companion import model
from companion.checks._core import Case, Mistake, checker

__all__ = ["check_absolute_targets", "check_lag_targets", "check_masked_accuracy"]

IGNORE_INDEX = model.IGNORE_INDEX  # -100, F.cross_entropy's default ignore_index


def _lag(tokens: torch.Tensor, lag: int) -> torch.Tensor:
    """Targets of :func:`companion.model.lag_task`: the token ``lag`` places back."""
    targets = torch.full_like(tokens, IGNORE_INDEX)
    targets[:, lag:] = tokens[:, :-lag]
    return targets


@checker
def check_lag_targets(lag_targets: Callable[..., torch.Tensor]) -> Iterator[Case]:
    r"""Check ``lag_targets(tokens, lag)``: :func:`companion.model.lag_task`'s rule.

    The target at position ``t`` is the token at ``t - lag``, and ``-100`` (the ignore
    index of :func:`torch.nn.functional.cross_entropy`) for ``t < lag``; the answer must
    be an integer tensor. Named mistakes: "float targets", "shifted the wrong way" (the
    token ``lag`` places ahead), "unscored positions filled with 0", "lag off by one".

    Args:
        lag_targets: a function ``(tokens (B, L) long, lag) -> targets (B, L) long``.
    """
    gen = torch.Generator().manual_seed(0)
    for lag, length in ((2, 10), (1, 5), (3, 7)):
        tokens = torch.randint(1, 9, (3, length), generator=gen)
        ahead = torch.full_like(tokens, IGNORE_INDEX)
        ahead[:, :-lag] = tokens[:, lag:]
        zeros = _lag(tokens, lag).clamp(min=0)
        mistakes = [
            Mistake(
                "shifted the wrong way",
                f"the target at t must be the token at t - {lag} (in the past), not "
                f"t + {lag}.",
                ahead,
            ),
            Mistake(
                "unscored positions filled with 0",
                f"the first {lag} positions have no answer: mark them with -100, the "
                "ignore index of cross_entropy, or they train the model to predict "
                "token 0.",
                zeros,
            ),
            Mistake(
                "lag off by one",
                f"use tokens[:, :-lag] for positions lag.. (got the answer for lag "
                f"{lag + 1}).",
                _lag(tokens, lag + 1),
            ),
        ]
        prop = f"target at t is the token at t - lag, -100 for t < lag (lag={lag})"
        inputs = {"tokens": tokens, "lag": lag}
        yield Case(
            prop, inputs, _lag(tokens, lag), mistakes, atol=0.0, rtol=0.0, integer=True
        )


@checker
def check_masked_accuracy(masked_accuracy: Callable[..., object]) -> Iterator[Case]:
    r"""Check ``masked_accuracy(logits, targets)``: accuracy over scored positions only.

    The answer may be a 0-d tensor or a Python number. Named mistake: "counted the
    unscored positions" (the ``-100`` ones).

    Args:
        masked_accuracy: a function ``(logits (B, L, V), targets (B, L)) -> 0-d
            tensor``.
    """
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 6, 5, generator=gen)
    targets = logits.argmax(dim=-1)  # a perfect model...
    targets[:, :2] = IGNORE_INDEX  # ...with two unscored positions per sequence
    targets[0, 3] = (targets[0, 3] + 1) % 5  # and one mistake
    scored = targets != IGNORE_INDEX
    mistake = Mistake(
        "counted the unscored positions",
        "select the positions with targets != -100 before averaging; each unscored "
        "position otherwise counts as a miss.",
        (logits.argmax(-1) == targets).double().mean(),
    )
    yield Case(
        "fraction of scored positions whose argmax is the target",
        {"logits": logits, "targets": targets},
        (logits.argmax(-1)[scored] == targets[scored]).double().mean(),
        [mistake],
        atol=1e-7,
        rtol=0.0,
    )


@checker
def check_absolute_targets(
    absolute_targets: Callable[..., torch.Tensor],
) -> Iterator[Case]:
    r"""Check ``absolute_targets(tokens, period)``: the target at position ``t`` is
    ``t mod period`` for every sequence, as an integer tensor.

    Named mistakes: "float targets", "positions counted from 1", "quotient instead of
    remainder".

    Args:
        absolute_targets: a function ``(tokens (B, L) long, period) -> (B, L) long``.
    """
    gen = torch.Generator().manual_seed(2)
    for period, length in ((5, 12), (3, 4)):
        tokens = torch.randint(0, 9, (2, length), generator=gen)
        t = torch.arange(length).expand(2, length)
        mistakes = [
            Mistake(
                "positions counted from 1",
                "the first token is at position 0, as in every chapter of the book.",
                (t + 1) % period,
            ),
            Mistake(
                "quotient instead of remainder",
                "use t % period, not t // period.",
                t // period,
            ),
        ]
        yield Case(
            f"target at t is t mod {period}, whatever the tokens",
            {"tokens": tokens, "period": period},
            t % period,
            mistakes,
            atol=0.0,
            rtol=0.0,
            integer=True,
        )
