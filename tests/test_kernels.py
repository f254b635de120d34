"""The Triton kernels (companion/kernels.py) against independent references: a float64 loop
written from RoPE's formula, and torch's scaled_dot_product_attention and logsumexp.

Without a GPU the kernels run through Triton's interpreter on CPU tensors (small sizes: the
interpreter is slow); on a CUDA machine they are compiled, and the same tests run on the GPU,
plus the sizes the book measures (head dims 64 and 128, fp16/bf16/fp32)."""

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
    out = x.double().clone()
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


# ---- bad input -----------------------------------------------------------------------------

_x = torch.randn(1, 2, 4, 8, device=DEVICE)
_cs = rope_cos_sin(torch.arange(4), rope_frequencies(8, base=10.0), device=DEVICE)
_q = torch.randn(1, 1, 4, 64, device=DEVICE)
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
        lambda: kernels.flash_attention(_q[..., :48], _q[..., :48], _q[..., :48]),
        ValueError,
        r"^query's head width D must be",
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
