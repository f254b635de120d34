"""Benchmark: the Triton kernels of companion.kernels against their floors and SDPA (GPU).

Run from the repository root (``make bench`` runs it; tests never do)::

    .venv/bin/python benchmarks/bench_kernels.py --device cuda

On a CUDA device, side by side in one run (``harness.time_cases``):

- **RoPE** at (1, 32, 4096, 128), float32 and bfloat16: ``kernels.rope`` (half layout) on q and
  k against ``q.clone(), k.clone()`` (the floor of any out-of-place rotation: one read, one
  write) and the eager and fused ``apply_rope``. Goal: the Triton kernel within 1.15x of the
  clone.
- **FlashAttention forward** at L = 4096 and 16384, D = 128, bfloat16, B = 1, H = 16, causal
  and not: ``kernels.flash_attention`` against ``F.scaled_dot_product_attention`` restricted
  to its flash backend. Throughput is 4 B H L S D flops (half of that when causal) per second.
  Goal: at least 0.7x SDPA's throughput. Peak memory above the inputs at both lengths: it must
  grow as O(L) (the output and the log-sum-exp), not O(L^2).

On a CPU the kernels run only through Triton's interpreter, a correctness tool that executes
each program in NumPy; timing it says nothing about the kernels, so the script records that the
GPU goals were not measured (the tests check the kernels' values on every run).

Writes ``benchmarks/results/kernels.md`` and ``kernels.json``. To keep a GPU run as the record
the appendix shows, copy ``kernels.json`` to ``benchmarks/recorded/kernels-cuda.json``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from harness import Report, parser, peak_memory, ratios, start, time_cases

from companion.rope import apply_rope, rope_cos_sin, rope_frequencies

ROPE_SHAPE = (1, 32, 4096, 128)  # (B, H, L, D)
FLASH_LENGTHS = (4096, 16384)
FLASH_HEADS, FLASH_DIM = 16, 128


def rope_cases(q, k, cos, sin) -> dict:
    """The same rotation of q and k by each implementation, and the copy floor."""
    from companion import kernels

    return {
        "clone floor": lambda: (q.clone(), k.clone()),
        "Triton kernels.rope": lambda: (
            kernels.rope(q, cos, sin),
            kernels.rope(k, cos, sin),
        ),
        "apply_rope eager": lambda: (apply_rope(q, cos, sin), apply_rope(k, cos, sin)),
        "apply_rope fused": lambda: (
            apply_rope(q, cos, sin, fused=True),
            apply_rope(k, cos, sin, fused=True),
        ),
    }


def bench_rope(report: Report, device: torch.device, args) -> None:
    from companion import kernels

    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        gen = torch.Generator().manual_seed(0)
        q, k = (
            torch.randn(ROPE_SHAPE, generator=gen).to(device, dtype) for _ in range(2)
        )
        cos, sin = rope_cos_sin(
            torch.arange(ROPE_SHAPE[2]), rope_frequencies(ROPE_SHAPE[3]), device=device
        )
        cases = rope_cases(q, k, cos, sin)
        torch.testing.assert_close(kernels.rope(q, cos, sin), apply_rope(q, cos, sin))
        medians = time_cases(cases, args)
        to_clone = ratios(medians, "clone floor")
        for name, t in medians.items():
            rows.append(
                {
                    "dtype": str(dtype).removeprefix("torch."),
                    "case": name,
                    "us": t * 1e6,
                    "clone": to_clone[name],
                }
            )
        ratio = to_clone["Triton kernels.rope"]
        report.goal(
            f"Triton RoPE <= 1.15x x.clone() at {ROPE_SHAPE}, {dtype}",
            ratio <= 1.15,
            f"{ratio:.2f}x",
        )
    report.table(
        f"RoPE on q and k, {ROPE_SHAPE}",
        {
            "dtype": ("dtype", ""),
            "case": ("implementation", ""),
            "us": ("median µs", ".1f"),
            "clone": ("/ clone", ".2f"),
        },
        rows,
    )


def bench_flash(report: Report, device: torch.device, args) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from companion import kernels

    rows, peaks = [], {}
    for length in FLASH_LENGTHS:
        for causal in (False, True):
            gen = torch.Generator().manual_seed(0)
            shape = (1, FLASH_HEADS, length, FLASH_DIM)
            q, k, v = (
                torch.randn(shape, generator=gen).to(device, torch.bfloat16)
                for _ in "qkv"
            )

            def sdpa(q=q, k=k, v=v, causal=causal):
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

            def triton(q=q, k=k, v=v, causal=causal):
                return kernels.flash_attention(q, k, v, is_causal=causal)

            torch.testing.assert_close(triton()[0], sdpa(), atol=2e-2, rtol=0)
            medians = time_cases(
                {"SDPA flash": sdpa, "Triton flash_attention": triton}, args
            )
            flops = (
                4 * FLASH_HEADS * length * length * FLASH_DIM * (0.5 if causal else 1.0)
            )
            rel = medians["SDPA flash"] / medians["Triton flash_attention"]
            for name, t in medians.items():
                rows.append(
                    {
                        "L": length,
                        "causal": causal,
                        "case": name,
                        "ms": t * 1e3,
                        "tflops": flops / t / 1e12,
                    }
                )
            report.goal(
                f"Triton FlashAttention >= 0.7x SDPA flash throughput, L={length}, "
                f"D={FLASH_DIM}, bf16, causal={causal}",
                rel >= 0.7,
                f"{rel:.2f}x",
            )
            if not causal:
                peaks[length] = peak_memory(triton, device)
    report.table(
        f"FlashAttention forward, B=1, H={FLASH_HEADS}, D={FLASH_DIM}, bfloat16",
        {
            "L": ("L", "d"),
            "causal": ("causal", ""),
            "case": ("implementation", ""),
            "ms": ("median ms", ".2f"),
            "tflops": ("TFLOP/s", ".1f"),
        },
        rows,
    )
    small, large = FLASH_LENGTHS
    growth = peaks[large] / peaks[small]
    report.note(
        f"Peak memory above the inputs: {peaks[small] / 2**20:.1f} MiB at L={small}, "
        f"{peaks[large] / 2**20:.1f} MiB at L={large}: x{growth:.2f} for x{large // small} "
        "in L (O(L^2) would be x16)"
    )
    report.goal(
        "Triton FlashAttention peak memory O(L)",
        growth <= 1.25 * (large / small),
        f"x{growth:.2f} for x{large // small} in L",
    )


def main() -> None:
    args = parser(__doc__.splitlines()[0]).parse_args()
    device = start(args)
    report = Report(
        "kernels",
        "Triton kernels: RoPE and the FlashAttention forward",
        device,
        {"rope shape": ROPE_SHAPE, "flash lengths": FLASH_LENGTHS},
        args,
    )
    if device.type != "cuda":
        report.note(
            "Not measured: the Triton kernels' goals are GPU goals, and without a CUDA device "
            "the kernels run only through Triton's interpreter (a correctness tool; the tests "
            "check their values on every run). Run with --device cuda on a GPU."
        )
    else:
        bench_rope(report, device, args)
        bench_flash(report, device, args)
    report.finish(args.out_dir)


if __name__ == "__main__":
    main()
