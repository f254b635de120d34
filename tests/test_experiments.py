"""Tests of companion.experiments: the book's one home for training - the loops (one
model at a time, and batched with vmap), the seeds, the jitter that stands for another
processor, the runs over seeds and their table."""

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


@pytest.fixture(autouse=True)
def _one_thread() -> object:
    """Tiny models: one thread is faster, and two thrash on a busy 2-core CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


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


def test_every_public_name_has_bad_input_cases() -> None:
    # every section's table: BAD_INPUTS, COMPARISON_BAD_INPUTS, CAPSTONE_BAD_INPUTS, ...
    tables = [v for k, v in globals().items() if k.endswith("BAD_INPUTS")]
    covered = {case[0] for table in tables for case in table}
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


# ---- The position family's comparison (chapter 4) ---------------------------------------
# compare_position_schemes and PositionComparison (moved here from companion.relative)

from companion import relative as R  # noqa: E402

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
_COMPARISON = E.PositionComparison(
    ("none",), (0,), 4, 1, {"none": torch.zeros(1, 3)}, {"none": torch.ones(1, 8)}, {}
)


def _compare(**changes: object) -> object:
    return E.compare_position_schemes(("none",), **{**_SMALL_COMPARISON, **changes})


COMPARISON_BAD_INPUTS = [
    (
        "compare_position_schemes",
        lambda: E.compare_position_schemes(("rope", "rope")),
        ValueError,
        r"^schemes must not repeat a name",
    ),
    (
        "compare_position_schemes",
        lambda: E.compare_position_schemes("rope"),
        TypeError,
        r"^schemes must be a non-empty sequence of names",
    ),
    (
        "compare_position_schemes",
        lambda: E.compare_position_schemes(("xl",)),
        ValueError,
        r"^schemes\[0\] must be one of",
    ),
    (
        "compare_position_schemes",
        lambda: _compare(seeds=(0, 0)),
        ValueError,
        r"^seeds must not repeat, got \(0, 0\)",
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
    COMPARISON_BAD_INPUTS,
    ids=[f"{case[0]}-{i}" for i, case in enumerate(COMPARISON_BAD_INPUTS)],
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
    result = E.compare_position_schemes(("shaw",), **kw, warmup_steps=1)
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
    result = E.compare_position_schemes(("none",), **{**kw, "steps": {"none": (1, 2)}})
    assert result.seeds == (100, 101, 102)
    assert built == [100, 101, 102, 100, 101, 102]  # each budget, each seed
    monkeypatch.delenv(E.SEED_OFFSET_ENV)
    monkeypatch.setattr(E, "build", original)
    plain = E.compare_position_schemes(("none",), **{**kw, "steps": 1, "seeds": (0,)})
    monkeypatch.setenv(E.JITTER_ENV, "1e-3")
    jittered = E.compare_position_schemes(
        ("none",), **{**kw, "steps": 1, "seeds": (0,)}
    )
    assert not torch.equal(plain.losses["none"], jittered.losses["none"])
    assert abs(plain.losses["none"][0, 0] - jittered.losses["none"][0, 0]) < 0.05


def test_compare_position_schemes_small() -> None:
    result = E.compare_position_schemes(("none", "shaw"), **_SMALL_COMPARISON)
    assert result.schemes == ("none", "shaw") and result.seeds == (0, 1)
    assert result.losses["shaw"].shape == (2, 3)
    assert result.accuracy["none"].shape == (2, 10)
    assert result.inside("shaw").shape == (2,)
    expected = result.accuracy["shaw"][:, 6:].mean(dim=1)
    assert torch.equal(result.beyond("shaw"), expected)
    assert result.table().count("\n") == 3
    # the same seeds give the same run, whichever schemes train beside it
    again = E.compare_position_schemes(("shaw",), **_SMALL_COMPARISON)
    assert torch.equal(again.losses["shaw"], result.losses["shaw"])


def test_compare_position_schemes_several_budgets() -> None:
    kwargs = {k: v for k, v in _SMALL_COMPARISON.items() if k != "steps"}
    both = E.compare_position_schemes(("alibi",), steps={"alibi": (4, 2)}, **kwargs)
    short = E.compare_position_schemes(("alibi",), steps=2, **kwargs)
    long = E.compare_position_schemes(("alibi",), steps=4, **kwargs)
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


# ---- The capstone's experiments (chapter 7) ------------------------------------------


def _mod5(tokens: torch.Tensor) -> torch.Tensor:
    return (torch.arange(tokens.shape[1]) % 5).expand_as(tokens).clone()


def test_capstone_model_is_the_chapters_configuration() -> None:
    net = E.capstone_model("alibi", num_layers=4, placement="post")()
    assert isinstance(net, TinyTransformer)
    expected = ModelConfig(
        **{
            **E.CAPSTONE_SIZES,
            "position": "alibi",
            "num_layers": 4,
            "placement": "post",
        }
    )
    assert net.config == expected
    assert E.CAPSTONE_TASK == {"batch_size": 32, "length": 16, "lag": 2}
    assert E.CAPSTONE_EVAL_LENGTH == 4 * E.CAPSTONE_TASK["length"]


def test_train_capstone_scheme_is_build_then_one_batched_call() -> None:
    """Oracle: the documented equivalent, written out (two budgets, two seeds)."""
    result = E.train_capstone_scheme("rope", (3, 4), budgets=(2, 4), lr=1e-2)
    factory = E.capstone_model("rope")
    jobs = [(2, 3), (2, 4), (4, 3), (4, 4)]
    models = [E.build(factory, s) for _, s in jobs]
    runs = E.train_batched(
        models,
        seeds=[s for _, s in jobs],
        steps=[n for n, _ in jobs],
        lr=1e-2,
        warmup_steps=50,
        schedule="cosine",
        **E.CAPSTONE_TASK,
    )
    assert set(result) == {2, 4}
    assert result[2].losses == [runs[0].losses, runs[1].losses]
    assert result[4].losses == [runs[2].losses, runs[3].losses]
    assert result[4].seeds == (3, 4)
    for got, want in zip(result[4].models, models[2:], strict=True):
        for a, b in zip(got.parameters(), want.parameters(), strict=True):
            assert torch.equal(a, b)


def test_position_and_band_accuracies_against_the_model_function() -> None:
    runs = E.train_capstone_scheme("none", (0, 1), budgets=(2,))[2]
    per_position = E.position_accuracies(runs, length=20, lag=2)
    assert per_position.shape == (2, 20) and per_position.dtype == torch.float64
    for row, net in zip(per_position, runs.models, strict=True):
        oracle = M.position_accuracy(net, length=20, lag=2)
        torch.testing.assert_close(row, oracle, equal_nan=True)
    bands = E.band_accuracy(per_position, {"a": (2, 10), "b": (10, 20)})
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
    assert E.first_step_below(losses, threshold, window=window) == expected


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
    assert E.first_relapse(losses, low=0.1, high=1.0) == expected


def test_warmup_runs_train_each_placement_as_one_batch() -> None:
    """Oracle: per placement, build every (config, seed) and one train_batched call."""
    got = E.warmup_runs((5, 6), steps=3, lr=3e-2)
    assert list(got) == list(E.WARMUP_CONFIGS)
    for placement in ("pre", "post"):
        labels = [k for k, (p, _) in E.WARMUP_CONFIGS.items() if p == placement]
        jobs = [(label, s) for label in labels for s in (5, 6)]
        factory = E.capstone_model("rope", num_layers=4, placement=placement)
        models = [E.build(factory, s) for _, s in jobs]
        runs = E.train_batched(
            models,
            seeds=[s for _, s in jobs],
            steps=3,
            lr=3e-2,
            warmup_steps=[E.WARMUP_CONFIGS[label][1] for label, _ in jobs],
            **E.CAPSTONE_TASK,
        )
        for k, (label, s) in enumerate(jobs):
            assert got[label].losses[got[label].seeds.index(s)] == runs[k].losses
    # the warm-up's first rate is lr / 30: a smaller first loss drop than at full lr
    assert got["post-LN + warm-up"].seeds == (5, 6)


def test_first_adamw_step_is_lr_times_the_sign_of_the_gradient() -> None:
    """Oracle: Adam's first update is lr * g / (|g| + eps), element by element; its norm
    is about lr * sqrt(n), and the relative logit change is recomputed by hand."""
    got = E.first_adamw_step((0,), lr=1e-2)
    for placement in ("post", "pre"):
        factory = E.capstone_model("rope", num_layers=4, placement=placement)
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
    runs, acc = E.absolute_position_runs(
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


CAPSTONE_BAD_INPUTS = [
    (
        "capstone_model",
        lambda: E.capstone_model("ring"),
        ValueError,
        r"position must be",
    ),
    (
        "capstone_model",
        lambda: E.capstone_model("rope", dim=30),
        ValueError,
        r"dim must be divisible by num_heads",
    ),
    (
        "train_capstone_scheme",
        lambda: E.train_capstone_scheme("rope", (0, 0), budgets=(1,)),
        ValueError,
        r"seed_list must not repeat a seed, got \(0, 0\)",
    ),
    (
        "train_capstone_scheme",
        lambda: E.train_capstone_scheme("rope", 3, budgets=(1,)),
        TypeError,
        r"seed_list must be a non-empty sequence of ints, got 3",
    ),
    (
        "train_capstone_scheme",
        lambda: E.train_capstone_scheme("rope", (0,), budgets=(2, 2)),
        ValueError,
        r"budgets must be distinct step counts, got \(2, 2\)",
    ),
    (
        "train_capstone_scheme",
        lambda: E.train_capstone_scheme("rope", (0,), budgets=(0,)),
        ValueError,
        r"budgets\[0\] must be a positive int, got 0",
    ),
    (
        "position_accuracies",
        lambda: E.position_accuracies([tiny()]),
        TypeError,
        r"runs must be a SeedRuns",
    ),
    (
        "band_accuracy",
        lambda: E.band_accuracy(torch.zeros(2, 8), {"a": (4, 9)}),
        ValueError,
        r"bands\['a'\] must be \(start, stop\) with 0 <= start < stop <= 8, got \(4, 9\)",
    ),
    (
        "band_accuracy",
        lambda: E.band_accuracy(torch.zeros(8), {"a": (0, 4)}),
        ValueError,
        r"per_position must",
    ),
    (
        "band_accuracy",
        lambda: E.band_accuracy(torch.zeros(2, 8), {}),
        TypeError,
        r"bands must be a non-empty dict",
    ),
    (
        "first_step_below",
        lambda: E.first_step_below([1.0], 0.5, window=0),
        ValueError,
        r"window must be a positive int, got 0",
    ),
    (
        "first_relapse",
        lambda: E.first_relapse([1.0], low=1.0, high=0.5),
        ValueError,
        r"low must be below high, got low=1.0, high=0.5",
    ),
    (
        "warmup_runs",
        lambda: E.warmup_runs((0,), configs={"x": ("middle", 0)}),
        ValueError,
        r"configs\['x'\] placement must be",
    ),
    (
        "warmup_runs",
        lambda: E.warmup_runs((0,), configs={"x": ("post", -1)}),
        ValueError,
        r"configs\['x'\] warm-up must be an int >= 0, got -1",
    ),
    (
        "first_adamw_step",
        lambda: E.first_adamw_step((0,), lr=0.0),
        ValueError,
        r"lr must be a real number > 0, got 0.0",
    ),
    (
        "absolute_position_runs",
        lambda: E.absolute_position_runs("rope", (0,), steps=1, targets=3),
        TypeError,
        r"targets must be",
    ),
    (
        "absolute_position_runs",
        lambda: E.absolute_position_runs(
            "rope", (0,), steps=1, targets=_mod5, eval_length=0
        ),
        ValueError,
        r"eval_length must be a positive int, got 0",
    ),
]


@pytest.mark.parametrize(
    ("name", "thunk", "error", "match"),
    CAPSTONE_BAD_INPUTS,
    ids=[f"{case[0]}-{i}" for i, case in enumerate(CAPSTONE_BAD_INPUTS)],
)
def test_capstone_bad_input_raises_a_named_error(
    name: str, thunk: object, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        thunk()  # type: ignore[operator]


# ---- The modern layer's experiments (chapter 9) --------------------------------------


def test_stability_runs_are_run_seeds_of_the_chapters_configurations() -> None:
    from companion import modern

    runs = E.stability_runs((3,), steps=2, labels=["QK-norm, lr 0.3"])
    assert list(runs) == ["QK-norm, lr 0.3"]
    (net,) = runs["QK-norm, lr 0.3"].models
    assert isinstance(net, modern.ModernTinyTransformer)
    assert net.attention_kind == "qk_norm" and net.config == E.MODERN_SIZES
    # the same as run_seeds with the chapter's task and rate, bit for bit
    direct = E.run_seeds(
        lambda: modern.ModernTinyTransformer(E.MODERN_SIZES, attention="qk_norm"),
        (3,),
        steps=2,
        lr=0.3,
        **E.MODERN_TASK,
    )
    assert runs["QK-norm, lr 0.3"].losses == direct.losses
    all_runs = E.stability_runs((0,), steps=1)
    assert list(all_runs) == list(E.STABILITY_RUNS)


def test_measure_stability_against_the_attention_it_reads() -> None:
    from companion import model as M
    from companion import modern

    runs = E.stability_runs((0, 1), steps=3)
    probe = E.modern_probe(8)
    assert probe.shape == (8, 16)
    assert torch.equal(probe, E.modern_probe(8))  # no training seed, no variant
    for label, r in runs.items():
        m = E.measure_stability(r, probe)
        assert m.final.shape == (2,) and m.layer_logit.shape == (2, 2)
        for i, net in enumerate(r.models):
            scores = modern.attention_maps(net, probe, scores=True)
            top = [s[s.isfinite()].abs().max().item() for s in scores]
            assert m.layer_logit[i].tolist() == pytest.approx(top)
            assert m.largest_logit[i].item() == pytest.approx(max(top))
            assert m.accuracy[i].item() == M.accuracy(net, length=16, lag=2)
            assert m.final[i].item() == pytest.approx(sum(r.losses[i][-20:]) / 3)
            assert m.lowest[i].item() == pytest.approx(sum(r.losses[i]) / 3)
            assert m.spike[i].isnan()  # three steps: no loss below 0.01 yet
            # one-hot rows, counted row by row from the weights (queries t >= 1)
            weights = modern.attention_maps(net, probe)  # (layers, B, H, L, L)
            rows = [
                float(weights[a, b, h, t, : t + 1].max() > 0.99)
                for a in range(2) for b in range(8) for h in range(4)
                for t in range(1, 16)
            ]  # fmt: skip
            assert m.one_hot[i].item() == pytest.approx(sum(rows) / len(rows))
        kind = E.STABILITY_RUNS[label][0]
        assert m.bound.isnan().all().item() == (kind != "qk_norm")
        assert m.saturated.isnan().all().item() == (kind != "softcap")
        if kind == "qk_norm":
            assert (m.layer_logit <= m.bound).all() and (m.gain > 0).all()
        if kind != "softcap":
            assert torch.equal(m.raw_logit, m.largest_logit)


def test_measure_stability_reads_the_spike_after_the_first_low_step() -> None:
    # a curve that gets below 0.01, spikes to 2.5, falls again: the spike is 2.5; the
    # lowest 20-step mean is the mean of its best window; the final mean its last 20
    net = M_tiny()
    curve = [3.0] * 10 + [0.005] * 25 + [2.5] + [0.002] * 24
    m = E.measure_stability(E.SeedRuns((0,), [curve], [net]), E.modern_probe(2))
    assert m.spike.item() == 2.5
    assert m.lowest.item() == pytest.approx(0.002)
    assert m.final.item() == pytest.approx(0.002)
    late = [3.0] * 10 + [0.005] * 30 + [1.0] * 20  # a spike at the very end
    m = E.measure_stability(E.SeedRuns((0,), [late], [net]), E.modern_probe(2))
    assert m.spike.item() == 1.0 and m.final.item() == 1.0
    assert m.lowest.item() == pytest.approx(0.005)
    # uniform attention (zero queries) is nowhere one-hot past query 0
    with torch.no_grad():
        for layer in _attention_layers(net):
            for p in layer.q_proj.parameters():
                p.zero_()
    m = E.measure_stability(E.SeedRuns((0,), [late], [net]), E.modern_probe(2))
    assert m.one_hot.item() == 0.0


def test_stability_runs_take_the_exported_settings() -> None:
    import inspect

    defaults = inspect.signature(E.stability_runs).parameters
    assert defaults["steps"].default == E.STABILITY_STEPS == 200
    assert defaults["cap"].default == E.STABILITY_CAP == 5.0


def test_lag_weight_of_uniform_attention_is_one_over_the_prefix() -> None:
    # zero queries: query t spreads evenly over t + 1 keys, so the key two back gets
    # 1/(t + 1); averaged over t = 2 .. 15, a loop-computed oracle
    net = E.build(lambda: M_tiny(), 0)
    with torch.no_grad():
        for layer in _attention_layers(net):
            for p in layer.q_proj.parameters():
                p.zero_()
    got = E.lag_weight([net, net], E.modern_probe(4))
    assert got.shape == (2, 2, 4) and got.dtype == torch.float64
    want = sum(1 / (t + 1) for t in range(2, 16)) / 14
    torch.testing.assert_close(got, torch.full_like(got, want), atol=1e-6, rtol=0)
    lag5 = E.lag_weight([net], E.modern_probe(4), lag=5)
    assert lag5[0, 1, 3].item() == pytest.approx(
        sum(1 / (t + 1) for t in range(5, 16)) / 11, abs=1e-6
    )


def test_lag_weight_reads_the_key_lag_places_back() -> None:
    # an initialized model's maps: the oracle is the loop over sequences and queries
    from companion import modern

    net = E.build(lambda: M_tiny(), 1)
    probe = E.modern_probe(3)
    maps = modern.attention_maps(net, probe)  # (layers, B, H, L, L)
    got = E.lag_weight([net], probe)[0]
    for layer in range(2):
        for h in range(4):
            vals = [
                maps[layer, b, h, t, t - 2].item()
                for b in range(3)
                for t in range(2, 16)
            ]
            assert got[layer, h].item() == pytest.approx(sum(vals) / len(vals))


def test_first_attention_step_is_lr_times_the_sign_of_the_gradient() -> None:
    """Oracle: AdamW's first update is lr * g / (|g| + eps) on the first batch of the
    seed (m_hat = g, v_hat = g^2), for W_Q and W_K of both layers."""
    got = E.first_attention_step((2,), lr=0.3)
    assert got["step"].shape == got["initial"].shape == (1, 2, 2, 32, 32)
    net = E.build(lambda: M_tiny(), 2)
    x, y = M.lag_task(
        32, 16, lag=2, vocab_size=16, generator=torch.Generator().manual_seed(2)
    )
    F.cross_entropy(net(x).flatten(0, 1), y.flatten()).backward()
    for a, layer in enumerate(_attention_layers(net)):
        for b, w in enumerate((layer.q_proj.weight, layer.k_proj.weight)):
            torch.testing.assert_close(got["initial"][0, a, b], w.detach().double())
            want = (0.3 * w.grad / (w.grad.abs() + 1e-8)).abs().double()
            torch.testing.assert_close(got["step"][0, a, b], want, atol=2e-6, rtol=1e-4)


def test_measure_stability_reads_a_saturated_cap_and_its_zero_slope() -> None:
    # an oracle: scale W_Q of a soft-capped model by 1e4 - its raw scores are the
    # plain model's with the same weights, and tanh rounds to +-1 almost everywhere
    from companion import modern

    runs = E.stability_runs((0,), steps=1, labels=["soft-cap 5, lr 0.3"])
    (net,) = runs["soft-cap 5, lr 0.3"].models
    with torch.no_grad():
        for layer in _attention_layers(net):
            layer.q_proj.weight.mul_(1e4)
    probe = E.modern_probe(4)
    m = E.measure_stability(runs["soft-cap 5, lr 0.3"], probe)
    plain = modern.ModernTinyTransformer(E.MODERN_SIZES, attention="rope")
    plain.load_state_dict(net.state_dict())
    raw = modern.attention_maps(plain, probe, scores=True)
    assert m.raw_logit.item() == pytest.approx(raw[raw.isfinite()].abs().max().item())
    assert m.raw_logit.item() > 1e3 and m.largest_logit.item() <= 5.0
    s = raw[raw.isfinite()]
    want_zero = ((s / 5.0).abs() > 9.1).double().mean().item()  # tanh(9.1) = 1 in fp32
    assert m.zero_slope.item() == pytest.approx(want_zero, abs=0.02)
    assert m.saturated.item() > 0.9 and m.zero_slope.item() > 0.5


def test_first_token_mass_of_uniform_attention_is_the_even_share() -> None:
    # zero query weights: every score 0, each query spreads evenly over its prefix, so
    # the first token gets 1/(t + 1) at query t - the even share, a loop-computed oracle
    net = E.build(lambda: M_tiny(), 0)
    with torch.no_grad():
        for layer in _attention_layers(net):
            for p in layer.q_proj.parameters():  # weight and bias: every query 0
                p.zero_()
    even = sum(1 / (t + 1) for t in range(4, 16)) / 12
    assert E.uniform_first_token_share(16, start=4) == pytest.approx(even)
    mass = E.first_token_mass([net, net], E.modern_probe(4))
    assert mass.shape == (2, 2, 4) and mass.dtype == torch.float64
    torch.testing.assert_close(mass, torch.full_like(mass, even), atol=1e-6, rtol=0)
    later = E.first_token_mass([net], E.modern_probe(4), start=10)
    assert later[0, 0, 0].item() == pytest.approx(
        sum(1 / (t + 1) for t in range(10, 16)) / 6, abs=1e-6
    )


def _attention_layers(net: torch.nn.Module) -> list:
    from companion.model import CausalSelfAttention

    return [m for m in net.modules() if isinstance(m, CausalSelfAttention)]


def M_tiny():
    from companion import modern

    return modern.ModernTinyTransformer(E.MODERN_SIZES, attention="rope")


MODERN_BAD_INPUTS = [
    ("stability_runs", lambda: E.stability_runs((0,), steps=0), ValueError, r"^steps"),
    ("stability_runs", lambda: E.stability_runs((0,), cap=0.0), ValueError, r"^cap"),
    (
        "stability_runs",
        lambda: E.stability_runs((0,), labels=["plain"]),
        ValueError,
        r"^labels must be one of",
    ),
    (
        "stability_runs",
        lambda: E.stability_runs((0,), labels="plain, lr 0.3"),
        TypeError,
        r"^labels must be a sequence of run labels",
    ),
    ("stability_runs", lambda: E.stability_runs(5), TypeError, r"^seed_list"),
    ("modern_probe", lambda: E.modern_probe(0), ValueError, r"^num_sequences"),
    (
        "measure_stability",
        lambda: E.measure_stability([1, 2]),
        TypeError,
        r"^runs must be a SeedRuns",
    ),
    (
        "measure_stability",
        lambda: E.measure_stability(
            E.SeedRuns((0,), [[1.0]], [M_tiny()]), torch.zeros(2, 16)
        ),
        TypeError,
        r"^probe must be",
    ),
    (
        "StabilityMeasures",
        lambda: E.StabilityMeasures(*([torch.zeros(2)] * 11), [1.0]),
        TypeError,
        r"^gain must be a torch",
    ),
    (
        "StabilityMeasures",
        lambda: E.StabilityMeasures(*([torch.zeros(2)] * 11), torch.zeros(3)),
        ValueError,
        r"^gain must have size 2",
    ),
    (
        "uniform_first_token_share",
        lambda: E.uniform_first_token_share(16, start=16),
        ValueError,
        r"^start must be less than length \(16\), got 16",
    ),
    (
        "uniform_first_token_share",
        lambda: E.uniform_first_token_share(0),
        ValueError,
        r"^length",
    ),
    ("first_token_mass", lambda: E.first_token_mass([]), TypeError, r"^models must"),
    (
        "first_token_mass",
        lambda: E.first_token_mass([torch.nn.Linear(2, 2)]),
        TypeError,
        r"^models\[0\] must",
    ),
    (
        "first_token_mass",
        lambda: E.first_token_mass([M_tiny()], E.modern_probe(2), start=16),
        ValueError,
        r"^start must be less than the probe's length \(16\)",
    ),
    ("lag_weight", lambda: E.lag_weight([]), TypeError, r"^models must"),
    (
        "lag_weight",
        lambda: E.lag_weight([torch.nn.Linear(2, 2)]),
        TypeError,
        r"^models\[0\] must",
    ),
    (
        "lag_weight",
        lambda: E.lag_weight([M_tiny()], E.modern_probe(2), lag=16),
        ValueError,
        r"^lag must be less than the probe's length \(16\), got 16",
    ),
    ("lag_weight", lambda: E.lag_weight([M_tiny()], lag=0), ValueError, r"^lag"),
    (
        "lag_weight",
        lambda: E.lag_weight([M_tiny()], torch.zeros(2, 16)),
        TypeError,
        r"^probe must be",
    ),
    (
        "first_attention_step",
        lambda: E.first_attention_step(0),
        TypeError,
        r"^seed_list must be a non-empty sequence",
    ),
    (
        "first_attention_step",
        lambda: E.first_attention_step((0,), lr=0.0),
        ValueError,
        r"^lr",
    ),
]


@pytest.mark.parametrize(
    ("name", "thunk", "error", "match"),
    MODERN_BAD_INPUTS,
    ids=[f"{case[0]}-{i}" for i, case in enumerate(MODERN_BAD_INPUTS)],
)
def test_modern_bad_input_raises_a_named_error(
    name: str, thunk: object, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        thunk()  # type: ignore[operator]


def test_chapter_settings_are_the_ones_their_prose_states() -> None:
    """The position-family and capstone chapters and their claims tests read these
    constants (one home, so the test and the chapter cannot drift); the prose states
    their values: three seeds per
    scheme, T5 again over six; budgets of 500 and 1,000 steps at a peak rate of 1e-2
    after 50 warm-up steps; the warm-up experiment's six seeds, 150 steps at 3e-2; the
    third exercise's 100 steps for the learned table and 600 for RoPE."""
    assert (E.POSITION_FAMILY_SEEDS, E.POSITION_FAMILY_T5_SEEDS) == (3, 6)
    assert E.POSITION_FAMILY_STEPS["t5"] == 400
    assert E.CAPSTONE_SEEDS == 3 and E.CAPSTONE_BUDGETS == (500, 1000)
    assert (E.CAPSTONE_LR, E.CAPSTONE_WARMUP_STEPS) == (1e-2, 50)
    assert (E.WARMUP_RUN_SEEDS, E.WARMUP_RUN_STEPS, E.WARMUP_RUN_LR) == (6, 150, 3e-2)
    assert E.ABSOLUTE_STEPS == {"learned": 100, "rope": 600}
    assert E.WARMUP_CONFIGS["post-LN + warm-up"] == ("post", 30)
