r"""Environment report, seeding and device choice for the chapters.

Every chapter's first code cell calls :func:`seed_everything` and
:func:`default_device`; the "Setting up" chapter prints :func:`environment_report`.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import random
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from companion import _validate

__all__ = [
    "EnvironmentReport",
    "PackageStatus",
    "default_device",
    "environment_report",
    "seed_everything",
]

#: Every third-party package a chapter imports (its distribution name), with the lowest
#: version the book supports: the package's dependencies and its ``book`` extra in
#: ``pyproject.toml`` (``pip install -e ".[book]"`` brings them all; a test keeps the two
#: lists in step and checks every chapter's imports against :data:`CHAPTER_IMPORTS`).
REQUIRED_PACKAGES: dict[str, str] = {
    "torch": "2.13",
    "numpy": "1.24",
    "matplotlib": "3.7",
    "sympy": "1.13.3",
    "transformers": "5.23",
    "ipython": "8.0",
}

#: The top-level module a chapter imports -> the package (in :data:`REQUIRED_PACKAGES`)
#: that provides it. IPython comes with Jupyter's kernel (``ipykernel``).
CHAPTER_IMPORTS: dict[str, str] = {
    "torch": "torch",
    "numpy": "numpy",
    "matplotlib": "matplotlib",
    "sympy": "sympy",
    "transformers": "transformers",
    "IPython": "ipython",
}

INSTALL_COMMAND = 'pip install -e ".[book]"'
"""What installs every package the chapters import, run from the repository root."""

_DEVICE_ENV = "COMPANION_DEVICE"


def seed_everything(seed: int = 0) -> torch.Generator:
    """Seed Python's, NumPy's and torch's global random generators.

    Args:
        seed: an integer in ``[0, 2**32 - 1]`` (the range NumPy's global generator
            takes).

    Returns:
        A fresh :class:`torch.Generator` seeded with ``seed``, for code that prefers an
        explicit generator over the global one.
    """
    # NumPy's global generator takes [0, 2**32 - 1]
    seed = _validate.integer("seed", seed, minimum=0, maximum=2**32 - 1)
    random.seed(seed)
    np.random.seed(seed)  # noqa: NPY002 -- learners use the legacy global generator too
    torch.manual_seed(seed)  # also seeds every CUDA device
    return torch.Generator().manual_seed(seed)


def default_device() -> torch.device:
    """The device the chapters run on: CUDA when present, else the CPU.

    Set the environment variable ``COMPANION_DEVICE`` (``cpu``, ``cuda``, ``cuda:1``…)
    to override the choice, e.g. ``COMPANION_DEVICE=cpu`` to reproduce the published
    outputs on a machine with a GPU, to their printed precision with the same library
    versions (PyTorch promises no bit-for-bit identity across releases or platforms).
    A value that names no device of this machine is a ``ValueError`` naming the
    variable.
    """
    requested = os.environ.get(_DEVICE_ENV, "").strip()
    if requested:
        return _validate.device(_DEVICE_ENV, requested)  # one this machine has
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@dataclass(frozen=True)
class PackageStatus:
    """One required package: the version found (``None`` if missing) and the minimum."""

    name: str
    minimum: str
    found: str | None

    @property
    def ok(self) -> bool:
        """True when the package is installed at or above its minimum version."""
        return self.found is not None and _version_tuple(self.found) >= _version_tuple(
            self.minimum
        )


@dataclass(frozen=True)
class EnvironmentReport:
    """What :func:`environment_report` found. ``str(report)`` is a readable table."""

    python: str
    platform: str
    packages: tuple[PackageStatus, ...]
    cuda_available: bool
    cuda_devices: tuple[str, ...]
    device: str
    companion_path: str  # shown without this machine's folders: <repo>/companion, ...
    importable_from: str
    importable: bool
    advice: tuple[str, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        """True when every package is present and recent enough and companion
        imports."""
        return self.importable and all(p.ok for p in self.packages)

    def __str__(self) -> str:
        rows = [
            ("Python", self.python),
            ("Platform", self.platform),
            *[
                (
                    p.name,
                    f"{p.found or 'MISSING'} (need >= {p.minimum})"
                    + ("" if p.ok else "  <-- fix"),
                )
                for p in self.packages
            ],
            (
                "CUDA available",
                "yes" if self.cuda_available else "no (the book runs on the CPU)",
            ),
            *[(f"  GPU {i}", name) for i, name in enumerate(self.cuda_devices)],
            ("Chapters will use", self.device),
            ("companion found at", self.companion_path),
            (
                "importable from",
                f"{self.importable_from}: {'yes' if self.importable else 'NO'}",
            ),
        ]
        width = max(len(k) for k, _ in rows)
        lines = [f"{k:<{width}}  {v}" for k, v in rows]
        lines.append("")
        lines.extend(self.advice or ("Everything the book needs is here.",))
        return "\n".join(lines)


def _version_tuple(version: str) -> tuple[int, ...]:
    """The leading numeric release of a version string: "2.13.0+cpu" -> (2, 13, 0),
    "3.11.2rc1" -> (3, 11, 2), "0.9.dev0" -> (0, 9)."""
    parts: list[int] = []
    for piece in version.split("+")[0].split("."):
        match = re.match(r"\d+", piece)
        if match is None:
            break
        parts.append(int(match.group(0)))
        if match.end() != len(piece):  # a pre-release suffix ends the release part
            break
    return tuple(parts)


def _release(version: str) -> str:
    """The public version, without a local part: "2.11.0+cu130" -> "2.11.0"."""
    return str(version).split("+")[0]


def _torch_install_advice() -> list[str]:
    """Advice when the torch that Python imports is not the one pip's metadata describes
    (two installs shadowing each other). The local part differs on CUDA wheels and is
    not
    a mismatch: the metadata says ``2.11.0`` where ``torch.__version__`` is
    ``2.11.0+cu130``."""
    found = _installed_version("torch")
    imported = str(torch.__version__)
    if found is None or _release(found) == _release(imported):
        return []
    return [
        f"torch {imported} is imported but pip's metadata says {found}: "
        "two installs of "
        "torch? `pip install --force-reinstall torch` in this environment."
    ]


def _repository() -> Path | None:
    """The repository root, when companion runs from a checkout
    (``pip install -e .``)."""
    root = Path(__file__).resolve().parent.parent
    return root if (root / "pyproject.toml").is_file() else None


def _shown(path: Path) -> str:
    """``path`` without this machine's folders: ``<repo>/book`` inside the repository,
    ``./sub`` under the current folder, ``~/...`` under the home folder,
    ``<site-packages>/companion`` for an installed copy, else ``.../name``."""
    path = path.resolve()
    repo, here, home = _repository(), Path.cwd().resolve(), Path.home().resolve()
    for root, label in ((repo, "<repo>"), (here, "."), (home, "~")):
        if root is not None and path.is_relative_to(root):
            rest = path.relative_to(root).as_posix()
            return label if rest == "." else f"{label}/{rest}"
    if "site-packages" in path.parts:
        rest = path.parts[path.parts.index("site-packages") + 1 :]
        return "/".join(("<site-packages>", *rest))
    return f".../{path.name}"


def _installed_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _importable_from(folder: Path) -> bool:
    """Whether a fresh interpreter started in ``folder`` (as a new kernel would be) can
    import companion."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", "import companion"],
            cwd=folder,
            capture_output=True,
            timeout=120,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def environment_report(
    folder: str | os.PathLike[str] | None = None,
) -> EnvironmentReport:
    """Collect what the chapters need to run and say what to do about anything missing.

    Args:
        folder: the folder from which ``companion`` must be importable (a notebook's
            working directory). Defaults to the current working directory.

    Returns:
        An :class:`EnvironmentReport`; print it for a table with advice.
    """
    _validate.optional(
        _validate.instance,
        "folder",
        folder,
        cls=(str, os.PathLike),
        expected="a path or None",
    )
    where = Path(folder if folder is not None else os.getcwd()).resolve()
    if not where.is_dir():
        raise ValueError(f"folder must be an existing directory, got {str(where)!r}")

    packages = tuple(
        PackageStatus(name, minimum, _installed_version(name))
        for name, minimum in REQUIRED_PACKAGES.items()
    )
    cuda = torch.cuda.is_available()
    devices = (
        tuple(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
        if cuda
        else ()
    )

    spec = importlib.util.find_spec("companion")
    found_at = Path(spec.origin).parent if spec and spec.origin else None
    companion_path = _shown(found_at) if found_at is not None else "not found"
    importable = _importable_from(where)

    advice = []
    for p in packages:
        if p.found is None:
            advice.append(
                f"{p.name} is missing: run `{INSTALL_COMMAND}` from the "
                "repository root "
                "(it installs every package the chapters import)."
            )
        elif not p.ok:
            advice.append(
                f"{p.name} {p.found} is older than {p.minimum}: "
                f"`pip install -U '{p.name}>={p.minimum}'`."
            )
    advice.extend(_torch_install_advice())
    if not importable:
        advice.append(
            f"companion is not importable: run `{INSTALL_COMMAND}` from the repository "
            "root, or start Jupyter from the repository's .venv "
            "(`.venv/bin/jupyter lab`)."
        )
    return EnvironmentReport(
        python=f"{platform.python_implementation()} {sys.version.split()[0]}",
        platform=platform.platform(terse=True),
        packages=packages,
        cuda_available=cuda,
        cuda_devices=devices,
        device=str(default_device()),
        companion_path=companion_path,
        importable_from=_shown(where),
        importable=importable,
        advice=tuple(advice),
    )
