"""Tests of companion.stability: chapter 9's stability runs (run_seeds of the chapter's
configurations), what measure_stability reads against the attention maps it reads
from, lag_weight and first_token_mass against uniform attention, AdamW's first step,
and the bad-input table."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from companion import experiments as E
from companion import model as M
from companion import stability as S

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


def test_stability_runs_are_run_seeds_of_the_chapters_configurations() -> None:
    from companion import modern

    runs = S.stability_runs((3,), steps=2, labels=["QK-norm, lr 0.3"])
    assert list(runs) == ["QK-norm, lr 0.3"]
    (net,) = runs["QK-norm, lr 0.3"].models
    assert isinstance(net, modern.ModernTinyTransformer)
    assert net.attention_kind == "qk_norm" and net.config == S.MODERN_SIZES
    # the same as run_seeds with the chapter's task and rate, bit for bit
    direct = E.run_seeds(
        lambda: modern.ModernTinyTransformer(S.MODERN_SIZES, attention="qk_norm"),
        (3,),
        steps=2,
        lr=0.3,
        **S.MODERN_TASK,
    )
    assert runs["QK-norm, lr 0.3"].losses == direct.losses
    all_runs = S.stability_runs((0,), steps=1)
    assert list(all_runs) == list(S.STABILITY_RUNS)


def test_measure_stability_against_the_attention_it_reads() -> None:
    from companion import model as M
    from companion import modern

    runs = S.stability_runs((0, 1), steps=3)
    probe = S.modern_probe(8)
    assert probe.shape == (8, 16)
    assert torch.equal(probe, S.modern_probe(8))  # no training seed, no variant
    for label, r in runs.items():
        m = S.measure_stability(r, probe)
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
        kind = S.STABILITY_RUNS[label][0]
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
    m = S.measure_stability(E.SeedRuns((0,), [curve], [net]), S.modern_probe(2))
    assert m.spike.item() == 2.5
    assert m.lowest.item() == pytest.approx(0.002)
    assert m.final.item() == pytest.approx(0.002)
    late = [3.0] * 10 + [0.005] * 30 + [1.0] * 20  # a spike at the very end
    m = S.measure_stability(E.SeedRuns((0,), [late], [net]), S.modern_probe(2))
    assert m.spike.item() == 1.0 and m.final.item() == 1.0
    assert m.lowest.item() == pytest.approx(0.005)
    # uniform attention (zero queries) is nowhere one-hot past query 0
    with torch.no_grad():
        for layer in _attention_layers(net):
            for p in layer.q_proj.parameters():
                p.zero_()
    m = S.measure_stability(E.SeedRuns((0,), [late], [net]), S.modern_probe(2))
    assert m.one_hot.item() == 0.0


def test_stability_runs_take_the_exported_settings() -> None:
    import inspect

    defaults = inspect.signature(S.stability_runs).parameters
    assert defaults["steps"].default == S.STABILITY_STEPS == 150
    assert defaults["cap"].default == S.STABILITY_CAP == 5.0


def test_lag_weight_of_uniform_attention_is_one_over_the_prefix() -> None:
    # zero queries: query t spreads evenly over t + 1 keys, so the key two back gets
    # 1/(t + 1); averaged over t = 2 .. 15, a loop-computed oracle
    net = E.build(lambda: M_tiny(), 0)
    with torch.no_grad():
        for layer in _attention_layers(net):
            for p in layer.q_proj.parameters():
                p.zero_()
    got = S.lag_weight([net, net], S.modern_probe(4))
    assert got.shape == (2, 2, 4) and got.dtype == torch.float64
    want = sum(1 / (t + 1) for t in range(2, 16)) / 14
    torch.testing.assert_close(got, torch.full_like(got, want), atol=1e-6, rtol=0)
    lag5 = S.lag_weight([net], S.modern_probe(4), lag=5)
    assert lag5[0, 1, 3].item() == pytest.approx(
        sum(1 / (t + 1) for t in range(5, 16)) / 11, abs=1e-6
    )


def test_lag_weight_reads_the_key_lag_places_back() -> None:
    # an initialized model's maps: the oracle is the loop over sequences and queries
    from companion import modern

    net = E.build(lambda: M_tiny(), 1)
    probe = S.modern_probe(3)
    maps = modern.attention_maps(net, probe)  # (layers, B, H, L, L)
    got = S.lag_weight([net], probe)[0]
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
    got = S.first_attention_step((2,), lr=0.3)
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

    runs = S.stability_runs((0,), steps=1, labels=["soft-cap 5, lr 0.3"])
    (net,) = runs["soft-cap 5, lr 0.3"].models
    with torch.no_grad():
        for layer in _attention_layers(net):
            layer.q_proj.weight.mul_(1e4)
    probe = S.modern_probe(4)
    m = S.measure_stability(runs["soft-cap 5, lr 0.3"], probe)
    plain = modern.ModernTinyTransformer(S.MODERN_SIZES, attention="rope")
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
    assert S.uniform_first_token_share(16, start=4) == pytest.approx(even)
    mass = S.first_token_mass([net, net], S.modern_probe(4))
    assert mass.shape == (2, 2, 4) and mass.dtype == torch.float64
    torch.testing.assert_close(mass, torch.full_like(mass, even), atol=1e-6, rtol=0)
    later = S.first_token_mass([net], S.modern_probe(4), start=10)
    assert later[0, 0, 0].item() == pytest.approx(
        sum(1 / (t + 1) for t in range(10, 16)) / 6, abs=1e-6
    )


def _attention_layers(net: torch.nn.Module) -> list:
    from companion.model import CausalSelfAttention

    return [m for m in net.modules() if isinstance(m, CausalSelfAttention)]


def M_tiny():
    from companion import modern

    return modern.ModernTinyTransformer(S.MODERN_SIZES, attention="rope")


BAD_INPUTS = [
    ("stability_runs", lambda: S.stability_runs((0,), steps=0), ValueError, r"^steps"),
    ("stability_runs", lambda: S.stability_runs((0,), cap=0.0), ValueError, r"^cap"),
    (
        "stability_runs",
        lambda: S.stability_runs((0,), labels=["plain"]),
        ValueError,
        r"^labels must be one of",
    ),
    (
        "stability_runs",
        lambda: S.stability_runs((0,), labels="plain, lr 0.3"),
        TypeError,
        r"^labels must be a sequence of run labels",
    ),
    ("stability_runs", lambda: S.stability_runs(5), TypeError, r"^seed_list"),
    ("modern_probe", lambda: S.modern_probe(0), ValueError, r"^num_sequences"),
    (
        "measure_stability",
        lambda: S.measure_stability([1, 2]),
        TypeError,
        r"^runs must be a SeedRuns",
    ),
    (
        "measure_stability",
        lambda: S.measure_stability(
            E.SeedRuns((0,), [[1.0]], [M_tiny()]), torch.zeros(2, 16)
        ),
        TypeError,
        r"^probe must be",
    ),
    (
        "StabilityMeasures",
        lambda: S.StabilityMeasures(*([torch.zeros(2)] * 11), [1.0]),
        TypeError,
        r"^gain must be a torch",
    ),
    (
        "StabilityMeasures",
        lambda: S.StabilityMeasures(*([torch.zeros(2)] * 11), torch.zeros(3)),
        ValueError,
        r"^gain must have size 2",
    ),
    (
        "uniform_first_token_share",
        lambda: S.uniform_first_token_share(16, start=16),
        ValueError,
        r"^start must be less than length \(16\), got 16",
    ),
    (
        "uniform_first_token_share",
        lambda: S.uniform_first_token_share(0),
        ValueError,
        r"^length",
    ),
    ("first_token_mass", lambda: S.first_token_mass([]), TypeError, r"^models must"),
    (
        "first_token_mass",
        lambda: S.first_token_mass([torch.nn.Linear(2, 2)]),
        TypeError,
        r"^models\[0\] must",
    ),
    (
        "first_token_mass",
        lambda: S.first_token_mass([M_tiny()], S.modern_probe(2), start=16),
        ValueError,
        r"^start must be less than the probe's length \(16\)",
    ),
    ("lag_weight", lambda: S.lag_weight([]), TypeError, r"^models must"),
    (
        "lag_weight",
        lambda: S.lag_weight([torch.nn.Linear(2, 2)]),
        TypeError,
        r"^models\[0\] must",
    ),
    (
        "lag_weight",
        lambda: S.lag_weight([M_tiny()], S.modern_probe(2), lag=16),
        ValueError,
        r"^lag must be less than the probe's length \(16\), got 16",
    ),
    ("lag_weight", lambda: S.lag_weight([M_tiny()], lag=0), ValueError, r"^lag"),
    (
        "lag_weight",
        lambda: S.lag_weight([M_tiny()], torch.zeros(2, 16)),
        TypeError,
        r"^probe must be",
    ),
    (
        "first_attention_step",
        lambda: S.first_attention_step(0),
        TypeError,
        r"^seed_list must be a non-empty sequence",
    ),
    (
        "first_attention_step",
        lambda: S.first_attention_step((0,), lr=0.0),
        ValueError,
        r"^lr",
    ),
]


@pytest.mark.parametrize(
    ("name", "thunk", "error", "match"),
    BAD_INPUTS,
    ids=[f"{case[0]}-{i}" for i, case in enumerate(BAD_INPUTS)],
)
def test_modern_bad_input_raises_a_named_error(
    name: str, thunk: object, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        thunk()  # type: ignore[operator]
