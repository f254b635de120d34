"""Tests of companion.capstone: chapter 7's runs (the scheme comparison, Post-LN against
Pre-LN, the third exercise) against the recipes they document, their measures
(per-position and band accuracy, first step below, first relapse) and their bad-input
table."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional as F

import companion
from companion import capstone as C
from companion import experiments as E
from companion import model as M
from companion.model import ModelConfig, TinyTransformer

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


def tiny(position: str = "rope", **kwargs: object) -> TinyTransformer:
    companion.seed_everything(0)
    cfg = dict(
        vocab_size=11, dim=16, num_heads=2, num_layers=2, position=position, max_len=32
    )
    cfg.update(kwargs)
    return TinyTransformer(ModelConfig(**cfg))


def _mod5(tokens: torch.Tensor) -> torch.Tensor:
    return (torch.arange(tokens.shape[1]) % 5).expand_as(tokens).clone()


def test_capstone_model_is_the_chapters_configuration() -> None:
    net = C.capstone_model("alibi", num_layers=4, placement="post")()
    assert isinstance(net, TinyTransformer)
    expected = ModelConfig(
        **{
            **C.CAPSTONE_SIZES,
            "position": "alibi",
            "num_layers": 4,
            "placement": "post",
        }
    )
    assert net.config == expected
    assert C.CAPSTONE_TASK == {"batch_size": 32, "length": 16, "lag": 2}
    assert C.CAPSTONE_EVAL_LENGTH == 4 * C.CAPSTONE_TASK["length"]


def test_train_capstone_scheme_is_build_then_one_batched_call() -> None:
    """Oracle: the documented equivalent, written out (two budgets, two seeds)."""
    result = C.train_capstone_scheme("rope", (3, 4), budgets=(2, 4), lr=1e-2)
    factory = C.capstone_model("rope")
    jobs = [(2, 3), (2, 4), (4, 3), (4, 4)]
    models = [E.build(factory, s) for _, s in jobs]
    runs = E.train_batched(
        models,
        seeds=[s for _, s in jobs],
        steps=[n for n, _ in jobs],
        lr=1e-2,
        warmup_steps=50,
        schedule="cosine",
        **C.CAPSTONE_TASK,
    )
    assert set(result) == {2, 4}
    assert result[2].losses == [runs[0].losses, runs[1].losses]
    assert result[4].losses == [runs[2].losses, runs[3].losses]
    assert result[4].seeds == (3, 4)
    for got, want in zip(result[4].models, models[2:], strict=True):
        for a, b in zip(got.parameters(), want.parameters(), strict=True):
            assert torch.equal(a, b)


def test_position_and_band_accuracies_against_the_model_function() -> None:
    runs = C.train_capstone_scheme("none", (0, 1), budgets=(2,))[2]
    per_position = C.position_accuracies(runs, length=20, lag=2)
    assert per_position.shape == (2, 20) and per_position.dtype == torch.float64
    for row, net in zip(per_position, runs.models, strict=True):
        oracle = M.position_accuracy(net, length=20, lag=2)
        torch.testing.assert_close(row, oracle, equal_nan=True)
    bands = C.band_accuracy(per_position, {"a": (2, 10), "b": (10, 20)})
    manual = torch.stack(
        [per_position[:, 2:10].mean(dim=1), per_position[:, 10:].mean(dim=1)], dim=1
    )
    torch.testing.assert_close(bands, manual)


@pytest.mark.parametrize(
    ("losses", "threshold", "window", "expected"),
    [
        ([3.0, 2.0, 1.0, 0.1, 0.1], 0.5, 2, 5),  # windows end at 2..5: 2.5 1.5 .55 .1
        ([3.0, 0.2, 0.2], 0.5, 1, 2),
        ([3.0, 0.2, 0.2], 0.5, 3, None),  # the one window's mean is 1.13
        ([0.4], 0.5, 2, None),  # shorter than a window
    ],
)
def test_first_step_below_is_the_end_of_the_first_low_window(
    losses: list[float], threshold: float, window: int, expected: int | None
) -> None:
    assert C.first_step_below(losses, threshold, window=window) == expected


@pytest.mark.parametrize(
    ("losses", "expected"),
    [
        ([3.0, 0.05, 2.0, 0.01], 2),
        ([3.0, 2.0, 0.05, 0.5, 0.9], None),  # learned, never back above 1
        ([3.0, 0.5, 2.0], None),  # never learned: a jump is not a relapse
        ([0.05, 1.0, 1.01], 2),  # above 1, not at 1
    ],
)
def test_first_relapse_needs_learning_first(
    losses: list[float], expected: int | None
) -> None:
    assert C.first_relapse(losses, low=0.1, high=1.0) == expected


def test_warmup_runs_train_each_placement_as_one_batch() -> None:
    """Oracle: per placement, build every (config, seed) and one train_batched call."""
    got = C.warmup_runs((5, 6), steps=3, lr=3e-2)
    assert list(got) == list(C.WARMUP_CONFIGS)
    for placement in ("pre", "post"):
        labels = [k for k, (p, _) in C.WARMUP_CONFIGS.items() if p == placement]
        jobs = [(label, s) for label in labels for s in (5, 6)]
        factory = C.capstone_model("rope", num_layers=4, placement=placement)
        models = [E.build(factory, s) for _, s in jobs]
        runs = E.train_batched(
            models,
            seeds=[s for _, s in jobs],
            steps=3,
            lr=3e-2,
            warmup_steps=[C.WARMUP_CONFIGS[label][1] for label, _ in jobs],
            **C.CAPSTONE_TASK,
        )
        for k, (label, s) in enumerate(jobs):
            assert got[label].losses[got[label].seeds.index(s)] == runs[k].losses
    # the warm-up's first rate is lr / 30: a smaller first loss drop than at full lr
    assert got["post-LN + warm-up"].seeds == (5, 6)


def test_first_adamw_step_is_lr_times_the_sign_of_the_gradient() -> None:
    """Oracle: Adam's first update is lr * g / (|g| + eps), element by element; its norm
    is about lr * sqrt(n), and the relative logit change is recomputed by hand."""
    got = C.first_adamw_step((0,), lr=1e-2)
    for placement in ("post", "pre"):
        factory = C.capstone_model("rope", num_layers=4, placement=placement)
        net = E.build(factory, 0)
        x, y = M.lag_task(
            32, 16, lag=2, vocab_size=16, generator=torch.Generator().manual_seed(0)
        )
        top = net.blocks[-1].sublayer[2].weight
        before = net(x).detach()
        F.cross_entropy(net(x).flatten(0, 1), y.flatten()).backward()
        g = top.grad.clone()
        update = 1e-2 * g / (g.abs() + 1e-8)
        with torch.no_grad():
            for p in net.parameters():
                if p.grad is not None:
                    p -= 1e-2 * p.grad / (p.grad.abs() + 1e-8)
            moved = ((net(x) - before).norm() / before.norm()).item()
        grad_norm, update_norm, change = got[placement][0].tolist()
        assert grad_norm == pytest.approx(g.norm().item(), rel=1e-6)
        assert update_norm == pytest.approx(update.norm().item(), rel=1e-4)
        assert update_norm == pytest.approx(1e-2 * math.sqrt(top.numel()), rel=1e-3)
        assert change == pytest.approx(moved, rel=1e-3)


def test_absolute_position_runs_score_the_given_targets() -> None:
    runs, acc = C.absolute_position_runs(
        "learned", (0, 1), steps=3, targets=_mod5, eval_length=32
    )
    assert acc.shape == (2, 32)
    tokens = M.lag_task(
        256, 32, lag=2, vocab_size=16, generator=torch.Generator().manual_seed(1234)
    )[0]
    for row, net in zip(acc, runs.models, strict=True):
        with torch.no_grad():
            hit = net(tokens).argmax(dim=-1) == _mod5(tokens)
        torch.testing.assert_close(row, hit.double().mean(dim=0))


BAD_INPUTS = [
    (
        "capstone_model",
        lambda: C.capstone_model("ring"),
        ValueError,
        r"position must be",
    ),
    (
        "capstone_model",
        lambda: C.capstone_model("rope", dim=30),
        ValueError,
        r"dim must be divisible by num_heads",
    ),
    (
        "train_capstone_scheme",
        lambda: C.train_capstone_scheme("rope", (0, 0), budgets=(1,)),
        ValueError,
        r"seed_list must not repeat a seed, got \(0, 0\)",
    ),
    (
        "train_capstone_scheme",
        lambda: C.train_capstone_scheme("rope", 3, budgets=(1,)),
        TypeError,
        r"seed_list must be a non-empty sequence of ints, got 3",
    ),
    (
        "train_capstone_scheme",
        lambda: C.train_capstone_scheme("rope", (0,), budgets=(2, 2)),
        ValueError,
        r"budgets must be distinct step counts, got \(2, 2\)",
    ),
    (
        "train_capstone_scheme",
        lambda: C.train_capstone_scheme("rope", (0,), budgets=(0,)),
        ValueError,
        r"budgets\[0\] must be a positive int, got 0",
    ),
    (
        "position_accuracies",
        lambda: C.position_accuracies([tiny()]),
        TypeError,
        r"runs must be a SeedRuns",
    ),
    (
        "band_accuracy",
        lambda: C.band_accuracy(torch.zeros(2, 8), {"a": (4, 9)}),
        ValueError,
        r"bands\['a'\] must be \(start, stop\) with 0 <= start < stop <= 8, got \(4, 9\)",
    ),
    (
        "band_accuracy",
        lambda: C.band_accuracy(torch.zeros(8), {"a": (0, 4)}),
        ValueError,
        r"per_position must",
    ),
    (
        "band_accuracy",
        lambda: C.band_accuracy(torch.zeros(2, 8), {}),
        TypeError,
        r"bands must be a non-empty dict",
    ),
    (
        "first_step_below",
        lambda: C.first_step_below([1.0], 0.5, window=0),
        ValueError,
        r"window must be a positive int, got 0",
    ),
    (
        "first_relapse",
        lambda: C.first_relapse([1.0], low=1.0, high=0.5),
        ValueError,
        r"low must be below high, got low=1.0, high=0.5",
    ),
    (
        "warmup_runs",
        lambda: C.warmup_runs((0,), configs={"x": ("middle", 0)}),
        ValueError,
        r"configs\['x'\] placement must be",
    ),
    (
        "warmup_runs",
        lambda: C.warmup_runs((0,), configs={"x": ("post", -1)}),
        ValueError,
        r"configs\['x'\] warm-up must be an int >= 0, got -1",
    ),
    (
        "first_adamw_step",
        lambda: C.first_adamw_step((0,), lr=0.0),
        ValueError,
        r"lr must be a real number > 0, got 0.0",
    ),
    (
        "absolute_position_runs",
        lambda: C.absolute_position_runs("rope", (0,), steps=1, targets=3),
        TypeError,
        r"targets must be",
    ),
    (
        "absolute_position_runs",
        lambda: C.absolute_position_runs(
            "rope", (0,), steps=1, targets=_mod5, eval_length=0
        ),
        ValueError,
        r"eval_length must be a positive int, got 0",
    ),
]


@pytest.mark.parametrize(
    ("name", "thunk", "error", "match"),
    BAD_INPUTS,
    ids=[f"{case[0]}-{i}" for i, case in enumerate(BAD_INPUTS)],
)
def test_capstone_bad_input_raises_a_named_error(
    name: str, thunk: object, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        thunk()  # type: ignore[operator]


def test_chapter_settings_are_the_ones_their_prose_states() -> None:
    """The chapter and its claims test read these constants (one home, so the test and
    the chapter cannot drift); the prose states their values: budgets of 500 and 1,000
    steps for no positions and ALiBi, 250 and 500 for the sinusoidal encoding and RoPE,
    at a peak rate of 1e-2 after 50 warm-up steps; the warm-up experiment's six
    seeds, 100 steps at 3e-2; the third exercise's 100 steps for the learned table and
    600 for RoPE."""
    assert C.CAPSTONE_SEEDS == 3 and C.CAPSTONE_BUDGETS == {
        "none": (500, 1000),
        "sinusoidal": (250, 500),
        "rope": (250, 500),
        "alibi": (500, 1000),
    }
    assert (C.CAPSTONE_LR, C.CAPSTONE_WARMUP_STEPS) == (1e-2, 50)
    assert (C.WARMUP_RUN_SEEDS, C.WARMUP_RUN_STEPS, C.WARMUP_RUN_LR) == (6, 100, 3e-2)
    assert C.ABSOLUTE_STEPS == {"learned": 100, "rope": 600}
    assert C.WARMUP_CONFIGS["post-LN + warm-up"] == ("post", 30)
