"""Chapter 05's checkers (attention): correct answers in several styles, torch's own
included, pass; each named mistake is named."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from companion import checks
from companion.attention import (
    causal_mask,
    scaled_dot_product_attention,
    tiled_attention,
)

# ---- check_attention -----------------------------------------------------------------


def attention_loops(query, key, value):
    out = torch.empty(*query.shape[:-1], value.shape[-1])
    flat_q, flat_k, flat_v = (t.reshape(-1, *t.shape[-2:]) for t in (query, key, value))
    flat_out = out.view(-1, *out.shape[-2:])
    for b in range(flat_q.shape[0]):
        for i in range(flat_q.shape[1]):
            scores = [float(flat_q[b, i] @ flat_k[b, j]) / math.sqrt(query.shape[-1])
                      for j in range(flat_k.shape[1])]  # fmt: skip
            top = max(scores)
            weights = [math.exp(s - top) for s in scores]
            total = sum(weights)
            flat_out[b, i] = sum(
                w / total * flat_v[b, j] for j, w in enumerate(weights)
            )
    return out


def attention_numpy(q, k, v, /):
    q, k, v = (np.asarray(t, dtype=np.float64) for t in (q, k, v))
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    w = np.exp(s - s.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True)) @ v


def attention_in_place(query, key, value):
    query /= math.sqrt(query.shape[-1])  # modifies the caller's tensor
    return torch.softmax(query @ key.mT, dim=-1) @ value


@pytest.mark.parametrize(
    "answer",
    [
        attention_loops,
        attention_numpy,
        attention_in_place,
        F.scaled_dot_product_attention,
        lambda query, key, value: scaled_dot_product_attention(query, key, value),
    ],
    ids=["loops", "numpy", "in-place", "torch-sdpa", "companion"],
)
def test_attention_accepts(answer) -> None:
    assert checks.check_attention(answer)


@pytest.mark.parametrize(
    ("answer", "name"),
    [
        (lambda q, k, v: torch.softmax(q @ k.mT, dim=-1) @ v, "missing 1/sqrt(d_k)"),
        (
            lambda q, k, v: torch.softmax(q @ k.mT / q.shape[-1] ** 0.5, dim=-2) @ v,
            "softmax over the wrong axis",
        ),
        (
            lambda q, k, v: torch.softmax(q @ k.mT / q.shape[-1], dim=-1) @ v,
            "divided by d_k instead of sqrt(d_k)",
        ),
    ],
)
def test_attention_names(answer, name, named) -> None:
    named(lambda: checks.check_attention(answer), name)


# ---- check_masked_attention ----------------------------------------------------------


def masked_fill(query, key, value, mask):
    scores = query @ key.mT / math.sqrt(query.shape[-1])
    return torch.softmax(scores.masked_fill(~mask, -math.inf), dim=-1) @ value


def masked_additive(q, k, v, allowed, /):
    bias = torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))
    return torch.softmax(q @ k.mT / math.sqrt(q.shape[-1]) + bias, dim=-1) @ v


@pytest.mark.parametrize(
    "answer",
    [
        masked_fill,
        masked_additive,
        lambda query, key, value, mask: F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask
        ),
    ],
    ids=["masked_fill", "additive", "torch-sdpa"],
)
def test_masked_attention_accepts(answer) -> None:
    assert checks.check_masked_attention(answer)


def test_masked_attention_names(named) -> None:
    def after(query, key, value, mask):
        weights = torch.softmax(query @ key.mT / query.shape[-1] ** 0.5, dim=-1)
        return weights.masked_fill(~mask, 0.0) @ value

    named(
        lambda: checks.check_masked_attention(after), "mask applied after the softmax"
    )
    named(
        lambda: checks.check_masked_attention(
            lambda q, k, v, m: masked_fill(q, k, v, ~m)
        ),
        "mask inverted",
    )

    def unscaled(query, key, value, mask):
        return torch.softmax((query @ key.mT).masked_fill(~mask, -math.inf), -1) @ value

    named(lambda: checks.check_masked_attention(unscaled), "missing 1/sqrt(d_k)")


# ---- check_causal_mask ---------------------------------------------------------------


def causal_loops(query_length, key_length):
    return [[j <= i for j in range(key_length)] for i in range(query_length)]


@pytest.mark.parametrize(
    "answer",
    [
        lambda query_length, key_length: causal_mask(query_length, key_length),
        causal_loops,
        lambda n, m, /: np.tril(np.ones((n, m), dtype=bool)),
        lambda n, m: torch.arange(m)[None, :] <= torch.arange(n)[:, None],
    ],
    ids=["companion", "lists", "numpy", "broadcast"],
)
def test_causal_mask_accepts(answer) -> None:
    assert checks.check_causal_mask(answer)


def test_causal_mask_names(named) -> None:
    def tril(diagonal):
        return lambda n, m: torch.ones(n, m, dtype=torch.bool).tril(diagonal)

    named(
        lambda: checks.check_causal_mask(tril(-1)),
        "causal mask off by one (the diagonal is excluded)",
    )
    named(
        lambda: checks.check_causal_mask(tril(1)),
        "causal mask off by one (one future key is visible)",
    )
    named(
        lambda: checks.check_causal_mask(lambda n, m: ~tril(0)(n, m)), "mask inverted"
    )

    def bottom_right(query_length, key_length):
        return causal_mask(query_length, key_length, alignment="bottom_right")

    named(lambda: checks.check_causal_mask(bottom_right), "bottom-right alignment")


def test_causal_mask_wants_bool() -> None:
    with pytest.raises(
        checks.CheckError, match=r"expected: torch.bool\n  got:      torch.int32"
    ):
        checks.check_causal_mask(lambda n, m: causal_mask(n, m).int())


# ---- check_split_heads ---------------------------------------------------------------


def split_loops(x, num_heads):
    width = x.shape[-1] // num_heads
    return torch.stack(
        [x[..., h * width : (h + 1) * width] for h in range(num_heads)], dim=1
    )


@pytest.mark.parametrize(
    "answer",
    [
        lambda x, num_heads: x.view(x.shape[0], x.shape[1], num_heads, -1).transpose(
            1, 2
        ),
        split_loops,
        lambda t, h, /: np.moveaxis(t.numpy().reshape(*t.shape[:2], h, -1), 2, 1),
        lambda x, num_heads: torch.stack(x.chunk(num_heads, dim=-1), dim=1),
    ],
    ids=["view-transpose", "loops", "numpy", "chunk"],
)
def test_split_heads_accepts(answer) -> None:
    assert checks.check_split_heads(answer)


def test_split_heads_names(named) -> None:
    named(
        lambda: checks.check_split_heads(
            lambda x, h: x.reshape(x.shape[0], h, x.shape[1], -1)
        ),
        "reshaped to (B, H, L, D/H) directly",
    )


# ---- check_tiled_attention -----------------------------------------------------------


def tiled_by_hand(
    query, key, value, block_size, rescaled=True, rescale_sum=None, rescale_acc=None
):
    q = query / math.sqrt(query.shape[-1])
    m = torch.full((*query.shape[:-1], 1), -math.inf)
    total = torch.zeros_like(m)
    acc = torch.zeros(*query.shape[:-1], value.shape[-1])
    for start in range(0, key.shape[-2], block_size):
        s = q @ key[..., start : start + block_size, :].mT
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        rescale = torch.exp(m - m_new)
        p = torch.exp(s - m_new)
        on_sum = rescaled if rescale_sum is None else rescale_sum
        on_acc = rescaled if rescale_acc is None else rescale_acc
        total = total * (rescale if on_sum else 1.0) + p.sum(-1, keepdim=True)
        acc = (
            acc * (rescale if on_acc else 1.0)
            + p @ value[..., start : start + block_size, :]
        )
        m = m_new
    return acc / total


@pytest.mark.parametrize(
    "answer",
    [
        tiled_by_hand,
        lambda q, k, v, b, /: tiled_attention(q, k, v, block_size=b),
    ],
    ids=["by-hand", "companion"],
)
def test_tiled_attention_accepts(answer) -> None:
    assert checks.check_tiled_attention(answer)


def test_tiled_attention_names(named) -> None:
    named(
        lambda: checks.check_tiled_attention(
            lambda *a: tiled_by_hand(*a, rescaled=False)
        ),
        "running sums not rescaled",
    )
    named(
        lambda: checks.check_tiled_attention(
            lambda *a: tiled_by_hand(*a, rescale_sum=True, rescale_acc=False)
        ),
        "accumulated values not rescaled",
    )
    named(
        lambda: checks.check_tiled_attention(
            lambda *a: tiled_by_hand(*a, rescale_sum=False, rescale_acc=True)
        ),
        "running sum not rescaled",
    )

    def no_max(query, key, value, block_size):
        e = torch.exp(query @ key.mT / query.shape[-1] ** 0.5)
        return (e @ value) / e.sum(-1, keepdim=True)

    with pytest.raises(checks.CheckError, match="NaN or inf"):
        checks.check_tiled_attention(no_max)


def test_attention_names_forgot_at_v(named) -> None:
    def weights_only(query, key, value):
        d = query.shape[-1]
        return torch.softmax(query @ key.mT / d**0.5, dim=-1)

    named(lambda: checks.check_attention(weights_only), "forgot @ v")


# ---- issue 37 (D4): natural mistakes in words ------------------------------------------


def test_causal_mask_names_the_upper_triangle(named) -> None:
    err = named(
        lambda: checks.check_causal_mask(
            lambda L, S: torch.ones(L, S, dtype=torch.bool).triu()
        ),
        "upper triangle (triu instead of tril)",
    )
    lines = err._render_traceback_()
    assert "relative error" not in str(err) and "tolerance" not in str(err)
    # the 5 x 5 masks drawn side by side, one row per query: expected, then the answer
    assert lines[2].split() == ["expected", "got"], lines
    assert lines[3].split() == ["1", ".", ".", ".", ".", "1", "1", "1", "1", "1"]
    assert lines[7].split() == ["1"] * 5 + [".", ".", ".", ".", "1"]
    assert len(lines) == 3 + 5


def test_an_unnamed_wrong_mask_is_compared_as_booleans() -> None:
    def one_row_wrong(L, S):
        mask = torch.ones(L, S, dtype=torch.bool).tril()
        mask[2, 0] = False
        return mask

    with pytest.raises(checks.CheckError) as info:
        checks.check_causal_mask(one_row_wrong)
    err = info.value
    assert err.mistake is None
    assert err.detail == (
        "1 of 25 entries differ (1 False where True is expected); the first at index "
        "(2, 0): expected True, got False."
    )
    assert "relative error" not in str(err) and "atol" not in str(err)
    # row 2 of the answer: expected "1 1 1 . .", got ". 1 1 . ."
    assert err.grid.splitlines()[3].split() == "1 1 1 . . . 1 1 . .".split()


# ---- review R3a-12, B8, B9: each natural wrong answer named by what is wrong ------------


def _scores(query, key):
    return query @ key.mT / math.sqrt(query.shape[-1])


def _masked_softmax_after_renormalizing(query, key, value, mask):
    weights = torch.softmax(_scores(query, key), dim=-1) * mask
    return weights / weights.sum(-1, keepdim=True) @ value


@pytest.mark.parametrize(
    "answer",
    [
        lambda q, k, v, m: torch.softmax(_scores(q, k).masked_fill(~m, -1e9), -1) @ v,
        lambda q, k, v, m: (
            torch.softmax(_scores(q, k).masked_fill(~m, torch.finfo(q.dtype).min), -1)
            @ v
        ),
        lambda q, k, v, m: (
            torch.softmax(torch.where(m, _scores(q, k), -math.inf), dim=-1) @ v
        ),
        _masked_softmax_after_renormalizing,
    ],
    ids=["fill-1e9", "fill-finfo-min", "where", "renormalized"],
)
def test_masked_attention_accepts_every_equivalent_form(answer) -> None:
    assert checks.check_masked_attention(answer)


ZEROED = "masked scores set to 0 (multiplied by the mask, or filled with 0)"


@pytest.mark.parametrize(
    ("answer", "name"),
    [
        # (a), B9: both give the blocked keys a score of 0, and one message says so
        (lambda q, k, v, m: torch.softmax(_scores(q, k) * m, -1) @ v, ZEROED),
        (
            lambda q, k, v, m: (
                torch.softmax(_scores(q, k).masked_fill(~m, 0.0), -1) @ v
            ),
            ZEROED,
        ),
        # (b)
        (lambda q, k, v, m: torch.softmax(_scores(q, k), -1) @ v, "mask ignored"),
        (
            lambda q, k, v, m: torch.softmax(_scores(q, k) + m, -1) @ v,
            "boolean mask added to the scores",
        ),
        (
            lambda q, k, v, m: (
                torch.softmax((q @ k.mT / q.shape[-1]).masked_fill(~m, -math.inf), -1)
                @ v
            ),
            "divided by d_k instead of sqrt(d_k)",
        ),
    ],
    ids=["multiplied", "filled-0", "ignored", "bool-added", "1/d_k"],
)
def test_masked_attention_names_each_natural_mistake(answer, name, named) -> None:
    err = named(lambda: checks.check_masked_attention(answer), name)
    # the first line says what is wrong, with no count of differing values
    assert err.detail.startswith(f'This is the known mistake "{name}": ')
    assert "values differ" not in str(err)
    # the message names neither code the learner may not have written
    if name == ZEROED:
        assert "softmax(scores * mask)" not in err.detail


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_causal_mask_names_an_additive_mask(dtype, named) -> None:
    def additive(query_length, key_length):
        allowed = torch.ones(query_length, key_length, dtype=torch.bool).tril()
        return torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, -math.inf)

    err = named(
        lambda: checks.check_causal_mask(additive),
        "additive mask (0 / -inf) instead of a boolean one",
    )
    # B8: no advice to cast, which would turn -inf into True and 0 into False
    assert ".to(torch.bool)" not in str(err)
    assert "True where a query may attend" in err.detail
    assert (err.expected, err.got) == ("torch.bool", str(dtype))


def test_causal_mask_float_with_large_negatives_is_not_told_to_cast() -> None:
    def additive(n, m):
        return torch.zeros(n, m).masked_fill(~torch.ones(n, m).tril().bool(), -1e9)

    with pytest.raises(checks.CheckError) as info:
        checks.check_causal_mask(additive)
    assert info.value.detail == (
        "The exercise asks for bool; your answer is float32 (it holds values other "
        "than 0 and 1, such as -1000000000: .to(torch.bool) would make every nonzero "
        "entry True, so compute the True/False answer itself)."
    )


def test_causal_mask_float_of_zeros_and_ones_is_told_to_cast() -> None:
    with pytest.raises(checks.CheckError) as info:
        checks.check_causal_mask(lambda n, m: causal_mask(n, m).float())
    assert info.value.detail == (
        "The exercise asks for bool; your answer is float32 (compute in bool, or end "
        "with .to(torch.bool))."
    )


def test_a_drawn_mask_is_not_also_printed_flat(named) -> None:
    # (f): the grid replaces the flat preview that ran row 0 into row 1
    err = named(
        lambda: checks.check_causal_mask(
            lambda n, m: torch.ones(n, m, dtype=torch.bool).triu(1)
        ),
        "mask inverted",
    )
    text = str(err)
    assert "25 values" not in text and "expected:" not in text, text
    assert text.splitlines()[2].split() == ["expected", "got"]
    assert err._render_traceback_()[2].split() == ["expected", "got"]


def flash_v1(query, key, value, block_size):
    """Another correct form: the output kept normalized after every block (as
    FlashAttention-1 does), instead of dividing once at the end."""
    q = query / math.sqrt(query.shape[-1])
    m = torch.full((*query.shape[:-1], 1), -math.inf)
    total = torch.zeros_like(m)
    out = torch.zeros(*query.shape[:-1], value.shape[-1])
    for start in range(0, key.shape[-2], block_size):
        s = q @ key[..., start : start + block_size, :].mT
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        p = torch.exp(s - m_new)
        total_new = total * torch.exp(m - m_new) + p.sum(-1, keepdim=True)
        v = value[..., start : start + block_size, :]
        out = (out * total * torch.exp(m - m_new) + p @ v) / total_new
        m, total = m_new, total_new
    return out


def test_tiled_attention_accepts_a_normalized_running_output() -> None:
    assert checks.check_tiled_attention(flash_v1)


def test_tiled_attention_names_each_block_on_its_own_maximum(named) -> None:
    # (c): no running maximum, each block shifted by its own
    def own_max(query, key, value, block_size):
        q = query / math.sqrt(query.shape[-1])
        total = torch.zeros(*query.shape[:-1], 1)
        acc = torch.zeros(*query.shape[:-1], value.shape[-1])
        for s0 in range(0, key.shape[-2], block_size):
            s = q @ key[..., s0 : s0 + block_size, :].mT
            p = torch.exp(s - s.amax(-1, keepdim=True))
            total = total + p.sum(-1, keepdim=True)
            acc = acc + p @ value[..., s0 : s0 + block_size, :]
        return acc / total

    err = named(
        lambda: checks.check_tiled_attention(own_max),
        "each block uses its own maximum, earlier blocks not rescaled",
    )
    assert "values differ" not in str(err)
