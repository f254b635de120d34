"""Numbers the chapter on the rest of the position family (book/04_relative_positions)
states, asserted here; the trained ones (marked ``trained``) call the chapter's own
``companion.position_comparison.compare_position_schemes`` and assert the chapter's bounds.

T5's buckets at its defaults (32 buckets, max_distance 128): the encoder's 16 buckets of
one direction start at distances 0-7 (exact), then 8, 12, 16, 23, 32, 46, 64, 91, and
every distance from 91 on shares the last; the decoder's 32 past buckets are exact to 15,
then logarithmic from 16 to 113. Phi-3-mini-128k's LongRoPE attention factor,
sqrt(1 + ln 32 / ln 4096) = 1.1902. Men et al.'s lower bound of the base at D = 128 and
L = 1024 is 4.29e3 (the paper's table: 4.3e3), and the admissible bases above it are
not an interval. The oracles are Hugging Face's T5 code, the formula, and a brute-force
check of B(m) >= 0 for every m.
"""

from __future__ import annotations

import math

import pytest
import torch

from companion.position_comparison import most_attended_key, pair_alias_offsets
from companion.relative import t5_relative_position_bucket
from companion.rope import rope_frequencies
from companion.rope_variants import (
    longrope_attention_factor,
    rope_base_lower_bound,
    rope_decay_sum,
)

transformers = pytest.importorskip("transformers")
from transformers.models.t5.modeling_t5 import T5Attention  # noqa: E402


def _first_distance_per_bucket(bidirectional: bool, buckets: int) -> list[int]:
    distance = torch.arange(0, 400)
    bucket = t5_relative_position_bucket(-distance, bidirectional=bidirectional)
    theirs = T5Attention._relative_position_bucket(
        -distance, bidirectional=bidirectional
    )
    assert torch.equal(bucket, theirs)
    return [int(distance[bucket == k][0]) for k in range(buckets)]


def test_t5_encoder_bucket_edges() -> None:
    edges = _first_distance_per_bucket(True, 16)
    assert edges == [0, 1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 23, 32, 46, 64, 91]
    # a key in the future: the same edges, 16 buckets up
    future = t5_relative_position_bucket(torch.tensor([1, 8, 91, 10**6]))
    assert future.tolist() == [17, 24, 31, 31]


def test_t5_decoder_bucket_edges() -> None:
    edges = _first_distance_per_bucket(False, 32)
    assert edges[:17] == list(range(17))
    assert edges[16:] == [
        16,
        19,
        21,
        24,
        27,
        31,
        35,
        40,
        46,
        52,
        59,
        67,
        77,
        87,
        99,
        113,
    ]
    # every future key shares bucket 0 with the query itself
    assert t5_relative_position_bucket(
        torch.tensor([0, 1, 500]), bidirectional=False
    ).tolist() == [0, 0, 0]


def test_phi3_longrope_attention_factor() -> None:
    factor = longrope_attention_factor(131072 / 4096, 4096)
    assert factor == pytest.approx(math.sqrt(1 + math.log(32) / math.log(4096)))
    assert round(factor, 4) == 1.1902


def test_base_bound_at_1024_matches_the_paper() -> None:
    bound = rope_base_lower_bound(1024, 128)
    assert round(bound, -1) == 4290.0
    assert abs(bound / 4.3e3 - 1) < 0.01  # Men et al., Table: 4.3e3 for 1k
    m = torch.arange(1025)
    assert float(rope_decay_sum(m, 128, base=bound).min()) >= 0
    assert float(rope_decay_sum(m, 128, base=4200.0).min()) < 0
    assert float(rope_decay_sum(m, 128, base=5000.0).min()) < 0  # the gap above it


# ---- the chapter's other numbers ----------------------------------------------------


def test_real_models_against_the_decay_sum() -> None:
    """The table of the section on the base: min B(m) over m <= context, the first
    negative m, the critical dimension (D = 128)."""
    from companion.rope_variants import critical_dimension

    expected = {  # base, context -> (min B rounded, first negative m, critical dim)
        (1e4, 4096): (-8.36, 1707, 92),
        (5e5, 8192): (5.97, None, 70),
        (1e6, 32768): (-0.78, 27115, 80),
        (5e5, 131072): (-14.53, 18438, 98),
    }
    for (base, context), (low, first, dims) in expected.items():
        b = rope_decay_sum(torch.arange(context + 1), 128, base=base)
        assert round(float(b.min()), 2) == low
        negative = torch.nonzero(b < 0).flatten()
        assert (int(negative[0]) if negative.numel() else None) == first
        assert critical_dimension(128, base, context) == dims
    assert critical_dimension(8, 1e4, 16) == 2  # the test bench


def test_nope_signal_shrinks() -> None:
    from companion.relative import nope_position_readout

    out, position = nope_position_readout(64)
    assert (position - torch.arange(64.0, dtype=torch.float64)).abs().max() < 1e-10
    ratio = (out[15] - out[16]) / (out[62] - out[63])
    assert round(float(ratio), 1) == 14.8


def test_from_hf_copies_longrope_and_every_rope_type() -> None:
    """The LongRoPE section: from_hf copies longrope (every family with RoPE) and
    every RoPE type of transformers' ROPE_INIT_FUNCTIONS, 'proportional' (Gemma 4's
    p-RoPE) included."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from companion.decoder import ROPE_TYPES

    assert "longrope" in ROPE_TYPES and "proportional" in ROPE_TYPES
    assert sorted(set(ROPE_INIT_FUNCTIONS) - set(ROPE_TYPES)) == []


def _bench_offset(d: int) -> float:
    """Pair 0's offset of a key d back from the answer (2 back) in the bench (D = 8,
    b = 1e4, theta_0 = 1), by math.remainder (nearest whole turn)."""
    theta_0 = rope_frequencies(8, base=1e4).double()[0].item()
    return math.remainder((d - 2) * theta_0, 2 * math.pi)


def _closest_past_half_turn(t: int) -> int:
    """Of the keys past pi / theta_1 that a query at t sees (d <= t), the one whose
    pair-0 angle is closest to the answer's."""
    half_turn = math.pi / rope_frequencies(8, base=1e4).double()[1].item()
    return min(
        (d for d in range(t + 1) if d > half_turn), key=lambda d: abs(_bench_offset(d))
    )


def test_rope_pair_0_aliases_and_pair_1_sine_sign() -> None:
    """The chapters' reading of why RoPE fails past 2 L0, its training-free half. The
    bench's pair 0 turns theta_0 = b^0 = 1 rad per position, so it cannot tell the
    answer (2 back) from a key whose angle differs by nearly whole turns (46 - 2 = 44
    rad, seven turns and 0.018 rad). Pair 1 (theta_1 = 0.1) adds
    a cos(d theta_1) - b sin(d theta_1); for b > 0 its sine part is below the answer's
    at every key 3 to 29 back (among them 8, 21, 27, closer to the answer in pair 0 than
    the key 40 back) and above it at every key past pi / theta_1 (in (31, 32)). Of the
    keys past pi / theta_1 a query sees, the closest to the answer in pair 0 is 33 back
    from t = 33, 40 back from t = 40 and 46 back from t = 46 (no threshold)."""
    theta = rope_frequencies(8, base=1e4)
    assert theta[0].item() == 1.0
    assert theta[1].item() == pytest.approx(1e4 ** (-2 / 8), rel=1e-6)
    half_turn = math.pi / theta[1].double().item()
    assert 44 - 7 * 2 * math.pi == pytest.approx(0.0177, abs=1e-4)
    assert 2 * 16 - 1 < half_turn < 2 * 16  # just before 2 L0
    closest = {t: _closest_past_half_turn(t) for t in range(32, 64)}
    steps = {t: d for t, d in closest.items() if t == 32 or d != closest[t - 1]}
    assert steps == {32: 32, 33: 33, 40: 40, 46: 46}
    assert abs(_bench_offset(40)) == pytest.approx(38 - 6 * 2 * math.pi, abs=1e-12)
    nearer = [d for d in range(3, 32) if abs(_bench_offset(d)) < abs(_bench_offset(40))]
    assert nearer == [8, 21, 27]
    sine = {d: -math.sin(d * theta[1].item()) for d in range(64)}  # b = 1
    assert all(sine[d] < 0 for d in range(1, 32))
    assert all(sine[d] > 0 for d in range(32, 63))
    assert all(sine[d] < sine[2] for d in range(3, 30))
    assert all(sine[d] > sine[2] for d in range(32, 64))
    # the package's offsets agree with the remainder above
    offsets = pair_alias_offsets(1.0, lag=2, length=64)
    for d in range(64):
        assert offsets[d].item() == pytest.approx(_bench_offset(d), abs=1e-12)


# ---- The trained comparison (mirrors the chapter's asserts) -------------------------
# One module-scoped run of companion.position_comparison.compare_position_schemes, the
# chapter's own call (its budgets and seed counts, from the same module), and T5 again
# over seeds(POSITION_FAMILY_T5_SEEDS): `make claims` reruns these under every variant
# (jitter, one thread, ATen default, other seeds); a bound is kept only if it holds in
# all of them.

# the bounds the chapter states (make claims reruns each under every variant)
T5_LOW = 0.95
T5_HIGH = 0.98
T5_FLOOR = 0.4
NONE_INSIDE = (0.7, 0.85)
P_ROPE_GAP = 0.03
FIRST_DROP = (32, 38)
_PROBE_SEED = 1  # the chapter's probe batch for the attention of the RoPE models


@pytest.fixture(scope="module")
def comparison():
    from companion import experiments, position_comparison

    torch.set_num_threads(1)
    return position_comparison.compare_position_schemes(
        steps=position_comparison.POSITION_FAMILY_STEPS,
        seeds=experiments.seeds(position_comparison.POSITION_FAMILY_SEEDS),
    )


@pytest.fixture(scope="module")
def t5_six():
    from companion import experiments, position_comparison

    torch.set_num_threads(1)
    return position_comparison.compare_position_schemes(
        ("t5",),
        steps=position_comparison.POSITION_FAMILY_STEPS["t5"],
        seeds=experiments.seeds(position_comparison.POSITION_FAMILY_T5_SEEDS),
    )


RELATIVE_SIGNAL = ("rope", "p_rope", "t5", "shaw", "transformer_xl")


@pytest.mark.trained(chapter=4)
def test_schemes_with_a_distance_signal_solve_the_trained_positions(
    comparison, t5_six
) -> None:
    for s in RELATIVE_SIGNAL:
        assert (comparison.inside(s) > 0.999).all(), s
        assert (comparison.final_loss(s) < 2e-3).all(), s
    assert (t5_six.inside("t5") > 0.999).all()


@pytest.mark.trained(chapter=4)
def test_shaw_and_transformer_xl_extrapolate(comparison) -> None:
    for s in ("shaw", "transformer_xl"):
        assert (comparison.beyond(s) > 0.999).all(), s


@pytest.mark.trained(chapter=4)
def test_rope_and_p_rope_hold_to_twice_the_length_then_fail(comparison) -> None:
    for s in ("rope", "p_rope"):
        assert (comparison.band(s, 16, 32) > 0.99).all(), s
        assert (comparison.band(s, 32, 64) < 0.4).all(), s
    gap = comparison.beyond("rope").mean() - comparison.beyond("p_rope").mean()
    assert abs(float(gap)) < P_ROPE_GAP


@pytest.mark.trained(chapter=4)
def test_rope_mean_accuracy_first_drops_past_twice_the_length(comparison) -> None:
    mean = comparison.accuracy["rope"].mean(dim=0)
    first = int(torch.nonzero(mean[16:] < 0.9).flatten()[0]) + 16
    assert FIRST_DROP[0] <= first <= FIRST_DROP[1]


@pytest.mark.trained(chapter=4)
def test_t5_depends_on_the_seed(t5_six) -> None:
    """Six seeds: beyond L0 at least one stays above T5_HIGH and at least one falls
    below T5_LOW, none below T5_FLOOR (the bounds the chapter states)."""
    beyond = t5_six.beyond("t5")
    assert int((beyond < T5_LOW).sum()) >= 1
    assert int((beyond > T5_HIGH).sum()) >= 1
    assert float(beyond.min()) > T5_FLOOR


@pytest.mark.trained(chapter=4)
def test_none_and_alibi_are_a_fixed_budget(comparison) -> None:
    r = comparison
    inside = {s: float(r.inside(s).mean()) for s in ("none", "alibi")}
    beyond = {s: float(r.beyond(s).mean()) for s in ("none", "alibi")}
    assert NONE_INSIDE[0] < inside["none"] < NONE_INSIDE[1]
    assert beyond["none"] < 0.35 and inside["none"] > 2 * beyond["none"]
    assert inside["alibi"] > 0.97 and 0.8 < beyond["alibi"] < inside["alibi"]
    for s in ("none", "alibi"):
        drop = r.losses[s][:, -250:-200].mean() - r.losses[s][:, -50:].mean()
        assert drop > 0, s  # the loss still falls over the last 200 steps
        half = r.shorter[s, 500]
        assert half[:, r.lag : r.training_length].mean() < inside[s], s
        assert half[:, r.training_length :].mean() < beyond[s], s


def _rope_probe(comparison):
    from companion.model import lag_task

    vocab = comparison.models["rope"][0].config.vocab_size
    probe, _ = lag_task(
        64,
        64,
        lag=comparison.lag,
        vocab_size=vocab,
        generator=torch.Generator().manual_seed(_PROBE_SEED),
    )
    return probe, torch.arange(64)[:, None] - torch.arange(64)


@pytest.mark.trained(chapter=4)
def test_rope_fails_by_attending_to_far_keys(comparison) -> None:
    """The RoPE bullet: in the last layer the query at t = 24 attends to the answer (two
    back) and next to none to keys more than L0 back; at t = 50 most of its attention
    is on keys 32 or more places back (every seed)."""
    from companion.modern import attention_maps

    probe, distance = _rope_probe(comparison)
    with torch.no_grad():
        last = torch.stack(
            [attention_maps(m, probe)[-1] for m in comparison.models["rope"]]
        )  # (seeds, B, H, L, S)
    for seed_maps in last:
        answer = {
            t: seed_maps[..., t, distance[t] == 2].sum(-1).mean() for t in (24, 50)
        }
        unseen = seed_maps[..., 24, distance[24] > 16].sum(-1).mean()
        far = seed_maps[..., 50, distance[50] >= 32].sum(-1).mean()
        assert answer[24] > 0.95 and unseen < 0.05
        assert answer[50] < 0.2 and far > 0.8


@pytest.mark.trained(chapter=4)
def test_rope_attends_to_an_alias_of_the_answer_and_pair_1_decides(comparison) -> None:
    """Review of issue 32, finding 1, and R2 #1: in the last layer at t = 50 the most
    attended key (mean over sequences and heads) takes more than half the row and is the
    key past pi / theta_1 closest to the answer in pair 0 that the query sees (46 back);
    pair 0 gives it within a fifth of what it gives the answer; at that key pair 1's sine
    part gives more than at the answer, its cosine part less, and pair 1's excess
    exceeds what pairs 0, 2 and 3 together give either key over the other (every seed).
    The RoPE seeds' mean accuracy falls most steeply onto t = 40, where the closest such
    key so far (40 back) comes into view, and at t = 40 it takes more than 0.3 of the row
    (every seed; whether it or the answer takes the most is close in some seeds, 0.51
    against 0.48 in one build, so that is not asserted)."""
    from companion.modern import attention_maps

    probe, _ = _rope_probe(comparison)
    top = most_attended_key(comparison.models["rope"], probe, query=50, lag=2)
    gap = top.gap.sum(dim=1)  # (seeds, P)
    answer_0 = top.at_answer[:, :, 0].sum(dim=1)  # pair 0's part of the answer's score
    for i in range(len(comparison.seeds)):
        assert int(top.distance[i]) == _closest_past_half_turn(50) == 46
        assert top.weight[i] > 0.5
        assert abs(gap[i, 0]) < 0.2 * answer_0[i]  # pair 0: about the answer's score
        assert top.gap[i, 1, 1] > 0 > top.gap[i, 0, 1]
        assert gap[i, 1] > gap[i, 0].abs() + gap[i, 2:].abs().sum()
    mean = comparison.accuracy["rope"].mean(dim=0)
    fall = mean[16:-1] - mean[17:]
    assert int(fall.argmax()) + 17 == 40 == _closest_past_half_turn(40)
    with torch.no_grad():
        key_40 = torch.stack(
            [
                attention_maps(m, probe)[-1][..., 40, 0].mean()
                for m in comparison.models["rope"]
            ]
        )  # (seeds,): at t = 40, the key 40 back is position 0
    assert (key_40 > 0.3).all()
