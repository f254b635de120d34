"""Benchmark: how far float32 can be trusted in RoPE, LayerNorm and attention.

Three studies, each against a float64 reference computed from the *same* float32 inputs (so
that only the arithmetic is judged, not the rounding of the inputs):

1. RoPE output error as the position grows to 2**20, for three table recipes
   (:func:`companion.performance.rope_table`): the package's float64 angles, Hugging Face's
   float32 angles, and a bfloat16 table. Errors are given in float32 units in the last place
   (ulps) of the output scale. Goal: the package stays within 4 ulps at 2**20.
2. LayerNorm error for inputs with a large mean (std 1, mean up to 1e5): the package's two-pass
   statistics and ``F.layer_norm`` vs the one-pass ``E[x^2] - E[x]^2`` variance.
3. Attention with large logits (queries scaled up): the package's attention and tiled attention
   and ``F.scaled_dot_product_attention`` vs a softmax that does not subtract the maximum.

Run from the repository root (``make bench`` does)::

    .venv/bin/python benchmarks/bench_precision.py [--device cuda]

The RoPE study runs on the CPU (its error does not depend on the device); the other two on
``--device``. Writes benchmarks/results/precision.md and precision.json.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from harness import Report, parser, start

from companion.attention import scaled_dot_product_attention, tiled_attention
from companion.norm import layer_norm
from companion.performance import (
    ROPE_RECIPES,
    max_abs_error,
    naive_softmax_attention,
    one_pass_layer_norm,
    rope_error_by_position,
    ulp,
)

HEAD_DIM = 128
ROPE_SHOWN = [0, 10, 14, 16, 18, 20]  # log2 of the positions in the table
MEANS = [0.0, 1e1, 1e2, 1e3, 1e4, 1e5]
LOGIT_SCALES = [1.0, 10.0, 30.0, 100.0, 1000.0]


def rope_study(report: Report) -> None:
    positions = torch.tensor([2.0**k for k in range(21)])  # 1 ... 2**20
    errors = {
        r: rope_error_by_position(positions, HEAD_DIM, recipe=r) for r in ROPE_RECIPES
    }
    rows = []
    for recipe, e in errors.items():
        ulps = e.in_ulps()
        row = {"recipe": recipe}
        for k in ROPE_SHOWN:
            row[f"ulps_2^{k}"] = ulps[k].item()
        row["abs_error_2^20"] = e.error[-1].item()
        row["errors_by_position"] = e.error.tolist()
        rows.append(row)
    columns = {"recipe": ("recipe", "")}
    columns.update({f"ulps_2^{k}": (f"m = 2^{k}", ".1f") for k in ROPE_SHOWN})
    columns["abs_error_2^20"] = ("abs error at 2^20", ".1e")
    report.table(
        f"RoPE output error in float32 ulps of the output scale, D={HEAD_DIM}, 8 random vectors",
        columns,
        rows,
    )
    package = errors["float64-angles"]
    at_end = package.in_ulps()[-1].item()
    report.goal(
        "RoPE error at position 2^20 within 4 float32 ulps of the output scale",
        at_end <= 4.0,
        f"{at_end:.2f} ulps (scale {package.scale[-1].item():.2f}, one ulp "
        f"{ulp(package.scale[-1]).item():.1e}); HF float32 angles: "
        f"{errors['float32-angles'].in_ulps()[-1].item():.0f} ulps",
    )


def layer_norm_study(report: Report, device: torch.device) -> None:
    gen = torch.Generator().manual_seed(1)
    noise = torch.randn(64, 1024, generator=gen)
    rows = []
    for mean in MEANS:
        x = (noise + mean).to(device)  # float32, std 1
        exact = layer_norm(x.double(), 1024)  # float64, two-pass, on the same inputs
        rows.append(
            {
                "mean": mean,
                "ulp_of_mean": ulp(mean).item(),
                "companion layer_norm": max_abs_error(layer_norm(x, 1024), exact),
                "torch F.layer_norm": max_abs_error(F.layer_norm(x, (1024,)), exact),
                "one-pass E[x^2]-E[x]^2": max_abs_error(one_pass_layer_norm(x), exact),
            }
        )
    report.table(
        "LayerNorm: largest error vs float64 (same float32 inputs), std 1, D=1024; "
        "inf = NaN or infinity in the output",
        {
            "mean": ("input mean", ".0e"),
            "ulp_of_mean": ("float32 ulp of the mean", ".1e"),
            "companion layer_norm": ("companion layer_norm", ".1e"),
            "torch F.layer_norm": ("torch F.layer_norm", ".1e"),
            "one-pass E[x^2]-E[x]^2": ("one-pass E[x²]−E[x]²", ".1e"),
        },
        rows,
    )


def attention_study(report: Report, device: torch.device) -> None:
    gen = torch.Generator().manual_seed(2)
    q0, k, v = (torch.randn(1, 2, 128, 64, generator=gen).to(device) for _ in range(3))
    rows = []
    for s in LOGIT_SCALES:
        q = s * q0
        exact = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
        logits = (q @ k.transpose(-2, -1)) / 8.0  # (1, 2, L, S), scale 1/sqrt(64)
        rows.append(
            {
                "query_scale": s,
                "max_logit": logits.abs().max().item(),
                "companion sdpa": max_abs_error(
                    scaled_dot_product_attention(q, k, v), exact
                ),
                "companion tiled": max_abs_error(
                    tiled_attention(q, k, v, block_size=32), exact
                ),
                "torch F.sdpa": max_abs_error(
                    F.scaled_dot_product_attention(q, k, v), exact
                ),
                "naive softmax": max_abs_error(naive_softmax_attention(q, k, v), exact),
            }
        )
    report.table(
        "Attention: largest error vs float64 (same float32 inputs), (1, 2, 128, 64); "
        "inf = NaN in the output",
        {
            "query_scale": ("query scale", ".0f"),
            "max_logit": ("largest abs logit", ".0f"),
            "companion sdpa": ("companion", ".1e"),
            "companion tiled": ("companion tiled", ".1e"),
            "torch F.sdpa": ("torch F.sdpa", ".1e"),
            "naive softmax": ("softmax without max shift", ".1e"),
        },
        rows,
    )


def main() -> None:
    args = parser(__doc__.splitlines()[0]).parse_args()
    device = start(args)
    report = Report(
        "precision",
        f"float32 precision of RoPE, LayerNorm and attention ({device})",
        device,
        {"dtype": "float32", "reference": "float64 on the same float32 inputs"},
        args=args,
    )
    rope_study(report)
    layer_norm_study(report, device)
    attention_study(report, device)
    report.finish(args.out_dir)


if __name__ == "__main__":
    main()
