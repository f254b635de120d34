r"""Masks as functions, FlexAttention's score modifiers, and the learned sink column.

A **mask predicate** ``mask_mod(b, h, q_idx, kv_idx)`` takes index tensors and returns a
bool tensor, ``True`` where query ``q_idx`` of batch row ``b``, head ``h`` **may** attend
key ``kv_idx`` (torch's convention): FlexAttention's ``mask_mod`` and the
``mask_function`` of Hugging Face's ``transformers.masking_utils``. One predicate serves
eager attention and :func:`torch.nn.functional.scaled_dot_product_attention` through
:func:`materialize_mask` (a ``(B, 1 or H, L, S)`` bool tensor), and FlexAttention as is
(``create_block_mask(mask_mod, B, H, L, S)``). The patterns: :func:`causal`,
:func:`sliding_window_causal`, :func:`chunked_causal`, :func:`same_document`,
:func:`prefix_lm`, :func:`padding`, combined by :func:`and_masks` and :func:`or_masks`;
:func:`offset_queries` puts the queries after a KV cache. Each equals transformers 5.23's
counterpart on the same inputs (tested). FlexAttention's ``score_mod`` for soft-capping
and ALiBi: :func:`softcap_score_mod`, :func:`alibi_score_mod`.

GPT-OSS's **learned sink**, one logit per head, is a column appended to every row of
scores before the softmax and dropped after it: it takes mass and gives no value
(:func:`attention_with_sinks`). It is not a ``score_mod`` (a column, not a change of
one); after an attention that returns its log-sum-exp it is a rescaling
(:func:`apply_sinks`), and its gradient has a closed form (:func:`sink_gradient`).

FlexAttention on CPU in torch 2.13 (measured in ``tests/test_masks.py``): the forward
runs eagerly (unfused, with a warning that recommends ``torch.compile``); the backward
does not: an input with ``requires_grad=True`` raises ``NotImplementedError``
("FlexAttention does not support backward on CPU").
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from companion import _validate
from companion.attention import softmax_scale
from companion.extension import alibi_slopes

__all__ = [
    "alibi_score_mod",
    "and_masks",
    "apply_sinks",
    "attention_with_sinks",
    "causal",
    "chunked_causal",
    "materialize_mask",
    "offset_queries",
    "or_masks",
    "padding",
    "prefix_lm",
    "same_document",
    "sink_gradient",
    "sliding_window_causal",
    "softcap_score_mod",
]

MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]
ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]


def _reads(mod: object) -> tuple[Tensor, ...]:
    """The tensors a predicate of this module indexes (``(B,)`` or ``(B, S)``), for
    :func:`materialize_mask` to check before it evaluates it; ``()`` for any other."""
    return getattr(mod, "_companion_reads", ())


def _tag(mod: MaskMod, name: str, *reads: Tensor) -> MaskMod:
    mod.__name__ = mod.__qualname__ = name
    mod._companion_reads = reads  # type: ignore[attr-defined]
    return mod


def _index_tensor(name: str, value: object, ndim: int, meaning: str) -> Tensor:
    """An integer tensor of ``ndim`` dimensions with no negative entry."""
    value = _validate.tensor(name, value, dtype="integer", ndim=ndim, meaning=meaning)
    if value.numel() and int(value.min()) < 0:
        raise ValueError(f"{name} must be >= 0, got a minimum of {int(value.min())}")
    return value


# ---- the predicates -----------------------------------------------------------------------


def causal(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
    r"""The causal predicate :math:`j \le i`: a query sees itself and the keys before it.

    Positions are absolute: after a KV cache of :math:`c` tokens, query row ``l`` sits
    at :math:`i = c + l` (:func:`offset_queries`). As ``causal_mask_function``.

    Args:
        b, h: batch and head indices (unused).
        q_idx: query positions :math:`i`.
        kv_idx: key positions :math:`j`.

    Shape:
        the four indices broadcast; output: their broadcast shape, bool.
    """
    return kv_idx <= q_idx


def sliding_window_causal(window: int) -> MaskMod:
    r"""Causal attention to the last ``window`` positions: :math:`i - W < j \le i`.

    Hugging Face's convention (``sliding_window_causal_mask_function``, used by
    Mistral, Gemma 2/3 and GPT-OSS): ``sliding_window=W`` allows the offsets
    :math:`i - j \in \{0, \dots, W - 1\}`, the query's own key and the :math:`W - 1`
    before it. GPT-OSS's published ``sliding_window=128`` gives 128 keys, offsets 0 to
    127; ``window=1`` is the diagonal alone.

    Args:
        window: :math:`W`, a positive int.

    Returns:
        The predicate ``mask_mod(b, h, q_idx, kv_idx)``.
    """
    window = _validate.positive_int("window", window)

    def mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return (kv_idx <= q_idx) & (kv_idx > q_idx - window)  # i - W < j <= i

    return _tag(mod, f"sliding_window_causal({window})")


def chunked_causal(chunk_size: int, *, left_padding: Tensor | None = None) -> MaskMod:
    r"""Causal attention inside fixed chunks (Llama 4's ``attention_chunk_size``):
    :math:`j \le i` and :math:`\lfloor (j - p_b)/C \rfloor = \lfloor (i - p_b)/C \rfloor`.

    Row :math:`b`'s chunks start at its first real token, after :math:`p_b` left
    padding tokens (Hugging Face counts them as ``(attention_mask.cumsum(-1) ==
    0).sum(-1)``); the first query of a chunk sees itself alone. As
    ``chunked_causal_mask_function(chunk_size, left_padding)``.

    Args:
        chunk_size: :math:`C`, a positive int.
        left_padding: :math:`p_b` per batch row, integers >= 0; ``None`` for none.

    Returns:
        The predicate ``mask_mod(b, h, q_idx, kv_idx)``.

    Shape:
        left_padding: ``(B,)``.
    """
    chunk_size = _validate.positive_int("chunk_size", chunk_size)
    pad = _validate.optional(
        _index_tensor, "left_padding", left_padding, ndim=1, meaning="(B,)"
    )

    def mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        p = 0 if pad is None else pad[b]  # the row's first real token starts chunk 0
        same = (kv_idx - p) // chunk_size == (q_idx - p) // chunk_size
        return (kv_idx <= q_idx) & same

    return _tag(mod, f"chunked_causal({chunk_size})", *([] if pad is None else [pad]))


def same_document(document_ids: Tensor) -> MaskMod:
    r"""Packed sequences: a query attends only keys of its own document,
    :math:`d_{b,i} = d_{b,j}`.

    Not causal by itself: ``and_masks(causal, same_document(ids))`` is the causal
    packed mask (Hugging Face's ``packed_sequence_mask_function`` and its causal mask;
    FlexAttention's "document masking").

    Args:
        document_ids: every position's document, integers >= 0, by absolute position
            (with a KV cache: the cached positions first).

    Returns:
        The predicate ``mask_mod(b, h, q_idx, kv_idx)``.

    Shape:
        document_ids: ``(B, S)``.
    """
    ids = _index_tensor("document_ids", document_ids, 2, "(B, S)")

    def mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return ids[b, q_idx] == ids[b, kv_idx]

    return _tag(mod, "same_document", ids)


def prefix_lm(prefix_lengths: Tensor | int) -> MaskMod:
    r"""Prefix-LM: bidirectional inside a prefix of :math:`P_b` positions, causal after
    it: :math:`j \le i` or :math:`j < P_b`.

    Every query sees the whole prefix, and no later token outside it (T5's prefix-LM
    objective, PaliGemma's image-and-prompt prefix). ``prefix_lengths=0`` is
    :func:`causal`.

    Args:
        prefix_lengths: :math:`P_b` per batch row (integers >= 0), or one int for all.

    Returns:
        The predicate ``mask_mod(b, h, q_idx, kv_idx)``.

    Shape:
        prefix_lengths: ``(B,)`` or a Python int.
    """
    if isinstance(prefix_lengths, Tensor):
        lengths = _index_tensor("prefix_lengths", prefix_lengths, 1, "(B,)")
    else:
        n = _validate.nonnegative_int("prefix_lengths", prefix_lengths)
        lengths = None

    def mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return (kv_idx <= q_idx) | (kv_idx < (n if lengths is None else lengths[b]))

    return _tag(mod, "prefix_lm", *([] if lengths is None else [lengths]))


def padding(attention_mask: Tensor) -> MaskMod:
    r"""Padding: a query attends only real keys, :math:`a_{b,j} = 1`.

    ``attention_mask`` is Hugging Face's 2-D mask (1 or ``True`` for a token, 0 for
    padding, left or right), by absolute key position (with a KV cache: the cached
    positions first). As ``padding_mask_function``. Under a causal mask a left-padding
    query sees no key: a fully masked row (see :func:`materialize_mask`).

    Args:
        attention_mask: 0/1, bool or integer.

    Returns:
        The predicate ``mask_mod(b, h, q_idx, kv_idx)``.

    Shape:
        attention_mask: ``(B, S)``.
    """
    keep = _validate.padding_mask("attention_mask", attention_mask)

    def mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return keep[b, kv_idx]

    return _tag(mod, "padding", keep)


def _combine(name: str, mods: tuple, op: Callable, start: bool) -> MaskMod:
    if not mods:
        raise TypeError(
            f"mask_mods must hold at least one predicate ({name}), got none"
        )
    for i, m in enumerate(mods):
        _validate.callable_(f"mask_mods[{i}]", m)
    reads = [t for m in mods for t in _reads(m)]
    if len({t.shape[0] for t in reads}) > 1 or len({t.device for t in reads}) > 1:
        raise ValueError(
            "mask_mods must read tensors of one batch size and device, got "
            + ", ".join(_validate.describe(t) for t in reads)
        )

    def mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        result = torch.full((), start, dtype=torch.bool, device=q_idx.device)
        for m in mods:
            result = op(result, m(b, h, q_idx, kv_idx))
        return result

    parts = ", ".join(getattr(m, "__name__", "mask_mod") for m in mods)
    return _tag(mod, f"{name}({parts})", *reads)


def and_masks(*mask_mods: MaskMod) -> MaskMod:
    r"""The intersection: may attend where every predicate allows it.

    As ``and_masks`` of FlexAttention and of ``transformers.masking_utils``.

    Args:
        mask_mods: one or more predicates.

    Returns:
        The predicate ``mask_mod(b, h, q_idx, kv_idx)``.
    """
    return _combine("and_masks", mask_mods, torch.logical_and, True)


def or_masks(*mask_mods: MaskMod) -> MaskMod:
    r"""The union: may attend where any predicate allows it.

    As ``or_masks`` of FlexAttention and of ``transformers.masking_utils``.

    Args:
        mask_mods: one or more predicates.

    Returns:
        The predicate ``mask_mod(b, h, q_idx, kv_idx)``.
    """
    return _combine("or_masks", mask_mods, torch.logical_or, False)


def offset_queries(mask_mod: MaskMod, offset: int) -> MaskMod:
    r"""The predicate for queries after a KV cache of :math:`c` tokens: query row ``l``
    at position :math:`c + l`, keys at :math:`0, \dots, S - 1`.

    FlexAttention numbers query rows from 0; this is how its ``mask_mod`` learns the
    cache length. As ``add_offsets_to_mask_function(mask_mod, offset, 0)``.

    Args:
        mask_mod: a predicate.
        offset: :math:`c`, an int >= 0.

    Returns:
        The predicate ``mask_mod(b, h, q_idx, kv_idx)``.
    """
    mask_mod = _validate.callable_("mask_mod", mask_mod)
    offset = _validate.nonnegative_int("offset", offset)

    def mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return mask_mod(b, h, q_idx + offset, kv_idx)

    name = f"offset_queries({getattr(mask_mod, '__name__', 'mask_mod')}, {offset})"
    return _tag(mod, name, *_reads(mask_mod))


# ---- the eager path and SDPA: a materialised mask ----------------------------------------


def materialize_mask(
    mask_mod: MaskMod,
    batch_size: int,
    query_length: int,
    key_length: int,
    *,
    num_heads: int | None = None,
    cache_length: int = 0,
    device: torch.device | str | None = None,
) -> Tensor:
    r"""A predicate evaluated on every (batch, head, query, key): the bool mask for eager
    attention and :func:`torch.nn.functional.scaled_dot_product_attention`.

    Entry ``[b, h, l, j]`` is ``mask_mod(b, h, c + l, j)``: queries after a KV cache of
    :math:`c` = ``cache_length`` tokens, keys at :math:`0, \dots, S - 1`. The predicate
    is called once on broadcast index grids, as Hugging Face's ``sdpa_mask`` does
    without ``vmap``: equal to ``sdpa_mask(B, L, S, q_offset=c, mask_function=...,
    allow_is_causal_skip=False)``, whose additive form is ``eager_mask`` (0 or
    ``finfo.min``).

    A row that no key satisfies (a left-padding query under a causal mask) stays all
    ``False``: :func:`torch.nn.functional.scaled_dot_product_attention` returns zeros
    for it in torch 2.13 (measured), a softmax over ``-inf`` alone gives NaN.

    Args:
        mask_mod: the predicate (its tensors must cover batch ``B`` and every position
            :math:`< \max(c + L, S)` that it indexes).
        batch_size: ``B``, a positive int.
        query_length: ``L``, an int >= 0.
        key_length: ``S``, an int >= 0.
        num_heads: ``H`` for a predicate that reads the head; ``None`` gives one head
            that broadcasts.
        cache_length: :math:`c`, an int >= 0.
        device: where to build the mask; ``None``: the device of the tensors the
            predicate reads, else the CPU.

    Returns:
        ``True`` where the query may attend.

    Shape:
        output: ``(B, H, L, S)``, or ``(B, 1, L, S)`` when ``num_heads`` is ``None``.
    """
    mask_mod = _validate.callable_("mask_mod", mask_mod)
    batch_size = _validate.positive_int("batch_size", batch_size)
    query_length = _validate.nonnegative_int("query_length", query_length)
    key_length = _validate.nonnegative_int("key_length", key_length)
    heads = _validate.optional(_validate.positive_int, "num_heads", num_heads) or 1
    cache_length = _validate.nonnegative_int("cache_length", cache_length)
    device = _validate.device("device", device)
    span = max(cache_length + query_length, key_length)
    for t in _reads(mask_mod):
        if t.shape[0] != batch_size:
            raise ValueError(
                f"batch_size must be the batch of the tensors mask_mod reads "
                f"({t.shape[0]}), got {batch_size}"
            )
        if t.ndim == 2 and span > t.shape[1]:
            raise ValueError(
                f"cache_length + query_length and key_length must be <= the "
                f"{t.shape[1]} positions mask_mod's tensors cover, got cache_length="
                f"{cache_length}, query_length={query_length}, key_length={key_length}"
            )
        if device is not None and (device.type, device.index or 0) != (
            t.device.type,
            t.device.index or 0,
        ):
            raise ValueError(
                f"device must be the device of the tensors mask_mod reads ({t.device}), "
                f"got {str(device)!r}"
            )
        device = t.device
    device = device or torch.device("cpu")
    b = torch.arange(batch_size, device=device)[:, None, None, None]  # (B, 1, 1, 1)
    h = torch.arange(heads, device=device)[None, :, None, None]  # (1, H, 1, 1)
    q = torch.arange(query_length, device=device) + cache_length
    q = q[None, None, :, None]  # (1, 1, L, 1), absolute positions c + l
    kv = torch.arange(key_length, device=device)[None, None, None, :]  # (1, 1, 1, S)
    allowed = torch.as_tensor(mask_mod(b, h, q, kv))
    if allowed.dtype != torch.bool:
        raise TypeError(
            f"mask_mod must return a bool tensor, got a tensor of dtype {allowed.dtype}"
        )
    shape = (batch_size, heads, query_length, key_length)
    return allowed.expand(shape).contiguous()  # (B, H or 1, L, S)


# ---- FlexAttention's score modifiers ------------------------------------------------------


def softcap_score_mod(cap: float) -> ScoreMod:
    r"""Gemma 2's soft-capping as a FlexAttention ``score_mod``:
    :math:`s \mapsto \mathrm{cap} \cdot \tanh(s/\mathrm{cap})`.

    FlexAttention hands ``score_mod`` the scaled score :math:`q k^\top / \sqrt{D}`, so
    this caps the same number as :func:`companion.modern.softcapped_attention` (and
    Hugging Face's Gemma 2 with ``query_pre_attn_scalar = D``).

    Args:
        cap: a finite real > 0 (Gemma 2: 50 on the attention scores).

    Returns:
        ``score_mod(score, b, h, q_idx, kv_idx)``.
    """
    cap = _validate.positive_real("cap", cap)

    def mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor):
        return cap * torch.tanh(score / cap)

    return mod


def alibi_score_mod(num_heads: int, *, query_offset: int = 0) -> ScoreMod:
    r"""ALiBi as a FlexAttention ``score_mod``: :math:`s \mapsto s - a_h (i - j)`.

    :math:`a_h` are :func:`companion.extension.alibi_slopes` (Press et al.'s and BLOOM's
    rule); query row ``l`` sits at :math:`i = c + l` with :math:`c` = ``query_offset``
    (``S - L`` puts the queries at the last ``L`` keys, as
    :func:`companion.extension.alibi_bias`). Combine it with a causal ``mask_mod``: the
    bias alone does not mask.

    Args:
        num_heads: ``H``, a positive int.
        query_offset: :math:`c`, an int >= 0.

    Returns:
        ``score_mod(score, b, h, q_idx, kv_idx)``.
    """
    slopes = alibi_slopes(num_heads)  # (H,) float32; validates num_heads
    offset = _validate.nonnegative_int("query_offset", query_offset)

    def mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor):
        a = slopes.to(score.device)[h]
        return score - a * (q_idx + offset - kv_idx)  # - a_h (i - j)

    return mod


# ---- the learned sink column (GPT-OSS) ----------------------------------------------------


def _sink_inputs(
    query: object, key: object, value: object, sinks: object
) -> tuple[int, int]:
    """query (B, H, L, D), key/value (B, Hk, S, ·) like it with Hk dividing H, sinks
    (H,) like it; returns (H, Hk)."""
    query = _validate.tensor("query", query, ndim=4, meaning="(B, H, L, D)")
    key = _validate.tensor_like(
        "key", key, "query", query, ndim=4, meaning="(B, Hk, S, D)"
    )
    value = _validate.tensor_like(
        "value", value, "query", query, ndim=4, meaning="(B, Hk, S, Dv)"
    )
    _validate.same_size("query", query, 0, "key", key, 0, "batch (B)")
    _validate.same_size("query", query, -1, "key", key, -1, "feature-width (D)")
    _validate.same_size("key", key, 1, "value", value, 1, "heads (Hk)")
    _validate.same_size("key", key, 0, "value", value, 0, "batch (B)")
    _validate.same_size("key", key, 2, "value", value, 2, "length (S)")
    heads, kv_heads = query.shape[1], key.shape[1]
    if kv_heads == 0 or heads % kv_heads:
        raise ValueError(
            f"key must have a number of heads that divides query's ({heads}), "
            f"got shape {tuple(key.shape)}"
        )
    sinks = _validate.tensor_like(
        "sinks", sinks, "query", query, ndim=1, meaning="(H,)"
    )
    _validate.shape("sinks", sinks, (heads,), "(H,)")
    return heads, kv_heads


def attention_with_sinks(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    sinks: Tensor,
    mask: Tensor | None = None,
    scale: float | None = None,
) -> Tensor:
    r"""Attention with a learned sink logit per head (GPT-OSS):
    :math:`O_i = \sum_j p_{ij} v_j` with
    :math:`p_{ij} = e^{s_{ij}} / (e^{\sigma_h} + \sum_k e^{s_{ik}})`.

    :math:`s = QK^\top \cdot \mathrm{scale} + M` are the masked scores and
    :math:`\sigma_h` the head's sink: a column appended to every row before the softmax
    and dropped after it, so the row's weights sum to :math:`1 - p_{\mathrm{sink},i}`
    and a query can attend to "nothing". A fully masked row puts all its mass on the
    sink: :math:`p_{\mathrm{sink}} = 1`, output zero, and a finite gradient (without a
    sink the softmax of ``-inf`` alone is NaN). Hugging Face's GPT-OSS
    ``eager_attention_forward`` gives the same zero row (its mask adds ``finfo.min``);
    tested.

    Grouped keys and values (``Hk`` dividing ``H``) are repeated to the query heads, as
    ``repeat_kv``. Half-precision inputs are computed in float32 and cast back.
    Gradients flow to all four tensors (autograd); :func:`sink_gradient` gives the
    sink's in closed form.

    Args:
        query: queries.
        key: keys, ``Hk`` heads.
        value: values, ``Hk`` heads.
        sinks: :math:`\sigma_h`, one logit per query head, query's dtype and device.
        mask: bool (``True`` = may attend) or float (added) mask, broadcasting to
            ``(B, H, L, S)``, e.g. :func:`materialize_mask`'s; ``None`` for none.
        scale: the factor on :math:`QK^\top`; ``None`` for :math:`1/\sqrt{D}`.

    Shape:
        query: ``(B, H, L, D)``; key: ``(B, Hk, S, D)``; value: ``(B, Hk, S, Dv)``;
        sinks: ``(H,)``; output: ``(B, H, L, Dv)``.
    """
    heads, kv_heads = _sink_inputs(query, key, value, sinks)
    shape = (query.shape[0], heads, query.shape[2], key.shape[2])
    if mask is not None:
        mask = _validate.mask("mask", mask, shape, "query", query)
    scale = softmax_scale(query, scale)
    work = (
        torch.float32 if query.dtype in (torch.float16, torch.bfloat16) else query.dtype
    )
    q, k, v, sigma = (t.to(work) for t in (query, key, value, sinks))
    if kv_heads != heads:  # grouped-query attention: repeat each key/value head
        k = k.repeat_interleave(heads // kv_heads, dim=1)  # (B, H, S, D)
        v = v.repeat_interleave(heads // kv_heads, dim=1)  # (B, H, S, Dv)
    scores = q @ k.transpose(-2, -1) * scale  # (B, H, L, S)
    if mask is not None and mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask, float("-inf"))
    elif mask is not None:
        scores = scores + mask.to(work)
    column = sigma[None, :, None, None].expand(*shape[:3], 1)  # (B, H, L, 1)
    logits = torch.cat([scores, column], dim=-1)  # (B, H, L, S + 1), sink last
    probs = torch.softmax(logits, dim=-1)[..., :-1]  # the sink column dropped
    return (probs @ v).to(query.dtype)  # (B, H, L, Dv)


def _lse_inputs(output: object, lse: object, sinks: object) -> None:
    output = _validate.tensor("output", output, ndim=4, meaning="(B, H, L, Dv)")
    lse = _validate.tensor_like(
        "lse", lse, "output", output, ndim=3, meaning="(B, H, L)"
    )
    _validate.shape("lse", lse, output.shape[:3], "(B, H, L)")
    sinks = _validate.tensor_like(
        "sinks", sinks, "output", output, ndim=1, meaning="(H,)"
    )
    _validate.shape("sinks", sinks, (output.shape[1],), "(H,)")


def apply_sinks(output: Tensor, lse: Tensor, sinks: Tensor) -> Tensor:
    r"""Add the sink column after the fact: :math:`O^{\mathrm{sink}}_i = O_i \cdot
    \operatorname{sigmoid}(\ell_i - \sigma_h)`.

    :math:`O_i` and :math:`\ell_i = \log \sum_j e^{s_{ij}}` are what an attention
    without the sink returns (FlexAttention with ``return_aux=AuxRequest(lse=True)``,
    FlashAttention's saved statistics); the sink only enlarges the denominator, from
    :math:`e^{\ell_i}` to :math:`e^{\ell_i} + e^{\sigma_h}`. A fully masked row
    (:math:`\ell_i = -\infty`) gives zero. Equal to :func:`attention_with_sinks`
    (tested with FlexAttention on CPU).

    Args:
        output: the attention output without sinks.
        lse: its natural-log log-sum-exp per row.
        sinks: :math:`\sigma_h`.

    Shape:
        output: ``(B, H, L, Dv)``; lse: ``(B, H, L)``; sinks: ``(H,)``; output: as
        ``output``.
    """
    _lse_inputs(output, lse, sinks)
    keep = torch.sigmoid(lse - sinks[None, :, None])  # (B, H, L): 1 - p_sink
    return output * keep[..., None]


def sink_gradient(
    output: Tensor, grad_output: Tensor, lse: Tensor, sinks: Tensor
) -> Tensor:
    r"""The sink's gradient in closed form:
    :math:`\partial \mathcal{L}/\partial \sigma_h = -\sum_{b,i} p_{\mathrm{sink},bhi} D_{bhi}`
    with :math:`D_i = \sum_d dO_{id} O_{id}`.

    The sink column gives no value, so its logit's gradient is
    :math:`p_{\mathrm{sink}}(0 - \sum_j p_{ij}\, dO_i \cdot v_j) = -p_{\mathrm{sink}}
    D_i`; :math:`D_i` is the row statistic FlashAttention's backward already computes,
    and :math:`p_{\mathrm{sink},i} = \operatorname{sigmoid}(\sigma_h - \ell_i)`.

    Args:
        output: :math:`O`, the output *with* the sink (:func:`attention_with_sinks`).
        grad_output: :math:`dO`, like ``output``.
        lse: :math:`\ell_i`, the log-sum-exp of the row's scores without the sink.
        sinks: :math:`\sigma_h`.

    Shape:
        output, grad_output: ``(B, H, L, Dv)``; lse: ``(B, H, L)``; sinks: ``(H,)``;
        result: ``(H,)``.
    """
    _lse_inputs(output, lse, sinks)
    grad_output = _validate.tensor_like(
        "grad_output", grad_output, "output", output, ndim=4
    )
    _validate.shape("grad_output", grad_output, output.shape, "(B, H, L, Dv)")
    d = (grad_output * output).sum(-1)  # (B, H, L): D_i = rowsum(dO * O)
    p_sink = torch.sigmoid(sinks[None, :, None] - lse)  # (B, H, L)
    return -(p_sink * d).sum(dim=(0, 2))  # (H,)
