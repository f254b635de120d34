"""Tests of companion.environment: seeding, device choice and the environment report."""

from __future__ import annotations

import ast
import json
import os
import random
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import companion
from companion import environment


@pytest.fixture
def importable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Skip the fresh interpreter that checks importability (seconds per report) in
    tests about something else."""
    monkeypatch.setattr(environment, "_importable_from", lambda folder: True)


def test_seed_everything_makes_every_generator_repeat() -> None:
    def draw() -> tuple[float, float, torch.Tensor, torch.Tensor]:
        gen = companion.seed_everything(123)
        return (
            random.random(),
            float(np.random.rand()),  # noqa: NPY002 -- the global generator is tested
            torch.rand(3),
            torch.rand(3, generator=gen),
        )

    first, second = draw(), draw()
    assert first[0] == second[0]
    assert first[1] == second[1]
    torch.testing.assert_close(first[2], second[2], rtol=0, atol=0)
    torch.testing.assert_close(first[3], second[3], rtol=0, atol=0)
    companion.seed_everything(124)
    assert not torch.equal(torch.rand(3), first[2]), (
        "a different seed must give other numbers"
    )


def test_default_device_follows_cuda_availability(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("COMPANION_DEVICE", raising=False)
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert companion.default_device().type == expected


def test_default_device_can_be_forced_to_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPANION_DEVICE", "cpu")
    assert companion.default_device() == torch.device("cpu")


def test_report_lists_the_real_versions() -> None:
    report = companion.environment_report()
    found = {p.name: p.found for p in report.packages}
    # pip's metadata has no local part on some CUDA wheels: 2.11.0 for 2.11.0+cu130
    assert environment._release(found["torch"]) == environment._release(
        torch.__version__
    )
    assert found["numpy"] == np.__version__
    assert report.cuda_available == torch.cuda.is_available()
    assert report.importable
    assert report.ok
    text = str(report)
    assert torch.__version__ in text
    assert "Everything the book needs is here." in text


def test_report_checks_importability_from_the_given_folder(tmp_path) -> None:
    report = companion.environment_report(tmp_path)
    assert report.importable_from == f".../{tmp_path.name}"  # not this machine's path
    # companion is installed into the environment (pip install -e .), so a fresh
    # interpreter started anywhere finds it
    assert report.importable


def test_report_flags_a_missing_package_and_says_what_to_do(
    monkeypatch: pytest.MonkeyPatch, importable
) -> None:
    monkeypatch.setitem(
        environment.REQUIRED_PACKAGES, "surely-not-installed-pkg", "1.0"
    )
    report = companion.environment_report()
    assert not report.ok
    missing = [p for p in report.packages if p.name == "surely-not-installed-pkg"]
    assert missing and missing[0].found is None and not missing[0].ok
    assert any("surely-not-installed-pkg is missing" in line for line in report.advice)
    assert "MISSING" in str(report)


def test_report_flags_an_old_package(
    monkeypatch: pytest.MonkeyPatch, importable
) -> None:
    monkeypatch.setitem(environment.REQUIRED_PACKAGES, "numpy", "999.0")
    report = companion.environment_report()
    assert not report.ok
    assert any("older than 999.0" in line for line in report.advice)


def test_report_flags_companion_not_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(environment, "_importable_from", lambda folder: False)
    report = companion.environment_report()
    assert not report.ok
    assert any('pip install -e ".[book]"' in line for line in report.advice)


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("2.13.0+cpu", (2, 13, 0)),
        ("1.24", (1, 24)),
        ("3.11.2rc1", (3, 11, 2)),
        ("0.9.dev0", (0, 9)),
    ],
)
def test_version_parsing(version: str, expected: tuple[int, ...]) -> None:
    assert environment._version_tuple(version) == expected


# ---- torch's version: the local part is not a mismatch -------------------------------


@pytest.mark.parametrize(
    ("metadata", "imported", "mismatch"),
    [
        ("2.13.0", "2.13.0+cu130", False),  # a CUDA wheel on PyPI
        ("2.13.0+cpu", "2.13.0+cpu", False),
        ("2.13.0+cu130", "2.13.0+cu130", False),
        ("2.14.0", "2.13.0+cu130", True),  # two installs: the imported one is not pip's
    ],
)
def test_torch_metadata_version_is_compared_without_the_local_part(
    monkeypatch: pytest.MonkeyPatch,
    importable,
    metadata: str,
    imported: str,
    mismatch: bool,
) -> None:
    real = environment._installed_version
    monkeypatch.setattr(
        environment,
        "_installed_version",
        lambda name: metadata if name == "torch" else real(name),
    )
    monkeypatch.setattr(torch, "__version__", imported)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    report = companion.environment_report()
    flagged = [line for line in report.advice if "two installs of torch" in line]
    assert bool(flagged) == mismatch
    assert report.ok  # the packages themselves are fine either way


# ---- every package a chapter imports is checked and declared -------------------------

REPO = Path(__file__).resolve().parent.parent


def _chapter_imports() -> dict[str, set[str]]:
    """Top-level modules that each chapter's code cells import (magics skipped)."""
    found: dict[str, set[str]] = {}
    for path in sorted((REPO / "book").glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] != "code":
                continue
            lines = "".join(cell["source"]).splitlines()
            code = "\n".join(
                ln for ln in lines if not ln.lstrip().startswith(("%", "!"))
            )
            for node in ast.walk(ast.parse(code)):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0:
                    names = [node.module]
                for name in names:
                    found.setdefault(name.split(".")[0], set()).add(path.stem)
    return found


def test_report_checks_every_third_party_module_a_chapter_imports(importable) -> None:
    imports = _chapter_imports()
    third_party = {m for m in imports if m not in sys.stdlib_module_names} - {
        "companion"
    }
    assert {"torch", "numpy", "matplotlib", "sympy", "transformers"} <= third_party
    unchecked = third_party - set(environment.CHAPTER_IMPORTS)
    assert not unchecked, (
        f"chapters import modules the report does not check: {unchecked}"
    )
    checked = {p.name for p in companion.environment_report().packages}
    assert set(environment.CHAPTER_IMPORTS.values()) <= checked


def test_required_packages_are_the_declared_dependencies() -> None:
    """Each package the report checks is a dependency or in the book extra, with the
    same minimum, so the install command it prints brings it."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = {}
    for spec in project["dependencies"] + project["optional-dependencies"]["book"]:
        name, _, minimum = spec.partition(">=")
        declared[name.strip().lower()] = minimum.strip()
    for name, minimum in environment.REQUIRED_PACKAGES.items():
        assert declared.get(name) == minimum, (
            f"{name}: pyproject says {declared.get(name)}"
        )


def test_a_missing_package_says_how_to_install_everything(
    monkeypatch: pytest.MonkeyPatch, importable
) -> None:
    real = environment._installed_version
    monkeypatch.setattr(
        environment,
        "_installed_version",
        lambda name: None if name == "sympy" else real(name),
    )
    report = companion.environment_report()
    assert not report.ok
    (line,) = [a for a in report.advice if a.startswith("sympy is missing")]
    assert 'pip install -e ".[book]"' in line and "repository root" in line


# ---- no build-machine paths ----------------------------------------------------------


def test_report_shows_no_path_of_this_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO / "book")
    report = companion.environment_report()
    text = str(report)
    assert report.companion_path == "<repo>/companion"
    assert report.importable_from == "<repo>/book"
    for private in {str(REPO), str(Path.home()), sys.prefix, os.getcwd()}:
        assert private not in text


@pytest.mark.parametrize(
    ("where", "shown"),
    [
        (REPO, "<repo>"),
        (REPO / "companion", "<repo>/companion"),
        (
            Path("/opt/venv/lib/python3.11/site-packages/companion"),
            "<site-packages>/companion",
        ),
        (Path("/somewhere/else/book"), ".../book"),
    ],
)
def test_paths_are_shown_generically(where: Path, shown: str) -> None:
    assert environment._shown(where) == shown


# ---- bad inputs: the contract (run by tests/test_contract.py) ------------------------


def _device_from_env(value: str):
    """default_device() with COMPANION_DEVICE set to ``value``, then restored."""

    def call():
        before = os.environ.get("COMPANION_DEVICE")
        os.environ["COMPANION_DEVICE"] = value
        try:
            return companion.default_device()
        finally:
            if before is None:
                del os.environ["COMPANION_DEVICE"]
            else:
                os.environ["COMPANION_DEVICE"] = before

    return call


NO_BAD_INPUTS = {
    "EnvironmentReport": "a record that environment_report fills; no argument to check",
    "PackageStatus": "a record that environment_report fills; no argument to check",
}

BAD_INPUTS = [
    (
        "seed_everything",
        lambda: companion.seed_everything(-1),
        ValueError,
        "seed must be an",
    ),
    (
        "seed_everything",
        lambda: companion.seed_everything(1.5),
        TypeError,
        "seed must be an int",
    ),
    (
        "seed_everything",
        lambda: companion.seed_everything(True),
        TypeError,
        "seed must be an",
    ),
    (
        "seed_everything",
        lambda: companion.seed_everything("0"),
        TypeError,
        "seed must be an",
    ),
    (
        "seed_everything",
        lambda: companion.seed_everything(2**32),
        ValueError,
        "seed must be an int <= 4294967295, got 4294967296",
    ),
    (
        "default_device",
        _device_from_env("gpu"),
        ValueError,
        "COMPANION_DEVICE must be a device such as 'cpu' or 'cuda', got 'gpu'",
    ),
    (
        "default_device",
        _device_from_env("cuda:9"),
        ValueError,
        "COMPANION_DEVICE must be a device this machine has, got 'cuda:9'",
    ),
    (
        "environment_report",
        lambda: companion.environment_report(42),
        TypeError,
        "folder must be a path or None, got 42",
    ),
    (
        "environment_report",
        lambda: companion.environment_report(b"book"),
        TypeError,
        "folder must be a path or None",
    ),
    (
        "environment_report",
        lambda: companion.environment_report("/surely/not/a/folder"),
        ValueError,
        "folder must be an existing directory",
    ),
]


# ---- valid random inputs never raise -------------------------------------------------


@given(st.integers(0, 2**32 - 1))
def test_valid_seeds_never_raise(seed: int) -> None:
    assert companion.seed_everything(seed).initial_seed() == seed
