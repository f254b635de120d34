"""The attention chapter's claims (book/05_attention.ipynb), each against an oracle.

Which causal alignment empties rows, when nn.MultiheadAttention returns NaN for a fully
masked row, the path lengths of Vaswani et al.'s Table 1, the crossover of the per-layer
costs (n = d), the online softmax, multi-head attention head by head, the vanishing
recurrent gradient, the bytes the textbook softmax moves and the arithmetic intensities
compared with a machine balance, and the fitted log-log slopes of the memory curves.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from companion.attention import (
    attention_weights,
    causal_mask,
    measure_peak_memory,
    scaled_dot_product_attention,
    tiled_attention,
)
from companion.performance import attention_flops, memory_traffic

# ---- masks: which rows a causal mask empties -----------------------------------------


@pytest.mark.parametrize("query_length", range(1, 9))
@pytest.mark.parametrize("key_length", range(1, 9))
def test_empty_rows_of_causal_alignments(query_length: int, key_length: int) -> None:
    """Top-left never empties a row; bottom-right empties the first L - S when L > S."""
    for alignment, offset in (
        ("top_left", 0),
        ("bottom_right", key_length - query_length),
    ):
        mask = causal_mask(query_length, key_length, alignment=alignment)
        empty = [i for i in range(query_length) if not mask[i].any()]
        # the loop oracle: row i keeps keys j <= i + offset, none when i + offset < 0
        expected = [i for i in range(query_length) if i + offset < 0]
        assert empty == expected
    bottom = causal_mask(query_length, key_length, alignment="bottom_right")
    assert int((~bottom.any(-1)).sum()) == max(query_length - key_length, 0)


# ---- a fully masked row: who returns NaN ---------------------------------------------


def _fully_masked_row(
    training: bool = False,
    grad: bool = False,
    need_weights: bool = False,
    cross: bool = False,
    float_mask: bool = False,
    fast_path: bool = True,
    monkeypatch: pytest.MonkeyPatch | None = None,
) -> tuple[str, bool]:
    """(outcome, whether the native fast-path kernel ran) for a query with no key."""
    calls = []
    native = torch._native_multi_head_attention

    def spy(*args, **kwargs):
        calls.append(1)
        return native(*args, **kwargs)

    assert monkeypatch is not None
    monkeypatch.setattr(torch, "_native_multi_head_attention", spy)
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(4, 2, batch_first=True).train(training)
    x = torch.randn(1, 3, 4)
    kv = torch.randn(1, 3, 4) if cross else x
    blocked = torch.zeros(3, 3, dtype=torch.bool)
    blocked[1] = True
    mask = torch.zeros(3, 3).masked_fill(blocked, -math.inf) if float_mask else blocked
    torch.backends.mha.set_fastpath_enabled(fast_path)
    try:
        with torch.set_grad_enabled(grad):
            row = mha(x, kv, kv, attn_mask=mask, need_weights=need_weights)[0][0, 1]
    finally:
        torch.backends.mha.set_fastpath_enabled(True)
    outcome = "NaN" if row.isnan().all() else "0" if (row == 0).all() else "other"
    return outcome, bool(calls)


MHA_CASES = [
    # (settings, takes the fast path, outcome)
    ({"training": True, "grad": True, "need_weights": True}, False, "NaN"),
    ({"training": True, "grad": True}, False, "0"),
    ({"grad": True}, False, "0"),
    ({"need_weights": True}, True, "NaN"),
    ({}, True, "NaN"),
    ({"cross": True}, False, "0"),
    ({"float_mask": True}, False, "0"),
    ({"fast_path": False}, False, "0"),
]


@pytest.mark.parametrize(("settings", "fast", "outcome"), MHA_CASES, ids=str)
def test_multihead_attention_nan_rule(
    settings: dict, fast: bool, outcome: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NaN exactly when need_weights=True or the fast path runs (as in the chapter)."""
    got, ran_fast = _fully_masked_row(**settings, monkeypatch=monkeypatch)
    assert ran_fast == fast
    assert got == outcome
    assert (got == "NaN") == (settings.get("need_weights", False) or ran_fast)


@pytest.mark.parametrize("backend", [SDPBackend.MATH, SDPBackend.FLASH_ATTENTION])
def test_sdpa_fully_masked_row_is_zero_like_the_package(backend: SDPBackend) -> None:
    """torch's SDPA (CPU) returns zeros for a row with no key, as the package does."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, n, 4, generator=gen) for n in (3, 5, 5))
    allowed = torch.ones(3, 5, dtype=torch.bool)
    allowed[1] = False
    with sdpa_kernel(backend):
        theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
    ours = scaled_dot_product_attention(q, k, v, mask=allowed)
    assert (theirs[0, 0, 1] == 0).all() and (ours[0, 0, 1] == 0).all()
    torch.testing.assert_close(ours, theirs)
    plain = torch.softmax(
        (q @ k.transpose(-2, -1)).masked_fill(~allowed, -math.inf), -1
    )
    assert plain[0, 0, 1].isnan().all()


# ---- why self-attention: Table 1's path lengths, the cost crossover ------------------


def _layers_until_connected(n: int, depends) -> int:
    reach = torch.eye(n, dtype=torch.int64)
    for layer in range(1, n + 1):
        reach = ((depends(layer).long() @ reach) > 0).long()
        if reach[n - 1, 0]:
            return layer
    raise AssertionError("never connected")


@pytest.mark.parametrize("n", [8, 27, 64, 100])
@pytest.mark.parametrize("k", [2, 3, 5])
def test_path_lengths_of_table_one(n: int, k: int) -> None:
    """O(1) for attention, n - 1 recurrent steps, O(n/k) and O(log_k n) convolutions."""
    pos = torch.arange(n)
    offset = pos[:, None] - pos[None, :]
    every = _layers_until_connected(n, lambda _: torch.ones(n, n, dtype=torch.bool))
    recurrent = _layers_until_connected(n, lambda _: (offset == 0) | (offset == 1))
    contiguous = _layers_until_connected(n, lambda _: (offset >= 0) & (offset < k))
    dilated = _layers_until_connected(
        n, lambda m: (offset >= 0) & (offset % k ** (m - 1) == 0) & (offset < k**m)
    )
    assert every == 1
    assert recurrent == n - 1
    assert contiguous == math.ceil((n - 1) / (k - 1))
    # receptive field k**m must exceed the distance n - 1
    assert dilated == min(m for m in range(1, n + 1) if k**m > n - 1)


def _counted_flops(fn) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def _recurrent_flops(n: int, d: int) -> int:
    """Flops torch counts for n steps of h = tanh(h W_h + x_t U_x), width d."""
    w_h, u_x, xs = torch.randn(d, d), torch.randn(d, d), torch.randn(n, 1, d)

    def run() -> None:
        h = torch.zeros(1, d)
        for x_t in xs:
            h = torch.tanh(h @ w_h + x_t @ u_x)

    return _counted_flops(run)


def _attention_flops_counted(n: int, d: int) -> int:
    q, k, v = (torch.randn(1, 1, n, d) for _ in range(3))
    return _counted_flops(lambda: torch.softmax(q @ k.transpose(-2, -1), -1) @ v)


@pytest.mark.parametrize("d", [16, 48])
def test_self_attention_cheaper_than_recurrent_below_the_width(d: int) -> None:
    """Counted by torch's FlopCounterMode: a recurrent layer does two d x d products per
    step (4 n d^2), attention 4 n^2 d; equal at n = d (the paper's n < d), the chapter's
    5.37e8 at n = d = 512."""
    for n in (d - 1, d, d + 1):
        rnn, att = _recurrent_flops(n, d), _attention_flops_counted(n, d)
        assert rnn == 4 * n * d**2
        assert att == attention_flops(1, 1, n, n, d)
        assert (att < rnn, att == rnn, att > rnn) == (n < d, n == d, n > d)
    assert attention_flops(1, 1, 512, 512, 512) == 4 * 512 * 512**2 == 536_870_912


def test_online_softmax_recurrence_against_torch() -> None:
    """m' = max(m, max x_j), l' = l e^(m - m') + sum e^(x_j - m'); softmax, lse."""
    gen = torch.Generator().manual_seed(0)
    for block in (1, 3, 7, 64):
        row = 30 * torch.randn(50, generator=gen, dtype=torch.float64)
        m, total = -math.inf, 0.0
        for start in range(0, row.numel(), block):
            x = row[start : start + block]
            m_new = max(m, x.max().item())
            total = total * math.exp(m - m_new) + torch.exp(x - m_new).sum().item()
            m = m_new
        torch.testing.assert_close(torch.exp(row - m) / total, torch.softmax(row, 0))
        assert abs(m + math.log(total) - torch.logsumexp(row, 0).item()) < 1e-12


def test_multi_head_formula_head_by_head_equals_the_module() -> None:
    """MHA(X) = [head_0; ...; head_{H-1}] W_O, head_h on columns hD/H .. (h+1)D/H - 1"""
    from companion.attention import MultiHeadAttention

    torch.manual_seed(0)
    D, H = 12, 3
    mha = MultiHeadAttention(D, H)
    x = torch.randn(2, 5, D)
    q, k, v = mha.q_proj(x), mha.k_proj(x), mha.v_proj(x)
    heads = []
    for h in range(H):
        cols = slice(h * D // H, (h + 1) * D // H)
        w = torch.softmax(
            q[..., cols] @ k[..., cols].transpose(-2, -1) / math.sqrt(D // H), -1
        )
        heads.append(w @ v[..., cols])
    with torch.no_grad():
        torch.testing.assert_close(mha.out_proj(torch.cat(heads, -1)), mha(x, x, x))


def test_recurrent_gradient_vanishes_below_its_bound() -> None:
    """|dh_n/dx_0| <= sigma^n |U| for h_t = tanh(W h + U x_t), sigma = |W|_2 = 0.9."""
    gen = torch.Generator().manual_seed(7)
    W = torch.randn(16, 16, generator=gen, dtype=torch.float64)
    W = 0.9 * W / torch.linalg.matrix_norm(W, ord=2)
    U = torch.randn(16, 16, generator=gen, dtype=torch.float64) / 4
    for n in (1, 10, 30):
        xs = torch.randn(n + 1, 16, generator=gen, dtype=torch.float64)

        def last(xs: torch.Tensor) -> torch.Tensor:
            h = torch.zeros(16, dtype=torch.float64)
            for x_t in xs:
                h = torch.tanh(W @ h + U @ x_t)
            return h

        jac = torch.autograd.functional.jacobian(last, xs)[:, 0]
        bound = 0.9**n * torch.linalg.matrix_norm(U, ord=2)
        assert torch.linalg.matrix_norm(jac, ord=2) <= bound


def test_coreference_example_attends_to_the_animal() -> None:
    sentence = "The animal didn't cross the street because it was too tired".split()
    features = {"animal": [1, 0, 0], "street": [0, 1, 0], "cross": [0, 0, 1]}
    keys = 4.0 * torch.tensor([features.get(w, [0, 0, 0]) for w in sentence])
    it = sentence.index("it")
    allowed = torch.arange(len(sentence)) <= it
    for query, word in (([1.0, 0.0, 0.0], "animal"), ([0.0, 1.0, 0.0], "street")):
        w = attention_weights(4.0 * torch.tensor([query]), keys, mask=allowed)[0]
        assert sentence[w.argmax()] == word and w.max() > 0.99


# ---- compute- or memory-bound --------------------------------------------------------


def _textbook_attention(q, k, v, mask):
    s = q @ k.transpose(-2, -1)
    s = s / math.sqrt(q.shape[-1])
    s = s.masked_fill(~mask, -math.inf)
    m = s.amax(-1, keepdim=True)
    e = torch.exp(s - m)
    z = e.sum(-1, keepdim=True)
    return (e / z) @ v


@pytest.mark.parametrize("length", [256, 1024])
def test_textbook_attention_moves_the_scores_fifteen_times(length: int) -> None:
    d = 64
    q, k, v = (torch.randn(1, 1, length, d) for _ in range(3))
    mask = causal_mask(length, length)
    traffic = memory_traffic(lambda: _textbook_attention(q, k, v, mask))
    moved = sum(r + w for name, r, w in traffic.ops if name != "_unsafe_view")
    scores = 4 * length * length
    # hand count in units of one float32 L x L matrix: QK^T writes 1; scale 2; the mask
    # (bool, 1/4 each: read twice, written once by ~mask) 0.75 and masked_fill 2; max 1;
    # subtract 2; exp 2; sum 1; divide 2; PV reads 1. Then the L x D tensors (read Q, K,
    # V, write O: 4D/L) and the four row vectors of max and sum (4/L).
    hand = 1 + 2 + 0.75 + 2 + 1 + 2 + 2 + 1 + 2 + 1 + (4 * d + 4) / length
    assert math.isclose(moved / scores, hand)
    assert 14.75 < moved / scores < 16  # "about 15 passes over the scores"
    flops = attention_flops(1, 1, length, length, d) + 6 * length * length
    intensity = flops / moved
    assert intensity < 5 < 67e12 / 3.35e12  # below an H100's float32 balance, any L


@pytest.mark.parametrize("block", [32, 64, 128, 256])
def test_tiled_intensity_is_about_half_the_block(block: int) -> None:
    """K and V read once per query block: flops / bytes -> block / 2 in float32."""
    length, d = 16384, 64
    tiled_bytes = 4 * (2 * length * d + 2 * length * d * math.ceil(length / block))
    intensity = attention_flops(1, 1, length, length, d) / tiled_bytes
    assert block / 2 * 0.95 < intensity <= block / 2


def test_memory_slopes_are_fitted_two_and_below_one() -> None:
    lengths = [256, 512, 1024]
    full, tiled = [], []
    for n in lengths:
        q, k, v = (torch.randn(1, 1, n, 64) for _ in range(3))
        full.append(
            measure_peak_memory(
                lambda q=q, k=k, v=v: scaled_dot_product_attention(q, k, v),
                device="cpu",
            )
        )
        tiled.append(
            measure_peak_memory(
                lambda q=q, k=k, v=v: tiled_attention(q, k, v, block_size=128),
                device="cpu",
            )
        )
    slope_full = np.polyfit(np.log(lengths), np.log(full), 1)[0]
    slope_tiled = np.polyfit(np.log(lengths), np.log(tiled), 1)[0]
    assert 1.95 < slope_full < 2.05
    assert slope_tiled < 1
