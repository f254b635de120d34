"""Chapter 7's checkers (the tiny Transformer's tasks): correct answers in several
styles pass; each named mistake, float targets included, is named."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from companion import checks

# ---- check_lag_targets ---------------------------------------------------------------


def lag_slicing(tokens, lag):
    targets = torch.full_like(tokens, -100)
    targets[:, lag:] = tokens[:, :-lag]
    return targets


def lag_loops(tokens, lag):
    return [[row[t - lag] if t >= lag else -100 for t in range(len(row))]
            for row in tokens.tolist()]  # fmt: skip


def lag_in_place(tokens, lag):
    tokens[:, lag:] = tokens[:, :-lag].clone()
    tokens[:, :lag] = -100
    return tokens


def lag_roll(x, k, /):
    shifted = torch.roll(x, shifts=k, dims=1)
    shifted[:, :k] = -100
    return shifted


@pytest.mark.parametrize(
    "answer",
    [
        lag_slicing,
        lag_loops,
        lag_in_place,
        lag_roll,
        lambda tokens, lag: np.pad(
            tokens.numpy()[:, :-lag], ((0, 0), (lag, 0)), constant_values=-100
        ),
    ],
    ids=["slicing", "lists", "in-place", "roll", "numpy"],
)
def test_lag_targets_accepts(answer) -> None:
    assert checks.check_lag_targets(answer)


def test_lag_targets_names(named) -> None:
    def ahead(tokens, lag):
        targets = torch.full_like(tokens, -100)
        targets[:, :-lag] = tokens[:, lag:]
        return targets

    def zeros(tokens, lag):
        return lag_slicing(tokens, lag).clamp(min=0)

    named(
        lambda: checks.check_lag_targets(lambda t, lag: lag_slicing(t, lag).float()),
        "float targets",
    )
    named(lambda: checks.check_lag_targets(ahead), "shifted the wrong way")
    named(lambda: checks.check_lag_targets(zeros), "unscored positions filled with 0")
    named(
        lambda: checks.check_lag_targets(lambda t, lag: lag_slicing(t, lag + 1)),
        "lag off by one",
    )


def test_float_targets_message_says_why() -> None:
    with pytest.raises(checks.CheckError, match=r"integer tensor \(torch.long\)"):
        checks.check_lag_targets(lambda t, lag: lag_slicing(t, lag).double().numpy())


# ---- check_masked_accuracy -----------------------------------------------------------


def accuracy_select(logits, targets):
    scored = targets != -100
    return (logits.argmax(-1)[scored] == targets[scored]).float().mean()


def accuracy_loops(logits, targets):
    hits = total = 0
    for row_logits, row_targets in zip(logits.tolist(), targets.tolist(), strict=True):
        for scores, target in zip(row_logits, row_targets, strict=True):
            if target != -100:
                total += 1
                hits += scores.index(max(scores)) == target
    return hits / total  # a Python float


@pytest.mark.parametrize(
    "answer",
    [
        accuracy_select,
        accuracy_loops,
        lambda lg, t, /: np.mean(
            (lg.numpy().argmax(-1) == t.numpy())[t.numpy() != -100]
        ),
        lambda logits, targets: (
            ((logits.argmax(-1) == targets) & (targets != -100)).sum()
            / (targets != -100).sum()
        ),
    ],
    ids=["select", "loops", "numpy", "sum-over-count"],
)
def test_masked_accuracy_accepts(answer) -> None:
    assert checks.check_masked_accuracy(answer)


def test_masked_accuracy_names(named) -> None:
    named(
        lambda: checks.check_masked_accuracy(
            lambda logits, targets: (logits.argmax(-1) == targets).double().mean()
        ),
        "counted the unscored positions",
    )


# ---- check_absolute_targets ----------------------------------------------------------


@pytest.mark.parametrize(
    "answer",
    [
        lambda tokens, period: (torch.arange(tokens.shape[1]) % period).expand_as(
            tokens
        ),
        lambda tokens, period: [
            [t % period for t in range(len(row))] for row in tokens.tolist()
        ],
        lambda x, p, /: np.tile(np.arange(x.shape[1]) % p, (x.shape[0], 1)),
        lambda tokens, period: tokens.copy_(torch.arange(tokens.shape[1]) % period),
    ],
    ids=["arange", "lists", "numpy", "in-place"],
)
def test_absolute_targets_accepts(answer) -> None:
    assert checks.check_absolute_targets(answer)


def test_absolute_targets_names(named) -> None:
    def positions(tokens):
        return torch.arange(tokens.shape[1]).expand_as(tokens)

    named(
        lambda: checks.check_absolute_targets(lambda t, p: (positions(t) % p).float()),
        "float targets",
    )
    named(
        lambda: checks.check_absolute_targets(lambda t, p: (positions(t) + 1) % p),
        "positions counted from 1",
    )
    named(
        lambda: checks.check_absolute_targets(lambda t, p: positions(t) // p),
        "quotient instead of remainder",
    )
