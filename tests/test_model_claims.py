"""The trained claims of the capstone (book/07_tiny_transformer), asserted here.

Each test calls the same function of :mod:`companion.capstone` as the chapter, with the
chapter's settings and seed counts (constants of ``companion.capstone``, which the
chapter reads too; every model built and trained by :mod:`companion.experiments`), and asserts the chapter's bounds: ``make claims``
(``scripts/claims.py``) reruns them with the initial weights perturbed by ``1 +- 1e-7``,
on one thread, with ATen's portable kernels and on other seeds, and a bound is kept only
if it holds in every variant. The experiments are module-scoped
fixtures, so each trains once per run of this file.
"""

from __future__ import annotations

import math

import pytest
import torch

from companion import capstone, experiments
from companion.rope import rope_frequencies

pytestmark = pytest.mark.trained(chapter=7)

SCHEMES = ("none", "sinusoidal", "rope", "alibi")
# the chapter's settings, from the one home both read (so the two cannot drift)
BUDGETS = capstone.CAPSTONE_BUDGETS  # per scheme: the larger gives the results
FULL = {s: max(b) for s, b in BUDGETS.items()}
HALF = {s: min(b) for s, b in BUDGETS.items()}
COMMON = min(FULL.values())  # every scheme at the same budget (review R5-2)
L0 = capstone.CAPSTONE_TASK["length"]  # 16
LAG = capstone.CAPSTONE_TASK["lag"]  # 2
EVAL = capstone.CAPSTONE_EVAL_LENGTH  # 64
BANDS = {"trained": (LAG, L0), "to 2x": (L0, 2 * L0), "to 4x": (2 * L0, EVAL)}
TRAINED, TO_2X, TO_4X = range(3)


def _bag_of_tokens(start: int, stop: int) -> float:
    """The bag-of-tokens baseline over positions ``start..stop - 1`` of the evaluation
    batch: guess the most frequent earlier token (ties split), as the chapter computes
    it."""
    from companion.model import lag_task

    tokens = lag_task(
        256, EVAL, lag=LAG, vocab_size=16, generator=torch.Generator().manual_seed(1234)
    )[0]
    one_hot = torch.nn.functional.one_hot(tokens, 16)
    counts = (one_hot.cumsum(dim=1) - one_hot)[:, LAG:]
    best = counts.max(dim=-1).values
    ties = (counts == best[..., None]).sum(dim=-1)
    hit = counts.gather(-1, tokens[:, :-LAG, None]).squeeze(-1) == best
    per_position = (hit.double() / ties).mean(dim=0)  # t = LAG ..
    return per_position[start - LAG : stop - LAG].mean().item()


@pytest.fixture(scope="module")
def schemes() -> dict:
    """The chapter's scheme comparison: every scheme, seeds(CAPSTONE_SEEDS), at both
    of its budgets."""
    torch.manual_seed(0)
    results = {}
    for scheme in SCHEMES:
        for steps, r in capstone.train_capstone_scheme(
            scheme,
            experiments.seeds(capstone.CAPSTONE_SEEDS),
            budgets=BUDGETS[scheme],
            lr=capstone.CAPSTONE_LR,
            warmup_steps=capstone.CAPSTONE_WARMUP_STEPS,
        ).items():
            results[scheme, steps] = r
    per_position = {
        key: capstone.position_accuracies(r, length=EVAL, lag=LAG)
        for key, r in results.items()
    }
    band = {key: capstone.band_accuracy(a, BANDS) for key, a in per_position.items()}
    full = {s: band[s, FULL[s]] for s in SCHEMES}
    return {
        "results": results,
        "per_position": per_position,
        "lo": {s: a.min(dim=0).values for s, a in full.items()},
        "hi": {s: a.max(dim=0).values for s, a in full.items()},
        "mean": {s: a.mean(dim=0) for s, a in full.items()},
        "half": {s: band[s, HALF[s]].mean(dim=0) for s in SCHEMES},
        "same": {s: band[s, COMMON] for s in SCHEMES},  # (seeds, bands)
    }


def test_none_and_alibi_are_still_learning_at_the_budget(schemes: dict) -> None:
    final = {key: r.final(100) for key, r in schemes["results"].items()}
    first = torch.tensor([c[0] for r in schemes["results"].values() for c in r.losses])
    assert (first > math.log(16)).all()
    for s in ("none", "alibi"):
        assert (final[s, FULL[s]] < final[s, HALF[s]]).all(), s


def test_rope_and_sinusoidal_end_near_zero_at_both_budgets(schemes: dict) -> None:
    """The chapter: RoPE and the sinusoidal encoding end below 0.01 nats (mean over the
    last 100 steps) at both budgets, in every seed."""
    for s in ("rope", "sinusoidal"):
        for steps in BUDGETS[s]:
            assert (schemes["results"][s, steps].final(100) < 0.01).all(), (s, steps)


def test_trained_models_are_causal_so_one_evaluation_serves_every_band(
    schemes: dict,
) -> None:
    """The chapter's check: on the same tokens, a trained model's logits at t < L0 do
    not depend on the input's length."""
    from companion.model import lag_task

    tokens = lag_task(
        32, EVAL, lag=LAG, vocab_size=16, generator=torch.Generator().manual_seed(1234)
    )[0]
    for r in schemes["results"].values():
        for net in r.models:
            with torch.no_grad():
                gap = (net(tokens[:, :L0]) - net(tokens)[:, :L0]).abs().max().item()
            assert gap < 1e-5


def test_with_positions_the_trained_positions_are_solved(schemes: dict) -> None:
    for s in ("sinusoidal", "rope", "alibi"):
        assert schemes["lo"][s][TRAINED] > 0.98, s


def test_without_positions_between_the_baseline_and_solved(schemes: dict) -> None:
    lo, hi, mean, half = (schemes[k]["none"] for k in ("lo", "hi", "mean", "half"))
    assert 0.7 < lo[TRAINED] and hi[TRAINED] < 0.95
    assert lo[TRAINED] > _bag_of_tokens(LAG, L0) + 0.3
    assert (mean[:-1] > mean[1:]).all() and (mean > half).all()


def test_sinusoidal_fails_past_the_training_length(schemes: dict) -> None:
    hi, mean = schemes["hi"], schemes["mean"]
    assert hi["sinusoidal"][TO_2X] < 0.5 and hi["sinusoidal"][TO_4X] < 0.3
    assert mean["sinusoidal"][TO_4X] < mean["none"][TO_4X] + 0.05
    same = schemes["same"]  # and with both at the same budget
    assert same["sinusoidal"][:, TO_4X].mean() < same["none"][:, TO_4X].mean() + 0.05


def test_rope_is_perfect_to_twice_the_length_and_fails_after(schemes: dict) -> None:
    lo, hi = schemes["lo"], schemes["hi"]
    assert lo["rope"][TO_2X] > 0.99 and hi["rope"][TO_4X] < 0.35
    rope = schemes["per_position"]["rope", FULL["rope"]]  # (seeds, EVAL)
    late = rope[:, 40:].mean(dim=1)  # t = 40..63
    assert (late < _bag_of_tokens(40, EVAL)).all()  # below the baseline, every seed
    assert (schemes["half"]["rope"] - schemes["mean"]["rope"]).abs().max() < 0.02
    config = schemes["results"]["rope", FULL["rope"]].models[0].config
    theta_1 = rope_frequencies(config.dim // config.num_heads, base=config.rope_base)[1]
    assert 2 * L0 - 1 < math.pi / theta_1.item() < 2 * L0  # the sine part's sign flip


def test_rope_attends_to_an_alias_of_the_answer_past_twice_the_length(
    schemes: dict,
) -> None:
    """The chapter's reading of RoPE's failure (issue 32's second review, finding 1): at
    t = 50 the last layer's most attended key (mean over 64 probe sequences and the
    heads) takes more than half of the row and is one of the two keys past pi / theta_1
    (where the second pair's sine part has changed sign) that the query sees whose
    angle under the fastest pair is closest to the answer's, modulo a turn (40 and 46
    back; no threshold, R2 #1); what pair 1 gives it over the answer exceeds what pairs
    0, 2 and 3 give either key over the other (every seed)."""
    from companion.model import lag_task
    from companion.position_comparison import most_attended_key, pair_alias_offsets

    nets = schemes["results"]["rope", FULL["rope"]].models
    config = nets[0].config
    theta = rope_frequencies(config.dim // config.num_heads, base=config.rope_base)
    offsets = pair_alias_offsets(theta[0].item(), lag=LAG, length=EVAL)
    half_turn = math.pi / theta[1].item()
    past = [d for d in range(51) if d > half_turn]
    far = sorted(past, key=lambda d: abs(offsets[d].item()))[:2]
    assert sorted(far) == [40, 46]
    probe = lag_task(
        64, EVAL, lag=LAG, vocab_size=16, generator=torch.Generator().manual_seed(1)
    )[0]
    top = most_attended_key(nets, probe, query=50, lag=LAG)
    gap = top.gap.sum(dim=1)
    for i in range(len(nets)):
        assert int(top.distance[i]) in far and top.weight[i] > 0.5
        assert gap[i, 1] > gap[i, 0].abs() + gap[i, 2:].abs().sum()


def test_alibi_degrades_least_past_twice_and_learns_slowest(schemes: dict) -> None:
    lo, hi, mean, half = (schemes[k] for k in ("lo", "hi", "mean", "half"))
    assert lo["alibi"][TO_4X] > 0.8
    for s in ("none", "sinusoidal", "rope"):
        assert lo["alibi"][TO_4X] > hi[s][TO_4X], s
    assert all(COMMON in BUDGETS[s] for s in SCHEMES)
    same = schemes["same"]  # every scheme at the same budget: not ALiBi's extra steps
    for s in ("none", "sinusoidal", "rope"):
        assert same["alibi"][:, TO_4X].min() > same[s][:, TO_4X].max(), s
    assert hi["alibi"][TO_2X] < lo["rope"][TO_2X]
    first_below = {
        s: [
            capstone.first_step_below(c, 0.5)
            for c in schemes["results"][s, FULL[s]].losses
        ]
        for s in ("sinusoidal", "rope", "alibi")
    }
    fast = first_below["sinusoidal"] + first_below["rope"]
    assert None not in fast
    assert all(n is None or n > max(fast) for n in first_below["alibi"])
    first_same = {  # the same, every scheme with the same schedule
        s: [
            capstone.first_step_below(c, 0.5)
            for c in schemes["results"][s, COMMON].losses
        ]
        for s in ("sinusoidal", "rope", "alibi")
    }
    fast_same = first_same["sinusoidal"] + first_same["rope"]
    assert None not in fast_same
    assert all(n is None or n > max(fast_same) for n in first_same["alibi"])
    for s in ("rope", "sinusoidal"):
        assert hi["alibi"][TRAINED] < lo[s][TRAINED], s
    assert (mean["alibi"] > half["alibi"]).all()


# ---- Post-LN and Pre-LN, with and without warm-up --------------------------------------


def test_adams_first_step_is_the_same_in_both_placements_at_depth_4() -> None:
    lr = capstone.WARMUP_RUN_LR
    premise = capstone.first_adamw_step(
        experiments.seeds(capstone.WARMUP_RUN_SEEDS), lr=lr
    )
    post, pre = premise["post"], premise["pre"]
    dim = capstone.CAPSTONE_SIZES["dim"]  # the top MLP's output matrix: dim x 4 dim
    expected = torch.full_like(post[:, 1], lr * math.sqrt(dim * 4 * dim))
    torch.testing.assert_close(post[:, 1], expected, rtol=1e-3, atol=0)
    torch.testing.assert_close(pre[:, 1], expected, rtol=1e-3, atol=0)
    ratio = post / pre
    # bounds with room (issue 32's second review): over 600 other seeds (200-799) the
    # gradient ratio reached 1.26 and the logit ratio 1.13; the earlier < 1.2 and < 1.1
    # held for seeds 0-5 and 100-105 but not for every seed
    assert (ratio[:, 0] < 1.5).all()
    assert (post[:, 2] > 1).all() and (pre[:, 2] > 1).all()
    assert (ratio[:, 2] < 1.25).all()


@pytest.fixture(scope="module")
def warmup() -> dict[str, experiments.SeedRuns]:
    """The chapter's warm-up experiment: seeds(WARMUP_RUN_SEEDS), its steps and rate,
    four layers."""
    return capstone.warmup_runs(
        experiments.seeds(capstone.WARMUP_RUN_SEEDS),
        steps=capstone.WARMUP_RUN_STEPS,
        lr=capstone.WARMUP_RUN_LR,
    )


def _learned(runs: experiments.SeedRuns) -> int:
    """Seeds whose loss got below 0.1 nats at some step."""
    return sum(min(c) < 0.1 for c in runs.losses)


def _lost(runs: experiments.SeedRuns) -> int:
    """Seeds back above 1 nat after they had got below 0.1."""
    return sum(capstone.first_relapse(c) is not None for c in runs.losses)


def test_without_warmup_pre_ln_trains_and_post_ln_mostly_never_learns(
    warmup: dict[str, experiments.SeedRuns],
) -> None:
    """Pre-LN learns in every seed and never loses it again; Post-LN without warm-up
    learns in at most two of the six seeds (which ones is chaotic: not asserted)."""
    pre, n = warmup["pre-LN"], len(warmup["pre-LN"].seeds)
    assert _learned(pre) == n and _lost(pre) == 0
    assert (pre.final(10) < 0.1).all()
    assert _learned(warmup["post-LN"]) <= 2


def test_with_warmup_every_post_ln_seed_learns(
    warmup: dict[str, experiments.SeedRuns],
) -> None:
    """Every Post-LN seed with warm-up gets below 0.1 nats. How many lose it again
    afterwards is not a claim (5 of 6 on seeds 0-5, 1 of 6 on seeds 100-105, in one
    build): the chapter prints the count and states no bound on it."""
    warm = warmup["post-LN + warm-up"]
    assert _learned(warm) == len(warm.seeds)


# ---- The third exercise: t mod 5 -------------------------------------------------------


def _mod5(tokens: torch.Tensor) -> torch.Tensor:
    return (torch.arange(tokens.shape[1]) % 5).expand_as(tokens).clone()


def test_absolute_positions_learned_table_at_once_rope_slowly_neither_beyond() -> None:
    seeds = experiments.seeds(capstone.CAPSTONE_SEEDS)
    steps = capstone.ABSOLUTE_STEPS  # learned: 100, rope: 600
    table, table_acc = capstone.absolute_position_runs(
        "learned", seeds, steps=steps["learned"], targets=_mod5, eval_length=2 * L0
    )
    rope, rope_acc = capstone.absolute_position_runs(
        "rope", seeds, steps=steps["rope"], targets=_mod5, eval_length=2 * L0
    )
    assert (table_acc[:, :L0].mean(dim=1) > 0.99).all()
    assert all(
        n is not None and n <= 60
        for n in (capstone.first_step_below(c, 0.1) for c in table.losses)
    )
    # bounds with room (claims run of issue 32's second review: seed 101's RoPE got below
    # 0.1 nats at step 274, against > 300 before; measured over seeds 0-5 and 100-108:
    # RoPE first below 0.1 at >= 274 or never, accuracy on t < 16 >= 0.898, last 100
    # steps below steps 200-299 in every seed (not below 300-399: seed 105), beyond L0
    # at most 0.319; the table below 0.1 by step 47)
    assert (rope_acc[:, :L0].mean(dim=1) > 0.85).all()
    assert all(
        n is None or n > 200
        for n in (capstone.first_step_below(c, 0.1) for c in rope.losses)
    )
    assert all(sum(c[-100:]) < sum(c[200:300]) for c in rope.losses)
    for acc in (table_acc, rope_acc):
        assert (acc[:, L0:].mean(dim=1) < 0.4).all()
