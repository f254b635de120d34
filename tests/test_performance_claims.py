"""The appendix's claims (book/07_performance.ipynb), each against an oracle.

The package's full attention moves the score matrix so often that its intensity is about 5
flop/byte at any length (memory-bound), tiled attention's is about half the block, the
exp/log form of the sinusoidal frequencies is less accurate than the direct power, and the
solution's block size that reaches an H100's tensor-core balance.
"""

from __future__ import annotations

import math

import pytest
import torch

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


@pytest.mark.parametrize("d_model", [64, 128, 512, 4096])
def test_exp_log_frequencies_are_less_accurate_than_the_power(d_model: int) -> None:
    """The study note on the PE formula credits exp/log with stability; it is the worse."""
    two_i = torch.arange(0, d_model, 2)
    exact = 10000.0 ** (-two_i.double() / d_model)
    snippet = torch.exp(two_i * -(math.log(10000.0) / d_model))
    direct = 10000.0 ** (-two_i.float() / d_model)
    assert snippet.dtype == direct.dtype == torch.float32

    def worst(f: torch.Tensor) -> float:
        return ((f.double() - exact).abs() / ulp(exact)).max().item()

    assert worst(direct) < 1 < 5 < worst(snippet)
    assert (1 / exact).max() < 1e4  # nothing near float32's limits
