"""Run the stages of `make test` in order, time each, and print a summary.

Usage: python scripts/stages.py "NAME=COMMAND" ["&NAME=COMMAND"] ...

A stage whose name starts with ``&`` runs alongside the stage before it (both start
together; the next stage starts when both have ended): `make test` pairs the PDF, whose
Paged.js and pypdf keep one core busy, with the trained claims. The output of stages that
run side by side is held in a file each and printed, whole, when the stage ends.

Every stage runs even when an earlier one failed, so one run reports every problem; the exit
status is non-zero when any stage failed. The last line is the summary, e.g.
``stages: 6 passed, 0 failed``; the total is the wall time of the whole run.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

HEARTBEAT_S = 120.0


def parse(argv: list[str]) -> list[list[tuple[str, str]]]:
    """The stages in groups that run side by side: [[(name, command), ...], ...]."""
    groups: list[list[tuple[str, str]]] = []
    for spec in argv:
        name, sep, command = spec.partition("=")
        if not sep or not name.lstrip("&") or not command:
            raise SystemExit(f"stages: expected NAME=COMMAND, got {spec!r}")
        if name.startswith("&"):
            if not groups:
                raise SystemExit(f"stages: {spec!r} has no stage before it to join")
            groups[-1].append((name[1:], command))
        else:
            groups.append([(name, command)])
    return groups


def run_group(group: list[tuple[str, str]]) -> list[tuple[str, bool, float]]:
    """Run one group's stages together; (name, passed, seconds) for each."""
    if len(group) == 1:
        name, command = group[0]
        print(f"\n===== {name}: {command}", flush=True)
        start = time.perf_counter()
        ok = subprocess.run(command, shell=True, check=False).returncode == 0
        elapsed = time.perf_counter() - start
        print(
            f"===== {name}: {'passed' if ok else 'FAILED'} in {elapsed:.1f} s",
            flush=True,
        )
        return [(name, ok, elapsed)]

    names = " and ".join(name for name, _ in group)
    print(f"\n===== side by side: {names}", flush=True)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        running = []
        for i, (name, command) in enumerate(group):
            log = (Path(tmp) / f"{i}.log").open("w")
            start = time.perf_counter()
            proc = subprocess.Popen(
                command, shell=True, stdout=log, stderr=subprocess.STDOUT
            )
            running.append((name, command, proc, log, start))
        ended: dict[str, float] = {}
        last_word = time.perf_counter()
        while len(ended) < len(running):
            for name, _, proc, _, start in running:
                if name not in ended and proc.poll() is not None:
                    ended[name] = time.perf_counter() - start
                    print(f"===== {name}: ended after {ended[name]:.1f} s", flush=True)
            if (
                time.perf_counter() - last_word > HEARTBEAT_S
            ):  # a quiet log is not a hang
                still = [name for name, *_ in running if name not in ended]
                print(f"===== still running: {', '.join(still)}", flush=True)
                last_word = time.perf_counter()
            time.sleep(0.5)
        for i, (name, command, proc, log, _) in enumerate(running):
            log.close()
            ok = proc.returncode == 0
            print(f"\n===== {name}: {command}", flush=True)
            print(
                (Path(tmp) / f"{i}.log").read_text(errors="replace"), end="", flush=True
            )
            print(
                f"===== {name}: {'passed' if ok else 'FAILED'} in {ended[name]:.1f} s",
                flush=True,
            )
            results.append((name, ok, ended[name]))
    return results


def main(argv: list[str]) -> int:
    groups = parse(argv)
    start = time.perf_counter()
    results: list[tuple[str, bool, float, str]] = []
    for group in groups:
        side = [name for name, _ in group]
        for name, ok, elapsed in run_group(group):
            others = [n for n in side if n != name]
            results.append(
                (name, ok, elapsed, f"beside {', '.join(others)}" if others else "")
            )
    total = time.perf_counter() - start

    width = max(len(name) for name, _, _, _ in results)
    print("\nmake test summary")
    for name, ok, elapsed, note in results:
        status = "passed" if ok else "FAILED"
        print(f"  {name:<{width}}  {status:<6}  {elapsed:7.1f} s  {note}".rstrip())
    passed = sum(ok for _, ok, _, _ in results)
    print(f"  {'total (wall)':<{width}}          {total:7.1f} s")
    print(f"stages: {passed} passed, {len(results) - passed} failed")
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
