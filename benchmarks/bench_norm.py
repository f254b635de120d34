"""Benchmark: companion layer_norm / rms_norm vs F.layer_norm / F.rms_norm, eager and compiled.

Side by side in one run (``harness.time_cases``) on the same ``(B, L, D)`` float32 tensor with a
gain (and, for LayerNorm, a bias) of width ``D``:

- ``clone floor``: ``x.clone()``, the memory traffic (read ``x``, write a result) that any
  out-of-place normalization pays at least;
- ``companion ...``: :func:`companion.norm.layer_norm` and :func:`companion.norm.rms_norm`,
  written as a few torch operations (each reads and writes the tensor once);
- ``torch F....``: torch's fused kernels;
- ``compiled companion ...``: the package's functions through ``torch.compile``, which fuses
  the operations into one pass, when a compiler works on this machine. If it does not (no C++
  compiler for the CPU backend, an unsupported platform, ``--no-compile``), the table says
  "not available" with the reason and the script goes on.

Norms do about 5-10 floating-point operations per element and move 8 bytes per float32 element:
memory bandwidth bounds them, so the clone is the yardstick.

Run from the repository root (``make bench`` does)::

    .venv/bin/python benchmarks/bench_norm.py [--device cuda] [--no-compile]

Writes benchmarks/results/norm.md and norm.json.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from harness import Report, parser, ratios, start, time_cases

from companion.norm import layer_norm, rms_norm
from companion.performance import max_abs_error, tensor_bytes

SHAPES = [(8, 512, 1024), (1, 128, 512)]  # (B, L, D)
EPS_RMS = 1e-6  # passed to both implementations (their defaults differ)


def try_compile(fn, x: torch.Tensor):
    """``(compiled, None)`` if ``torch.compile(fn)`` runs here, else ``(None, reason)``."""
    try:
        compiled = torch.compile(fn, dynamic=False)
        torch.testing.assert_close(compiled(x), fn(x))
    except (
        Exception
    ) as err:  # any failure means "no working compiler here": report, go on
        reason = f"{type(err).__name__}: {str(err).strip().splitlines()[0][:120]}"
        return None, reason
    return compiled, None


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument(
        "--no-compile", action="store_true", help="skip the torch.compile cases"
    )
    args = p.parse_args()
    device = start(args)
    report = Report(
        "norm",
        f"LayerNorm and RMSNorm, float32 on {device}",
        device,
        {"dtype": "float32", "shapes (B, L, D)": SHAPES, "rounds": args.rounds},
        args=args,
    )
    rows = []
    compile_reason = "--no-compile given" if args.no_compile else None
    for shape in SHAPES:
        dim = shape[-1]
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(shape, generator=gen).to(device)  # (B, L, D)
        w = (1 + 0.1 * torch.randn(dim, generator=gen)).to(device)
        b = (0.1 * torch.randn(dim, generator=gen)).to(device)
        fns = {
            "companion layer_norm": lambda x, d=dim, w=w, b=b: layer_norm(x, d, w, b),
            "torch F.layer_norm": lambda x, d=dim, w=w, b=b: F.layer_norm(
                x, (d,), w, b
            ),
            "companion rms_norm": lambda x, d=dim, w=w: rms_norm(x, d, w, eps=EPS_RMS),
            "torch F.rms_norm": lambda x, d=dim, w=w: F.rms_norm(
                x, (d,), w, eps=EPS_RMS
            ),
        }
        if compile_reason is None:
            for name in ("companion layer_norm", "companion rms_norm"):
                compiled, reason = try_compile(fns[name], x)
                if compiled is None:
                    compile_reason = reason
                    break
                fns[f"compiled {name}"] = compiled
        cases = {"clone floor": lambda x=x: x.clone()}
        cases.update({name: (lambda fn=fn, x=x: fn(x)) for name, fn in fns.items()})
        medians = time_cases(cases, args)
        to_clone = ratios(medians, "clone floor")
        moved = 2 * tensor_bytes(x)  # read x, write the result
        references = {
            "layer_norm": F.layer_norm(x.double(), (dim,), w.double(), b.double()),
            "rms_norm": F.rms_norm(x.double(), (dim,), w.double(), eps=EPS_RMS),
        }
        for name, t in medians.items():
            kind = "layer_norm" if "layer_norm" in name else "rms_norm"
            torch_name = f"torch F.{kind}"
            rows.append(
                {
                    "shape": str(shape),
                    "implementation": name,
                    "median_ms": t * 1e3,
                    "ratio_to_torch": None
                    if name == "clone floor"
                    else t / medians[torch_name],
                    "ratio_to_clone": to_clone[name],
                    "gb_per_s": moved / t / 1e9,
                    "max_error_vs_float64": None
                    if name == "clone floor"
                    else max_abs_error(fns[name](x), references[kind]),
                }
            )
        del x
    report.table(
        "Median of interleaved rounds; GB/s = (bytes of x read + result written) / time",
        {
            "shape": ("shape (B, L, D)", ""),
            "implementation": ("implementation", ""),
            "median_ms": ("median (ms)", ".3f"),
            "ratio_to_torch": ("/ torch F", ".2f"),
            "ratio_to_clone": ("/ clone", ".2f"),
            "gb_per_s": ("GB/s", ".1f"),
            "max_error_vs_float64": ("max error vs float64", ".1e"),
        },
        rows,
    )
    if compile_reason is not None:
        report.note(f"torch.compile: not available ({compile_reason}).")
    else:
        report.note(
            "torch.compile: available; compiled rows measured after one warm-up call."
        )
    report.settings["torch.compile"] = compile_reason or "available"
    report.finish(args.out_dir)


if __name__ == "__main__":
    main()
