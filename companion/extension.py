r"""Beyond the training length: ALiBi and RoPE scaling (chapter :ref:`ch-extension`).

Two families of answers to "what happens past the length the model was trained on":

* **ALiBi** (Press et al., 2022) adds no position embedding at all. Each head ``h`` adds
  a linear penalty :math:`-a_h (m - n)` to the score of the query at position :math:`m`
  and the key at :math:`n` (Press et al. call the slope :math:`m`);
  :func:`alibi_slopes` gives the head slopes :math:`a_h` and :func:`alibi_bias` the bias
  tensor, ready for the ``attn_mask`` of
  :func:`torch.nn.functional.scaled_dot_product_attention`.
* **RoPE scaling** changes the inverse frequencies :math:`\theta_i = b^{-2i/D}` of
  :func:`companion.rope.rope_frequencies` so that positions past the training length map
  onto angles the model has seen. Every function here returns the scaled inverse
  frequencies, shape ``(D/2,)``, float64, which plug straight into
  :func:`companion.rope.rope_cos_sin`:

  ==================================  ================================================
  :func:`linear_scaling_frequencies`  position interpolation, :math:`\theta_i / s`
  :func:`ntk_scaling_frequencies`     NTK-aware base :math:`b\,s^{D/(D-2)}`
  :func:`dynamic_ntk_frequencies`     the NTK base recomputed from the current length
  :func:`yarn_frequencies`            YaRN ramp between ``beta_fast`` and ``beta_slow``,
                                      plus the attention factor :math:`0.1\ln s + 1`
  :func:`llama3_frequencies`          the Llama 3.1 wavelength-band rule
  ==================================  ================================================

Each matches the corresponding entry of Hugging Face transformers'
``modeling_rope_utils.ROPE_INIT_FUNCTIONS`` (``"linear"``, ``"dynamic"``, ``"yarn"``,
``"llama3"``) to a relative :math:`2 \times 10^{-6}` (``transformers`` computes them in
float32); the tests check it. The chapter derives every formula.
"""

from __future__ import annotations

import math

import torch

from companion import _validate
from companion.positional import inverse_frequencies

__all__ = [
    "alibi_bias",
    "alibi_slopes",
    "dynamic_ntk_frequencies",
    "linear_scaling_frequencies",
    "llama3_frequencies",
    "ntk_aware_base",
    "ntk_scaling_frequencies",
    "rope_wavelengths",
    "yarn_attention_factor",
    "yarn_correction_range",
    "yarn_frequencies",
    "yarn_ramp",
]


# ---- RoPE scaling --------------------------------------------------------------------


def rope_wavelengths(frequencies: torch.Tensor) -> torch.Tensor:
    r"""Wavelengths :math:`\lambda_i = 2\pi / \theta_i` of RoPE pairs, in tokens.

    A pair with wavelength :math:`\lambda_i` turns by one full circle every
    :math:`\lambda_i` positions. Pairs whose wavelength exceeds the training length
    never completed a circle during training.

    Args:
        frequencies: inverse frequencies :math:`\theta_i` (radians per token), a
            floating-point tensor, all positive.

    Returns:
        The wavelengths, same shape, dtype and device as ``frequencies``.

    Shape:
        - frequencies: ``(..., D/2)``
        - output: ``(..., D/2)``
    """
    frequencies = _validate.tensor("frequencies", frequencies)
    if not bool((frequencies > 0).all()):  # NaN is not positive either
        raise ValueError(
            f"frequencies must all be positive, got values down to "
            f"{frequencies.min().item():g} (shape {tuple(frequencies.shape)})"
        )
    return 2 * math.pi / frequencies


def linear_scaling_frequencies(
    head_dim: int, *, base: float = 10000.0, factor: float
) -> torch.Tensor:
    r"""Position interpolation (linear scaling): each inverse frequency over ``factor``.

    :math:`\theta'_i = \theta_i / s`, which is the same as feeding positions
    :math:`m / s` (Chen et al., 2023): a sequence ``s`` times longer than the training
    length is squeezed into the training range of angles. Matches HF transformers'
    ``rope_type="linear"``.

    Args:
        head_dim: the rotated dimension ``D``, even.
        base: the RoPE base :math:`b`.
        factor: the scale :math:`s \ge 1`, new length over training length.

    Returns:
        Scaled inverse frequencies, float64 on the CPU.

    Shape:
        - output: ``(D/2,)``
    """
    s = _validate.real("factor", factor, minimum=1.0)
    return inverse_frequencies(head_dim, base=base, name="head_dim") / s


def ntk_aware_base(base: float, factor: float, head_dim: int) -> float:
    r"""The NTK-aware RoPE base :math:`b' = b\, s^{D/(D-2)}`.

    Chosen so that the *lowest* frequency pair, :math:`i = D/2 - 1`, is slowed by
    exactly ``factor`` (as in position interpolation) while the highest, :math:`i = 0`,
    is unchanged: :math:`b'^{-(D-2)/D} = b^{-(D-2)/D} / s`. Proposed by /u/bloc97
    (2023); the rule of HF transformers' ``"dynamic"`` type at a fixed length.

    Args:
        base: the RoPE base :math:`b > 1`.
        factor: the scale :math:`s \ge 1`.
        head_dim: the rotated dimension ``D``, even and at least 4.

    Returns:
        The new base, a Python float.
    """
    b = _validate.real("base", base, exclusive_minimum=1.0)
    s = _validate.real("factor", factor, minimum=1.0)
    d = _validate.integer("head_dim", head_dim, minimum=4, even=True)
    try:
        new_base = b * s ** (d / (d - 2))
    except OverflowError:  # Python floats raise instead of giving inf
        new_base = math.inf
    if not math.isfinite(new_base):
        raise ValueError(
            f"factor must be small enough for base * factor ** (D/(D-2)) to be a "
            f"finite float, got factor={s:g} with base={b:g} and head_dim={d}"
        )
    return new_base


def ntk_scaling_frequencies(
    head_dim: int, *, base: float = 10000.0, factor: float
) -> torch.Tensor:
    r"""NTK-aware scaling: RoPE frequencies with the base :func:`ntk_aware_base`.

    :math:`\theta'_i = (b\,s^{D/(D-2)})^{-2i/D} = \theta_i\, s^{-2i/(D-2)}`: the ratio
    :math:`\theta'_i/\theta_i` falls geometrically from 1 (pair 0) to :math:`1/s` (last
    pair).

    Args:
        head_dim: the rotated dimension ``D``, even and at least 4.
        base: the RoPE base :math:`b`.
        factor: the scale :math:`s \ge 1`.

    Returns:
        Scaled inverse frequencies, float64 on the CPU.

    Shape:
        - output: ``(D/2,)``
    """
    return inverse_frequencies(
        head_dim, base=ntk_aware_base(base, factor, head_dim), name="head_dim"
    )


def dynamic_ntk_frequencies(
    head_dim: int,
    *,
    base: float = 10000.0,
    factor: float,
    original_max_position_embeddings: int,
    seq_len: int,
) -> torch.Tensor:
    r"""Dynamic NTK scaling: the NTK-aware base recomputed for the current length.

    With :math:`L_0` the training length and :math:`L = \max(\text{seq\_len}, L_0)`, the
    effective scale is :math:`s_L = s L / L_0 - (s - 1)` and the base
    :math:`b\, s_L^{D/(D-2)}`. Up to :math:`L_0` the frequencies are the original ones;
    past it they slow down as the sequence grows. This is exactly the rule of HF
    transformers' ``rope_type="dynamic"`` (with ``config.max_position_embeddings``
    :math:`= L_0`).

    The catch: keys already in a KV cache were rotated with the base of an *earlier*
    length, so the query and the cached keys disagree about what a position is (the
    chapter measures it).

    Args:
        head_dim: the rotated dimension ``D``, even and at least 4.
        base: the RoPE base :math:`b`.
        factor: the scale :math:`s \ge 1`.
        original_max_position_embeddings: the training length :math:`L_0`.
        seq_len: the current sequence length (positions ``0 .. seq_len - 1``); ``0`` (an
            empty sequence) gives the original frequencies.

    Returns:
        Scaled inverse frequencies, float64 on the CPU.

    Shape:
        - output: ``(D/2,)``
    """
    s = _validate.real("factor", factor, minimum=1.0)
    n0 = _validate.positive_int(
        "original_max_position_embeddings", original_max_position_embeddings
    )
    n = max(_validate.nonnegative_int("seq_len", seq_len), n0)  # at least L0: no change
    effective = s * n / n0 - (
        s - 1
    )  # >= 1; head_dim and base checked by the call below
    return ntk_scaling_frequencies(head_dim, base=base, factor=effective)


def yarn_correction_range(
    head_dim: int,
    *,
    base: float = 10000.0,
    original_max_position_embeddings: int,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    truncate: bool = True,
) -> tuple[float, float]:
    r"""The pair indices where the YaRN ramp starts and ends.

    Pair :math:`i` turns :math:`r_i = L_0 / \lambda_i` times over the training length
    :math:`L_0`. The index where a pair turns :math:`r` times solves
    :math:`\lambda_i = L_0 / r`:

    .. math:: i(r) = \frac{D \ln\!\big(L_0 / (2\pi r)\big)}{2 \ln b}.

    ``low = i(beta_fast)`` and ``high = i(beta_slow)``, floored and ceiled when
    ``truncate``, clipped to ``[0, D - 1]`` (the YaRN authors' code's clipping, kept by
    HF transformers; only ``D/2`` pairs exist, which is harmless since the ramp is
    clamped).

    Args:
        head_dim: the rotated dimension ``D``, even.
        base: the RoPE base :math:`b`.
        original_max_position_embeddings: the training length :math:`L_0`.
        beta_fast: turns above which a pair is left untouched (default 32; the
            paper's :math:`\beta`, the chapter's :math:`r_\text{fast}`).
        beta_slow: turns below which a pair is fully interpolated (default 1; the
            paper's :math:`\alpha`, the chapter's :math:`r_\text{slow}`).
        truncate: round the range outwards to whole pairs, as HF transformers does by
            default.

    Returns:
        ``(low, high)`` as floats.
    """
    d = _validate.positive_int("head_dim", head_dim, even=True)
    b = _validate.real("base", base, exclusive_minimum=1.0)
    n0 = _validate.positive_int(
        "original_max_position_embeddings", original_max_position_embeddings
    )
    fast = _validate.positive_real("beta_fast", beta_fast)
    slow = _validate.positive_real("beta_slow", beta_slow)
    if fast < slow:
        raise ValueError(
            f"beta_fast must be >= beta_slow, got beta_fast={fast:g}, "
            f"beta_slow={slow:g}"
        )
    for name, beta in (("beta_fast", fast), ("beta_slow", slow)):
        if not 0 < n0 / (beta * 2 * math.pi) < math.inf:  # log of it must be finite
            raise ValueError(
                f"{name} must give a finite correction dimension "
                f"(0 < original_max_position_embeddings / (2 pi {name}) < inf), "
                f"got {name}={beta:g}"
            )
    truncate = _validate.flag("truncate", truncate)

    def index(rotations: float) -> float:
        return d * math.log(n0 / (rotations * 2 * math.pi)) / (2 * math.log(b))

    low, high = index(fast), index(slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    return float(max(low, 0)), float(min(high, d - 1))


def yarn_ramp(
    head_dim: int,
    *,
    base: float = 10000.0,
    original_max_position_embeddings: int,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    truncate: bool = True,
) -> torch.Tensor:
    r"""YaRN's interpolation weight per pair: 0 = untouched, 1 = fully interpolated.

    :math:`\rho_i = \operatorname{clamp}((i - \text{low}) / (\text{high} - \text{low}),
    0, 1)` with ``(low, high)`` from :func:`yarn_correction_range` (``high`` nudged by
    ``0.001`` when the two coincide). Fast pairs (small ``i``, many turns in the
    training length) get :math:`\rho_i = 0`; slow pairs get :math:`\rho_i = 1`. This
    ramp is linear in the pair index, as the YaRN authors' reference code builds it
    (``_yarn_find_correction_range`` with floor and ceil, then
    ``_yarn_linear_ramp_mask(low, high, dim // 2)``) and HF transformers'
    ``_compute_yarn_parameters`` after it. The paper's formula is linear in the number
    of turns :math:`r_i = L_0/\lambda_i` instead (its ramp :math:`\gamma = 1 - \rho`
    is 1 for an untouched pair); the two give frequencies up to 1.76 times apart
    (chapter :ref:`ch-extension`).

    Args:
        head_dim: the rotated dimension ``D``, even.
        base: the RoPE base :math:`b`.
        original_max_position_embeddings: the training length :math:`L_0`.
        beta_fast: see :func:`yarn_correction_range`.
        beta_slow: see :func:`yarn_correction_range`.
        truncate: see :func:`yarn_correction_range`.

    Returns:
        The ramp, float64 on the CPU, values in ``[0, 1]``, non-decreasing in ``i``.

    Shape:
        - output: ``(D/2,)``
    """
    low, high = yarn_correction_range(
        head_dim,
        base=base,
        original_max_position_embeddings=original_max_position_embeddings,
        beta_fast=beta_fast,
        beta_slow=beta_slow,
        truncate=truncate,
    )
    if low == high:
        high += 0.001  # avoid 0 / 0
    i = torch.arange(int(head_dim) // 2, dtype=torch.float64)  # pair index
    return ((i - low) / (high - low)).clamp(0.0, 1.0)


def yarn_attention_factor(factor: float) -> float:
    r"""YaRN's attention factor :math:`\sqrt{1/t} = 0.1 \ln s + 1` (1 for ``s <= 1``).

    HF transformers multiplies cos and sin by it, so queries *and* keys grow by it and
    the attention logits by its square: a softmax temperature :math:`t` below 1 that
    sharpens the attention, which position interpolation alone flattens over a longer
    sequence.

    Args:
        factor: the scale :math:`s`.

    Returns:
        The factor, a Python float.
    """
    s = _validate.positive_real("factor", factor)
    return 1.0 if s <= 1 else 0.1 * math.log(s) + 1.0


def yarn_frequencies(
    head_dim: int,
    *,
    base: float = 10000.0,
    factor: float,
    original_max_position_embeddings: int,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    truncate: bool = True,
    attention_factor: float | None = None,
) -> tuple[torch.Tensor, float]:
    r"""YaRN: NTK-by-parts frequencies and an attention temperature (Peng et al., 2024).

    :math:`\theta'_i = \theta_i \big((1 - \rho_i) + \rho_i / s\big)` with the
    interpolation weight :math:`\rho_i` of :func:`yarn_ramp`: pairs that turn more than
    ``beta_fast`` times within the training length keep their frequency (they have seen
    every angle), pairs that turn less than ``beta_slow`` times are interpolated like
    position interpolation, and the pairs between are blended. Matches HF transformers'
    ``rope_type="yarn"`` (without DeepSeek's ``mscale`` options).

    Args:
        head_dim: the rotated dimension ``D``, even.
        base: the RoPE base :math:`b`.
        factor: the scale :math:`s \ge 1`.
        original_max_position_embeddings: the training length :math:`L_0`.
        beta_fast: see :func:`yarn_correction_range` (default 32).
        beta_slow: see :func:`yarn_correction_range` (default 1).
        truncate: see :func:`yarn_correction_range`.
        attention_factor: override the factor; ``None`` gives
            :func:`yarn_attention_factor`.

    Returns:
        ``(inv_freq, attention_factor)``: the scaled inverse frequencies (float64, CPU)
        and the factor to multiply cos and sin by.

    Shape:
        - inv_freq: ``(D/2,)``
    """
    s = _validate.real("factor", factor, minimum=1.0)
    mscale = _validate.optional(
        _validate.positive_real, "attention_factor", attention_factor
    )
    ramp = yarn_ramp(  # validates head_dim, base, the training length, betas, truncate
        head_dim,
        base=base,
        original_max_position_embeddings=original_max_position_embeddings,
        beta_fast=beta_fast,
        beta_slow=beta_slow,
        truncate=truncate,
    )
    if mscale is None:
        mscale = yarn_attention_factor(s)
    theta = inverse_frequencies(head_dim, base=base, name="head_dim")
    return theta * ((1 - ramp) + ramp / s), mscale


def llama3_frequencies(
    head_dim: int,
    *,
    base: float = 500000.0,
    factor: float = 8.0,
    low_freq_factor: float = 1.0,
    high_freq_factor: float = 4.0,
    original_max_position_embeddings: int = 8192,
) -> torch.Tensor:
    r"""The Llama 3.1 rule: scale RoPE frequencies by wavelength band.

    With training length :math:`L_0` and wavelengths :math:`\lambda_i = 2\pi/\theta_i`:

    * :math:`\lambda_i < L_0 / \text{high\_freq\_factor}`: unchanged (high frequencies);
    * :math:`\lambda_i > L_0 / \text{low\_freq\_factor}`: divided by ``factor``
      (interpolated);
    * between: :math:`\theta'_i = (1 - \mu_i)\,\theta_i / s + \mu_i\,\theta_i` with
      :math:`\mu_i = (L_0/\lambda_i - \text{low}) / (\text{high} - \text{low})`.

    Defaults are Llama 3.1's (``base=500000``, ``factor=8``, 1, 4, ``8192``). Matches
    Meta's ``apply_scaling`` and HF transformers' ``rope_type="llama3"``.

    Args:
        head_dim: the rotated dimension ``D``, even.
        base: the RoPE base :math:`b`.
        factor: the scale :math:`s \ge 1` for the low-frequency band.
        low_freq_factor: wavelengths above :math:`L_0 / \text{low\_freq\_factor}` are
            scaled.
        high_freq_factor: wavelengths below :math:`L_0 / \text{high\_freq\_factor}` are
            kept; must exceed ``low_freq_factor``.
        original_max_position_embeddings: the training length :math:`L_0`.

    Returns:
        Scaled inverse frequencies, float64 on the CPU.

    Shape:
        - output: ``(D/2,)``
    """
    s = _validate.real("factor", factor, minimum=1.0)
    lo = _validate.positive_real("low_freq_factor", low_freq_factor)
    hi = _validate.positive_real("high_freq_factor", high_freq_factor)
    n0 = _validate.positive_int(
        "original_max_position_embeddings", original_max_position_embeddings
    )
    if hi <= lo:
        raise ValueError(
            f"high_freq_factor must be > low_freq_factor, got high_freq_factor={hi:g}, "
            f"low_freq_factor={lo:g}"
        )
    theta = inverse_frequencies(
        head_dim, base=base, name="head_dim"
    )  # validates both first
    wavelength = 2 * math.pi / theta
    mu = ((n0 / wavelength - lo) / (hi - lo)).clamp(0.0, 1.0)  # 0 = scaled, 1 = kept
    scaled = (1 - mu) * theta / s + mu * theta
    # the two outer bands exactly, as in the reference (no rounding from the blend)
    scaled = torch.where(wavelength < n0 / hi, theta, scaled)
    return torch.where(wavelength > n0 / lo, theta / s, scaled)


# ---- ALiBi ---------------------------------------------------------------------------


def _alibi_slopes_float(num_heads: int) -> list[float]:
    """Press et al.'s rule, as floats (powers of two with fractional exponents)."""
    if (
        num_heads & (num_heads - 1) == 0
    ):  # a power of two: 2^(-8/n), 2^(-16/n), ..., 2^-8
        return [2.0 ** (-8.0 * k / num_heads) for k in range(1, num_heads + 1)]
    closest = 2 ** math.floor(math.log2(num_heads))
    # every other slope of the 2*closest sequence fills the rest: the first of them is
    # steeper than all the first ones, the others fall between two of them
    extra = _alibi_slopes_float(2 * closest)[0::2][: num_heads - closest]
    return _alibi_slopes_float(closest) + extra


def alibi_slopes(
    num_heads: int,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    r"""ALiBi head slopes :math:`a_h` (Press et al., 2022, who call them :math:`m`).

    For :math:`H` a power of two, the geometric sequence :math:`a_h = 2^{-8h/H}`,
    :math:`h = 1, \dots, H` (8 heads: 1/2, 1/4, ..., 1/256). Otherwise, with :math:`c`
    the largest power of two below :math:`H`: the :math:`c` slopes for :math:`c` heads,
    then the first :math:`H - c` of the *odd-numbered* slopes for :math:`2c` heads
    (:math:`2^{-4/c}, 2^{-12/c}, \dots`). The first of these is steeper than every one
    of the :math:`c` slopes (12 heads: :math:`2^{-0.5} = 0.7071 > 1/2`); the others
    fall between two of them. This is the
    rule of the reference implementation and of BLOOM (HF transformers'
    ``build_alibi_tensor``).

    Args:
        num_heads: the number of heads ``H`` (positive).
        dtype: a floating-point output dtype (the slopes are computed in float64 and
            cast; an integer dtype would round every slope, all below 1, to 0).
        device: output device.

    Returns:
        The slopes, in head order.

    Shape:
        - output: ``(H,)``
    """
    num_heads = _validate.positive_int("num_heads", num_heads)
    dtype = _validate.dtype("dtype", dtype)
    device = _validate.device("device", device)
    slopes = torch.tensor(_alibi_slopes_float(num_heads), dtype=torch.float64)
    return slopes.to(device=device, dtype=dtype)


def alibi_bias(
    num_heads: int,
    query_length: int,
    key_length: int,
    *,
    is_causal: bool = True,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    r"""The ALiBi bias :math:`-a_h (m - n)` for attention scores, causal mask included.

    :math:`m` is the query's position and :math:`n` the key's. Queries are the *last*
    ``L`` of the ``S`` key positions (query row ``l`` sits at position
    :math:`m = l + S - L`), which covers self-attention (``L == S``) and decoding
    with a KV cache (``L < S``). With ``is_causal=True`` keys after the query get
    :math:`-\infty`, so the result can be passed as ``attn_mask`` to
    :func:`torch.nn.functional.scaled_dot_product_attention` (Press et al.'s causal
    setting). With ``is_causal=False`` the bias is the symmetric :math:`-a_h |m - n|`, a
    common choice for bidirectional encoders (not part of Press et al.).

    Args:
        num_heads: the number of heads ``H``.
        query_length: ``L``, at least 0 (``0`` gives an empty ``(H, 0, S)`` bias).
        key_length: ``S``, at least ``L``.
        is_causal: mask keys after the query with :math:`-\infty`.
        dtype: a floating-point output dtype.
        device: output device.

    Returns:
        The bias per head.

    Shape:
        - output: ``(H, L, S)``; broadcasts against scores ``(B, H, L, S)``.
    """
    num_heads = _validate.positive_int("num_heads", num_heads)
    query_length = _validate.nonnegative_int("query_length", query_length)
    key_length = _validate.nonnegative_int("key_length", key_length)
    if key_length < query_length:
        raise ValueError(
            "key_length must be >= query_length (queries are the last L of the S "
            f"keys), got key_length={key_length}, query_length={query_length}"
        )
    is_causal = _validate.flag("is_causal", is_causal)
    dtype = _validate.dtype("dtype", dtype)
    device = _validate.device("device", device)
    slopes = alibi_slopes(num_heads, dtype=torch.float64, device=device)  # (H,)
    m = torch.arange(query_length, device=device) + (key_length - query_length)  # (L,)
    n = torch.arange(key_length, device=device)  # (S,)
    offset = n[None, :] - m[:, None]  # (L, S), n - m: negative for keys in the past
    if is_causal:
        bias = slopes[:, None, None] * offset.to(torch.float64)  # (H, L, S), -a (m - n)
        bias = bias.masked_fill(offset > 0, float("-inf"))
    else:
        bias = slopes[:, None, None] * (-offset.abs()).to(torch.float64)  # -a |m - n|
    return bias.to(dtype)
