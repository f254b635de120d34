"""Shared harness of the scripts in ``benchmarks/``: options, timing, metadata, reports.

Every ``bench_*.py`` script does the same four things through this module:

1. parse the common options (``--device cpu|cuda``, ``--min-run-time``, ``--rounds``,
   ``--out-dir``) with :func:`parser` and :func:`start`;
2. time implementations *side by side in one run*, on the same tensors, with
   :func:`time_cases` (:func:`companion.performance.compare_timings`: warm-up, then the median
   of interleaved rounds of :mod:`torch.utils.benchmark` measurements, whose timer synchronises
   CUDA before reading the clock), and ratios to a reference measured in that same run;
3. measure peak memory where it matters with :func:`peak_memory`
   (:func:`companion.attention.measure_peak_memory`: CUDA allocator counters, or on the CPU a
   count of the live tensors that torch operators create);
4. collect tables and goals in a :class:`Report`, which prints Markdown and writes
   ``benchmarks/results/<name>.md`` and ``<name>.json`` with the machine, the versions, the
   device, dtype and settings.

Nothing else in the repository imports this module; the tests never time anything.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing the package

import torch  # noqa: E402

from companion.attention import measure_peak_memory  # noqa: E402
from companion.performance import compare_timings, keep_freed_memory  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def parser(description: str) -> argparse.ArgumentParser:
    """An argument parser with the options every benchmark script shares."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument(
        "--min-run-time",
        type=float,
        default=0.2,
        help="seconds of calls per measurement",
    )
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds per case")
    p.add_argument(
        "--out-dir", type=Path, default=RESULTS, help="where to write .md and .json"
    )
    p.add_argument(
        "--allocator",
        choices=["steady", "default"],
        default="steady",
        help="steady (default): the C allocator reuses freed memory, so CPU timings measure "
        "kernels, not page faults (companion.performance.keep_freed_memory); default: leave "
        "glibc's settings alone",
    )
    return p


def start(args: argparse.Namespace) -> torch.device:
    """Check the requested device, set up the allocator and seed torch; returns the device.

    Sets ``args.allocator_applied``: whether the steady allocator setting took effect.
    """
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda was asked for, but torch sees no CUDA device")
    args.allocator_applied = args.allocator == "steady" and keep_freed_memory()
    torch.manual_seed(0)
    return device


def machine(device: torch.device) -> dict:
    """The machine a measurement ran on."""
    info = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": str(device),
        "device_name": None,
    }
    if device.type == "cuda":
        info["device_name"] = torch.cuda.get_device_name(device)
    return info


def versions() -> dict:
    """Versions of Python and of the libraries the benchmarks use (``None``: not installed)."""
    found = {"python": platform.python_version(), "torch": torch.__version__}
    for name in ("numpy", "transformers", "triton"):
        try:
            module = __import__(name)
        except ImportError:
            found[name] = None
        else:
            found[name] = module.__version__
    return found


def time_cases(
    cases: Mapping[str, Callable[[], object]], args: argparse.Namespace
) -> dict[str, float]:
    """Median seconds per call of each case, side by side (see the module docstring)."""
    return compare_timings(cases, min_run_time=args.min_run_time, rounds=args.rounds)


def peak_memory(fn: Callable[[], object], device: torch.device) -> int:
    """Peak bytes that ``fn()`` allocates above what was in use before it."""
    return measure_peak_memory(fn, device=device)


def ratios(medians: Mapping[str, float], reference: str) -> dict[str, float]:
    """Each median divided by the reference's, measured in the same run."""
    return {name: t / medians[reference] for name, t in medians.items()}


class Report:
    """Tables and goals of one benchmark script, printed as Markdown and written to disk.

    Args:
        name: file stem of the outputs (``results/<name>.md`` and ``.json``).
        title: one line saying what is measured.
        device: the device measured on.
        settings: anything else that a reader needs to reproduce the run (dtype, sizes, ...).
    """

    def __init__(
        self, name: str, title: str, device: torch.device, settings: Mapping, args=None
    ) -> None:
        self.name = name
        self.title = title
        self.device = device
        self.settings = dict(settings)
        if args is not None:  # the options every script shares
            self.settings["C allocator"] = (
                "steady (freed memory reused)"
                if getattr(args, "allocator_applied", False)
                else "default (glibc settings)"
            )
        self.tables: list[dict] = []
        self.goals: list[dict] = []
        self.notes: list[str] = []
        self.started = time.perf_counter()
        print(f"# {title}\n", flush=True)

    def table(
        self,
        title: str,
        columns: Mapping[str, tuple[str, str]],
        rows: Sequence[Mapping],
    ) -> None:
        """Add a table and print it.

        Args:
            title: a line above the table.
            columns: key -> (header, format spec, e.g. ``".3f"``; ``""`` for ``str``).
            rows: one mapping per row holding at least the keys of ``columns`` (``None``
                prints as ``n/a``); every key is kept in the JSON.
        """

        def cell(value: object, spec: str) -> str:
            if value is None:
                return "n/a"
            return format(value, spec) if spec else str(value)

        lines = [f"## {title}", ""]
        lines.append("| " + " | ".join(header for header, _ in columns.values()) + " |")
        lines.append(
            "|"
            + "|".join("---:" if spec else "---" for _, spec in columns.values())
            + "|"
        )
        for row in rows:
            cells = (cell(row[key], spec) for key, (_, spec) in columns.items())
            lines.append("| " + " | ".join(cells) + " |")
        text = "\n".join(lines)
        print(text + "\n", flush=True)
        self.tables.append(
            {"title": title, "markdown": text, "rows": [dict(r) for r in rows]}
        )

    def note(self, text: str) -> None:
        """Add and print a line of explanation (e.g. why a case was not measured)."""
        print(text + "\n", flush=True)
        self.notes.append(text)

    def goal(self, text: str, passed: bool, measured: str) -> None:
        """Record a goal of the issue and print ``PASS``/``FAIL`` with the measured value."""
        line = f"GOAL {'PASS' if passed else 'FAIL'}: {text} (measured: {measured})"
        print(line, flush=True)
        self.goals.append({"goal": text, "passed": bool(passed), "measured": measured})

    def finish(self, out_dir: Path) -> None:
        """Write ``<name>.md`` and ``<name>.json`` into ``out_dir``."""
        elapsed = time.perf_counter() - self.started
        meta = {"machine": machine(self.device), "versions": versions()}
        out_dir.mkdir(parents=True, exist_ok=True)
        md = [f"# {self.title}", ""]
        md.append(
            f"{meta['machine']['processor']}, {meta['machine']['cpu_count']} CPUs, "
            f"{meta['machine']['torch_threads']} torch threads, device {self.device}"
            + (
                f" ({meta['machine']['device_name']})"
                if meta["machine"]["device_name"]
                else ""
            )
            + "; "
            + ", ".join(f"{k} {v}" for k, v in meta["versions"].items() if v)
        )
        md.append("")
        md.append(
            "Settings: " + ", ".join(f"{k}={v}" for k, v in self.settings.items())
        )
        md.append("")
        for t in self.tables:
            md += [t["markdown"], ""]
        md += self.notes
        md += [
            f"- {'PASS' if g['passed'] else 'FAIL'}: {g['goal']} (measured: {g['measured']})"
            for g in self.goals
        ]
        (out_dir / f"{self.name}.md").write_text("\n".join(md) + "\n")
        record = {
            "benchmark": self.name,
            "title": self.title,
            **meta,
            "settings": self.settings,
            "tables": self.tables,
            "notes": self.notes,
            "goals": self.goals,
            "elapsed_s": elapsed,
        }
        (out_dir / f"{self.name}.json").write_text(
            json.dumps(record, indent=2, default=str) + "\n"
        )
        print(
            f"\n{self.name}: {elapsed:.0f} s; wrote {out_dir / self.name}.md and .json"
        )
