"""Run the stages of `make test` in order, time each, and print a summary.

Usage: python scripts/stages.py "NAME=COMMAND" ["&NAME=COMMAND"] ["+NAME=COMMAND"] ...

A stage whose name starts with ``&`` runs alongside the stage before it (both start
together; the next plain stage starts when both have ended). A stage whose name starts
with ``+`` runs after the stage before it, in the same lane: ``a`` ``+b`` ``&c`` runs ``a``
then ``b`` while ``c`` runs beside them. `make test` runs the PDF (Paged.js, then the
PDF's checks) beside the trained claims, and the browser check after both (the browser
check reads the HTML pages the PDF stage rewrites; beside the claims, JupyterLab's checker
once ran past its 120 s timeout). The output of stages that run side by side is held in a
file each and printed, whole, when the group ends.

Every stage runs even when an earlier one failed, so one run reports every problem; the exit
status is non-zero when any stage failed. The last line is the summary, e.g.
``stages: 6 passed, 0 failed``; the total is the wall time of the whole run.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HEARTBEAT_S = 120.0

#: a group of lanes that run side by side; a lane is stages (name, command) run in order
Group = list[list[tuple[str, str]]]


def parse(argv: list[str]) -> list[Group]:
    """The stages in groups of lanes: [[[(name, command), ...], ...], ...]."""
    groups: list[Group] = []
    seen: set[str] = set()
    for spec in argv:
        name, sep, command = spec.partition("=")
        if not sep or not name.lstrip("&+") or not command:
            raise SystemExit(f"stages: expected NAME=COMMAND, got {spec!r}")
        if name.lstrip("&+") in seen:
            raise SystemExit(f"stages: two stages named {name.lstrip('&+')!r}")
        seen.add(name.lstrip("&+"))
        if name[0] in "&+":
            if not groups:
                raise SystemExit(f"stages: {spec!r} has no stage before it to join")
            if name[0] == "&":
                groups[-1].append([(name[1:], command)])
            else:
                groups[-1][-1].append((name[1:], command))
        else:
            groups.append([[(name, command)]])
    return groups


def _run_alone(name: str, command: str) -> tuple[str, bool, float]:
    print(f"\n===== {name}: {command}", flush=True)
    start = time.perf_counter()
    ok = subprocess.run(command, shell=True, check=False).returncode == 0
    elapsed = time.perf_counter() - start
    print(
        f"===== {name}: {'passed' if ok else 'FAILED'} in {elapsed:.1f} s", flush=True
    )
    return name, ok, elapsed


def run_group(group: Group) -> list[tuple[str, bool, float]]:
    """Run one group's lanes side by side, each lane's stages in order; (name, passed,
    seconds) for each stage, in the order given."""
    if len(group) == 1:
        return [_run_alone(name, command) for name, command in group[0]]

    names = " and ".join(" then ".join(name for name, _ in lane) for lane in group)
    print(f"\n===== side by side: {names}", flush=True)
    ended: dict[str, tuple[bool, float]] = {}
    running: set[str] = set()
    lock = threading.Lock()
    with tempfile.TemporaryDirectory() as tmp:
        logs = {}
        for i, (name, _) in enumerate(stage for lane in group for stage in lane):
            logs[name] = Path(tmp) / f"{i}.log"

        def lane_runner(lane: list[tuple[str, str]]) -> None:
            for name, command in lane:
                with logs[name].open("w") as log:
                    with lock:
                        running.add(name)
                    start = time.perf_counter()
                    proc = subprocess.Popen(
                        command, shell=True, stdout=log, stderr=subprocess.STDOUT
                    )
                    proc.wait()
                    elapsed = time.perf_counter() - start
                with lock:
                    running.discard(name)
                    ended[name] = (proc.returncode == 0, elapsed)
                    print(f"===== {name}: ended after {elapsed:.1f} s", flush=True)

        threads = [threading.Thread(target=lane_runner, args=(lane,)) for lane in group]
        for thread in threads:
            thread.start()
        last_word = time.perf_counter()
        while any(thread.is_alive() for thread in threads):
            if time.perf_counter() - last_word > HEARTBEAT_S:  # a quiet log is no hang
                with lock:
                    still = sorted(running)
                print(f"===== still running: {', '.join(still)}", flush=True)
                last_word = time.perf_counter()
            time.sleep(0.5)
        for thread in threads:
            thread.join()
        results = []
        for lane in group:
            for name, command in lane:
                ok, elapsed = ended[name]
                print(f"\n===== {name}: {command}", flush=True)
                print(logs[name].read_text(errors="replace"), end="", flush=True)
                print(
                    f"===== {name}: {'passed' if ok else 'FAILED'} in {elapsed:.1f} s",
                    flush=True,
                )
                results.append((name, ok, elapsed))
    return results


def main(argv: list[str]) -> int:
    groups = parse(argv)
    start = time.perf_counter()
    results: list[tuple[str, bool, float, str]] = []
    for group in groups:
        lane_of = {name: i for i, lane in enumerate(group) for name, _ in lane}
        for name, ok, elapsed in run_group(group):
            others = [n for n, lane in lane_of.items() if lane != lane_of[name]]
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
