"""Benchmark: the package's attention and tiled attention vs F.scaled_dot_product_attention.

Side by side in one run, for L = 1024 ... 16384 (self-attention, S = L): time
(torch.utils.benchmark) and peak memory (companion.attention.measure_peak_memory: CUDA allocator
counters, or on the CPU the peak of the live tensors that torch operators create, counted through
a TorchDispatchMode; a fused kernel's internal scratch memory is not seen there), next to the size
of the full (L, S) float32 score matrix, and the largest difference from torch's result.

Goal checked and reported: tiled attention's peak memory at L = 16384 is at most 1/20 of the
full score matrix's, with the same result.

Run from the repository root (``make bench`` does):

    .venv/bin/python benchmarks/bench_attention.py            # CPU, about 2 minutes
    .venv/bin/python benchmarks/bench_attention.py --device cuda

Writes a Markdown table to stdout and JSON to benchmarks/results/attention.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils import benchmark

from companion.attention import measure_peak_memory, scaled_dot_product_attention, tiled_attention

MiB = 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--heads", type=int, default=1)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--block-size", type=int, default=512)
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "attention.json"
    )
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    started = time.perf_counter()

    methods = {
        "companion full": lambda q, k, v: scaled_dot_product_attention(q, k, v),
        "companion tiled": lambda q, k, v: tiled_attention(q, k, v, block_size=args.block_size),
        "torch F.sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
    }
    rows = []
    for length in args.lengths:
        shape = (1, args.heads, length, args.head_dim)  # (B, H, L, D)
        q, k, v = (torch.randn(shape, device=device) for _ in range(3))
        score_bytes = args.heads * length * length * 4  # one float32 (L, S) matrix
        with torch.no_grad():
            reference = F.scaled_dot_product_attention(q, k, v)
            for name, fn in methods.items():
                number = 3 if length <= 4096 else 1
                timer = benchmark.Timer(
                    stmt="fn(q, k, v)", globals={"fn": fn, "q": q, "k": k, "v": v}
                )
                if length <= 4096:
                    timer.timeit(1)  # warm-up
                seconds = timer.timeit(number).median
                gc.collect()
                out = None

                def run(fn=fn, q=q, k=k, v=v) -> None:
                    nonlocal out
                    out = fn(q, k, v)

                peak = measure_peak_memory(run, device=device)
                diff = (out - reference).abs().max().item()
                del out
                gc.collect()
                rows.append(
                    {
                        "L": length,
                        "method": name,
                        "time_s": seconds,
                        "peak_bytes": peak,
                        "score_matrix_bytes": score_bytes,
                        "peak_over_score_matrix": None if peak is None else peak / score_bytes,
                        "max_abs_diff_vs_torch": diff,
                    }
                )
                print(
                    f"  L={length:6d} {name:16s} {seconds:8.3f} s  peak "
                    f"{'n/a' if peak is None else f'{peak / MiB:9.1f} MiB'}",
                    flush=True,
                )
        del q, k, v, reference
        gc.collect()

    print()
    print(
        f"Attention, B=1, H={args.heads}, D={args.head_dim}, S=L, float32, {device}, "
        f"tiled block_size={args.block_size}"
    )
    print()
    print(
        "| L | method | time (s) | peak memory (MiB) | score matrix (MiB) | peak / score matrix "
        "| max abs diff vs torch |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|")
    for r in rows:
        peak = "n/a" if r["peak_bytes"] is None else f"{r['peak_bytes'] / MiB:.1f}"
        ratio = (
            "n/a" if r["peak_over_score_matrix"] is None else f"{r['peak_over_score_matrix']:.3f}"
        )
        print(
            f"| {r['L']} | {r['method']} | {r['time_s']:.3f} | {peak} | "
            f"{r['score_matrix_bytes'] / MiB:.0f} | {ratio} | {r['max_abs_diff_vs_torch']:.1e} |"
        )

    largest = max(args.lengths)
    tiled = next(r for r in rows if r["L"] == largest and r["method"] == "companion tiled")
    ratio = tiled["peak_over_score_matrix"]
    goal_met = ratio is not None and ratio <= 1 / 20 and tiled["max_abs_diff_vs_torch"] < 1e-4
    print()
    print(
        f"Goal (tiled peak <= 1/20 of the score matrix at L={largest}, same result): "
        f"{'met' if goal_met else 'NOT met'}; measured ratio "
        f"{'n/a' if ratio is None else f'1/{1 / ratio:.0f}' if ratio > 0 else '0'}, "
        f"max abs diff {tiled['max_abs_diff_vs_torch']:.1e}"
    )
    elapsed = time.perf_counter() - started
    print(f"Total time {elapsed:.0f} s")

    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "benchmark": "attention",
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "batch": 1,
        "heads": args.heads,
        "head_dim": args.head_dim,
        "block_size": args.block_size,
        "dtype": "float32",
        "memory_method": "torch.cuda.max_memory_allocated"
        if device.type == "cuda"
        else "peak of live tensors created by torch operators (TorchDispatchMode count)",
        "rows": rows,
        "goal": {
            "L": largest,
            "tiled_peak_over_score_matrix": ratio,
            "max_abs_diff_vs_torch": tiled["max_abs_diff_vs_torch"],
            "met": goal_met,
        },
        "elapsed_s": elapsed,
    }
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"Wrote {args.out}")


if __name__ == "__main__":
    main()
