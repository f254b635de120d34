r"""Attention: alignment scores, scaled dot-product attention, masks, heads and tiling.

The chapter *Attention, from alignment scores to FlashAttention's trick* derives
everything here step by step. In short:

- :func:`additive_score`, :func:`dot_score`, :func:`general_score`,
  :func:`concat_score`: the alignment scores of Bahdanau et al. (additive, 2014) and
  Luong et al. (dot, general, concat, 2015), before the Transformer's scaled dot
  product.
- :func:`attention_weights` and :func:`scaled_dot_product_attention`:
  :math:`\operatorname{softmax}(QK^\top/\sqrt{D} + M)\,V`, with the argument names and
  mask semantics of :func:`torch.nn.functional.scaled_dot_product_attention`.
- :func:`causal_mask`: a boolean ``(L, S)`` mask, top-left or bottom-right aligned.
- :class:`MultiHeadAttention`: split, attend, merge; it loads the weights of a
  :class:`torch.nn.MultiheadAttention`, and :func:`mask_from_torch_mha` converts that
  module's (inverted) boolean masks.
- :func:`tiled_attention`: the same result in one pass over key/value blocks with an
  online softmax (the FlashAttention idea), never holding the ``(L, S)`` score matrix.
- :func:`measure_peak_memory`: the peak memory a call allocates (CUDA counters, or a
  count of the live tensors that torch operators create).

Mask convention (torch's): a boolean mask is ``True`` where a query **may** attend; a
float mask is **added** to the scores (``-inf`` blocks). Masks broadcast to
``(..., L, S)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import torch
from torch import nn

from companion import _validate
from companion.performance import peak_live_bytes

__all__ = [
    "MultiHeadAttention",
    "additive_score",
    "attention_weights",
    "causal_mask",
    "concat_score",
    "dot_score",
    "general_score",
    "mask_from_torch_mha",
    "measure_peak_memory",
    "scaled_dot_product_attention",
    "softmax_scale",
    "tiled_attention",
]


# ---- computing in float32 ------------------------------------------------------------


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Half-precision inputs are scored and normalized in float32, then cast back."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def softmax_scale(query: torch.Tensor, scale: float | None = None) -> float:
    r"""The factor on the scores before the softmax: ``scale`` if given, else
    :math:`1/\sqrt{D}` with :math:`D` the query's last size (the default of
    :func:`torch.nn.functional.scaled_dot_product_attention`).

    The one home of that default, shared by :func:`scaled_dot_product_attention` and
    the relative-position scores of :mod:`companion.relative`.

    Args:
        query: the queries; only the size of the last dimension is read.
        scale: a positive real, or ``None`` for :math:`1/\sqrt{D}`.

    Returns:
        The factor, a Python float.

    Shape:
        query: ``(..., L, D)`` with ``D >= 1``.
    """
    _validate.tensor("query", query, min_ndim=1, meaning="(..., L, D)")
    scale = _validate.optional(_validate.positive_real, "scale", scale)
    if scale is not None:
        return scale
    if query.shape[-1] < 1:
        raise ValueError(
            f"query must have a last size D >= 1 for the default scale 1/sqrt(D), "
            f"got shape {tuple(query.shape)}"
        )
    return 1.0 / math.sqrt(query.shape[-1])


# ---- alignment scores before the Transformer -----------------------------------------


def dot_score(query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    r"""Luong et al.'s *dot* score :math:`q^\top k` for every query-key pair.

    The paper writes column vectors; in the book's rows (``notation.md``) the score is
    :math:`q k^\top`, which is what is computed.

    Args:
        query: decoder states (queries).
        key: encoder states (keys), same feature width as ``query``.

    Returns:
        The scores, unscaled (the Transformer divides them by :math:`\sqrt{D}`).

    Shape:
        query: ``(..., L, D)``.
        key: ``(..., S, D)``.
        output: ``(..., L, S)``.
    """
    _validate.attention_inputs(query, key, positive_width=False)
    return query @ key.transpose(-2, -1)  # (..., L, S)


def _query_and_key(
    query: torch.Tensor, key: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The first checks of the learned scores: ``query (..., L, Dq)``, and ``key
    (..., S, Dk)`` of its dtype and device (the widths may differ)."""
    query = _validate.tensor("query", query, min_ndim=2, meaning="(..., L, Dq)")
    key = _validate.tensor_like(
        "key", key, "query", query, min_ndim=2, meaning="(..., S, Dk)"
    )
    return query, key


def _batch_dims(query: torch.Tensor, key: torch.Tensor) -> tuple[int, ...]:
    """The last check of the learned scores: the batch dims broadcast; their shape."""
    return _validate.broadcastable(
        "query and key", [query.shape[:-2], key.shape[:-2]], "batch dims"
    )


def general_score(
    query: torch.Tensor, key: torch.Tensor, *, weight: torch.Tensor
) -> torch.Tensor:
    r"""Luong et al.'s *general* (bilinear) score :math:`q^\top W k`.

    In the paper's column vectors; in the book's rows it is :math:`q W k^\top`, the same
    number for the same :math:`W`, which is what is computed.

    With ``weight`` the identity it is :func:`dot_score`; unlike it, the query and key
    widths may differ.

    Args:
        query: decoder states.
        key: encoder states.
        weight: the learned matrix :math:`W`.

    Returns:
        The bilinear scores :math:`q_i W k_j^\top`, unscaled.

    Shape:
        query: ``(..., L, Dq)``.
        key: ``(..., S, Dk)``.
        weight: ``(Dq, Dk)``.
        output: ``(..., L, S)``.
    """
    query, key = _query_and_key(query, key)
    weight = _validate.tensor_like("weight", weight, "query", query, ndim=2)
    _validate.shape("weight", weight, (query.shape[-1], key.shape[-1]), "(Dq, Dk)")
    _batch_dims(query, key)
    return (query @ weight) @ key.transpose(-2, -1)  # (..., L, Dk) @ (..., Dk, S)


def additive_score(
    query: torch.Tensor,
    key: torch.Tensor,
    *,
    query_weight: torch.Tensor,
    key_weight: torch.Tensor,
    v: torch.Tensor,
) -> torch.Tensor:
    r"""Bahdanau et al.'s *additive* score :math:`v^\top \tanh(W q + U k)`.

    In the paper :math:`q` is the previous decoder state :math:`s_{i-1}` and :math:`k`
    an annotation :math:`h_j` of the bidirectional encoder; ``query_weight`` is
    :math:`W_a`, ``key_weight`` is :math:`U_a`, ``v`` is :math:`v_a` (no biases, as in
    the paper). Weights follow :class:`torch.nn.Linear`'s
    ``(out_features, in_features)`` layout, so the paper's column-vector :math:`W q` is
    ``query @ query_weight.T`` on the rows here.

    Args:
        query: decoder states.
        key: encoder states.
        query_weight: :math:`W_a`.
        key_weight: :math:`U_a`.
        v: :math:`v_a`.

    Returns:
        The additive scores :math:`v_a^\top \tanh(W_a q_i + U_a k_j)`.

    Shape:
        query: ``(..., L, Dq)``.
        key: ``(..., S, Dk)``.
        query_weight: ``(A, Dq)``.
        key_weight: ``(A, Dk)``.
        v: ``(A,)``.
        output: ``(..., L, S)``.
    """
    query, key = _query_and_key(query, key)
    v = _validate.tensor_like("v", v, "query", query, ndim=1, meaning="(A,)")
    for name, w, width in (
        ("query_weight", query_weight, query.shape[-1]),
        ("key_weight", key_weight, key.shape[-1]),
    ):
        w = _validate.tensor_like(name, w, "query", query, ndim=2)
        _validate.shape(name, w, (v.shape[0], width), "(A, D) with A = len(v)")
    _batch_dims(query, key)
    wq = query @ query_weight.T  # (..., L, A)
    uk = key @ key_weight.T  # (..., S, A)
    hidden_pairs = torch.tanh(wq.unsqueeze(-2) + uk.unsqueeze(-3))  # (..., L, S, A)
    return hidden_pairs @ v  # (..., L, S)


def concat_score(
    query: torch.Tensor, key: torch.Tensor, *, weight: torch.Tensor, v: torch.Tensor
) -> torch.Tensor:
    r"""Luong et al.'s *concat* score :math:`v^\top \tanh(W [q; k])`.

    Splitting :math:`W = [W_q \; W_k]` by columns gives :math:`W[q;k] = W_q q + W_k k`:
    this is Bahdanau's :func:`additive_score` (the chapter checks it). It is written
    here with an explicit concatenation of every pair, as the formula reads, so it holds
    an ``(..., L, S, Dq + Dk)`` tensor: use it on small inputs.

    Args:
        query: decoder states.
        key: encoder states.
        weight: :math:`W`, ``(A, Dq + Dk)`` like :class:`torch.nn.Linear`.
        v: :math:`v`.

    Returns:
        The concat scores :math:`v^\top \tanh(W [q_i; k_j])`, equal to the additive
        ones for :math:`W = [W_a \; U_a]`.

    Shape:
        query: ``(..., L, Dq)``.
        key: ``(..., S, Dk)``.
        weight: ``(A, Dq + Dk)``.
        v: ``(A,)``.
        output: ``(..., L, S)``.
    """
    query, key = _query_and_key(query, key)
    weight = _validate.tensor_like("weight", weight, "query", query, ndim=2)
    v = _validate.tensor_like("v", v, "query", query, ndim=1, meaning="(A,)")
    width = query.shape[-1] + key.shape[-1]
    _validate.shape("weight", weight, (v.shape[0], width), "(A, Dq + Dk)")
    batch = _batch_dims(query, key)
    L, S = query.shape[-2], key.shape[-2]
    q = query.unsqueeze(-2).expand(*batch, L, S, query.shape[-1])  # (..., L, S, Dq)
    k = key.unsqueeze(-3).expand(*batch, L, S, key.shape[-1])  # (..., L, S, Dk)
    pairs = torch.cat([q, k], dim=-1)  # (..., L, S, Dq + Dk)
    return torch.tanh(pairs @ weight.T) @ v  # (..., L, S)


# ---- scaled dot-product attention ----------------------------------------------------


def causal_mask(
    query_length: int,
    key_length: int,
    *,
    alignment: Literal["top_left", "bottom_right"] = "top_left",
    device: torch.device | str | None = None,
) -> torch.Tensor:
    r"""Boolean causal mask, ``True`` where query ``i`` may attend to key ``j``.

    ``"top_left"``: :math:`j \le i`, the diagonal starts at the top-left corner. This is
    what ``F.scaled_dot_product_attention(..., is_causal=True)`` uses
    (``torch.ones(L, S).tril()``). ``"bottom_right"``: :math:`j \le i + S - L`, the
    diagonal ends at the bottom-right corner: the last query sees every key, as when
    ``L`` new tokens are decoded after ``S - L`` cached ones (FlashAttention 2.1+ and
    ``torch.nn.attention.bias.causal_lower_right``). The two agree when ``L == S``.

    Args:
        query_length: ``L``, an int >= 0.
        key_length: ``S``, an int >= 0.
        alignment: ``"top_left"`` or ``"bottom_right"``.
        device: where to create the mask.

    Returns:
        A boolean mask.

    Shape:
        output: ``(L, S)``.
    """
    query_length = _validate.nonnegative_int("query_length", query_length)
    key_length = _validate.nonnegative_int("key_length", key_length)
    _validate.choice("alignment", alignment, ("top_left", "bottom_right"))
    device = _validate.device("device", device)
    offset = 0 if alignment == "top_left" else key_length - query_length
    ones = torch.ones(query_length, key_length, dtype=torch.bool, device=device)
    return ones.tril(diagonal=offset)  # True where j <= i + offset


def _masked_softmax(scores: torch.Tensor) -> torch.Tensor:
    """Softmax over the last axis; a row whose scores are all -inf gives zeros, not NaN,
    and so does a row with no keys at all (S = 0: an empty row)."""
    if scores.shape[-1] == 0:
        return scores
    row_max = scores.amax(dim=-1, keepdim=True)
    row_max = torch.where(torch.isneginf(row_max), torch.zeros_like(row_max), row_max)
    e = torch.exp(scores - row_max)  # largest finite entry -> exp(0) = 1; -inf -> 0
    total = e.sum(dim=-1, keepdim=True)
    return e / torch.where(total == 0, torch.ones_like(total), total)


def _inputs(
    query: object,
    key: object,
    value: object,
    mask: object,
    is_causal: object,
    scale: object,
) -> tuple[tuple[int, ...], torch.Tensor | None, float]:
    """The attention functions' arguments, validated: the broadcast batch shape, the
    mask and the scale. ``value`` is :data:`Ellipsis` where the function takes none."""
    if value is None:
        _validate.tensor("value", value)  # raises: a value is needed here
    batch = _validate.attention_inputs(query, key, None if value is ... else value)
    is_causal = _validate.flag("is_causal", is_causal)
    scale = softmax_scale(query, scale)
    if mask is not None:
        shape = (*batch, query.shape[-2], key.shape[-2])
        mask = _validate.mask("mask", mask, shape, "query", query)
        if is_causal:
            raise ValueError(
                "mask must be None when is_causal=True (give one or the other, as "
                "torch documents); combine causal_mask(L, S) & mask yourself"
            )
    return batch, mask, scale


def _weights(
    query: torch.Tensor,
    key: torch.Tensor,
    mask: torch.Tensor | None,
    is_causal: bool,
    scale: float,
) -> torch.Tensor:
    """Attention weights in the compute dtype (float32 for half inputs)."""
    L, S = query.shape[-2], key.shape[-2]
    dtype = _compute_dtype(query.dtype)
    scores = (query.to(dtype) @ key.to(dtype).transpose(-2, -1)) * scale  # (..., L, S)
    if is_causal:
        scores = scores.masked_fill(~causal_mask(L, S, device=query.device), -math.inf)
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, -math.inf)  # False = may not attend
        else:
            scores = scores + mask.to(dtype)  # additive mask, before the softmax
    return _masked_softmax(scores)


def attention_weights(
    query: torch.Tensor,
    key: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> torch.Tensor:
    r"""The attention weights
    :math:`\operatorname{softmax}(QK^\top \cdot \text{scale} + M)`.

    Each row is a probability distribution over the ``S`` keys. The semantics are those
    of :func:`torch.nn.functional.scaled_dot_product_attention` (which does not return
    them): ``scale`` defaults to :math:`1/\sqrt{D}`; a boolean ``mask`` is ``True``
    where a query may attend, a float ``mask`` is added to the scores; ``is_causal``
    applies the top-left causal mask of :func:`causal_mask`. Giving both ``mask`` and
    ``is_causal=True`` is an error, as torch documents (torch 2.13 raises for 3-D inputs
    and silently combines the two masks for 4-D inputs; the chapter shows both).

    A row whose keys are all masked gets weights that are all zero (so its output is
    zero) instead of the NaN of a plain softmax. torch's
    ``scaled_dot_product_attention`` also returns zeros there on the CPU (fused and math
    paths alike, torch 2.13); :class:`torch.nn.MultiheadAttention` returns NaN with
    ``need_weights=True`` (its default) and on its fast path, zeros otherwise (the
    chapter measures each case).

    Half-precision inputs are scored and normalized in float32; the result has the
    input's dtype. With no keys (``S = 0``) every row is empty and every output is zero,
    like a fully masked row; ``D`` must be positive (the default scale is
    :math:`1/\sqrt{D}`).

    Args:
        query: queries.
        key: keys, same ``D`` as ``query``.
        mask: boolean or float mask broadcastable to ``(..., L, S)``.
        is_causal: apply the top-left causal mask.
        scale: the factor on the scores; ``None`` means :math:`1/\sqrt{D}`.

    Returns:
        The weights; rows sum to one (or are all zero when fully masked).

    Shape:
        query: ``(..., L, D)``.
        key: ``(..., S, D)``.
        output: ``(..., L, S)``.
    """
    _, mask, scale = _inputs(query, key, ..., mask, is_causal, scale)
    return _weights(query, key, mask, is_causal, scale).to(query.dtype)


def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    backend: str = "torch",
) -> torch.Tensor:
    r"""Scaled dot-product attention
    :math:`\operatorname{softmax}(QK^\top/\sqrt{D} + M)\,V`.

    Same arguments and results as
    ``torch.nn.functional.scaled_dot_product_attention(query, key, value,
    attn_mask=mask, is_causal=is_causal,
    scale=scale)`` (no dropout), computed from the definition: the full ``(..., L,
    S)`` weight matrix is formed, so memory grows as :math:`L S`
    (:func:`tiled_attention` avoids that). See :func:`attention_weights` for the masks
    and for what a fully masked row returns (zeros).

    Args:
        query: queries.
        key: keys.
        value: values.
        mask: boolean (``True`` = may attend) or float (added) mask, broadcastable to
            ``(..., L, S)``.
        is_causal: apply the top-left causal mask (``j <= i``).
        scale: factor on the scores; ``None`` means :math:`1/\sqrt{D}`.
        backend: ``"torch"`` (the definition, above) or ``"triton"``: the FlashAttention
            kernels :func:`companion.kernels.flash_attention` (needs Triton, which has
            Linux wheels only; CUDA tensors where a GPU is present, CPU tensors through
            Triton's interpreter otherwise). They take no ``mask`` (``is_causal``
            only), ``(B, H, L, D)`` inputs of float16, bfloat16 or float32 in any
            memory layout, ``value`` of ``key``'s shape, and any ``D`` from 1 to 256
            (padded on chip to a power of two >= 16); the output is contiguous. The
            gradient is FlashAttention-2's backward, differentiable once: a second
            derivative (``create_graph=True``, then differentiating again) raises a
            ``RuntimeError``.

    Returns:
        One output per query, the weighted average of the values.

    Shape:
        query: ``(..., L, D)``.
        key: ``(..., S, D)``.
        value: ``(..., S, Dv)``.
        output: ``(..., L, Dv)``.
    """
    _, mask, scale = _inputs(query, key, value, mask, is_causal, scale)
    if _validate.choice("backend", backend, ("torch", "triton")) == "triton":
        if mask is not None:
            raise ValueError(
                f"mask must be None with backend='triton' (is_causal only), got "
                f"{_validate.describe(mask)}"
            )
        from companion import kernels  # needs Triton; `import companion` does not

        return kernels.flash_attention(
            query, key, value, is_causal=is_causal, scale=scale
        )[0]
    weights = _weights(query, key, mask, is_causal, scale)  # (..., L, S)
    return (weights @ value.to(weights.dtype)).to(query.dtype)  # (..., L, Dv)


# ---- tiled attention with an online softmax ------------------------------------------


def tiled_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    block_size: int,
    is_causal: bool = False,
    scale: float | None = None,
) -> torch.Tensor:
    r"""Scaled dot-product attention in blocks, with an online softmax (the
    FlashAttention idea).

    Queries are taken ``block_size`` at a time; for each query block one pass over the
    key/value blocks keeps a running row maximum :math:`m`, a running sum :math:`\ell`
    of :math:`e^{s - m}` and a running weighted sum of values, rescaling both by
    :math:`e^{m_\text{old} - m_\text{new}}` whenever the maximum grows
    (Milakov & Gimelshein's online softmax). Only a ``(block, block)`` tile of scores
    exists at any time, so the extra memory is :math:`O(\text{block}^2 + L\,D)` instead
    of :math:`O(L S)`. The result equals :func:`scaled_dot_product_attention` up to
    rounding.

    This is the algorithm in plain PyTorch (a Python loop over tiles), to show the idea
    and measure memory; it is not fast. Real kernels (FlashAttention, torch's fused
    SDPA) run the same loop inside one GPU/CPU kernel.

    Args:
        query: queries.
        key: keys.
        value: values.
        block_size: rows of queries and of keys per tile.
        is_causal: top-left causal mask (``j <= i``); tiles entirely above the diagonal
            are skipped.
        scale: factor on the scores; ``None`` means :math:`1/\sqrt{D}`.

    Returns:
        The attention output.

    Shape:
        query: ``(..., L, D)``.
        key: ``(..., S, D)``.
        value: ``(..., S, Dv)``.
        output: ``(..., L, Dv)``.
    """
    batch, _, scale = _inputs(query, key, value, None, is_causal, scale)
    block_size = _validate.positive_int("block_size", block_size)
    L, S, Dv = query.shape[-2], key.shape[-2], value.shape[-1]
    dtype = _compute_dtype(query.dtype)
    out = torch.empty(*batch, L, Dv, dtype=query.dtype, device=query.device)
    for i0 in range(0, L, block_size):
        i1 = min(i0 + block_size, L)
        q = query[..., i0:i1, :].to(dtype) * scale  # (..., bq, D)
        shape = (*batch, i1 - i0, 1)
        m = torch.full(
            shape, -math.inf, dtype=dtype, device=query.device
        )  # running max
        total = torch.zeros(
            shape, dtype=dtype, device=query.device
        )  # running sum of e^(s-m)
        acc = torch.zeros(*batch, i1 - i0, Dv, dtype=dtype, device=query.device)
        for j0 in range(0, S, block_size):
            if is_causal and j0 > i1 - 1:
                break  # this and later key blocks are entirely in the future
            j1 = min(j0 + block_size, S)
            s = q @ key[..., j0:j1, :].to(dtype).transpose(-2, -1)  # (..., bq, bk)
            if is_causal and j1 - 1 > i0:  # the tile crosses the diagonal
                rows = torch.arange(i0, i1, device=query.device).unsqueeze(-1)
                cols = torch.arange(j0, j1, device=query.device)
                s = s.masked_fill(cols > rows, -math.inf)
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
            m_safe = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)
            p = torch.exp(s - m_safe)  # (..., bq, bk)
            rescale = torch.exp(m - m_safe)  # e^(m_old - m_new); 0 on the first tile
            total = rescale * total + p.sum(dim=-1, keepdim=True)
            acc = rescale * acc + p @ value[..., j0:j1, :].to(dtype)  # (..., bq, Dv)
            m = m_new
        total = torch.where(total == 0, torch.ones_like(total), total)
        out[..., i0:i1, :] = (acc / total).to(query.dtype)
    return out


# ---- multi-head attention ------------------------------------------------------------


def mask_from_torch_mha(
    *,
    attn_mask: torch.Tensor | None = None,
    key_padding_mask: torch.Tensor | None = None,
) -> torch.Tensor | None:
    r"""Convert :class:`torch.nn.MultiheadAttention`'s masks to this module's
    convention.

    ``nn.MultiheadAttention`` uses the *opposite* boolean convention from
    ``F.scaled_dot_product_attention``: there ``True`` means "may **not** attend" (in
    ``attn_mask``) and "this key is padding" (in ``key_padding_mask``). Here a boolean
    mask is ``True`` where a query may attend. Float masks are added to the scores in
    both.

    Args:
        attn_mask: ``(L, S)`` boolean (``True`` = blocked) or float mask, or ``None``.
        key_padding_mask: ``(B, S)`` boolean (``True`` = padding) or float mask, or
            ``None``.

    Returns:
        A mask for :class:`MultiHeadAttention` (boolean when both inputs are boolean,
        else float), or ``None`` when both are ``None``.

    Shape:
        attn_mask: ``(L, S)``.
        key_padding_mask: ``(B, S)``.
        output: ``(L, S)`` from ``attn_mask`` alone, ``(B, 1, 1, S)`` from
            ``key_padding_mask`` alone, ``(B, 1, L, S)`` from both.
    """
    attn_mask = _validate.optional(
        _validate.tensor, "attn_mask", attn_mask, dtype=("bool", "floating"), ndim=2
    )
    key_padding_mask = _validate.optional(
        _validate.tensor,
        "key_padding_mask",
        key_padding_mask,
        dtype=("bool", "floating"),
        ndim=2,
    )
    if attn_mask is not None and key_padding_mask is not None:
        _validate.same_device(
            "key_padding_mask", key_padding_mask, "attn_mask", attn_mask
        )
        _validate.same_size(
            "attn_mask",
            attn_mask,
            -1,
            "key_padding_mask",
            key_padding_mask,
            -1,
            "key-length (S)",
        )
    parts = []
    if attn_mask is not None:
        parts.append(attn_mask)
    if key_padding_mask is not None:
        parts.append(key_padding_mask[:, None, None, :])  # (B, 1, 1, S)
    if not parts:
        return None
    if all(p.dtype == torch.bool for p in parts):
        allowed = ~parts[0]  # invert: True = blocked there, True = may attend here
        for p in parts[1:]:
            allowed = allowed & ~p
        return allowed
    floats = [p.dtype for p in parts if p.dtype != torch.bool]
    dtype = floats[0] if len(floats) == 1 else torch.promote_types(*floats)
    total = None
    for p in parts:
        additive = (
            torch.zeros(p.shape, dtype=dtype, device=p.device).masked_fill(p, -math.inf)
            if p.dtype == torch.bool
            else p
        )
        total = additive if total is None else total + additive
    return total


class MultiHeadAttention(nn.Module):
    r"""Multi-head attention: project, split into heads, attend, merge, project.

    ``forward`` is one call to :func:`scaled_dot_product_attention` between the
    reshapes:

    .. code-block:: text

        (B, L, D) -> q_proj -> (B, L, H, D/H) -> transpose -> (B, H, L, D/H)
        attend per head -> (B, H, L, D/H) -> transpose, merge -> (B, L, D) -> out_proj

    The four projections are separate :class:`torch.nn.Linear` layers (like Hugging Face
    models; unlike nanoGPT's packed ``c_attn``); :meth:`load_torch_weights` copies them
    from a :class:`torch.nn.MultiheadAttention`, which packs ``W_Q, W_K, W_V`` row-wise
    into one ``in_proj_weight`` of shape ``(3D, D)``.

    Args:
        embed_dim: model width ``D``.
        num_heads: number of heads ``H``; must divide ``embed_dim``.
        bias: add biases to the four projections.
        device: where to create the parameters.
        dtype: dtype of the parameters.

    Shape:
        query: ``(B, L, D)``.
        key: ``(B, S, D)``.
        value: ``(B, S, D)``.
        mask: broadcastable to ``(B, H, L, S)``, ``True`` = may attend.
        output: ``(B, L, D)``.
    """

    accepts_mask: bool = True
    """Whether :meth:`~companion.attention.MultiHeadAttention.attend` takes a ``mask``
    (``False``: the layer builds its own)."""

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        embed_dim = _validate.positive_int("embed_dim", embed_dim)
        num_heads = _validate.positive_int("num_heads", num_heads)
        if embed_dim % num_heads != 0:
            raise ValueError(
                "num_heads must divide embed_dim, got "
                f"embed_dim={embed_dim}, num_heads={num_heads}"
            )
        bias = _validate.flag("bias", bias)
        kw = {"bias": bias, **_validate.factory_kwargs(device, dtype)}
        super().__init__()
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.q_proj = nn.Linear(embed_dim, embed_dim, **kw)
        self.k_proj = nn.Linear(embed_dim, embed_dim, **kw)
        self.v_proj = nn.Linear(embed_dim, embed_dim, **kw)
        self.out_proj = nn.Linear(embed_dim, embed_dim, **kw)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.num_heads, self.head_dim).transpose(
            1, 2
        )  # (B, H, length, D/H)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        *,
        mask: torch.Tensor | None = None,
        is_causal: bool = False,
    ) -> torch.Tensor:
        """Attend from ``query`` to ``key``/``value`` (all ``(B, length, D)``).

        The inputs must have the parameters' dtype and device; ``mask`` broadcasts to
        ``(B, H, L, S)`` (see :func:`scaled_dot_product_attention`).
        """
        weight = self.q_proj.weight
        meaning = f"(B, length, embed_dim={self.embed_dim})"
        query = _validate.tensor_like("query", query, "q_proj.weight", weight, ndim=3)
        _validate.size("query", query, -1, self.embed_dim, "embed_dim")
        for name, x in (("key", key), ("value", value)):
            x = _validate.tensor_like(name, x, "query", query, ndim=3, meaning=meaning)
            _validate.size(name, x, -1, self.embed_dim, "embed_dim")
            _validate.same_size("query", query, 0, name, x, 0, "batch (B)")
        _validate.same_size("key", key, 1, "value", value, 1, "length (S)")
        is_causal = _validate.flag("is_causal", is_causal)
        if mask is not None:
            B, L, S = query.shape[0], query.shape[1], key.shape[1]
            shape = (B, self.num_heads, L, S)
            mask = _validate.mask("mask", mask, shape, "query", query)
        q = self._split(self.q_proj(query))  # (B, H, L, D/H)
        k = self._split(self.k_proj(key))  # (B, H, S, D/H)
        v = self._split(self.v_proj(value))  # (B, H, S, D/H)
        out = self.attend(q, k, v, mask=mask, is_causal=is_causal)  # (B, H, L, D/H)
        B, H, L, Dh = out.shape
        out = out.transpose(1, 2).reshape(B, L, H * Dh)  # (B, L, D): heads side by side
        return self.out_proj(out)

    def attend(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        *,
        mask: torch.Tensor | None = None,
        is_causal: bool = False,
    ) -> torch.Tensor:
        """The step between the head split and the merge: attention per head.

        It runs three narrow hooks, and a variant overrides the one step it changes
        (as labml's ``RotaryPEMultiHeadAttention`` overrides only ``get_scores``),
        reusing the projections, the split and the merge:

        1. :meth:`transform_qk` turns queries and keys (RoPE rotates them, QK-norm
           normalizes them first); here they pass unchanged.
        2. :meth:`score_bias` is added to the scores, its causal mask included (ALiBi,
           T5's buckets); here there is none.
        3. :meth:`attention` weighs the values: here
           :func:`companion.attention.scaled_dot_product_attention`; a layer whose
           formula differs (soft-capped scores, Shaw's relative vectors,
           Transformer-XL's scores) replaces it.

        A layer that builds its own mask (``accepts_mask = False``) refuses ``mask``.

        Shape:
            query: ``(B, H, L, D/H)``; key, value: ``(B, H, S, D/H)``; output like
                query.
        """
        if mask is not None and not self.accepts_mask:  # before any computation
            raise ValueError(
                f"mask must be None: {type(self).__name__} builds its own mask (causal "
                f"when is_causal=True), got {_validate.describe(mask)}"
            )
        query, key = self.transform_qk(query, key)  # (B, H, L, D/H), (B, H, S, D/H)
        bias = self.score_bias(query, key, is_causal=is_causal)  # (H, L, S) or None
        if bias is not None:  # the bias is the mask, its causal part included
            assert mask is None, "a layer with a score_bias sets accepts_mask = False"
            mask, is_causal = bias, False
        return self.attention(query, key, value, mask, is_causal)  # (B, H, L, D/H)

    def transform_qk(
        self, query: torch.Tensor, key: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Hook of :meth:`attend`: queries and keys as the scores see them; here
        unchanged.

        Shape:
            query: ``(B, H, L, D/H)``; key: ``(B, H, S, D/H)``; outputs: the same.
        """
        return query, key

    def score_bias(
        self, query: torch.Tensor, key: torch.Tensor, *, is_causal: bool
    ) -> torch.Tensor | None:
        """Hook of :meth:`attend`: an additive bias on the scores, ``-inf`` where the
        causal mask blocks when ``is_causal``, or ``None`` for none (as here).

        Shape:
            query: ``(B, H, L, D/H)``; key: ``(B, H, S, D/H)``; output: broadcastable
                to ``(B, H, L, S)``.
        """
        return None

    def attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None,
        is_causal: bool,
    ) -> torch.Tensor:
        r"""Hook of :meth:`attend`: the attention of each head,
        :math:`\operatorname{softmax}(QK^\top/\sqrt{D} + M)\,V`; here
        :func:`companion.attention.scaled_dot_product_attention`.

        Shape:
            q: ``(B, H, L, D/H)``; k, v: ``(B, H, S, D/H)``; mask: broadcastable to
                ``(B, H, L, S)``; output: like q.
        """
        return scaled_dot_product_attention(q, k, v, mask=mask, is_causal=is_causal)

    @torch.no_grad()
    def load_torch_weights(self, module: nn.MultiheadAttention) -> MultiHeadAttention:
        """Copy the weights of a :class:`torch.nn.MultiheadAttention` into this module.

        ``module`` must have the same ``embed_dim``, ``num_heads`` and ``bias``, equal
        query/key/value widths (so it packs them into ``in_proj_weight``), and none of
        the options this module does not model: ``add_bias_kv`` (a learned extra key
        and value), ``add_zero_attn`` (an extra all-zero key and value) and
        ``dropout`` > 0 (dropout on the attention weights); each is refused by name.
        Its output then matches this module's on batch-first inputs, with masks
        converted by :func:`mask_from_torch_mha` (``batch_first`` changes only the
        layout of torch's inputs, not its weights).

        Args:
            module: the module to copy from.

        Returns:
            ``self``.
        """
        _validate.module("module", module, nn.MultiheadAttention)
        if (module.embed_dim, module.num_heads) != (self.embed_dim, self.num_heads):
            raise ValueError(
                f"module must have embed_dim={self.embed_dim}, "
                f"num_heads={self.num_heads}, got "
                f"embed_dim={module.embed_dim}, num_heads={module.num_heads}"
            )
        if module.in_proj_weight is None:
            raise ValueError(
                "module must pack q, k, v in in_proj_weight (equal query, key and value "
                f"widths), got kdim={module.kdim}, vdim={module.vdim}"
            )
        unsupported = [  # torch options this module does not model
            text
            for text, used in (
                ("add_bias_kv=True", module.bias_k is not None),
                ("add_zero_attn=True", module.add_zero_attn),
                (f"dropout={module.dropout}", module.dropout != 0),
            )
            if used
        ]
        if unsupported:
            raise ValueError(
                "module must have add_bias_kv=False, add_zero_attn=False and "
                "dropout=0.0 (this module has no extra key and value and no dropout), "
                f"got {', '.join(unsupported)}"
            )
        if (module.in_proj_bias is None) != (self.q_proj.bias is None):
            raise ValueError(
                f"module must have bias={self.q_proj.bias is not None} like this "
                "module, got "
                f"bias={module.in_proj_bias is not None}"
            )
        w_q, w_k, w_v = module.in_proj_weight.chunk(
            3, dim=0
        )  # rows: W_Q, then W_K, then W_V
        for proj, w in ((self.q_proj, w_q), (self.k_proj, w_k), (self.v_proj, w_v)):
            proj.weight.copy_(w)
        self.out_proj.weight.copy_(module.out_proj.weight)
        if module.in_proj_bias is not None:
            b_q, b_k, b_v = module.in_proj_bias.chunk(3)
            for proj, b in ((self.q_proj, b_q), (self.k_proj, b_k), (self.v_proj, b_v)):
                proj.bias.copy_(b)
            self.out_proj.bias.copy_(module.out_proj.bias)
        return self


# ---- measuring peak memory -----------------------------------------------------------


def measure_peak_memory(fn: Callable[[], object], *, device: torch.device | str) -> int:
    """Bytes of memory that ``fn()`` holds at its peak, above what was in use before the
    call.

    On CUDA: :func:`torch.cuda.max_memory_allocated` after
    :func:`torch.cuda.reset_peak_memory_stats`, minus what was allocated before.
    Elsewhere (the CPU): every tensor that a torch operator creates inside ``fn`` is
    counted from its creation until it is freed, by the package's one memory meter (a
    :class:`~torch.utils._python_dispatch.TorchDispatchMode` in
    :mod:`companion.performance`, which :func:`~companion.performance.memory_traffic`
    uses too); the peak of that running total is returned. The count is exact for the
    tensors a Python implementation creates; scratch memory *inside* one fused kernel
    (such as ``F.scaled_dot_product_attention``'s) is not seen, only its outputs. The
    counting slows ``fn`` down: time it separately.

    Args:
        fn: a function with no arguments (its result is discarded).
        device: the device ``fn`` computes on.

    Returns:
        Peak bytes.
    """
    fn = _validate.callable_("fn", fn)
    device = _validate.instance(
        "device", device, (torch.device, str), "a torch.device or a device string"
    )
    device = _validate.device("device", device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    return peak_live_bytes(fn)
