"""Tests of companion.experiments: the book's one home for training - the loops (one
model at a time, and batched with vmap), the seeds, the jitter that stands for another
processor, the runs over seeds and their table, the checks the chapters' experiment
modules share - and the deprecated aliases of the names that moved to those modules
(companion.position_comparison, companion.capstone, companion.stability)."""

from __future__ import annotations

import copy
import math
import os

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import companion
from companion import experiments as E
from companion import model as M
from companion.model import ModelConfig, TinyTransformer

SCHEMES = M.POSITION_SCHEMES


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


def tiny(position: str = "rope", **kwargs: object) -> TinyTransformer:
    companion.seed_everything(0)
    cfg = dict(
        vocab_size=11, dim=16, num_heads=2, num_layers=2, position=position, max_len=32
    )
    cfg.update(kwargs)
    return TinyTransformer(ModelConfig(**cfg))


# ---- The loops -----------------------------------------------------------------------


@pytest.mark.parametrize("position", SCHEMES)
def test_every_scheme_trains_and_the_loss_decreases(position: str) -> None:
    """lag=1 with a small vocabulary: the loss falls within a few dozen steps, whatever
    the scheme (without positions the model still learns something, see the chapter)."""
    m = tiny(position, num_heads=2)
    run = E.train(m, steps=40, batch_size=16, length=12, lag=1, lr=1e-2, seed=0)
    assert len(run.losses) == 40
    first, last = sum(run.losses[:5]) / 5, sum(run.losses[-5:]) / 5
    assert last < first, f"{position}: loss went from {first:.3f} to {last:.3f}"


def test_training_is_deterministic_with_a_seed() -> None:
    runs = [
        E.train(tiny("rope"), steps=5, batch_size=4, length=8, lag=1, seed=7)
        for _ in range(2)
    ]
    assert runs[0].losses == runs[1].losses


def test_warmup_ramps_the_learning_rate_linearly() -> None:
    run = E.train(
        tiny(), steps=6, batch_size=2, length=6, lag=1, lr=1e-3, warmup_steps=4
    )
    assert run.learning_rates == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3])


def test_cosine_schedule_warms_up_then_falls_to_zero_along_half_a_cosine() -> None:
    run = E.train(
        tiny(), steps=6, batch_size=2, length=6, lag=1, lr=1e-3, warmup_steps=2,
        schedule="cosine",
    )  # fmt: skip
    expected = [5e-4, 1e-3] + [
        1e-3 * 0.5 * (1 + math.cos(math.pi * k / 4)) for k in range(4)
    ]
    assert run.learning_rates == pytest.approx(expected)


def _plain_loop(
    model: TinyTransformer, seed: int, steps: int, lr: float
) -> list[float]:
    """An independent oracle for train: AdamW on lag_task batches, written out."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    losses = []
    for _ in range(steps):
        tokens, targets = M.lag_task(8, 10, lag=2, vocab_size=11, generator=gen)
        logits = model(tokens)
        loss = F.cross_entropy(
            logits.reshape(-1, 11), targets.reshape(-1), ignore_index=-100
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("position", SCHEMES)
@pytest.mark.parametrize("placement", ["pre", "post"])
def test_batched_training_equals_training_the_seeds_one_by_one(
    position: str, placement: str
) -> None:
    """vmap over stacked parameters gives each model its own AdamW update: the losses
    and the trained weights agree with one-at-a-time training up to float32 rounding."""
    seeds = [0, 1, 2]
    models = [tiny(position, placement=placement) for _ in seeds]
    for s, m in zip(seeds, models, strict=True):  # different initial weights per seed
        companion.seed_everything(s)
        m.load_state_dict(tiny(position, placement=placement).state_dict())
        with torch.no_grad():
            for p in m.parameters():
                p.add_(0.01 * s * torch.randn_like(p))
    separate = [copy.deepcopy(m) for m in models]
    runs = E.train_batched(
        models, seeds=seeds, steps=4, batch_size=8, length=10, lag=2, lr=1e-2
    )
    probe = torch.randint(11, (2, 10), generator=torch.Generator().manual_seed(9))
    for s, m, ref, run in zip(seeds, models, separate, runs, strict=True):
        expected = _plain_loop(ref, s, steps=4, lr=1e-2)
        assert run.losses == pytest.approx(expected, rel=1e-5, abs=1e-5)
        for (name, p), q in zip(m.named_parameters(), ref.parameters(), strict=True):
            if name.endswith("k_proj.bias") and position != "rope":
                # q.(k + b) shifts a query's scores by the constant q.b, which the
                # softmax ignores: the true gradient is zero, and AdamW's step on the
                # rounding noise (up to lr) differs between any two summation orders
                continue
            torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=name)
        assert not m.training
        with torch.no_grad():
            torch.testing.assert_close(m(probe), ref(probe), rtol=1e-4, atol=1e-4)


def test_batched_training_matches_train_with_warmup() -> None:
    models = [tiny("alibi"), tiny("alibi")]
    refs = [copy.deepcopy(m) for m in models]
    runs = E.train_batched(
        models, seeds=[3, 4], steps=5, batch_size=4, length=8, lag=1, warmup_steps=3
    )
    for seed, ref, run in zip([3, 4], refs, runs, strict=True):
        expected = E.train(
            ref, steps=5, batch_size=4, length=8, lag=1, warmup_steps=3, seed=seed
        )
        assert run.learning_rates == expected.learning_rates
        assert run.losses == pytest.approx(expected.losses, rel=1e-5, abs=1e-5)


def test_batched_training_gives_each_model_its_own_steps_and_warmup() -> None:
    """Budgets and warm-ups per model: each run is train's at that budget (the cosine
    compressed into its steps), and a model is left unchanged after its own steps."""
    models = [tiny("rope") for _ in range(3)]
    refs = [copy.deepcopy(m) for m in models]
    steps, warmups, seeds = [3, 6, 6], [1, 2, 0], [5, 5, 6]
    runs = E.train_batched(
        models,
        seeds=seeds,
        steps=steps,
        batch_size=4,
        length=8,
        lag=1,
        lr=1e-2,
        warmup_steps=warmups,
        schedule="cosine",
    )
    for m, ref, run, n, w, s in zip(
        models, refs, runs, steps, warmups, seeds, strict=True
    ):
        expected = E.train(
            ref,
            steps=n,
            batch_size=4,
            length=8,
            lag=1,
            lr=1e-2,
            warmup_steps=w,
            schedule="cosine",
            seed=s,
        )
        assert run.learning_rates == expected.learning_rates
        assert run.losses == pytest.approx(expected.losses, rel=1e-5, abs=1e-5)
        for (name, p), q in zip(m.named_parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=name)


def test_batched_adamw_step_is_torchs_adamw_bit_for_bit() -> None:
    """train_batched's update (a learning rate per model) is torch.optim.AdamW's
    arithmetic: with one rate for every model the parameters agree exactly."""
    gen = torch.Generator().manual_seed(0)
    ours = {
        "a": torch.randn(3, 5, 4, generator=gen),
        "b": torch.randn(3, 7, generator=gen),
    }
    theirs = {k: v.clone().requires_grad_() for k, v in ours.items()}
    optimizer = torch.optim.AdamW(theirs.values(), lr=3e-2, weight_decay=0.0)
    moments = {k: (torch.zeros_like(v), torch.zeros_like(v)) for k, v in ours.items()}
    for step in range(1, 30):
        grads = [torch.randn(v.shape, generator=gen) * 10.0 ** (step % 5 - 2)
                 for v in ours.values()]  # fmt: skip
        E._adamw_step(ours, grads, moments, [3e-2] * 3, step)
        for v, g in zip(theirs.values(), grads, strict=True):
            v.grad = g.clone()
        optimizer.step()
    for k in ours:
        assert torch.equal(ours[k], theirs[k].detach()), k


def test_batched_training_takes_another_task_on_the_same_tokens() -> None:
    def lag_targets(tokens: torch.Tensor) -> torch.Tensor:
        out = torch.full_like(tokens, -100)
        out[:, 2:] = tokens[:, :-2]
        return out

    def first_token(tokens: torch.Tensor) -> torch.Tensor:
        return tokens[:, :1].expand_as(tokens).clone()

    kwargs = dict(seeds=[0, 1], steps=3, batch_size=4, length=8, lag=2)
    plain = E.train_batched([tiny(), tiny()], **kwargs)
    same = E.train_batched([tiny(), tiny()], targets=lag_targets, **kwargs)
    other = E.train_batched([tiny(), tiny()], targets=first_token, **kwargs)
    for a, b, c in zip(plain, same, other, strict=True):
        assert a.losses == b.losses  # the lag task's targets, given as a function
        assert a.losses[0] != c.losses[0]  # another task: other losses


def test_batched_training_changes_the_weights_of_every_model() -> None:
    models = [tiny("rope"), tiny("rope")]
    before = [copy.deepcopy(m.state_dict()) for m in models]
    E.train_batched(models, seeds=[0, 1], steps=2, batch_size=4, length=8, lag=1)
    for m, old in zip(models, before, strict=True):
        assert any(not torch.equal(old[k], v) for k, v in m.state_dict().items())
    # different batches per seed: the two models, equal at the start, now differ
    assert not torch.equal(models[0].head.weight, models[1].head.weight)


def test_batched_training_prints_progress_only_when_asked(
    capsys: pytest.CaptureFixture[str],
) -> None:
    E.train_batched([tiny()], seeds=[0], steps=3, batch_size=2, length=6, lag=1)
    assert capsys.readouterr().out == ""
    E.train_batched(
        [tiny()], seeds=[0], steps=3, batch_size=2, length=6, lag=1, progress=True
    )
    assert "step     3/3: mean loss" in capsys.readouterr().out


def test_a_repeated_batched_call_is_answered_from_the_first_bit_for_bit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """train_batched remembers its calls in the process: an identical call (same initial
    weights bit for bit, seeds, steps, rate, task, threads) gets the first call's
    trained weights and losses without training; a model one part in 1e7 away, another
    seed or another budget trains."""
    kwargs = dict(steps=[3, 2], batch_size=4, length=8, lag=1, lr=1e-2)
    first = [tiny("alibi"), tiny("alibi")]
    E.train_batched(first, seeds=[5, 6], **kwargs)
    fresh = [tiny("alibi"), tiny("alibi")]
    E.clear_runs()  # the oracle: the same call computed again
    want = E.train_batched(fresh, seeds=[5, 6], **kwargs)

    def no_training(*args: object, **kw: object) -> None:
        raise AssertionError("trained again")

    monkeypatch.setattr(E, "_adamw_step", no_training)
    again = [tiny("alibi"), tiny("alibi")]
    got = E.train_batched(again, seeds=[5, 6], **kwargs)
    assert [r.losses for r in got] == [r.losses for r in want]
    assert [r.learning_rates for r in got] == [r.learning_rates for r in want]
    for a, b, c in zip(again, fresh, first, strict=True):
        for pa, pb, pc in zip(
            a.parameters(), b.parameters(), c.parameters(), strict=True
        ):
            assert torch.equal(pa, pb) and torch.equal(pa, pc)
        assert not a.training
    got[0].losses.append(0.0)  # the caller's copy, not the remembered one
    again[0].head.weight.data.zero_()
    assert (
        E.train_batched([tiny("alibi"), tiny("alibi")], seeds=[5, 6], **kwargs)[
            0
        ].losses
        == want[0].losses
    )
    jittered = [E.jitter_(tiny("alibi"), 1e-7, seed=0), tiny("alibi")]
    for models, seeds, steps in [
        (jittered, [5, 6], [3, 2]),
        ([tiny("alibi"), tiny("alibi")], [5, 7], [3, 2]),
        ([tiny("alibi"), tiny("alibi")], [5, 6], [3, 1]),
        ([tiny("none"), tiny("none")], [5, 6], [3, 2]),
    ]:
        with pytest.raises(AssertionError, match="trained again"):
            E.train_batched(models, seeds=seeds, **{**kwargs, "steps": steps})


def test_a_hooked_or_frozen_model_is_always_trained(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A forward hook, a global hook or a frozen parameter is state the remembered call's
    key does not see: such a call trains (review R5: a hooked model got the unhooked
    call's answer)."""
    kwargs = dict(seeds=[5], steps=2, batch_size=4, length=8, lag=1, lr=1e-2)
    E.train_batched([tiny("alibi")], **kwargs)
    monkeypatch.setattr(E, "_adamw_step", lambda *a, **k: pytest.fail("trained"))
    E.train_batched([tiny("alibi")], **kwargs)  # answered: the identical call
    monkeypatch.undo()

    def no_training(*args: object, **kw: object) -> None:
        raise AssertionError("trained again")

    monkeypatch.setattr(E, "_adamw_step", no_training)
    hooked = tiny("alibi")
    hooked.head.register_forward_hook(lambda mod, inp, out: out * 2)
    pre = tiny("alibi")
    pre.register_forward_pre_hook(lambda mod, inp: None)
    frozen = tiny("alibi")
    frozen.head.weight.requires_grad_(False)
    for model in (hooked, pre, frozen):
        with pytest.raises((AssertionError, RuntimeError, ValueError)):
            E.train_batched([model], **kwargs)
    handle = torch.nn.modules.module.register_module_forward_hook(lambda m, i, o: None)
    try:
        with pytest.raises(AssertionError, match="trained again"):
            E.train_batched([tiny("alibi")], **kwargs)
    finally:
        handle.remove()


def test_chapter_4s_no_position_runs_are_chapter_7s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The two chapters train the no-position and ALiBi models alike (the same bench,
    seeds, budgets, rate and warm-up): after the capstone's call, the position family's
    is answered from it (make claims runs both in one process)."""
    from companion import capstone, position_comparison

    E.clear_runs()
    ch7 = capstone.train_capstone_scheme("none", (0, 1), budgets=(2, 3))
    monkeypatch.setattr(E, "_adamw_step", lambda *a, **k: pytest.fail("trained"))
    ch4 = position_comparison.compare_position_schemes(
        ("none",), seeds=(0, 1), steps={"none": (2, 3)}, num_sequences=4
    )
    assert ch4.losses["none"].tolist() == ch7[3].losses
    for a, b in zip(ch4.models["none"], ch7[3].models, strict=True):
        pairs = zip(a.parameters(), b.parameters(), strict=True)
        assert all(torch.equal(p, q) for p, q in pairs)


# ---- Bad input: every public name ----------------------------------------------------

_TRAIN = dict(steps=1, batch_size=2, length=4, lag=1)


def _train_batched(**overrides: object) -> None:
    kwargs = dict(models=[tiny(), tiny()], seeds=[0, 1], **_TRAIN)
    kwargs.update(overrides)
    E.train_batched(**kwargs)  # type: ignore[arg-type]


BAD_INPUTS = [
    # TrainingRun
    (
        "TrainingRun",
        lambda: E.TrainingRun(losses=1.0),
        TypeError,
        r"losses must be a list of floats, got 1.0",
    ),
    (
        "TrainingRun",
        lambda: E.TrainingRun(losses=[1.0], learning_rates=[]),
        ValueError,
        r"learning_rates must hold one rate per loss \(1\), got 0",
    ),
    # train
    (
        "train",
        lambda: E.train(tiny(), **{**_TRAIN, "steps": 0}),
        ValueError,
        r"steps must be a positive int, got 0",
    ),
    (
        "train",
        lambda: E.train(tiny(), **_TRAIN, warmup_steps=-1),
        ValueError,
        r"warmup_steps must be an int >= 0, got -1",
    ),
    (
        "train",
        lambda: E.train(tiny(), **_TRAIN, lr=0),
        ValueError,
        r"lr must be a real number > 0, got 0",
    ),
    (
        "train",
        lambda: E.train(tiny(), **_TRAIN, schedule="linear"),
        ValueError,
        r"schedule must be one of 'constant', 'cosine', got 'linear'",
    ),
    (
        "train",
        lambda: E.train(tiny(), **_TRAIN, seed=-2),
        ValueError,
        r"seed must be an int >= 0, got -2",
    ),
    (
        "train",
        lambda: E.train(nn.Linear(2, 2), **_TRAIN),
        TypeError,
        r"model.config must be a ModelConfig, got None",
    ),
    (
        "train",
        lambda: E.train(tiny(), **{**_TRAIN, "length": 1}),
        ValueError,
        r"length must be greater than lag, got length=1, lag=1",
    ),
    # train_batched
    (
        "train_batched",
        lambda: _train_batched(models=tiny()),
        TypeError,
        r"models must be a non-empty sequence of TinyTransformers, "
        r"got a TinyTransformer",
    ),
    (
        "train_batched",
        lambda: _train_batched(models=[]),
        TypeError,
        r"models must be a non-empty sequence of TinyTransformers, got a list",
    ),
    (
        "train_batched",
        lambda: _train_batched(models=[tiny(), nn.Linear(2, 2)], seeds=[0, 1]),
        TypeError,
        r"models\[1\] must be a TinyTransformer, got a Linear",
    ),
    (
        "train_batched",
        lambda: _train_batched(models=[tiny(), tiny("alibi")]),
        ValueError,
        r"models must share one config, got models\[1\].config=",
    ),
    (
        "train_batched",
        lambda: _train_batched(seeds=[0]),
        ValueError,
        r"seeds must hold one seed per model \(2\), got 1 seeds",
    ),
    (
        "train_batched",
        lambda: _train_batched(seeds=[0, 1.5]),
        TypeError,
        r"seeds\[1\] must be an int, got 1.5",
    ),
    (
        "train_batched",
        lambda: _train_batched(seeds=7),
        TypeError,
        r"seeds must be a sequence of ints, got 7",
    ),
    (
        "train_batched",
        lambda: _train_batched(progress=1),
        TypeError,
        r"progress must be a bool, got 1",
    ),
    (
        "train_batched",
        lambda: _train_batched(lag=0),
        ValueError,
        r"lag must be a positive int, got 0",
    ),
    (
        "train_batched",
        lambda: _train_batched(models=[m := tiny(), m]),
        ValueError,
        r"models must be distinct modules, got the same module twice",
    ),
    (
        "train_batched",
        lambda: _train_batched(steps=[1]),
        ValueError,
        r"steps must be one number or one per model \(2\), got 1 values",
    ),
    (
        "train_batched",
        lambda: _train_batched(warmup_steps=[0, -1]),
        ValueError,
        r"warmup_steps\[1\] must be an int >= 0, got -1",
    ),
    (
        "train_batched",
        lambda: _train_batched(targets=3),
        TypeError,
        r"targets must be callable, got 3",
    ),
    (
        "train_batched",
        lambda: _train_batched(targets=lambda t: t.float()),
        TypeError,
        r"targets\(tokens\) must be an integer tensor, got a tensor of dtype",
    ),
    (
        "train_batched",
        lambda: _train_batched(targets=lambda t: t[:, :1]),
        ValueError,
        r"targets\(tokens\) must have shape of the tokens \(2, 4\), got shape \(2, 1\)",
    ),
    # init_jitter, seeds (the environment variables)
    (
        "init_jitter",
        lambda: _with_env(E.JITTER_ENV, "tiny", E.init_jitter),
        ValueError,
        r"COMPANION_INIT_JITTER must be a number such as 1e-7, got 'tiny'",
    ),
    (
        "init_jitter",
        lambda: _with_env(E.JITTER_ENV, "2", E.init_jitter),
        ValueError,
        r"COMPANION_INIT_JITTER must be a finite number with \|eps\| < 1, got '2'",
    ),
    (
        "seed_offset",
        lambda: _with_env(E.SEED_OFFSET_ENV, "1e3", E.seed_offset),
        ValueError,
        r"COMPANION_SEED_OFFSET must be a non-negative integer, got '1e3'",
    ),
    (
        "seeds",
        lambda: E.seeds(0),
        ValueError,
        r"n must be a positive int, got 0",
    ),
    (
        "seeds",
        lambda: _with_env(E.SEED_OFFSET_ENV, "-3", lambda: E.seeds(2)),
        ValueError,
        r"COMPANION_SEED_OFFSET must be a non-negative integer, got '-3'",
    ),
    # jitter_, build
    (
        "jitter_",
        lambda: E.jitter_("net", 1e-7, seed=0),
        TypeError,
        r"model must be a Module, got 'net'",
    ),
    (
        "jitter_",
        lambda: E.jitter_(tiny(), 1.0, seed=0),
        ValueError,
        r"eps must satisfy \|eps\| < 1, got 1.0",
    ),
    (
        "jitter_",
        lambda: E.jitter_(tiny(), 1e-7, seed=-1),
        ValueError,
        r"seed must be an int >= 0, got -1",
    ),
    (
        "build",
        lambda: E.build(tiny(), 0),
        TypeError,
        r"factory must be a function that returns a fresh model .*, got a TinyTransformer",
    ),
    (
        "build",
        lambda: E.build(lambda: 3, 0),
        TypeError,
        r"factory\(\) must be an nn.Module \(a fresh model\), got 3",
    ),
    (
        "build",
        lambda: E.build(tiny, 1.5),
        TypeError,
        r"seed must be an int, got 1.5",
    ),
    # run_seeds, SeedRuns, summary_table
    (
        "run_seeds",
        lambda: E.run_seeds(tiny, [], **_TRAIN),
        ValueError,
        r"seed_list must hold at least one seed, got none",
    ),
    (
        "run_seeds",
        lambda: E.run_seeds(tiny, 3, **_TRAIN),
        TypeError,
        r"seed_list must be a sequence of ints, got 3",
    ),
    (
        "run_seeds",
        lambda: E.run_seeds(tiny, [0], seeds=[0], **_TRAIN),
        TypeError,
        r"run_seeds takes the seeds as seed_list, not seeds=",
    ),
    (
        "SeedRuns",
        lambda: E.SeedRuns((0, 1), [[1.0]], [tiny()]),
        ValueError,
        r"seeds, losses and models must have one entry per seed, got 2, 1 and 1",
    ),
    (
        "summary_table",
        lambda: E.summary_table({}),
        TypeError,
        r"runs must be a non-empty dict of SeedRuns, got a dict",
    ),
    (
        "summary_table",
        lambda: E.summary_table({"a": [1.0]}),
        TypeError,
        r"runs\['a'\] must be a SeedRuns, got a list",
    ),
    # the checks the chapters' experiment modules share
    (
        "distinct_seeds",
        lambda: E.distinct_seeds("seed_list", 3),
        TypeError,
        r"^seed_list must be a non-empty sequence of ints, got 3",
    ),
    (
        "distinct_seeds",
        lambda: E.distinct_seeds("seed_list", ()),
        TypeError,
        r"^seed_list must be a non-empty sequence of ints",
    ),
    (
        "distinct_seeds",
        lambda: E.distinct_seeds("seed_list", (0, -1)),
        ValueError,
        r"^seed_list\[1\]",
    ),
    (
        "distinct_seeds",
        lambda: E.distinct_seeds("seed_list", (0, 2**32)),
        ValueError,
        r"^seed_list\[1\]",
    ),
    (
        "distinct_seeds",
        lambda: E.distinct_seeds("seed_list", (0, 0)),
        ValueError,
        r"^seed_list must not repeat a seed, got \(0, 0\)",
    ),
    (
        "task_targets",
        lambda: E.task_targets(
            lambda t: t.float(), torch.zeros(2, 4, dtype=torch.long)
        ),
        TypeError,
        r"^targets\(tokens\) must be an integer tensor",
    ),
    (
        "task_targets",
        lambda: E.task_targets(lambda t: t[:, :1], torch.zeros(2, 4, dtype=torch.long)),
        ValueError,
        r"^targets\(tokens\) must have shape of the tokens \(2, 4\), got shape \(2, 1\)",
    ),
]


def _with_env(name: str, value: str, thunk: object) -> object:
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        return thunk()  # type: ignore[operator]
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


@pytest.mark.parametrize(
    ("name", "thunk", "error", "match"),
    BAD_INPUTS,
    ids=[f"{case[0]}-{i}" for i, case in enumerate(BAD_INPUTS)],
)
def test_bad_input_raises_a_named_error(
    name: str, thunk: object, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        thunk()  # type: ignore[operator]


#: public names that take no input a caller could get wrong (test_contract reads it)
NO_BAD_INPUTS = {"clear_runs": "takes no argument: nothing to get wrong"}


def test_every_public_name_has_bad_input_cases() -> None:
    # every section's table: BAD_INPUTS, COMPARISON_BAD_INPUTS, CAPSTONE_BAD_INPUTS, ...
    tables = [
        v
        for k, v in globals().items()
        if k.endswith("BAD_INPUTS") and k != "NO_BAD_INPUTS"
    ]
    covered = {case[0] for table in tables for case in table} | set(NO_BAD_INPUTS)
    constants = {name for name in E.__all__ if name.isupper()}  # e.g. JITTER_ENV
    assert set(E.__all__) - constants <= covered, set(E.__all__) - constants - covered


# ---- The variants: jitter and seeds --------------------------------------------------


def test_jitter_multiplies_each_weight_by_one_plus_eps_u() -> None:
    """Oracle: the formula, with u drawn in float64 from the documented generator."""
    net, ref = tiny(), tiny()
    E.jitter_(net, 1e-3, seed=4)
    gen = torch.Generator().manual_seed(4 + E._JITTER_STREAM)
    for p, q in zip(net.parameters(), ref.parameters(), strict=True):
        u = torch.rand(q.shape, generator=gen, dtype=torch.float64) * 2 - 1
        expected = (q.detach().double() * (1 + 1e-3 * u)).float()
        assert torch.equal(p.detach(), expected)
        ratio = p.detach().double() / q.detach().double()
        finite = q.detach() != 0
        assert ((ratio[finite] - 1).abs() <= 1e-3 * (1 + 1e-4)).all()


def test_jitter_of_1e7_moves_nearly_every_weight_and_not_the_global_generator() -> None:
    """In float32 a factor 1 + 1e-7 u would round to 1 for most u; computed in float64
    and rounded once, most weights move, none by more than 1e-7 plus half a step."""
    net, ref = tiny(), tiny()
    torch.manual_seed(123)
    E.jitter_(net, 1e-7, seed=0)
    after = torch.rand(3)
    torch.manual_seed(123)
    assert torch.equal(after, torch.rand(3)), "the global generator was touched"
    moved = total = 0
    for p, q in zip(net.parameters(), ref.parameters(), strict=True):
        nz = q.detach() != 0
        rel = (p.detach().double() / q.detach().double() - 1)[nz].abs()
        assert (rel <= 1e-7 + 2.0**-24).all()
        moved += int((rel > 0).sum())
        total += int(nz.sum())
    assert moved / total > 0.5


def test_zero_jitter_leaves_the_model_bit_for_bit() -> None:
    net, ref = tiny(), tiny()
    E.jitter_(net, 0.0, seed=3)
    for p, q in zip(net.parameters(), ref.parameters(), strict=True):
        assert torch.equal(p, q)


def test_build_reads_the_jitter_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def make() -> TinyTransformer:
        return TinyTransformer(ModelConfig(vocab_size=11, dim=16, num_heads=2))

    monkeypatch.delenv(E.JITTER_ENV, raising=False)
    plain = E.build(make, 5)
    again = E.build(make, 5)
    assert all(
        torch.equal(p, q)
        for p, q in zip(plain.parameters(), again.parameters(), strict=True)
    )
    monkeypatch.setenv(E.JITTER_ENV, "1e-7")
    assert E.init_jitter() == 1e-7
    shaken = E.build(make, 5)
    by_hand = E.jitter_(E.build(make, 5), 0.0, seed=5)  # already jittered by build
    assert all(
        torch.equal(p, q)
        for p, q in zip(shaken.parameters(), by_hand.parameters(), strict=True)
    )
    expected = E.jitter_(copy.deepcopy(plain), 1e-7, seed=5)
    assert all(
        torch.equal(p, q)
        for p, q in zip(shaken.parameters(), expected.parameters(), strict=True)
    )
    assert any(
        not torch.equal(p, q)
        for p, q in zip(shaken.parameters(), plain.parameters(), strict=True)
    )
    monkeypatch.setenv(E.JITTER_ENV, "")
    assert E.init_jitter() == 0.0


def test_seeds_shift_with_the_offset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(E.SEED_OFFSET_ENV, raising=False)
    assert E.seeds(3) == (0, 1, 2)
    monkeypatch.setenv(E.SEED_OFFSET_ENV, "100")
    assert E.seeds(3) == (100, 101, 102)


def test_run_seeds_is_build_then_train_batched_and_its_summary() -> None:
    """Oracle: the documented equivalent, written out; the summary from the formula."""

    def make() -> TinyTransformer:
        return TinyTransformer(ModelConfig(vocab_size=11, dim=16, num_heads=2))

    kwargs = dict(steps=12, batch_size=4, length=8, lag=1, lr=1e-2)
    result = E.run_seeds(make, (2, 3), **kwargs)
    models = [E.build(make, s) for s in (2, 3)]
    runs = E.train_batched(models, seeds=(2, 3), **kwargs)
    assert result.seeds == (2, 3)
    assert result.losses == [r.losses for r in runs]
    finals = [sum(r.losses[-5:]) / 5 for r in runs]
    assert result.final(5).tolist() == pytest.approx(finals, abs=1e-12)
    mean, spread = result.summary(5)
    assert mean == pytest.approx(sum(finals) / 2)
    assert spread == pytest.approx(max(finals) - min(finals))
    table = E.summary_table({"rope": result}, last=5)
    assert table.splitlines()[2].startswith("| rope | ")
    assert f"{mean:.3f}" in table


def test_distinct_seeds_and_task_targets_return_what_they_checked() -> None:
    assert E.distinct_seeds("seed_list", [3, 0, 2**32 - 1]) == (3, 0, 2**32 - 1)
    tokens = torch.tensor([[1, 2, 3]])
    out = E.task_targets(lambda t: (t % 2).int(), tokens)
    assert out.dtype == torch.long and out.tolist() == [[1, 0, 1]]


# the names that moved out (issue 33), written out here rather than read from the
# modules, so a name dropped from the aliases fails this test
MOVED = {
    "position_comparison": """POSITION_FAMILY_SEEDS POSITION_FAMILY_STEPS
        POSITION_FAMILY_T5_SEEDS PositionComparison compare_position_schemes""",
    "capstone": """ABSOLUTE_STEPS CAPSTONE_BUDGETS CAPSTONE_EVAL_LENGTH CAPSTONE_LR
        CAPSTONE_SEEDS CAPSTONE_SIZES CAPSTONE_TASK CAPSTONE_WARMUP_STEPS
        WARMUP_CONFIGS WARMUP_RUN_LR WARMUP_RUN_SEEDS WARMUP_RUN_STEPS
        absolute_position_runs band_accuracy capstone_model first_adamw_step
        first_relapse first_step_below position_accuracies train_capstone_scheme
        warmup_runs""",
    "stability": """MODERN_SIZES MODERN_TASK STABILITY_CAP STABILITY_RUNS STABILITY_STEPS
        StabilityMeasures first_attention_step first_token_mass lag_weight
        measure_stability modern_probe stability_runs uniform_first_token_share""",
}
MOVED_NAMES = [(home, name) for home, names in MOVED.items() for name in names.split()]


@pytest.mark.parametrize(("home", "name"), MOVED_NAMES, ids=lambda v: str(v))
def test_the_chapters_experiments_moved_with_a_deprecated_alias(
    home: str, name: str
) -> None:
    """experiments.<name> and `from companion.experiments import <name>` still answer
    for one release, warn naming the new home, and give the new module's own object."""
    import importlib

    module = importlib.import_module(f"companion.{home}")
    new_home = rf"companion\.{home}\.{name}\b"
    with pytest.warns(DeprecationWarning, match=new_home):
        alias = getattr(E, name)
    assert alias is getattr(module, name)
    with pytest.warns(DeprecationWarning, match=new_home):
        exec(f"from companion.experiments import {name} as imported", namespace := {})
    assert namespace["imported"] is alias
    assert name not in E.__all__ and name in module.__all__


def test_the_aliases_are_the_moved_names_and_no_others() -> None:
    """experiments answers for exactly the names it held before the split (a name added
    to one of the three modules since never lived here), and for no other."""
    assert {name: home for home, name in MOVED_NAMES} == E._MOVED
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        E.no_such_name  # noqa: B018


def test_clear_runs_makes_the_next_identical_call_train(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """clear_runs forgets the remembered calls (review R5-5: no public way to turn the
    cache off); what is remembered is kept on the CPU."""
    kwargs = dict(seeds=[3], steps=2, batch_size=4, length=8, lag=1, lr=1e-2)
    E.train_batched([tiny("alibi")], **kwargs)
    assert all(
        t.device.type == "cpu"
        for weights, _ in E._DONE.values()
        for w in weights
        for t in w.values()
    )

    def no_training(*args: object, **kw: object) -> None:
        raise AssertionError("trained again")

    monkeypatch.setattr(E, "_adamw_step", no_training)
    E.train_batched([tiny("alibi")], **kwargs)  # answered from the first call
    E.clear_runs()
    with pytest.raises(AssertionError, match="trained again"):
        E.train_batched([tiny("alibi")], **kwargs)
