"""Tests of companion.position_comparison: chapter 4's trained comparison of the position
family (compare_position_schemes, PositionComparison), against the recipe it documents
(build, train_batched, position_accuracy written out), and its bad-input table."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from companion import experiments as E
from companion import model as M
from companion import position_comparison as PC
from companion import relative as R
from companion.model import ModelConfig


@pytest.fixture(autouse=True)
def _one_thread() -> object:
    """Tiny models: one thread is faster, and two thrash on a busy 2-core CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


_TINY_CONFIG = ModelConfig(vocab_size=8, dim=16, num_heads=2, num_layers=1)
_SMALL_COMPARISON = {
    "seeds": (0, 1),
    "steps": 3,
    "config": _TINY_CONFIG,
    "training_length": 6,
    "eval_length": 10,
    "lag": 2,
    "batch_size": 4,
    "num_sequences": 8,
}
_COMPARISON = PC.PositionComparison(
    ("none",), (0,), 4, 1, {"none": torch.zeros(1, 3)}, {"none": torch.ones(1, 8)}, {}
)


def _compare(**changes: object) -> object:
    return PC.compare_position_schemes(("none",), **{**_SMALL_COMPARISON, **changes})


BAD_INPUTS = [
    (
        "compare_position_schemes",
        lambda: PC.compare_position_schemes(("rope", "rope")),
        ValueError,
        r"^schemes must not repeat a name",
    ),
    (
        "compare_position_schemes",
        lambda: PC.compare_position_schemes("rope"),
        TypeError,
        r"^schemes must be a non-empty sequence of names",
    ),
    (
        "compare_position_schemes",
        lambda: PC.compare_position_schemes(("xl",)),
        ValueError,
        r"^schemes\[0\] must be one of",
    ),
    (
        "compare_position_schemes",
        lambda: _compare(seeds=(0, 0)),
        ValueError,
        r"^seeds must not repeat a seed, got \(0, 0\)",
    ),
    (
        "compare_position_schemes",
        lambda: _compare(seeds=()),
        TypeError,
        r"^seeds must be a non-empty sequence of ints",
    ),
    (
        "compare_position_schemes",
        lambda: _compare(seeds=(0, -1)),
        ValueError,
        r"^seeds\[1\] must be",
    ),
    (
        "compare_position_schemes",
        lambda: _compare(training_length=16, eval_length=16),
        ValueError,
        r"^eval_length must be more than training_length=16",
    ),
    (
        "compare_position_schemes",
        lambda: _compare(num_sequences=0),  # review s6-ch03-04, finding 8
        ValueError,
        r"^num_sequences must be a positive int, got 0",
    ),
    (
        "compare_position_schemes",
        lambda: _compare(batch_size=0),
        ValueError,
        r"^batch_size must be a positive int, got 0",
    ),
    (
        "compare_position_schemes",
        lambda: _compare(lag=6),
        ValueError,
        r"^lag must be less than training_length=6, got 6",
    ),
    (
        "compare_position_schemes",
        lambda: _compare(lr=0.0),
        ValueError,
        r"^lr must be",
    ),
    (
        "compare_position_schemes",
        lambda: _compare(warmup_steps=-1),
        ValueError,
        r"^warmup_steps must be",
    ),
    (
        "compare_position_schemes",
        lambda: _compare(steps={"none": (2, 2)}),
        ValueError,
        r"^steps\['none'\] must not repeat a budget",
    ),
    (
        "compare_position_schemes",
        lambda: _compare(steps={"none": ()}),
        ValueError,
        r"^steps\['none'\] must hold at least one budget",
    ),
    (
        "compare_position_schemes",
        lambda: _compare(steps={"alibi": 2}),
        ValueError,
        r"^steps must give every scheme its steps, missing \['none'\]",
    ),
    (
        "compare_position_schemes",
        lambda: _compare(steps=0),
        ValueError,
        r"^steps must be a positive int",
    ),
    (
        "compare_position_schemes",
        lambda: _compare(config="small"),
        TypeError,
        r"^config must be a ModelConfig",
    ),
    (
        "compare_position_schemes",
        lambda: _compare(progress="yes"),
        TypeError,
        r"^progress must be",
    ),
    (
        "PositionComparison",
        lambda: _COMPARISON.band("t5", 0, 4),
        ValueError,
        r"^scheme must be one of",
    ),
    (
        "PositionComparison",
        lambda: _COMPARISON.final_loss("none", window=0),
        ValueError,
        r"^window must be a positive int",
    ),
]


@pytest.mark.parametrize(
    ("name", "thunk", "error", "match"),
    BAD_INPUTS,
    ids=[f"{case[0]}-{i}" for i, case in enumerate(BAD_INPUTS)],
)
def test_comparison_refuses_bad_input_before_it_trains(
    name: str,
    thunk: object,
    error: type[Exception],
    match: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every bad argument is refused before the first model is built or trained (the
    review's finding 8: num_sequences was checked only after training)."""

    def no_training(*args: object, **kwargs: object) -> None:
        raise AssertionError("trained before refusing the input")

    monkeypatch.setattr(E, "build", no_training)
    monkeypatch.setattr(E, "train_batched", no_training)
    with pytest.raises(error, match=match):
        thunk()  # type: ignore[operator]


def test_comparison_is_build_train_batched_and_position_accuracy() -> None:
    """Oracle: the documented recipe written out - each model from build (seed s, so
    the jitter acts), all seeds of a scheme through train_batched (cosine schedule),
    then position_accuracy - gives the same losses and accuracies bit for bit."""
    kw = _SMALL_COMPARISON
    result = PC.compare_position_schemes(("shaw",), **kw, warmup_steps=1)
    config = ModelConfig(vocab_size=8, dim=16, num_heads=2, num_layers=1, max_len=10)
    models = [
        E.build(lambda: R.position_family_model("shaw", config), s) for s in (0, 1)
    ]
    runs = E.train_batched(
        models,
        seeds=(0, 1),
        steps=3,
        batch_size=4,
        length=6,
        lag=2,
        lr=1e-2,
        warmup_steps=1,
        schedule="cosine",
    )
    assert result.losses["shaw"].tolist() == [r.losses for r in runs]
    expected = torch.stack(
        [M.position_accuracy(m, length=10, lag=2, num_sequences=8) for m in models]
    )
    torch.testing.assert_close(
        result.accuracy["shaw"], expected, equal_nan=True, rtol=0, atol=0
    )


def test_comparison_builds_through_build_and_takes_the_seed_offset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without seeds it uses seeds(3) (COMPANION_SEED_OFFSET shifts them), and every
    model comes from build, so COMPANION_INIT_JITTER moves its initial weights."""
    built: list[int] = []
    original = E.build

    def spy(factory: object, seed: int, **kwargs: object) -> nn.Module:
        built.append(seed)
        return original(factory, seed, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(E, "build", spy)
    monkeypatch.setenv(E.SEED_OFFSET_ENV, "100")
    kw = {k: v for k, v in _SMALL_COMPARISON.items() if k != "seeds"}
    result = PC.compare_position_schemes(("none",), **{**kw, "steps": {"none": (1, 2)}})
    assert result.seeds == (100, 101, 102)
    assert built == [100, 101, 102, 100, 101, 102]  # each budget, each seed
    monkeypatch.delenv(E.SEED_OFFSET_ENV)
    monkeypatch.setattr(E, "build", original)
    plain = PC.compare_position_schemes(("none",), **{**kw, "steps": 1, "seeds": (0,)})
    monkeypatch.setenv(E.JITTER_ENV, "1e-3")
    jittered = PC.compare_position_schemes(
        ("none",), **{**kw, "steps": 1, "seeds": (0,)}
    )
    assert not torch.equal(plain.losses["none"], jittered.losses["none"])
    assert abs(plain.losses["none"][0, 0] - jittered.losses["none"][0, 0]) < 0.05


def test_compare_position_schemes_small() -> None:
    result = PC.compare_position_schemes(("none", "shaw"), **_SMALL_COMPARISON)
    assert result.schemes == ("none", "shaw") and result.seeds == (0, 1)
    assert result.losses["shaw"].shape == (2, 3)
    assert result.accuracy["none"].shape == (2, 10)
    assert result.inside("shaw").shape == (2,)
    expected = result.accuracy["shaw"][:, 6:].mean(dim=1)
    assert torch.equal(result.beyond("shaw"), expected)
    assert result.table().count("\n") == 3
    # the same seeds give the same run, whichever schemes train beside it
    again = PC.compare_position_schemes(("shaw",), **_SMALL_COMPARISON)
    assert torch.equal(again.losses["shaw"], result.losses["shaw"])


def test_compare_position_schemes_several_budgets() -> None:
    kwargs = {k: v for k, v in _SMALL_COMPARISON.items() if k != "steps"}
    both = PC.compare_position_schemes(("alibi",), steps={"alibi": (4, 2)}, **kwargs)
    short = PC.compare_position_schemes(("alibi",), steps=2, **kwargs)
    long = PC.compare_position_schemes(("alibi",), steps=4, **kwargs)
    assert both.losses["alibi"].shape == (2, 4)
    torch.testing.assert_close(
        both.accuracy["alibi"], long.accuracy["alibi"], equal_nan=True, rtol=0, atol=0
    )
    torch.testing.assert_close(
        both.shorter["alibi", 2],
        short.accuracy["alibi"],
        equal_nan=True,
        rtol=0,
        atol=0,
    )
    assert torch.allclose(both.losses["alibi"], long.losses["alibi"], atol=1e-6)
    # the shorter budget is a run of its own, not the longer run stopped early
    lag = kwargs["lag"]  # positions t < lag are nan
    assert not torch.equal(
        both.shorter["alibi", 2][:, lag:], long.accuracy["alibi"][:, lag:]
    )


def test_chapter_settings_are_the_ones_their_prose_states() -> None:
    """The chapter and its claims test read these constants (one home, so the test and
    the chapter cannot drift); the prose states their values: three seeds per scheme,
    T5 again over six, 400 steps for T5."""
    assert (PC.POSITION_FAMILY_SEEDS, PC.POSITION_FAMILY_T5_SEEDS) == (3, 6)
    assert PC.POSITION_FAMILY_STEPS["t5"] == 400
