r"""Checkers for chapter 05 (:ref:`ch-attention`): attention, masks, heads, tiling."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from companion import attention
from companion.checks._core import Case, Mistake, checker, known_mistake

__all__ = [
    "check_attention",
    "check_causal_mask",
    "check_masked_attention",
    "check_split_heads",
    "check_tiled_attention",
]

_sdpa = attention.scaled_dot_product_attention


def _inputs(
    gen: torch.Generator, batch: tuple[int, ...], length: int, source: int, width: int
) -> dict[str, torch.Tensor]:
    return {
        "query": torch.randn(*batch, length, width, generator=gen),
        "key": torch.randn(*batch, source, width, generator=gen),
        "value": torch.randn(*batch, source, 3, generator=gen),
    }


_missing_scale = known_mistake(
    "missing 1/sqrt(d_k)",
    "divide the scores q·k by sqrt(d_k) (the last dimension of query) before the "
    "softmax; without it their variance grows like d_k and the softmax saturates.",
)
_divided_by_d = known_mistake(
    "divided by d_k instead of sqrt(d_k)",
    "the scale is 1/sqrt(d_k): d_k ** -0.5, not 1 / d_k.",
)


@checker
def check_attention(attention: Callable[..., torch.Tensor]) -> Iterator[Case]:
    r"""Check a learner's ``attention(query, key, value)``: softmax(QKᵀ/√d_k) V.

    Properties checked: the output of scaled dot-product attention on small inputs with
    ``L != S``, and on ``d_k = 64`` where a missing scale changes the result a lot. An
    answer that scales ``query`` in place is judged on its result (it gets copies).
    Named mistakes: "missing 1/sqrt(d_k)", "softmax over the wrong axis", "divided by
    d_k instead of sqrt(d_k)", "forgot @ v" (the weights returned).

    Args:
        attention: a function ``attention(query, key, value) -> Tensor`` for
            ``(..., L, D)``, ``(..., S, D)``, ``(..., S, Dv)`` inputs.
    """
    gen = torch.Generator().manual_seed(0)
    cases = [
        ("softmax(Q Kᵀ / sqrt(d_k)) V on a small batch", (2,), 4, 6, 8),
        ("softmax(Q Kᵀ / sqrt(d_k)) V with d_k = 64", (1, 2), 5, 7, 64),
    ]
    for prop, batch, length, source, width in cases:
        inputs = _inputs(gen, batch, length, source, width)
        q, k, v = inputs.values()
        scores = q @ k.transpose(-2, -1) / width**0.5
        mistakes = [
            _missing_scale(_sdpa(q, k, v, scale=1.0)),
            Mistake(
                "softmax over the wrong axis",
                "the weights of one query must sum to one over the keys: "
                "softmax(scores, dim=-1), not dim=-2.",
                torch.softmax(scores, dim=-2) @ v,
            ),
            _divided_by_d(_sdpa(q, k, v, scale=1.0 / width)),
            Mistake(
                "forgot @ v",
                "you returned the attention weights, (..., L, S); the output is "
                "those weights times the values: softmax(...) @ value, (..., L, Dv).",
                torch.softmax(scores, dim=-1),
            ),
        ]
        yield Case(prop, inputs, _sdpa(q, k, v), mistakes)


@checker
def check_masked_attention(attention: Callable[..., torch.Tensor]) -> Iterator[Case]:
    r"""Check a learner's ``attention(query, key, value, mask)`` with a boolean mask.

    The mask follows ``F.scaled_dot_product_attention``: ``True`` where a query may
    attend. Properties checked: a padding mask that broadcasts over queries, and a
    general ``(L, S)`` mask. Named mistakes: "mask applied after the softmax", "mask
    inverted", "masked scores set to 0 (multiplied by the mask, or filled with 0)"
    (``softmax(scores * mask)``, ``scores.masked_fill(~mask, 0)``), "mask ignored",
    "boolean mask added to the scores" (``softmax(scores + mask)``), "missing
    1/sqrt(d_k)", "divided by d_k instead of sqrt(d_k)".

    Args:
        attention: a function ``attention(query, key, value, mask) -> Tensor``.
    """
    gen = torch.Generator().manual_seed(1)
    padding = torch.tensor([[True, True, True, False, False]]).unsqueeze(1)  # (1, 1, S)
    general = torch.tensor(
        [
            [True, False, True, False, True],
            [False, True, True, True, False],
            [True, True, False, False, False],
            [False, False, False, True, True],
        ]
    )  # (L, S): every row has both True and False
    cases = [
        ("padding keys get zero weight (mask broadcast over queries)", padding),
        ("a general boolean mask, True = may attend", general),
    ]
    for prop, mask in cases:
        inputs = {**_inputs(gen, (1,), 4, 5, 8), "mask": mask}
        q, k, v = inputs["query"], inputs["key"], inputs["value"]
        scores = q @ k.transpose(-2, -1) / 8**0.5  # (1, L, S)
        weights = torch.softmax(scores, dim=-1)
        mistakes = [
            Mistake(
                "mask applied after the softmax",
                "zeroing weights after the softmax leaves rows that no longer sum to "
                "one; set the masked scores to -inf BEFORE the softmax.",
                weights.masked_fill(~mask, 0.0) @ v,
            ),
            Mistake(
                "mask inverted",
                "here True means 'may attend' (torch's "
                "F.scaled_dot_product_attention); nn.MultiheadAttention uses the "
                "opposite convention.",
                _sdpa(q, k, v, mask=~mask),
            ),
            Mistake(
                "masked scores set to 0 (multiplied by the mask, or filled with 0)",
                "a score of 0 is an ordinary score: exp(0) = 1 still gives the blocked "
                "keys weight. A blocked key needs a score of -inf before the softmax.",
                torch.softmax(scores.masked_fill(~mask, 0.0), dim=-1) @ v,
            ),
            Mistake(
                "mask ignored",
                "your output attends to every key, as if there were no mask: the keys "
                "the mask marks False must get weight 0.",
                weights @ v,
            ),
            Mistake(
                "boolean mask added to the scores",
                "adding a bool mask adds 1 to the allowed scores and 0 to the blocked "
                "ones, so the blocked keys keep their weight; a blocked key needs a "
                "score of -inf before the softmax.",
                torch.softmax(scores + mask, dim=-1) @ v,
            ),
            _missing_scale(_sdpa(q, k, v, mask=mask, scale=1.0)),
            _divided_by_d(_sdpa(q, k, v, mask=mask, scale=1.0 / 8)),
        ]
        yield Case(prop, inputs, _sdpa(q, k, v, mask=mask), mistakes)


@checker
def check_causal_mask(causal_mask: Callable[..., torch.Tensor]) -> Iterator[Case]:
    r"""Check a learner's ``causal_mask(query_length, key_length)``: bool, top-left.

    The reference is ``torch.ones(L, S, dtype=torch.bool).tril()``: query ``i`` may
    attend to key ``j`` when ``j <= i`` (itself included), which is what
    ``is_causal=True`` means in ``F.scaled_dot_product_attention``. The dtype must be
    ``torch.bool``; the answer is compared as booleans, and a wrong mask is drawn as a
    grid beside the expected one. Named mistakes: "causal mask off by one (the diagonal
    is excluded)", "causal mask off by one (one future key is visible)", "upper
    triangle (triu instead of tril)", "mask inverted", "bottom-right alignment",
    "additive mask (0 / -inf) instead of a boolean one" (a float answer, recognized
    before its dtype is reported).

    Args:
        causal_mask: a function ``causal_mask(query_length, key_length) -> Tensor``.
    """
    cases = [
        ("query i attends to keys j <= i, itself included", 5, 5),
        ("top-left alignment when L < S", 3, 6),
        ("top-left alignment when L > S", 6, 3),
    ]
    for prop, length, source in cases:
        ones = torch.ones(length, source, dtype=torch.bool)
        mistakes = [
            Mistake(
                "causal mask off by one (the diagonal is excluded)",
                "a token may attend to itself: use tril(diagonal=0), i.e. j <= i, not "
                "j < i.",
                ones.tril(diagonal=-1),
            ),
            Mistake(
                "causal mask off by one (one future key is visible)",
                "query i may see keys j <= i only: use tril(diagonal=0), not "
                "tril(diagonal=1).",
                ones.tril(diagonal=1),
            ),
            Mistake(
                "upper triangle (triu instead of tril)",
                "triu keeps the keys at or AFTER each query (j >= i), the future; a "
                "causal mask keeps the keys at or before it (j <= i): the lower "
                "triangle, tril.",
                ones.triu(),
            ),
            Mistake(
                "mask inverted",
                "return True where attending is ALLOWED (j <= i), as "
                "F.scaled_dot_product_attention expects; triu(diagonal=1) is the "
                "'blocked' mask.",
                ~ones.tril(),
            ),
            Mistake(
                "additive mask (0 / -inf) instead of a boolean one",
                "0 where a query may attend and -inf where it may not is the mask "
                "that is ADDED to the scores (Hugging Face's, nn.MultiheadAttention's "
                "float masks); the exercise asks for the boolean mask "
                "F.scaled_dot_product_attention takes: True where a query may "
                "attend, i.e. where your mask is 0.",
                torch.zeros(length, source).masked_fill(~ones.tril(), -torch.inf),
            ),
        ]
        if length != source:
            mistakes.append(
                Mistake(
                    "bottom-right alignment",
                    "is_causal in torch aligns the diagonal at the top-left corner "
                    "(j <= i); you aligned it at the bottom-right (j <= i + S - L).",
                    ones.tril(diagonal=source - length),
                )
            )
        yield Case(
            prop,
            {"query_length": length, "key_length": source},
            ones.tril(),
            mistakes,
            check_dtype=True,
        )


@checker
def check_split_heads(split_heads: Callable[..., torch.Tensor]) -> Iterator[Case]:
    r"""Check a learner's ``split_heads(x, num_heads)``: ``(B, L, D) -> (B, H, L, D/H)``

    Head ``h`` must hold features ``h*D/H ... (h+1)*D/H - 1`` of every token, as
    ``nn.MultiheadAttention`` and every Transformer implementation split them. Named
    mistake: "reshaped to (B, H, L, D/H) directly".

    Args:
        split_heads: a function ``split_heads(x, num_heads) -> Tensor``.
    """
    gen = torch.Generator().manual_seed(2)
    for batch, length, width, heads in ((2, 5, 12, 3), (1, 4, 8, 4)):
        x = torch.randn(batch, length, width, generator=gen)
        mistake = Mistake(
            "reshaped to (B, H, L, D/H) directly",
            "view(B, H, L, D/H) mixes tokens across heads; reshape to (B, L, H, D/H) "
            "first, then transpose(1, 2).",
            x.reshape(batch, heads, length, width // heads),
        )
        yield Case(
            "head h holds features h*D/H ... (h+1)*D/H - 1 of every token",
            {"x": x, "num_heads": heads},
            x.view(batch, length, heads, width // heads).transpose(1, 2),
            [mistake],
            atol=0.0,
            rtol=0.0,
        )


def _tiled_without_rescale(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    block_size: int,
    *,
    rescale_sum: bool = False,
    rescale_values: bool = False,
    own_max: bool = False,
) -> torch.Tensor:
    """The known wrong tiled attention: running max kept, but the running sum and/or
    the accumulated values not rescaled when it grows (both, by default); with
    ``own_max``, each block's exponentials taken against that block's maximum alone."""
    scores = query @ key.transpose(-2, -1) / query.shape[-1] ** 0.5  # (..., L, S)
    m = torch.full((*scores.shape[:-1], 1), -torch.inf)
    total = torch.zeros_like(m)
    acc = torch.zeros(*scores.shape[:-1], value.shape[-1])
    for j0 in range(0, key.shape[-2], block_size):
        s = scores[..., j0 : j0 + block_size]
        m_block = s.amax(-1, keepdim=True)
        m_new = m_block if own_max else torch.maximum(m, m_block)
        factor = torch.exp(m - m_new)  # (..., L, 1)
        p = torch.exp(s - m_new)
        total = (total * factor if rescale_sum else total) + p.sum(-1, keepdim=True)
        acc = (acc * factor if rescale_values else acc) + p @ value[
            ..., j0 : j0 + block_size, :
        ]
        m = m_new
    return acc / total


@checker
def check_tiled_attention(
    tiled_attention: Callable[..., torch.Tensor],
) -> Iterator[Case]:
    r"""Check a learner's ``tiled_attention(query, key, value, block_size)``.

    Properties checked: equality with full attention when ``block_size`` does not divide
    ``S``; with one key per block; and with large scores (``|q·k|/√d`` in the hundreds),
    where only a running maximum keeps ``exp`` finite. Named mistakes: "running sums not
    rescaled" (neither the sum nor the accumulated values), "accumulated values not
    rescaled" (the sum only), "running sum not rescaled" (the values only), "each block
    uses its own maximum, earlier blocks not rescaled" (no running maximum). The checker
    compares values only: it cannot see whether the full ``(L, S)`` score matrix was
    formed.

    Args:
        tiled_attention: a function ``tiled_attention(query, key, value, block_size)``.
    """
    gen = torch.Generator().manual_seed(3)
    cases = [
        ("equals full attention; block_size does not divide S", 1.0, 4),
        ("equals full attention with one key per block", 1.0, 1),
        ("stays finite for large scores", 60.0, 3),
    ]
    for prop, spread, block in cases:
        inputs = _inputs(gen, (2,), 6, 10, 8)
        inputs["query"] = inputs["query"] * spread
        q, k, v = inputs.values()
        mistakes = [
            Mistake(
                "running sums not rescaled",
                "when the running max grows from m_old to m_new, multiply the running "
                "sum and the accumulated output by exp(m_old - m_new) before adding the "
                "new block.",
                _tiled_without_rescale(q, k, v, block),
            ),
            Mistake(
                "accumulated values not rescaled",
                "you rescale the running sum by exp(m_old - m_new) when the max grows, "
                "but not the accumulated weighted sum of values: it needs the same "
                "factor, since both hold terms exp(s - m_old).",
                _tiled_without_rescale(q, k, v, block, rescale_sum=True),
            ),
            Mistake(
                "running sum not rescaled",
                "you rescale the accumulated values by exp(m_old - m_new) when the max "
                "grows, but not the running sum of exponentials: it needs the same "
                "factor, since both hold terms exp(s - m_old).",
                _tiled_without_rescale(q, k, v, block, rescale_values=True),
            ),
            Mistake(
                "each block uses its own maximum, earlier blocks not rescaled",
                "exp(s - m) of blocks shifted by different maxima are on different "
                "scales (each block's largest term is 1), so adding them weighs the "
                "blocks wrongly: all terms must be relative to one maximum, the "
                "largest seen so far.",
                _tiled_without_rescale(q, k, v, block, own_max=True),
            ),
        ]
        yield Case(prop, {**inputs, "block_size": block}, _sdpa(q, k, v), mistakes)
