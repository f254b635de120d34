r"""Attention: alignment scores, scaled dot-product attention, masks, heads and tiling.

The chapter *Attention, from alignment scores to FlashAttention's trick* derives everything
here step by step. In short:

- :func:`additive_score`, :func:`dot_score`, :func:`general_score`, :func:`concat_score`: the
  alignment scores of Bahdanau et al. (additive, 2014) and Luong et al. (dot, general, concat,
  2015), before the Transformer's scaled dot product.
- :func:`attention_weights` and :func:`scaled_dot_product_attention`:
  :math:`\operatorname{softmax}(QK^\top/\sqrt{D} + M)\,V`, with the argument names and mask
  semantics of :func:`torch.nn.functional.scaled_dot_product_attention`.
- :func:`causal_mask`: a boolean ``(L, S)`` mask, top-left or bottom-right aligned.
- :class:`MultiHeadAttention`: split, attend, merge; it loads the weights of a
  :class:`torch.nn.MultiheadAttention`, and :func:`mask_from_torch_mha` converts that module's
  (inverted) boolean masks.
- :func:`tiled_attention`: the same result in one pass over key/value blocks with an online
  softmax (the FlashAttention idea), never holding the ``(L, S)`` score matrix.
- :func:`measure_peak_memory`: the peak memory a call allocates (CUDA counters, or a count of
  the live tensors that torch operators create).

Mask convention (torch's): a boolean mask is ``True`` where a query **may** attend; a float
mask is **added** to the scores (``-inf`` blocks). Masks broadcast to ``(..., L, S)``.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from typing import Literal

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

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
    "tiled_attention",
]


# ---------------------------------------------------------------------------------------------
# Validation helpers
# ---------------------------------------------------------------------------------------------


def _check_tensor(x: object, name: str, *, min_ndim: int = 2) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must have a floating-point dtype, got {x.dtype}")
    if x.ndim < min_ndim:
        raise ValueError(
            f"{name} must have at least {min_ndim} dimensions (..., length, features), "
            f"got shape {tuple(x.shape)}"
        )
    return x


def _check_same(reference: torch.Tensor, other: torch.Tensor, name: str) -> None:
    if other.dtype != reference.dtype:
        raise TypeError(f"{name} must have query's dtype {reference.dtype}, got {other.dtype}")
    if other.device != reference.device:
        raise ValueError(f"{name} must be on query's device {reference.device}, got {other.device}")


def _check_qkv(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor | None
) -> tuple[int, ...]:
    """Validate query/key(/value); return the broadcast batch shape."""
    _check_tensor(query, "query")
    _check_tensor(key, "key")
    _check_same(query, key, "key")
    if query.shape[-1] != key.shape[-1]:
        raise ValueError(
            "query and key must have the same feature width D, got query "
            f"{tuple(query.shape)} and key {tuple(key.shape)}"
        )
    shapes = [query.shape[:-2], key.shape[:-2]]
    if value is not None:
        _check_tensor(value, "value")
        _check_same(query, value, "value")
        if value.shape[-2] != key.shape[-2]:
            raise ValueError(
                "key and value must have the same length S, got key "
                f"{tuple(key.shape)} and value {tuple(value.shape)}"
            )
        shapes.append(value.shape[:-2])
    try:
        batch = torch.broadcast_shapes(*shapes)
    except RuntimeError:
        raise ValueError(
            "the leading (batch, head) dimensions of query, key and value must broadcast, got "
            f"{[tuple(s) for s in shapes]}"
        ) from None
    return tuple(batch)


def _check_scale(scale: object, head_dim: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a float or None, got {type(scale).__name__}")
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be a positive finite number, got {scale}")
    return float(scale)


def _check_flag(flag: object, name: str) -> bool:
    if not isinstance(flag, bool):
        raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
    return flag


def _check_mask(mask: object, scores_shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"mask must be a torch.Tensor or None, got {type(mask).__name__}")
    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise TypeError(
            f"mask must be boolean (True = may attend) or floating (added to the scores), "
            f"got {mask.dtype}"
        )
    if mask.device != device:
        raise ValueError(f"mask must be on query's device {device}, got {mask.device}")
    try:
        ok = tuple(torch.broadcast_shapes(mask.shape, scores_shape)) == tuple(scores_shape)
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(
            f"mask must broadcast to the scores' shape (..., L, S) = {tuple(scores_shape)}, "
            f"got {tuple(mask.shape)}"
        )
    return mask


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Half-precision inputs are scored and normalised in float32, then cast back."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


# ---------------------------------------------------------------------------------------------
# Alignment scores before the Transformer
# ---------------------------------------------------------------------------------------------


def dot_score(query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    r"""Luong et al.'s *dot* score :math:`q^\top k` for every query-key pair.

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
    _check_qkv(query, key, None)
    return query @ key.transpose(-2, -1)  # (..., L, S)


def general_score(query: torch.Tensor, key: torch.Tensor, *, weight: torch.Tensor) -> torch.Tensor:
    r"""Luong et al.'s *general* (bilinear) score :math:`q^\top W k`.

    With ``weight`` the identity it is :func:`dot_score`; unlike it, the query and key widths
    may differ.

    Args:
        query: decoder states.
        key: encoder states.
        weight: the learned matrix :math:`W`.

    Returns:
        The scores.

    Shape:
        query: ``(..., L, Dq)``.
        key: ``(..., S, Dk)``.
        weight: ``(Dq, Dk)``.
        output: ``(..., L, S)``.
    """
    _check_tensor(query, "query")
    _check_tensor(key, "key")
    _check_tensor(weight, "weight")
    if weight.shape != (query.shape[-1], key.shape[-1]):
        raise ValueError(
            f"weight must have shape (Dq, Dk) = {(query.shape[-1], key.shape[-1])}, "
            f"got {tuple(weight.shape)}"
        )
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

    In the paper :math:`q` is the previous decoder state :math:`s_{i-1}` and :math:`k` an
    annotation :math:`h_j` of the bidirectional encoder; ``query_weight`` is :math:`W_a`,
    ``key_weight`` is :math:`U_a`, ``v`` is :math:`v_a` (no biases, as in the paper). Weights
    follow :class:`torch.nn.Linear`'s ``(out_features, in_features)`` layout.

    Args:
        query: decoder states.
        key: encoder states.
        query_weight: :math:`W_a`.
        key_weight: :math:`U_a`.
        v: :math:`v_a`.

    Returns:
        The scores.

    Shape:
        query: ``(..., L, Dq)``.
        key: ``(..., S, Dk)``.
        query_weight: ``(A, Dq)``.
        key_weight: ``(A, Dk)``.
        v: ``(A,)``.
        output: ``(..., L, S)``.
    """
    _check_tensor(query, "query")
    _check_tensor(key, "key")
    _check_tensor(v, "v", min_ndim=1)
    hidden = v.shape[-1]
    for w, name, width in (
        (query_weight, "query_weight", query.shape[-1]),
        (key_weight, "key_weight", key.shape[-1]),
    ):
        _check_tensor(w, name)
        if w.shape != (hidden, width):
            raise ValueError(
                f"{name} must have shape (A, {width}) with A = len(v) = {hidden}, got {tuple(w.shape)}"
            )
    wq = query @ query_weight.T  # (..., L, A)
    uk = key @ key_weight.T  # (..., S, A)
    hidden_pairs = torch.tanh(wq.unsqueeze(-2) + uk.unsqueeze(-3))  # (..., L, S, A)
    return hidden_pairs @ v  # (..., L, S)


def concat_score(
    query: torch.Tensor, key: torch.Tensor, *, weight: torch.Tensor, v: torch.Tensor
) -> torch.Tensor:
    r"""Luong et al.'s *concat* score :math:`v^\top \tanh(W [q; k])`.

    Splitting :math:`W = [W_q \; W_k]` by columns gives :math:`W[q;k] = W_q q + W_k k`: this is
    Bahdanau's :func:`additive_score` (the chapter checks it). It is written here with an
    explicit concatenation of every pair, as the formula reads, so it holds an
    ``(..., L, S, Dq + Dk)`` tensor: use it on small inputs.

    Args:
        query: decoder states.
        key: encoder states.
        weight: :math:`W`, ``(A, Dq + Dk)`` like :class:`torch.nn.Linear`.
        v: :math:`v`.

    Returns:
        The scores.

    Shape:
        query: ``(..., L, Dq)``.
        key: ``(..., S, Dk)``.
        weight: ``(A, Dq + Dk)``.
        v: ``(A,)``.
        output: ``(..., L, S)``.
    """
    _check_tensor(query, "query")
    _check_tensor(key, "key")
    _check_tensor(weight, "weight")
    _check_tensor(v, "v", min_ndim=1)
    width = query.shape[-1] + key.shape[-1]
    if weight.shape != (v.shape[-1], width):
        raise ValueError(
            f"weight must have shape (A, Dq + Dk) = {(v.shape[-1], width)}, got {tuple(weight.shape)}"
        )
    L, S = query.shape[-2], key.shape[-2]
    batch = torch.broadcast_shapes(query.shape[:-2], key.shape[:-2])
    q = query.unsqueeze(-2).expand(*batch, L, S, query.shape[-1])  # (..., L, S, Dq)
    k = key.unsqueeze(-3).expand(*batch, L, S, key.shape[-1])  # (..., L, S, Dk)
    pairs = torch.cat([q, k], dim=-1)  # (..., L, S, Dq + Dk)
    return torch.tanh(pairs @ weight.T) @ v  # (..., L, S)


# ---------------------------------------------------------------------------------------------
# Scaled dot-product attention
# ---------------------------------------------------------------------------------------------


def causal_mask(
    query_length: int,
    key_length: int,
    *,
    alignment: Literal["top_left", "bottom_right"] = "top_left",
    device: torch.device | str | None = None,
) -> torch.Tensor:
    r"""Boolean causal mask, ``True`` where query ``i`` may attend to key ``j``.

    ``"top_left"``: :math:`j \le i`, the diagonal starts at the top-left corner. This is what
    ``F.scaled_dot_product_attention(..., is_causal=True)`` uses (``torch.ones(L, S).tril()``).
    ``"bottom_right"``: :math:`j \le i + S - L`, the diagonal ends at the bottom-right corner:
    the last query sees every key, as when ``L`` new tokens are decoded after ``S - L`` cached
    ones (FlashAttention 2.1+ and ``torch.nn.attention.bias.causal_lower_right``).
    The two agree when ``L == S``.

    Args:
        query_length: ``L``.
        key_length: ``S``.
        alignment: ``"top_left"`` or ``"bottom_right"``.
        device: where to create the mask.

    Returns:
        A boolean mask.

    Shape:
        output: ``(L, S)``.
    """
    for name, n in (("query_length", query_length), ("key_length", key_length)):
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"{name} must be an int, got {type(n).__name__}")
        if n < 1:
            raise ValueError(f"{name} must be positive, got {n}")
    if alignment not in ("top_left", "bottom_right"):
        raise ValueError(f"alignment must be 'top_left' or 'bottom_right', got {alignment!r}")
    offset = 0 if alignment == "top_left" else key_length - query_length
    ones = torch.ones(query_length, key_length, dtype=torch.bool, device=device)
    return ones.tril(diagonal=offset)  # True where j <= i + offset


def _masked_softmax(scores: torch.Tensor) -> torch.Tensor:
    """Softmax over the last axis; a row whose scores are all -inf gives zeros, not NaN."""
    row_max = scores.amax(dim=-1, keepdim=True)
    row_max = torch.where(torch.isneginf(row_max), torch.zeros_like(row_max), row_max)
    e = torch.exp(scores - row_max)  # largest finite entry -> exp(0) = 1; -inf -> 0
    total = e.sum(dim=-1, keepdim=True)
    return e / torch.where(total == 0, torch.ones_like(total), total)


def _weights(
    query: torch.Tensor,
    key: torch.Tensor,
    mask: torch.Tensor | None,
    is_causal: bool,
    scale: float | None,
    batch: tuple[int, ...],
) -> torch.Tensor:
    """Attention weights in the compute dtype (float32 for half inputs)."""
    L, S = query.shape[-2], key.shape[-2]
    scale = _check_scale(scale, query.shape[-1])
    _check_flag(is_causal, "is_causal")
    if mask is not None:
        if is_causal:
            raise ValueError(
                "give either mask or is_causal=True, not both (as torch documents); "
                "combine causal_mask(L, S) & mask yourself"
            )
        mask = _check_mask(mask, (*batch, L, S), query.device)
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
    r"""The attention weights :math:`\operatorname{softmax}(QK^\top \cdot \text{scale} + M)`.

    Each row is a probability distribution over the ``S`` keys. The semantics are those of
    :func:`torch.nn.functional.scaled_dot_product_attention` (which does not return them):
    ``scale`` defaults to :math:`1/\sqrt{D}`; a boolean ``mask`` is ``True`` where a query may
    attend, a float ``mask`` is added to the scores; ``is_causal`` applies the top-left causal
    mask of :func:`causal_mask`. Giving both ``mask`` and ``is_causal=True`` is an error, as
    torch documents (torch 2.13 raises for 3-D inputs and silently combines the two masks for
    4-D inputs; the chapter shows both).

    Deliberate difference: a row whose keys are all masked gets weights that are all zero (so
    its output is zero) instead of the NaN of a plain softmax. torch's
    ``scaled_dot_product_attention`` also returns zeros there on the CPU (fused and math
    paths alike, torch 2.13); :class:`torch.nn.MultiheadAttention` returns NaN.

    Half-precision inputs are scored and normalised in float32; the result has the input's dtype.

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
    batch = _check_qkv(query, key, None)
    return _weights(query, key, mask, is_causal, scale, batch).to(query.dtype)


def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> torch.Tensor:
    r"""Scaled dot-product attention :math:`\operatorname{softmax}(QK^\top/\sqrt{D} + M)\,V`.

    Same arguments and results as
    ``torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask,
    is_causal=is_causal, scale=scale)`` (no dropout), computed from the definition: the full
    ``(..., L, S)`` weight matrix is formed, so memory grows as :math:`L S`
    (:func:`tiled_attention` avoids that). See :func:`attention_weights` for the masks and for
    what a fully masked row returns (zeros).

    Args:
        query: queries.
        key: keys.
        value: values.
        mask: boolean (``True`` = may attend) or float (added) mask, broadcastable to
            ``(..., L, S)``.
        is_causal: apply the top-left causal mask (``j <= i``).
        scale: factor on the scores; ``None`` means :math:`1/\sqrt{D}`.

    Returns:
        One output per query, the weighted average of the values.

    Shape:
        query: ``(..., L, D)``.
        key: ``(..., S, D)``.
        value: ``(..., S, Dv)``.
        output: ``(..., L, Dv)``.
    """
    batch = _check_qkv(query, key, value)
    weights = _weights(query, key, mask, is_causal, scale, batch)  # (..., L, S)
    return (weights @ value.to(weights.dtype)).to(query.dtype)  # (..., L, Dv)


# ---------------------------------------------------------------------------------------------
# Tiled attention with an online softmax
# ---------------------------------------------------------------------------------------------


def tiled_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    block_size: int,
    is_causal: bool = False,
    scale: float | None = None,
) -> torch.Tensor:
    r"""Scaled dot-product attention in blocks, with an online softmax (the FlashAttention idea).

    Queries are taken ``block_size`` at a time; for each query block one pass over the
    key/value blocks keeps a running row maximum :math:`m`, a running sum :math:`\ell` of
    :math:`e^{s - m}` and a running weighted sum of values, rescaling both by
    :math:`e^{m_\text{old} - m_\text{new}}` whenever the maximum grows
    (Milakov & Gimelshein's online softmax). Only a ``(block, block)`` tile of scores exists at
    any time, so the extra memory is :math:`O(\text{block}^2 + L\,D)` instead of
    :math:`O(L S)`. The result equals :func:`scaled_dot_product_attention` up to rounding.

    This is the algorithm in plain PyTorch (a Python loop over tiles), to show the idea and
    measure memory; it is not fast. Real kernels (FlashAttention, torch's fused SDPA) run the
    same loop inside one GPU/CPU kernel.

    Args:
        query: queries.
        key: keys.
        value: values.
        block_size: rows of queries and of keys per tile.
        is_causal: top-left causal mask (``j <= i``); tiles entirely above the diagonal are
            skipped.
        scale: factor on the scores; ``None`` means :math:`1/\sqrt{D}`.

    Returns:
        The attention output.

    Shape:
        query: ``(..., L, D)``.
        key: ``(..., S, D)``.
        value: ``(..., S, Dv)``.
        output: ``(..., L, Dv)``.
    """
    batch = _check_qkv(query, key, value)
    if isinstance(block_size, bool) or not isinstance(block_size, int):
        raise TypeError(f"block_size must be an int, got {type(block_size).__name__}")
    if block_size < 1:
        raise ValueError(f"block_size must be positive, got {block_size}")
    _check_flag(is_causal, "is_causal")
    scale = _check_scale(scale, query.shape[-1])
    L, S, Dv = query.shape[-2], key.shape[-2], value.shape[-1]
    dtype = _compute_dtype(query.dtype)
    out = torch.empty(*batch, L, Dv, dtype=query.dtype, device=query.device)
    for i0 in range(0, L, block_size):
        i1 = min(i0 + block_size, L)
        q = query[..., i0:i1, :].to(dtype) * scale  # (..., bq, D)
        shape = (*batch, i1 - i0, 1)
        m = torch.full(shape, -math.inf, dtype=dtype, device=query.device)  # running max
        total = torch.zeros(shape, dtype=dtype, device=query.device)  # running sum of e^(s-m)
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


# ---------------------------------------------------------------------------------------------
# Multi-head attention
# ---------------------------------------------------------------------------------------------


def mask_from_torch_mha(
    *,
    attn_mask: torch.Tensor | None = None,
    key_padding_mask: torch.Tensor | None = None,
) -> torch.Tensor | None:
    r"""Convert :class:`torch.nn.MultiheadAttention`'s masks to this module's convention.

    ``nn.MultiheadAttention`` uses the *opposite* boolean convention from
    ``F.scaled_dot_product_attention``: there ``True`` means "may **not** attend" (in
    ``attn_mask``) and "this key is padding" (in ``key_padding_mask``). Here a boolean mask is
    ``True`` where a query may attend. Float masks are added to the scores in both.

    Args:
        attn_mask: ``(L, S)`` boolean (``True`` = blocked) or float mask, or ``None``.
        key_padding_mask: ``(B, S)`` boolean (``True`` = padding) or float mask, or ``None``.

    Returns:
        A mask for :class:`MultiHeadAttention` (boolean when both inputs are boolean, else
        float), or ``None`` when both are ``None``.

    Shape:
        attn_mask: ``(L, S)``.
        key_padding_mask: ``(B, S)``.
        output: ``(L, S)`` from ``attn_mask`` alone, ``(B, 1, 1, S)`` from
            ``key_padding_mask`` alone, ``(B, 1, L, S)`` from both.
    """
    parts = []
    if attn_mask is not None:
        if not isinstance(attn_mask, torch.Tensor) or attn_mask.ndim != 2:
            raise ValueError(
                "attn_mask must be a 2-D (L, S) tensor, got "
                f"{tuple(attn_mask.shape) if isinstance(attn_mask, torch.Tensor) else type(attn_mask).__name__}"
            )
        parts.append(attn_mask)
    if key_padding_mask is not None:
        if not isinstance(key_padding_mask, torch.Tensor) or key_padding_mask.ndim != 2:
            raise ValueError(
                "key_padding_mask must be a 2-D (B, S) tensor, got "
                f"{tuple(key_padding_mask.shape) if isinstance(key_padding_mask, torch.Tensor) else type(key_padding_mask).__name__}"
            )
        parts.append(key_padding_mask[:, None, None, :])  # (B, 1, 1, S)
    if not parts:
        return None
    if all(p.dtype == torch.bool for p in parts):
        allowed = ~parts[0]  # invert: True = blocked there, True = may attend here
        for p in parts[1:]:
            allowed = allowed & ~p
        return allowed
    dtype = next(p.dtype for p in parts if p.dtype != torch.bool)
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

    ``forward`` is one call to :func:`scaled_dot_product_attention` between the reshapes:

    .. code-block:: text

        (B, L, E) -> q_proj -> (B, L, H, E/H) -> transpose -> (B, H, L, E/H)
        attend per head -> (B, H, L, E/H) -> transpose, merge -> (B, L, E) -> out_proj

    The four projections are separate :class:`torch.nn.Linear` layers (like Hugging Face
    models and nanoGPT's split of ``c_attn``); :meth:`load_torch_weights` copies them from a
    :class:`torch.nn.MultiheadAttention`, which packs ``W_Q, W_K, W_V`` row-wise into one
    ``in_proj_weight`` of shape ``(3E, E)``.

    Args:
        embed_dim: model width ``E``.
        num_heads: number of heads ``H``; must divide ``embed_dim``.
        bias: add biases to the four projections.
        device: where to create the parameters.
        dtype: dtype of the parameters.

    Shape:
        query: ``(B, L, E)``.
        key: ``(B, S, E)``.
        value: ``(B, S, E)``.
        mask: broadcastable to ``(B, H, L, S)``, ``True`` = may attend.
        output: ``(B, L, E)``.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        for name, n in (("embed_dim", embed_dim), ("num_heads", num_heads)):
            if isinstance(n, bool) or not isinstance(n, int):
                raise TypeError(f"{name} must be an int, got {type(n).__name__}")
            if n < 1:
                raise ValueError(f"{name} must be positive, got {n}")
        if embed_dim % num_heads != 0:
            raise ValueError(
                f"num_heads must divide embed_dim, got embed_dim={embed_dim}, num_heads={num_heads}"
            )
        _check_flag(bias, "bias")
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        kw = {"bias": bias, "device": device, "dtype": dtype}
        self.q_proj = nn.Linear(embed_dim, embed_dim, **kw)
        self.k_proj = nn.Linear(embed_dim, embed_dim, **kw)
        self.v_proj = nn.Linear(embed_dim, embed_dim, **kw)
        self.out_proj = nn.Linear(embed_dim, embed_dim, **kw)

    def _split(self, x: torch.Tensor, name: str) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.ndim != 3 or x.shape[-1] != self.embed_dim:
            raise ValueError(
                f"{name} must have shape (B, length, embed_dim={self.embed_dim}), "
                f"got {tuple(x.shape)}"
            )
        B, T, _ = x.shape
        return x.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, T, E/H)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        *,
        mask: torch.Tensor | None = None,
        is_causal: bool = False,
    ) -> torch.Tensor:
        """Attend from ``query`` to ``key``/``value`` (all ``(B, length, E)``)."""
        q = self._split(self.q_proj(query), "query")  # (B, H, L, E/H)
        k = self._split(self.k_proj(key), "key")  # (B, H, S, E/H)
        v = self._split(self.v_proj(value), "value")  # (B, H, S, E/H)
        out = scaled_dot_product_attention(q, k, v, mask=mask, is_causal=is_causal)
        B, H, L, Dh = out.shape
        out = out.transpose(1, 2).reshape(B, L, H * Dh)  # (B, L, E): heads side by side
        return self.out_proj(out)

    @torch.no_grad()
    def load_torch_weights(self, module: nn.MultiheadAttention) -> MultiHeadAttention:
        """Copy the weights of a :class:`torch.nn.MultiheadAttention` into this module.

        ``module`` must have the same ``embed_dim`` and ``num_heads``, equal query/key/value
        widths (so it packs them into ``in_proj_weight``) and no ``add_bias_kv``. Its output
        then matches this module's for ``batch_first=True`` inputs, with masks converted by
        :func:`mask_from_torch_mha`.

        Args:
            module: the module to copy from.

        Returns:
            ``self``.
        """
        if not isinstance(module, nn.MultiheadAttention):
            raise TypeError(f"module must be an nn.MultiheadAttention, got {type(module).__name__}")
        if (module.embed_dim, module.num_heads) != (self.embed_dim, self.num_heads):
            raise ValueError(
                f"module must have embed_dim={self.embed_dim}, num_heads={self.num_heads}, got "
                f"embed_dim={module.embed_dim}, num_heads={module.num_heads}"
            )
        if module.in_proj_weight is None or module.bias_k is not None:
            raise ValueError("module must pack q, k, v in in_proj_weight and have no add_bias_kv")
        if (module.in_proj_bias is None) != (self.q_proj.bias is None):
            raise ValueError("module and self must agree on bias")
        w_q, w_k, w_v = module.in_proj_weight.chunk(3, dim=0)  # rows: W_Q, then W_K, then W_V
        for proj, w in ((self.q_proj, w_q), (self.k_proj, w_k), (self.v_proj, w_v)):
            proj.weight.copy_(w)
        self.out_proj.weight.copy_(module.out_proj.weight)
        if module.in_proj_bias is not None:
            b_q, b_k, b_v = module.in_proj_bias.chunk(3)
            for proj, b in ((self.q_proj, b_q), (self.k_proj, b_k), (self.v_proj, b_v)):
                proj.bias.copy_(b)
            self.out_proj.bias.copy_(module.out_proj.bias)
        return self


# ---------------------------------------------------------------------------------------------
# Measuring peak memory
# ---------------------------------------------------------------------------------------------


class _LiveTensorBytes(TorchDispatchMode):
    """Counts the bytes of the tensors that operators create while active, as they live and die.

    A storage is counted once, when an operator first returns it, and released when the last
    tensor seen on it (the first result or any later view or in-place result) is garbage
    collected. Storages of tensors made before the mode started are never counted.
    """

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._sizes: dict[int, int] = {}  # storage address -> bytes
        self._refs: dict[int, int] = {}  # storage address -> tensors seen on it still alive

    def _release(self, address: int) -> None:
        self._refs[address] -= 1
        if self._refs[address] == 0:
            del self._refs[address]
            self.live -= self._sizes.pop(address)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {
            t.untyped_storage().data_ptr()
            for t in tree_flatten((args, kwargs))[0]
            if isinstance(t, torch.Tensor)
        }
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            address = storage.data_ptr()
            if address == 0 or (address in inputs and address not in self._sizes):
                continue  # empty, or a view/in-place result of a tensor made before the mode
            if address not in self._sizes:  # new memory
                self._sizes[address] = storage.nbytes()
                self._refs[address] = 0
                self.live += storage.nbytes()
                self.peak = max(self.peak, self.live)
            self._refs[address] += 1  # one more tensor keeps this storage alive
            weakref.finalize(t, self._release, address)
        return out


def measure_peak_memory(fn: Callable[[], object], *, device: torch.device | str) -> int:
    """Bytes of memory that ``fn()`` holds at its peak, above what was in use before the call.

    On CUDA: :func:`torch.cuda.max_memory_allocated` after
    :func:`torch.cuda.reset_peak_memory_stats`, minus what was allocated before. Elsewhere
    (the CPU): every tensor that a torch operator creates inside ``fn`` is counted from its
    creation until it is freed, through a :class:`~torch.utils._python_dispatch.TorchDispatchMode`;
    the peak of that running total is returned. The count is exact for the tensors a Python
    implementation creates; scratch memory *inside* one fused kernel (such as
    ``F.scaled_dot_product_attention``'s) is not seen, only its outputs. The counting slows
    ``fn`` down: time it separately.

    Args:
        fn: a function with no arguments (its result is discarded).
        device: the device ``fn`` computes on.

    Returns:
        Peak bytes.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    counter = _LiveTensorBytes()
    with counter:
        fn()
    return counter.peak
