"""Benchmark: companion.rope.apply_rope vs Hugging Face, Meta-style complex RoPE and a copy.

Run from the repository root (``make bench`` runs it; tests never do)::

    .venv/bin/python benchmarks/bench_rope.py            # CPU, float32
    .venv/bin/python benchmarks/bench_rope.py --device cuda

Every row rotates the same query and key tensors (two tensors of the shape shown), side by side
in one run with :mod:`torch.utils.benchmark`:

- ``companion half`` / ``companion interleaved``: :func:`companion.rope.apply_rope` on q and k;
- ``HF apply_rotary_pos_emb``: ``transformers``' LLaMA function with its repeated (L, D) table;
- ``Meta complex``: Meta's LLaMA reference ``apply_rotary_emb`` (``view_as_complex``), on the
  ``(B, L, H, D)`` layout it expects;
- ``clone floor``: ``q.clone(), k.clone()``, the memory traffic every out-of-place rotation
  must pay at least.

Prints a Markdown table (median times and ratios to HF and to the clone) and writes
``benchmarks/results/rope.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from pathlib import Path

import torch
import torch.utils.benchmark as tb

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from companion.rope import apply_rope, rope_cos_sin, rope_frequencies

SHAPES = [(1, 32, 4096, 128), (1, 8, 256, 64)]  # (B, H, L, D)


def meta_apply_rotary_emb(xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor):
    """Meta's LLaMA reference (``llama/model.py``), inputs ``(B, L, H, D)``."""
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    shape = [d if i in (1, xq_.ndim - 1) else 1 for i, d in enumerate(xq_.shape)]
    freqs_cis = freqs_cis.view(*shape)
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


def bench_shape(
    shape, device: torch.device, dtype: torch.dtype, min_run_time: float, rounds: int
) -> dict:
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    _, _, length, head_dim = shape  # (B, H, L, D)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(shape, generator=gen).to(device, dtype)  # (B, H, L, D)
    k = torch.randn(shape, generator=gen).to(device, dtype)
    positions = torch.arange(length)
    cos, sin = rope_cos_sin(positions, rope_frequencies(head_dim), dtype=dtype, device=device)
    hf_cos, hf_sin = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)  # HF's (L, D) table
    q_blhd, k_blhd = q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous()
    freqs_cis = torch.complex(cos.float(), sin.float())  # (L, D/2), Meta's freqs_cis

    cases = {
        "clone floor": "q.clone(); k.clone()",
        "companion half": "apply_rope(q, cos, sin); apply_rope(k, cos, sin)",
        "companion interleaved": (
            "apply_rope(q, cos, sin, layout='interleaved'); "
            "apply_rope(k, cos, sin, layout='interleaved')"
        ),
        "HF apply_rotary_pos_emb": "apply_rotary_pos_emb(q, k, hf_cos, hf_sin, unsqueeze_dim=0)",
        "Meta complex": "meta_apply_rotary_emb(q_blhd, k_blhd, freqs_cis)",
    }
    env = {
        "q": q,
        "k": k,
        "cos": cos,
        "sin": sin,
        "hf_cos": hf_cos,
        "hf_sin": hf_sin,
        "q_blhd": q_blhd,
        "k_blhd": k_blhd,
        "freqs_cis": freqs_cis,
        "apply_rope": apply_rope,
        "apply_rotary_pos_emb": apply_rotary_pos_emb,
        "meta_apply_rotary_emb": meta_apply_rotary_emb,
    }
    timers = {
        name: tb.Timer(stmt, globals=env, label="rope", sub_label=str(shape), description=name)
        for name, stmt in cases.items()
    }
    for timer in timers.values():
        timer.timeit(1)  # warm-up
    # Interleave the implementations over several rounds so that a change in the machine's load
    # hits all of them alike; report the median over rounds of each round's median.
    per_round: dict[str, list[float]] = {name: [] for name in timers}
    for _ in range(rounds):
        for name, timer in timers.items():
            per_round[name].append(timer.blocked_autorange(min_run_time=min_run_time).median)
    medians = {name: statistics.median(ts) for name, ts in per_round.items()}
    return {"shape": list(shape), "medians_s": medians, "round_medians_s": per_round}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--min-run-time", type=float, default=0.4, help="seconds per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per shape")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "rope.json"))
    args = parser.parse_args()
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)

    import transformers

    results = [bench_shape(s, device, dtype, args.min_run_time, args.rounds) for s in SHAPES]
    lines = [
        f"RoPE on q and k, {args.dtype} on {device} "
        f"({torch.get_num_threads()} CPU threads), median over {args.rounds} interleaved rounds "
        "of torch.utils.benchmark medians",
        "",
        "| shape (B, H, L, D) | implementation | median (ms) | / HF | / clone |",
        "|---|---|---:|---:|---:|",
    ]
    for r in results:
        med = r["medians_s"]
        r["ratio_to_hf"] = {n: t / med["HF apply_rotary_pos_emb"] for n, t in med.items()}
        r["ratio_to_clone"] = {n: t / med["clone floor"] for n, t in med.items()}
        for name, t in med.items():
            lines.append(
                f"| {tuple(r['shape'])} | {name} | {t * 1e3:.3f} | "
                f"{r['ratio_to_hf'][name]:.2f} | {r['ratio_to_clone'][name]:.2f} |"
            )
    print("\n".join(lines))

    record = {
        "benchmark": "rope",
        "what": "rotate q and k (two tensors of the shape) once; medians in seconds",
        "rounds": args.rounds,
        "min_run_time_s": args.min_run_time,
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "cuda_device": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        },
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        },
        "device": str(device),
        "dtype": args.dtype,
        "results": results,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
