r"""Checkers for the appendix (:ref:`ch-performance`): ulps, the roofline, intensity."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import torch

from companion import performance
from companion.checks._core import Case, Mistake, checker, f64

__all__ = [
    "check_roofline_time",
    "check_tiled_attention_intensity",
    "check_ulp32",
]


@checker
def check_ulp32(ulp32: Callable[..., object]) -> Iterator[Case]:
    r"""Check a learner's ``ulp32(x)``: the spacing of float32 numbers at :math:`|x|`.

    Reference: :func:`companion.performance.ulp` with ``dtype=torch.float32``,
    :math:`2^{\lfloor \log_2 |x| \rfloor - 23}` for normal numbers, on a float64 tensor of
    positive and negative values (powers of two included, where the spacing changes).
    Named mistakes: "half an ulp" (the largest rounding error, not the spacing),
    "float64's spacing" (52 fraction bits instead of 23), "relative spacing ``|x| 2^-23``"
    (not a power of two), "machine epsilon for every x" (the spacing at 1 only).

    Args:
        ulp32: a function ``ulp32(x)`` taking a tensor and returning one spacing per
            element.
    """
    cases = (
        ("one ulp of float32 at |x|", [1.0, 3.9, 2.0**19, 2.0**20, 1000.5]),
        ("uses |x| for negative numbers", [-1.0, -5.0, -(2.0**20)]),
        ("small numbers too", [1e-3, 0.75, 2.0**-10]),
    )
    for prop, values in cases:
        x = torch.tensor(values, dtype=torch.float64)
        expected = performance.ulp(x, dtype=torch.float32).to(torch.float64)
        exponent = torch.floor(torch.log2(x.abs()))
        yield Case(
            prop,
            {"x": x},
            expected,
            [
                Mistake(
                    "half an ulp",
                    "2^(e - 24) is the largest rounding error; the spacing between "
                    "neighbouring float32 numbers is twice that, 2^(e - 23).",
                    expected / 2,
                ),
                Mistake(
                    "float64's spacing",
                    "float32 has 23 fraction bits (24 significant bits); 52 is float64's.",
                    2.0 ** (exponent - 52),
                ),
                Mistake(
                    "relative spacing |x| 2^-23",
                    "the spacing is constant between two powers of two: round |x| down "
                    "to a power of two first (floor of log2).",
                    x.abs() * 2.0**-23,
                ),
                Mistake(
                    "machine epsilon for every x",
                    "torch.finfo(torch.float32).eps is the spacing at 1 only; it scales "
                    "with the power of two below |x|.",
                    torch.full_like(x, 2.0**-23),
                ),
            ],
            atol=0.0,
            rtol=1e-12,
        )


@checker
def check_roofline_time(roofline_time: Callable[..., object]) -> Iterator[Case]:
    r"""Check a learner's ``roofline_time(flops, bytes_moved, peak_flops, bandwidth)``.

    Answers are compared to a relative 1e-6 (a float32 result is fine). Reference: the
    roofline bound :math:`\max(F/P, B/W)` in seconds: a kernel can be no
    faster than its arithmetic at the peak rate, nor than its memory traffic at full
    bandwidth. Cases: a memory-bound elementwise operation, a compute-bound matrix
    product, and one exactly at the machine balance. Named mistakes: "sum of the two
    floors" (they overlap), "the smaller floor" (min instead of max), "flops over
    bandwidth" (mixed units).

    Args:
        roofline_time: a function of four numbers returning seconds (a number).
    """
    peak, bandwidth = 67e12, 3.35e12  # an H100's float32 rate and its memory bandwidth
    n = 2**24
    cases = (
        ("memory-bound: RoPE-like, 3 flops per 8 bytes", 3.0 * n, 8.0 * n),
        ("compute-bound: a 4096^3 matrix product", 2.0 * 4096**3, 3 * 4.0 * 4096**2),
        ("at the machine balance", 20.0 * n, 1.0 * n),
    )
    for prop, flops, moved in cases:
        inputs = {
            "flops": flops,
            "bytes_moved": moved,
            "peak_flops": peak,
            "bandwidth": bandwidth,
        }
        compute, memory = flops / peak, moved / bandwidth
        yield Case(
            prop,
            inputs,
            f64(max(compute, memory)),
            [
                Mistake(
                    "sum of the two floors",
                    "a kernel moves data while it computes: the time is at least the "
                    "larger of the two floors, not their sum.",
                    f64(compute + memory),
                ),
                Mistake(
                    "the smaller floor",
                    "both floors bind: the time is at least the larger one (max).",
                    f64(min(compute, memory)),
                ),
                Mistake(
                    "flops over bandwidth",
                    "divide the flops by the peak rate and the bytes by the bandwidth.",
                    f64(max(flops / bandwidth, moved / peak)),
                ),
            ],
            atol=0.0,
            rtol=1e-6,
        )


@checker
def check_tiled_attention_intensity(
    tiled_attention_intensity: Callable[..., object],
) -> Iterator[Case]:
    r"""Check ``tiled_attention_intensity(length, head_dim, block_size, bytes_per_element)``.

    Reference: the appendix's count for one head of tiled attention with ``L = S``:
    :math:`4L^2D` flops (:func:`companion.performance.attention_flops`, the two matrix
    products) over the bytes of reading :math:`Q` and writing the output once and reading
    :math:`K` and :math:`V` once per block of queries,
    :math:`b\,(2LD + 2LD\lceil L/B_r \rceil)`. Named mistakes: "K and V read only once"
    (the tiles of scores are on chip, but K and V come back for every query block),
    "multiply-adds counted as one flop", "standard attention's traffic" (the scores
    written and read), "no ceiling for a partial block" (``L / B_r`` or ``L // B_r``).

    Args:
        tiled_attention_intensity: a function of four ints returning flops per byte.
    """
    # Block sizes B_r != 2D: with B_r = 2D standard attention's traffic, b (4LD + 2L^2),
    # is exactly twice the tiled count and could not be told from "multiply-adds counted
    # as one flop". L = 1000, B_r = 96 gives ceil 11, floor 10 and L / B_r = 10.4 apart.
    cases = (
        ("float32, blocks of 64", 4096, 64, 64, 4),
        ("bfloat16 halves the bytes", 4096, 128, 64, 2),
        ("a partial last block counts as a block", 1000, 64, 96, 4),
    )
    for prop, length, head_dim, block, size in cases:
        flops = performance.attention_flops(1, 1, length, length, head_dim)
        blocks = math.ceil(length / block)

        def moved(
            k_blocks: float, n: int = length, d: int = head_dim, b: int = size
        ) -> float:
            return b * (2 * n * d + 2 * n * d * k_blocks)

        inputs = {
            "length": length,
            "head_dim": head_dim,
            "block_size": block,
            "bytes_per_element": size,
        }
        mistakes = [
            Mistake(
                "K and V read only once",
                "each block of queries streams all of K and V through the chip again: "
                "count 2 L D elements per query block, ceil(L / B_r) blocks.",
                f64(flops / moved(1)),
            ),
            Mistake(
                "multiply-adds counted as one flop",
                "QK^T and PV are L S D multiply-adds each, two flops per multiply-add: "
                "4 L^2 D flops in all.",
                f64(flops / 2 / moved(blocks)),
            ),
        ]
        mistakes.append(
            Mistake(
                "standard attention's traffic",
                "that counts the L x L scores written and read back, as standard "
                "attention does; tiling keeps them on chip: count Q and the output "
                "once and K and V once per block of queries.",
                f64(flops / (size * (4 * length * head_dim + 2 * length * length))),
            )
        )
        if length % block:
            for k_blocks in (length / block, length // block):
                mistakes.append(
                    Mistake(
                        "no ceiling for a partial block",
                        "a last, partial block of queries still reads all of K and V: "
                        f"use ceil(L / B_r) = {blocks} blocks, not {k_blocks:g}.",
                        f64(flops / moved(k_blocks)),
                    )
                )
        yield Case(
            prop, inputs, f64(flops / moved(blocks)), mistakes, atol=0.0, rtol=1e-6
        )
