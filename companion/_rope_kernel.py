"""The RoPE kernel of :func:`companion.kernels.rope`: the Triton source, its launch and
its autograd Function (private; ``companion.kernels.rope`` and ``apply_rope(...,
backend="triton")`` are the entry points)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from companion._triton import check_device, tl, triton

__all__ = ["launch_rope", "rotate", "row_layout"]


def row_layout(x: Tensor) -> tuple[Tensor, list[int], list[int]]:
    """``x``'s rows (every axis but the last) as at most four (size, stride) axes.

    Adjacent axes that step through memory as one are merged, so the kernel finds any
    row of any layout (transposed, sliced, expanded) from its index in row-major order.
    A layout that still needs more than four axes is copied to a contiguous one.
    """
    sizes, strides = [], []
    for n, st in zip(x.shape[:-1], x.stride()[:-1], strict=True):
        if n == 1:
            continue  # a size-1 axis never moves the address
        if sizes and strides[-1] == n * st:  # mergeable with the axis before it
            sizes[-1], strides[-1] = sizes[-1] * n, st
        else:
            sizes.append(n)
            strides.append(st)
    if len(sizes) > 4:
        return row_layout(x.contiguous())
    pad = 4 - len(sizes)
    return x, [1] * pad + sizes, [0] * pad + strides


def _rope_kernel(
    x_ptr,
    cos_ptr,
    sin_ptr,
    out_ptr,
    num_rows,  # R: every row of x, a (R, D) matrix in row-major order
    n1,  # x's rows as four axes (n0, n1, n2, n3), n0 implied; strides s0..s3
    n2,
    n3,
    s0,
    s1,
    s2,
    s3,
    sd,  # stride of x's last axis (1 unless sliced)
    seq_len,  # L
    inner,  # rows between two positions: 1 for (..., L, D), H for (B, L, H, D)
    rows_per_table,  # rows sharing one cos/sin table (R; R / B for (B, L, D/2) tables)
    table_stride,  # rows of the table per table: 0 (one shared table) or L
    HALF: tl.constexpr,  # D / 2 pairs per row
    BLOCK_ROWS: tl.constexpr,
    BLOCK_PAIRS: tl.constexpr,  # HALF rounded up to a power of two
    INTERLEAVED: tl.constexpr,
    INVERSE: tl.constexpr,  # rotate by -m theta: the gradient
    F64: tl.constexpr,
):
    # one program: BLOCK_ROWS rows of x, all their pairs; int64 indices (R D > 2^31)
    start = tl.program_id(0).to(tl.int64) * BLOCK_ROWS
    rows = start + tl.arange(0, BLOCK_ROWS).to(tl.int64)  # (BR,) row index r
    pairs = tl.arange(0, BLOCK_PAIRS)  # (BP,) pair index i
    mask = (rows < num_rows)[:, None] & (pairs < HALF)[None, :]  # (BR, BP)
    # cos/sin of each row's position m: table row (which table, which position)
    position = (rows // inner) % seq_len
    table_row = (rows // rows_per_table) * table_stride + position  # (BR,)
    t = table_row[:, None] * HALF + pairs[None, :]  # (BR, BP)
    # where row r starts in memory: its four indices times x's strides
    i3 = rows % n3
    i2 = (rows // n3) % n2
    i1 = (rows // (n3 * n2)) % n1
    i0 = rows // (n3 * n2 * n1)
    base = i0 * s0 + i1 * s1 + i2 * s2 + i3 * s3  # (BR,)
    if INTERLEAVED:  # pair i is (x[2i], x[2i+1])
        ia, ib = 2 * pairs, 2 * pairs + 1
    else:  # pair i is (x[i], x[i + D/2]): Hugging Face's rotate_half layout
        ia, ib = pairs, pairs + HALF
    xa = x_ptr + base[:, None] + ia[None, :] * sd  # (BR, BP) addresses
    xb = x_ptr + base[:, None] + ib[None, :] * sd
    compute = tl.float64 if F64 else tl.float32  # the math in float32 (or float64)
    c = tl.load(cos_ptr + t, mask=mask, other=0.0).to(compute)  # the table: (BR, BP)
    s = tl.load(sin_ptr + t, mask=mask, other=0.0).to(compute)
    if INVERSE:  # R(-m theta) = R(m theta)^T undoes the rotation: the gradient
        s = -s
    a = tl.load(xa, mask=mask, other=0.0).to(compute)  # read x once
    b = tl.load(xb, mask=mask, other=0.0).to(compute)
    # (a + ib) e^{i m theta} = (a c - b s) + i (b c + a s), in registers
    dtype = out_ptr.dtype.element_ty
    oa = out_ptr + rows[:, None] * (2 * HALF) + ia[None, :]  # out is contiguous
    ob = out_ptr + rows[:, None] * (2 * HALF) + ib[None, :]
    tl.store(oa, (a * c - b * s).to(dtype), mask=mask)  # write the result once
    tl.store(ob, (b * c + a * s).to(dtype), mask=mask)


_ROPE = triton.jit(_rope_kernel)


def launch_rope(
    x: Tensor,
    cos: Tensor,
    sin: Tensor,
    layout: str,
    seq_axis: int,
    inverse: bool,
) -> Tensor:
    """Run the RoPE kernel once: ``x`` of any strides in, a contiguous result out."""
    half = x.shape[-1] // 2
    seq_len = x.shape[seq_axis]
    inner = math.prod(x.shape[seq_axis + 1 : -1])  # rows between two positions
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    per_batch = cos.dim() == 3 and cos.shape[0] > 1  # (B, L, D/2): a table per sequence
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)  # contiguous
    if rows == 0:
        return out
    x, n, st = row_layout(x)
    block_rows = 16
    grid = (triton.cdiv(rows, block_rows),)
    _ROPE[grid](
        x,
        cos,
        sin,
        out,
        rows,
        n[1],
        n[2],
        n[3],
        *st,
        x.stride(-1),
        seq_len,
        inner,
        rows // out.shape[0] if per_batch else rows,
        seq_len if per_batch else 0,
        HALF=half,
        BLOCK_ROWS=block_rows,
        BLOCK_PAIRS=triton.next_power_of_2(half),
        INTERLEAVED=layout == "interleaved",
        INVERSE=inverse,
        F64=x.dtype == torch.float64,
    )
    return out


class _Rope(torch.autograd.Function):
    """RoPE by :math:`\\pm m\\theta_i`, with its gradient: the rotation the other way
    (the transpose), itself a ``_Rope``, so gradients of any order are right (RoPE is
    linear in ``x``: ``create_graph=True`` records the backward rotation)."""

    @staticmethod
    def forward(ctx, x, cos, sin, layout, seq_axis, inverse):  # type: ignore[override]
        ctx.save_for_backward(cos, sin)
        ctx.args = (layout, seq_axis, inverse)
        return launch_rope(x, cos, sin, layout, seq_axis, inverse=inverse)

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        cos, sin = ctx.saved_tensors
        layout, seq_axis, inverse = ctx.args
        grad_x = _Rope.apply(grad_out, cos, sin, layout, seq_axis, not inverse)
        return grad_x, None, None, None, None, None


def rotate(x: Tensor, cos: Tensor, sin: Tensor, layout: str, seq_axis: int) -> Tensor:
    """Launch the RoPE kernel on arguments :func:`companion.rope.apply_rope` has checked:
    ``cos``/``sin`` ``(L, D/2)`` or ``(B, L, D/2)``, positions on axis ``seq_axis``
    (non-negative). Differentiable in ``x``."""
    check_device("x", x)
    if torch.is_grad_enabled():
        for name, t in (("cos", cos), ("sin", sin)):
            if t.requires_grad:
                raise ValueError(
                    f"{name} must not require grad with backend='triton' (the kernel "
                    "differentiates x only), got a tensor with requires_grad=True: "
                    "use backend='torch'"
                )
    cos, sin = cos.contiguous(), sin.contiguous()
    return _Rope.apply(x, cos, sin, layout, seq_axis, False)
