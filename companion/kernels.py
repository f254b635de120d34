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
  backend="triton")``; GPT-OSS's learned sink logits as an option, ``sinks=``; keys and
  values of fewer heads than the queries for grouped-query attention), and also
  returns the log-sum-exp of every row: each program holds one block of queries in
  on-chip memory and streams the keys and values past it block by block with the online
  softmax of :func:`companion.attention.tiled_attention`, so the
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

The Triton sources are in private modules, by idea: ``companion._flash`` (the
FlashAttention kernels), ``companion._rope_kernel`` (the RoPE kernel, its launch and its
autograd Function) and ``companion._triton`` (Triton imported, compiled or interpreted);
this module holds the public functions, their argument checks and the FlashAttention
launches and autograd Functions.

``import companion`` does not need Triton; importing this module does
(``pip install triton``, or the ``kernels`` extra: ``pip install -e ".[kernels]"``).
Triton has wheels for Linux only.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

# rotate, interpreted and the private names are re-exported: apply_rope, the tests and
# the appendix find them here
from companion import _flash, _rope_args, _validate
from companion._rope_kernel import launch_rope as _launch_rope  # noqa: F401
from companion._rope_kernel import rotate
from companion._rope_kernel import row_layout as _row_layout  # noqa: F401
from companion._triton import LOG2E, OutOfResources, interpreted, triton  # noqa: F401
from companion._triton import check_device as _check_device

__all__ = ["flash_attention", "rope"]

#: head widths the FlashAttention kernels take (padded on chip to a power of two >= 16)
MAX_HEAD_DIM = 256

# the kernels, as names of this module: _launch finds them here (the tests replace them
# with ones that refuse large blocks)
_FLASH = _flash.FLASH
_FLASH_BWD_PRE = _flash.FLASH_BWD_PRE
_FLASH_BWD_DKDV = _flash.FLASH_BWD_DKDV
_FLASH_BWD_DQ = _flash.FLASH_BWD_DQ
_mm = _flash.mm  # float32 products ("ieee"): tests read its source


# ---- RoPE ----------------------------------------------------------------------------


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


# ---- FlashAttention: launching the kernels ----------------------------------------


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


def _flash_forward(q, k, v, sinks, is_causal, scale, block_m, block_n):
    """The output and the log-sum-exp (the sink's column included when ``sinks``, a
    float32 ``(H,)`` tensor, is given)."""
    b, h, q_len, _ = q.shape
    h_kv, k_len = k.shape[1:3]
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)  # contiguous
    lse = torch.empty((b, h, q_len), dtype=torch.float32, device=q.device)
    if q_len == 0 or b * h == 0:
        return out, lse
    if k_len == 0:  # no key to attend to: zeros, as a fully masked row (SDPA's math);
        # with a sink, all the mass is on it: lse = sigma_h
        lse = lse.fill_(float("-inf")) if sinks is None else lse.copy_(sinks[:, None])
        return out.zero_(), lse
    strides = (*q.stride(), *k.stride(), *v.stride())
    args = (q, k, v, out, lse, sinks, *strides, h, h // h_kv)  # h // h_kv: the group
    _launch(
        _FLASH,
        lambda bm, bn: (triton.cdiv(q_len, bm), h, b),
        (*args, scale * LOG2E, q_len, k_len),  # the kernel uses exp2
        block_m,
        block_n,
        CAUSAL=is_causal,
        HAS_SINKS=sinks is not None,
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
    sinks,
    is_causal,
    scale,
    block_m,
    block_n,
    need_dq=True,
    need_dkdv=True,
    need_dsinks=True,
):
    """dQ, dK, dV and the sinks' gradient (``None`` without sinks); a pass that is not
    needed (its inputs need no gradient) is skipped and gives ``None``."""
    b, h, q_len, d = q.shape
    h_kv, k_len = k.shape[1:3]
    group = h // h_kv if h_kv else 1
    dq = torch.zeros(q.shape, dtype=q.dtype, device=q.device) if need_dq else None
    dk, dv = (
        (torch.zeros(t.shape, dtype=t.dtype, device=t.device) for t in (k, v))
        if need_dkdv
        else (None, None)
    )
    need_dsinks = need_dsinks and sinks is not None
    dsinks = (
        torch.zeros(h, dtype=torch.float32, device=q.device) if need_dsinks else None
    )
    if (
        q_len == 0
        or k_len == 0
        or b * h == 0
        or not (need_dq or need_dkdv or need_dsinks)
    ):
        # no weight on any key (the output is zero, so D = 0 and the sinks get 0 too)
        return dq, dk, dv, dsinks
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
    if need_dsinks:  # d sigma_h = -sum_{b,i} p_sink D_i, p_sink = e^(sigma_h - lse),
        # summed by torch in a fixed order (a kernel would add across programs with
        # atomics, in an order that varies from run to run on a GPU)
        p_sink = torch.exp(sinks[None, :, None] - lse)  # (B, H, L)
        dsinks = -(p_sink * delta).sum(dim=(0, 2))  # (H,)
    if not (need_dq or need_dkdv):
        return dq, dk, dv, dsinks
    # the inner loops read q, k, v and dO many times: contiguous copies (no-ops when
    # they already are) keep those reads simple
    q, k, v, grad_out = (t.contiguous() for t in (q, k, v, grad_out))
    if need_dkdv:
        _launch(
            _FLASH_BWD_DKDV,
            # one program per block of keys of one KV head, summing over its group
            lambda bm, bn: (triton.cdiv(k_len, bn), h_kv, b),
            (q, k, v, grad_out, lse, delta, dk, dv, group, scale, q_len, k_len),
            block_m,
            block_n,
            CAUSAL=is_causal,
            **flags,
        )
    if need_dq:
        _launch(
            _FLASH_BWD_DQ,
            lambda bm, bn: (triton.cdiv(q_len, bm), h, b),
            (q, k, v, grad_out, lse, delta, dq, group, scale, q_len, k_len),
            block_m,
            block_n,
            CAUSAL=is_causal,
            **flags,
        )
    return dq, dk, dv, dsinks


class _FlashAttention(torch.autograd.Function):
    """The FlashAttention forward, and the FlashAttention-2 backward as its gradient.

    Saved for the backward: the inputs, the output and the log-sum-exp (one float per
    query row), never the :math:`L \\times S` weights. Differentiable once: a second
    derivative (the gradient of a gradient taken with ``create_graph=True``) raises a
    ``RuntimeError``, since the backward kernels record no graph."""

    @staticmethod
    def forward(ctx, q, k, v, sinks, is_causal, scale, block_m, block_n):  # type: ignore[override]
        s32 = None if sinks is None else sinks.to(torch.float32).contiguous()
        out, lse = _flash_forward(q, k, v, s32, is_causal, scale, block_m, block_n)
        ctx.save_for_backward(q, k, v, out, lse, s32)
        ctx.args = (is_causal, scale, block_m, block_n)
        ctx.sinks_dtype = None if sinks is None else sinks.dtype
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):  # type: ignore[override]
        q, k, v, out, lse, sinks = ctx.saved_tensors
        need_q, need_k, need_v, need_s = ctx.needs_input_grad[:4]
        # a Function of its own: under create_graph=True it is recorded, connected to
        # q, k, v and dO, and differentiating through it raises instead of silently
        # counting the gradients' own derivative as zero
        dq, dk, dv, ds = _FlashAttentionGrad.apply(
            q,
            k,
            v,
            out,
            lse,
            grad_out,
            sinks,
            ctx.args,
            (need_q, need_k or need_v, need_s),
        )
        ds = None if ds is None else ds.to(ctx.sinks_dtype)
        return dq, dk, dv, ds, None, None, None, None


class _FlashAttentionGrad(torch.autograd.Function):
    """The backward kernels as a node of the graph, whose own gradient raises."""

    @staticmethod
    def forward(ctx, q, k, v, out, lse, grad_out, sinks, args, need):  # type: ignore[override]
        return _flash_backward(q, k, v, out, lse, grad_out, sinks, *args, *need)

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
    sinks: Tensor | None = None,
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

    Grouped-query attention (GQA; multi-query with one KV head): ``key`` and ``value`` may
    have :math:`H_{kv}` heads, a divisor of ``query``'s :math:`H`; query head :math:`h`
    reads KV head :math:`\lfloor h / (H / H_{kv}) \rfloor` (Hugging Face's ``repeat_kv``,
    ``repeat_interleave`` on the head axis; SDPA's ``enable_gqa=True``). The kernels pick
    the KV head in their address arithmetic: the repeated keys and values are never
    formed. In the backward, one program per block of keys of a KV head sums the
    contributions of its group's query heads to dK and dV one head after the other (a
    fixed order: the same bits every run, no atomics).

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

    With ``sinks`` (GPT-OSS's learned sink logits, one :math:`\sigma_h` per head), every
    row's softmax gets one more column, of logit :math:`\sigma_h`, that takes probability
    mass and gives no value; equivalent to the following (the reference,
    :func:`companion.masks.attention_with_sinks`)::

        scores = query @ key.transpose(-2, -1) * scale          # (B, H, L, S), masked
        column = sinks[None, :, None, None].expand(B, H, L, 1)  # the sink, last
        probs = torch.softmax(torch.cat([scores, column], -1), -1)[..., :-1]
        output = probs @ value                                  # rows sum to 1 - p_sink
        lse = torch.logsumexp(torch.cat([scores, column], -1), -1)

    The kernel starts each row's online softmax from the sink's column (running maximum
    :math:`m = \sigma_h`, running sum :math:`\ell = 1`) instead of from nothing
    (:math:`-\infty`, 0), so the stored log-sum-exp includes it and the backward's
    recomputed :math:`P = e^{s - \mathrm{lse}}` are the weights with the sink; dQ, dK
    and dV are then computed as without it. The sink's gradient is
    :math:`\partial\mathcal{L}/\partial\sigma_h = -\sum_{b,i}
    p_{\mathrm{sink},bhi}\,\Delta_{bhi}` with :math:`p_{\mathrm{sink}} =
    e^{\sigma_h - \mathrm{lse}}` (the closed form of
    :func:`companion.masks.sink_gradient`), from the :math:`\Delta` the first backward
    kernel computes, summed by torch in a fixed order. A row with no key to see (only
    when ``S = 0``: the causal mask ``j <= i`` always keeps key 0) puts all its mass on
    the sink: output 0, lse :math:`\sigma_h` (without sinks: 0 and :math:`-\infty`).
    ``sinks=None`` runs the kernels without the sink's code (``HAS_SINKS`` is a
    compile-time flag): the same results, bit for bit, as before it existed (checked
    under the interpreter); a sink of :math:`-\infty` gives the same numbers as none.

    Args:
        query: queries, float16, bfloat16 or float32.
        key: keys, same dtype, batch ``B`` and ``D`` as ``query``; ``H_kv`` heads, a
            divisor of ``query``'s ``H`` (grouped-query attention; ``H_kv = H`` is
            plain multi-head attention).
        value: values, same shape as ``key``.
        is_causal: the top-left causal mask ``j <= i`` (as SDPA's ``is_causal``).
        scale: factor on the scores; ``None`` means :math:`1/\sqrt{D}`.
        block_m: queries per program (a power of two >= 16).
        block_n: keys per inner step (a power of two >= 16). On a GPU whose on-chip
            memory cannot hold the blocks (Triton's ``OutOfResources``), the larger of
            the two is halved until it fits, down to 16 (the same result up to rounding;
            tested with a simulated error, not yet on a GPU).
        sinks: one sink logit per query head, any floating dtype (the kernel reads it in
            float32; its gradient comes back in its dtype), on ``query``'s device, any
            strides; ``None`` for none.

    Returns:
        ``(output, lse)``: output ``(B, H, L, D)`` in ``query``'s dtype, contiguous, and
        lse ``(B, H, L)`` in float32 (the sink's column included).

    Shape:
        query: ``(B, H, L, D)``, ``D`` from 1 to 256 (held on chip padded to a power of
        two >= 16: 80 and 96 run as 128; 64 and 128 are the sizes the book measures);
        key, value: ``(B, H_kv, S, D)`` with ``H % H_kv == 0``; sinks: ``(H,)``.
    """
    query = _validate.tensor("query", query, ndim=4, meaning="(B, H, L, D)")
    key = _validate.tensor("key", key, ndim=4, meaning="(B, H_kv, S, D)")
    value = _validate.tensor("value", value, ndim=4, meaning="(B, H_kv, S, D)")
    for name, t in (("key", key), ("value", value)):
        _validate.same_dtype(name, t, "query", query)
        _validate.same_device(name, t, "query", query)
    if query.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(
            "query must be float16, bfloat16 or float32, got a tensor of dtype "
            f"{query.dtype}"
        )
    _validate.same_size("key", key, 0, "query", query, 0, "batch (B)")
    _validate.same_size("key", key, -1, "query", query, -1, "head width D")
    _validate.shape("value", value, key.shape, "of key (B, H_kv, S, D)")
    # grouped-query attention: H_kv KV heads, each read by H / H_kv query heads
    heads, kv_heads = query.shape[1], key.shape[1]
    if kv_heads or heads:
        _validate.divisor(
            "key's head count H_kv", kv_heads, "query's head count H", heads
        )
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
    if sinks is not None:
        sinks = _validate.tensor("sinks", sinks, ndim=1, meaning="(H,)")
        _validate.same_device("sinks", sinks, "query", query)
        _validate.shape("sinks", sinks, query.shape[1:2], "(H,)")
    _check_device("query", query)
    sm_scale = (1.0 / math.sqrt(d)) if scale is None else scale
    return _FlashAttention.apply(
        query, key, value, sinks, is_causal, sm_scale, block_m, block_n
    )
