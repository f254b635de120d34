"""Benchmark: the package's attention and tiled attention vs F.scaled_dot_product_attention.

Side by side in one run, for L = 1024 ... 16384 (self-attention, S = L): time
(torch.utils.benchmark, CUDA synchronised) and peak memory (``harness.peak_memory``, i.e.
companion.attention.measure_peak_memory: CUDA allocator counters, or on the CPU the peak of the
live tensors that torch operators create, counted through a TorchDispatchMode; a fused kernel's
internal scratch memory is not seen there), next to the size of the full (L, S) float32 score
matrix, the achieved FLOP rate of the two matrix products, and the largest difference from
torch's result.

The largest lengths take seconds per call on a CPU, so this script does not use the harness's
interleaved rounds: up to L = 4096 each method is warmed up and timed 3 times (median), above
that timed once.

Goal checked and reported: tiled attention's peak memory at L = 16384 is at most 1/20 of the
full version's (and of the score matrix's), with the same result.

Run from the repository root (``make bench`` does):

    .venv/bin/python benchmarks/bench_attention.py            # CPU, about 2 minutes
    .venv/bin/python benchmarks/bench_attention.py --device cuda

Writes Markdown tables to stdout and benchmarks/results/attention.md and attention.json.
"""

from __future__ import annotations

import gc

import torch
import torch.nn.functional as F
from harness import Report, parser, peak_memory, start
from torch.utils import benchmark

from companion.attention import scaled_dot_product_attention, tiled_attention
from companion.performance import attention_flops, max_abs_error

MiB = 2**20


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument(
        "--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384]
    )
    p.add_argument("--heads", type=int, default=1)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--block-size", type=int, default=512)
    args = p.parse_args()
    device = start(args)
    report = Report(
        "attention",
        f"Attention, B=1, H={args.heads}, D={args.head_dim}, S=L, float32, {device}",
        device,
        {
            "dtype": "float32",
            "batch": 1,
            "heads": args.heads,
            "head_dim": args.head_dim,
            "lengths": args.lengths,
            "tiled block_size": args.block_size,
            "memory method": "torch.cuda.max_memory_allocated"
            if device.type == "cuda"
            else "peak of live tensors created by torch operators (TorchDispatchMode count)",
        },
        args=args,
    )

    methods = {
        "companion full": lambda q, k, v: scaled_dot_product_attention(q, k, v),
        "companion tiled": lambda q, k, v: tiled_attention(
            q, k, v, block_size=args.block_size
        ),
        "torch F.sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
    }
    rows = []
    for length in args.lengths:
        shape = (1, args.heads, length, args.head_dim)  # (B, H, L, D)
        q, k, v = (torch.randn(shape, device=device) for _ in range(3))
        score_bytes = args.heads * length * length * 4  # one float32 (L, S) matrix
        flops = attention_flops(1, args.heads, length, length, args.head_dim)
        with torch.no_grad():
            reference = F.scaled_dot_product_attention(q, k, v)
            for name, fn in methods.items():
                number = 3 if length <= 4096 else 1
                timer = benchmark.Timer(
                    stmt="fn(q, k, v)",
                    globals={"fn": fn, "q": q, "k": k, "v": v},
                    num_threads=torch.get_num_threads(),
                )
                if length <= 4096:
                    timer.timeit(1)  # warm-up
                seconds = timer.timeit(number).median
                gc.collect()
                out = None

                def run(fn=fn, q=q, k=k, v=v) -> None:
                    nonlocal out
                    out = fn(q, k, v)

                peak = peak_memory(run, device)
                diff = max_abs_error(out, reference)
                del out
                gc.collect()
                rows.append(
                    {
                        "L": length,
                        "method": name,
                        "time_s": seconds,
                        "gflop_per_s": flops / seconds / 1e9,
                        "peak_bytes": peak,
                        "peak_mib": peak / MiB,
                        "score_matrix_bytes": score_bytes,
                        "score_matrix_mib": score_bytes / MiB,
                        "peak_over_score_matrix": peak / score_bytes,
                        "max_abs_diff_vs_torch": diff,
                    }
                )
                print(
                    f"  L={length:6d} {name:16s} {seconds:8.3f} s  peak {peak / MiB:9.1f} MiB",
                    flush=True,
                )
        del q, k, v, reference
        gc.collect()

    print()
    report.table(
        f"Time, FLOP rate of QK^T and PV (4 L^2 D per head), peak memory; "
        f"tiled block_size={args.block_size}",
        {
            "L": ("L", "d"),
            "method": ("method", ""),
            "time_s": ("time (s)", ".3f"),
            "gflop_per_s": ("GFLOP/s", ".1f"),
            "peak_mib": ("peak memory (MiB)", ".1f"),
            "score_matrix_mib": ("score matrix (MiB)", ".0f"),
            "peak_over_score_matrix": ("peak / score matrix", ".3f"),
            "max_abs_diff_vs_torch": ("max abs diff vs torch", ".1e"),
        },
        rows,
    )

    largest = max(args.lengths)
    at_largest = {r["method"]: r for r in rows if r["L"] == largest}
    tiled, full = at_largest["companion tiled"], at_largest["companion full"]
    over_full = tiled["peak_bytes"] / full["peak_bytes"]
    report.goal(
        f"tiled attention peak memory at L={largest} <= 1/20 of the full version's, same result",
        over_full <= 1 / 20 and tiled["max_abs_diff_vs_torch"] < 1e-4,
        f"tiled {tiled['peak_mib']:.1f} MiB / full {full['peak_mib']:.1f} MiB = 1/"
        f"{1 / over_full:.0f} (score matrix alone: 1/{1 / tiled['peak_over_score_matrix']:.0f}); "
        f"max abs diff vs torch {tiled['max_abs_diff_vs_torch']:.1e}",
    )
    report.finish(args.out_dir)


if __name__ == "__main__":
    main()
