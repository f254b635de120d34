r"""Triton kernels: RoPE and FlashAttention, forward and backward (appendix :ref:`ch-performance`).

Kernels written in `Triton <https://triton-lang.org>`_, the language PyTorch itself uses to
generate its GPU kernels. Each has the same arguments and the same contract as its
``companion`` counterpart, and each is selectable from it with ``backend="triton"``:

- :func:`rope` is :func:`companion.rope.apply_rope` (``apply_rope(..., backend="triton")``):
  every program (one instance of the kernel) loads a block of rows of ``x`` and the cos/sin
  of their positions, rotates every pair in registers, and stores the block: ``x`` is read
  once and the result written once, the least any implementation can move. Its gradient is
  the same kernel rotating by :math:`-m\theta_i`.
- :func:`flash_attention` is :func:`companion.attention.scaled_dot_product_attention`
  without a mask argument (``is_causal`` only; ``scaled_dot_product_attention(...,
  backend="triton")``), and also returns the log-sum-exp of every row: each program holds
  one block of queries in on-chip memory and streams the keys and values past it block by
  block with the online softmax of :func:`companion.attention.tiled_attention`, so the
  :math:`L \times S` score matrix never exists in memory. Its gradient is the
  FlashAttention-2 backward (Dao, 2023): the weights are recomputed block by block from
  the stored log-sum-exp, never stored.

Both accept any memory layout (a transposed ``x.view(B, L, H, D).transpose(1, 2)``, a
slice, an expanded tensor): the kernels read through the input's strides and write a new
contiguous result. Both are ``torch.autograd.Function``\ s: ``backward()`` runs the
backward kernels (RoPE's gradient is a RoPE, so derivatives of every order are right; the
attention backward is differentiable once, and a second derivative through it raises).
Float32 inputs are written to be multiplied in full float32 (``tl.dot`` with
``input_precision="ieee"``; by the documentation of ``tl.dot``, Triton's default on NVIDIA
GPUs with tensor cores is TF32, 10 fraction bits).

On a machine with a CUDA device they are compiled for the GPU. Without one they run through
Triton's *interpreter*, which executes the same kernel source with NumPy, one program after
another: slow, and not bit-exact (it converts float32 to bfloat16 by truncation where a GPU
rounds to nearest, so bfloat16 results can differ by one bfloat16 ulp), but close enough
to test the kernels against the references on every machine (the tests and the appendix do
that at small sizes).

What has run where. Every check of these kernels made for the book so far ran through the
interpreter on a CPU: no GPU was available to the sessions that wrote and checked them.
Under the interpreter the attention kernels take their float32 branch for every input
dtype (``_flash_flags``), so three paths have never run anywhere: the 16-bit branch of
``_mm`` (``tl.dot`` on 16-bit operands, which rounds the weights ``P`` to the input's dtype
before ``P V``, where the interpreter multiplies them in float32), ``input_precision="ieee"``
compiled for an NVIDIA GPU, and the halving of the blocks on ``OutOfResources`` on real
hardware (tested by simulating the error). The tests marked ``cuda`` in
``tests/test_kernels.py`` and the GPU goals of ``benchmarks/bench_kernels.py`` are written
for a GPU and have not run; ``benchmarks/recorded/README.md`` lists what is not yet measured.

``import companion`` does not need Triton; importing this module does
(``pip install triton``, or the ``kernels`` extra: ``pip install -e ".[kernels]"``).
Triton has wheels for Linux only.
"""

from __future__ import annotations

import math
import os
import sys

import torch
from torch import Tensor

from companion import _rope_args, _validate

# Triton decides when it is imported whether kernels are compiled or interpreted
# (TRITON_INTERPRET). Without a GPU, the interpreter is the only way to run them.
if "triton" not in sys.modules and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

try:
    import triton
    import triton.language as tl
    from triton.runtime.errors import OutOfResources
except ImportError as exc:  # pragma: no cover - exercised only without Triton
    raise ImportError(
        "companion.kernels needs Triton: pip install triton (or, from the repository, "
        'pip install -e ".[kernels]"); Triton has wheels for Linux only'
    ) from exc

__all__ = ["flash_attention", "rope"]

if not torch.cuda.is_available() and not triton.knobs.runtime.interpret:
    raise ImportError(
        "this machine has no CUDA device, so companion.kernels runs its kernels through "
        "Triton's interpreter, but Triton was imported before companion.kernels without "
        "TRITON_INTERPRET=1: import companion.kernels first, or set TRITON_INTERPRET=1"
    )

LOG2E = 1.4426950408889634  # log2(e): the kernels exponentiate with exp2

#: head widths the FlashAttention kernels take (padded on chip to a power of two >= 16)
MAX_HEAD_DIM = 256


# ---- running a kernel on a device ----------------------------------------------------


def interpreted() -> bool:
    """Whether the kernels run through Triton's interpreter (on CPU tensors) rather than
    compiled for a CUDA GPU. Fixed when Triton is first imported: interpreted when this
    machine has no CUDA device or ``TRITON_INTERPRET=1`` was set."""
    return bool(triton.knobs.runtime.interpret)


def _check_device(name: str, x: Tensor) -> None:
    want = "cpu" if interpreted() else "cuda"
    if x.device.type != want:
        mode = (
            "run through Triton's interpreter, on CPU tensors"
            if want == "cpu"
            else "are compiled for the GPU here, and need CUDA tensors"
        )
        raise ValueError(
            f"{name} must be on a {want!r} device (the kernels {mode}), got a tensor "
            f"on {x.device}"
        )


def _row_layout(x: Tensor) -> tuple[Tensor, list[int], list[int]]:
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
        return _row_layout(x.contiguous())
    pad = 4 - len(sizes)
    return x, [1] * pad + sizes, [0] * pad + strides


# ---- RoPE ----------------------------------------------------------------------------


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


def rope(
    x: Tensor,
    cos: Tensor,
    sin: Tensor,
    *,
    layout: str = "half",
    seq_dim: int = -2,
    positions: Tensor | None = None,
) -> Tensor:
    r"""RoPE in one pass over ``x``: :func:`companion.rope.apply_rope` as a Triton kernel.

    The same as ``apply_rope(x, cos, sin, layout=layout, seq_dim=seq_dim,
    positions=positions, backend="triton")``: the same argument checks, then the
    kernel; equivalent to the default ``apply_rope``: pair :math:`(a, b)` at position
    :math:`m` becomes
    :math:`(a c - b s,\; b c + a s)` with :math:`c = \cos m\theta_i`,
    :math:`s = \sin m\theta_i`, computed in float32 (float64 for float64 input) and stored in
    ``x``'s dtype. Each program rotates a block of rows: it reads those rows of ``x``
    (through ``x``'s strides, whatever its layout) and the cos/sin rows of their positions,
    and writes the result; nothing else touches memory. Differentiable in ``x``: the
    gradient is the rotation by :math:`-m\theta_i` of the output's gradient, the same
    kernel; ``cos`` and ``sin`` get no gradient (a ``ValueError`` if they require one).

    Args:
        x: queries or keys, positions along ``seq_dim``, head width last; any strides.
        cos: :math:`\cos(m\theta_i)`, ``(L, D/2)`` shared by the batch or ``(B, L, D/2)``.
        sin: :math:`\sin(m\theta_i)`, same shape as ``cos``.
        layout: ``"half"`` (pairs ``(i, i + D/2)``, Hugging Face) or ``"interleaved"``
            (pairs ``(2i, 2i + 1)``, Meta).
        seq_dim: ``-2`` for ``(..., L, D)``, ``1`` for ``(B, L, H, D)``.
        positions: optional position ids ``(L,)`` or ``(B, L)`` into a ``(T, D/2)`` table.

    Returns:
        The rotated tensor, same shape, dtype and device as ``x``, contiguous.

    Shape:
        x: ``(..., L, D)`` or ``(B, L, H, D)``; cos, sin: ``(L, D/2)`` or ``(B, L, D/2)``.
    """
    # the checks apply_rope makes (one home, which imports neither module)
    x, table, _, layout, s = _rope_args.rope_arguments(
        x, cos, sin, layout, seq_dim, positions
    )
    return rotate(x, *table, layout, s)


def _launch_rope(
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
    x, n, st = _row_layout(x)
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
        return _launch_rope(x, cos, sin, layout, seq_axis, inverse=inverse)

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
    _check_device("x", x)
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


# ---- FlashAttention forward ----------------------------------------------------------


@triton.jit
def _batch_head():
    # the program's (batch, head) as one int64 index b H + h, from a grid (blocks, H, B)
    return tl.program_id(2).to(tl.int64) * tl.num_programs(1) + tl.program_id(1)


@triton.jit
def _mm(a, b, F32: tl.constexpr):
    # a @ b on chip, summed in float32. Float32 operands: IEEE float32 products, where
    # tl.dot's documented default on NVIDIA GPUs with tensor cores is TF32 (10 fraction
    # bits; the appendix emulates the error: above 1e-4). Otherwise a is cast to b's dtype
    # (the tensor cores take 16-bit inputs; p is rounded to 16 bits before p @ v). The
    # 16-bit branch and the compiled "ieee" branch have not run yet: no GPU so far, and
    # the interpreter always takes the float32 branch (_flash_flags).
    if F32:
        c = tl.dot(a, b, input_precision="ieee")
    else:
        c = tl.dot(a.to(b.dtype), b)
    return c


@triton.jit
def _row_tiles(
    a_ptr,
    b_ptr,
    start,
    length,
    bh,
    offs_d,
    d_ok,
    BLOCK: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    F32: tl.constexpr,
):
    # rows start .. start + BLOCK of one (batch, head) of two contiguous (B, H, len, D)
    # tensors read together (k and v, or q and dO): the rows' offsets, which of them are
    # in range, their rows in (B H len, D), the tile mask, and both tiles (BLOCK, BD),
    # zero outside the mask, in float32 when F32
    offs = start + tl.arange(0, BLOCK)
    ok = offs < length
    rows = bh * length + offs.to(tl.int64)
    mask = ok[:, None] & d_ok[None, :]
    at = rows[:, None] * HEAD_DIM + offs_d[None, :]
    a = tl.load(a_ptr + at, mask=mask, other=0.0)
    b = tl.load(b_ptr + at, mask=mask, other=0.0)
    if F32:
        a, b = a.to(tl.float32), b.to(tl.float32)
    return offs, ok, rows, mask, a, b


def _flash_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,  # (B, H, L, D), contiguous
    lse_ptr,  # (B, H, L), contiguous
    sqb,  # strides of q (batch, head, row, feature); then of k and of v
    sqh,
    sqm,
    sqd,
    skb,
    skh,
    skn,
    skd,
    svb,
    svh,
    svn,
    svd,
    num_heads,  # H
    scale,  # the score scale times log2(e): exp2 is the fast exponential
    q_len,  # L
    k_len,  # S
    HEAD_DIM: tl.constexpr,  # D
    BLOCK_D: tl.constexpr,  # D rounded up to a power of two >= 16 (padded with zeros)
    BLOCK_M: tl.constexpr,  # queries per program
    BLOCK_N: tl.constexpr,  # keys per step of the inner loop
    CAUSAL: tl.constexpr,
    F32: tl.constexpr,  # products of float32 operands (float32 input; the interpreter)
):
    # one program: BLOCK_M queries of one (batch, head); grid (L / BLOCK_M, H, B): a
    # grid's second and third axes hold at most 65535 programs each on a GPU
    start_m = tl.program_id(0) * BLOCK_M
    bh = _batch_head()  # which (batch, head), b H + h; int64 addresses
    b, h = bh // num_heads, bh % num_heads
    q_ptr += b * sqb + h * sqh
    k_ptr += b * skb + h * skh
    v_ptr += b * svb + h * svh
    offs_m = start_m + tl.arange(0, BLOCK_M)  # (BM,) query rows
    offs_d = tl.arange(0, BLOCK_D)  # (BD,) features; those >= D are padding
    d_ok = offs_d < HEAD_DIM
    q = tl.load(
        q_ptr + offs_m.to(tl.int64)[:, None] * sqm + offs_d[None, :] * sqd,
        mask=(offs_m < q_len)[:, None] & d_ok[None, :],
        other=0.0,
    )  # (BM, BD): read once, kept on chip for the whole loop
    if F32:
        q = q.to(tl.float32)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)  # running row maximum (base 2)
    l_i = tl.zeros((BLOCK_M,), tl.float32)  # running sum of 2^(s - m)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)  # running sum of 2^(s - m) v
    # causal (top-left, j <= i): key blocks past this block's last query are all masked
    end_n = tl.minimum(k_len, start_m + BLOCK_M) if CAUSAL else k_len
    for start_n in range(0, end_n, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)  # (BN,) key rows
        kv_mask = (offs_n < k_len)[:, None] & d_ok[None, :]
        rows_n = offs_n.to(tl.int64)[:, None]
        k = tl.load(
            k_ptr + rows_n * skn + offs_d[None, :] * skd, mask=kv_mask, other=0.0
        )
        v = tl.load(
            v_ptr + rows_n * svn + offs_d[None, :] * svd, mask=kv_mask, other=0.0
        )
        if F32:
            k, v = k.to(tl.float32), v.to(tl.float32)
        s = _mm(q, tl.trans(k), F32) * scale  # (BM, BN) scores, float32, on chip
        keep = (offs_n < k_len)[None, :]
        if CAUSAL:
            keep = keep & (offs_n[None, :] <= offs_m[:, None])
        s = tl.where(keep, s, float("-inf"))
        # online softmax: a new maximum rescales the sums so far by 2^(m_old - m_new)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing yet
        p = tl.math.exp2(s - m_safe[:, None])  # (BM, BN)
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + _mm(p, v, F32)
        m_i = m_new
    # divide once at the end; store the output and each row's log-sum-exp (natural log)
    out = acc / l_i[:, None]
    row_ok = offs_m < q_len
    rows_out = bh * q_len + offs_m.to(tl.int64)  # (BM,) rows of (B H L, D)
    o_ptrs = out_ptr + rows_out[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok)
    lse = (m_i + tl.math.log2(l_i)) / 1.4426950408889634  # log2 -> natural log
    tl.store(lse_ptr + rows_out, lse, mask=row_ok)


_FLASH = triton.jit(_flash_kernel)


# ---- FlashAttention backward ---------------------------------------------------------


def _flash_bwd_preprocess(
    o_ptr,  # (B, H, L, D) output, contiguous
    do_ptr,  # its gradient dO, any strides
    delta_ptr,  # (B, H, L) float32: D_i = rowsum(dO * O)
    sdb,
    sdh,
    sdm,
    sdd,
    num_heads,
    q_len,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    # D_i = sum_d dO_id O_id = sum_j P_ij dP_ij: one number per query row
    bh = _batch_head()
    b, h = bh // num_heads, bh % num_heads
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_m < q_len)[:, None] & (offs_d < HEAD_DIM)[None, :]
    rows = bh * q_len + offs_m.to(tl.int64)
    o = tl.load(
        o_ptr + rows[:, None] * HEAD_DIM + offs_d[None, :], mask=mask, other=0.0
    )
    do_ptrs = (
        do_ptr
        + b * sdb
        + h * sdh
        + offs_m.to(tl.int64)[:, None] * sdm
        + offs_d[None, :] * sdd
    )
    do = tl.load(do_ptrs, mask=mask, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(delta_ptr + rows, delta, mask=offs_m < q_len)


def _flash_bwd_dkdv_kernel(
    q_ptr,  # q, k, v, dO: contiguous (B, H, L|S, D)
    k_ptr,
    v_ptr,
    do_ptr,
    lse_ptr,  # (B, H, L) log-sum-exp of the forward (natural log)
    delta_ptr,  # (B, H, L) rowsum(dO * O)
    dk_ptr,  # (B, H, S, D) outputs, contiguous
    dv_ptr,
    scale,  # the score scale (natural units)
    q_len,
    k_len,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,  # queries per step of the inner loop
    BLOCK_N: tl.constexpr,  # keys per program
    CAUSAL: tl.constexpr,
    F32: tl.constexpr,
):
    # one program: BLOCK_N keys (and values) of one (batch, head), kept on chip while
    # every block of queries streams past; grid (S / BLOCK_N, H, B)
    start_n = tl.program_id(0) * BLOCK_N
    bh = _batch_head()
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    offs_n, n_ok, kv_rows, kv_mask, k, v = _row_tiles(
        k_ptr, v_ptr, start_n, k_len, bh, offs_d, d_ok, BLOCK_N, HEAD_DIM, F32
    )
    dk = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    dv = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    # causal: queries before this key block never see it; start at its diagonal block
    start = (start_n // BLOCK_M) * BLOCK_M if CAUSAL else 0
    for start_m in range(start, q_len, BLOCK_M):
        offs_m, m_ok, q_rows, _, q, do = _row_tiles(
            q_ptr, do_ptr, start_m, q_len, bh, offs_d, d_ok, BLOCK_M, HEAD_DIM, F32
        )
        lse = tl.load(lse_ptr + q_rows, mask=m_ok, other=0.0) * 1.4426950408889634
        delta = tl.load(delta_ptr + q_rows, mask=m_ok, other=0.0)
        # recompute P^T for this tile from the stored log-sum-exp: (BN, BM)
        st = _mm(k, tl.trans(q), F32)  # S^T, (BN, BM)
        keep = n_ok[:, None] & m_ok[None, :]
        if CAUSAL:
            keep = keep & (offs_n[:, None] <= offs_m[None, :])
        # masked scores to -inf before the exponential: a masked score far above the
        # row's log-sum-exp would overflow to inf (harmless once masked, but a warning)
        st = tl.where(keep, st * (scale * 1.4426950408889634), float("-inf"))
        pt = tl.math.exp2(st - lse[None, :])  # lse is finite: a row sees key 0
        # dV += P^T dO; dP^T = V dO^T; dS = P * (dP - D); dK += scale dS^T Q
        dv += _mm(pt, do, F32)
        dpt = _mm(v, tl.trans(do), F32)
        dst = pt * (dpt - delta[None, :])
        dk += _mm(dst, q, F32)
    dk = dk * scale
    dk_ptrs = dk_ptr + kv_rows[:, None] * HEAD_DIM + offs_d[None, :]
    dv_ptrs = dv_ptr + kv_rows[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(dk_ptrs, dk.to(dk_ptr.dtype.element_ty), mask=kv_mask)
    tl.store(dv_ptrs, dv.to(dv_ptr.dtype.element_ty), mask=kv_mask)


def _flash_bwd_dq_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    do_ptr,
    lse_ptr,
    delta_ptr,
    dq_ptr,  # (B, H, L, D) output, contiguous
    scale,
    q_len,
    k_len,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,  # queries per program
    BLOCK_N: tl.constexpr,  # keys per step of the inner loop
    CAUSAL: tl.constexpr,
    F32: tl.constexpr,
):
    # one program: BLOCK_M queries (and their dO) on chip, the key blocks streaming past
    # as in the forward; grid (L / BLOCK_M, H, B)
    start_m = tl.program_id(0) * BLOCK_M
    bh = _batch_head()
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    offs_m, m_ok, q_rows, q_mask, q, do = _row_tiles(
        q_ptr, do_ptr, start_m, q_len, bh, offs_d, d_ok, BLOCK_M, HEAD_DIM, F32
    )
    lse = tl.load(lse_ptr + q_rows, mask=m_ok, other=0.0) * 1.4426950408889634
    delta = tl.load(delta_ptr + q_rows, mask=m_ok, other=0.0)
    dq = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    end_n = tl.minimum(k_len, start_m + BLOCK_M) if CAUSAL else k_len
    for start_n in range(0, end_n, BLOCK_N):
        offs_n, n_ok, _, _, k, v = _row_tiles(
            k_ptr, v_ptr, start_n, k_len, bh, offs_d, d_ok, BLOCK_N, HEAD_DIM, F32
        )
        s = _mm(q, tl.trans(k), F32)
        dp = _mm(do, tl.trans(v), F32)
        keep = m_ok[:, None] & n_ok[None, :]
        if CAUSAL:
            keep = keep & (offs_n[None, :] <= offs_m[:, None])
        s = tl.where(keep, s * (scale * 1.4426950408889634), float("-inf"))
        p = tl.math.exp2(s - lse[:, None])  # masked: exactly 0, never inf
        ds = p * (dp - delta[:, None])  # (BM, BN)
        dq += _mm(ds, k, F32)
    dq = dq * scale
    dq_ptrs = dq_ptr + q_rows[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(dq_ptrs, dq.to(dq_ptr.dtype.element_ty), mask=q_mask)


_FLASH_BWD_PRE = triton.jit(_flash_bwd_preprocess)
_FLASH_BWD_DKDV = triton.jit(_flash_bwd_dkdv_kernel)
_FLASH_BWD_DQ = triton.jit(_flash_bwd_dq_kernel)


def _flash_flags(query: Tensor) -> dict:
    d = query.shape[-1]
    fp32 = query.dtype == torch.float32
    return {
        "HEAD_DIM": d,
        "BLOCK_D": max(16, triton.next_power_of_2(d)),
        # the interpreter multiplies bfloat16 as integers: it gets float32 operands, so
        # the 16-bit branch of _mm runs only compiled on a GPU (not run so far)
        "F32": fp32 or query.device.type == "cpu",
    }


def _launch(kernel, grid, args, block_m, block_n=None, **constexprs) -> None:
    """``kernel[grid(block_m, block_n)](*args, BLOCK_M=..., BLOCK_N=..., **constexprs)``.

    A compiled kernel that needs more on-chip memory than the GPU has (Triton's
    ``OutOfResources``: e.g. float32 heads of 128 or 256 with 64 x 64 blocks, whose tiles
    are four bytes a number and are kept in several pipeline stages) is launched again
    with the larger block halved, down to 16. Only the order of the additions (the last
    bits) depends on the blocks.
    Under the interpreter nothing runs out. The halving is tested by simulating the
    error (``tests/test_kernels.py``); which sizes run out on which GPU has not been
    measured (no GPU has run these kernels so far).
    """
    while True:
        blocks = {"BLOCK_M": block_m}
        if block_n is not None:
            blocks["BLOCK_N"] = block_n
        try:
            kernel[grid(block_m, block_n)](*args, **blocks, **constexprs)
            return
        except OutOfResources:
            if max(block_m, block_n or 0) <= 16:
                raise
            if block_n is not None and block_n >= block_m:
                block_n //= 2
            else:
                block_m //= 2


def _flash_forward(q, k, v, is_causal, scale, block_m, block_n):
    b, h, q_len, _ = q.shape
    k_len = k.shape[2]
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)  # contiguous
    lse = torch.empty((b, h, q_len), dtype=torch.float32, device=q.device)
    if q_len == 0 or b * h == 0:
        return out, lse
    if k_len == 0:  # no key to attend to: zeros, as a fully masked row (SDPA's math)
        return out.zero_(), lse.fill_(float("-inf"))
    args = (q, k, v, out, lse, *q.stride(), *k.stride(), *v.stride(), h)
    _launch(
        _FLASH,
        lambda bm, bn: (triton.cdiv(q_len, bm), h, b),
        (*args, scale * LOG2E, q_len, k_len),  # the kernel uses exp2
        block_m,
        block_n,
        CAUSAL=is_causal,
        **_flash_flags(q),
    )
    return out, lse


def _flash_backward(
    q,
    k,
    v,
    out,
    lse,
    grad_out,
    is_causal,
    scale,
    block_m,
    block_n,
    need_dq=True,
    need_dkdv=True,
):
    """dQ, dK, dV; a pass that is not needed (its inputs need no gradient) is skipped and
    gives ``None``."""
    b, h, q_len, d = q.shape
    k_len = k.shape[2]
    dq = torch.zeros(q.shape, dtype=q.dtype, device=q.device) if need_dq else None
    dk, dv = (
        (torch.zeros(t.shape, dtype=t.dtype, device=t.device) for t in (k, v))
        if need_dkdv
        else (None, None)
    )
    if q_len == 0 or k_len == 0 or b * h == 0 or not (need_dq or need_dkdv):
        return dq, dk, dv  # no weight anywhere: nothing flows back
    flags = _flash_flags(q)
    delta = torch.empty((b, h, q_len), dtype=torch.float32, device=q.device)
    _launch(
        _FLASH_BWD_PRE,
        lambda bm, _: (triton.cdiv(q_len, bm), h, b),
        (out, grad_out, delta, *grad_out.stride(), h, q_len),
        block_m,
        HEAD_DIM=d,
        BLOCK_D=flags["BLOCK_D"],
    )
    # the inner loops read q, k, v and dO many times: contiguous copies (no-ops when
    # they already are) keep those reads simple
    q, k, v, grad_out = (t.contiguous() for t in (q, k, v, grad_out))
    if need_dkdv:
        _launch(
            _FLASH_BWD_DKDV,
            lambda bm, bn: (triton.cdiv(k_len, bn), h, b),
            (q, k, v, grad_out, lse, delta, dk, dv, scale, q_len, k_len),
            block_m,
            block_n,
            CAUSAL=is_causal,
            **flags,
        )
    if need_dq:
        _launch(
            _FLASH_BWD_DQ,
            lambda bm, bn: (triton.cdiv(q_len, bm), h, b),
            (q, k, v, grad_out, lse, delta, dq, scale, q_len, k_len),
            block_m,
            block_n,
            CAUSAL=is_causal,
            **flags,
        )
    return dq, dk, dv


class _FlashAttention(torch.autograd.Function):
    """The FlashAttention forward, and the FlashAttention-2 backward as its gradient.

    Saved for the backward: the inputs, the output and the log-sum-exp (one float per
    query row), never the :math:`L \\times S` weights. Differentiable once: a second
    derivative (the gradient of a gradient taken with ``create_graph=True``) raises a
    ``RuntimeError``, since the backward kernels record no graph."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal, scale, block_m, block_n):  # type: ignore[override]
        out, lse = _flash_forward(q, k, v, is_causal, scale, block_m, block_n)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (is_causal, scale, block_m, block_n)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):  # type: ignore[override]
        q, k, v, out, lse = ctx.saved_tensors
        need_q, need_k, need_v = ctx.needs_input_grad[:3]
        # a Function of its own: under create_graph=True it is recorded, connected to
        # q, k, v and dO, and differentiating through it raises instead of silently
        # counting the gradients' own derivative as zero
        dq, dk, dv = _FlashAttentionGrad.apply(
            q, k, v, out, lse, grad_out, ctx.args, (need_q, need_k or need_v)
        )
        return dq, dk, dv, None, None, None, None


class _FlashAttentionGrad(torch.autograd.Function):
    """The backward kernels as a node of the graph, whose own gradient raises."""

    @staticmethod
    def forward(ctx, q, k, v, out, lse, grad_out, args, need):  # type: ignore[override]
        return _flash_backward(q, k, v, out, lse, grad_out, *args, *need)

    @staticmethod
    def backward(ctx, *grads):  # type: ignore[override]
        raise RuntimeError(
            "flash_attention (backend='triton') is differentiable once: its backward "
            "kernels have no gradient of their own, so a gradient taken with "
            "create_graph=True cannot be differentiated again; use backend='torch' "
            "for second derivatives"
        )


def flash_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    block_m: int = 64,
    block_n: int = 64,
) -> tuple[Tensor, Tensor]:
    r"""FlashAttention as Triton kernels; returns the output and the log-sum-exp.

    Equivalent to ``scaled_dot_product_attention(query, key, value, is_causal=is_causal,
    scale=scale)`` for the output, and to ``torch.logsumexp(scores, dim=-1)`` of the scaled
    (and masked) scores for the second result, which the backward pass uses to recompute
    the weights. Computed as :func:`companion.attention.tiled_attention` computes it: each
    program keeps ``block_m`` queries on chip and streams ``block_n`` keys and values at a
    time past them, with the online softmax, so memory holds :math:`O(L)` numbers besides
    the inputs and the output. Scores, sums and products are summed in float32 whatever
    the input dtype; float32 inputs are multiplied in full float32
    (``input_precision="ieee"``, not TF32), and 16-bit inputs in their own dtype on a
    GPU's tensor cores (the weights rounded to it before they multiply the values).
    Inputs of any strides (e.g. ``x.view(B, L, H, D).transpose(1, 2)``) are read through
    their strides; the output is a new contiguous ``(B, H, L, D)`` tensor. Checked so far
    through Triton's interpreter only, which multiplies every dtype in float32: the
    compiled path, the 16-bit products included, has not run on a GPU yet (module
    docstring).

    Differentiable in ``query``, ``key`` and ``value`` (the output; the log-sum-exp is
    not): the backward is FlashAttention-2's (Dao, 2023). A first kernel computes
    :math:`\Delta_i = \sum_d dO_{id} O_{id}`; a second keeps a block of keys and values on
    chip and streams the query blocks past it, recomputing :math:`P = e^{s - \mathrm{lse}}`
    tile by tile to accumulate :math:`dV = P^\top dO` and :math:`dK = \mathrm{scale}\,
    dS^\top Q` with :math:`dS = P \circ (dP - \Delta)`, :math:`dP = dO\,V^\top`; a third
    keeps a block of queries and streams the keys for :math:`dQ = \mathrm{scale}\,dS\,K`.
    Causal masking skips the tiles above the diagonal in all three; a pass whose inputs
    need no gradient is skipped. Differentiable once: differentiating the gradients again
    (``create_graph=True``) raises a ``RuntimeError`` instead of counting their
    derivative as zero.

    Args:
        query: queries, float16, bfloat16 or float32.
        key: keys, same dtype and ``(B, H)`` as ``query``.
        value: values, same shape as ``key``.
        is_causal: the top-left causal mask ``j <= i`` (as SDPA's ``is_causal``).
        scale: factor on the scores; ``None`` means :math:`1/\sqrt{D}`.
        block_m: queries per program (a power of two >= 16).
        block_n: keys per inner step (a power of two >= 16). On a GPU whose on-chip
            memory cannot hold the blocks (Triton's ``OutOfResources``), the larger of
            the two is halved until it fits, down to 16 (the same result up to rounding;
            tested with a simulated error, not yet on a GPU).

    Returns:
        ``(output, lse)``: output ``(B, H, L, D)`` in ``query``'s dtype, contiguous, and
        lse ``(B, H, L)`` in float32.

    Shape:
        query: ``(B, H, L, D)``, ``D`` from 1 to 256 (held on chip padded to a power of
        two >= 16: 80 and 96 run as 128; 64 and 128 are the sizes the book measures);
        key, value: ``(B, H, S, D)``.
    """
    query = _validate.tensor("query", query, ndim=4, meaning="(B, H, L, D)")
    key = _validate.tensor("key", key, ndim=4, meaning="(B, H, S, D)")
    value = _validate.tensor("value", value, ndim=4, meaning="(B, H, S, D)")
    for name, t in (("key", key), ("value", value)):
        _validate.same_dtype(name, t, "query", query)
        _validate.same_device(name, t, "query", query)
    if query.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(
            "query must be float16, bfloat16 or float32, got a tensor of dtype "
            f"{query.dtype}"
        )
    if key.shape[:2] != query.shape[:2] or value.shape != key.shape:
        raise ValueError(
            "query, key and value must share (B, H), and value must have key's shape, "
            f"got query {tuple(query.shape)}, key {tuple(key.shape)}, value "
            f"{tuple(value.shape)}"
        )
    _validate.same_size("query", query, -1, "key", key, -1, "head width D")
    d = query.shape[-1]
    if not 1 <= d <= MAX_HEAD_DIM:
        raise ValueError(
            f"query's head width D must be from 1 to {MAX_HEAD_DIM} (a block of queries "
            f"is held on chip), got {d}"
        )
    is_causal = _validate.flag("is_causal", is_causal)
    scale = _validate.optional(_validate.positive_real, "scale", scale)
    for name, blk in (("block_m", block_m), ("block_n", block_n)):
        blk = _validate.positive_int(name, blk)
        if blk < 16 or blk & (blk - 1):
            raise ValueError(f"{name} must be a power of two >= 16, got {blk}")
    _check_device("query", query)
    sm_scale = (1.0 / math.sqrt(d)) if scale is None else scale
    return _FlashAttention.apply(
        query, key, value, is_causal, sm_scale, block_m, block_n
    )
