r"""The attention layer of 2024-2025: soft-capping, QK-norm bounds, sliding windows,
attention sinks and padding.

The chapter "The attention layer of 2024-2025" derives each function; this module holds
the math. It never imports :mod:`companion.decoder` or :mod:`companion.mla` at module
level (``decoder`` imports :func:`softcap` from here for Gemma 2).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from companion import _validate
from companion.attention import causal_mask
from companion.model import (
    CausalSelfAttention,
    ModelConfig,
    RotarySelfAttention,
    TinyTransformer,
    attention_inputs,
)
from companion.norm import RMSNorm

__all__ = [
    "ModernTinyTransformer",
    "QKNormSelfAttention",
    "SinkCache",
    "SoftcapSelfAttention",
    "attention_maps",
    "kv_cache_bytes",
    "padding_position_ids",
    "qk_norm_logit_bound",
    "receptive_field",
    "sink_cache_keep",
    "softcap",
    "softcapped_attention",
]


def softcap(x: torch.Tensor, cap: float) -> torch.Tensor:
    r"""Soft-capping, :math:`\mathrm{cap}\cdot\tanh(x/\mathrm{cap})`, elementwise.

    Gemma 2 applies it to the attention logits (``attn_logit_softcapping``, 50.0) before
    the mask and softmax, and to the final logits (``final_logit_softcapping``, 30.0).
    It is odd, increasing, close to the identity for :math:`|x| \ll \mathrm{cap}`
    (:math:`x - x^3/(3\,\mathrm{cap}^2) + \dots`) and bounded:
    :math:`|\mathrm{softcap}(x)| < \mathrm{cap}`. Matches Hugging Face's Gemma 2
    (``logits / cap``, ``tanh``, ``* cap``) to rounding.

    Args:
        x: logits, a floating tensor of any shape; ``-inf`` (a masked logit) maps to
            ``-cap``, so apply the mask after capping, as Gemma 2 does.
        cap: the cap, a finite real number > 0.

    Shape:
        ``x``: ``(...)``; output: ``(...)``, the dtype and device of ``x``.
    """
    _validate.tensor("x", x)
    cap = _validate.positive_real("cap", cap)
    return torch.tanh(x / cap) * cap


# ---- QK-norm and soft-capped attention in the tiny model ---------------------------


def softcapped_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    cap: float,
    is_causal: bool = False,
) -> torch.Tensor:
    r"""Attention with soft-capped scores, as Gemma 2:
    :math:`\operatorname{softmax}(\mathrm{softcap}(QK^\top/\sqrt{D}, \mathrm{cap}) + M)V`.

    The cap acts on the scaled scores, before the causal mask (a masked score stays
    masked). Matches Hugging Face's ``eager_attention_forward`` of Gemma 2 with
    ``scaling = D**-0.5`` (``query_pre_attn_scalar = D``).

    Args:
        query: queries.
        key: keys, same ``D``.
        value: values.
        cap: the cap, a finite real number > 0.
        is_causal: apply the top-left causal mask (``j <= i``).

    Shape:
        query: ``(..., L, D)``; key: ``(..., S, D)``; value: ``(..., S, Dv)``;
        output: ``(..., L, Dv)``.
    """
    _validate.attention_inputs(query, key, value)
    cap = _validate.positive_real("cap", cap)
    is_causal = _validate.flag("is_causal", is_causal)
    scores = softcap(query @ key.transpose(-2, -1) * query.shape[-1] ** -0.5, cap)
    if is_causal:
        allowed = causal_mask(query.shape[-2], key.shape[-2], device=query.device)
        scores = scores.masked_fill(~allowed, float("-inf"))  # (..., L, S)
    return torch.softmax(scores, dim=-1) @ value


class QKNormSelfAttention(RotarySelfAttention):
    r"""RoPE self-attention with QK-norm: queries and keys RMS-normalized per head.

    As Qwen3 (``q_norm``, ``k_norm``): an :class:`~companion.norm.RMSNorm` over the
    head width ``D/H`` with a learned gain (initialized to one, shared by the heads),
    applied to ``q`` and ``k`` after the head split and *before* RoPE, then
    :class:`~companion.model.RotarySelfAttention`'s rotation. The one override is the
    hook :meth:`~companion.attention.MultiHeadAttention.transform_qk`.
    (OLMo 2 normalizes all heads' queries together, over the whole width ``H * D``,
    and all keys over ``H_kv * D``, before the split: one head can then hold the whole
    norm, ``||q_h||^2 <= H D`` and ``||k_h||^2 <= H_kv D``, and
    :func:`qk_norm_logit_bound` does not hold per head; the bound there is
    ``sqrt(H * H_kv)`` times larger, ``H`` times with as many key as query heads.)

    Args:
        dim: model width.
        num_heads: heads ``H``; ``dim / num_heads`` must be even.
        base: the RoPE base.

    Shape:
        - input: ``(B, L, dim)``
        - output: ``(B, L, dim)``
    """

    def __init__(self, dim: int, num_heads: int, *, base: float = 10000.0) -> None:
        super().__init__(dim, num_heads, base=base)
        self.q_norm = RMSNorm(self.head_dim, eps=1e-6)
        self.k_norm = RMSNorm(self.head_dim, eps=1e-6)

    def transform_qk(
        self, query: torch.Tensor, key: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Normalize ``query`` and ``key`` per head, then rotate them (RoPE)."""
        return super().transform_qk(self.q_norm(query), self.k_norm(key))


class SoftcapSelfAttention(RotarySelfAttention):
    r"""RoPE self-attention whose scores are soft-capped, as Gemma 2's.

    :class:`~companion.model.RotarySelfAttention`'s rotation stays; the one override is
    the hook :meth:`~companion.attention.MultiHeadAttention.attention`, which becomes
    :func:`softcapped_attention`. No mask other than the causal one.

    Args:
        dim: model width.
        num_heads: heads ``H``; ``dim / num_heads`` must be even.
        cap: the cap on the scaled scores (Gemma 2: 50.0).
        base: the RoPE base.

    Shape:
        - input: ``(B, L, dim)``
        - output: ``(B, L, dim)``
    """

    accepts_mask = False

    def __init__(
        self, dim: int, num_heads: int, *, cap: float = 50.0, base: float = 10000.0
    ) -> None:
        super().__init__(dim, num_heads, base=base)
        self.cap = _validate.positive_real("cap", cap)

    def attention(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool
    ) -> Tensor:
        """:func:`softcapped_attention` with this layer's cap."""
        return softcapped_attention(q, k, v, cap=self.cap, is_causal=is_causal)


ATTENTION_KINDS = ("rope", "qk_norm", "softcap")


class ModernTinyTransformer(TinyTransformer):
    r""":class:`~companion.model.TinyTransformer` (RoPE) whose attention layers are
    plain RoPE, :class:`QKNormSelfAttention` or :class:`SoftcapSelfAttention`.

    Only ``_attention`` is overridden; it trains with
    :func:`companion.experiments.train_batched` like the base class.

    Args:
        config: the sizes; ``config.position`` must be ``"rope"``.
        attention: ``"rope"``, ``"qk_norm"`` or ``"softcap"``.
        cap: the cap of ``"softcap"`` (ignored otherwise).

    Shape:
        - input: token ids ``(B, L)``
        - output: logits ``(B, L, vocab_size)``
    """

    def __init__(
        self, config: ModelConfig, *, attention: str = "rope", cap: float = 50.0
    ) -> None:
        _validate.instance("config", config, ModelConfig, "a ModelConfig")
        if config.position != "rope":
            raise ValueError(f"config.position must be 'rope', got {config.position!r}")
        kind = _validate.choice("attention", attention, ATTENTION_KINDS)
        cap = _validate.positive_real("cap", cap)
        nn_setattr = object.__setattr__  # plain values, before nn.Module.__init__
        nn_setattr(self, "attention_kind", kind)
        nn_setattr(self, "cap", cap)
        super().__init__(config)

    def _attention(self) -> RotarySelfAttention:
        c = self.config
        if self.attention_kind == "qk_norm":
            return QKNormSelfAttention(c.dim, c.num_heads, base=c.rope_base)
        if self.attention_kind == "softcap":
            return SoftcapSelfAttention(
                c.dim, c.num_heads, cap=self.cap, base=c.rope_base
            )
        return RotarySelfAttention(c.dim, c.num_heads, base=c.rope_base)


# ---- sliding windows -------------------------------------------------------------------


def _windows(windows: object) -> list[int | None]:
    if isinstance(windows, (str, bytes)) or not isinstance(windows, Sequence):
        raise _validate.fail(
            TypeError, "windows", "a sequence of window sizes (int or None)", windows
        )
    if not windows:
        raise ValueError("windows must name at least one layer, got an empty sequence")
    return [
        None if w is None else _validate.positive_int(f"windows[{i}]", w)
        for i, w in enumerate(windows)
    ]


def receptive_field(windows: Sequence[int | None]) -> float:
    r"""How far back a stack of causal layers lets a position see, in tokens.

    A layer with a sliding window :math:`W` lets query :math:`i` attend to keys
    :math:`i - W + 1, \ldots, i` (Mistral's and Hugging Face's convention: the window
    counts the query itself), so one layer reaches :math:`W - 1` tokens back and
    :math:`N` such layers, each reading the previous layer's outputs,
    :math:`\sum_l (W_l - 1)`. A global layer (``None``) reaches the whole prefix:
    ``math.inf``.

    Args:
        windows: one entry per layer, bottom to top: the window ``W >= 1`` or ``None``
            for a global (full causal) layer.

    Returns:
        The largest distance ``i - j`` over which token ``j`` can change the output at
        ``i`` (an int as a float), or ``math.inf``.
    """
    ws = _windows(windows)
    if any(w is None for w in ws):
        return math.inf
    return float(sum(w - 1 for w in ws))


def kv_cache_bytes(
    length: int,
    *,
    windows: Sequence[int | None],
    num_kv_heads: int,
    head_dim: int,
    bytes_per_element: int = 2,
) -> int:
    r"""Bytes of the key/value cache after ``length`` tokens of one sequence.

    Each layer stores a key and a value of ``num_kv_heads * head_dim`` numbers per
    cached token: all ``length`` tokens for a global layer; for a sliding layer of
    window :math:`W` (query :math:`i` sees keys :math:`i - W + 1, \ldots, i`) a rolling
    buffer of the last :math:`W - 1` tokens, since the next query brings its own key,
    as Hugging Face's ``DynamicSlidingWindowLayer`` keeps (transformers 5.23):

    .. math::
        \text{bytes} = \sum_l 2 \, H_{kv} D \, \min(\text{length}, W_l - 1) \, b .

    Args:
        length: tokens seen so far, >= 0.
        windows: one entry per layer: the window, or ``None`` for a global layer.
        num_kv_heads: key/value heads per layer.
        head_dim: head width ``D``.
        bytes_per_element: 2 for bfloat16/float16, 4 for float32.

    Returns:
        The bytes, an int.
    """
    length = _validate.nonnegative_int("length", length)
    ws = _windows(windows)
    heads = _validate.positive_int("num_kv_heads", num_kv_heads)
    width = _validate.positive_int("head_dim", head_dim)
    b = _validate.positive_int("bytes_per_element", bytes_per_element)
    cached = sum(length if w is None else min(length, w - 1) for w in ws)
    return 2 * heads * width * cached * b


# ---- QK-norm ---------------------------------------------------------------------------


def qk_norm_logit_bound(q_gain: torch.Tensor, k_gain: torch.Tensor) -> float:
    r"""The largest scaled attention logit that QK-norm allows.

    With :math:`\hat q = \mathrm{RMSNorm}(q)` (so :math:`\|\hat q\|^2 \le D`, equal
    without :math:`\epsilon`), gains :math:`g_q, g_k` and the same for :math:`k`,

    .. math::
        \frac{|(g_q \odot \hat q) \cdot (g_k \odot \hat k)|}{\sqrt{D}}
        \le \frac{\max_i |g_{q,i} g_{k,i}| \, \|\hat q\| \|\hat k\|}{\sqrt D}
        \le \sqrt{D} \, \max_i |g_{q,i} g_{k,i}| ,

    attained (as :math:`\epsilon \to 0`) by :math:`q = k = e_{i^*}`. RoPE rotates
    pairs :math:`(i, i + D/2)`; it keeps :math:`\|\hat q\|`, so the bound holds after it
    when the two gains of each pair are equal, and with
    :math:`\max|g_q| \max|g_k|` in general; this function returns the larger,
    :math:`\sqrt{D}\,\max_i|g_{q,i}|\,\max_i|g_{k,i}|`, valid with or without RoPE.

    Args:
        q_gain: the query norm's gain.
        k_gain: the key norm's gain, same width.

    Shape:
        ``q_gain``, ``k_gain``: ``(D,)``.
    """
    _validate.tensor("q_gain", q_gain, ndim=1, nonempty=True, meaning="(D,)")
    _validate.tensor("k_gain", k_gain, ndim=1, nonempty=True, meaning="(D,)")
    _validate.same_size("q_gain", q_gain, 0, "k_gain", k_gain, 0, "width (D)")
    D = q_gain.shape[0]
    qg = q_gain.detach().double().abs().max().item()
    kg = k_gain.detach().double().abs().max().item()
    return math.sqrt(D) * qg * kg


# ---- padding ---------------------------------------------------------------------------


def padding_position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    r"""Positions of a padded batch, as Hugging Face's ``generate`` derives them.

    ``cumsum(attention_mask) - 1`` along the sequence: each row's first real token gets
    position 0 however much padding precedes it (left padding), and padding positions
    get 0 (a placeholder: their keys are masked out), as
    ``GenerationMixin._prepare_position_ids_for_generation`` in transformers 5.23.

    Args:
        attention_mask: 1 (or ``True``) for a token, 0 for padding.

    Shape:
        ``attention_mask``: ``(B, L)``; output: ``(B, L)``, int64.
    """
    _validate.tensor(
        "attention_mask",
        attention_mask,
        dtype=("integer", "bool"),
        ndim=2,
        meaning="(B, L)",
    )
    mask = attention_mask.long()
    if ((mask != 0) & (mask != 1)).any():
        raise ValueError("attention_mask must hold only 0 and 1")
    return (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)


# ---- attention sinks ---------------------------------------------------------------------


def sink_cache_keep(length: int, *, sinks: int, window: int) -> torch.Tensor:
    r"""Which of ``length`` tokens a StreamingLLM cache keeps: the first ``sinks`` (the
    attention sinks) and the last ``window``, in order (all of them while
    ``length <= sinks + window``). Xiao et al. (2024), Section 3.2.

    Args:
        length: tokens seen, >= 0.
        sinks: initial tokens always kept, >= 0.
        window: most recent tokens kept, >= 1.

    Shape:
        output: ``(min(length, sinks + window),)``, int64 token indices.
    """
    length = _validate.nonnegative_int("length", length)
    sinks = _validate.nonnegative_int("sinks", sinks)
    window = _validate.positive_int("window", window)
    if length <= sinks + window:
        return torch.arange(length)
    return torch.cat([torch.arange(sinks), torch.arange(length - window, length)])


class SinkCache:
    r"""A rolling key/value cache that keeps attention sinks (StreamingLLM).

    Keys are stored *before* RoPE. :meth:`update` appends the new tokens and evicts the
    middle, keeping the first ``sinks`` tokens and the last ``window``
    (:func:`sink_cache_keep`). :meth:`positions` gives the positions the cached keys are
    rotated with at attention time: their slots in the cache, ``0 .. n - 1``, not their
    positions in the text. That is StreamingLLM's re-indexing: the distance between the
    newest query and a sink stays below ``sinks + window``, inside what the model was
    trained on, however long the stream runs.

    :meth:`update` returns the cache *after* eviction: the keys the next query sees.
    Streaming feeds one token per call, as StreamingLLM does and as chapter 9 does. A
    chunk of ``L > 1`` tokens is appended whole and then evicted, so the chunk's own
    earlier queries may need keys that are gone: a 20-token prompt into
    ``SinkCache(sinks=2, window=6)`` returns the keys of tokens 0, 1, 14, ..., 19, and
    its queries 2 to 13 cannot see their own keys there. Attend over a long prompt with
    its full keys and a causal mask first, then hand them to :meth:`update`.

    Args:
        sinks: initial tokens kept.
        window: recent tokens kept.

    Shape:
        keys, values: ``(B, H, S, D)``; :meth:`update` takes ``(B, H, L, D)`` new ones
        (``L = 1`` when streaming; see above for ``L > 1``).
    """

    def __init__(self, *, sinks: int, window: int) -> None:
        self.sinks = _validate.nonnegative_int("sinks", sinks)
        self.window = _validate.positive_int("window", window)
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.seen = 0  # tokens ever appended

    def update(
        self, key: torch.Tensor, value: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``key``/``value`` (not rotated), evict, return the cache's keys and
        values after the eviction (what the next query sees; one token per call when
        streaming, see the class's note on chunks)."""
        _validate.tensor("key", key, ndim=4, meaning="(B, H, L, D)")
        _validate.tensor_like(
            "value", value, "key", key, ndim=4, meaning="(B, H, L, D)"
        )
        _validate.same_size("key", key, 0, "value", value, 0, "batch")
        _validate.same_size("key", key, 1, "value", value, 1, "heads")
        _validate.same_size("key", key, -2, "value", value, -2, "length (L)")
        if self.keys is not None:  # all checks before any state changes
            _validate.same_size("key", key, 0, "the cached keys", self.keys, 0, "batch")
            _validate.same_size("key", key, 1, "the cached keys", self.keys, 1, "heads")
            _validate.same_size("key", key, -1, "the cached keys", self.keys, -1, "D")
            _validate.same_size(
                "value", value, -1, "the cached values", self.values, -1, "D"
            )
        self.seen += key.shape[-2]
        if self.keys is not None:
            key = torch.cat([self.keys, key], dim=-2)
            value = torch.cat([self.values, value], dim=-2)
        keep = sink_cache_keep(key.shape[-2], sinks=self.sinks, window=self.window)
        self.keys = key[..., keep.to(key.device), :]
        self.values = value[..., keep.to(value.device), :]
        return self.keys, self.values

    def positions(self) -> torch.Tensor:
        """The RoPE positions of the cached keys, ``0 .. n - 1`` (re-indexed)."""
        n = 0 if self.keys is None else self.keys.shape[-2]
        return torch.arange(n)


# ---- reading the attention of a trained tiny model ---------------------------------------


@torch.no_grad()
def attention_maps(
    net: TinyTransformer, input_ids: torch.Tensor, *, scores: bool = False
) -> torch.Tensor:
    r"""The attention weights (or scores) of every layer of a tiny model on ``input_ids``.

    Runs the model once, records the input of each attention layer, and recomputes its
    weights from the layer's own projections and position step: plain causal (no
    position), RoPE, QK-norm then RoPE, or RoPE then soft-capping, plus the layer's own
    :meth:`~companion.attention.MultiHeadAttention.score_bias` where it has one (the
    sliding window of :class:`companion.hybrid_positions.LocalRotarySelfAttention`).
    A layer with a learned sink per head
    (:class:`companion.sink_comparison.LearnedSinkSelfAttention`) gets the sink's
    column in its softmax, dropped after it: its rows sum to one minus the sink's share.
    ALiBi and the other layers are refused by name.

    Args:
        net: a :class:`~companion.model.TinyTransformer` (or
            :class:`ModernTinyTransformer`).
        input_ids: token ids.
        scores: return the scaled (and, for soft-capping, capped) scores before the
            softmax instead, ``-inf`` above the diagonal.

    Shape:
        ``input_ids``: ``(B, L)``; output: ``(layers, B, H, S, S)`` with ``S`` the
        length the layers see: ``L``, or ``L + 1`` for a model that puts a sink token in
        front (:class:`companion.sink_comparison.SinkTransformer`); rows summing to 1
        (weights; less the sink's share with a learned sink).
    """

    _validate.module("net", net, TinyTransformer)
    scores = _validate.flag("scores", scores)
    layers = [m for m in net.modules() if isinstance(m, CausalSelfAttention)]
    for m in layers:
        if not (type(m) is CausalSelfAttention or isinstance(m, RotarySelfAttention)):
            raise ValueError(
                "net must use plain, RoPE, QK-norm or soft-capped attention, got a "
                f"{type(m).__name__}"
            )
    maps = []
    for m, x in attention_inputs(net, input_ids):
        q, k = m._split(m.q_proj(x)), m._split(m.k_proj(x))  # (B, H, L, D/H)
        q, k = m.transform_qk(q, k)  # the layer's own: QK-norm, RoPE
        logits = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5  # (B, H, L, L)
        if isinstance(m, SoftcapSelfAttention):
            logits = softcap(logits, m.cap)
        bias = m.score_bias(q, k, is_causal=True)  # the layer's own (a window) or None
        if bias is not None:
            logits = logits + bias  # (B, H, L, L), -inf where the layer masks
        L = q.shape[-2]
        allowed = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
        logits = logits.masked_fill(~allowed, -math.inf)
        sinks = getattr(m, "sinks", None)  # a learned sink logit per head, (H,)
        if scores or sinks is None:
            maps.append(logits if scores else torch.softmax(logits, dim=-1))
            continue
        column = sinks[None, :, None, None].expand(*logits.shape[:-1], 1)
        weights = torch.cat([logits, column], dim=-1).softmax(-1)[..., :-1]
        maps.append(weights)  # the sink column dropped: rows sum to 1 - its share
    return torch.stack(maps)
