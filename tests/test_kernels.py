"""The Triton kernels (companion/kernels.py) against independent references: a float64 loop
written from RoPE's formula, and torch's scaled_dot_product_attention and logsumexp.

Without a GPU the kernels run through Triton's interpreter on CPU tensors (small sizes: the
interpreter is slow); on a CUDA machine they are compiled, and the same tests run on the GPU,
plus the sizes the book measures (head dims 64 and 128, fp16/bf16/fp32). No CUDA run has been
made yet (no GPU so far): the tests marked ``cuda`` have never run, and under the interpreter
the attention kernels take their float32 branch for every dtype, so their 16-bit branch is
untested (benchmarks/recorded/README.md lists what is not yet measured)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from companion.rope import apply_rope, rope_cos_sin, rope_frequencies

kernels = pytest.importorskip("companion.kernels", reason="Triton is not installed")

DEVICE = torch.device("cpu" if kernels.interpreted() else "cuda")
FLOATS = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


# ---- RoPE: a float64 loop over rows and pairs ----------------------------------------------


def rope_loop(
    x: torch.Tensor, positions: torch.Tensor, base: float, layout: str
) -> torch.Tensor:
    """(a, b) at position m -> (a cos m theta_i - b sin, b cos + a sin), one pair at a time."""
    *lead, length, d = x.shape
    out = x.double().clone(memory_format=torch.contiguous_format)  # reshape: a view
    flat_x, flat_out = x.double().reshape(-1, length, d), out.reshape(-1, length, d)
    pos = positions.expand(*lead, length).reshape(-1, length)
    for r in range(flat_x.shape[0]):
        for t in range(length):
            m = float(pos[r, t])
            for i in range(d // 2):
                theta = base ** (-2 * i / d)
                c, s = math.cos(m * theta), math.sin(m * theta)
                ia, ib = (
                    (2 * i, 2 * i + 1) if layout == "interleaved" else (i, i + d // 2)
                )
                a, b = flat_x[r, t, ia].item(), flat_x[r, t, ib].item()
                flat_out[r, t, ia], flat_out[r, t, ib] = a * c - b * s, b * c + a * s
    return out


TOL = {
    torch.float64: 1e-12,
    torch.float32: 2e-6,
    torch.float16: 2e-3,
    torch.bfloat16: 2e-2,
}


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_rope_matches_the_formula(layout: str, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 7, 8, generator=gen).to(DEVICE, dtype)
    positions = torch.tensor([0, 1, 2, 5, 9, 100, 4000])
    table = torch.float64 if dtype == torch.float64 else torch.float32
    freqs = rope_frequencies(8, base=10000.0)
    cos, sin = rope_cos_sin(positions, freqs, dtype=table, device=DEVICE)
    got = kernels.rope(x, cos, sin, layout=layout)
    assert got.dtype == dtype and got.shape == x.shape and got.device == x.device
    want = rope_loop(x.cpu(), positions, 10000.0, layout)
    torch.testing.assert_close(
        got.cpu().double(), want, atol=TOL[dtype], rtol=TOL[dtype]
    )


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_rope_equals_apply_rope_for_every_table_form(layout: str) -> None:
    gen = torch.Generator().manual_seed(1)
    freqs = rope_frequencies(16, base=500.0)
    table = rope_cos_sin(torch.arange(40), freqs, device=DEVICE)
    ids = torch.randint(0, 40, (2, 9), generator=gen).to(DEVICE)
    cases = [
        (torch.randn(2, 4, 9, 16, generator=gen), {}, table[0][:9], table[1][:9]),
        (
            torch.randn(2, 9, 4, 16, generator=gen),
            {"seq_dim": 1},
            table[0][:9],
            table[1][:9],
        ),
        (torch.randn(2, 4, 9, 16, generator=gen), {"positions": ids}, *table),
        (torch.randn(9, 16, generator=gen), {}, table[0][:9], table[1][:9]),
        (
            torch.randn(2, 4, 9, 16, generator=gen),
            {},
            *rope_cos_sin(ids.double(), freqs, device=DEVICE),
        ),  # a (B, L, D/2) table: one per sequence
    ]
    for x, kwargs, cos, sin in cases:
        x = x.to(DEVICE)
        got = kernels.rope(x, cos, sin, layout=layout, **kwargs)
        want = apply_rope(x, cos, sin, layout=layout, **kwargs)
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


def test_rope_of_a_non_contiguous_input_and_of_no_rows() -> None:
    x = torch.randn(2, 9, 4, 8, device=DEVICE).transpose(
        1, 2
    )  # (B, H, L, D), not contiguous
    cos, sin = rope_cos_sin(
        torch.arange(9), rope_frequencies(8, base=10.0), device=DEVICE
    )
    torch.testing.assert_close(kernels.rope(x, cos, sin), apply_rope(x, cos, sin))
    empty = torch.randn(0, 4, 9, 8, device=DEVICE)
    assert kernels.rope(empty, cos, sin).shape == empty.shape


# ---- FlashAttention: SDPA and logsumexp ----------------------------------------------------

ATOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def reference(q, k, v, is_causal, scale=None):
    q64, k64, v64 = (t.double() for t in (q, k, v))
    out = F.scaled_dot_product_attention(
        q64, k64, v64, is_causal=is_causal, scale=scale
    )
    scores = q64 @ k64.transpose(-1, -2) * (scale or 1 / math.sqrt(q.shape[-1]))
    if is_causal:
        keep = torch.ones(
            q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device
        ).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    return out, torch.logsumexp(scores, dim=-1)


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str
)
@pytest.mark.parametrize(("q_len", "k_len"), [(64, 64), (40, 100), (100, 40)])
def test_flash_attention_matches_sdpa_and_logsumexp(
    is_causal, dtype, q_len, k_len
) -> None:
    gen = torch.Generator().manual_seed(2)
    q, k, v = (
        torch.randn(1, 2, n, 64, generator=gen).to(DEVICE, dtype)
        for n in (q_len, k_len, k_len)
    )
    out, lse = kernels.flash_attention(
        q, k, v, is_causal=is_causal, block_m=32, block_n=32
    )
    want, want_lse = reference(q, k, v, is_causal)
    assert (
        out.dtype == dtype and lse.dtype == torch.float32 and lse.shape == (1, 2, q_len)
    )
    torch.testing.assert_close(out.double(), want, atol=ATOL[dtype], rtol=0)
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_flash_attention_head_dims_blocks_and_scale(head_dim: int) -> None:
    gen = torch.Generator().manual_seed(3)
    q, k, v = (
        torch.randn(2, 1, 48, head_dim, generator=gen).to(DEVICE) for _ in range(3)
    )
    for block_m, block_n in ((16, 64), (64, 16)):
        out, lse = kernels.flash_attention(
            q, k, v, is_causal=True, scale=0.3, block_m=block_m, block_n=block_n
        )
        want, want_lse = reference(q, k, v, True, scale=0.3)
        torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=0)
        torch.testing.assert_close(lse.double(), want_lse, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.cuda
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_flash_attention_at_the_benchmark_sizes_on_cuda(head_dim, dtype) -> None:
    q, k, v = (
        torch.randn(1, 4, 1024, head_dim, device="cuda", dtype=dtype) for _ in range(3)
    )
    for is_causal in (False, True):
        out, _ = kernels.flash_attention(q, k, v, is_causal=is_causal)
        want = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
        torch.testing.assert_close(out, want, atol=ATOL[dtype], rtol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.cuda
@pytest.mark.parametrize("head_dim", [64, 128])
def test_float32_on_cuda_is_not_tf32(head_dim) -> None:
    """Compiled for a GPU, float32 stays float32 (input_precision="ieee"): TF32 products
    would err by more than 1e-4 here (tests/test_performance_claims.py)."""
    gen = torch.Generator().manual_seed(14)
    q, k, v = (torch.randn(1, 2, 128, head_dim, generator=gen) for _ in "qkv")
    for is_causal in (False, True):
        want, want_lse = reference(q, k, v, is_causal)
        out, lse = kernels.flash_attention(
            *(t.cuda() for t in (q, k, v)), is_causal=is_causal
        )
        assert (out.cpu().double() - want).abs().max().item() < 1e-5
        assert (lse.cpu().double() - want_lse).abs().max().item() < 1e-5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_flash_attention_backward_at_the_benchmark_head_width_on_cuda(dtype) -> None:
    gen = torch.Generator().manual_seed(15)
    q, k, v = (
        torch.randn(1, 4, 512, 128, generator=gen).to("cuda", dtype).requires_grad_()
        for _ in "qkv"
    )
    for is_causal in (False, True):
        out, _ = kernels.flash_attention(q, k, v, is_causal=is_causal)
        grad_out = torch.randn(out.shape, generator=gen).to("cuda", dtype)
        got = torch.autograd.grad(out, (q, k, v), grad_out, retain_graph=True)
        # no atomic additions: the same bits on every run (the chapter's claim)
        again = torch.autograd.grad(out, (q, k, v), grad_out)
        assert all(torch.equal(a, b) for a, b in zip(got, again, strict=True))
        q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
        ref = F.scaled_dot_product_attention(q64, k64, v64, is_causal=is_causal)
        want = torch.autograd.grad(ref, (q64, k64, v64), grad_out.double())
        tol = 1e-5 if dtype == torch.float32 else 3e-2  # relative to the largest entry
        for g, w in zip(got, want, strict=True):
            scale = max(1.0, w.abs().max().item())
            assert (g.double() - w).abs().max().item() < tol * scale


# ---- selected from the counterparts: backend="triton" -------------------------------------


def test_apply_rope_and_sdpa_select_the_kernels() -> None:
    from companion.attention import scaled_dot_product_attention

    gen = torch.Generator().manual_seed(4)
    x = torch.randn(2, 3, 16, 32, generator=gen).to(DEVICE)
    cos, sin = rope_cos_sin(torch.arange(16), rope_frequencies(32), device=DEVICE)
    for layout in ("half", "interleaved"):
        torch.testing.assert_close(
            apply_rope(x, cos, sin, layout=layout, backend="triton"),
            apply_rope(x, cos, sin, layout=layout),
        )
    q, k, v = (torch.randn(1, 2, 40, 32, generator=gen).to(DEVICE) for _ in range(3))
    for causal in (False, True):
        torch.testing.assert_close(
            scaled_dot_product_attention(q, k, v, is_causal=causal, backend="triton"),
            scaled_dot_product_attention(q, k, v, is_causal=causal),
            atol=2e-5,
            rtol=0,
        )


def test_no_key_gives_zeros_as_the_reference_does() -> None:
    from companion.attention import scaled_dot_product_attention

    q, kv = (
        torch.randn(1, 1, 4, 16, device=DEVICE),
        torch.randn(1, 1, 0, 16, device=DEVICE),
    )
    out, lse = kernels.flash_attention(q, kv, kv)
    torch.testing.assert_close(out, scaled_dot_product_attention(q, kv, kv))
    assert torch.isneginf(lse).all()


# ---- any memory layout: the stride matrix ---------------------------------------------


def _layouts(shape: tuple[int, int, int, int], gen: torch.Generator) -> dict:
    """One (B, H, n, D) tensor in each layout a caller produces: the values differ, the
    shape is the same."""
    b, h, n, d = shape
    return {
        "contiguous": torch.randn(b, h, n, d, generator=gen),
        # what every model produces: (B, L, H, D) viewed with the heads second
        "transposed": torch.randn(b, n, h, d, generator=gen).transpose(1, 2),
        # every other position of a longer sequence, and the first D of wider rows
        "sliced": torch.randn(b, h, 2 * n, d + 8, generator=gen)[:, :, ::2, :d],
        # one head shared by all (stride 0), as grouped-query attention's keys
        "expanded": torch.randn(b, 1, n, d, generator=gen).expand(b, h, n, d),
        # the feature axis strided: every other column
        "strided D": torch.randn(b, h, n, 2 * d, generator=gen)[..., ::2],
    }


LAYOUTS = ["contiguous", "transposed", "sliced", "expanded", "strided D"]


@pytest.mark.parametrize("entry", ["kernels", "backend"])
@pytest.mark.parametrize("layout_name", LAYOUTS)
def test_flash_attention_reads_any_layout(entry: str, layout_name: str) -> None:
    from companion.attention import scaled_dot_product_attention

    gen = torch.Generator().manual_seed(5)
    q = _layouts((2, 2, 24, 16), gen)[layout_name].to(DEVICE)
    k = _layouts((2, 2, 40, 16), gen)[layout_name].to(DEVICE)
    v = _layouts((2, 2, 40, 16), gen)[layout_name].to(DEVICE)
    assert layout_name == "contiguous" or not q.is_contiguous()
    for causal in (False, True):
        if entry == "kernels":
            out = kernels.flash_attention(q, k, v, is_causal=causal, block_m=16)[0]
        else:
            out = scaled_dot_product_attention(
                q, k, v, is_causal=causal, backend="triton"
            )
        want, _ = reference(q, k, v, causal)
        assert out.shape == q.shape and out.is_contiguous()
        torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=0)


@pytest.mark.parametrize("entry", ["kernels", "backend"])
@pytest.mark.parametrize("layout_name", LAYOUTS)
def test_rope_reads_any_layout(entry: str, layout_name: str) -> None:
    gen = torch.Generator().manual_seed(6)
    x = _layouts((2, 3, 9, 16), gen)[layout_name].double().to(DEVICE)
    cos, sin = rope_cos_sin(
        torch.arange(9),
        rope_frequencies(16, base=100.0),
        dtype=torch.float64,
        device=DEVICE,
    )
    for layout in ("half", "interleaved"):
        if entry == "kernels":
            got = kernels.rope(x, cos, sin, layout=layout)
        else:
            got = apply_rope(x, cos, sin, layout=layout, backend="triton")
        assert got.shape == x.shape and got.is_contiguous()
        want = rope_loop(x.cpu(), torch.arange(9), 100.0, layout)
        torch.testing.assert_close(got.cpu(), want, atol=1e-12, rtol=1e-12)
    # (B, L, H, D) with seq_dim=1, given as a transposed (B, H, L, D) view
    y = x.transpose(1, 2)
    torch.testing.assert_close(
        apply_rope(y, cos, sin, seq_dim=1, backend="triton"),
        apply_rope(y.contiguous(), cos, sin, seq_dim=1),
        atol=1e-12,
        rtol=1e-12,
    )


def test_rope_of_many_axes_that_do_not_merge() -> None:
    """Rows spread over more than four axes that cannot merge: the kernel takes a
    contiguous copy instead (the only case it copies), same values."""
    gen = torch.Generator().manual_seed(13)
    base = torch.randn(2, 3, 2, 3, 2, 5, 8, generator=gen, dtype=torch.float64)
    x = base.permute(4, 3, 2, 1, 0, 5, 6)  # (2, 3, 2, 3, 2, L=5, D=8), no axis merges
    copy, sizes, _ = kernels._row_layout(x)
    assert copy.is_contiguous() and sizes == [1, 1, 1, 360]  # one axis in the copy
    cos, sin = rope_cos_sin(
        torch.arange(5), rope_frequencies(8), dtype=torch.float64, device=DEVICE
    )
    x = x.to(DEVICE)
    for layout in ("half", "interleaved"):
        torch.testing.assert_close(
            kernels.rope(x, cos, sin, layout=layout),
            rope_loop(x.cpu(), torch.arange(5), 10000.0, layout).to(DEVICE),
            atol=1e-12,
            rtol=1e-12,
        )


def test_row_layout_merges_what_steps_through_memory_as_one() -> None:
    x = torch.empty(2, 9, 4, 8).transpose(1, 2)  # (B, H, L, D) view of (B, L, H, D)
    same, sizes, strides = kernels._row_layout(x)
    assert same is x and sizes == [1, 2, 4, 9] and strides == [0, 288, 8, 32]
    y = torch.empty(3, 5, 16)[:, :, :8]  # rows (3, 5), strides (80, 16): one axis
    _, sizes, strides = kernels._row_layout(y)
    assert sizes == [1, 1, 1, 15] and strides == [0, 0, 0, 16]
    z = torch.empty(1, 7, 8).expand(4, 7, 8)  # batch stride 0
    _, sizes, strides = kernels._row_layout(z)
    assert sizes == [1, 1, 4, 7] and strides == [0, 0, 0, 8]


def test_masked_loads_never_read_past_the_tensor() -> None:
    """NaN in the memory right after the keys' last row and after the queries' last
    feature must not reach the output: masked loads read 0 there (other=0.0)."""
    big_k = torch.randn(1, 1, 40, 80, device=DEVICE)
    big_k[:, :, 37:] = float("nan")  # rows past S = 37, inside the last key block
    big_q = torch.randn(1, 1, 20, 96, device=DEVICE)
    big_q[..., 80:] = float("nan")  # features past D = 80, inside the padded block
    q, k = big_q[..., :80], big_k[:, :, :37]
    out, lse = kernels.flash_attention(q, k, k, block_m=16, block_n=16)
    want, want_lse = reference(q, k, k, False)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=0)
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("head_dim", [80, 96, 8])
def test_head_widths_that_are_not_powers_of_two(head_dim: int) -> None:
    """80 and 96 (common head widths) and 8 run padded to a power of two >= 16."""
    gen = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 2, 20, head_dim, generator=gen).to(DEVICE) for _ in "qkv")
    for causal in (False, True):
        out, lse = kernels.flash_attention(q, k, v, is_causal=causal, block_m=16)
        want, want_lse = reference(q, k, v, causal)
        torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=0)
        torch.testing.assert_close(lse.double(), want_lse, atol=1e-5, rtol=1e-5)
    x = torch.randn(1, 2, 20, head_dim, generator=gen, dtype=torch.float64).to(DEVICE)
    cos, sin = rope_cos_sin(
        torch.arange(20), rope_frequencies(head_dim), dtype=torch.float64, device=DEVICE
    )
    for layout in ("half", "interleaved"):
        torch.testing.assert_close(
            kernels.rope(x, cos, sin, layout=layout),
            rope_loop(x.cpu(), torch.arange(20), 10000.0, layout).to(DEVICE),
            atol=1e-12,
            rtol=1e-12,
        )


def test_float32_is_multiplied_in_float32_not_tf32() -> None:
    """The flag that selects tl.dot(..., input_precision="ieee") is set for float32 on
    every device (Triton's default on NVIDIA GPUs since Ampere is TF32), and for every
    dtype under the interpreter (which gets float32 operands); 16-bit inputs on a GPU
    keep their dtype for the tensor cores."""
    meta = {dt: torch.empty(1, 1, 1, 64, dtype=dt, device="meta") for dt in FLOATS[:3]}
    assert kernels._flash_flags(meta[torch.float32])["F32"] is True
    assert kernels._flash_flags(meta[torch.bfloat16])["F32"] is False
    assert kernels._flash_flags(meta[torch.float16])["F32"] is False
    cpu = torch.empty(1, 1, 1, 80, dtype=torch.bfloat16)
    assert kernels._flash_flags(cpu) == {"HEAD_DIM": 80, "BLOCK_D": 128, "F32": True}
    import inspect

    assert 'input_precision="ieee"' in inspect.getsource(kernels._mm.fn)


# ---- gradients: the FlashAttention-2 backward and RoPE's -------------------------------


def _sdpa_grads(q, k, v, grad_out, is_causal, scale=None):
    """Float64 autograd through torch's SDPA: the oracle for the backward kernels."""
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(
        q64, k64, v64, is_causal=is_causal, scale=scale
    )
    return torch.autograd.grad(out, (q64, k64, v64), grad_out.double())


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize(
    ("q_len", "k_len", "head_dim"), [(40, 24, 16), (24, 40, 80), (33, 33, 32)]
)
def test_flash_attention_backward_matches_float64_autograd(
    is_causal, q_len, k_len, head_dim
) -> None:
    gen = torch.Generator().manual_seed(8)
    q = torch.randn(1, q_len, 2, head_dim, generator=gen).transpose(1, 2).to(DEVICE)
    k, v = (torch.randn(1, 2, k_len, head_dim, generator=gen).to(DEVICE) for _ in "kv")
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out, lse = kernels.flash_attention(
        q, k, v, is_causal=is_causal, scale=0.4, block_m=16, block_n=16
    )
    assert out.requires_grad and not lse.requires_grad
    grad_out = torch.randn(out.shape, generator=gen).to(DEVICE)
    got = torch.autograd.grad(out, (q, k, v), grad_out)
    want = _sdpa_grads(q, k, v, grad_out, is_causal, scale=0.4)
    for name, g, w in zip("qkv", got, want, strict=True):
        assert g.shape == w.shape and g.dtype == torch.float32
        err = (g.double() - w).abs().max().item()
        assert err < 2e-5, (name, err)  # NaN fails here too: nan < tol is False


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_flash_attention_backward_in_half_precision(dtype) -> None:
    gen = torch.Generator().manual_seed(9)
    q, k, v = (
        torch.randn(1, 1, 32, 32, generator=gen).to(DEVICE, dtype).requires_grad_()
        for _ in "qkv"
    )
    out, _ = kernels.flash_attention(q, k, v, is_causal=True, block_m=16, block_n=16)
    grad_out = torch.randn(out.shape, generator=gen).to(DEVICE, dtype)
    got = torch.autograd.grad(out, (q, k, v), grad_out)
    want = _sdpa_grads(q, k, v, grad_out, True)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == dtype
        torch.testing.assert_close(g.double(), w, atol=2 * ATOL[dtype], rtol=0)


def test_sdpa_backend_triton_carries_gradients() -> None:
    from companion.attention import scaled_dot_product_attention

    gen = torch.Generator().manual_seed(10)
    q, k, v = (
        torch.randn(1, 2, 20, 16, generator=gen).to(DEVICE).requires_grad_()
        for _ in "qkv"
    )
    out = scaled_dot_product_attention(q, k, v, is_causal=True, backend="triton")
    assert out.grad_fn is not None
    got = torch.autograd.grad(out.square().sum(), (q, k, v))
    ref = scaled_dot_product_attention(q, k, v, is_causal=True)
    want = torch.autograd.grad(ref.square().sum(), (q, k, v))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_rope_backward_is_the_inverse_rotation(layout: str) -> None:
    """The gradient of RoPE is the rotation by -m theta: against float64 autograd of the
    torch path, for a transposed x, seq_dim=1 and a per-sequence table."""
    gen = torch.Generator().manual_seed(11)
    freqs = rope_frequencies(16, base=100.0)
    ids = torch.randint(0, 50, (2, 7), generator=gen)
    tables = {
        "shared": rope_cos_sin(torch.arange(7), freqs, dtype=torch.float64),
        "per sequence": rope_cos_sin(ids.double(), freqs, dtype=torch.float64),
    }
    for seq_dim in (-2, 1):
        for cos, sin in tables.values():
            cos, sin = cos.to(DEVICE), sin.to(DEVICE)
            shape = (2, 7, 3, 16) if seq_dim == -2 else (2, 3, 7, 16)
            x = torch.randn(shape, generator=gen, dtype=torch.float64).transpose(1, 2)
            x = x.to(DEVICE).requires_grad_()
            out = apply_rope(
                x, cos, sin, layout=layout, seq_dim=seq_dim, backend="triton"
            )
            grad_out = torch.randn(out.shape, generator=gen, dtype=torch.float64)
            (got,) = torch.autograd.grad(out, x, grad_out.to(DEVICE))
            ref = apply_rope(x, cos, sin, layout=layout, seq_dim=seq_dim)
            (want,) = torch.autograd.grad(ref, x, grad_out.to(DEVICE))
            torch.testing.assert_close(got, want, atol=1e-13, rtol=1e-13)
            # and the inverse rotation undoes the forward one
            axis = seq_dim % x.dim()
            back = kernels._launch_rope(out.detach(), cos, sin, layout, axis, True)
            torch.testing.assert_close(back, x.detach(), atol=1e-13, rtol=1e-13)


def _loss_terms():
    """Losses whose gradient dO is not a plain contiguous tensor: the gradient of a sum is
    an expanded tensor of stride 0, of a product with a transposed output a transposed one,
    of a slice a tensor with zeros between the rows."""
    weight = torch.linspace(-1.0, 1.0, 20, device=DEVICE)
    return {
        "sum (dO expanded, strides 0)": lambda o: o.sum(),
        "transposed": lambda o: (o.transpose(-1, -2) * weight).square().sum(),
        "sliced": lambda o: o[:, :, ::3].sum(),
    }


@pytest.mark.parametrize("term", list(_loss_terms()))
def test_flash_attention_backward_for_any_layout_of_the_output_gradient(term) -> None:
    gen = torch.Generator().manual_seed(13)
    q = torch.randn(2, 2, 20, 16, generator=gen).to(DEVICE).requires_grad_()
    k, v = (
        torch.randn(2, 2, 28, 16, generator=gen).to(DEVICE).requires_grad_()
        for _ in "kv"
    )
    loss = _loss_terms()[term]
    out, _ = kernels.flash_attention(q, k, v, is_causal=True, block_m=16, block_n=16)
    got = torch.autograd.grad(loss(out), (q, k, v))
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    out64 = F.scaled_dot_product_attention(q64, k64, v64, is_causal=True)
    want = torch.autograd.grad(loss(out64.float()), (q64, k64, v64))
    for name, g, w in zip("qkv", got, want, strict=True):
        err = (g.double() - w).abs().max().item()
        assert err < 2e-5, (term, name, err)


@pytest.mark.parametrize("term", list(_loss_terms()))
def test_rope_backward_for_any_layout_of_the_output_gradient(term) -> None:
    gen = torch.Generator().manual_seed(18)
    cos, sin = rope_cos_sin(torch.arange(20), rope_frequencies(16), device=DEVICE)
    x = torch.randn(2, 20, 3, 16, generator=gen).transpose(1, 2).to(DEVICE)
    x = x.requires_grad_()
    loss = _loss_terms()[term]
    (got,) = torch.autograd.grad(loss(apply_rope(x, cos, sin, backend="triton")), x)
    (want,) = torch.autograd.grad(loss(apply_rope(x, cos, sin)), x)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_flash_attention_gradients_of_some_inputs_and_of_empty_ones() -> None:
    """Only the inputs that need a gradient get one (the pass for the others is skipped),
    and with no query or no key nothing flows back: zeros, as through SDPA."""
    gen = torch.Generator().manual_seed(14)
    q, k, v = (torch.randn(1, 2, 18, 16, generator=gen).to(DEVICE) for _ in "qkv")
    for wanted in ("q", "v", "kv"):
        ins = {
            n: t.clone().requires_grad_(n in wanted)
            for n, t in zip("qkv", (q, k, v), strict=True)
        }
        out, _ = kernels.flash_attention(*ins.values(), is_causal=True, block_m=16)
        got = torch.autograd.grad(out.square().sum(), [ins[n] for n in wanted])
        ref = F.scaled_dot_product_attention(*ins.values(), is_causal=True)
        want = torch.autograd.grad(ref.square().sum(), [ins[n] for n in wanted])
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, atol=2e-5, rtol=1e-5)
    for q_len, k_len in ((0, 5), (5, 0)):
        ins = [
            torch.randn(1, 1, n, 16, device=DEVICE).requires_grad_()
            for n in (q_len, k_len, k_len)
        ]
        out, _ = kernels.flash_attention(*ins)
        got = torch.autograd.grad(out.sum(), ins)
        want = torch.autograd.grad(F.scaled_dot_product_attention(*ins).sum(), ins)
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape and not g.any() and not w.any()


def test_blocks_are_halved_when_the_gpu_runs_out_of_on_chip_memory(monkeypatch) -> None:
    """A GPU that cannot hold the blocks (OutOfResources, raised by Triton when a kernel
    is first launched) gets every kernel again with the larger block halved, down to 16,
    and the same values and gradients; past 16 the error reaches the caller. Simulated:
    each kernel refuses blocks above a limit."""
    from triton.runtime.errors import OutOfResources

    tried = []

    class Refusing:
        def __init__(self, kernel, limit):
            self.kernel, self.limit = kernel, limit

        def __getitem__(self, grid):
            def launch(*args, **meta):
                blocks = (meta["BLOCK_M"], meta.get("BLOCK_N", 16))
                tried.append(blocks)
                if max(blocks) > self.limit:
                    raise OutOfResources(2**18, 2**17, "shared memory")
                return self.kernel[grid](*args, **meta)

            return launch

    gen = torch.Generator().manual_seed(17)
    q, k, v = (
        torch.randn(1, 2, 40, 16, generator=gen).to(DEVICE).requires_grad_()
        for _ in "qkv"
    )
    out, _ = kernels.flash_attention(q, k, v, is_causal=True)
    want = torch.autograd.grad(out.square().sum(), (q, k, v))
    names = ("_FLASH", "_FLASH_BWD_PRE", "_FLASH_BWD_DKDV", "_FLASH_BWD_DQ")
    for name in names:
        monkeypatch.setattr(kernels, name, Refusing(getattr(kernels, name), 16))
    out_16, _ = kernels.flash_attention(q, k, v, is_causal=True)
    got = torch.autograd.grad(out_16.square().sum(), (q, k, v))
    torch.testing.assert_close(out_16, out, atol=1e-6, rtol=0)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=0)
    assert (64, 64) in tried and (16, 16) in tried and (64, 32) in tried
    for name in names:
        monkeypatch.setattr(kernels, name, Refusing(getattr(kernels, name).kernel, 8))
    with pytest.raises(OutOfResources):
        kernels.flash_attention(q, k, v)


@pytest.mark.filterwarnings("error")
def test_flash_attention_backward_with_large_logits() -> None:
    """Scores of a few hundred (scale 30): a masked score far above its row's log-sum-exp
    must give a weight of 0 without an overflow on the way (the interpreter's NumPy warns
    on one) and the gradients stay right."""
    gen = torch.Generator().manual_seed(16)
    q, k, v = (
        torch.randn(1, 1, 33, 16, generator=gen).to(DEVICE).requires_grad_()
        for _ in "qkv"
    )
    out, _ = kernels.flash_attention(
        q, k, v, is_causal=True, scale=30.0, block_m=16, block_n=16
    )
    grad_out = torch.randn(out.shape, generator=gen).to(DEVICE)
    got = torch.autograd.grad(out, (q, k, v), grad_out)
    want = _sdpa_grads(q, k, v, grad_out, True, scale=30.0)
    for name, g, w in zip("qkv", got, want, strict=True):
        err = ((g.double() - w).abs().max() / w.abs().max()).item()
        assert err < 1e-4, (name, err)


def test_second_derivatives() -> None:
    """RoPE is linear: its gradient is a RoPE too, so a gradient of a gradient is right
    (against the torch path). The FlashAttention backward kernels have no gradient of their
    own: differentiating through them raises, also when the loss mixes the gradient
    with the output (where a graph cut would silently count that part as zero)."""
    from companion.attention import scaled_dot_product_attention

    gen = torch.Generator().manual_seed(15)
    cos, sin = rope_cos_sin(torch.arange(7), rope_frequencies(16), device=DEVICE)
    x = torch.randn(2, 7, 16, generator=gen).to(DEVICE).requires_grad_()
    second = {}
    for backend in ("torch", "triton"):
        out = apply_rope(x, cos, sin, backend=backend)
        (g,) = torch.autograd.grad(out.pow(3).sum(), x, create_graph=True)
        (second[backend],) = torch.autograd.grad(g.square().sum() + out.sum(), x)
    torch.testing.assert_close(second["triton"], second["torch"], atol=1e-4, rtol=1e-5)
    q, k, v = (
        torch.randn(1, 1, 8, 16, generator=gen).to(DEVICE).requires_grad_()
        for _ in "qkv"
    )
    out = scaled_dot_product_attention(q, k, v, backend="triton")
    (gq,) = torch.autograd.grad(out.square().sum(), q, create_graph=True)
    for penalty in (gq.square().sum(), gq.square().sum() + out.sum()):
        with pytest.raises(RuntimeError, match="differentiable once"):
            torch.autograd.grad(penalty, q, retain_graph=True)


def test_a_tiny_model_trains_with_the_triton_backends() -> None:
    """The capstone's TinyTransformer (RoPE) trained five AdamW steps with RoPE and
    attention from the kernels: the same losses as the torch paths, step by step."""
    from companion.attention import scaled_dot_product_attention
    from companion.model import ModelConfig, RotarySelfAttention, TinyTransformer

    class TritonRotary(RotarySelfAttention):
        def attend(self, query, key, value, *, mask=None, is_causal=False):
            L, S = query.shape[-2], key.shape[-2]
            cq, sq = rope_cos_sin(torch.arange(S - L, S), self.rope_frequencies)
            ck, sk = rope_cos_sin(torch.arange(S), self.rope_frequencies)
            query = apply_rope(query, cq.to(DEVICE), sq.to(DEVICE), backend="triton")
            key = apply_rope(key, ck.to(DEVICE), sk.to(DEVICE), backend="triton")
            return scaled_dot_product_attention(
                query, key, value, is_causal=is_causal, backend="triton"
            )

    config = ModelConfig(vocab_size=11, dim=32, num_heads=2, num_layers=2)
    gen = torch.Generator().manual_seed(12)
    tokens = torch.randint(0, 11, (4, 13), generator=gen).to(DEVICE)
    losses = {}
    for backend in ("torch", "triton"):
        torch.manual_seed(0)
        model = TinyTransformer(config).to(DEVICE)
        if backend == "triton":
            n = 0
            for module in model.modules():
                if type(module) is RotarySelfAttention:
                    module.__class__ = TritonRotary
                    n += 1
            assert n == config.num_layers
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        losses[backend] = []
        for _ in range(5):
            logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses[backend].append(loss.item())
    assert losses["torch"][-1] < losses["torch"][0] - 0.1  # it does learn
    torch.testing.assert_close(
        torch.tensor(losses["triton"]), torch.tensor(losses["torch"]), atol=1e-4, rtol=0
    )


# ---- bad input -----------------------------------------------------------------------------

_x = torch.randn(1, 2, 4, 8, device=DEVICE)
_cs = rope_cos_sin(torch.arange(4), rope_frequencies(8, base=10.0), device=DEVICE)
_q = torch.randn(1, 1, 4, 64, device=DEVICE)
_gq = torch.randn(2, 4, 3, 8, device=DEVICE)  # (B, H, L, D) = (2, 4, 3, 8)
_other = "cuda" if DEVICE.type == "cpu" else "cpu"

BAD_INPUTS = [
    (
        "rope",
        lambda: kernels.rope([1.0], *_cs),
        TypeError,
        r"^x must be a torch\.Tensor",
    ),
    (
        "rope",
        lambda: kernels.rope(_x.long(), *_cs),
        TypeError,
        r"^x must be a floating",
    ),
    (
        "rope",
        lambda: kernels.rope(_x[..., :7], *_cs),
        ValueError,
        r"^x must have an even",
    ),
    (
        "rope",
        lambda: kernels.rope(_x, *_cs, layout="pairs"),
        ValueError,
        r"^layout must be",
    ),
    (
        "rope",
        lambda: kernels.rope(_x, _cs[0][:3], _cs[1][:3]),
        ValueError,
        r"^cos must have size 4",
    ),
    (
        "rope",
        lambda: kernels.rope(_x, _cs[0], _cs[1][:3]),
        ValueError,
        r"^sin must have shape of cos",
    ),
    (
        "rope",
        lambda: kernels.rope(_x, *_cs, seq_dim=3),
        ValueError,
        r"^seq_dim must be",
    ),
    (
        "rope",
        lambda: kernels.rope(
            _x, *_cs, positions=torch.tensor([0, 1, 2, 9], device=DEVICE)
        ),
        ValueError,
        r"^positions must lie in \[0, 4\)",
    ),
    (
        "rope",
        lambda: kernels.rope(_x, *_cs, positions=torch.zeros(4, device=DEVICE)),
        TypeError,
        r"^positions must be an integer tensor",
    ),
    (
        "flash_attention",
        lambda: kernels.flash_attention(_q[0], _q, _q),
        ValueError,
        r"^query must have 4 dimensions",
    ),
    (
        "flash_attention",
        lambda: kernels.flash_attention(_q.double(), _q.double(), _q.double()),
        TypeError,
        r"^query must be float16, bfloat16 or float32",
    ),
    (
        "flash_attention",
        lambda: kernels.flash_attention(_q, _q.half(), _q),
        TypeError,
        r"^key must have query's dtype",
    ),
    (
        "flash_attention",
        lambda: kernels.flash_attention(
            *(torch.zeros(1, 1, 2, 320, device=DEVICE),) * 3
        ),
        ValueError,
        r"^query's head width D must be from 1 to 256",
    ),
    (
        "flash_attention",
        lambda: kernels.flash_attention(_q, _q, _q, is_causal=1),
        TypeError,
        r"^is_causal must be a bool",
    ),
    (
        "flash_attention",
        lambda: kernels.flash_attention(_q, _q, _q, block_m=48),
        ValueError,
        r"^block_m must be a power of two",
    ),
    (
        "flash_attention",
        lambda: kernels.flash_attention(_q, _q, _q, scale=-1.0),
        ValueError,
        r"^scale must be a real number > 0",
    ),
    (
        "rope",
        lambda: kernels.rope(_x, _cs[0].clone().requires_grad_(), _cs[1]),
        ValueError,
        r"^cos must not require grad with backend='triton'",
    ),
    # learned sinks (tests/test_kernels_sinks.py): one floating logit per head, (H,)
    (
        "flash_attention",
        lambda: kernels.flash_attention(_q, _q, _q, sinks=[0.0]),
        TypeError,
        r"^sinks must be a torch\.Tensor",
    ),
    (
        "flash_attention",
        lambda: kernels.flash_attention(
            _q, _q, _q, sinks=torch.zeros(1, dtype=torch.long, device=DEVICE)
        ),
        TypeError,
        r"^sinks must be a floating-point tensor, got a tensor of dtype torch\.int64",
    ),
    (
        "flash_attention",
        lambda: kernels.flash_attention(
            _q, _q, _q, sinks=torch.zeros(1, 1, device=DEVICE)
        ),
        ValueError,
        r"^sinks must have 1 dimensions \(H,\), got shape \(1, 1\)",
    ),
    (
        "flash_attention",
        lambda: kernels.flash_attention(
            _q, _q, _q, sinks=torch.zeros(2, device=DEVICE)
        ),
        ValueError,
        r"^sinks must have shape \(H,\) \(1,\), got shape \(2,\)",
    ),
    # grouped-query attention (tests/test_kernels_sinks.py): key and value have H_kv heads,
    # a divisor of query's H; the batch and D are query's; sinks are per query head
    (
        "flash_attention",
        lambda: kernels.flash_attention(_gq, _gq[:, :3], _gq[:, :3]),
        ValueError,
        r"^key's head count H_kv must divide query's head count H \(4\), got 3",
    ),
    (
        "flash_attention",
        lambda: kernels.flash_attention(_gq, _gq[:1, :2], _gq[:1, :2]),
        ValueError,
        r"^key and query must have the same batch \(B\) size, got key \(1, 2, 3, 8\)",
    ),
    (
        "flash_attention",
        lambda: kernels.flash_attention(_gq, _gq[:, :2, :, :4], _gq[:, :2, :, :4]),
        ValueError,
        r"^key and query must have the same head width D size",
    ),
    (
        "flash_attention",
        lambda: kernels.flash_attention(_gq, _gq[:, :2], _gq[:, :1]),
        ValueError,
        r"^value must have shape of key \(B, H_kv, S, D\) \(2, 2, 3, 8\), got shape "
        r"\(2, 1, 3, 8\)",
    ),
    (
        "flash_attention",
        lambda: kernels.flash_attention(
            _gq, _gq[:, :2], _gq[:, :2], sinks=torch.zeros(2, device=DEVICE)
        ),
        ValueError,
        r"^sinks must have shape \(H,\) \(4,\), got shape \(2,\)",
    ),
]


@pytest.mark.parametrize(("name", "call", "exc", "match"), BAD_INPUTS, ids=lambda p: "")
def test_bad_input(name, call, exc, match) -> None:
    with pytest.raises(exc, match=match):
        call()


def test_tensors_on_the_wrong_device_for_the_mode() -> None:
    if not torch.cuda.is_available() and DEVICE.type == "cpu":
        pytest.skip("this machine has no second kind of device to try")
    x = _x.to(_other)
    with pytest.raises(ValueError, match=r"^x must be on a"):
        kernels.rope(x, *(t.to(_other) for t in _cs))
    with pytest.raises(ValueError, match=r"^sinks must be on query's device"):
        kernels.flash_attention(_q, _q, _q, sinks=torch.zeros(1, device=_other))
