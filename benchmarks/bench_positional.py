"""Benchmark: the sinusoidal position table vs the notes' per-element loop and the exp/log snippet.

Three ways to build the same ``(L, D)`` table of Vaswani et al. (interleaved sin/cos), side by
side in one run (``harness.time_cases``), each with its largest error against the table built
in float64:

- ``companion``: :func:`companion.positional.sinusoidal_encoding` (float64 angles, one cast);
- ``exp/log snippet``: the PyTorch tutorial / Annotated Transformer code,
  ``div_term = exp(arange(0, D, 2) * -(log(10000) / D))`` and float32 angles;
- ``notes' loop``: the course notes' code, one ``np.power`` per element in Python lists, then
  ``torch.FloatTensor`` (and a copy to the device).

The table is built once per model, so its speed rarely matters; the loop's cost shows what
per-element Python costs next to one vectorised expression.

Run from the repository root (``make bench`` does)::

    .venv/bin/python benchmarks/bench_positional.py [--device cuda]

Writes benchmarks/results/positional.md and positional.json.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from harness import Report, parser, ratios, start, time_cases

from companion.performance import max_abs_error
from companion.positional import sinusoidal_encoding

SHAPES = [(512, 128), (2048, 512)]  # (L, D)


def notes_loop(seq_len: int, hidden_dim: int) -> torch.Tensor:
    """The notes' code (seed 002), wrapped in a function; numpy, one element at a time."""

    def get_position_angle_vec(position):
        return [
            position / np.power(10000, 2 * (hid_j // 2) / hidden_dim)
            for hid_j in range(hidden_dim)
        ]

    position_angle_vecs = np.array(
        [get_position_angle_vec(pos_i) for pos_i in range(seq_len)]
    )
    position_angle_vecs[:, 0::2] = np.sin(position_angle_vecs[:, 0::2])  # dim 2t
    position_angle_vecs[:, 1::2] = np.cos(position_angle_vecs[:, 1::2])  # dim 2t+1
    return torch.FloatTensor(position_angle_vecs)  # (L, D); the notes add .unsqueeze(0)


def exp_log_snippet(max_len: int, d_model: int, device: torch.device) -> torch.Tensor:
    """The common snippet (PyTorch tutorial, Annotated Transformer), float32 throughout."""
    pe = torch.zeros(max_len, d_model, device=device)
    position = torch.arange(0, max_len, device=device).unsqueeze(1)
    div_term = torch.exp(
        torch.arange(0, d_model, 2, device=device) * -(math.log(10000.0) / d_model)
    )
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term)
    return pe


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    args = p.parse_args()
    device = start(args)
    report = Report(
        "positional",
        f"Sinusoidal position table (L, D), float32 on {device}",
        device,
        {"dtype": "float32", "shapes (L, D)": SHAPES, "rounds": args.rounds},
        args=args,
    )
    rows = []
    for length, dim in SHAPES:
        cases = {
            "companion": lambda n=length, d=dim: sinusoidal_encoding(
                n, d, device=device
            ),
            "exp/log snippet": lambda n=length, d=dim: exp_log_snippet(n, d, device),
            "notes' loop": lambda n=length, d=dim: notes_loop(n, d).to(device),
        }
        medians = time_cases(cases, args)
        to_companion = ratios(medians, "companion")
        exact = sinusoidal_encoding(length, dim, dtype=torch.float64, device=device)
        for name, fn in cases.items():
            rows.append(
                {
                    "shape": str((length, dim)),
                    "implementation": name,
                    "median_ms": medians[name] * 1e3,
                    "ratio": to_companion[name],
                    "max_error": max_abs_error(fn(), exact),
                }
            )
    report.table(
        "Median time, ratio to companion (same run), largest error vs the float64 table",
        {
            "shape": ("shape (L, D)", ""),
            "implementation": ("implementation", ""),
            "median_ms": ("median (ms)", ".3f"),
            "ratio": ("/ companion", ".1f"),
            "max_error": ("max abs error", ".1e"),
        },
        rows,
    )
    report.note(
        "The snippet's error grows with the position (float32 angles: spacing 2**-12 near "
        "position 2048); the loop and companion round only once, at the end."
    )
    report.finish(args.out_dir)


if __name__ == "__main__":
    main()
