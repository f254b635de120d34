"""The appendix's claims (book/12_performance.ipynb), each against an oracle.

The package's full attention moves the score matrix so often (about 12 float32 L x L
matrices) that its intensity is the same at any length, about 5 flop/byte at D = 64 and 10 at
D = 128 (memory-bound), tiled attention's is about half the block, TF32 products would put
the kernel's float32 check out by two orders of magnitude (an emulation: no GPU has run the
kernels), the exp/log form of the sinusoidal frequencies is less accurate than the direct
power where the width is a power of two and rarely more accurate elsewhere, and the
solution's block size that reaches an H100's tensor-core balance.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from companion.attention import scaled_dot_product_attention
from companion.performance import attention_flops, memory_traffic, tensor_bytes, ulp

H100_FLOAT32_BALANCE = 67e12 / 3.35e12  # NVIDIA H100 SXM datasheet: 20 flop/byte
H100_BF16_BALANCE = 989e12 / 3.35e12  # dense bfloat16 tensor cores: about 295


def _moved(fn) -> int:
    """Bytes read and written by fn's operators; matmul's reshapes (_unsafe_view) copy
    nothing."""
    return sum(r + w for name, r, w in memory_traffic(fn).ops if name != "_unsafe_view")


@pytest.mark.parametrize("length", [512, 1024, 4096])
def test_full_attention_intensity_about_five_at_any_length(length: int) -> None:
    d = 64
    q, k, v = (torch.randn(1, 1, length, d) for _ in range(3))
    moved = _moved(lambda: scaled_dot_product_attention(q, k, v))
    intensity = attention_flops(1, 1, length, length, d) / moved
    assert 4 < intensity < 6 < H100_FLOAT32_BALANCE
    # what it would be if only Q, K, V and the output crossed the bus: L / 4 here
    ideal = attention_flops(1, 1, length, length, d) / tensor_bytes(q, k, v, q)
    assert ideal == length / 4


@pytest.mark.parametrize("length", [1024, 2048])
def test_full_attention_intensity_about_ten_at_head_width_128(length: int) -> None:
    """The flops per score grow with D, the score bytes do not: twice the intensity."""
    ratio = {}
    for d in (64, 128):
        q, k, v = (torch.randn(1, 1, length, d) for _ in range(3))
        moved = _moved(lambda q=q, k=k, v=v: scaled_dot_product_attention(q, k, v))
        ratio[d] = attention_flops(1, 1, length, length, d) / moved
        assert 11 < moved / (4 * length * length) < 13  # about 12 score matrices
    assert 9 < ratio[128] < 11.5 < H100_FLOAT32_BALANCE
    assert 1.8 < ratio[128] / ratio[64] < 2.05


def _tf32(x: torch.Tensor) -> torch.Tensor:
    """Round float32 to TF32's 10 fraction bits (to nearest, ties away from zero)."""
    return ((x.contiguous().view(torch.int32) + 0x1000) & ~0x1FFF).view(torch.float32)


def test_tf32_rounding_of_the_operands() -> None:
    x = torch.tensor([1 + 2**-11 + 2**-12, 1 + 2**-12, -3.0, 2**-10 + 1])
    assert _tf32(x).tolist() == [1 + 2**-10, 1.0, -3.0, 1 + 2**-10]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("is_causal", [False, True])
def test_tf32_products_would_fail_the_chapters_float32_check(seed, is_causal) -> None:
    """The appendix asserts a float32 FlashAttention error below 1e-5; with both products
    on TF32-rounded operands (tl.dot's documented default for float32 on NVIDIA GPUs)
    the error on the same kind of inputs is above 1e-4, while float32 stays below 1e-5."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = torch.randn(3, 1, 2, 128, 64, generator=gen)
    exact = F.scaled_dot_product_attention(
        q.double(), k.double(), v.double(), is_causal=is_causal
    )
    s = (_tf32(q).double() @ _tf32(k).double().transpose(-1, -2) / 8).float()
    if is_causal:
        keep = torch.ones(128, 128, dtype=torch.bool).tril()
        s = s.masked_fill(~keep, float("-inf"))
    p = torch.softmax(s, dim=-1)
    tf32_error = (_tf32(p).double() @ _tf32(v).double() - exact).abs().max().item()
    f32 = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    f32_error = (f32.double() - exact).abs().max().item()
    assert f32_error < 1e-5 < 1e-4 < tf32_error < 1e-2
    # a tensor core fed float32 operands without a conversion first keeps their top 19
    # bits (truncation): the error is larger still, so the claim holds either way
    cut = lambda x: (x.contiguous().view(torch.int32) & ~0x1FFF).view(torch.float32)  # noqa: E731
    s_cut = (cut(q).double() @ cut(k).double().transpose(-1, -2) / 8).float()
    if is_causal:
        s_cut = s_cut.masked_fill(~keep, float("-inf"))
    p_cut = torch.softmax(s_cut, dim=-1)
    cut_error = (cut(p_cut).double() @ cut(v).double() - exact).abs().max().item()
    assert 1e-4 < tf32_error < cut_error < 1e-2


def test_tiled_intensity_passes_the_float32_balance() -> None:
    length, d, block = 4096, 64, 128
    tiled = 4 * (2 * length * d + 2 * length * d * math.ceil(length / block))
    assert attention_flops(1, 1, length, length, d) / tiled > 3 * H100_FLOAT32_BALANCE


def test_block_size_for_the_bfloat16_balance() -> None:
    """bfloat16, L = 4096, D = 128: blocks of 256 fall short of 295, blocks of 512 pass."""

    def intensity(block: int) -> float:
        elements = 2 * 4096 * 128 * (1 + math.ceil(4096 / block))
        return attention_flops(1, 1, 4096, 4096, 128) / (2 * elements)

    assert intensity(256) < H100_BF16_BALANCE < intensity(512)
    assert intensity(4096) == pytest.approx(4096 / 2)
    # the solution's answer: at least 342 queries (12 blocks), L / (1 + blocks) >= 295
    need = next(b for b in range(16, 4097) if intensity(b) >= H100_BF16_BALANCE)
    assert need == 342 and intensity(need) == pytest.approx(4096 / 13)
    assert intensity(need - 1) < H100_BF16_BALANCE


def _frequency_ulps(d_model: int) -> tuple[float, float]:
    """Largest float32 error, in ulps of the float64 value, of the exp/log snippet's
    frequencies and of the direct power 10000 ** (-2i / d)."""
    two_i = torch.arange(0, d_model, 2)
    exact = 10000.0 ** (-two_i.double() / d_model)
    snippet = torch.exp(two_i * -(math.log(10000.0) / d_model))
    direct = 10000.0 ** (-two_i.float() / d_model)
    assert snippet.dtype == direct.dtype == torch.float32
    assert (1 / exact).max() < 1e4  # nothing near float32's limits

    def worst(f: torch.Tensor) -> float:
        return ((f.double() - exact).abs() / ulp(exact)).max().item()

    return worst(snippet), worst(direct)


@pytest.mark.parametrize("d_model", [64, 128, 512, 4096])
def test_exp_log_frequencies_are_less_accurate_at_powers_of_two(d_model: int) -> None:
    """The study note on the PE formula credits exp/log with stability; where d is a power
    of two, -2i/d is exact in float32 and the direct power is far the better."""
    snippet, direct = _frequency_ulps(d_model)
    assert direct < 1 < 5 < snippet


def test_exp_log_frequencies_rarely_win_at_other_widths() -> None:
    """At other widths both forms round their exponent (the direct form by more than an
    ulp at 768), and the exp form is the more accurate at fewer than 1 in 10 even widths."""
    assert _frequency_ulps(768)[1] > 1
    sweep = [_frequency_ulps(d) for d in range(2, 2049, 2)]
    assert sum(snippet < direct for snippet, direct in sweep) < len(sweep) / 10
