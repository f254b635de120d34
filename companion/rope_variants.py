r"""RoPE's variants: the choice of base, p-RoPE, LongRoPE, and RoPE in 2-D and 3-D.

The RoPE members of chapter :ref:`ch-relative` (the relative biases are in
:mod:`companion.relative`), each matched to a reference in
``tests/test_rope_variants.py``:

**Choosing the base.** :func:`rope_base_lower_bound` is the smallest RoPE base for which
the long-term-decay sum of Men et al. (2024), :math:`B(m) = \sum_i \cos(m\theta_i)`
(:func:`rope_decay_sum`), stays non-negative up to a target context length;
:func:`critical_dimension` counts the dimensions that turn a full circle within the
training length (Liu et al., 2024).

**p-RoPE.** :func:`p_rope_frequencies` keeps only the fastest fraction of RoPE's
frequencies (Barbero et al., 2025); :class:`PRoPESelfAttention` is the tiny
Transformer's attention with them. :func:`rope_pair_scores` splits a trained RoPE
layer's scores into each pair's cosine and sine parts.

**LongRoPE.** :func:`longrope_frequencies` is Phi-3's ``"longrope"`` scaling (one
searched factor per pair, short or long set by the sequence length) and
:func:`longrope_attention_factor` its attention factor, equal to Hugging Face's
``ROPE_INIT_FUNCTIONS["longrope"]``.

**RoPE in several dimensions.** :func:`multimodal_position_ids` and
:func:`multimodal_rope_cos_sin` are Qwen2-VL's multimodal RoPE (M-RoPE): three position
ids per token (temporal, height, width) and contiguous sections of the pairs turned by
each, equal to Hugging Face's ``Qwen2VLModel.get_rope_index`` and
``Qwen2VLRotaryEmbedding``. :func:`axial_rope_frequencies` and
:func:`axial_rope_cos_sin` are axial 2-D RoPE for image patches (Heo et al., 2024): half
of the pairs turn with the column :math:`x`, the other half with the row :math:`y`, so a
score depends on :math:`(x_1 - x_2, y_1 - y_2)` alone. The cos/sin tables plug into
:func:`companion.rope.apply_rope`.

Shape legend: ``B`` batch, ``H`` heads, ``L`` query length, ``S`` key length, ``D`` head
width.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from companion import _validate
from companion.model import CausalSelfAttention, RotarySelfAttention, TinyTransformer
from companion.positional import inverse_frequencies, sinusoidal_dot_products
from companion.rope import rope_frequencies

__all__ = [
    "PRoPESelfAttention",
    "axial_rope_cos_sin",
    "axial_rope_frequencies",
    "critical_dimension",
    "grid_positions",
    "longrope_attention_factor",
    "longrope_frequencies",
    "multimodal_position_ids",
    "multimodal_rope_cos_sin",
    "p_rope_frequencies",
    "rope_base_lower_bound",
    "rope_decay_sum",
    "rope_pair_scores",
]


# ---- choosing the base (Men et al., 2024) --------------------------------------------


def rope_decay_sum(offsets: Tensor, head_dim: int, *, base: float = 10000.0) -> Tensor:
    r"""Men et al.'s long-term-decay sum :math:`B(m) = \sum_{i=0}^{D/2-1}
    \cos(m\theta_i)`.

    For a query :math:`q` and a key :math:`k = q + \varepsilon` that is similar to it,
    against a random key, with independent coordinates of variance :math:`\sigma^2`, the
    expected RoPE score at distance :math:`m` exceeds the random key's by
    :math:`2\sigma^2 B(m)` (Men et al., 2024, Theorem 1): while :math:`B(m) > 0` the
    model can still prefer the similar token. :math:`B` is the dot product of two
    sinusoidal encodings at offset :math:`m`
    (:func:`companion.positional.sinusoidal_dot_products`), which computes it.

    Args:
        offsets: distances :math:`m`, an integer or floating tensor.
        head_dim: ``D``, a positive even int.
        base: the RoPE base.

    Returns:
        :math:`B(m)`, float64, on ``offsets``' device.

    Shape:
        offsets: ``(...)``; output: ``(...)``.
    """
    offsets = _validate.tensor("offsets", offsets, dtype=("integer", "floating"))
    _validate.positive_int("head_dim", head_dim, even=True)
    return sinusoidal_dot_products(offsets, head_dim, base=base)


def _largest_deficit_rate(theta: Tensor, context_length: int) -> float:
    """``max over m = 1 .. context_length of -B(m) / m`` (negative when every
    ``B(m) > 0``), in chunks of ``m``."""
    largest = -math.inf
    for start in range(1, context_length + 1, 1 << 14):
        stop = min(start + (1 << 14), context_length + 1)
        m = torch.arange(start, stop, dtype=torch.float64)
        rate = -torch.cos(m[:, None] * theta).sum(-1) / m
        largest = max(largest, float(rate.max()))
    return largest


def rope_base_lower_bound(
    context_length: int,
    head_dim: int = 128,
    *,
    low: float = 2.0,
    high: float = 1e12,
    rtol: float = 1e-6,
) -> float:
    r"""The smallest RoPE base whose decay sum :math:`B(m)` stays non-negative up to
    ``context_length``: Men et al.'s (2024) lower bound on the base.

    Men et al. define :math:`\text{base}_L = \inf\{b : B_b(m) \ge 0 \text{ for all }
    m = 0, 1, \ldots, L\}` with :math:`B_b(m) = \sum_{i<D/2} \cos(m\, b^{-2i/D})`
    (:func:`rope_decay_sum`). The admissible bases do not form an interval: at
    ``D = 128`` and ``L = 1024`` (a scan in steps of 5) they are about 4.30e3 to 4.33e3
    (the bound's island), 5.61e3 to 5.64e3, and from 6.02e3 on (checked to 6.4e3),
    with failing bases between. A grid scan can miss such islands, so the search is
    certified instead. Since :math:`|\partial B_b(m) / \partial \ln b| \le m\,c(b)`
    with :math:`c(b) = \sum_i (2i/D)\,\theta_i(b)`, which decreases in :math:`b`, a
    distance :math:`m` with :math:`B_b(m) < 0` stays negative, so keeps every base
    inadmissible, up to :math:`\ln b - B_b(m)/(m\,c(b))`. The search steps from
    ``low`` by the longest such certified step (at least a factor ``1 + rtol``) until
    no :math:`B_b(m)` is negative. The answer is exact up to ``rtol`` (an island
    narrower than that can be missed). Each step costs :math:`L \cdot D/2` cosines.

    Args:
        context_length: :math:`L`, at least 1.
        head_dim: ``D``, a positive even int (Llama: 128).
        low: where the search starts, a real > 1 that is not admissible itself.
        high: where it gives up, a real > ``low``.
        rtol: the smallest relative step, in ``(0, 0.5]``.

    Returns:
        The bound, a Python float.

    Raises:
        ValueError: bad arguments, ``low`` already admissible, or no admissible base
            up to ``high``.
    """
    n = _validate.positive_int("context_length", context_length)
    _validate.positive_int("head_dim", head_dim, even=True)
    lo = _validate.real("low", low, exclusive_minimum=1.0)
    hi = _validate.real("high", high, exclusive_minimum=lo)
    tol = _validate.real("rtol", rtol, exclusive_minimum=0.0, maximum=0.5)
    weights = 2 * torch.arange(head_dim // 2, dtype=torch.float64) / head_dim  # 2i/D
    b = lo
    while b <= hi:
        theta = inverse_frequencies(head_dim, base=b, name="head_dim")
        rate = _largest_deficit_rate(theta, n)  # B(0) = D/2 > 0 is no witness
        if rate <= 0:
            if b == lo:
                raise ValueError(
                    f"low must be a base that is not admissible yet (B(m) < 0 for "
                    f"some m <= {n}), got low={lo:g}, which is: start lower"
                )
            return b
        # B_b(m) < 0 with |dB_b(m)/d ln b| <= m c(b): B stays negative for a step
        # of -B_b(m) / (m c(b)) in ln b; the best witness m gives the longest step
        c = float((weights * theta).sum())
        b *= math.exp(max(rate / c, math.log1p(tol)))
    raise ValueError(
        f"high must be large enough to hold an admissible base for context_length={n} "
        f"and head_dim={head_dim}, got high={hi:g}"
    )


def critical_dimension(head_dim: int, base: float, training_length: int) -> int:
    r"""Liu et al.'s (2024) critical dimension: the dimensions whose pairs turn a full
    circle within the training length.

    Pair :math:`i` has wavelength :math:`\lambda_i = 2\pi\, b^{2i/D}`; it completes a
    period within :math:`T` positions when :math:`\lambda_i \le T`, i.e. for
    :math:`i \le x = (D/2) \log_b(T / 2\pi)`. The count of such dimensions (two per
    pair) is :math:`d_\text{extra} = 2\lceil x \rceil` in the paper ("Scaling laws of
    RoPE-based extrapolation"); computed here by counting the pairs, which agrees except
    when :math:`x` is a whole number (then the pair :math:`i = x` has
    :math:`\lambda_i = T` exactly and counts). Llama 2 (:math:`D = 128`, :math:`b =
    10^4`, :math:`T = 4096`): 92 of 128. Dimensions past it never saw a full period
    in training.

    Args:
        head_dim: ``D``, a positive even int.
        base: the RoPE base :math:`b`, a real > 1.
        training_length: :math:`T`, a positive int.

    Returns:
        The number of dimensions, an even int in ``[0, D]``.
    """
    theta = inverse_frequencies(head_dim, base=base, name="head_dim")
    t = _validate.positive_int("training_length", training_length)
    wavelengths = 2 * math.pi / theta
    return 2 * int((wavelengths <= t).sum())


# ---- p-RoPE ----------------------------------------------------------------------------


def p_rope_frequencies(
    head_dim: int, fraction: float, *, base: float = 10000.0
) -> Tensor:
    r"""p-RoPE's frequencies (Barbero et al., 2025): RoPE with only the fastest
    fraction ``p`` of its frequencies, the slowest set to zero.

    RoPE's :math:`\theta_i = b^{-2i/D}` for the first :math:`\lfloor pD/2 \rfloor`
    pairs (the fastest), :math:`0` for the rest: those pairs do not turn at all
    and carry content only, at every distance. :math:`p = 1` is RoPE, :math:`p = 0`
    no position at all. The count is floored as Barbero et al.'s code and Hugging
    Face's ``proportional`` RoPE (Gemma 4) floor it, ``int(p * D // 2)`` in float
    arithmetic: :math:`p = 0.3`, :math:`D = 24` turns 3 pairs (rounding would give 4),
    :math:`D = 64` turns 9 (rounding: 10).

    Args:
        head_dim: ``D``, a positive even int.
        fraction: :math:`p \in [0, 1]`, the fraction of pairs kept.
        base: the RoPE base :math:`b`, a real > 1.

    Returns:
        :math:`\theta_i`, float64, for :func:`companion.rope.rope_cos_sin`.

    Shape:
        output: ``(D/2,)``.
    """
    theta = rope_frequencies(head_dim, base=base)  # validates head_dim and base
    p = _validate.real("fraction", fraction, minimum=0.0, maximum=1.0)
    d = 2 * theta.numel()  # D, validated
    kept = int(p * d // 2)  # floored, as HF's proportional RoPE: int(p * D // 2)
    theta[kept:] = 0.0
    return theta


class PRoPESelfAttention(RotarySelfAttention):
    """Causal self-attention with p-RoPE: :class:`companion.model.RotarySelfAttention`
    whose frequencies are :func:`p_rope_frequencies`.

    Args:
        dim: model width ``D``.
        num_heads: heads ``H``; ``dim / num_heads`` must be even.
        fraction: :math:`p`, the fraction of the pairs that turn.
        base: the RoPE base.

    Shape:
        - input: ``(B, L, D)``
        - output: ``(B, L, D)``
    """

    def __init__(
        self, dim: int, num_heads: int, *, fraction: float = 0.5, base: float = 1e4
    ) -> None:
        super().__init__(dim, num_heads, base=base)
        self.fraction = _validate.real("fraction", fraction, minimum=0.0, maximum=1.0)
        freqs = p_rope_frequencies(self.head_dim, self.fraction, base=base)
        self.register_buffer("rope_frequencies", freqs, persistent=False)


# ---- each pair's share of the scores ---------------------------------------------


def rope_pair_scores(
    net: TinyTransformer, input_ids: Tensor, *, layer: int = -1
) -> Tensor:
    r"""Each RoPE pair's share of one layer's scores, split into its cosine and sine parts.

    In the complex view (:ref:`ch-rope`), pair :math:`i` of a query at position
    :math:`m` and a key at :math:`n` adds to the score

    .. math::
        \frac{1}{\sqrt{D}} \mathrm{Re}\big(z_q \bar z_k e^{\mathrm{i}(m-n)\theta_i}\big)
        = \frac{1}{\sqrt{D}} \big(a \cos((m-n)\theta_i) - b \sin((m-n)\theta_i)\big),
        \qquad a + \mathrm{i} b = z_q \bar z_k,

    with :math:`z_q, z_k` the pair's entries of the query and key *before* rotation
    (half layout, as :func:`companion.rope.apply_rope`). Summed over both parts and all
    pairs this is the layer's score (:func:`companion.modern.attention_maps` with
    ``scores=True``) on and below the diagonal. Computed in float64.

    Args:
        net: a :class:`~companion.model.TinyTransformer` with RoPE (or p-RoPE) layers.
        input_ids: token ids, ``(B, L)``.
        layer: which RoPE layer, counted as a Python index (``-1``: the last).

    Returns:
        ``(2, P, B, H, L, L)`` float64: index 0 the cosine parts
        :math:`a\cos(d\theta_i)/\sqrt{D}`, index 1 the sine parts
        :math:`-b\sin(d\theta_i)/\sqrt{D}`, for each of the :math:`P = D/2` pairs;
        entries above the diagonal (keys the causal mask hides) included.
    """
    _validate.module("net", net, TinyTransformer)
    layers = [m for m in net.modules() if isinstance(m, CausalSelfAttention)]
    if not layers or any(
        type(m) not in (RotarySelfAttention, PRoPESelfAttention) for m in layers
    ):
        kinds = sorted({type(m).__name__ for m in layers})
        raise ValueError(
            f"net must use RoPE or p-RoPE attention in every layer, got {kinds}"
        )
    layer = _validate.integer(
        "layer", layer, minimum=-len(layers), maximum=len(layers) - 1
    )
    _validate.tensor("input_ids", input_ids, dtype="integer", ndim=2, meaning="(B, L)")
    m = layers[layer]
    captured: list[Tensor] = []
    hook = m.register_forward_pre_hook(lambda _, a: captured.append(a[0]))
    try:
        with torch.no_grad():
            net(input_ids)
    finally:
        hook.remove()
    x = captured[0]  # (B, L, D) the layer's input
    with torch.no_grad():
        q, k = m._split(m.q_proj(x)).double(), m._split(m.k_proj(x)).double()
    half = q.shape[-1] // 2
    z_q = torch.complex(q[..., :half], q[..., half:])  # (B, H, L, P)
    z_k = torch.complex(k[..., :half], k[..., half:])  # (B, H, S, P)
    ab = z_q[..., :, None, :] * z_k[..., None, :, :].conj()  # (B, H, L, S, P)
    L = q.shape[-2]
    d = (torch.arange(L)[:, None] - torch.arange(L)).to(ab.device, torch.float64)
    angle = d[..., None] * m.rope_frequencies.to(ab.device, torch.float64)  # (L, S, P)
    scale = q.shape[-1] ** -0.5
    parts = torch.stack([ab.real * angle.cos(), -ab.imag * angle.sin()]) * scale
    return parts.movedim(-1, 1)  # (2, P, B, H, L, S)


# ---- LongRoPE (Phi-3) ----------------------------------------------------------------


def longrope_attention_factor(
    factor: float, original_max_position_embeddings: int
) -> float:
    r"""LongRoPE's attention factor :math:`\sqrt{1 + \ln s / \ln L_0}` (1 for
    :math:`s \le 1`).

    Multiplies cos and sin (so queries and keys), as YaRN's factor does; the default of
    Hugging Face's ``"longrope"`` type and of Microsoft's Phi-3 code, with
    :math:`s` = ``factor`` (Phi-3: ``max_position_embeddings /
    original_max_position_embeddings``, e.g. 131072 / 4096 = 32, giving 1.19).

    Args:
        factor: the extension ratio :math:`s`, a positive real.
        original_max_position_embeddings: the training length :math:`L_0`, at least 2.

    Returns:
        The factor, a Python float.
    """
    s = _validate.positive_real("factor", factor)
    n0 = _validate.integer(
        "original_max_position_embeddings", original_max_position_embeddings, minimum=2
    )
    return 1.0 if s <= 1 else math.sqrt(1 + math.log(s) / math.log(n0))


def _pair_factors(name: str, value: object, pairs: int) -> Tensor:
    """A sequence (or 1-D floating tensor) of ``pairs`` positive reals, float64 CPU."""
    if isinstance(value, Tensor):
        value = _validate.tensor(name, value, ndim=1, meaning="(D/2,)")
        _validate.size(name, value, 0, pairs, "D/2, one factor per pair")
        value = value.detach().cpu().tolist()
    items = _validate.sequence(name, value, length=pairs, what="positive reals (D/2)")
    return torch.tensor(
        [_validate.positive_real(f"{name}[{i}]", x) for i, x in enumerate(items)],
        dtype=torch.float64,
    )


def longrope_frequencies(
    head_dim: int,
    *,
    base: float = 10000.0,
    short_factor: Sequence[float] | Tensor,
    long_factor: Sequence[float] | Tensor,
    factor: float,
    original_max_position_embeddings: int,
    seq_len: int | None = None,
    attention_factor: float | None = None,
) -> tuple[Tensor, float]:
    r"""LongRoPE (Ding et al., 2024) as Phi-3 uses it: one rescale factor per pair.

    :math:`\theta'_i = \theta_i / \kappa_i` with :math:`\theta_i = b^{-2i/D}` and
    :math:`\kappa` the ``long_factor`` list when the sequence is longer than the
    training length (``seq_len > original_max_position_embeddings``), the
    ``short_factor`` list otherwise (``seq_len`` ``None`` or 0 included). The lists
    were found by LongRoPE's evolutionary search and ship in the model's config. This
    is Hugging Face's ``rope_type="longrope"``: ``ROPE_INIT_FUNCTIONS["longrope"]``
    with its ``seq_len``, and the rotary embedding's switch, which passes
    ``seq_len = max(position_ids) + 1`` (the short set up to position
    :math:`L_0 - 1`, the long set from position :math:`L_0` on). The whole sequence uses
    one set: keys cached with the short set are stale once a sequence grows past
    :math:`L_0`.

    Args:
        head_dim: the rotated width ``D`` (Hugging Face: ``int(head_dim *
            partial_rotary_factor)``), even.
        base: the RoPE base :math:`b` (``rope_theta``).
        short_factor: ``D/2`` positive reals, a list or a 1-D floating tensor.
        long_factor: ``D/2`` positive reals.
        factor: the extension ratio :math:`s` for the attention factor (Phi-3:
            ``max_position_embeddings / original_max_position_embeddings``).
        original_max_position_embeddings: the training length :math:`L_0`, at least 2.
        seq_len: the current length; ``None`` means short.
        attention_factor: override the factor; ``None`` gives
            :func:`longrope_attention_factor`.

    Returns:
        ``(inv_freq, attention_factor)``: the frequencies (float64, CPU) and the factor
        to multiply cos and sin by.

    Shape:
        inv_freq: ``(D/2,)``.
    """
    theta = inverse_frequencies(
        head_dim, base=base, name="head_dim"
    )  # validates head_dim and base
    pairs = theta.shape[0]
    short = _pair_factors("short_factor", short_factor, pairs)
    long = _pair_factors("long_factor", long_factor, pairs)
    mscale = longrope_attention_factor(factor, original_max_position_embeddings)
    n0 = int(original_max_position_embeddings)
    length = _validate.optional(_validate.nonnegative_int, "seq_len", seq_len)
    override = _validate.optional(
        _validate.positive_real, "attention_factor", attention_factor
    )
    scales = long if length is not None and length > n0 else short
    return theta / scales, mscale if override is None else override


# ---- RoPE in several dimensions ----------------------------------------------------------


def _multiaxis_cos_sin(
    positions: Tensor,
    frequencies: Tensor,
    axis_of_pair: Tensor,
    dtype: torch.dtype,
    device: torch.device | None,
) -> tuple[Tensor, Tensor]:
    """cos/sin of ``positions[axis_of_pair[i]] * frequencies[i]`` (float64 angles).

    positions ``(A, ...)``, frequencies ``(P,)``, axis_of_pair ``(P,)`` in ``[0, A)``;
    output ``(..., P)`` each."""
    device = positions.device if device is None else device
    pos = positions.to(device=device, dtype=torch.float64)  # (A, ...)
    theta = frequencies.to(device=device, dtype=torch.float64)  # (P,)
    pos = pos.movedim(0, -1)  # (..., A)
    angles = pos[..., axis_of_pair.to(device)] * theta  # (..., P)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def multimodal_position_ids(
    segments: Sequence[int | Sequence[int]],
    *,
    spatial_merge_size: int = 2,
) -> Tensor:
    r"""Qwen2-VL's three position ids (temporal, height, width) for a text and
    vision sequence.

    ``segments`` lists the sequence in order: an int ``n`` is ``n`` text tokens, a
    triple ``(t, h, w)`` a vision grid of ``t x h x w`` patches (Hugging Face's
    ``image_grid_thw`` or ``video_grid_thw`` row), which the model merges into
    ``t * (h/m) * (w/m)`` tokens with :math:`m` = ``spatial_merge_size``. With
    :math:`p` the next free position:

    * a text token takes :math:`(p, p, p)` and :math:`p` grows by 1, so a text-only
      sequence is ordinary 1-D RoPE;
    * the vision token at frame :math:`\tau`, row :math:`r`, column :math:`c` (row-major)
      takes :math:`(p + \tau, p + r, p + c)`, and :math:`p` then grows by
      :math:`\max(h, w)/m`.

    This is Hugging Face transformers 5.23's ``Qwen2VLModel.get_rope_index`` (images
    and videos alike, ``time_interval`` 1) for one unpadded sequence. For an image
    (:math:`t = 1`) the text after it resumes at one past the largest id used, as in
    Qwen2-VL's original code. For a video with more frames than :math:`\max(h, w)/m`,
    transformers 5.23 departs from that code: :math:`p` still grows by
    :math:`\max(h, w)/m`, so the text resumes inside the video's temporal ids
    (``[2, (6, 4, 4), 2]``: video temporal ids 2-7, then text at 4 and 5), where
    Qwen2-VL's original ``get_rope_index`` (transformers 4.4x) started it at the
    largest id plus one (8).

    Args:
        segments: ints (text lengths, at least 1) and ``(t, h, w)`` triples of
            positive ints with ``h`` and ``w`` divisible by ``spatial_merge_size``;
            two grids are separated by text (in Qwen2-VL every grid sits between its
            vision start and end tokens; Hugging Face's grouping by token type would
            merge two adjacent grids).
        spatial_merge_size: patches merged per side (Qwen2-VL: 2).

    Returns:
        The position ids, int64, CPU.

    Shape:
        output: ``(3, L)`` with ``L`` the number of tokens.
    """
    m = _validate.positive_int("spatial_merge_size", spatial_merge_size)
    items = _validate.sequence(
        "segments", segments, what="text lengths and (t, h, w) grids"
    )
    if not items:
        raise ValueError("segments must hold at least one segment, got 0")
    parts, p = [], 0
    for n, item in enumerate(items):
        name = f"segments[{n}]"
        if isinstance(item, (tuple, list)):
            if n and isinstance(items[n - 1], (tuple, list)):
                raise ValueError(
                    f"segments must separate two grids by text (Qwen2-VL's vision "
                    f"start and end tokens do), got grids at {n - 1} and {n}"
                )
            t, h, w = _validate.sequence(name, item, length=3, what="ints (t, h, w)")
            t, h, w = (
                _validate.positive_int(f"{name}[{a}]", x)
                for a, x in enumerate((t, h, w))
            )
            if h % m or w % m:
                raise ValueError(
                    f"{name} must have h and w divisible by spatial_merge_size={m}, "
                    f"got (t, h, w) = {(t, h, w)}"
                )
            grid = torch.meshgrid(
                torch.arange(t),
                torch.arange(h // m),
                torch.arange(w // m),
                indexing="ij",
            )
            parts.append(torch.stack(grid).reshape(3, -1) + p)
            p += max(h, w) // m
        else:
            length = _validate.positive_int(name, item)
            parts.append(torch.arange(p, p + length).expand(3, -1))
            p += length
    return torch.cat(parts, dim=1)


def multimodal_rope_cos_sin(
    position_ids: Tensor,
    frequencies: Tensor,
    mrope_section: Sequence[int],
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> tuple[Tensor, Tensor]:
    r"""The cos/sin table of Qwen2-VL's multimodal RoPE (M-RoPE).

    The ``D/2`` pairs are cut into contiguous sections, ``mrope_section`` pairs each
    (Qwen2-VL: ``[16, 24, 24]`` of 64): pair :math:`i` of section :math:`a` turns by
    :math:`m_a \theta_i`, where :math:`m_a` is the token's position id on axis
    :math:`a` (temporal, height, width; :func:`multimodal_position_ids`) and
    :math:`\theta_i` the usual frequency of pair :math:`i`. The fast pairs thus track
    time and the slowest width. For a text token the three ids agree and the table is
    ordinary RoPE's. Pass the result to :func:`companion.rope.apply_rope` (half layout):
    equal to Hugging Face's ``Qwen2VLRotaryEmbedding`` and ``apply_rotary_pos_emb``.

    Args:
        position_ids: integer (or floating) positions, one row per axis.
        frequencies: the pair frequencies :math:`\theta_i`, a 1-D floating tensor of
            ``D/2`` values (:func:`companion.rope.rope_frequencies`).
        mrope_section: one non-negative int per axis, summing to ``D/2``.
        dtype: floating-point dtype of the table (angles are float64).
        device: device of the table; ``None`` means ``position_ids``' device.

    Returns:
        ``(cos, sin)``.

    Shape:
        position_ids: ``(A, ...)``, e.g. ``(3, L)`` or ``(3, B, L)``.
        frequencies: ``(D/2,)``.
        cos, sin: ``(..., D/2)``.
    """
    position_ids = _validate.tensor(
        "position_ids", position_ids, dtype=("integer", "floating"), min_ndim=1
    )
    frequencies = _validate.tensor("frequencies", frequencies, ndim=1, meaning="(D/2,)")
    axes = position_ids.shape[0]
    section = _validate.sequence(
        "mrope_section", mrope_section, length=axes, what="ints, one per axis"
    )
    section = [
        _validate.nonnegative_int(f"mrope_section[{a}]", n)
        for a, n in enumerate(section)
    ]
    if sum(section) != frequencies.shape[0]:
        raise ValueError(
            f"mrope_section must sum to D/2 = {frequencies.shape[0]} (the length of "
            f"frequencies), got {section} (sum {sum(section)})"
        )
    dtype = _validate.dtype("dtype", dtype)
    device = _validate.device("device", device)
    axis_of_pair = torch.repeat_interleave(torch.arange(axes), torch.tensor(section))
    return _multiaxis_cos_sin(position_ids, frequencies, axis_of_pair, dtype, device)


def axial_rope_frequencies(head_dim: int, *, base: float = 100.0) -> Tensor:
    r"""Frequencies of axial 2-D RoPE: :math:`\theta_i = \text{base}^{-4i/D}`,
    :math:`i < D/4`.

    Each axis gets ``D/4`` pairs with the full range of frequencies of a 1-D RoPE of
    width ``D/2``, as in Heo et al.'s RoPE-Axial (2024; ``compute_axial_cis`` in their
    ``rope-vit`` code, default base 100, as here: patch grids are short; SAM 2's copy
    uses 10000). The first ``D/4`` pairs turn with the column :math:`x`,
    the last ``D/4`` with the row :math:`y` (:func:`axial_rope_cos_sin`).

    Args:
        head_dim: the head width ``D``, a positive multiple of 4.
        base: the base, a real number > 1.

    Returns:
        The ``D/4`` frequencies, float64, CPU.

    Shape:
        output: ``(D/4,)``.
    """
    d = _validate.positive_int("head_dim", head_dim)
    if d % 4:
        raise ValueError(
            f"head_dim must be a multiple of 4 (two axes of pairs), got {d}"
        )
    return inverse_frequencies(d // 2, base=base, name="head_dim")


def grid_positions(
    height: int, width: int, *, device: torch.device | str | None = None
) -> Tensor:
    r"""The :math:`(x, y)` = (column, row) of each patch of a ``height x width`` grid,
    in row-major (raster) order, the order in which a ViT flattens its patches.

    Args:
        height: rows, at least 0.
        width: columns, at least 0.
        device: output device.

    Returns:
        int64 positions; row :math:`n` is :math:`(n \bmod W, \lfloor n / W \rfloor)`.

    Shape:
        output: ``(height * width, 2)``.
    """
    h = _validate.nonnegative_int("height", height)
    w = _validate.nonnegative_int("width", width)
    device = _validate.device("device", device)
    n = torch.arange(h * w, device=device)
    return torch.stack([n % w, n // w], dim=-1) if w else n.new_zeros(0, 2)


def axial_rope_cos_sin(
    positions: Tensor,
    frequencies: Tensor,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> tuple[Tensor, Tensor]:
    r"""The cos/sin table of axial 2-D RoPE for patch positions :math:`(x, y)`.

    Pair :math:`i < D/4` turns by :math:`x\,\theta_i`, pair :math:`D/4 + i` by
    :math:`y\,\theta_i`: two independent 1-D RoPEs on two groups of planes. In the
    complex view the score of a query at :math:`(x_1, y_1)` and a key at
    :math:`(x_2, y_2)` is
    :math:`\mathrm{Re}\sum_i q_i \bar k_i e^{\mathrm{i}(x_1 - x_2)\theta_i} +
    \mathrm{Re}\sum_i q'_i \bar k'_i e^{\mathrm{i}(y_1 - y_2)\theta_i}`: a function of
    :math:`(x_1 - x_2, y_1 - y_2)` alone. Pass the result to
    :func:`companion.rope.apply_rope`; the table is per pair, so either layout works.

    Args:
        positions: :math:`(x, y)` per token, an integer or floating tensor with 2 last
            (e.g. :func:`grid_positions`).
        frequencies: the ``D/4`` frequencies, a 1-D floating tensor
            (:func:`axial_rope_frequencies`).
        dtype: floating-point dtype of the table (angles are float64).
        device: device of the table; ``None`` means ``positions``' device.

    Returns:
        ``(cos, sin)``.

    Shape:
        positions: ``(..., 2)``; frequencies: ``(D/4,)``.
        cos, sin: ``(..., D/2)``.
    """
    positions = _validate.tensor(
        "positions", positions, dtype=("integer", "floating"), min_ndim=1
    )
    _validate.size("positions", positions, -1, 2, "(x, y)")
    frequencies = _validate.tensor("frequencies", frequencies, ndim=1, meaning="(D/4,)")
    dtype = _validate.dtype("dtype", dtype)
    device = _validate.device("device", device)
    quarter = frequencies.shape[0]
    axis_of_pair = torch.arange(2).repeat_interleave(quarter)  # x for D/4, then y
    return _multiaxis_cos_sin(
        positions.movedim(-1, 0),
        frequencies.repeat(2),
        axis_of_pair,
        dtype,
        device,
    )
