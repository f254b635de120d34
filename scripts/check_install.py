"""Does the exact lock (requirements.txt) install on macOS arm64, Windows and Linux?

For each target platform this asks pip to resolve the whole of ``requirements.txt``
against what PyPI serves for that platform, wheels only, without installing anything::

    pip install --dry-run --ignore-installed --only-binary=:all: \
        --platform <tag> --python-version <X.Y.Z> --report <json> -r <filtered lock>

pip evaluates environment markers (``; sys_platform == "linux"``, in the lock and in
every dependency's metadata, e.g. torch's CUDA packages) against the machine it runs
on, not against ``--platform``. So the script runs pip with its marker environment
replaced by the target's (``pip._vendor.packaging.markers.default_environment``
patched in the child process), and reports the lock's lines that the target's markers
leave out. The local project (``-e .``) is left out: it is pure Python.

It needs the network (PyPI), so it is ``make install-check``, not part of ``make test``;
offline it says so and exits 0. Exit status 1 when a platform does not resolve, with
pip's error naming the package the index lacks.

Usage: ``python scripts/check_install.py [--python-version 3.11.9] [--only win_amd64]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent

# pip expands a macOS tag to the older macOS versions but not a manylinux_2_28 tag to
# manylinux_2_17/2014, which most Linux wheels carry: those are listed.
PLATFORM_TAGS = {
    "macosx_14_0_arm64": ["macosx_14_0_arm64"],
    "win_amd64": ["win_amd64"],
    "manylinux_2_28_x86_64": [
        *(f"manylinux_2_{minor}_x86_64" for minor in range(28, 4, -1)),
        "manylinux2014_x86_64",
        "manylinux2010_x86_64",
        "manylinux1_x86_64",
    ],
}

# The marker environment of each target. torch 2.13's macOS wheels are tagged
# macosx_14_0_arm64 (macOS 14 or later; there is no macOS x86_64 wheel).
TARGETS = {
    "macosx_14_0_arm64": {
        "sys_platform": "darwin",
        "platform_system": "Darwin",
        "platform_machine": "arm64",
        "os_name": "posix",
    },
    "win_amd64": {
        "sys_platform": "win32",
        "platform_system": "Windows",
        "platform_machine": "AMD64",
        "os_name": "nt",
    },
    "manylinux_2_28_x86_64": {
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "os_name": "posix",
    },
}


# Where each target's torch comes from, besides PyPI. On Linux, PyPI's torch 2.13.0 is
# the CUDA build (about 20 nvidia/cuda wheels) and requires triton==3.7.1, which
# conflicts with the lock's triton 3.9.0; `make venv` first installs the CPU build from
# PyTorch's index, whose 2.13.0+cpu requires no triton. The check does the same.
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
EXTRA_INDEX = {"manylinux_2_28_x86_64": TORCH_CPU_INDEX}


def online(url: str = "https://pypi.org/simple/pip/") -> bool:
    """``url`` answers."""
    try:
        urllib.request.urlopen(url, timeout=10).close()
    except OSError:
        return False
    return True


# pip, run with the target's marker environment (argv[1]: JSON), then pip's arguments.
PIP_AS_TARGET = """
import json, sys
import pip._vendor.packaging.markers as markers
target = json.loads(sys.argv[1])
host = markers.default_environment
markers.default_environment = lambda: {**host(), **target}
from pip._internal.cli.main import main
sys.exit(main(sys.argv[2:]))
"""


def marker_env(platform: str, python_version: str) -> dict[str, str]:
    """The environment markers of ``platform`` with CPython ``python_version``."""
    env = dict(TARGETS[platform])
    env.update(
        python_version=".".join(python_version.split(".")[:2]),
        python_full_version=python_version,
        implementation_name="cpython",
        platform_python_implementation="CPython",
    )
    return env


def lock_for(platform: str, python_version: str) -> tuple[list[str], list[str]]:
    """The lines of requirements.txt that apply on ``platform``, and those that don't."""
    env = marker_env(platform, python_version)
    keep, skipped = [], []
    for raw in (ROOT / "requirements.txt").read_text().splitlines():
        line = raw.split(" #")[0].strip()
        if not line or line.startswith(("#", "-e", "-")):
            continue
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate(env):
            keep.append(line.split(";")[0].strip())
        else:
            skipped.append(f"{req.name} ({req.marker})")
    return keep, skipped


def check(platform: str, python_version: str) -> bool:
    keep, skipped = lock_for(platform, python_version)
    extra_index = EXTRA_INDEX.get(platform)
    if extra_index and not online(extra_index + "/torch/"):
        print(f"skip {platform}: {extra_index} (torch's CPU build) cannot be reached")
        return True
    with tempfile.TemporaryDirectory() as tmp:
        lock = Path(tmp) / "requirements.txt"
        lock.write_text("\n".join(keep) + "\n")
        report = Path(tmp) / "report.json"
        env = dict(os.environ, PIP_CONFIG_FILE=os.devnull)  # PyPI only, as a learner
        env.pop("PIP_FIND_LINKS", None)
        env.pop("PIP_EXTRA_INDEX_URL", None)
        target = json.dumps(marker_env(platform, python_version))
        cmd = [
            sys.executable, "-c", PIP_AS_TARGET, target,
            "install", "--dry-run", "--ignore-installed",
            "--quiet", "--disable-pip-version-check", "--only-binary=:all:",
            "--index-url", "https://pypi.org/simple",
            *([f"--extra-index-url={extra_index}"] if extra_index else []),
            *[f"--platform={tag}" for tag in PLATFORM_TAGS[platform]],
            "--python-version", python_version,
            "--report", str(report), "-r", str(lock),
        ]  # fmt: skip
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            errors = [ln for ln in done.stderr.splitlines() if "ERROR" in ln]
            print(f"FAIL {platform} (Python {python_version}):")
            for ln in errors[-4:]:
                print(f"     {ln}")
            return False
        installed = json.loads(report.read_text())["install"]
    names = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in installed}
    extra = sorted(set(names) - {Requirement(k).name.lower() for k in keep})
    print(
        f"ok   {platform} (Python {python_version}): {len(names)} wheels resolve, "
        f"torch {names.get('torch', '-')}, triton {names.get('triton', 'not installed')}"
    )
    if skipped:
        print(f"     left out by their markers: {', '.join(skipped)}")
    if extra:
        print(f"     pulled in beyond the lock: {', '.join(extra)}")
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python-version", default="3.11.9")
    parser.add_argument("--only", choices=sorted(TARGETS), action="append")
    args = parser.parse_args()
    if not online():
        print("install-check skipped: PyPI (https://pypi.org) cannot be reached")
        return 0
    results = [check(p, args.python_version) for p in (args.only or TARGETS)]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
