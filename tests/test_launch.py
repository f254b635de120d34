"""Running a chapter from the web page (review s6-ux D8): the Colab button and the set-up cell.

Every chapter's web page has a Colab launch button (``_config.yml``'s ``launch_buttons``), which
opens the chapter's notebook from the repository in ``_config.yml``. Colab has torch, numpy and
matplotlib but not this book's package, so every chapter starts with a set-up cell, tagged
``colab-setup`` and ``remove-cell`` (the web page and the PDF leave it out): in Colab it clones
the repository, installs the libraries Colab lacks, and imports ``companion`` from the clone;
anywhere else (a learner's JupyterLab, nbmake, the book build) it does nothing and needs no
network.

What is tested here, offline: the cell is in every chapter before the first code cell; it does
nothing outside Colab; inside a stand-in for Colab it clones ``_config.yml``'s repository and
branch, installs what pyproject's ``book`` extra asks for those libraries, and makes
``import companion`` resolve to the clone; the package itself installs with every subpackage.
What cannot be tested here: Colab itself (a Google account, the network, its preinstalled
versions), i.e. that the clone and the installs succeed there and the chapter then runs.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
import types
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "book").glob("[0-9][0-9]_*.ipynb"))
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _cells(nb_path: Path) -> list[dict]:
    return json.loads(nb_path.read_text(encoding="utf-8"))["cells"]


def _source(cell: dict) -> str:
    src = cell["source"]
    return "".join(src) if isinstance(src, list) else src


def _setup_cell(nb_path: Path) -> dict:
    cells = [
        c
        for c in _cells(nb_path)
        if "colab-setup" in c.get("metadata", {}).get("tags", [])
    ]
    assert len(cells) == 1, f"{nb_path.name}: {len(cells)} cells tagged colab-setup"
    return cells[0]


def _run(source: str, colab: bool, monkeypatch: pytest.MonkeyPatch) -> dict:
    """Execute the cell's code with subprocess.run, os.chdir and the file system probe
    recorded instead of performed; with ``colab`` a module named google.colab is loaded."""
    import os

    calls: dict[str, list] = {"run": [], "chdir": []}

    def fake_run(args: list[str], **kwargs: object) -> subprocess.CompletedProcess:
        calls["run"].append((list(args), kwargs))
        return subprocess.CompletedProcess(args, 0)

    monkeypatch.setattr(subprocess, "run", fake_run)
    monkeypatch.setattr(os, "chdir", lambda path: calls["chdir"].append(str(path)))
    monkeypatch.setattr(os.path, "isdir", lambda path: False)
    monkeypatch.setattr(sys, "path", list(sys.path))
    if colab:
        google = types.ModuleType("google")
        google.colab = types.ModuleType("google.colab")
        monkeypatch.setitem(sys.modules, "google", google)
        monkeypatch.setitem(sys.modules, "google.colab", google.colab)
    else:
        monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    exec(compile(source, "<colab-setup>", "exec"), {"__name__": "__main__"})
    calls["path"] = list(sys.path)
    return calls


def test_the_web_pages_offer_colab() -> None:
    launch = CONFIG.get("launch_buttons", {})
    assert launch.get("colab_url") == "https://colab.research.google.com", launch
    repo = CONFIG["repository"]
    assert re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+", repo["url"]), repo
    assert repo.get("branch"), repo


def test_every_chapter_has_the_same_setup_cell_first() -> None:
    assert len(CHAPTERS) >= 10, [p.name for p in CHAPTERS]
    sources = set()
    for nb_path in CHAPTERS:
        cell = _setup_cell(nb_path)
        code = [c for c in _cells(nb_path) if c["cell_type"] == "code"]
        assert code[0] is not None and code[0].get("id") == cell.get("id"), (
            f"{nb_path.name}: the Colab set-up cell is not the first code cell"
        )
        assert "remove-cell" in cell["metadata"]["tags"], (
            f"{nb_path.name}: the set-up cell is shown on the web page"
        )
        sources.add(_source(cell))
    assert len(sources) == 1, "the chapters' set-up cells differ"


@pytest.mark.parametrize("nb_path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_the_setup_cell_does_nothing_outside_colab(
    nb_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = list(sys.path)
    calls = _run(_source(_setup_cell(nb_path)), False, monkeypatch)
    assert calls["run"] == [] and calls["chdir"] == [], calls
    assert calls["path"] == before


def test_in_colab_the_setup_cell_clones_the_repository_and_installs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    source = _source(_setup_cell(CHAPTERS[0]))
    calls = _run(source, True, monkeypatch)
    runs = [args for args, _ in calls["run"]]
    assert all(kwargs.get("check") for _, kwargs in calls["run"]), (
        "a failed clone or install must stop the notebook"
    )
    clone = [a for a in runs if a[:2] == ["git", "clone"]]
    assert len(clone) == 1, runs
    repo = CONFIG["repository"]
    assert repo["url"] in clone[0] and f"--branch={repo['branch']}" in clone[0], clone
    target = clone[0][-1]
    assert calls["path"][0] == target, "companion is not imported from the clone"
    assert calls["chdir"] == [f"{target}/book"], calls["chdir"]

    pip = [a for a in runs if a[1:4] == ["-m", "pip", "install"]]
    assert len(pip) == 1 and pip[0][0] == sys.executable, runs
    wanted = [a for a in pip[0][4:] if not a.startswith("-")]
    extra = {
        re.split(r"[<>=;\s]", r, maxsplit=1)[0]: r.split(";")[0].strip()
        for r in PYPROJECT["project"]["optional-dependencies"]["book"]
    }
    for requirement in wanted:
        name = re.split(r"[<>=]", requirement, maxsplit=1)[0]
        assert extra.get(name) == requirement, (
            f"the Colab cell installs {requirement!r}; pyproject's book extra says "
            f"{extra.get(name)!r}"
        )
    # Colab brings torch, numpy and matplotlib (the package's own dependencies) and
    # Jupyter; the two libraries the chapters import beyond them are installed
    assert {re.split(r"[<>=]", w, maxsplit=1)[0] for w in wanted} == {
        "transformers",
        "sympy",
    }


def test_the_package_installs_with_every_subpackage() -> None:
    """pyproject's package list names every folder of companion/ that holds code (a
    non-editable install, ``pip install git+...``, would leave out one it does not name)."""
    declared = PYPROJECT["tool"]["setuptools"].get("packages")
    if declared is None:  # automatic discovery finds every subpackage
        return
    folders = sorted(
        ".".join(p.parent.relative_to(ROOT).parts)
        for p in (ROOT / "companion").rglob("__init__.py")
        if "__pycache__" not in p.parts
    )
    missing = [f for f in folders if f not in declared]
    assert not missing, f"pyproject.toml's packages leave out {missing}"
