r"""Triton kernels: RoPE in one pass, and the FlashAttention forward (appendix :ref:`ch-performance`).

Two kernels written in `Triton <https://triton-lang.org>`_, the language PyTorch itself uses to
generate its GPU kernels. Each has the same arguments and the same contract as its
``companion`` counterpart, and each is selectable from it with ``backend="triton"``:

- :func:`rope` is :func:`companion.rope.apply_rope`: every program (one instance of the kernel)
  loads a block of rows of ``x`` and the cos/sin of their positions, rotates every pair in
  registers, and stores the block: ``x`` is read once and the result written once, the least
  any implementation can move.
- :func:`flash_attention` is :func:`companion.attention.scaled_dot_product_attention` without a
  mask argument (``is_causal`` only), and also returns the log-sum-exp of every row: each
  program holds one block of queries in on-chip memory and streams the keys and values past
  it block by block with the online softmax of :func:`companion.attention.tiled_attention`, so
  the :math:`L \times S` score matrix never exists in memory.

On a machine with a CUDA device they are compiled for the GPU. Without one they run through Triton's
*interpreter*, which executes the same kernel source with NumPy, one program after another:
slow, but exact enough to test the kernels against the references on every machine (the
tests and the appendix do that at small sizes).

``import companion`` does not need Triton; importing this module does
(``pip install triton``, or the ``kernels`` extra: ``pip install -e ".[kernels]"``).
"""

from __future__ import annotations

import math
import os
import sys

import torch
from torch import Tensor

from companion import _validate

# Triton decides when it is imported whether kernels are compiled or interpreted
# (TRITON_INTERPRET). Without a GPU, the interpreter is the only way to run them.
if "triton" not in sys.modules and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

try:
    import triton
    import triton.language as tl
except ImportError as exc:  # pragma: no cover - exercised only without Triton
    raise ImportError(
        "companion.kernels needs Triton: pip install triton (or, from the repository, "
        'pip install -e ".[kernels]")'
    ) from exc

__all__ = ["flash_attention", "rope"]

if not torch.cuda.is_available() and not triton.knobs.runtime.interpret:
    raise ImportError(
        "this machine has no CUDA device, so companion.kernels runs its kernels through "
        "Triton's interpreter, but Triton was imported before companion.kernels without "
        "TRITON_INTERPRET=1: import companion.kernels first, or set TRITON_INTERPRET=1"
    )


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
            f"{name} must be on a {want!r} device (the kernels {mode}), got a tensor on {x.device}"
        )


# ---- RoPE ----------------------------------------------------------------------------


def _rope_kernel(
    x_ptr,
    cos_ptr,
    sin_ptr,
    out_ptr,
    num_rows,  # R: every row of x, a (R, D) matrix
    seq_len,  # L
    inner,  # rows between two positions: 1 for (..., L, D), H for (B, L, H, D)
    rows_per_table,  # rows sharing one cos/sin table (R; R / B for (B, L, D/2) tables)
    table_stride,  # rows of the table per table: 0 (one shared table) or L
    HALF: tl.constexpr,  # D / 2 pairs per row
    BLOCK_ROWS: tl.constexpr,
    BLOCK_PAIRS: tl.constexpr,  # HALF rounded up to a power of two
    INTERLEAVED: tl.constexpr,
    F64: tl.constexpr,
):
    # one program: BLOCK_ROWS rows of x, all their pairs
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)  # (BR,)
    pairs = tl.arange(0, BLOCK_PAIRS)  # (BP,) pair index i
    mask = (rows < num_rows)[:, None] & (pairs < HALF)[None, :]  # (BR, BP)
    # cos/sin of each row's position m: table row (which table, which position)
    position = (rows // inner) % seq_len
    table_row = (rows // rows_per_table) * table_stride + position  # (BR,)
    t = table_row[:, None] * HALF + pairs[None, :]  # (BR, BP)
    if INTERLEAVED:  # pair i is (x[2i], x[2i+1])
        ia, ib = 2 * pairs, 2 * pairs + 1
    else:  # pair i is (x[i], x[i + D/2]): Hugging Face's rotate_half layout
        ia, ib = pairs, pairs + HALF
    xa = x_ptr + rows[:, None] * (2 * HALF) + ia[None, :]  # (BR, BP) addresses
    xb = x_ptr + rows[:, None] * (2 * HALF) + ib[None, :]
    compute = (
        tl.float64 if F64 else tl.float32
    )  # the math in float32 (float64 for float64)
    c = tl.load(cos_ptr + t, mask=mask).to(compute)  # read the table: (BR, BP)
    s = tl.load(sin_ptr + t, mask=mask).to(compute)
    a = tl.load(xa, mask=mask).to(compute)  # read x once
    b = tl.load(xb, mask=mask).to(compute)
    # (a + ib) e^{i m theta} = (a c - b s) + i (b c + a s), in registers
    dtype = out_ptr.dtype.element_ty
    oa = out_ptr + rows[:, None] * (2 * HALF) + ia[None, :]
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
    positions=positions, backend="triton")``, which checks the arguments and calls the
    kernel; equivalent to the default ``apply_rope``: pair :math:`(a, b)` at position
    :math:`m` becomes
    :math:`(a c - b s,\; b c + a s)` with :math:`c = \cos m\theta_i`,
    :math:`s = \sin m\theta_i`, computed in float32 (float64 for float64 input) and stored in
    ``x``'s dtype. Each program rotates a block of rows: it reads those rows of ``x`` and the
    cos/sin rows of their positions, and writes the result; nothing else touches memory.

    Args:
        x: queries or keys, positions along ``seq_dim``, head width last; made contiguous if it
            is not (a copy).
        cos: :math:`\cos(m\theta_i)`, ``(L, D/2)`` shared by the batch or ``(B, L, D/2)``.
        sin: :math:`\sin(m\theta_i)`, same shape as ``cos``.
        layout: ``"half"`` (pairs ``(i, i + D/2)``, Hugging Face) or ``"interleaved"``
            (pairs ``(2i, 2i + 1)``, Meta).
        seq_dim: ``-2`` for ``(..., L, D)``, ``1`` for ``(B, L, H, D)``.
        positions: optional position ids ``(L,)`` or ``(B, L)`` into a ``(T, D/2)`` table.

    Returns:
        The rotated tensor, same shape, dtype and device as ``x``.

    Shape:
        x: ``(..., L, D)`` or ``(B, L, H, D)``; cos, sin: ``(L, D/2)`` or ``(B, L, D/2)``.
    """
    from companion.rope import apply_rope  # one home for RoPE's argument checks

    return apply_rope(
        x,
        cos,
        sin,
        layout=layout,
        seq_dim=seq_dim,
        positions=positions,
        backend="triton",
    )


def rotate(x: Tensor, cos: Tensor, sin: Tensor, layout: str, seq_axis: int) -> Tensor:
    """Launch the RoPE kernel on arguments :func:`companion.rope.apply_rope` has checked:
    ``cos``/``sin`` ``(L, D/2)`` or ``(B, L, D/2)``, positions on axis ``seq_axis``."""
    _check_device("x", x)
    x = x.contiguous()
    s, half = seq_axis, x.shape[-1] // 2
    seq_len = x.shape[s]
    inner = math.prod(x.shape[s + 1 : -1])  # rows between two positions
    rows = x.numel() // x.shape[-1]
    per_batch = cos.dim() == 3 and cos.shape[0] > 1  # (B, L, D/2): a table per sequence
    cos, sin = cos.contiguous(), sin.contiguous()
    out = torch.empty_like(x)
    if rows == 0:
        return out
    block_rows = 16
    grid = (triton.cdiv(rows, block_rows),)
    _ROPE[grid](
        x,
        cos,
        sin,
        out,
        rows,
        seq_len,
        inner,
        rows // x.shape[0] if per_batch else rows,
        seq_len if per_batch else 0,
        HALF=half,
        BLOCK_ROWS=block_rows,
        BLOCK_PAIRS=triton.next_power_of_2(half),
        INTERLEAVED=layout == "interleaved",
        F64=x.dtype == torch.float64,
    )
    return out


# ---- FlashAttention forward ----------------------------------------------------------


def _flash_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    lse_ptr,
    scale,  # log2(e)/sqrt(D), or the caller's scale times log2(e): exp2 is fast
    q_len,  # L
    k_len,  # S
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,  # queries per program
    BLOCK_N: tl.constexpr,  # keys per step of the inner loop
    CAUSAL: tl.constexpr,
    UPCAST: tl.constexpr,  # matrix products in float32 (interpreter, float32 input)
):
    # one program: BLOCK_M queries of one (batch, head); grid (L / BLOCK_M, B * H)
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1).to(
        tl.int64
    )  # which (batch, head): the tensors are (B*H, L|S, D)
    offs_m = start_m + tl.arange(0, BLOCK_M)  # (BM,) query rows
    offs_d = tl.arange(0, HEAD_DIM)  # (D,)
    q_rows = bh * q_len + offs_m
    q = tl.load(
        q_ptr + q_rows[:, None] * HEAD_DIM + offs_d[None, :],
        mask=(offs_m < q_len)[:, None],
    )  # (BM, D): read once, kept on chip for the whole loop
    if UPCAST:
        q = q.to(tl.float32)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)  # running row maximum (base 2)
    l_i = tl.zeros((BLOCK_M,), tl.float32)  # running sum of 2^(s - m)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)  # running sum of 2^(s - m) v
    # causal (top-left, j <= i): key blocks past this block's last query are all masked
    end_n = tl.minimum(k_len, start_m + BLOCK_M) if CAUSAL else k_len
    for start_n in range(0, end_n, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)  # (BN,) key rows
        kv_rows = bh * k_len + offs_n
        kv_mask = (offs_n < k_len)[:, None]
        k = tl.load(k_ptr + kv_rows[:, None] * HEAD_DIM + offs_d[None, :], mask=kv_mask)
        v = tl.load(v_ptr + kv_rows[:, None] * HEAD_DIM + offs_d[None, :], mask=kv_mask)
        if UPCAST:
            k, v = k.to(tl.float32), v.to(tl.float32)
        s = tl.dot(q, tl.trans(k)) * scale  # (BM, BN) scores, in float32, on chip
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
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    # divide once at the end; store the output and each row's log-sum-exp (natural log)
    out = acc / l_i[:, None]
    row_ok = offs_m < q_len
    o_ptrs = out_ptr + q_rows[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
    lse = (m_i + tl.math.log2(l_i)) / 1.4426950408889634  # log2 -> natural log
    tl.store(lse_ptr + q_rows, lse, mask=row_ok)


_FLASH = triton.jit(_flash_kernel)


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
    r"""The FlashAttention forward pass as a Triton kernel; returns the output and the
    log-sum-exp.

    Equivalent to ``scaled_dot_product_attention(query, key, value, is_causal=is_causal,
    scale=scale)`` for the output, and to ``torch.logsumexp(scores, dim=-1)`` of the scaled
    (and masked) scores for the second result, which a backward pass needs to recompute the
    weights. Computed as :func:`companion.attention.tiled_attention` computes it: each
    program keeps ``block_m`` queries on chip and streams ``block_n`` keys and values at a
    time past them, with the online softmax, so memory holds :math:`O(L)` numbers besides the
    inputs and the output. Scores and sums are float32 whatever the input dtype.

    Args:
        query: queries, float16, bfloat16 or float32.
        key: keys, same dtype and ``(B, H)`` as ``query``.
        value: values, same shape as ``key``.
        is_causal: the top-left causal mask ``j <= i`` (as SDPA's ``is_causal``).
        scale: factor on the scores; ``None`` means :math:`1/\sqrt{D}`.
        block_m: queries per program (a power of two >= 16).
        block_n: keys per inner step (a power of two >= 16).

    Returns:
        ``(output, lse)``: output ``(B, H, L, D)`` in ``query``'s dtype and lse ``(B, H, L)``
        in float32.

    Shape:
        query: ``(B, H, L, D)``, ``D`` a power of two from 16 to 256 (64 and 128 are the
        sizes the book measures); key, value: ``(B, H, S, D)``.
    """
    query = _validate.tensor("query", query, ndim=4, meaning="(B, H, L, D)")
    key = _validate.tensor("key", key, ndim=4, meaning="(B, H, S, D)")
    value = _validate.tensor("value", value, ndim=4, meaning="(B, H, S, D)")
    for name, t in (("key", key), ("value", value)):
        _validate.same_dtype(name, t, "query", query)
        _validate.same_device(name, t, "query", query)
    if query.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(
            f"query must be float16, bfloat16 or float32, got a tensor of dtype {query.dtype}"
        )
    if key.shape[:2] != query.shape[:2] or value.shape != key.shape:
        raise ValueError(
            "query, key and value must share (B, H), and value must have key's shape, got "
            f"query {tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}"
        )
    _validate.same_size("query", query, -1, "key", key, -1, "head width D")
    d = query.shape[-1]
    if d not in (16, 32, 64, 128, 256):
        raise ValueError(
            f"query's head width D must be 16, 32, 64, 128 or 256, got {d}"
        )
    is_causal = _validate.flag("is_causal", is_causal)
    scale = _validate.optional(_validate.positive_real, "scale", scale)
    for name, blk in (("block_m", block_m), ("block_n", block_n)):
        blk = _validate.positive_int(name, blk)
        if blk < 16 or blk & (blk - 1):
            raise ValueError(f"{name} must be a power of two >= 16, got {blk}")
    _check_device("query", query)
    b, h, q_len, _ = query.shape
    k_len = key.shape[2]
    out = torch.empty_like(query)
    lse = torch.empty((b, h, q_len), dtype=torch.float32, device=query.device)
    if q_len == 0 or b * h == 0:
        return out, lse
    if (
        k_len == 0
    ):  # no key to attend to: zeros, as a fully masked row (SDPA's math path)
        return out.zero_(), lse.fill_(float("-inf"))
    q, k, v = (t.contiguous() for t in (query, key, value))
    sm_scale = (1.0 / math.sqrt(d)) if scale is None else scale
    grid = (triton.cdiv(q_len, block_m), b * h)
    _FLASH[grid](
        q,
        k,
        v,
        out,
        lse,
        sm_scale * 1.4426950408889634,  # times log2(e): the kernel uses exp2
        q_len,
        k_len,
        HEAD_DIM=d,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        CAUSAL=is_causal,
        UPCAST=query.device.type == "cpu" or query.dtype == torch.float32,
    )
    return out, lse
