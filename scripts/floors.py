"""`make floors`: prove the lower bounds that pyproject.toml declares.

``pyproject.toml`` promises that ``companion`` and its ``book`` extra work with every version
at or above each ``>=`` floor; ``requirements.txt`` (the exact lock that ``make test`` uses)
proves only the newest. This script builds a scratch environment, ``_build/floors/venv``, with
every declared floor installed exactly (``name==floor``), plus the test tools at the lock's
versions, and runs the unit tests there (``pytest tests -m "not trained"``). A floor is what
this run passes with; a floor it cannot install or that fails a test must be raised.

What the run covers, and what it does not:

- every ``>=`` in ``[project] dependencies`` and the ``book``/``kernels`` extras whose marker
  holds on this machine (triton's is Linux only), and any package of
  ``companion.environment.REQUIRED_PACKAGES`` that pyproject does not name, at the report's
  minimum; the venv's Python is the one that runs this script (``make floors``: ``.venv``'s);
- the unit tests exercise numpy, torch, matplotlib, transformers (Hugging Face oracles) and
  triton (its interpreter); sympy and IPython are imported by the chapters only, so the script
  imports what the chapters use from them (``sympy``'s solver and simplifier,
  ``IPython.display``); jupyterlab, jupyterlab-myst and ipykernel are proven to install
  together with the rest, not exercised (executing the chapters is ``make notebooks``' job,
  on the lock);
- pip resolves every dependency the floors do not name to its newest compatible release.

Usage::

    python scripts/floors.py                 # build the venv (reused when present), test
    python scripts/floors.py --fresh         # remove the venv first
    python scripts/floors.py -- -k rope      # extra arguments after -- go to pytest

On Linux, torch comes from PyTorch's CPU index (PyPI's Linux wheel is the CUDA build) when
``download.pytorch.org`` answers within 5 s, as the Makefile's venv rule does; where it does not
(an offline mirror), torch comes from the configured index with the rest.

Needs the network (PyPI) the first time; not part of ``make test``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / "_build" / "floors" / "venv"
#: PyTorch's CPU wheels; the Makefile's venv rule uses the same index, probed the same way.
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
#: Test tools taken at the lock's versions (they are not floors of the package).
TEST_TOOLS = ("pytest", "hypothesis", "PyYAML")
#: What the chapters use from the packages the unit tests never import.
CHAPTER_SMOKE = (
    "import sympy as sp; x = sp.symbols('x', real=True);"
    " assert sp.simplify(sp.cos(x) ** 2 + sp.sin(x) ** 2) == 1;"
    " assert sp.solve(x**2 - 4, x) == [-2, 2];"
    " from IPython.display import Markdown, display"
)


def _marker_holds(marker: str) -> bool:
    """The one marker form pyproject.toml uses: ``sys_platform == '...'``."""
    if not marker:
        return True
    match = re.fullmatch(r"sys_platform\s*==\s*['\"](\w+)['\"]", marker.strip())
    if not match:
        raise SystemExit(f"floors.py: cannot evaluate the marker {marker!r}")
    return sys.platform == match.group(1)


def declared_floors() -> dict[str, str]:
    """Every declared ``name>=floor`` that applies on this machine, name -> floor."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = list(project["dependencies"])
    for extra in ("book", "kernels"):
        specs += project["optional-dependencies"].get(extra, [])
    floors: dict[str, str] = {}
    for spec in specs:
        requirement, _, marker = spec.partition(";")
        match = re.fullmatch(
            r"\s*([A-Za-z0-9_.-]+)\s*>=\s*([0-9][0-9.]*)\s*", requirement
        )
        if not match:
            raise SystemExit(f"floors.py: {spec!r} is not of the form name>=version")
        if _marker_holds(marker):
            floors[canonicalize_name(match.group(1))] = match.group(2)
    sys.path.insert(0, str(ROOT))
    from companion.environment import REQUIRED_PACKAGES

    for name, minimum in REQUIRED_PACKAGES.items():
        floors.setdefault(canonicalize_name(name), minimum)
    return floors


def lock_pins(names: tuple[str, ...]) -> list[str]:
    """``name==version`` lines of requirements.txt for ``names``."""
    wanted = {n.lower() for n in names}
    pins = []
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        requirement = line.split("#")[0].split(";")[0].strip()
        if "==" in requirement and requirement.split("==")[0].lower() in wanted:
            pins.append(requirement)
    if len(pins) != len(wanted):
        raise SystemExit(f"floors.py: requirements.txt does not pin all of {names}")
    return pins


def torch_cpu_index_answers(timeout: float = 5.0) -> bool:
    """Linux only: does PyTorch's CPU index answer within ``timeout`` seconds?"""
    if not sys.platform.startswith("linux"):
        return False
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(f"{TORCH_CPU_INDEX}/torch/", timeout=timeout).close()
    except (urllib.error.URLError, OSError, ValueError):
        return False
    return True


def run(cmd: list[str], **kwargs: object) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, **kwargs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fresh", action="store_true", help="remove the venv first")
    parser.add_argument("pytest_args", nargs="*", help="after --: passed to pytest")
    args = parser.parse_args()

    floors = declared_floors()
    exact = [f"{name}=={floor}" for name, floor in sorted(floors.items())]
    print("declared floors, installed exactly:", " ".join(exact), flush=True)
    if args.fresh and VENV.exists():
        shutil.rmtree(VENV)
    python = VENV / "bin" / "python"
    if not python.exists():
        run([sys.executable, "-m", "venv", str(VENV)])
    pip = [str(python), "-m", "pip", "--disable-pip-version-check"]
    # torch's floor first, the CPU build where PyTorch's index answers (as the Makefile's venv
    # rule does); the resolve below then keeps it, since it satisfies torch==floor
    if "torch" in floors and torch_cpu_index_answers():
        run(
            [
                *pip,
                "install",
                "--quiet",
                "--retries",
                "1",
                "--timeout",
                "15",
                "--extra-index-url",
                TORCH_CPU_INDEX,
                f"torch=={floors['torch']}",
            ]
        )
    elif sys.platform.startswith("linux"):
        print(
            "floors.py: download.pytorch.org not reachable: torch from the configured index",
            flush=True,
        )
    # one resolve: the floors exactly, the test tools at the lock's versions, and the package
    # itself with its declared ranges (pip refuses if a floor contradicts another's needs)
    run([*pip, "install", "--quiet", *exact, *lock_pins(TEST_TOOLS), "-e", str(ROOT)])
    run([*pip, "check"])
    freeze = subprocess.run(
        [*pip, "freeze"], check=True, capture_output=True, text=True
    ).stdout
    found = {
        canonicalize_name(line.split("==")[0]): line.split("==")[1]
        for line in freeze.splitlines()
        if "==" in line
    }
    wrong = {
        name: found.get(name)
        for name, floor in floors.items()
        if name not in found or Version(Version(found[name]).public) != Version(floor)
    }
    if wrong:
        print(f"floors.py: installed versions are not the floors: {wrong}")
        return 1
    run([str(python), "-c", CHAPTER_SMOKE])
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    pytest = [str(python), "-m", "pytest", "tests", "-m", "not trained", "-q", "-x"]
    result = subprocess.run(
        [*pytest, "-p", "no:cacheprovider", *args.pytest_args], cwd=ROOT, env=env
    )
    print(
        "floors: "
        + (
            "every declared floor passes the unit tests"
            if result.returncode == 0
            else f"pytest failed (exit {result.returncode}) with the floors: raise the floor "
            "that fails"
        )
        + f" [{' '.join(exact)}; Python {sys.version.split()[0]}]",
        flush=True,
    )
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
