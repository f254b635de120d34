"""Run the stages of `make test` in order, time each, and print a summary.

Usage: python scripts/stages.py "NAME=COMMAND" ...

Every stage runs even when an earlier one failed, so one run reports every problem; the exit
status is non-zero when any stage failed. The last line is the summary, e.g.
``stages: 6 passed, 0 failed``.
"""

from __future__ import annotations

import subprocess
import sys
import time


def main(argv: list[str]) -> int:
    results: list[tuple[str, bool, float]] = []
    for spec in argv:
        name, _, command = spec.partition("=")
        print(f"\n===== {name}: {command}", flush=True)
        start = time.perf_counter()
        ok = subprocess.run(command, shell=True, check=False).returncode == 0
        elapsed = time.perf_counter() - start
        results.append((name, ok, elapsed))
        print(
            f"===== {name}: {'passed' if ok else 'FAILED'} in {elapsed:.1f} s",
            flush=True,
        )

    width = max(len(name) for name, _, _ in results)
    print("\nmake test summary")
    for name, ok, elapsed in results:
        print(f"  {name:<{width}}  {'passed' if ok else 'FAILED':<6}  {elapsed:7.1f} s")
    total = sum(elapsed for _, _, elapsed in results)
    passed = sum(ok for _, ok, _ in results)
    print(f"  {'total':<{width}}          {total:7.1f} s")
    print(f"stages: {passed} passed, {len(results) - passed} failed")
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
