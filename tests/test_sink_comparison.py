"""Tests of companion.sink_comparison: chapter 10's learned sink against a sink token
(the trigger-lag targets against a loop, the learned-sink layer against a float64 loop
of GPT-OSS's formula and against plain RoPE attention when its sink is far below every
score, the sink token's forward against a hand-written one, the window, the runs through
companion.experiments, the sink's share against the layer's own output), and its
bad-input table."""

from __future__ import annotations

import copy
import math
import re

import pytest
import torch
from torch.nn import functional as F

from companion import experiments as E
from companion import hybrid_positions as HP
from companion import model as M
from companion import sink_comparison as SC
from companion.modern import attention_maps

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py

_CONFIG = M.ModelConfig(vocab_size=16, dim=16, num_heads=2, num_layers=2)


def _layers(net: M.TinyTransformer) -> list[M.CausalSelfAttention]:
    return [m for m in net.modules() if isinstance(m, M.CausalSelfAttention)]


# ---- the task ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lag", "triggers", "vocab"), [(2, 4, 16), (1, 1, 2), (3, 7, 9)]
)
def test_trigger_lag_targets_against_a_loop(
    lag: int, triggers: int, vocab: int
) -> None:
    tokens = torch.randint(vocab, (5, 11), generator=torch.Generator().manual_seed(lag))
    out = SC.trigger_lag_targets(tokens, lag=lag, triggers=triggers, vocab_size=vocab)
    assert out.dtype == torch.int64 and out.shape == tokens.shape
    for b in range(5):
        for t in range(11):
            x = tokens[b, t].item()
            if t < lag:
                expected = -100
            elif x < triggers:
                expected = tokens[b, t - lag].item()
            else:
                expected = (x + 1) % vocab
            assert out[b, t].item() == expected


def test_trigger_lag_targets_on_the_lag_tasks_tokens_and_a_transposed_view() -> None:
    tokens, lag_targets = M.lag_task(8, 16, lag=2, vocab_size=16)
    out = SC.trigger_lag_targets(tokens)
    trigger = tokens < SC.SINK_TRIGGERS
    assert torch.equal(out[trigger], lag_targets[trigger])  # the lag task's answer
    view = tokens.T.contiguous().T  # a transposed view of the same values
    assert not view.is_contiguous() and torch.equal(SC.trigger_lag_targets(view), out)


# ---- the learned-sink layer --------------------------------------------------------------


def _loop_reference(
    layer: SC.LearnedSinkSelfAttention, x: torch.Tensor
) -> torch.Tensor:
    """GPT-OSS's p_ij = e^s_ij / (e^sigma_h + sum_k e^s_ik) in float64 loops."""
    with torch.no_grad():
        q = layer._split(layer.q_proj(x)).double()
        k = layer._split(layer.k_proj(x)).double()
        v = layer._split(layer.v_proj(x)).double()
        q, k = layer.transform_qk(q, k)  # RoPE, as the layer's own
        B, H, L, Dh = q.shape
        out = torch.zeros(B, H, L, Dh, dtype=torch.float64)
        W = L if layer.window is None else layer.window
        for b in range(B):
            for h in range(H):
                sigma = layer.sinks[h].double().item()
                for i in range(L):
                    keys = [j for j in range(L) if i - W < j <= i]
                    s = {
                        j: (q[b, h, i] @ k[b, h, j]).item() / math.sqrt(Dh)
                        for j in keys
                    }
                    top = max([sigma, *s.values()])
                    denom = math.exp(sigma - top) + sum(
                        math.exp(v_ - top) for v_ in s.values()
                    )
                    for j in keys:
                        out[b, h, i] += math.exp(s[j] - top) / denom * v[b, h, j]
        merged = out.transpose(1, 2).reshape(B, L, H * Dh)
        return layer.out_proj.double()(merged).float()


@pytest.mark.parametrize("window", [None, 3])
def test_learned_sink_layer_against_a_float64_loop(window: int | None) -> None:
    torch.manual_seed(0)
    layer = SC.LearnedSinkSelfAttention(16, 2, window=window)
    with torch.no_grad():
        layer.sinks.copy_(torch.tensor([0.7, -1.3]))
    x = torch.randn(3, 7, 16)
    expected = _loop_reference(layer, x)
    layer.float()
    got = layer(x.transpose(0, 1).contiguous().transpose(0, 1))  # a transposed view
    assert torch.allclose(got, expected, atol=1e-5)


def test_a_sink_far_below_every_score_is_plain_rope_attention() -> None:
    torch.manual_seed(1)
    sink = SC.LearnedSinkSelfAttention(16, 2)
    with torch.no_grad():
        sink.sinks.fill_(-1e4)  # e^sigma underflows: no mass left for the sink
    plain = M.RotarySelfAttention(16, 2)
    plain.load_state_dict({k: v for k, v in sink.state_dict().items() if k != "sinks"})
    local = HP.LocalRotarySelfAttention(16, 2, window=3)
    local.load_state_dict(plain.state_dict())
    windowed = SC.LearnedSinkSelfAttention(16, 2, window=3)
    windowed.load_state_dict(sink.state_dict())
    x = torch.randn(2, 9, 16)
    assert torch.allclose(sink(x), plain(x), atol=1e-6)
    assert torch.allclose(windowed(x), local(x), atol=1e-6)


def test_attention_maps_of_a_learned_sink_layer_give_the_sink_its_share() -> None:
    """The weights attention_maps recomputes, times the values, are the layer's own
    output, and each row sums to 1 - sigmoid(sigma - lse) (the sink's share)."""
    torch.manual_seed(2)
    net = SC.SinkTransformer(_CONFIG, sink="learned")
    with torch.no_grad():
        for layer in _layers(net):
            layer.sinks.normal_()
    ids = torch.randint(16, (3, 10))
    weights = attention_maps(net, ids)  # (layers, B, H, L, L)
    scores = attention_maps(net, ids, scores=True)
    for n, (layer, x) in enumerate(M.attention_inputs(net, ids)):
        v = layer._split(layer.v_proj(x))  # (B, H, L, D/H)
        out = weights[n] @ v
        merged = layer.out_proj(out.transpose(1, 2).reshape(3, 10, 16))
        assert torch.allclose(merged, layer(x), atol=1e-5)
        share = torch.sigmoid(layer.sinks[:, None] - torch.logsumexp(scores[n], -1))
        assert torch.allclose(1 - weights[n].sum(-1), share, atol=1e-5)


@pytest.mark.parametrize("keep_first", [False, True])
@pytest.mark.parametrize(("window", "L", "S"), [(3, 9, 9), (1, 4, 7), (20, 6, 6)])
def test_streaming_bias_against_a_loop(
    window: int, L: int, S: int, keep_first: bool
) -> None:
    bias = SC.streaming_bias(window, L, S, keep_first=keep_first, dtype=torch.float64)
    for row in range(L):
        i = S - L + row  # the query's position: the last L of the S keys
        for j in range(S):
            seen = i - window < j <= i or (keep_first and j == 0)
            assert bias[row, j].item() == (0.0 if seen else -math.inf)


def test_keeping_the_first_slot_is_the_window_plus_key_zero() -> None:
    """A keep_first layer's output equals a plain RoPE layer's with the same weights on
    the scores masked to the window and key 0 (materialized by hand)."""
    torch.manual_seed(5)
    kept = SC.StreamingRotarySelfAttention(16, 2, window=3, keep_first=True)
    plain = M.RotarySelfAttention(16, 2)
    plain.load_state_dict(kept.state_dict())
    x = torch.randn(2, 9, 16)
    i, j = torch.arange(9)[:, None], torch.arange(9)[None, :]
    allowed = ((i - 3 < j) & (j <= i)) | (j == 0)  # (L, S)
    q = plain._split(plain.q_proj(x))
    k = plain._split(plain.k_proj(x))
    v = plain._split(plain.v_proj(x))
    q, k = plain.transform_qk(q, k)
    scores = (q @ k.transpose(-2, -1) / math.sqrt(8)).masked_fill(~allowed, -math.inf)
    out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(2, 9, 16)
    assert torch.allclose(kept(x), plain.out_proj(out), atol=1e-6)
    # and a window that holds every key is plain causal RoPE attention
    wide = SC.StreamingRotarySelfAttention(16, 2)
    wide.load_state_dict(kept.state_dict())
    assert torch.allclose(wide(x), plain(x), atol=1e-6)


# ---- the models --------------------------------------------------------------------------


def test_no_sink_is_the_tiny_transformer_weight_for_weight() -> None:
    plain = E.build(lambda: M.TinyTransformer(_CONFIG), 5)
    none = E.build(lambda: SC.SinkTransformer(_CONFIG, sink="none"), 5)
    assert plain.state_dict().keys() == none.state_dict().keys()
    pairs = zip(plain.state_dict().items(), none.state_dict().values(), strict=True)
    for (k, a), b in pairs:
        assert torch.equal(a, b), k
    ids = torch.randint(16, (2, 9))
    assert torch.equal(plain(ids), none(ids))


def test_the_sink_token_is_slot_zero_and_its_output_is_dropped() -> None:
    torch.manual_seed(3)
    net = SC.SinkTransformer(_CONFIG, sink="token")
    assert net.sink_token.shape == (16,)
    ids = torch.randint(16, (2, 9))
    x = torch.cat([net.sink_token.expand(2, 1, 16), net.embed(ids)], dim=1)
    expected = net.head(net.final_norm(net.blocks(x)))[:, 1:]  # by hand
    got = net(ids)
    assert got.shape == (2, 9, 16) and torch.allclose(got, expected)
    later = ids.clone()
    later[:, 5:] = (later[:, 5:] + 1) % 16  # change the tokens after position 4
    # causal: the outputs at the first five positions are unchanged
    assert torch.equal(net(later)[:, :5], got[:, :5])
    with torch.no_grad():
        net.sink_token.add_(1.0)
    assert not torch.allclose(net(ids), got)  # every position reads the sink token


@pytest.mark.parametrize("sink", SC.SINK_KINDS)
def test_windowed_copy_keeps_the_weights_and_only_the_last_w_slots(sink: str) -> None:
    torch.manual_seed(4)
    net = SC.SinkTransformer(_CONFIG, sink=sink)
    ids = torch.randint(16, (2, 9))
    wide = SC.windowed(net, 10)  # ten slots hold every key (the sink token's too)
    assert wide.window == 10 and not wide.training
    assert torch.allclose(wide(ids), net(ids), atol=1e-6)
    narrow = SC.windowed(net, 3)
    out = narrow(ids)
    changed = ids.clone()
    changed[:, 0] = (
        changed[:, 0] + 1
    ) % 16  # token 0: out of the late queries' windows
    # the layers stack: position t sees back to t - 2 * (W - 1) = t - 4 through two layers
    assert torch.allclose(narrow(changed)[:, 5:], out[:, 5:], atol=1e-6)
    assert not torch.allclose(net(changed)[:, 5:], net(ids)[:, 5:], atol=1e-6)
    kept = SC.windowed(net, 3, keep_first=True)
    assert kept.keep_first and kept.window == 3
    if sink == "token":  # slot 0 is the sink token: token 0 is still evicted
        assert torch.allclose(kept(changed)[:, 5:], kept(ids)[:, 5:], atol=1e-6)
    else:  # slot 0 is token 0, kept in every window
        assert not torch.allclose(kept(changed)[:, 5:], kept(ids)[:, 5:], atol=1e-6)


def test_sink_runs_equal_run_seeds_per_kind() -> None:
    E.clear_runs()
    runs = SC.sink_runs((0, 1), steps=12, kinds=("learned", "token"))
    assert list(runs) == ["learned", "token"]
    E.clear_runs()
    for kind, r in runs.items():
        alone = E.run_seeds(
            lambda kind=kind: SC.SinkTransformer(SC.SINK_SIZES, sink=kind),
            (0, 1),
            steps=12,
            lr=SC.SINK_LR,
            warmup_steps=10,
            schedule="cosine",
            targets=SC.trigger_lag_targets,
            **SC.SINK_TASK,
        )
        assert r.seeds == (0, 1) and r.losses == alone.losses
        for a, b in zip(r.models, alone.models, strict=True):
            pairs = zip(a.state_dict().items(), b.state_dict().values(), strict=True)
            for (name, p), q in pairs:
                assert torch.equal(p, q), (kind, name)


@pytest.fixture(scope="module")
def short_runs() -> dict[str, E.SeedRuns]:
    return SC.sink_runs((0, 1), steps=12)


def test_measure_sinks_reads_the_loss_and_the_sinks_share(short_runs) -> None:
    probe = SC.sink_probe(16)
    assert torch.equal(probe, SC.sink_probe(16)) and probe.shape == (16, 16)
    targets = SC.trigger_lag_targets(probe)
    for kind, runs in short_runs.items():
        m = SC.measure_sinks(runs, probe, window=3)
        assert m.resting.shape == m.reading.shape == (2, 2, 4)
        for s, net in enumerate(runs.models):
            logits = net(probe)[:, 3:]
            loss = F.cross_entropy(logits.flatten(0, 1), targets[:, 3:].flatten())
            assert m.loss[s].item() == pytest.approx(loss.item(), rel=1e-6)
            w_logits = SC.windowed(net, 3)(probe)[:, 3:]
            w_loss = F.cross_entropy(w_logits.flatten(0, 1), targets[:, 3:].flatten())
            assert m.window_loss[s].item() == pytest.approx(w_loss.item(), rel=1e-6)
            hits = (w_logits.argmax(-1) == targets[:, 3:]).double().mean().item()
            assert m.window_accuracy[s].item() == pytest.approx(hits)
            k_logits = SC.windowed(net, 3, keep_first=True)(probe)[:, 3:]
            k_loss = F.cross_entropy(k_logits.flatten(0, 1), targets[:, 3:].flatten())
            assert m.kept_loss[s].item() == pytest.approx(k_loss.item(), rel=1e-6)
            # the resting share by hand: weights of the sink slot (or 1 - the row's sum)
            weights = attention_maps(net, probe)  # (layers, B, H, S, S)
            if kind == "learned":
                share = 1 - weights.sum(-1)
            elif kind == "token":
                share = weights[..., 1:, 0]
            else:
                share = weights[..., 0]
            rest = (probe >= SC.SINK_TRIGGERS)[:, 4:]
            by_layer_head = share[..., 4:].permute(0, 2, 1, 3)  # (layers, H, B, L - 4)
            by_hand = by_layer_head[:, :, rest].mean(-1)  # (layers, H)
            assert torch.allclose(m.resting[s], by_hand.double(), atol=1e-6)
            read = (probe < SC.SINK_TRIGGERS)[:, 4:]
            by_hand = by_layer_head[:, :, read].mean(-1)  # (layers, H)
            assert torch.allclose(m.reading[s], by_hand.double(), atol=1e-6)
        assert (m.lowest > 0).all()


def test_measure_sinks_on_a_short_probe_by_hand(short_runs) -> None:
    """Another window and start on a six-token probe: the three losses by hand, and a
    float64 copy of a model measures what the float32 one does."""
    probe = SC.sink_probe(8)[:, :6]
    targets = SC.trigger_lag_targets(probe)[:, 4:]
    runs = short_runs["token"]
    m = SC.measure_sinks(runs, probe, window=4, start=2)
    for s, net in enumerate(runs.models):
        for got, model in (
            (m.loss, net),
            (m.window_loss, SC.windowed(net, 4)),
            (m.kept_loss, SC.windowed(net, 4, keep_first=True)),
        ):
            logits = model(probe)[:, 4:]
            loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
            assert got[s].item() == pytest.approx(loss.item(), rel=1e-6)
    wide = copy.deepcopy(runs.models[0]).double()
    assert SC.windowed(wide, 4).embed.weight.dtype == torch.float64
    again = SC.measure_sinks(
        E.SeedRuns((0,), [runs.losses[0]], [wide]), probe, window=4, start=2
    )
    assert again.loss[0].item() == pytest.approx(m.loss[0].item(), rel=1e-4)


def test_windowed_leaves_the_global_generator_alone() -> None:
    net = SC.SinkTransformer(_CONFIG, sink="token")
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    SC.windowed(net, 3)
    assert torch.equal(torch.rand(3), expected)


def test_attention_maps_of_a_sink_token_model_see_its_slot() -> None:
    """With a sink token the layers see L + 1 slots; the weights attention_maps gives,
    times the values, are each layer's own output."""
    torch.manual_seed(6)
    net = SC.SinkTransformer(_CONFIG, sink="token")
    ids = torch.randint(16, (2, 7))
    weights = attention_maps(net, ids)
    assert weights.shape == (2, 2, 2, 8, 8)
    for n, (layer, x) in enumerate(M.attention_inputs(net, ids)):
        v = layer._split(layer.v_proj(x))
        merged = layer.out_proj((weights[n] @ v).transpose(1, 2).reshape(2, 8, 16))
        assert torch.allclose(merged, layer(x), atol=1e-5)


# ---- bad input ---------------------------------------------------------------------------


def _untrained_runs() -> E.SeedRuns:
    """One untrained model of each size, enough for measure_sinks' argument checks."""
    net = SC.SinkTransformer(SC.SINK_SIZES, sink="none")
    return E.SeedRuns((0,), [[1.0] * 20], [net])


_TOKENS = torch.randint(16, (2, 8), generator=torch.Generator().manual_seed(0))

#: (public name, call, error, the words the message must hold); test_contract.py checks
#: that every public name of companion.sink_comparison has a row
BAD_INPUTS = [
    (
        "trigger_lag_targets",
        lambda: SC.trigger_lag_targets(_TOKENS.float()),
        TypeError,
        re.escape("tokens"),
    ),
    (
        "trigger_lag_targets",
        lambda: SC.trigger_lag_targets(_TOKENS[:, :2]),
        ValueError,
        re.escape("tokens"),
    ),
    (
        "trigger_lag_targets",
        lambda: SC.trigger_lag_targets(_TOKENS, lag=0),
        ValueError,
        re.escape("lag"),
    ),
    (
        "trigger_lag_targets",
        lambda: SC.trigger_lag_targets(_TOKENS, triggers=16),
        ValueError,
        re.escape("triggers"),
    ),
    (
        "trigger_lag_targets",
        lambda: SC.trigger_lag_targets(_TOKENS, triggers=0),
        ValueError,
        re.escape("triggers"),
    ),
    (
        "trigger_lag_targets",
        lambda: SC.trigger_lag_targets(_TOKENS, vocab_size=1),
        ValueError,
        re.escape("vocab_size"),
    ),
    (
        "LearnedSinkSelfAttention",
        lambda: SC.LearnedSinkSelfAttention(16, 2, window=0),
        ValueError,
        re.escape("window"),
    ),
    (
        "LearnedSinkSelfAttention",
        lambda: SC.LearnedSinkSelfAttention(16, 2, window=2.5),
        TypeError,
        re.escape("window"),
    ),
    (
        "SinkTransformer",
        lambda: SC.SinkTransformer(_CONFIG, sink="bos"),
        ValueError,
        re.escape("sink"),
    ),
    (
        "SinkTransformer",
        lambda: SC.SinkTransformer("config"),
        TypeError,
        re.escape("config"),
    ),
    (
        "SinkTransformer",
        lambda: SC.SinkTransformer(M.ModelConfig(16, 16, 2, 2, position="none")),
        ValueError,
        re.escape("config.position"),
    ),
    (
        "SinkTransformer",
        lambda: SC.SinkTransformer(_CONFIG, window=-1),
        ValueError,
        re.escape("window"),
    ),
    (
        "SinkTransformer",
        lambda: SC.SinkTransformer(_CONFIG, keep_first=True),
        ValueError,
        re.escape("keep_first"),
    ),
    (
        "SinkTransformer",
        lambda: SC.SinkTransformer(_CONFIG, window=3, keep_first=1),
        TypeError,
        re.escape("keep_first"),
    ),
    (
        "streaming_bias",
        lambda: SC.streaming_bias(0, 4, 4),
        ValueError,
        re.escape("window"),
    ),
    (
        "streaming_bias",
        lambda: SC.streaming_bias(3, 5, 4),
        ValueError,
        re.escape("key_length"),
    ),
    (
        "streaming_bias",
        lambda: SC.streaming_bias(3, 4, 4, keep_first="yes"),
        TypeError,
        re.escape("keep_first"),
    ),
    (
        "streaming_bias",
        lambda: SC.streaming_bias(3, 4, 4, dtype=torch.int64),
        TypeError,
        re.escape("dtype"),
    ),
    (
        "StreamingRotarySelfAttention",
        lambda: SC.StreamingRotarySelfAttention(16, 2, keep_first=None),
        TypeError,
        re.escape("keep_first"),
    ),
    (
        "windowed",
        lambda: SC.windowed(SC.SinkTransformer(_CONFIG), 3, keep_first=2),
        TypeError,
        re.escape("keep_first"),
    ),
    (
        "windowed",
        lambda: SC.windowed(M.TinyTransformer(_CONFIG), 3),
        TypeError,
        re.escape("net"),
    ),
    (
        "windowed",
        lambda: SC.windowed(SC.SinkTransformer(_CONFIG), 0),
        ValueError,
        re.escape("window"),
    ),
    (
        "sink_runs",
        lambda: SC.sink_runs((0, 0)),
        ValueError,
        re.escape("seeds"),
    ),
    (
        "sink_runs",
        lambda: SC.sink_runs((0,), steps=10),
        ValueError,
        re.escape("steps"),
    ),
    (
        "sink_runs",
        lambda: SC.sink_runs((0,), lr=0.0),
        ValueError,
        re.escape("lr"),
    ),
    (
        "sink_runs",
        lambda: SC.sink_runs((0,), kinds=("none", "sink")),
        ValueError,
        re.escape("kinds"),
    ),
    (
        "sink_runs",
        lambda: SC.sink_runs((0,), kinds="none"),
        TypeError,
        re.escape("kinds"),
    ),
    (
        "sink_probe",
        lambda: SC.sink_probe(0),
        ValueError,
        re.escape("num_sequences"),
    ),
    (
        "measure_sinks",
        lambda: SC.measure_sinks("runs"),
        TypeError,
        re.escape("runs"),
    ),
    (
        "measure_sinks",
        lambda: SC.measure_sinks(_untrained_runs(), SC.sink_probe(4).float()),
        TypeError,
        re.escape("probe"),
    ),
    (
        "measure_sinks",
        lambda: SC.measure_sinks(_untrained_runs(), window=2),
        ValueError,
        re.escape("window"),
    ),
    (
        "measure_sinks",
        lambda: SC.measure_sinks(_untrained_runs(), start=16),
        ValueError,
        re.escape("probe"),
    ),
    (
        "measure_sinks",
        lambda: SC.measure_sinks(
            E.SeedRuns((0,), [[1.0]], [M.TinyTransformer(_CONFIG)])
        ),
        TypeError,
        re.escape("runs.models[0]"),
    ),
    (
        "SinkMeasures",
        lambda: SC.SinkMeasures(*[torch.zeros(2)] * 8, torch.zeros(3, 2, 4)),
        ValueError,
        re.escape("reading"),
    ),
    (
        "trigger_lag_targets",
        lambda: SC.trigger_lag_targets(_TOKENS - 1),
        ValueError,
        re.escape("tokens must be ids"),
    ),
    (
        "trigger_lag_targets",
        lambda: SC.trigger_lag_targets(_TOKENS + 16),
        ValueError,
        re.escape("tokens must be ids"),
    ),
    (
        "measure_sinks",
        lambda: SC.measure_sinks(_untrained_runs(), SC.sink_probe(4)[:0]),
        ValueError,
        "probe must hold sequences",
    ),
    (
        "measure_sinks",
        lambda: SC.measure_sinks(_untrained_runs(), SC.sink_probe(4) + 16),
        ValueError,
        re.escape("probe must be token ids"),
    ),
    (
        "measure_sinks",
        lambda: SC.measure_sinks(_untrained_runs(), torch.full((2, 8), 7)),
        ValueError,
        "probe must hold triggers",
    ),
    (
        "measure_sinks",
        lambda: SC.measure_sinks(
            E.SeedRuns((0,), [[1.0]], [SC.SinkTransformer(SC.SINK_SIZES, window=3)])
        ),
        ValueError,
        re.escape("runs.models[0] must see every key"),
    ),
    (
        "measure_sinks",
        lambda: SC.measure_sinks(
            E.SeedRuns((0,), [[]], [SC.SinkTransformer(SC.SINK_SIZES)])
        ),
        ValueError,
        re.escape("runs.losses[0]"),
    ),
    (
        "measure_sinks",
        lambda: SC.measure_sinks(
            E.SeedRuns(
                (0, 1),
                [[1.0], [1.0]],
                [SC.SinkTransformer(SC.SINK_SIZES), SC.SinkTransformer(_CONFIG)],
            )
        ),
        ValueError,
        re.escape("runs.models must share one config"),
    ),
]


@pytest.mark.parametrize(("name", "call", "error", "match"), BAD_INPUTS)
def test_bad_input(name, call, error, match) -> None:
    with pytest.raises(error, match=match):
        call()
