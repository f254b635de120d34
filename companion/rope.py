r"""Rotary position embedding, RoPE (chapter :ref:`ch-rope`).

RoPE rotates each pair of coordinates of a query or key vector by an angle proportional to
the token's position, so that the attention score of a query at position :math:`m` and a key
at position :math:`n` depends on the positions only through :math:`m - n`. For head width
:math:`D`, pair :math:`i = 0, \ldots, D/2 - 1` turns at the frequency

.. math::

    \theta_i = \text{base}^{-2i/D},

and at position :math:`m` the pair :math:`(a, b)` becomes
:math:`(a \cos m\theta_i - b \sin m\theta_i,\; b \cos m\theta_i + a \sin m\theta_i)`: the
complex number :math:`a + ib` multiplied by :math:`e^{im\theta_i}`. Only queries and keys are
rotated, never values.

Two layouts say which coordinates form pair :math:`i`:

``"half"``
    coordinates ``(i, i + D/2)``, rotated with :func:`rotate_half`. GPT-NeoX, Hugging Face
    ``transformers`` (LLaMA, Mistral, Qwen, ...), the default here.
``"interleaved"``
    coordinates ``(2i, 2i + 1)``, the complex-number view. RoFormer, GPT-J, Meta's LLaMA
    reference code (:func:`apply_rope_complex`).

Both give the same attention scores once the weights are permuted to match
(:func:`interleaved_to_half_permutation`); mixing them does not.

The cos/sin table is a value: :func:`rope_cos_sin` returns it and the caller passes it to
:func:`apply_rope`. Angles are formed in float64 and only cos and sin are cast, so the table is
accurate to the rounding of its dtype even at positions near :math:`2^{20}`. The derivation,
the layouts and the precision study are in the chapter; the functions here implement them.
"""

from __future__ import annotations

import math
import numbers
import types

import torch
from torch import Tensor

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

LAYOUTS = ("half", "interleaved")
"""The pairings :func:`apply_rope` understands."""


def _check_head_dim(head_dim: object) -> int:
    if isinstance(head_dim, bool) or not isinstance(head_dim, numbers.Integral):
        raise TypeError(f"head_dim must be an int, got {type(head_dim).__name__}")
    head_dim = int(head_dim)
    if head_dim <= 0 or head_dim % 2:
        raise ValueError(f"head_dim must be a positive even integer, got {head_dim}")
    return head_dim


def _check_layout(layout: object) -> str:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    return str(layout)


def _check_float_tensor(name: str, x: object) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must have a floating-point dtype, got {x.dtype}")
    return x


def _check_even_last_dim(name: str, x: Tensor) -> int:
    if x.ndim < 2:
        raise ValueError(
            f"{name} must have at least 2 dims (..., L, D), got shape {tuple(x.shape)}"
        )
    width = x.shape[-1]
    if width % 2:
        raise ValueError(f"{name}.shape[-1] (head_dim) must be even, got {width}")
    return width


def rope_frequencies(head_dim: int, *, base: float = 10000.0) -> Tensor:
    r"""Rotation frequencies :math:`\theta_i = \text{base}^{-2i/D}` of the ``D/2`` pairs.

    The same progression as the sinusoidal encoding's frequencies: :math:`\theta_0 = 1` radian
    per position down to :math:`\theta_{D/2-1} = \text{base}^{-(D-2)/D}`. Hugging Face's
    ``inv_freq`` is this tensor in float32; Meta's ``precompute_freqs_cis`` forms it as
    ``1 / theta ** (arange(0, dim, 2) / dim)``. Computed in float64 on the CPU.

    Args:
        head_dim: the head width ``D``; a positive even integer.
        base: the base of the progression (10000 in RoFormer and LLaMA 1-2, 500000 in
            LLaMA 3).

    Returns:
        The frequencies in radians per position, float64.

    Shape:
        output: ``(D // 2,)``.
    """
    head_dim = _check_head_dim(head_dim)
    if isinstance(base, bool) or not isinstance(base, numbers.Real):
        raise TypeError(f"base must be a real number, got {type(base).__name__}")
    base = float(base)
    if not math.isfinite(base) or base <= 1.0:
        raise ValueError(f"base must be a finite number > 1, got {base}")
    i = torch.arange(head_dim // 2, dtype=torch.float64)  # pair index 0 .. D/2 - 1
    return base ** (-2.0 * i / head_dim)


def _angles(positions: object, frequencies: object, device: torch.device | str | None) -> Tensor:
    """Float64 angles ``m * theta_i`` on ``device``: shape ``(*positions.shape, D/2)``."""
    if not isinstance(positions, Tensor):
        raise TypeError(f"positions must be a torch.Tensor, got {type(positions).__name__}")
    if positions.dtype == torch.bool or positions.is_complex():
        raise TypeError(f"positions must be an integer or real tensor, got {positions.dtype}")
    if not isinstance(frequencies, Tensor):
        raise TypeError(f"frequencies must be a torch.Tensor, got {type(frequencies).__name__}")
    if frequencies.ndim != 1:
        raise ValueError(f"frequencies must be 1-D (D/2,), got shape {tuple(frequencies.shape)}")
    device = positions.device if device is None else torch.device(device)
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

    One entry per position and *pair*, so the table does not depend on the layout (Hugging
    Face's table repeats it twice along the last axis for the half layout). Positions are
    explicit: any integer or real tensor, e.g. ``torch.arange(L)`` or a batch of position ids
    ``(B, L)`` with an offset for a KV cache, or fractional positions for interpolation.

    The angles :math:`m\theta_i` are formed in float64 and only cos and sin are cast to
    ``dtype``: every entry is within the rounding of ``dtype`` of the exact value, also at
    positions near :math:`2^{20}`, where a float32 angle is off by up to a few hundredths of a
    radian (half a float32 step of the angle).

    Args:
        positions: position ids ``m``, integer or real.
        frequencies: the pair frequencies :math:`\theta_i`, e.g. from :func:`rope_frequencies`
            (scaled frequencies for context extension work the same way).
        dtype: floating-point dtype of the table.
        device: device of the table; ``None`` means ``positions``' device.

    Returns:
        ``(cos, sin)``.

    Shape:
        positions: ``(...)``, e.g. ``(L,)`` or ``(B, L)``.
        frequencies: ``(D // 2,)``.
        cos, sin: ``(..., D // 2)``, e.g. ``(L, D // 2)`` or ``(B, L, D // 2)``.
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype}")
    angles = _angles(positions, frequencies, device)  # (..., D/2) float64
    return torch.cos(angles).to(dtype), torch.sin(angles).to(dtype)


def rope_freqs_cis(
    positions: Tensor, frequencies: Tensor, *, device: torch.device | str | None = None
) -> Tensor:
    r"""The complex table :math:`e^{im\theta_i}` of Meta's LLaMA reference (``freqs_cis``).

    Meta's ``precompute_freqs_cis`` builds ``torch.polar(torch.ones_like(freqs), freqs)``
    from float32 angles; here the angles are float64 and the result is cast to complex64.

    Args:
        positions: position ids ``m``, integer or real.
        frequencies: the pair frequencies :math:`\theta_i`.
        device: device of the table; ``None`` means ``positions``' device.

    Returns:
        The unit complex numbers :math:`e^{im\theta_i}`, complex64.

    Shape:
        positions: ``(...)``.
        frequencies: ``(D // 2,)``.
        output: ``(..., D // 2)``.
    """
    angles = _angles(positions, frequencies, device)  # (..., D/2) float64
    return torch.polar(torch.ones_like(angles), angles).to(torch.complex64)


def rotate_half(x: Tensor) -> Tensor:
    r"""Map each half-layout pair :math:`(a, b) = (x_i, x_{i + D/2})` to :math:`(-b, a)`.

    Multiplication by :math:`i` in every pair, i.e. a quarter turn; exactly Hugging Face's
    ``rotate_half``: ``cat((-x2, x1), dim=-1)``. Then
    ``x * cos + rotate_half(x) * sin`` is the half-layout rotation (with cos and sin repeated
    twice along the last axis).

    Args:
        x: input whose last axis holds the two halves.

    Returns:
        The rotated tensor, same dtype and device.

    Shape:
        x: ``(..., D)`` with ``D`` even.
        output: ``(..., D)``.
    """
    _check_float_tensor("x", x)
    if x.shape[-1] % 2:
        raise ValueError(f"x.shape[-1] must be even, got {x.shape[-1]}")
    x1, x2 = x.chunk(2, dim=-1)  # (..., D/2) each
    return torch.cat((-x2, x1), dim=-1)


def rotate_interleaved(x: Tensor) -> Tensor:
    r"""Map each interleaved pair :math:`(a, b) = (x_{2i}, x_{2i+1})` to :math:`(-b, a)`.

    The interleaved counterpart of :func:`rotate_half` (GPT-J's ``rotate_every_two``).

    Args:
        x: input whose last axis holds the pairs side by side.

    Returns:
        The rotated tensor, same dtype and device.

    Shape:
        x: ``(..., D)`` with ``D`` even.
        output: ``(..., D)``.
    """
    _check_float_tensor("x", x)
    if x.shape[-1] % 2:
        raise ValueError(f"x.shape[-1] must be even, got {x.shape[-1]}")
    pairs = x.unflatten(-1, (-1, 2))  # (..., D/2, 2)
    return torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)


def interleaved_to_half_permutation(head_dim: int) -> Tensor:
    r"""Indices ``p`` with ``x_half = x_interleaved[..., p]``: ``[0, 2, 4, ..., 1, 3, 5, ...]``.

    Column ``i`` of the half layout is coordinate ``2i`` of the interleaved one and column
    ``i + D/2`` is coordinate ``2i + 1``, so pair :math:`i` moves from ``(2i, 2i+1)`` to
    ``(i, i + D/2)`` and keeps its frequency. Applying ``p`` to the output rows of each head of
    :math:`W_q` and :math:`W_k` is what checkpoint converters (Meta to Hugging Face) do.

    Args:
        head_dim: the head width ``D``; a positive even integer.

    Returns:
        The permutation, int64.

    Shape:
        output: ``(D,)``.
    """
    head_dim = _check_head_dim(head_dim)
    return torch.arange(head_dim).view(head_dim // 2, 2).t().reshape(head_dim)


def half_to_interleaved_permutation(head_dim: int) -> Tensor:
    r"""Indices ``p`` with ``x_interleaved = x_half[..., p]``; the inverse of
    :func:`interleaved_to_half_permutation`: ``[0, D/2, 1, D/2 + 1, ...]``.

    Args:
        head_dim: the head width ``D``; a positive even integer.

    Returns:
        The permutation, int64.

    Shape:
        output: ``(D,)``.
    """
    head_dim = _check_head_dim(head_dim)
    return torch.arange(head_dim).view(2, head_dim // 2).t().reshape(head_dim)


def _normalise_seq_dim(seq_dim: object, ndim: int) -> int:
    if isinstance(seq_dim, bool) or not isinstance(seq_dim, numbers.Integral):
        raise TypeError(f"seq_dim must be an int, got {type(seq_dim).__name__}")
    s = int(seq_dim)
    if not -ndim <= s < ndim or s % ndim == ndim - 1:
        raise ValueError(
            f"seq_dim must name an axis of x other than the last (head_dim), got {seq_dim} "
            f"for x with {ndim} dims"
        )
    return s % ndim


def _broadcast_table(name: str, t: Tensor, x: Tensor, s: int) -> Tensor:
    """Reshape a ``(L, D/2)`` or ``(B, L, D/2)`` table to broadcast against ``x`` (L on axis s)."""
    pairs = x.shape[-1] // 2
    length = x.shape[s]
    after = x.ndim - 2 - s  # axes between L and D (heads, in (B, L, H, D))
    if t.ndim == 2:
        if t.shape != (length, pairs):
            raise ValueError(
                f"{name} must have shape (L, D/2) = ({length}, {pairs}) to match x of shape "
                f"{tuple(x.shape)} with L on axis {s}, got {tuple(t.shape)}"
            )
        return t.reshape(length, *([1] * after), pairs)
    if t.ndim == 3:
        if s == 0:
            raise ValueError(
                f"{name} of shape (B, L, D/2) needs a batch axis before L in x, but x has L on "
                f"axis 0 (shape {tuple(x.shape)})"
            )
        if t.shape[1:] != (length, pairs) or t.shape[0] not in (1, x.shape[0]):
            raise ValueError(
                f"{name} must have shape (B, L, D/2) = ({x.shape[0]}, {length}, {pairs}) to "
                f"match x of shape {tuple(x.shape)} with L on axis {s}, got {tuple(t.shape)}"
            )
        return t.reshape(t.shape[0], *([1] * (s - 1)), length, *([1] * after), pairs)
    raise ValueError(f"{name} must be (L, D/2) or (B, L, D/2), got shape {tuple(t.shape)}")


def _gather_rows(name: str, table: Tensor, positions: Tensor) -> Tensor:
    """Rows ``table[positions]`` with a clear error for positions outside the table."""
    if not isinstance(positions, Tensor) or positions.is_floating_point() or positions.is_complex():
        raise TypeError(f"positions must be an integer tensor, got {positions!r:.60}")
    if positions.dtype == torch.bool:
        raise TypeError("positions must be an integer tensor, got torch.bool")
    if table.ndim != 2:
        raise ValueError(
            f"with positions, {name} must be a (T, D/2) table, got shape {tuple(table.shape)}"
        )
    if torch.compiler.is_compiling():  # values are unknown while tracing: indexing checks them
        return table[positions.to(table.device)]
    if positions.numel() and (int(positions.min()) < 0 or int(positions.max()) >= table.shape[0]):
        raise ValueError(
            f"positions must lie in [0, {table.shape[0]}) for a table of {table.shape[0]} rows, "
            f"got values in [{int(positions.min())}, {int(positions.max())}]: recompute the "
            "table with rope_cos_sin for the positions you need"
        )
    return table[positions.to(table.device)]  # (..., D/2)


def apply_rope(
    x: Tensor,
    cos: Tensor,
    sin: Tensor,
    *,
    layout: str = "half",
    seq_dim: int = -2,
    positions: Tensor | None = None,
    fused: bool = False,
) -> Tensor:
    r"""Rotate each pair of ``x`` by its position's angle: RoPE for queries or keys.

    Pair :math:`(a, b)` at position :math:`m` with cos/sin entries :math:`c, s` becomes
    :math:`(a c - b s,\; b c + a s)`, i.e. :math:`(a + ib)\,e^{im\theta_i}`. Which
    coordinates form a pair is set by ``layout``: ``"half"`` pairs ``(i, i + D/2)`` (Hugging Face
    ``transformers``, GPT-NeoX: ``x * cos + rotate_half(x) * sin`` with the table repeated),
    ``"interleaved"`` pairs ``(2i, 2i + 1)`` (RoFormer, GPT-J, Meta's reference). Apply it to
    queries and keys, never to values.

    The math runs in float32 (float64 if ``x`` is float64) and the result is cast to ``x``'s
    dtype. The half layout writes into one output buffer without forming ``rotate_half(x)``,
    block by block on the CPU so that each block stays in cache (when autograd is recording,
    it uses the same formula with temporaries, which autograd can differentiate); the
    interleaved layout is one complex multiplication, as in
    :func:`apply_rope_complex`.

    Eager PyTorch has no single kernel for the half layout's sum of two products, so its
    default path reads and writes each element several times (about 2.5-3x the time of
    ``x.clone()`` on a CPU; the appendix measures it). ``fused=True`` runs the same formula
    through :func:`torch.compile`, which fuses it into one pass (about 1.4x the copy). The first
    call compiles (seconds); later calls with any batch size, length or number of heads reuse
    the kernel, and a new head width, dtype or device compiles once more. It needs what
    ``torch.compile`` needs (a C++ compiler on the CPU, Triton on CUDA). The interleaved
    layout is one kernel already (the complex multiplication); ``fused`` does not change it.
    Called inside a function that the caller compiles with ``torch.compile``, both layouts
    use the plain formula, which that compilation fuses (``fused`` then makes no difference).

    Args:
        x: queries or keys, positions along ``seq_dim`` and the head width last.
        cos: :math:`\cos(m\theta_i)` from :func:`rope_cos_sin`: one row per position of ``x``
            (``(L, D/2)``, shared by the batch), or per sequence (``(B, L, D/2)``, ``B``
            matching ``x``'s first axis); broadcast over every other axis (heads).
        sin: :math:`\sin(m\theta_i)`, same shape as ``cos``.
        layout: ``"half"`` or ``"interleaved"``: which coordinates form a pair.
        seq_dim: the axis of ``x`` that holds the positions: ``-2`` (default) for
            ``(B, H, L, D)`` or ``(..., L, D)``; ``1`` (or ``-3``) for ``(B, L, H, D)``.
        positions: optional integer position ids; if given, ``cos`` and ``sin`` are a
            precomputed ``(T, D/2)`` table and the rows ``cos[positions]`` are used
            (positions outside ``[0, T)`` raise ``ValueError``).
        fused: run the half layout as one compiled kernel (``torch.compile``) instead of
            eager PyTorch; same values up to float rounding (fused multiply-adds). If compiling
            fails (no C++ compiler, no Triton), raises ``RuntimeError``: use ``fused=False``.

    Returns:
        The rotated tensor, same shape, dtype and device as ``x``.

    Raises:
        RuntimeError: ``fused=True`` and ``torch.compile`` cannot build the kernel here.

    Shape:
        x: ``(B, H, L, D)``, ``(..., L, D)``, or ``(B, L, H, D)`` with ``seq_dim=1``.
        cos, sin: ``(L, D/2)`` or ``(B, L, D/2)``; with ``positions``: ``(T, D/2)``.
        positions: ``(L,)`` or ``(B, L)``.
        output: same as ``x``.
    """
    _check_float_tensor("x", x)
    _check_float_tensor("cos", cos)
    _check_float_tensor("sin", sin)
    layout = _check_layout(layout)
    if not isinstance(fused, bool):
        raise TypeError(f"fused must be True or False, got {fused!r:.60}")
    _check_even_last_dim("x", x)
    s = _normalise_seq_dim(seq_dim, x.ndim)
    if cos.shape != sin.shape:
        raise ValueError(
            f"cos and sin must have the same shape, got {tuple(cos.shape)} and {tuple(sin.shape)}"
        )
    if positions is not None:
        cos = _gather_rows("cos", cos, positions)
        sin = _gather_rows("sin", sin, positions)
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    cos = _broadcast_table("cos", cos.to(x.device, compute), x, s)  # (.., L, 1.., D/2)
    sin = _broadcast_table("sin", sin.to(x.device, compute), x, s)
    if torch.compiler.is_compiling() or _functorch_wrapped(x, cos, sin):
        # inside the caller's torch.compile (which fuses it) or a torch.func transform (vmap,
        # grad: no out= writes, no complex views there): the plain formula
        return _rope_formula(x, cos, sin, layout)
    if layout == "interleaved":
        # pairs (x[2i], x[2i+1]) are adjacent: one complex multiply reads x once
        return _multiply_complex(x, torch.complex(cos, sin))
    if fused:
        return _apply_fused(x, cos, sin)
    if torch.is_grad_enabled() and (x.requires_grad or cos.requires_grad or sin.requires_grad):
        return _rope_formula(x, cos, sin)  # autograd cannot record out= writes
    xc = x.to(compute)  # no copy for float32 input
    out = torch.empty(x.shape, dtype=compute, device=x.device)
    block = _BLOCK if x.device.type == "cpu" else x.numel()  # GPUs: one launch per kernel
    _rotate_half_layout_into(out, xc, cos, sin, block)
    return out.to(x.dtype)


_BLOCK = 1 << 19  # elements per block of the half-layout fast path (2 MiB of float32)


def _rotate_half_layout_into(out: Tensor, x: Tensor, cos: Tensor, sin: Tensor, block: int) -> None:
    """Write the half-layout rotation of ``x`` into ``out``, block by block.

    Each block is rotated with four in-place kernels that read and write its halves; blocks are
    small enough to stay in the CPU cache between those kernels, so memory sees about one read
    of ``x`` and one write of ``out``. ``cos``/``sin`` broadcast against ``x`` (right-aligned).
    """
    axis = next((a for a in range(x.ndim - 1) if x.shape[a] > 1), None)
    if x.numel() > block and axis is not None:
        size = x.shape[axis]
        step = max(1, block // (x.numel() // size))
        t_axis = axis - (x.ndim - cos.ndim)  # the same axis in the (right-aligned) table
        split_table = t_axis >= 0 and cos.shape[t_axis] > 1
        for start in range(0, size, step):
            n = min(step, size - start)
            c = cos.narrow(t_axis, start, n) if split_table else cos
            s = sin.narrow(t_axis, start, n) if split_table else sin
            _rotate_half_layout_into(
                out.narrow(axis, start, n), x.narrow(axis, start, n), c, s, block
            )
        return
    x1, x2 = x.chunk(2, dim=-1)  # (..., D/2): pair i = (x1[i], x2[i])
    o1, o2 = out.chunk(2, dim=-1)  # views into out: no rotate_half(x) temporary
    torch.mul(x1, cos, out=o1)  # a cos
    o1.addcmul_(x2, sin, value=-1.0)  # a cos - b sin
    torch.mul(x2, cos, out=o2)  # b cos
    o2.addcmul_(x1, sin)  # b cos + a sin


def _functorch_wrapped(*tensors: Tensor) -> bool:
    """Whether any tensor is seen through a :mod:`torch.func` transform (vmap, grad, ...)."""
    is_wrapped = getattr(torch._C._functorch, "is_functorch_wrapped_tensor", None)
    return is_wrapped is not None and any(is_wrapped(t) for t in tensors)


def _rope_formula(x: Tensor, cos: Tensor, sin: Tensor, layout: str = "half") -> Tensor:
    """RoPE as one expression with temporaries: what autograd, ``torch.func`` transforms and
    ``torch.compile`` (which fuses it into one loop) see. Math in float32 or float64."""
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    pair_dim, split = (-2, (2, -1)) if layout == "half" else (-1, (-1, 2))
    a, b = x.to(compute).unflatten(-1, split).unbind(pair_dim)  # (..., D/2): pair i = (a[i], b[i])
    return torch.stack((a * cos - b * sin, b * cos + a * sin), pair_dim).flatten(-2).to(x.dtype)


_COMPILED: dict = {}  # (dtype, device type, D, grad mode) -> compiled half-layout kernel


def _compiled_kernel(x: Tensor) -> object:
    """The compiled half-layout kernel for what changes its code (built once per key).

    Each key gets its own copy of the kernel's code object: ``torch.compile`` keeps its cache
    and its limit on recompilations per code object, so one kernel's variants (strides,
    broadcast patterns) cannot use up the budget of another dtype or head width.
    """
    key = (x.dtype, x.device.type, x.shape[-1], torch.is_grad_enabled())
    kernel = _COMPILED.get(key)
    if kernel is None:
        base = _rope_formula  # layout defaults to "half"
        fn = types.FunctionType(
            base.__code__.replace(), base.__globals__, base.__name__, base.__defaults__
        )
        kernel = _COMPILED[key] = torch.compile(
            fn, dynamic=False, options={"cpp_cache_precompile_headers": False}
        )
    return kernel


def _apply_fused(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Half-layout ``apply_rope`` through the compiled kernel (``cos``/``sin`` broadcastable).

    Every axis but the head width is marked dynamic, so one compiled kernel serves all batch
    sizes, lengths and head counts; the head width stays static, which lets the compiler
    vectorise the inner loop. The marks go on fresh views: the caller's tensors are untouched.
    """
    kernel = _compiled_kernel(x)
    views = [t.view(t.shape) for t in (x, cos, sin)]
    for t in views:
        torch._dynamo.maybe_mark_dynamic(t, [i for i in range(t.ndim - 1) if t.shape[i] > 1])
    try:
        return kernel(*views)
    except Exception as err:  # the compiler toolchain is missing or failed
        reason = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise RuntimeError(
            f"apply_rope(fused=True) builds its kernel with torch.compile, which failed on "
            f"{x.device.type} ({type(err).__name__}: {reason[:200]}); use fused=False, which "
            "computes the same values in eager PyTorch"
        ) from err


def _multiply_complex(x: Tensor, f: Tensor) -> Tensor:
    """``x``'s interleaved pairs times the broadcastable complex table ``f``, cast back."""
    xr = x.to(f.real.dtype)  # float32 (float64 for float64 x)
    if xr.stride(-1) != 1 or xr.storage_offset() % 2 or any(st % 2 for st in xr.stride()[:-1]):
        xr = xr.contiguous()  # view_as_complex needs pairs adjacent in memory
    xz = torch.view_as_complex(xr.unflatten(-1, (-1, 2)))  # (..., D/2) complex
    return torch.view_as_real(xz * f).flatten(-2).to(x.dtype)  # (..., D)


def apply_rope_complex(x: Tensor, freqs_cis: Tensor, *, seq_dim: int = -2) -> Tensor:
    r"""RoPE as complex multiplication, in the style of Meta's LLaMA reference.

    Views each interleaved pair ``(x[2i], x[2i+1])`` as the complex number
    :math:`x_{2i} + i\,x_{2i+1}` (``torch.view_as_complex``), multiplies by
    :math:`e^{im\theta_i}` and views the result as real again. Meta's ``apply_rotary_emb``
    does the same in float32 (``xq.float()``) and casts back with ``type_as``. This is the
    *interleaved* layout: it equals ``apply_rope(x, cos, sin, layout="interleaved")``.

    Args:
        x: queries or keys, positions along ``seq_dim``.
        freqs_cis: :math:`e^{im\theta_i}` from :func:`rope_freqs_cis`, ``(L, D/2)`` or
            ``(B, L, D/2)``, broadcast like ``cos`` in :func:`apply_rope`.
        seq_dim: the axis of ``x`` that holds the positions.

    Returns:
        The rotated tensor, same shape, dtype and device as ``x``.

    Shape:
        x: ``(..., L, D)`` or ``(B, L, H, D)`` with ``seq_dim=1``.
        freqs_cis: ``(L, D/2)`` or ``(B, L, D/2)``, complex.
        output: same as ``x``.
    """
    _check_float_tensor("x", x)
    if not isinstance(freqs_cis, Tensor) or not freqs_cis.is_complex():
        raise TypeError(f"freqs_cis must be a complex tensor, got {freqs_cis!r:.60}")
    _check_even_last_dim("x", x)
    s = _normalise_seq_dim(seq_dim, x.ndim)
    compute = torch.complex128 if x.dtype == torch.float64 else torch.complex64
    f = _broadcast_table("freqs_cis", freqs_cis.to(x.device, compute), x, s)  # (.., L, 1.., D/2)
    return _multiply_complex(x, f)
