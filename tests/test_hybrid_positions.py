"""Tests of companion.hybrid_positions: the local-RoPE / global-NoPE hybrid of chapter 10
(the sliding-window bias against a loop and Hugging Face's predicate, the local layer's
window, the NoPE layer's indifference to position, the pattern as data, the comparison
through compare_position_schemes), and its bad-input table."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from companion import experiments as E
from companion import hybrid_positions as HP
from companion import model as M
from companion import position_comparison as PC
from companion.model import ModelConfig

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py

_CONFIG = ModelConfig(vocab_size=8, dim=16, num_heads=2, num_layers=2, position="none")


def _layers(net: M.TinyTransformer) -> list[M.CausalSelfAttention]:
    return [m for m in net.modules() if isinstance(m, M.CausalSelfAttention)]


# ---- the window ------------------------------------------------------------------------


@pytest.mark.parametrize("window", [1, 3, 8, 40])
@pytest.mark.parametrize(("L", "S"), [(12, 12), (1, 12), (5, 9)])
def test_sliding_window_bias_against_a_loop(window: int, L: int, S: int) -> None:
    bias = HP.sliding_window_bias(window, L, S, dtype=torch.float64)
    assert bias.shape == (L, S) and bias.dtype == torch.float64
    for row in range(L):
        i = S - L + row  # the query's position: the last L of the S keys
        for j in range(S):
            inside = i - window < j <= i
            assert bias[row, j].item() == (0.0 if inside else -math.inf)


def test_sliding_window_bias_is_hugging_faces_predicate() -> None:
    transformers = pytest.importorskip("transformers")
    from transformers.masking_utils import sliding_window_causal_mask_function

    theirs = sliding_window_causal_mask_function(5)
    bias = HP.sliding_window_bias(5, 11, 11)
    i, j = torch.arange(11)[:, None], torch.arange(11)[None, :]
    zero = torch.tensor(0)
    assert torch.equal(theirs(zero, zero, i, j), bias == 0)
    assert transformers  # the test-only dependency


def test_local_layer_honours_its_window() -> None:
    """Changing a key W or more places back leaves a query's output unchanged; changing
    one W - 1 back changes it (RoPE-local); a global RoPE layer sees both."""
    torch.manual_seed(0)
    local = HP.LocalRotarySelfAttention(16, 2, window=4).eval()
    wide = M.RotarySelfAttention(16, 2).eval()
    wide.load_state_dict(local.state_dict())
    x = torch.randn(2, 12, 16)
    for far, changes in ((11 - 4, False), (11 - 3, True)):
        y = x.clone()
        y[:, far] += 1.0  # the key at position `far`, seen from the query at 11
        with torch.no_grad():
            moved = (local(y)[:, 11] - local(x)[:, 11]).abs().max().item()
            moved_wide = (wide(y)[:, 11] - wide(x)[:, 11]).abs().max().item()
        assert (moved > 1e-4) is changes, far
        assert moved_wide > 1e-4
    # the first W queries see every key before them: the global layer's outputs
    with torch.no_grad():
        torch.testing.assert_close(local(x)[:, :4], wide(x)[:, :4])


def test_local_layer_is_sdpa_with_hugging_faces_window() -> None:
    """The layer's output: RoPE'd queries and keys, then torch's SDPA with the bool mask
    of companion.masks.sliding_window_causal."""
    from torch.nn import functional as F

    from companion.masks import materialize_mask, sliding_window_causal

    torch.manual_seed(1)
    layer = HP.LocalRotarySelfAttention(16, 2, window=3).eval()
    x = torch.randn(2, 9, 16)
    q, k = layer._split(layer.q_proj(x)), layer._split(layer.k_proj(x))
    v = layer._split(layer.v_proj(x))
    q, k = M.RotarySelfAttention.transform_qk(layer, q, k)
    mask = materialize_mask(sliding_window_causal(3), 2, 9, 9)  # (B, 1, L, S)
    heads = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, H, L, D/H)
    expected = layer.out_proj(heads.transpose(1, 2).reshape(2, 9, 16))
    with torch.no_grad():
        torch.testing.assert_close(layer(x), expected)


def test_nope_layer_ignores_positions() -> None:
    """The global NoPE layer is permutation-equivariant over the keys it sees: a query's
    output is the same whatever order the keys before it come in."""
    net = E.build(lambda: HP.HybridPositionTransformer(_CONFIG, window=3), 0)
    nope = _layers(net)[1]
    assert type(nope) is M.CausalSelfAttention
    x = torch.randn(3, 10, 16)
    order = torch.cat([torch.randperm(9, generator=torch.Generator().manual_seed(2)),
                       torch.tensor([9])])  # fmt: skip
    with torch.no_grad():
        torch.testing.assert_close(nope(x[:, order])[:, -1], nope(x)[:, -1])


# ---- the pattern as data ---------------------------------------------------------------


def test_pattern_builds_one_layer_per_entry() -> None:
    config = dataclasses.replace(_CONFIG, num_layers=4)
    pattern = ("rope-local", "rope-local", "rope-global", "nope-global")
    net = HP.HybridPositionTransformer(config, pattern, window=5)
    kinds = [type(m) for m in _layers(net)]
    assert kinds == [HP.LocalRotarySelfAttention] * 2 + [
        M.RotarySelfAttention,
        M.CausalSelfAttention,
    ]
    assert [m.window for m in _layers(net)[:2]] == [5, 5]
    assert net.pattern == pattern and net.window == 5
    out = net(torch.randint(0, 8, (2, 20)))
    assert out.shape == (2, 20, 8)
    assert "window=5" in repr(net)  # train_batched's key tells windows apart


@pytest.mark.parametrize(("kind", "position"), [("rope-global", "rope"),
                                                ("nope-global", "none")])  # fmt: skip
def test_uniform_patterns_are_the_tiny_transformer(kind: str, position: str) -> None:
    """All-RoPE and all-NoPE patterns are the position family's models, weight for weight."""
    ours = E.build(lambda: HP.HybridPositionTransformer(_CONFIG, (kind,) * 2), 3)
    theirs = E.build(
        lambda: M.TinyTransformer(dataclasses.replace(_CONFIG, position=position)), 3
    )
    ids = torch.randint(0, 8, (2, 24))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), theirs(ids), rtol=0, atol=0)


def test_window_at_least_the_length_is_the_global_layer() -> None:
    ids = torch.randint(0, 8, (2, 12))
    ours = E.build(lambda: HP.HybridPositionTransformer(_CONFIG, ["rope-local"] * 2,
                                                        window=12), 5)  # fmt: skip
    theirs = E.build(
        lambda: HP.HybridPositionTransformer(_CONFIG, ["rope-global"] * 2), 5
    )
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), theirs(ids))


def test_the_hybrid_trains_batched_like_one_at_a_time() -> None:
    """vmap through the window's bias: train_batched's losses are train's."""
    kw = dict(steps=3, batch_size=4, length=10, lag=2, lr=1e-2)
    nets = [E.build(lambda: HP.HybridPositionTransformer(_CONFIG, window=3), s)
            for s in (0, 1)]  # fmt: skip
    single = [E.build(lambda: HP.HybridPositionTransformer(_CONFIG, window=3), s)
              for s in (0, 1)]  # fmt: skip
    batched = E.train_batched(nets, seeds=[0, 1], **kw)
    for net, run, seed in zip(single, batched, (0, 1), strict=True):
        alone = E.train(net, seed=seed, **kw)
        torch.testing.assert_close(
            torch.tensor(run.losses), torch.tensor(alone.losses), rtol=1e-4, atol=1e-5
        )


# ---- the comparison --------------------------------------------------------------------

_SMALL = dict(seeds=(0, 1), steps=3, training_length=6, eval_length=10, lag=2,
              batch_size=4, num_sequences=8, config=_CONFIG)  # fmt: skip


def test_compare_hybrid_positions_small() -> None:
    r = HP.compare_hybrid_positions(window=3, **_SMALL)
    assert r.schemes == HP.HYBRID_SCHEMES == ("hybrid", "rope", "none")
    assert r.seeds == (0, 1)
    for s in r.schemes:
        assert r.losses[s].shape == (2, 3) and r.accuracy[s].shape == (2, 10)
    assert [type(m) for m in _layers(r.models["hybrid"][0])] == [
        HP.LocalRotarySelfAttention,
        M.CausalSelfAttention,
    ]
    assert type(r.models["rope"][0]) is M.TinyTransformer


def test_compare_hybrid_is_build_train_batched_and_position_accuracy() -> None:
    r = HP.compare_hybrid_positions(window=3, **_SMALL)
    nets = [E.build(lambda: HP.HybridPositionTransformer(_CONFIG, window=3), s)
            for s in (0, 1)]  # fmt: skip
    E.train_batched(nets, seeds=[0, 1], steps=3, batch_size=4, length=6, lag=2,
                    lr=1e-2, warmup_steps=50, schedule="cosine")  # fmt: skip
    acc = torch.stack(
        [M.position_accuracy(n, length=10, lag=2, num_sequences=8) for n in nets]
    )
    torch.testing.assert_close(r.accuracy["hybrid"], acc, equal_nan=True)


def test_chapter_constants() -> None:
    assert HP.HYBRID_PATTERN == ("rope-local", "nope-global")
    assert HP.HYBRID_WINDOW == 8 and HP.HYBRID_SEEDS == 3
    assert set(HP.HYBRID_STEPS) == set(HP.HYBRID_SCHEMES)
    assert HP.HYBRID_STEPS["rope"] == PC.POSITION_FAMILY_STEPS["rope"]


# ---- bad input -------------------------------------------------------------------------

BAD_INPUTS = [
    (
        "sliding_window_bias",
        lambda: HP.sliding_window_bias(0, 4, 4),
        ValueError,
        "window must be",
    ),
    (
        "sliding_window_bias",
        lambda: HP.sliding_window_bias(2.0, 4, 4),
        TypeError,
        "window must be",
    ),
    (
        "sliding_window_bias",
        lambda: HP.sliding_window_bias(2, 0, 4),
        ValueError,
        "query_length must be",
    ),
    (
        "sliding_window_bias",
        lambda: HP.sliding_window_bias(2, 5, 4),
        ValueError,
        "key_length must be",
    ),
    (
        "sliding_window_bias",
        lambda: HP.sliding_window_bias(2, 4, 4, dtype=torch.int64),
        TypeError,
        "dtype",
    ),
    (
        "sliding_window_bias",
        lambda: HP.sliding_window_bias(2, 4, 4, dtype="float32"),
        TypeError,
        "dtype",
    ),
    (
        "LocalRotarySelfAttention",
        lambda: HP.LocalRotarySelfAttention(16, 2, window=0),
        ValueError,
        "window must",
    ),
    (
        "LocalRotarySelfAttention",
        lambda: HP.LocalRotarySelfAttention(16, 2, window=None),
        TypeError,
        "window must",
    ),
    (
        "LocalRotarySelfAttention",
        lambda: HP.LocalRotarySelfAttention(6, 2, window=3),
        ValueError,
        "even",
    ),
    (
        "HybridPositionTransformer",
        lambda: HP.HybridPositionTransformer("config"),
        TypeError,
        "config must be",
    ),
    (
        "HybridPositionTransformer",
        lambda: HP.HybridPositionTransformer(
            dataclasses.replace(_CONFIG, position="rope")
        ),
        ValueError,
        "config.position must be 'none'",
    ),
    (
        "HybridPositionTransformer",
        lambda: HP.HybridPositionTransformer(_CONFIG, ("rope-local",)),
        ValueError,
        "pattern must hold 2 layer kinds",
    ),
    (
        "HybridPositionTransformer",
        lambda: HP.HybridPositionTransformer(_CONFIG, "rope-local"),
        TypeError,
        "pattern must be a tuple or list",
    ),
    (
        "HybridPositionTransformer",
        lambda: HP.HybridPositionTransformer(_CONFIG, ("rope-local", "alibi")),
        ValueError,
        r"pattern\[1\] must be one of 'rope-local'",
    ),
    (
        "HybridPositionTransformer",
        lambda: HP.HybridPositionTransformer(_CONFIG, window=-1),
        ValueError,
        "window must be",
    ),
    (
        "compare_hybrid_positions",
        lambda: HP.compare_hybrid_positions(window=0),
        ValueError,
        "window must be",
    ),
    (
        "compare_hybrid_positions",
        lambda: HP.compare_hybrid_positions(pattern=("rope-local",) * 3),
        ValueError,
        "pattern must hold 2 layer kinds",
    ),
    (
        "compare_hybrid_positions",
        lambda: HP.compare_hybrid_positions(pattern=("rope-local", 1)),
        TypeError,
        r"pattern\[1\] must be one of",
    ),
    (
        "compare_hybrid_positions",
        lambda: HP.compare_hybrid_positions(seeds=(0, 0)),
        ValueError,
        "seeds",
    ),
    (
        "compare_hybrid_positions",
        lambda: HP.compare_hybrid_positions(steps={"hybrid": 3}),
        ValueError,
        "steps must give every scheme",
    ),
]


@pytest.mark.parametrize(("name", "call", "error", "match"), BAD_INPUTS)
def test_bad_input(name, call, error, match) -> None:
    with pytest.raises(error, match=match):
        call()
