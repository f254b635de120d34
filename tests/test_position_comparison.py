"""Tests of companion.position_comparison: chapter 4's trained comparison of the position
family (compare_position_schemes, PositionComparison), against the recipe it documents
(build, train_batched, position_accuracy written out), and its bad-input table."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from companion import experiments as E
from companion import model as M
from companion import position_comparison as PC
from companion import relative as R
from companion.model import ModelConfig

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


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


def _rope_nets(n: int = 2, position: str = "rope") -> list[M.TinyTransformer]:
    config = ModelConfig(
        vocab_size=8, dim=16, num_heads=2, num_layers=2, position=position
    )
    nets = []
    for seed in range(n):
        torch.manual_seed(seed)
        nets.append(M.TinyTransformer(config).eval())
    return nets


_PROBE = torch.randint(0, 8, (3, 12), generator=torch.Generator().manual_seed(0))


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
        "pair_alias_offsets",
        lambda: PC.pair_alias_offsets(0.0, lag=2, length=8),
        ValueError,
        r"^theta must be",
    ),
    (
        "pair_alias_offsets",
        lambda: PC.pair_alias_offsets(float("nan"), lag=2, length=8),
        ValueError,
        r"^theta must be",
    ),
    (
        "pair_alias_offsets",
        lambda: PC.pair_alias_offsets(1.0, lag=-1, length=8),
        ValueError,
        r"^lag must be an int >= 0, got -1",
    ),
    (
        "pair_alias_offsets",
        lambda: PC.pair_alias_offsets(1.0, lag=2, length=0),
        ValueError,
        r"^length must be a positive int, got 0",
    ),
    (
        "pair_alias_offsets",
        lambda: PC.pair_alias_offsets(1.0, lag=2.0, length=8),
        TypeError,
        r"^lag must be an int, got 2.0",
    ),
    (
        "most_attended_key",
        lambda: PC.most_attended_key(_rope_nets(1)[0], _PROBE, query=5, lag=2),
        TypeError,
        r"^models must be a tuple or list of RoPE models, got a TinyTransformer",
    ),
    (
        "most_attended_key",
        lambda: PC.most_attended_key([], _PROBE, query=5, lag=2),
        ValueError,
        r"^models must hold at least one model, got 0",
    ),
    (
        "most_attended_key",
        lambda: PC.most_attended_key([nn.Linear(2, 2)], _PROBE, query=5, lag=2),
        TypeError,
        r"^models\[0\] must be a TinyTransformer",
    ),
    (
        "most_attended_key",
        lambda: PC.most_attended_key(
            _rope_nets(1) + _rope_nets(1, "none"), _PROBE, query=5, lag=2
        ),
        ValueError,
        r"^models\[1\] must use RoPE or p-RoPE attention in every layer, got "
        r"\['CausalSelfAttention'\]",
    ),
    (
        "most_attended_key",
        lambda: PC.most_attended_key(_rope_nets(1), _PROBE.float(), query=5, lag=2),
        TypeError,
        r"^probe must be an integer tensor",
    ),
    (
        "most_attended_key",
        lambda: PC.most_attended_key(_rope_nets(1), _PROBE[0], query=5, lag=2),
        ValueError,
        r"^probe must have 2 dimensions \(B, L\)",
    ),
    (
        "most_attended_key",
        lambda: PC.most_attended_key(_rope_nets(1), _PROBE, query=12, lag=2),
        ValueError,
        r"^query must be an int <= 11, got 12",
    ),
    (
        "most_attended_key",
        lambda: PC.most_attended_key(_rope_nets(1), _PROBE, query=1, lag=2),
        ValueError,
        r"^query must be an int >= 2, got 1",
    ),
    (
        "most_attended_key",
        lambda: PC.most_attended_key(_rope_nets(1), _PROBE, query=5, lag=0),
        ValueError,
        r"^lag must be a positive int, got 0",
    ),
    (
        "most_attended_key",
        lambda: PC.most_attended_key(_rope_nets(1), _PROBE, query=5, lag=2, layer=2),
        ValueError,
        r"^layer must be an int <= 1, got 2",
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
    (
        "compare_position_schemes",
        lambda: PC.compare_position_schemes(("rope",), builders={"rope": len}),
        ValueError,
        "builders must name schemes of its own",
    ),
    (
        "compare_position_schemes",
        lambda: PC.compare_position_schemes(("x",), builders={"x": 3}),
        TypeError,
        r"builders\['x'\] must be callable",
    ),
    (
        "compare_position_schemes",
        lambda: PC.compare_position_schemes(("x",), builders=[("x", len)]),
        TypeError,
        "builders must be a dict",
    ),
]


NO_BAD_INPUTS = {
    "AttendedKey": "a result record that most_attended_key fills; it takes no input",
}


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


# ---- The aliases of the answer and the most attended key ----------------------------


def test_pair_alias_offsets_against_a_loop() -> None:
    """Oracle: a Python loop over the formula, math.remainder's nearest whole turn (a
    different reduction from the function's floor modulo); the bench's numbers the
    chapter prints (theta_0 = 1, lag 2: the six keys 3 to 63 back nearest the answer's
    angle)."""
    for theta, lag, length in ((1.0, 2, 64), (0.1, 2, 64), (0.37, 0, 30), (2.5, 5, 9)):
        got = PC.pair_alias_offsets(theta, lag=lag, length=length)
        assert got.dtype == torch.float64 and got.shape == (length,)
        for d in range(length):
            expected = math.remainder((d - lag) * theta, 2 * math.pi)
            assert abs(got[d].item() - expected) < 1e-12 or (  # at +-pi, either sign
                abs(abs(expected) - math.pi) < 1e-12
            )
        assert (got >= -math.pi).all() and (got < math.pi).all()
    offsets = PC.pair_alias_offsets(1.0, lag=2, length=64)
    closest = sorted(range(3, 64), key=lambda d: abs(offsets[d].item()))[:6]
    assert closest == [46, 27, 21, 52, 8, 40]  # the keys nearest the answer's angle
    assert offsets[46].item() == pytest.approx(44 - 7 * 2 * math.pi, abs=1e-12)
    assert abs(offsets[46].item()) < 0.02


def test_most_attended_key_against_the_attention_and_the_scores() -> None:
    """Oracle: the layer's weights and scores from companion.modern.attention_maps (its
    own recomputation of the layer): the key with the largest mean weight, its weight,
    the answer's, and the pair parts summing, over both parts and all pairs, to the mean
    score at each of the two keys."""
    from companion.modern import attention_maps

    nets = _rope_nets(2)
    for layer in (-1, 0):
        top = PC.most_attended_key(nets, _PROBE, query=9, lag=3, layer=layer)
        assert (top.query, top.lag) == (9, 3)
        assert top.distance.dtype == torch.int64 and top.distance.shape == (2,)
        assert top.at_key.shape == top.at_answer.shape == (2, 2, 4)  # head width 8
        for i, net in enumerate(nets):
            with torch.no_grad():
                weights = attention_maps(net, _PROBE)[layer][..., 9, :10]
                scores = attention_maps(net, _PROBE, scores=True)[layer][..., 9, :10]
            row = weights.double().mean(dim=(0, 1))
            key = int(row.argmax())
            assert int(top.distance[i]) == 9 - key
            assert top.weight[i].item() == pytest.approx(row[key].item(), rel=1e-12)
            assert top.answer_weight[i].item() == pytest.approx(
                row[6].item(), rel=1e-12
            )
            mean_score = scores.double().mean(dim=(0, 1))
            for parts, j in ((top.at_key[i], key), (top.at_answer[i], 6)):
                assert parts.sum().item() == pytest.approx(
                    mean_score[j].item(), abs=1e-4
                )
        torch.testing.assert_close(top.gap, top.at_key - top.at_answer)


def test_most_attended_key_finds_a_planted_key() -> None:
    """A last layer made to look at one distance: on a probe of one repeated token every
    position feeds the layer the same vector x, and its projections are set so that only
    pair 0 scores, with z_q = 40 e^{-3i} and z_k = 1 in both heads: the score
    Re(z_q conj(z_k) e^{i d theta_0}) peaks at distance 3. The function names that
    distance, and the whole difference from the answer's score is in pair 0."""
    net = _rope_nets(1)[0]
    attn = [m for m in net.modules() if isinstance(m, M.CausalSelfAttention)][-1]
    probe = torch.zeros(2, 12, dtype=torch.long)
    seen: list[torch.Tensor] = []
    hook = attn.register_forward_pre_hook(lambda _, a: seen.append(a[0]))
    with torch.no_grad():
        net(probe)
    hook.remove()
    x = seen[0][0, 0]  # (16,): the same at every position
    assert torch.allclose(seen[0], x.expand_as(seen[0]), atol=1e-5)
    unit = x / x.dot(x)  # u . x = 1
    half = 4  # head width 8: pairs as (real, imaginary) = (j, j + 4)
    with torch.no_grad():
        attn.q_proj.weight.zero_()
        attn.k_proj.weight.zero_()
        for base in (0, 8):  # both heads, pair 0
            attn.q_proj.weight[base] = 40 * math.cos(-3.0) * unit
            attn.q_proj.weight[base + half] = 40 * math.sin(-3.0) * unit
            attn.k_proj.weight[base] = unit
        for proj in (attn.q_proj, attn.k_proj):
            if proj.bias is not None:
                proj.bias.zero_()
    top = PC.most_attended_key([net], probe, query=11, lag=2)
    assert int(top.distance[0]) == 3
    gap = top.gap[0]  # (2, P)
    assert gap[:, 1:].abs().max() < 1e-6 and gap[:, 0].sum() > 0
    # Re(40 e^{i(d - 3)}) / sqrt(8) at d = 3 and at the answer, d = 2
    expected = 40 * (1 - math.cos(-1.0)) / math.sqrt(8)
    assert gap[:, 0].sum().item() == pytest.approx(expected, rel=1e-4)
