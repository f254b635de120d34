r"""The relative-position family: Shaw, Transformer-XL, T5 buckets, and NoPE.

The chapters before this one cover the absolute sinusoidal encoding, RoPE, ALiBi and the
RoPE scaling rules. This module holds the other members a reader meets in real models,
each matched to a reference in ``tests/test_relative.py``:

**Relative positions inside attention.** With queries at positions :math:`i` and keys at
:math:`j`:

=====================================  ==============================================
:func:`shaw_attention`                 Shaw et al. (2018): learned vectors
                                       :math:`a^K_{\mathrm{clip}(j-i)}` added to the keys
                                       (and :math:`a^V` to the values),
                                       :math:`e_{ij} = q_i \cdot (k_j + a^K_{ij})`
:func:`transformer_xl_scores`          Dai et al. (2019): the four terms of
                                       :math:`(x_i + p_i) W_Q W_K^\top (x_j + p_j)^\top`
                                       (positions added to the inputs) rewritten with a
                                       relative encoding :math:`r_{i-j}` and two learned
                                       vectors :math:`u, v`; computed with :func:`rel_shift`
:func:`t5_relative_position_bucket`,   Raffel et al. (2020): one learned scalar per head
:func:`t5_relative_bias`,              and *bucket* of :math:`j - i`: exact for the
:class:`T5RelativeBias`                nearest distances, logarithmic up to
                                       ``max_distance``; Hugging Face's T5 bit for bit
=====================================  ==============================================

ALiBi (:func:`companion.extension.alibi_bias`) is the same family with a fixed bias
:math:`-a_h (i - j)` instead of a learned one. For the trained comparison, each has a
causal self-attention layer in the style of :mod:`companion.model` (a subclass of
:class:`companion.model.CausalSelfAttention` that overrides one hook of ``attend``):
:class:`T5BiasSelfAttention`, :class:`ShawSelfAttention` and
:class:`TransformerXLSelfAttention`; a :class:`companion.model.TinyTransformer`
subclass whose ``_attention`` returns one of them trains with it
(``position="none"`` in its config).

**RoPE's variants** (the choice of base, p-RoPE, LongRoPE, RoPE in 2-D and 3-D) are in
:mod:`companion.rope_variants`; their old names here are deprecated aliases for one
release.

**No position at all.** :func:`nope_position_readout` computes Kazemnejad et al.'s
(2023) construction: causal attention with equal scores reads absolute position.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import Tensor, nn

from companion import _deprecation, _validate, rope_variants
from companion.attention import scaled_dot_product_attention, softmax_scale
from companion.model import CausalSelfAttention, ModelConfig, TinyTransformer
from companion.positional import inverse_frequencies

__all__ = [
    "PositionFamilyTransformer",
    "ShawSelfAttention",
    "T5BiasSelfAttention",
    "T5RelativeBias",
    "TransformerXLSelfAttention",
    "nope_position_readout",
    "position_family_model",
    "rel_shift",
    "relative_positions",
    "shaw_attention",
    "shaw_relative_index",
    "shaw_scores",
    "t5_relative_bias",
    "t5_relative_position_bucket",
    "transformer_xl_encoding",
    "transformer_xl_scores",
]


# ---- relative positions ----------------------------------------------------------------


def _lengths(
    query_length: object, key_length: object, query_offset: object
) -> tuple[int, int, int]:
    return (
        _validate.nonnegative_int("query_length", query_length),
        _validate.nonnegative_int("key_length", key_length),
        _validate.nonnegative_int("query_offset", query_offset),
    )


def relative_positions(
    query_length: int,
    key_length: int,
    *,
    query_offset: int = 0,
    device: torch.device | str | None = None,
) -> Tensor:
    r"""The matrix of relative positions :math:`j - i`, key minus query.

    Query row ``l`` sits at position :math:`i = l + \text{query\_offset}` and key column
    ``j`` at position :math:`j`: ``query_offset = 0`` is self-attention from the start,
    ``query_offset = S - L`` queries that are the last ``L`` of ``S`` positions (a KV
    cache; Hugging Face's T5 calls it ``past_seen_tokens``). Negative entries are keys
    in the past. This is the ``relative_position`` of Hugging Face's
    ``T5Attention.compute_bias`` (``memory_position - context_position``).

    Args:
        query_length: ``L``, at least 0.
        key_length: ``S``, at least 0.
        query_offset: the position of query row 0, at least 0.
        device: output device.

    Returns:
        :math:`j - i`, int64.

    Shape:
        output: ``(L, S)``.
    """
    length, keys, offset = _lengths(query_length, key_length, query_offset)
    device = _validate.device("device", device)
    i = torch.arange(length, device=device) + offset  # (L,) query positions
    j = torch.arange(keys, device=device)  # (S,) key positions
    return j[None, :] - i[:, None]  # (L, S)


# ---- T5 ---------------------------------------------------------------------------------


def _t5_bucket_arguments(
    bidirectional: object, num_buckets: object, max_distance: object
) -> tuple[bool, int, int, int]:
    """Validated ``(bidirectional, num_buckets, max_distance, n)`` with ``n`` the buckets
    of one direction; ``n // 2`` exact buckets must exist and ``max_distance`` must lie
    beyond them, or the logarithmic buckets divide by zero."""
    bidirectional = _validate.flag("bidirectional", bidirectional)
    smallest = 4 if bidirectional else 2
    why = "two directions of at least 2 buckets" if bidirectional else "at least 2"
    num_buckets = _validate.positive_int("num_buckets", num_buckets)
    if num_buckets < smallest:
        raise ValueError(
            f"num_buckets must be an int >= {smallest} ({why}; a direction needs an "
            f"exact bucket), got {num_buckets}"
        )
    n = num_buckets // 2 if bidirectional else num_buckets
    max_distance = _validate.positive_int("max_distance", max_distance)
    if max_distance <= n // 2:
        raise ValueError(
            f"max_distance must be > {n // 2} (the exact buckets of a direction, "
            f"num_buckets={num_buckets} with bidirectional={bidirectional}), got "
            f"{max_distance}"
        )
    return bidirectional, num_buckets, max_distance, n


def t5_relative_position_bucket(
    relative_position: Tensor,
    *,
    bidirectional: bool = True,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> Tensor:
    r"""T5's bucket of each relative position :math:`j - i` (key minus query).

    With ``bidirectional`` (T5's encoder) half of the buckets serve keys in the past or
    at the query (:math:`j - i \le 0`) and half keys in the future, offset by
    ``num_buckets // 2``; without it (the decoder) keys in the future all share bucket 0
    with the query itself. Within a direction of :math:`n` buckets and distance
    :math:`r = |j - i|` (or :math:`\max(i - j, 0)`), with :math:`e = \lfloor n/2
    \rfloor` exact buckets, the bucket is :math:`r` itself for :math:`r < e`, and for
    :math:`r \ge e`, with :math:`M` = ``max_distance``,

    .. math::

        \text{bucket}(r) &= \min\!\big(n - 1,\; e + \lfloor s(r)\,(n - e) \rfloor\big), \\
        s(r) &= \frac{\ln(r/e)}{\ln(M/e)},

    so every distance from ``max_distance`` on shares the last bucket. The logarithm is
    computed in float32 exactly as Hugging Face's ``T5Attention._relative_position_bucket``
    and Mesh TensorFlow's ``_relative_position_bucket`` (which T5 was trained with)
    compute it: the result equals theirs for every input, including the distances where
    the exact quotient is a whole number and float32 rounding decides the bucket.

    Args:
        relative_position: :math:`j - i`, an integer tensor of any shape, e.g. from
            :func:`relative_positions`.
        bidirectional: buckets for both directions (encoder) or the past only
            (decoder).
        num_buckets: total number of buckets (T5: 32); at least 4 if bidirectional, 2
            otherwise.
        max_distance: distance from which every position shares the last bucket (T5:
            128); more than the exact buckets of a direction.

    Returns:
        Bucket indices in ``[0, num_buckets)``, int64, on ``relative_position``'s
        device.

    Shape:
        relative_position: ``(...)``; output: ``(...)``.
    """
    relative_position = _validate.tensor(
        "relative_position", relative_position, dtype="integer"
    )
    bidirectional, _, max_distance, n = _t5_bucket_arguments(
        bidirectional, num_buckets, max_distance
    )
    rel = relative_position.to(torch.int64)
    if bidirectional:
        offset = (rel > 0).to(torch.int64) * n  # future keys: the upper half
        distance = rel.abs()
    else:
        offset = torch.zeros_like(rel)
        distance = (-rel).clamp(min=0)  # past keys only; the future is distance 0
    exact = n // 2
    # the same float32 operations in the same order as T5's code (bucket boundaries
    # where the quotient is a whole number follow float32 rounding); distances below
    # `exact` are clamped only to keep log(0) out of a value that is not used
    large = exact + (
        torch.log(distance.clamp(min=exact).float() / exact)
        / math.log(max_distance / exact)
        * (n - exact)
    ).to(torch.int64)
    large = large.clamp(max=n - 1)
    return offset + torch.where(distance < exact, distance, large)


def t5_relative_bias(
    weight: Tensor,
    query_length: int,
    key_length: int,
    *,
    bidirectional: bool = True,
    max_distance: int = 128,
    query_offset: int = 0,
) -> Tensor:
    r"""T5's relative position bias: one learned scalar per head and bucket.

    :math:`b_h(i, j) = W[\text{bucket}(j - i), h]` with the bucket of
    :func:`t5_relative_position_bucket`; added to the attention scores before the
    softmax (T5 does not divide its scores by :math:`\sqrt{D}`, the bias is added to
    the raw :math:`q \cdot k`). The same bias serves every layer in T5 (only the first
    layer owns the table). Equal to Hugging Face's ``T5Attention.compute_bias`` (which
    returns it with a leading axis of 1) with ``bidirectional = not is_decoder``.

    Args:
        weight: the table :math:`W`, a floating-point tensor with one row per bucket
            (``num_buckets = weight.shape[0]``) and one column per head.
        query_length: ``L``.
        key_length: ``S``.
        bidirectional: see :func:`t5_relative_position_bucket`.
        max_distance: see :func:`t5_relative_position_bucket`.
        query_offset: the position of query row 0 (see :func:`relative_positions`).

    Returns:
        The bias per head, ``weight``'s dtype and device.

    Shape:
        weight: ``(num_buckets, H)``.
        output: ``(H, L, S)``; broadcasts against scores ``(B, H, L, S)``.
    """
    weight = _validate.tensor("weight", weight, ndim=2, meaning="(num_buckets, H)")
    try:
        _t5_bucket_arguments(bidirectional, weight.shape[0], max_distance)
    except ValueError as error:
        if not str(error).startswith("num_buckets"):
            raise
        raise ValueError(
            f"weight must have a valid number of rows (num_buckets): {error}"
        ) from None
    rel = relative_positions(
        query_length, key_length, query_offset=query_offset, device=weight.device
    )
    buckets = t5_relative_position_bucket(
        rel,
        bidirectional=bidirectional,
        num_buckets=weight.shape[0],
        max_distance=max_distance,
    )  # (L, S)
    return weight[buckets].permute(2, 0, 1)  # (L, S, H) -> (H, L, S)


class T5RelativeBias(nn.Module):
    r"""T5's learned bucketed relative bias, a thin module around
    :func:`t5_relative_bias`.

    Holds ``relative_attention_bias``, an ``nn.Embedding(num_buckets, num_heads)``
    named as in Hugging Face's ``T5Attention``, so a T5 checkpoint's
    ``...relative_attention_bias.weight`` loads into it as it is.

    Args:
        num_heads: ``H``.
        num_buckets: see :func:`t5_relative_position_bucket` (T5: 32).
        max_distance: see :func:`t5_relative_position_bucket` (T5: 128).
        bidirectional: ``True`` for an encoder, ``False`` for a decoder.
        device: device of the table.
        dtype: floating-point dtype of the table.

    Shape:
        output of ``forward(L, S)``: ``(H, L, S)``.
    """

    def __init__(
        self,
        num_heads: int,
        *,
        num_buckets: int = 32,
        max_distance: int = 128,
        bidirectional: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.num_heads = _validate.positive_int("num_heads", num_heads)
        self.bidirectional, self.num_buckets, self.max_distance, _ = (
            _t5_bucket_arguments(bidirectional, num_buckets, max_distance)
        )
        self.relative_attention_bias = nn.Embedding(
            self.num_buckets, self.num_heads, **_validate.factory_kwargs(device, dtype)
        )

    def forward(
        self, query_length: int, key_length: int, *, query_offset: int = 0
    ) -> Tensor:
        """The bias ``(H, L, S)`` for ``L`` queries starting at ``query_offset`` and
        ``S`` keys."""
        return t5_relative_bias(
            self.relative_attention_bias.weight,
            query_length,
            key_length,
            bidirectional=self.bidirectional,
            max_distance=self.max_distance,
            query_offset=query_offset,
        )

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, num_buckets={self.num_buckets}, "
            f"max_distance={self.max_distance}, bidirectional={self.bidirectional}"
        )


# ---- Shaw et al. -------------------------------------------------------------------------


def shaw_relative_index(
    query_length: int,
    key_length: int,
    max_relative_position: int,
    *,
    query_offset: int = 0,
    device: torch.device | str | None = None,
) -> Tensor:
    r"""Row of Shaw et al.'s table for each query-key pair:
    :math:`\mathrm{clip}(j - i, -K, K) + K`.

    Shaw et al. (2018) learn :math:`2K + 1` vectors :math:`w_{-K}, \ldots, w_K` and use
    :math:`a_{ij} = w_{\mathrm{clip}(j - i, -K, K)}`: every key more than :math:`K`
    positions away shares the last vector of its side.

    Args:
        query_length: ``L``.
        key_length: ``S``.
        max_relative_position: the clipping distance :math:`K` (the paper's
            :math:`k`), at least 0.
        query_offset: the position of query row 0 (see :func:`relative_positions`).
        device: output device.

    Returns:
        Indices in ``[0, 2K]``, int64.

    Shape:
        output: ``(L, S)``.
    """
    k = _validate.nonnegative_int("max_relative_position", max_relative_position)
    rel = relative_positions(
        query_length, key_length, query_offset=query_offset, device=device
    )
    return rel.clamp(-k, k) + k


def _shaw_inputs(
    query: object, key: object, rel_key: object, query_offset: object
) -> tuple[int, int]:
    """Validates the shared inputs; returns ``(K, query_offset)``."""
    _validate.attention_inputs(query, key)
    rel_key = _validate.tensor_like(
        "rel_key", rel_key, "query", query, ndim=2, meaning="(2K + 1, D)"
    )
    _validate.same_size("query", query, -1, "rel_key", rel_key, -1, "feature-width (D)")
    rows = rel_key.shape[0]
    if rows % 2 == 0:
        raise ValueError(
            "rel_key must have an odd number 2K + 1 of rows (relative positions -K "
            f"to K), got shape {tuple(rel_key.shape)}"
        )
    return rows // 2, _validate.nonnegative_int("query_offset", query_offset)


def shaw_scores(
    query: Tensor,
    key: Tensor,
    rel_key: Tensor,
    *,
    scale: float | None = None,
    query_offset: int = 0,
) -> Tensor:
    r"""Shaw et al.'s attention scores :math:`e_{ij} = q_i \cdot (k_j + a^K_{ij})`
    times ``scale``.

    :math:`a^K_{ij}` is row :math:`\mathrm{clip}(j - i, -K, K) + K` of ``rel_key``
    (:func:`shaw_relative_index`), shared by every head as in the paper. Computed as in
    the paper's efficient form: :math:`q_i \cdot a^K_{ij}` is read from the
    :math:`L \times (2K + 1)` products :math:`q_i \cdot w_r`, never from an
    :math:`L \times S \times D` tensor.

    Args:
        query: floating-point tensor.
        key: same dtype and device as ``query``.
        rel_key: the :math:`2K + 1` learned vectors :math:`w^K_{-K}, \ldots, w^K_K`,
            same dtype and device.
        scale: factor on the scores; ``None`` means :math:`1/\sqrt{D}` (the paper's
            :math:`1/\sqrt{d_z}`).
        query_offset: the position of query row 0 (see :func:`relative_positions`).

    Returns:
        The scaled scores.

    Shape:
        query: ``(..., L, D)``; key: ``(..., S, D)``; rel_key: ``(2K + 1, D)``.
        output: ``(..., L, S)``.
    """
    k, offset = _shaw_inputs(query, key, rel_key, query_offset)
    s = softmax_scale(query, scale)
    length, keys = query.shape[-2], key.shape[-2]
    index = shaw_relative_index(
        length, keys, k, query_offset=offset, device=query.device
    )
    content = query @ key.transpose(-2, -1)  # (..., L, S)
    by_row = query @ rel_key.transpose(0, 1)  # (..., L, 2K + 1): q_i . w_r
    position = torch.gather(
        by_row, -1, index.expand(*by_row.shape[:-1], keys)
    )  # (..., L, S): q_i . w_{index(i, j)}
    return (content + position) * s


def shaw_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    rel_key: Tensor,
    rel_value: Tensor | None = None,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    query_offset: int = 0,
) -> Tensor:
    r"""Attention with Shaw et al.'s relative position representations.

    :math:`z_i = \sum_j \alpha_{ij} (v_j + a^V_{ij})` with
    :math:`\alpha_{i\cdot} = \mathrm{softmax}_j(e_{ij})` and :math:`e_{ij}` from
    :func:`shaw_scores`; :math:`a^V_{ij}` is row :math:`\mathrm{clip}(j-i, -K, K) + K`
    of ``rel_value`` (no value term when it is ``None``, as in the paper's ablation
    that keeps only :math:`a^K`). The value term is formed as the paper's efficient
    implementation does: the weights of the keys that share a relative position are
    summed into :math:`2K + 1` slots first, then multiplied by the table.

    Args:
        query: floating-point tensor.
        key: same dtype and device as ``query``.
        value: same dtype and device.
        rel_key: the :math:`2K + 1` key vectors, same dtype and device.
        rel_value: ``None`` or the :math:`2K + 1` value vectors, same dtype and device.
        is_causal: mask keys after the query (position :math:`j > i`).
        scale: factor on the scores; ``None`` means :math:`1/\sqrt{D}`.
        query_offset: the position of query row 0 (see :func:`relative_positions`).

    Returns:
        The attention output, ``query``'s dtype and device.

    Shape:
        query: ``(..., L, D)``; key: ``(..., S, D)``; value: ``(..., S, Dv)``.
        rel_key: ``(2K + 1, D)``; rel_value: ``(2K + 1, Dv)``.
        output: ``(..., L, Dv)``.
    """
    _validate.attention_inputs(query, key, value)
    k, offset = _shaw_inputs(query, key, rel_key, query_offset)
    if rel_value is not None:
        rel_value = _validate.tensor_like(
            "rel_value", rel_value, "query", query, ndim=2, meaning="(2K + 1, Dv)"
        )
        _validate.shape(
            "rel_value",
            rel_value,
            (2 * k + 1, value.shape[-1]),
            "(2K + 1, Dv) with rel_key's 2K + 1 rows",
        )
    is_causal = _validate.flag("is_causal", is_causal)
    scores = shaw_scores(query, key, rel_key, scale=scale, query_offset=offset)
    length, keys = query.shape[-2], key.shape[-2]
    if is_causal:
        future = relative_positions(
            length, keys, query_offset=offset, device=query.device
        )
        scores = scores.masked_fill(future > 0, float("-inf"))
    weights = torch.softmax(scores, dim=-1)  # (..., L, S)
    out = weights @ value  # (..., L, Dv)
    if rel_value is None:
        return out
    index = shaw_relative_index(
        length, keys, k, query_offset=offset, device=query.device
    )
    slots = torch.zeros(
        *weights.shape[:-1], 2 * k + 1, dtype=weights.dtype, device=weights.device
    )  # (..., L, 2K + 1): the weight on each relative position
    slots = slots.scatter_add(-1, index.expand_as(weights), weights)
    return out + slots @ rel_value


# ---- Transformer-XL ------------------------------------------------------------------


def rel_shift(x: Tensor) -> Tensor:
    r"""Transformer-XL's relative shift: row :math:`l` of ``x`` moved left by
    :math:`L - 1 - l` places.

    ``out[..., l, j] = x[..., l, j + L - 1 - l]`` wherever :math:`j + L - 1 - l < S`.
    With column :math:`c` of ``x`` holding the term for distance :math:`S - 1 - c`, the
    result holds in column :math:`j` the term for distance :math:`(l + S - L) - j`:
    query row :math:`l` at position :math:`l + S - L` against key :math:`j`. The
    entries with :math:`j > l + S - L` (keys after the query) are left-overs of the
    next row and a zero pad, and must be masked. The implementation is the authors'
    trick (Dai et al., 2019, ``_rel_shift``): pad one zero column on the left, view the
    ``L x (S + 1)`` block as ``(S + 1) x L``, drop its first row and view it back, a
    reshaping without a gather.

    Args:
        x: a tensor whose last two axes are ``(L, S)`` with ``L <= S``.

    Returns:
        The shifted tensor, same shape, dtype and device.

    Shape:
        x: ``(..., L, S)``; output: ``(..., L, S)``.
    """
    x = _validate.tensor("x", x, dtype=None, min_ndim=2, meaning="(..., L, S)")
    length, keys = x.shape[-2], x.shape[-1]
    if length > keys:
        raise ValueError(
            f"x must have L <= S (queries are the last L of the S positions), got "
            f"shape {tuple(x.shape)}"
        )
    lead = x.shape[:-2]
    padded = torch.cat([x.new_zeros(*lead, length, 1), x], dim=-1)  # (..., L, S + 1)
    padded = padded.reshape(
        *lead, keys + 1, length
    )  # the same memory, read as S+1 rows
    return padded[..., 1:, :].reshape(*lead, length, keys)


def transformer_xl_encoding(
    key_length: int,
    dim: int,
    *,
    base: float = 10000.0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> Tensor:
    r"""Transformer-XL's sinusoidal encoding :math:`R_d` of the distances
    :math:`d = 0, \ldots, S - 1`.

    Row :math:`d` is :math:`[\sin(d\,\omega_0), \ldots, \sin(d\,\omega_{D/2-1}),
    \cos(d\,\omega_0), \ldots, \cos(d\,\omega_{D/2-1})]` with
    :math:`\omega_i = \text{base}^{-2i/D}`: the sines then the cosines, the layout of
    the authors' ``PositionalEmbedding``. Their code lists the distances from
    :math:`S - 1` down to 0 (``pos_seq = arange(klen - 1, -1, -1)``); here row
    :math:`d` is distance :math:`d`, and :func:`transformer_xl_scores` flips it.
    Projected by :math:`W_{k,R}`, it gives the ``rel_key`` of
    :func:`transformer_xl_scores`.

    Args:
        key_length: ``S``, at least 0.
        dim: the width ``D``, a positive even int.
        base: base of the frequencies.
        dtype: floating-point output dtype (angles are formed in float64).
        device: output device.

    Returns:
        The encodings, one row per distance.

    Shape:
        output: ``(S, D)``.
    """
    keys = _validate.nonnegative_int("key_length", key_length)
    omega = inverse_frequencies(dim, base=base)  # (D/2,) float64
    dtype = _validate.dtype("dtype", dtype)
    device = _validate.device("device", device)
    angles = torch.arange(keys, dtype=torch.float64)[:, None] * omega  # (S, D/2)
    table = torch.cat([angles.sin(), angles.cos()], dim=-1)  # (S, D)
    return table.to(device=device, dtype=dtype)


def transformer_xl_scores(
    query: Tensor,
    key: Tensor,
    rel_key: Tensor,
    u: Tensor,
    v: Tensor,
    *,
    scale: float | None = None,
) -> Tensor:
    r"""Transformer-XL's relative attention scores (Dai et al., 2019), causal.

    For the query at position :math:`i` and the key at :math:`j \le i`, with
    :math:`r_{i-j}` the projected relative encoding (``rel_key`` row :math:`i - j`):

    .. math::

        A_{ij} = \underbrace{q_i \cdot k_j}_{(a)} + \underbrace{q_i \cdot r_{i-j}}_{(b)}
               + \underbrace{u \cdot k_j}_{(c)} + \underbrace{v \cdot r_{i-j}}_{(d)}
               = (q_i + u) \cdot k_j + \mathrm{shift}\big((q_i + v) \cdot r\big)_{ij},

    the four terms of :math:`(x_i + p_i) W_Q W_K^\top (x_j + p_j)^\top` (rows, as in
    :ref:`ch-relative`; the paper writes column vectors) with the key's
    absolute :math:`p_j` replaced by :math:`r_{i-j}` and the query's by the learned
    :math:`u` and :math:`v`. Terms (b) and (d) are one :math:`L \times S` product
    against the distances, realigned by :func:`rel_shift`. Queries are the last ``L``
    of the ``S`` positions (``S - L`` remembered ones before them, the authors'
    ``mlen``); keys after the query get :math:`-\infty`. The result is ``scale`` times
    :math:`A`, ready for a softmax.

    Args:
        query: floating-point tensor, the projected queries :math:`q_i = W_q x_i`.
        key: same dtype and device, :math:`k_j = W_{k,E} x_j`.
        rel_key: :math:`r_d = W_{k,R} R_d` for the distances :math:`d = 0 .. S - 1`
            (row :math:`d`), same dtype and device; it broadcasts against ``key``
            (one table for all heads, or ``(H, S, D)`` per head).
        u: the content bias :math:`u`, broadcast against ``query`` (``(D,)``, or
            ``(H, 1, D)`` per head as in the authors' ``r_w_bias``).
        v: the position bias :math:`v` (the authors' ``r_r_bias``), like ``u``.
        scale: factor on the scores; ``None`` means :math:`1/\sqrt{D}`.

    Returns:
        The scaled scores with :math:`-\infty` above the causal diagonal.

    Shape:
        query: ``(..., L, D)``; key: ``(..., S, D)`` with ``S >= L``.
        rel_key: ``(..., S, D)``; u, v: ``(..., D)`` broadcasting against query.
        output: ``(..., L, S)``.
    """
    _validate.attention_inputs(query, key)
    length, keys = query.shape[-2], key.shape[-2]
    if keys < length:
        raise ValueError(
            "key must have at least as many positions as query (queries are the last "
            f"L of S), got query {tuple(query.shape)} and key {tuple(key.shape)}"
        )
    rel_key = _validate.tensor_like(
        "rel_key", rel_key, "query", query, min_ndim=2, meaning="(..., S, D)"
    )
    _validate.size("rel_key", rel_key, -2, keys, "S, one row per distance 0 .. S - 1")
    _validate.size("rel_key", rel_key, -1, query.shape[-1], "D, query's width")
    _validate.broadcastable(
        "rel_key and key", [rel_key.shape[:-2], key.shape[:-2]], "leading dimensions"
    )
    for name, bias in (("u", u), ("v", v)):
        bias = _validate.tensor_like(name, bias, "query", query, min_ndim=1)
        _validate.size(name, bias, -1, query.shape[-1], "D, query's width")
        _validate.broadcasts_to(name, bias, query.shape, "query's shape")
    s = softmax_scale(query, scale)
    content = (query + u) @ key.transpose(-2, -1)  # (a) + (c): (..., L, S)
    by_distance = (query + v) @ rel_key.flip(-2).transpose(-2, -1)  # columns: S-1 .. 0
    position = rel_shift(by_distance)  # (b) + (d), column j = distance i - j
    scores = (content + position) * s
    future = relative_positions(
        length, keys, query_offset=keys - length, device=query.device
    )
    return scores.masked_fill(future > 0, float("-inf"))


# ---- no position at all (Kazemnejad et al., 2023) ------------------------------------


def nope_position_readout(
    length: int, *, dtype: torch.dtype = torch.float64
) -> tuple[Tensor, Tensor]:
    r"""How a causal layer without positions can still read absolute position
    (Kazemnejad et al., 2023, the construction of their Theorem 1).

    With all scores equal (zero queries) and the causal mask, the query at position
    :math:`t` (from 0) averages the values of the :math:`t + 1` tokens up to it. If only
    the first token (a beginning-of-sequence token) has value 1, the output is
    :math:`1/(t + 1)`, and :math:`1/\text{output} - 1 = t` is the absolute position.
    Computed through :func:`companion.attention.scaled_dot_product_attention`.

    Args:
        length: ``L``, at least 0.
        dtype: floating-point dtype of the computation.

    Returns:
        ``(output, position)``: the attention output :math:`1/(t + 1)` and the
        position read from it.

    Shape:
        output, position: ``(L,)``.
    """
    n = _validate.nonnegative_int("length", length)
    dtype = _validate.dtype("dtype", dtype)
    zeros = torch.zeros(n, 1, dtype=dtype)  # equal scores: q = k = 0
    value = torch.zeros(n, 1, dtype=dtype)
    value[:1] = 1.0  # the first token is marked
    out = scaled_dot_product_attention(zeros, zeros, value, is_causal=True)[:, 0]
    return out, 1 / out - 1


# ---- self-attention layers for the tiny Transformer ------------------------------------


class T5BiasSelfAttention(CausalSelfAttention):
    r"""Causal self-attention with T5's learned bucketed bias (decoder buckets).

    The one override is the hook
    :meth:`~companion.attention.MultiHeadAttention.score_bias`: :class:`T5RelativeBias`
    (``bidirectional=False``: every past distance has its bucket, the future is masked)
    is added to the scores, which are scaled by :math:`1/\sqrt{D/H}` as everywhere in
    this book (T5 itself folds that scale into its initialization). One table per layer
    (T5 shares the first layer's).

    Args:
        dim: model width ``D``.
        num_heads: heads ``H``; must divide ``dim``.
        num_buckets: see :func:`t5_relative_position_bucket`.
        max_distance: see :func:`t5_relative_position_bucket`.

    Shape:
        - input: ``(B, L, D)``
        - output: ``(B, L, D)``
        - the bias: ``(H, L, S)``, from ``relative_bias``'s ``(num_buckets, H)`` table
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        num_buckets: int = 32,
        max_distance: int = 128,
    ) -> None:
        super().__init__(dim, num_heads)
        self.relative_bias = T5RelativeBias(
            self.num_heads,
            num_buckets=num_buckets,
            max_distance=max_distance,
            bidirectional=False,
        )

    accepts_mask = False  # the hook builds its own

    def score_bias(self, query: Tensor, key: Tensor, *, is_causal: bool) -> Tensor:
        """The learned bias of each head, ``-inf`` on future keys when ``is_causal``."""
        length, keys = query.shape[-2], key.shape[-2]
        bias = self.relative_bias(length, keys, query_offset=keys - length)
        bias = bias.to(device=query.device, dtype=query.dtype)  # (H, L, S)
        if is_causal:
            future = relative_positions(
                length, keys, query_offset=keys - length, device=query.device
            )
            bias = bias.masked_fill(future > 0, float("-inf"))
        return bias


class ShawSelfAttention(CausalSelfAttention):
    r"""Causal self-attention with Shaw et al.'s relative key (and value) vectors.

    The one override is the hook
    :meth:`~companion.attention.MultiHeadAttention.attention`, which becomes
    :func:`shaw_attention` with ``2K + 1`` learned vectors of the head width for the
    keys and, if ``values``, for the values, shared by the heads as
    in the paper; initialized from a normal distribution with standard deviation
    :math:`(D/H)^{-1/2}`.

    Args:
        dim: model width ``D``.
        num_heads: heads ``H``; must divide ``dim``.
        max_relative_position: the clipping distance :math:`K`.
        values: add the value vectors :math:`a^V` too.

    Shape:
        - input: ``(B, L, D)``
        - output: ``(B, L, D)``
        - ``rel_key``, ``rel_value``: ``(2K + 1, D/H)``
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        max_relative_position: int = 16,
        values: bool = True,
    ) -> None:
        super().__init__(dim, num_heads)
        k = _validate.nonnegative_int("max_relative_position", max_relative_position)
        values = _validate.flag("values", values)
        self.max_relative_position = k
        std = self.head_dim**-0.5
        self.rel_key = nn.Parameter(torch.randn(2 * k + 1, self.head_dim) * std)
        self.rel_value = (
            nn.Parameter(torch.randn(2 * k + 1, self.head_dim) * std)
            if values
            else None
        )

    accepts_mask = False  # the hook builds its own

    def attention(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool
    ) -> Tensor:
        """:func:`shaw_attention` with this layer's vectors; the queries are the last
        ``L`` of the ``S`` positions."""
        return shaw_attention(
            q,
            k,
            v,
            self.rel_key.to(q.dtype),
            None if self.rel_value is None else self.rel_value.to(q.dtype),
            is_causal=is_causal,
            query_offset=k.shape[-2] - q.shape[-2],
        )


class TransformerXLSelfAttention(CausalSelfAttention):
    r"""Causal self-attention with Transformer-XL's relative scores (no memory).

    The one override is the hook
    :meth:`~companion.attention.MultiHeadAttention.attention`, with the scores of
    :func:`transformer_xl_scores`: the sinusoidal
    :func:`transformer_xl_encoding` of each distance, projected per head by a learned
    :math:`W_{k,R}` (``r_proj``, no bias), and the learned per-head biases ``u``
    (content) and ``v`` (position), zero at the start. Causal only: the shifted scores
    above the diagonal are not defined.

    Args:
        dim: model width ``D``.
        num_heads: heads ``H``; must divide ``dim``; ``D`` must be even.
        base: base of the sinusoidal encoding.

    Shape:
        - input: ``(B, L, D)``
        - output: ``(B, L, D)``
        - ``u``, ``v``: ``(H, 1, D/H)``; ``r_proj``: ``(S, D) -> (S, D)`` on the encoding
    """

    def __init__(self, dim: int, num_heads: int, *, base: float = 10000.0) -> None:
        super().__init__(dim, num_heads)
        _validate.positive_int("dim", dim, even=True)
        self.base = _validate.real("base", base, exclusive_minimum=1.0)
        self.r_proj = nn.Linear(self.embed_dim, self.embed_dim, bias=False)
        self.u = nn.Parameter(torch.zeros(self.num_heads, 1, self.head_dim))
        self.v = nn.Parameter(torch.zeros(self.num_heads, 1, self.head_dim))

    accepts_mask = False  # the hook builds its own

    def attention(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool
    ) -> Tensor:
        """Softmax of :func:`transformer_xl_scores` (causal only), times ``v``."""
        if not is_causal:
            raise ValueError(
                "is_causal must be True: Transformer-XL's shifted scores exist only "
                "up to the diagonal, got False"
            )
        keys = k.shape[-2]
        weight = self.r_proj.weight
        encoding = transformer_xl_encoding(
            keys,
            self.embed_dim,
            base=self.base,
            dtype=weight.dtype,
            device=weight.device,
        )  # (S, D)
        r = self.r_proj(encoding).view(keys, self.num_heads, self.head_dim)
        r = r.transpose(0, 1).to(q.dtype)  # (H, S, D/H)
        scores = transformer_xl_scores(
            q, k, r, self.u.to(q.dtype), self.v.to(q.dtype)
        )  # (B, H, L, S), -inf above the diagonal
        return torch.softmax(scores, dim=-1) @ v


# ---- the trained comparison ----------------------------------------------------------

COMPARISON_SCHEMES = ("none", "alibi", "rope", "p_rope", "t5", "shaw", "transformer_xl")
"""The position schemes :func:`companion.position_comparison.compare_position_schemes` trains."""

_LAYER_OPTIONS = {  # the defaults of the comparison: sized for a training length of 16
    "p_rope": {"fraction": 0.5},
    "t5": {"num_buckets": 16, "max_distance": 16},
    "shaw": {"max_relative_position": 8},
    "transformer_xl": {},
}


class PositionFamilyTransformer(TinyTransformer):
    """A :class:`companion.model.TinyTransformer` whose attention layers are one of
    the position family's: ``"t5"`` (:class:`T5BiasSelfAttention`), ``"shaw"``
    (:class:`ShawSelfAttention`), ``"transformer_xl"``
    (:class:`TransformerXLSelfAttention`) or ``"p_rope"``
    (:class:`companion.rope_variants.PRoPESelfAttention`, with ``config.rope_base``).

    Args:
        config: the sizes; ``config.position`` must be ``"none"`` (the layer is the
            position scheme).
        attention: one of the four names above.
        **options: keyword arguments of that layer (e.g. ``max_relative_position``).

    Shape:
        as :class:`companion.model.TinyTransformer`.
    """

    def __init__(self, config: ModelConfig, attention: str, **options: object) -> None:
        _validate.instance("config", config, ModelConfig, "a ModelConfig")
        self.attention = _validate.choice("attention", attention, tuple(_LAYER_OPTIONS))
        if config.position != "none":
            raise ValueError(
                "config.position must be 'none' (the attention layer is the position "
                f"scheme), got {config.position!r}"
            )
        self.options = dict(options)
        super().__init__(config)

    def _attention(self) -> CausalSelfAttention:
        c, o = self.config, self.options
        if self.attention == "t5":
            return T5BiasSelfAttention(c.dim, c.num_heads, **o)  # type: ignore[arg-type]
        if self.attention == "shaw":
            return ShawSelfAttention(c.dim, c.num_heads, **o)  # type: ignore[arg-type]
        if self.attention == "transformer_xl":
            return TransformerXLSelfAttention(c.dim, c.num_heads, **o)  # type: ignore[arg-type]
        p_rope = rope_variants.PRoPESelfAttention  # not a name here: a moved one
        return p_rope(c.dim, c.num_heads, base=c.rope_base, **o)  # type: ignore[arg-type]


def position_family_model(
    scheme: str, config: ModelConfig, **options: object
) -> TinyTransformer:
    """A :class:`companion.model.TinyTransformer` with the position scheme ``scheme``.

    ``"none"``, ``"alibi"``, ``"rope"`` (and ``"sinusoidal"``, ``"learned"``) are
    :class:`companion.model.TinyTransformer` 's own (``config.position`` is replaced by
    ``scheme``); ``"t5"``, ``"shaw"``, ``"transformer_xl"`` and ``"p_rope"`` are a
    :class:`PositionFamilyTransformer` with the comparison's default options
    (``options`` override them). Seed before calling it for reproducible weights.

    Args:
        scheme: one of ``COMPARISON_SCHEMES`` (or ``"sinusoidal"``, ``"learned"``).
        config: the sizes.
        **options: options of the family's attention layer.
    """
    _validate.instance("config", config, ModelConfig, "a ModelConfig")
    scheme = _validate.choice(
        "scheme", scheme, (*COMPARISON_SCHEMES, "sinusoidal", "learned")
    )
    if scheme in _LAYER_OPTIONS:
        config = dataclasses.replace(config, position="none")
        return PositionFamilyTransformer(
            config, scheme, **{**_LAYER_OPTIONS[scheme], **options}
        )
    if options:
        raise ValueError(
            f"options are for this module's attention layers only, got {options} "
            f"with scheme={scheme!r}"
        )
    return TinyTransformer(dataclasses.replace(config, position=scheme))


_TO_ROPE_VARIANTS = """PRoPESelfAttention axial_rope_cos_sin axial_rope_frequencies
critical_dimension grid_positions longrope_attention_factor longrope_frequencies
multimodal_position_ids multimodal_rope_cos_sin p_rope_frequencies rope_base_lower_bound
rope_decay_sum rope_pair_scores""".split()  # moved to companion.rope_variants
_TO_POSITION_COMPARISON = ("PositionComparison", "compare_position_schemes")
_MOVED = dict.fromkeys(_TO_ROPE_VARIANTS, "rope_variants")
_MOVED |= dict.fromkeys(_TO_POSITION_COMPARISON, "position_comparison")
__getattr__ = _deprecation.moved_names(__name__, _MOVED)  # deprecated, for one release
