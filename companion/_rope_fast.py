"""How :func:`companion.rope.apply_rope` computes its rotation (private).

:func:`~companion.rope.apply_rope` validates its arguments, lines the cos/sin table up
with ``x`` and calls :func:`rotate`, which picks one of these ways to compute the same
values:

- inside a caller's ``torch.compile``, inside a ``torch.func`` transform (``vmap``,
  ``grad``), and whenever autograd records: :func:`formula`, the rotation as one
  expression with temporaries (which the caller's compilation fuses, and autograd
  differentiates);
- the interleaved layout: one complex multiplication, :func:`multiply_complex`;
- ``fused=True`` with the half layout: :func:`formula` compiled by ``torch.compile``
  into one loop, :func:`apply_fused`;
- otherwise the half layout is written straight into one output buffer without a
  ``rotate_half(x)`` temporary, :func:`rotate_half_into`, block by block on the CPU so
  that each block stays in cache between its four kernels.

Every path agrees with the others to float rounding; ``tests/test_rope.py`` checks each
one against a float64 loop. Nothing here validates: the caller has.
"""

from __future__ import annotations

import types
from collections.abc import Callable

import torch
from torch import Tensor

__all__: list[str] = []  # private: apply_rope is the documented entry point

BLOCK = 1 << 19  # elements per block of the half-layout out= path (2 MiB of float32)
COMPILED: dict[tuple, Callable[..., Tensor]] = {}  # (dtype, device, D, grad) -> kernel


def rotate(x: Tensor, cos: Tensor, sin: Tensor, layout: str, fused: bool) -> Tensor:
    """RoPE of ``x`` with ``cos``/``sin`` that broadcast against it (right-aligned), on
    its device; the result has ``x``'s dtype."""
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    if cos.dtype != compute:
        cos, sin = cos.to(compute), sin.to(compute)
    if torch.compiler.is_compiling() or torch._C._are_functorch_transforms_active():
        # the caller's torch.compile fuses the plain formula; torch.func transforms
        # cannot batch out= writes or complex views
        return formula(x, cos, sin, layout)
    if layout == "interleaved":  # pairs (x[2i], x[2i+1]) adjacent: a complex multiply
        return multiply_complex(x, torch.complex(cos, sin))
    if fused:
        return apply_fused(x, cos, sin)
    recording = x.requires_grad or cos.requires_grad or sin.requires_grad
    if recording and torch.is_grad_enabled():
        return formula(x, cos, sin)  # autograd cannot record out= writes
    xc = x if x.dtype == compute else x.to(compute)
    out = torch.empty(x.shape, dtype=compute, device=x.device)
    rotate_half_into(out, xc, cos, sin, BLOCK if x.device.type == "cpu" else x.numel())
    return out if x.dtype == compute else out.to(x.dtype)


def formula(x: Tensor, cos: Tensor, sin: Tensor, layout: str = "half") -> Tensor:
    """RoPE as one expression with temporaries: what autograd, ``torch.func`` transforms
    and ``torch.compile`` see. Tables in float32 (float64 for float64 ``x``)."""
    pair_dim, split = (-2, (2, -1)) if layout == "half" else (-1, (-1, 2))
    pairs = x.to(cos.dtype).unflatten(-1, split)  # (..., 2, D/2) or (..., D/2, 2)
    a, b = pairs.unbind(pair_dim)  # (..., D/2): pair i = (a[i], b[i])
    out = torch.stack((a * cos - b * sin, b * cos + a * sin), pair_dim)  # (..., 2, D/2)
    return out.flatten(-2).to(x.dtype)


def rotate_half_into(
    out: Tensor, x: Tensor, cos: Tensor, sin: Tensor, block: int
) -> None:
    """Write the half-layout rotation of ``x`` into ``out``, block by block.

    Each block is rotated with four in-place kernels on its halves; blocks small enough
    to stay in the CPU cache between those kernels mean that memory sees about one read
    of ``x`` and one write of ``out``. ``cos``/``sin`` broadcast against ``x``
    (right-aligned).
    """
    axis = None
    if x.numel() > block:  # the first axis with more than one entry, to split along
        axis = next((a for a in range(x.ndim - 1) if x.shape[a] > 1), None)
    if axis is not None:
        size = x.shape[axis]
        step = max(1, block // (x.numel() // size))
        t_axis = axis - (x.ndim - cos.ndim)  # that axis in the right-aligned table
        split_table = t_axis >= 0 and cos.shape[t_axis] > 1
        for start in range(0, size, step):
            n = min(step, size - start)
            c = cos.narrow(t_axis, start, n) if split_table else cos
            s = sin.narrow(t_axis, start, n) if split_table else sin
            rotate_half_into(
                out.narrow(axis, start, n), x.narrow(axis, start, n), c, s, block
            )
        return
    x1, x2 = x.chunk(2, dim=-1)  # (..., D/2): pair i = (x1[i], x2[i])
    o1, o2 = out.chunk(2, dim=-1)  # views into out: no rotate_half(x) temporary
    torch.mul(x1, cos, out=o1)  # a cos
    o1.addcmul_(x2, sin, value=-1.0)  # a cos - b sin
    torch.mul(x2, cos, out=o2)  # b cos
    o2.addcmul_(x1, sin)  # b cos + a sin


def multiply_complex(x: Tensor, f: Tensor) -> Tensor:
    """``x``'s interleaved pairs times the complex table ``f``, cast back."""
    xr = x.to(f.real.dtype)  # float32 (float64 for float64 x)
    odd = xr.storage_offset() % 2 or any(st % 2 for st in xr.stride()[:-1])
    if xr.stride(-1) != 1 or odd:  # view_as_complex needs pairs adjacent in memory
        xr = xr.contiguous()
    xz = torch.view_as_complex(xr.unflatten(-1, (-1, 2)))  # (..., D/2) complex
    return torch.view_as_real(xz * f).flatten(-2).to(x.dtype)  # (..., D)


def compiled_kernel(x: Tensor) -> Callable[..., Tensor]:
    """The compiled half-layout kernel for what changes its code (built once per key).

    Each key gets its own copy of :func:`formula`'s code object: ``torch.compile`` keeps
    its cache and its limit on recompilations per code object, so one kernel's variants
    (strides, broadcast patterns) cannot use up the budget of another dtype or head
    width.
    """
    key = (x.dtype, x.device.type, x.shape[-1], torch.is_grad_enabled())
    kernel = COMPILED.get(key)
    if kernel is None:
        fn = types.FunctionType(
            formula.__code__.replace(),
            formula.__globals__,
            formula.__name__,
            formula.__defaults__,
        )
        kernel = COMPILED[key] = torch.compile(
            fn, dynamic=False, options={"cpp_cache_precompile_headers": False}
        )
    return kernel


def apply_fused(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Half-layout rotation through the compiled kernel (``cos``/``sin`` broadcastable).

    Every axis but the head width is marked dynamic, so one compiled kernel serves all
    batch sizes, lengths and head counts; the head width stays static, which lets the
    compiler vectorize the inner loop. The marks go on fresh views: the caller's tensors
    are untouched.
    """
    kernel = compiled_kernel(x)
    views = [t.view(t.shape) for t in (x, cos, sin)]
    for t in views:
        torch._dynamo.maybe_mark_dynamic(
            t, [i for i in range(t.ndim - 1) if t.shape[i] > 1]
        )
    try:
        return kernel(*views)
    except Exception as err:  # the compiler toolchain is missing or failed
        reason = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise RuntimeError(
            "apply_rope(fused=True) builds its kernel with torch.compile, which failed "
            f"on {x.device.type} ({type(err).__name__}: {reason[:200]}); use "
            "fused=False, which computes the same values in eager PyTorch"
        ) from err
