"""The FlashAttention kernels of :func:`companion.kernels.flash_attention`: the Triton
sources of the forward and of the FlashAttention-2 backward (private; the wrappers that
check the arguments, launch these and make them an autograd Function are in
:mod:`companion.kernels`)."""

from __future__ import annotations

from companion._triton import tl, triton

__all__ = ["FLASH", "FLASH_BWD_DKDV", "FLASH_BWD_DQ", "FLASH_BWD_PRE", "mm"]


@triton.jit
def batch_head():
    # the program's (batch, head) as one int64 index b H + h, from a grid (blocks, H, B)
    return tl.program_id(2).to(tl.int64) * tl.num_programs(1) + tl.program_id(1)


@triton.jit
def mm(a, b, F32: tl.constexpr):
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
def row_tiles(
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
    # rows start .. start + BLOCK of one (batch, head), bh = b heads + head, of two
    # contiguous (B, heads, len, D) tensors read together (k and v, or q and dO): the
    # rows' offsets, which of them are in range, their rows in (B heads len, D), the
    # tile mask, and both tiles (BLOCK, BD), zero outside the mask, in float32 when F32
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
    sinks_ptr,  # (H,) float32 sink logits (natural units), when HAS_SINKS
    sqb,  # strides of q (batch, head, row, feature); then of k and of v, (B, H_kv, S, D)
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
    group,  # H / H_kv, the query heads that share one KV head (1: one KV head each)
    scale,  # the score scale times log2(e): exp2 is the fast exponential
    q_len,  # L
    k_len,  # S
    HEAD_DIM: tl.constexpr,  # D
    BLOCK_D: tl.constexpr,  # D rounded up to a power of two >= 16 (padded with zeros)
    BLOCK_M: tl.constexpr,  # queries per program
    BLOCK_N: tl.constexpr,  # keys per step of the inner loop
    CAUSAL: tl.constexpr,
    F32: tl.constexpr,  # products of float32 operands (float32 input; the interpreter)
    HAS_SINKS: tl.constexpr,  # a sink column per head (GPT-OSS)
):
    # one program: BLOCK_M queries of one (batch, head); grid (L / BLOCK_M, H, B): a
    # grid's second and third axes hold at most 65535 programs each on a GPU
    start_m = tl.program_id(0) * BLOCK_M
    bh = batch_head()  # which (batch, head), b H + h; int64 addresses
    b, h = bh // num_heads, bh % num_heads
    kv_head = h // group  # grouped-query: heads h of one group read one KV head
    q_ptr += b * sqb + h * sqh
    k_ptr += b * skb + kv_head * skh
    v_ptr += b * svb + kv_head * svh
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
    # with a sink, the row starts from its column: m = sigma_h, l = 2^(sigma_h - m) = 1;
    # it adds to the sum and nothing to acc (it gives no value)
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + h).to(tl.float32) * 1.4426950408889634  # base 2
        m_i = tl.zeros((BLOCK_M,), tl.float32) + sink  # running row maximum (base 2)
        l_i = tl.full((BLOCK_M,), 1.0, tl.float32)  # running sum of 2^(s - m)
    else:  # nothing seen yet: m = -inf, l = 0
        m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
        l_i = tl.zeros((BLOCK_M,), tl.float32)
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
        s = mm(q, tl.trans(k), F32) * scale  # (BM, BN) scores, float32, on chip
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
        acc = acc * alpha[:, None] + mm(p, v, F32)
        m_i = m_new
    # divide once at the end; store the output and each row's log-sum-exp (natural log)
    out = acc / l_i[:, None]
    row_ok = offs_m < q_len
    rows_out = bh * q_len + offs_m.to(tl.int64)  # (BM,) rows of (B H L, D)
    o_ptrs = out_ptr + rows_out[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok)
    lse = (m_i + tl.math.log2(l_i)) / 1.4426950408889634  # log2 -> natural log
    tl.store(lse_ptr + rows_out, lse, mask=row_ok)


FLASH = triton.jit(_flash_kernel)

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
    bh = batch_head()
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
    q_ptr,  # q, dO: contiguous (B, H, L, D); k, v: contiguous (B, H_kv, S, D)
    k_ptr,
    v_ptr,
    do_ptr,
    lse_ptr,  # (B, H, L) log-sum-exp of the forward (natural log)
    delta_ptr,  # (B, H, L) rowsum(dO * O)
    dk_ptr,  # (B, H_kv, S, D) outputs, contiguous
    dv_ptr,
    group,  # H / H_kv: the query heads that read this program's KV head
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
    # one program: BLOCK_N keys (and values) of one (batch, KV head), kept on chip while
    # every block of queries of each query head of its group streams past; grid
    # (S / BLOCK_N, H_kv, B). The group's heads are summed one after the other, in the
    # same order every run: no two programs write to the same place, no atomics
    start_n = tl.program_id(0) * BLOCK_N
    bkv = batch_head()  # b H_kv + (KV head)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    offs_n, n_ok, kv_rows, kv_mask, k, v = row_tiles(
        k_ptr, v_ptr, start_n, k_len, bkv, offs_d, d_ok, BLOCK_N, HEAD_DIM, F32
    )
    dk = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    dv = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    # causal: queries before this key block never see it; start at its diagonal block
    start = (start_n // BLOCK_M) * BLOCK_M if CAUSAL else 0
    for g in range(0, group):
        bh = bkv * group + g  # b H + h: query head h = (KV head) group + g
        for start_m in range(start, q_len, BLOCK_M):
            offs_m, m_ok, q_rows, _, q, do = row_tiles(
                q_ptr, do_ptr, start_m, q_len, bh, offs_d, d_ok, BLOCK_M, HEAD_DIM, F32
            )
            lse = tl.load(lse_ptr + q_rows, mask=m_ok, other=0.0) * 1.4426950408889634
            delta = tl.load(delta_ptr + q_rows, mask=m_ok, other=0.0)
            # recompute P^T for this tile from the stored log-sum-exp: (BN, BM)
            st = mm(k, tl.trans(q), F32)  # S^T, (BN, BM)
            keep = n_ok[:, None] & m_ok[None, :]
            if CAUSAL:
                keep = keep & (offs_n[:, None] <= offs_m[None, :])
            # masked scores to -inf before the exponential: a masked score far above
            # the row's log-sum-exp would overflow to inf (harmless once masked, but a
            # warning)
            st = tl.where(keep, st * (scale * 1.4426950408889634), float("-inf"))
            pt = tl.math.exp2(st - lse[None, :])  # lse is finite: a row sees key 0
            # dV += P^T dO; dP^T = V dO^T; dS = P * (dP - D); dK += scale dS^T Q
            dv += mm(pt, do, F32)
            dpt = mm(v, tl.trans(do), F32)
            dst = pt * (dpt - delta[None, :])
            dk += mm(dst, q, F32)
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
    group,  # H / H_kv
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
    # one program: BLOCK_M queries (and their dO) on chip, the key blocks of its KV head
    # streaming past as in the forward; grid (L / BLOCK_M, H, B)
    start_m = tl.program_id(0) * BLOCK_M
    bh = batch_head()
    # its KV head: b H + h = (b H_kv + h // group) group + h % group, as H = H_kv group
    bkv = bh // group
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    offs_m, m_ok, q_rows, q_mask, q, do = row_tiles(
        q_ptr, do_ptr, start_m, q_len, bh, offs_d, d_ok, BLOCK_M, HEAD_DIM, F32
    )
    lse = tl.load(lse_ptr + q_rows, mask=m_ok, other=0.0) * 1.4426950408889634
    delta = tl.load(delta_ptr + q_rows, mask=m_ok, other=0.0)
    dq = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    end_n = tl.minimum(k_len, start_m + BLOCK_M) if CAUSAL else k_len
    for start_n in range(0, end_n, BLOCK_N):
        offs_n, n_ok, _, _, k, v = row_tiles(
            k_ptr, v_ptr, start_n, k_len, bkv, offs_d, d_ok, BLOCK_N, HEAD_DIM, F32
        )
        s = mm(q, tl.trans(k), F32)
        dp = mm(do, tl.trans(v), F32)
        keep = m_ok[:, None] & n_ok[None, :]
        if CAUSAL:
            keep = keep & (offs_n[None, :] <= offs_m[:, None])
        s = tl.where(keep, s * (scale * 1.4426950408889634), float("-inf"))
        p = tl.math.exp2(s - lse[:, None])  # masked: exactly 0, never inf
        ds = p * (dp - delta[:, None])  # (BM, BN)
        dq += mm(ds, k, F32)
    dq = dq * scale
    dq_ptrs = dq_ptr + q_rows[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(dq_ptrs, dq.to(dq_ptr.dtype.element_ty), mask=q_mask)


FLASH_BWD_PRE = triton.jit(_flash_bwd_preprocess)
FLASH_BWD_DKDV = triton.jit(_flash_bwd_dkdv_kernel)
FLASH_BWD_DQ = triton.jit(_flash_bwd_dq_kernel)
