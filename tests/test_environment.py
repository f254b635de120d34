"""Tests of companion.environment: seeding, device choice and the environment report."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

import companion
from companion import environment


def test_seed_everything_makes_every_generator_repeat() -> None:
    def draw() -> tuple[float, float, torch.Tensor, torch.Tensor]:
        gen = companion.seed_everything(123)
        return (
            random.random(),
            float(np.random.rand()),  # noqa: NPY002 -- the global generator is the point
            torch.rand(3),
            torch.rand(3, generator=gen),
        )

    first, second = draw(), draw()
    assert first[0] == second[0]
    assert first[1] == second[1]
    torch.testing.assert_close(first[2], second[2], rtol=0, atol=0)
    torch.testing.assert_close(first[3], second[3], rtol=0, atol=0)
    companion.seed_everything(124)
    assert not torch.equal(torch.rand(3), first[2]), "a different seed must give other numbers"


@pytest.mark.parametrize(
    ("seed", "error", "match"),
    [
        (-1, ValueError, r"seed must be non-negative, got -1"),
        (1.5, TypeError, r"seed must be an int, got float"),
        (True, TypeError, r"seed must be an int, got bool"),
        ("0", TypeError, r"seed must be an int, got str"),
    ],
)
def test_seed_everything_rejects_bad_seeds(seed: object, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        companion.seed_everything(seed)  # type: ignore[arg-type]


def test_default_device_follows_cuda_availability(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COMPANION_DEVICE", raising=False)
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert companion.default_device().type == expected


def test_default_device_can_be_forced_to_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPANION_DEVICE", "cpu")
    assert companion.default_device() == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_default_device_rejects_cuda_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPANION_DEVICE", "cuda")
    with pytest.raises(ValueError, match=r"COMPANION_DEVICE asks for 'cuda'"):
        companion.default_device()


def test_report_lists_the_real_versions() -> None:
    report = companion.environment_report()
    found = {p.name: p.found for p in report.packages}
    assert found["torch"] == torch.__version__
    assert found["numpy"] == np.__version__
    assert report.cuda_available == torch.cuda.is_available()
    assert report.importable
    assert report.ok
    text = str(report)
    assert torch.__version__ in text
    assert "Everything the book needs is here." in text


def test_report_checks_importability_from_the_given_folder(tmp_path) -> None:
    report = companion.environment_report(tmp_path)
    assert report.importable_from == str(tmp_path.resolve())
    # companion is installed into the environment (pip install -e .), so a fresh interpreter
    # started anywhere finds it
    assert report.importable


def test_report_flags_a_missing_package_and_says_what_to_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(environment.REQUIRED_PACKAGES, "surely-not-installed-pkg", "1.0")
    report = companion.environment_report()
    assert not report.ok
    missing = [p for p in report.packages if p.name == "surely-not-installed-pkg"]
    assert missing and missing[0].found is None and not missing[0].ok
    assert any("surely-not-installed-pkg is missing" in line for line in report.advice)
    assert "MISSING" in str(report)


def test_report_flags_an_old_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(environment.REQUIRED_PACKAGES, "numpy", "999.0")
    report = companion.environment_report()
    assert not report.ok
    assert any("older than 999.0" in line for line in report.advice)


def test_report_flags_companion_not_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(environment, "_importable_from", lambda folder: False)
    report = companion.environment_report()
    assert not report.ok
    assert any("pip install -e ." in line for line in report.advice)


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


@pytest.mark.parametrize(
    ("folder", "error", "match"),
    [
        (42, TypeError, r"folder must be a path or None, got int"),
        ("/surely/not/a/folder", ValueError, r"folder must be an existing directory"),
    ],
)
def test_report_rejects_bad_folders(folder: object, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        companion.environment_report(folder)  # type: ignore[arg-type]
