r"""Rotary position embedding, RoPE (chapter :ref:`ch-rope`).

RoPE rotates each pair of coordinates of a query or key vector by an angle proportional
to the token's position, so that the attention score of a query at position :math:`m`
and a key at position :math:`n` depends on the positions only through :math:`m - n`. For
head width :math:`D`, pair :math:`i = 0, \ldots, D/2 - 1` turns at the frequency

.. math::

    \theta_i = \text{base}^{-2i/D},

and at position :math:`m` the pair :math:`(a, b)` becomes
:math:`(a \cos m\theta_i - b \sin m\theta_i,\; b \cos m\theta_i + a \sin m\theta_i)`:
the complex number :math:`a + \mathrm{i}b` multiplied by
:math:`e^{\mathrm{i}m\theta_i}`, a counterclockwise turn by :math:`m\theta_i` (in the
book's row convention the row :math:`[a, b]` times :math:`R(m\theta_i)`). Only queries
and keys are rotated, never values.

Two layouts say which coordinates form pair :math:`i`:

``"half"``
    coordinates ``(i, i + D/2)``, rotated with :func:`rotate_half`. GPT-NeoX, Hugging
    Face ``transformers`` (LLaMA, Mistral, Qwen, ...), the default here.
``"interleaved"``
    coordinates ``(2i, 2i + 1)``, the complex-number view. RoFormer, GPT-J, Meta's LLaMA
    reference code (:func:`apply_rope_complex`).

Both give the same attention scores once the weights are permuted to match
(:func:`interleaved_to_half_permutation`); mixing them does not.

The cos/sin table is a value: :func:`rope_cos_sin` returns it and the caller passes it
to :func:`apply_rope`. Angles are formed in float64 and only cos and sin are cast, so
a float32 (or lower-precision) table is accurate to the rounding of its dtype even at
positions near :math:`2^{20}`; a float64 table carries the float64 angle's own rounding,
about :math:`m\theta_i 2^{-53}` radians (:math:`1.2 \times 10^{-10}` at
:math:`m = 2^{20}` for :math:`\theta_0 = 1`; the table's error measured at
:math:`m = 2^{20} - 1`, ``D = 128``: :math:`5.9 \times 10^{-11}`), far above float64's
:math:`1.1 \times 10^{-16}`. The derivation, the layouts and the precision study are in
the chapter; the functions here implement them.
"""

from __future__ import annotations

import torch
from torch import Tensor

from companion import _rope_args, _rope_fast, _validate
from companion.positional import inverse_frequencies

__all__ = [
    "LAYOUTS",
    "apply_rope",
    "apply_rope_complex",
    "half_to_interleaved_permutation",
    "interleaved_to_half_permutation",
    "rope_cos_sin",
    "rope_freqs_cis",
    "rope_frequencies",
    "rotate_half",
    "rotate_interleaved",
]

LAYOUTS = _rope_args.LAYOUTS
"""The pairings :func:`apply_rope` understands: ``("half", "interleaved")``."""


def rope_frequencies(head_dim: int, *, base: float = 10000.0) -> Tensor:
    r"""Rotation frequencies :math:`\theta_i = \text{base}^{-2i/D}` of the D/2 pairs.

    The same progression as the sinusoidal encoding's frequencies (one implementation
    serves both, :func:`companion.positional.sinusoidal_frequencies`):
    :math:`\theta_0 = 1` radian per position down to
    :math:`\theta_{D/2-1} = \text{base}^{-(D-2)/D}`. Hugging Face's ``inv_freq`` is this
    tensor in float32; Meta's ``precompute_freqs_cis`` forms it as
    ``1 / theta ** (arange(0, dim, 2) / dim)``. Computed in float64 on the CPU.

    Args:
        head_dim: the head width ``D``; a positive even integer.
        base: the base of the progression, a real number > 1 (10000 in RoFormer and
            LLaMA 1-2, 500000 in LLaMA 3).

    Returns:
        The frequencies in radians per position, float64.

    Shape:
        output: ``(D // 2,)``.
    """
    return inverse_frequencies(head_dim, base=base, name="head_dim")


def _angles(
    positions: Tensor, frequencies: Tensor, device: torch.device | None
) -> Tensor:
    """Float64 angles ``m * theta_i`` on ``device``: ``(*positions.shape, D/2)``."""
    device = positions.device if device is None else device
    m = positions.to(device=device, dtype=torch.float64)  # (...)
    theta = frequencies.to(device=device, dtype=torch.float64)  # (D/2,)
    return m[..., None] * theta  # (..., D/2), exact to float64 rounding


def rope_cos_sin(
    positions: Tensor,
    frequencies: Tensor,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> tuple[Tensor, Tensor]:
    r"""The cos/sin table of RoPE: :math:`\cos(m\theta_i)` and :math:`\sin(m\theta_i)`.

    One entry per position and *pair*, so the table does not depend on the layout
    (Hugging Face's table repeats it twice along the last axis for the half layout).
    Positions are explicit: any integer or real tensor, e.g. ``torch.arange(L)`` or a
    batch of position ids ``(B, L)`` with an offset for a KV cache, or fractional
    positions for interpolation.

    The angles :math:`m\theta_i` are formed in float64 and only cos and sin are cast to
    ``dtype``: in float32 (and lower-precision dtypes) every entry is within the rounding
    of ``dtype`` of the exact value, also at positions near :math:`2^{20}` (measured
    against 50-digit arithmetic: :math:`3.0 \times 10^{-8}` at :math:`m = 2^{20} - 1`,
    ``D = 128``, under float32's half step :math:`6.0 \times 10^{-8}`); in float64 the
    angle's own rounding, about :math:`m\theta_i 2^{-53}` radians
    (:math:`1.2 \times 10^{-10}` there for :math:`\theta_0 = 1`), dominates: the table's
    error there is :math:`5.9 \times 10^{-11}`. An angle formed in float32 instead
    carries a *relative* error of about :math:`2^{-23}`, i.e.
    :math:`m\theta_i 2^{-23}` radians: the chapter measures up to 3.9 half steps of the
    float32 grid at the angle and :math:`1.1 \times 10^{-7} m` radians at ``D = 4096``
    (0.06 rad for pair 1 of ``D = 128`` just below :math:`2^{20}`).

    Args:
        positions: position ids ``m``, an integer or floating-point tensor (empty: an
            empty table).
        frequencies: the pair frequencies :math:`\theta_i`, a 1-D floating-point tensor,
            e.g. from :func:`rope_frequencies` (scaled frequencies for context extension
            work the same way). Both are moved to ``device``.
        dtype: floating-point dtype of the table.
        device: device of the table; ``None`` means ``positions``' device.

    Returns:
        ``(cos, sin)``.

    Shape:
        positions: ``(...)``, e.g. ``(L,)`` or ``(B, L)``.
        frequencies: ``(D // 2,)``.
        cos, sin: ``(..., D // 2)``, e.g. ``(L, D // 2)`` or ``(B, L, D // 2)``.
    """
    positions = _validate.tensor("positions", positions, dtype=("integer", "floating"))
    frequencies = _validate.tensor("frequencies", frequencies, ndim=1, meaning="(D/2,)")
    dtype = _validate.dtype("dtype", dtype)
    device = _validate.device("device", device)
    angles = _angles(positions, frequencies, device)  # (..., D/2) float64
    return torch.cos(angles).to(dtype), torch.sin(angles).to(dtype)


def rope_freqs_cis(
    positions: Tensor, frequencies: Tensor, *, device: torch.device | str | None = None
) -> Tensor:
    r"""The complex table :math:`e^{\mathrm{i}m\theta_i}` of Meta's LLaMA reference
    (``freqs_cis``).

    Meta's ``precompute_freqs_cis`` builds
    ``torch.polar(torch.ones_like(freqs), freqs)`` from float32 angles; here the angles
    are float64 and the result is cast to complex64.

    Args:
        positions: position ids ``m``, an integer or floating-point tensor.
        frequencies: the pair frequencies :math:`\theta_i`, a 1-D floating-point tensor.
        device: device of the table; ``None`` means ``positions``' device.

    Returns:
        The unit complex numbers :math:`e^{\mathrm{i}m\theta_i}`, complex64.

    Shape:
        positions: ``(...)``.
        frequencies: ``(D // 2,)``.
        output: ``(..., D // 2)``.
    """
    positions = _validate.tensor("positions", positions, dtype=("integer", "floating"))
    frequencies = _validate.tensor("frequencies", frequencies, ndim=1, meaning="(D/2,)")
    device = _validate.device("device", device)
    angles = _angles(positions, frequencies, device)  # (..., D/2) float64
    return torch.polar(torch.ones_like(angles), angles).to(torch.complex64)


def rotate_half(x: Tensor) -> Tensor:
    r"""Map each half-layout pair :math:`(a, b) = (x_i, x_{i + D/2})` to ``(-b, a)``.

    Multiplication by :math:`\mathrm{i}` in every pair, i.e. a quarter turn; exactly
    Hugging Face's ``rotate_half``: ``cat((-x2, x1), dim=-1)``. Then
    ``x * cos + rotate_half(x) * sin`` is the half-layout rotation (with cos and sin
    repeated twice along the last axis).

    Args:
        x: a floating-point tensor whose last axis holds the two halves.

    Returns:
        ``cat((-x2, x1), dim=-1)`` for the halves ``x1, x2``, same dtype and device as
        ``x``.

    Shape:
        x: ``(..., D)`` with ``D`` even and positive.
        output: ``(..., D)``.
    """
    x = _validate.tensor("x", x, min_ndim=1)
    _validate.even_size("x", x, -1, "the two halves")
    x1, x2 = x.chunk(2, dim=-1)  # (..., D/2) each
    return torch.cat((-x2, x1), dim=-1)


def rotate_interleaved(x: Tensor) -> Tensor:
    r"""Map each interleaved pair :math:`(a, b) = (x_{2i}, x_{2i+1})` to ``(-b, a)``.

    The interleaved counterpart of :func:`rotate_half` (GPT-J's ``rotate_every_two``).

    Args:
        x: a floating-point tensor whose last axis holds the pairs side by side.

    Returns:
        The pairs ``(-x[2i + 1], x[2i])`` side by side, same dtype and device as ``x``.

    Shape:
        x: ``(..., D)`` with ``D`` even and positive.
        output: ``(..., D)``.
    """
    x = _validate.tensor("x", x, min_ndim=1)
    _validate.even_size("x", x, -1, "pairs side by side")
    pairs = x.unflatten(-1, (-1, 2))  # (..., D/2, 2)
    return torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)


def interleaved_to_half_permutation(head_dim: int) -> Tensor:
    r"""Indices ``p`` with ``x_half = x_interleaved[..., p]``.

    Column ``i`` of the half layout is coordinate ``2i`` of the interleaved one and
    column ``i + D/2`` is coordinate ``2i + 1``, so pair :math:`i` moves from
    ``(2i, 2i+1)`` to ``(i, i + D/2)`` and keeps its frequency. Applying ``p`` to each
    head's rows of the stored query and key weights (``nn.Linear.weight``, whose rows are
    the columns of :math:`W_Q` and :math:`W_K`) is what checkpoint converters (Meta to
    Hugging Face) do.

    Args:
        head_dim: the head width ``D``; a positive even integer.

    Returns:
        The permutation ``[0, 2, ..., D - 2, 1, 3, ..., D - 1]``, int64, shape ``(D,)``.
    """
    head_dim = _validate.positive_int("head_dim", head_dim, even=True)
    return torch.arange(head_dim).view(head_dim // 2, 2).t().reshape(head_dim)


def half_to_interleaved_permutation(head_dim: int) -> Tensor:
    r"""Indices ``p`` with ``x_interleaved = x_half[..., p]``; the inverse of
    :func:`interleaved_to_half_permutation`: ``[0, D/2, 1, D/2 + 1, ...]``.

    Args:
        head_dim: the head width ``D``; a positive even integer.

    Returns:
        The permutation ``[0, D/2, 1, D/2 + 1, ...]``, int64, shape ``(D,)``.
    """
    head_dim = _validate.positive_int("head_dim", head_dim, even=True)
    return torch.arange(head_dim).view(2, head_dim // 2).t().reshape(head_dim)


def apply_rope(
    x: Tensor,
    cos: Tensor,
    sin: Tensor,
    *,
    layout: str = "half",
    seq_dim: int = -2,
    positions: Tensor | None = None,
    fused: bool = False,
    backend: str = "torch",
) -> Tensor:
    r"""Rotate each pair of ``x`` by its position's angle: RoPE for queries or keys.

    Pair :math:`(a, b)` at position :math:`m` with cos/sin entries :math:`c, s` becomes
    :math:`(a c - b s,\; b c + a s)`, i.e.
    :math:`(a + \mathrm{i}b)\,e^{\mathrm{i}m\theta_i}`. Which coordinates form a pair is
    set by ``layout``: ``"half"`` pairs ``(i, i + D/2)`` (Hugging Face ``transformers``,
    GPT-NeoX: ``x * cos + rotate_half(x) * sin`` with the table repeated),
    ``"interleaved"`` pairs ``(2i, 2i + 1)`` (RoFormer, GPT-J, Meta's reference). Apply
    it to queries and keys, never to values.

    For ``x`` of shape ``(..., L, D)`` and a table of shape ``(L, D/2)``, equivalent to
    the following (half layout; the interleaved layout takes
    ``a, b = x[..., 0::2], x[..., 1::2]`` and writes the two results back to the even
    and odd columns)::

        a, b = x.float().chunk(2, dim=-1)  # pair i = (a[i], b[i]), the two halves
        out = torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1).to(x.dtype)

    The math runs in float32 (float64 if ``x`` is float64) and the result is cast to
    ``x``'s dtype. The half layout is written into one output buffer without the
    temporaries of the expression above (block by block on the CPU, so that each block
    stays in cache); the interleaved layout is one complex multiplication, as in
    :func:`apply_rope_complex`. Inside a caller's ``torch.compile``, inside ``torch.func``
    transforms (``vmap``, ``grad``) and, for the eager half layout, whenever autograd
    records, the expression itself runs; the complex multiplication and the compiled
    kernel are differentiable as they are.
    Eager PyTorch has no single kernel for the half layout's sum of two products;
    ``fused=True`` compiles the same expression with :func:`torch.compile` into one
    pass: the first call compiles (seconds), later calls with any batch size, length or
    number of heads reuse the kernel, and a new head width, dtype or device compiles
    once more. It needs what ``torch.compile`` needs (a C++ compiler on the CPU, Triton
    on CUDA). The interleaved layout is one kernel already; ``fused`` does not change
    it. Chapter :ref:`ch-performance` measures the paths.

    Args:
        x: queries or keys, a floating-point tensor with positions along ``seq_dim`` and
            an even head width last.
        cos: :math:`\cos(m\theta_i)` from :func:`rope_cos_sin`, a floating-point tensor
            on ``x``'s device: one row per position of ``x`` (``(L, D/2)``, shared by
            the batch), or per sequence (``(B, L, D/2)``, ``B`` matching ``x``'s first
            axis or 1); broadcast over every other axis (heads).
        sin: :math:`\sin(m\theta_i)`, same shape, dtype and device as ``cos``.
        layout: ``"half"`` or ``"interleaved"``: which coordinates form a pair.
        seq_dim: the axis of ``x`` that holds the positions: ``-2`` (default) for
            ``(B, H, L, D)`` or ``(..., L, D)``; ``1`` (or ``-3``) for ``(B, L, H, D)``.
        positions: optional integer position ids on ``cos``' device; if given, ``cos``
            and ``sin`` are a precomputed ``(T, D/2)`` table and the rows
            ``cos[positions]`` are used (positions outside ``[0, T)`` raise
            ``ValueError``).
        fused: a bool; run the half layout as one compiled kernel (``torch.compile``)
            instead of eager PyTorch; same values up to float rounding (fused
            multiply-adds).
        backend: ``"torch"`` (the paths above) or ``"triton"``: the one-pass Triton
            kernel of :mod:`companion.kernels` (needs Triton; compiled on CUDA, interpreted
            on a CPU), which reads ``x`` through its strides and returns a new contiguous
            tensor. It is differentiable in ``x`` to any order: its backward is the same
            kernel rotating by :math:`-m\theta_i`, itself differentiable. It gives
            ``cos`` and ``sin`` no gradient, so they must not require grad (a
            ``ValueError`` while grad is enabled; use ``backend="torch"`` to
            differentiate the table). ``fused`` must be ``False``.

    Returns:
        The rotated tensor, same shape, dtype and device as ``x`` (``L = 0`` gives an
        empty one).

    Raises:
        TypeError: an argument of the wrong type or dtype family (a complex or integer
            ``x``, ``cos`` and ``sin`` of different dtypes, a non-bool ``fused``).
        ValueError: a wrong value: an odd head width, a table that does not match ``x``,
            tensors on different devices, a ``meta`` tensor, positions outside the
            table, ``cos`` or ``sin`` requiring grad with ``backend="triton"``.
        RuntimeError: ``fused=True`` and ``torch.compile`` cannot build the kernel here
            (no C++ compiler, no Triton): use ``fused=False``.

    Shape:
        x: ``(B, H, L, D)``, ``(..., L, D)``, or ``(B, L, H, D)`` with ``seq_dim=1``.
        cos, sin: ``(L, D/2)`` or ``(B, L, D/2)``; with ``positions``: ``(T, D/2)``.
        positions: ``(L,)`` or ``(B, L)``.
        output: same as ``x``.
    """
    fused = _validate.flag("fused", fused)
    backend = _validate.choice("backend", backend, ("torch", "triton"))
    if backend == "triton" and fused:
        raise ValueError("fused must be False with backend='triton', got True")
    x, table, (cos, sin), layout, s = _rope_args.rope_arguments(
        x, cos, sin, layout, seq_dim, positions
    )  # table: (L, D/2) or (B, L, D/2); cos, sin: viewed to broadcast against x
    if backend == "triton":
        from companion import kernels  # needs Triton; `import companion` does not

        return kernels.rotate(x, *table, layout, s)
    return _rope_fast.rotate(x, cos, sin, layout, fused)


def apply_rope_complex(x: Tensor, freqs_cis: Tensor, *, seq_dim: int = -2) -> Tensor:
    r"""RoPE as complex multiplication, in the style of Meta's LLaMA reference.

    Views each interleaved pair ``(x[2i], x[2i+1])`` as the complex number
    :math:`x_{2i} + \mathrm{i}\,x_{2i+1}` (``torch.view_as_complex``), multiplies by
    :math:`e^{\mathrm{i}m\theta_i}` and views the result as real again. Meta's
    ``apply_rotary_emb`` does the same in float32 (``xq.float()``) and casts back with
    ``type_as``. This is the *interleaved* layout: it equals
    ``apply_rope(x, cos, sin, layout="interleaved")``.

    Args:
        x: queries or keys, a floating-point tensor with positions along ``seq_dim``.
        freqs_cis: :math:`e^{\mathrm{i}m\theta_i}` from :func:`rope_freqs_cis`, a
            complex tensor on ``x``'s device, ``(L, D/2)`` or ``(B, L, D/2)``, broadcast
            like ``cos`` in :func:`apply_rope`.
        seq_dim: the axis of ``x`` that holds the positions.

    Returns:
        The rotated tensor, same shape, dtype and device as ``x``.

    Shape:
        x: ``(..., L, D)`` or ``(B, L, H, D)`` with ``seq_dim=1``.
        freqs_cis: ``(L, D/2)`` or ``(B, L, D/2)``, complex.
        output: same as ``x``.
    """
    x = _validate.tensor("x", x, min_ndim=2, meaning="(..., L, D)")
    _validate.even_size("x", x, -1, "head_dim: RoPE rotates pairs")
    s = _validate.axis(
        "seq_dim", seq_dim, x.ndim, exclude=-1, why="not the last, head_dim"
    )
    freqs_cis = _validate.tensor(
        "freqs_cis", freqs_cis, dtype="complex", min_ndim=2, max_ndim=3
    )
    _validate.same_device("freqs_cis", freqs_cis, "x", x)
    f = _rope_args.align_table("freqs_cis", freqs_cis, x, s)  # (.., L, 1.., D/2)
    compute = torch.complex128 if x.dtype == torch.float64 else torch.complex64
    return _rope_fast.multiply_complex(x, f.to(compute))
