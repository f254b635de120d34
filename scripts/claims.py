"""`make claims`: rerun every trained claim under variants that stand for other processors.

Trained outcomes in this book are chaotic at the level of floating-point rounding: another
processor, thread count or ATen kernel can send the same seed elsewhere. So every claim the
chapters make from training is mirrored in a test marked ``trained`` in
``tests/test_*claims*.py``, and this script reruns those tests under each variant:

=================  =========================================================================
as is              the environment as it is
jitter +1e-7       ``COMPANION_INIT_JITTER=1e-7``: each initial weight times ``1 + 1e-7 u``
jitter -1e-7       ``COMPANION_INIT_JITTER=-1e-7``
one thread         ``OMP_NUM_THREADS=1`` and ``MKL_NUM_THREADS=1``; ``tests/conftest.py``
                   then calls ``torch.set_num_threads(1)``: torch's intra-op pool on one
                   thread (its inter-op pool is left as it is)
ATen default       ``ATEN_CPU_CAPABILITY=default``: ATen's portable kernels, no AVX2/AVX-512
other seeds        ``COMPANION_SEED_OFFSET=100``: every experiment on seeds it never showed
=================  =========================================================================

It prints one row per claim: the test, the chapter it mirrors, the variants it held in, and
exits non-zero unless every claim held in every variant. A claim that does not hold
everywhere is not a claim the book may make.

Usage::

    python scripts/claims.py                      # every variant
    python scripts/claims.py --variants "as is" "jitter +1e-7"
    python scripts/claims.py -k relative          # a subset of the claims (pytest's -k)
    python scripts/claims.py --jobs 2             # two variants at a time, each on
                                                  # cores/2 threads (one on a 2-core
                                                  # machine, where every variant then
                                                  # runs single-threaded like "one
                                                  # thread"); "as is" keeps the
                                                  # environment's thread count
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

VARIANTS: dict[str, dict[str, str]] = {
    "as is": {},
    "jitter +1e-7": {"COMPANION_INIT_JITTER": "1e-7"},
    "jitter -1e-7": {"COMPANION_INIT_JITTER": "-1e-7"},
    "one thread": {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
    "ATen default": {"ATEN_CPU_CAPABILITY": "default"},
    "other seeds": {"COMPANION_SEED_OFFSET": "100"},
}

_CHAPTER = re.compile(r"\[chapter (\d+)\]")


def run_variant(
    name: str, pytest_args: list[str], out_dir: Path, threads: int | None
) -> tuple[str, dict[str, tuple[bool, str]], float, str]:
    """Run the trained claims under one variant; test id -> (passed, chapter)."""
    env = {**os.environ, **VARIANTS[name]}
    if (
        threads is not None
        and name != "as is"
        and "OMP_NUM_THREADS" not in VARIANTS[name]
    ):
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    # torch 2.13's Inductor cache ignores the capability (see the Makefile)
    capability = VARIANTS[name].get("ATEN_CPU_CAPABILITY")
    if capability:
        base = env.get("TORCHINDUCTOR_CACHE_DIR") or str(
            Path(tempfile.gettempdir()) / "torchinductor"
        )
        env["TORCHINDUCTOR_CACHE_DIR"] = f"{base}_{capability}"
    safe = name.replace("+", "plus").replace("-", "minus")  # jitter +1e-7 vs -1e-7
    report = out_dir / (re.sub(r"\W+", "_", safe) + ".xml")
    command = [
        sys.executable, "-m", "pytest", "tests", "-m", "trained", "-q", "-p",
        "no:cacheprovider", f"--junitxml={report}", "-o", "junit_family=xunit2",
        *pytest_args,
    ]  # fmt: skip
    start = time.perf_counter()
    proc = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, check=False
    )
    elapsed = time.perf_counter() - start
    results: dict[str, tuple[bool, str]] = {}
    if report.exists():
        for case in ET.parse(report).iter("testcase"):
            test_id = f"{case.get('classname', '').split('.')[-1]}::{case.get('name')}"
            failed = any(child.tag in ("failure", "error") for child in case)
            if any(child.tag == "skipped" for child in case):
                continue
            chapter = ""
            for prop in case.iter("property"):
                if prop.get("name") == "chapter":
                    chapter = prop.get("value", "")
            results[test_id] = (not failed, chapter)
    tail = "\n".join(proc.stdout.splitlines()[-15:])
    return name, results, elapsed, tail


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS)
    )
    parser.add_argument("-k", default=None, help="pytest -k expression")
    parser.add_argument(
        "--jobs", type=int, default=1, help="variants run at once (each then on "
        "cores/jobs threads, the one-thread variant on one, 'as is' on the "
        "environment's count)"
    )  # fmt: skip
    args = parser.parse_args(argv)
    pytest_args = ["-k", args.k] if args.k else []
    threads = None if args.jobs == 1 else max(1, (os.cpu_count() or 1) // args.jobs)
    with tempfile.TemporaryDirectory() as tmp:
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            done = list(
                pool.map(
                    lambda v: run_variant(v, pytest_args, Path(tmp), threads),
                    args.variants,
                )
            )
    by_variant = {name: results for name, results, _, _ in done}
    claims = sorted({t for results in by_variant.values() for t in results})
    if not claims:
        print("no trained claim ran:")
        for name, _, _, tail in done:
            print(f"--- {name}\n{tail}")
        return 1
    chapters = {
        t: next((r[t][1] for r in by_variant.values() if t in r and r[t][1]), "")
        for t in claims
    }
    width = max(len(t) for t in claims)
    print(f"\n{'claim':<{width}}  chapter  held / variants  failed in")
    all_held = True
    for t in sorted(claims, key=lambda t: (int(chapters[t] or 0), t)):
        held = [v for v in args.variants if by_variant[v].get(t, (False, ""))[0]]
        failed = [v for v in args.variants if v not in held]
        all_held &= not failed
        print(
            f"{t:<{width}}  {chapters[t] or '?':>7}  {len(held):>4} / {len(args.variants):<8}"
            f"  {', '.join(failed) or '-'}"
        )
    print()
    for name, results, elapsed, tail in done:
        n_ok = sum(ok for ok, _ in results.values())
        print(f"variant {name!r}: {n_ok} of {len(results)} held, {elapsed:.0f} s")
        if n_ok != len(results):
            print("    " + tail.replace("\n", "\n    "))
    held_all = sum(
        all(by_variant[v].get(t, (False, ""))[0] for v in args.variants) for t in claims
    )
    print(f"claims: {held_all} passed, {len(claims) - held_all} failed")
    return 0 if all_held else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
