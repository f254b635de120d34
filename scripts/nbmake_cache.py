"""pytest plugin for `make test`: the chapters nbmake executes also fill the book's execution cache.

`make test` runs every chapter under nbmake, then builds the book with warnings as errors. Both
executed every chapter, so the slowest chapters (the ones that train) ran twice. With this plugin
loaded (``pytest -p nbmake_cache --nb-cache=_build/.jupyter_cache``), each chapter that nbmake runs
*without error* is stored in jupyter-cache, keyed exactly as myst-nb looks it up (the notebook's
code cells and its kernelspec), so the build that follows finds every chapter there and renders
the outputs nbmake produced instead of executing it again. Nothing else changes: the outputs are
those of a clean kernel run in the chapter's own folder, as myst-nb's would be; a chapter that
fails is not cached (nbmake reports it, and the build would execute it and fail again); the
tracked notebooks are never written.

The cache is only valid for the companion/ and lock that produced it: the Makefile clears it when
their hash changes (see ``CACHE_INPUTS`` there) before this plugin adds to it.
"""

from __future__ import annotations

import copy
from pathlib import Path

import nbformat
import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--nb-cache",
        default=None,
        metavar="DIR",
        help="store every notebook nbmake executes without error in this jupyter-cache folder",
    )


def executed_copy(
    source: nbformat.NotebookNode, executed: nbformat.NotebookNode
) -> nbformat.NotebookNode:
    """``source`` with the outputs and execution counts of ``executed``, nothing else.

    nbmake records timings in each cell's metadata; jupyter-cache hashes cell metadata, so the
    executed notebook itself would never match the source myst-nb reads. Taking only the outputs
    keeps the hash of ``source``.
    """
    source_code = [cell for cell in source.cells if cell.cell_type == "code"]
    executed_code = [cell for cell in executed.cells if cell.cell_type == "code"]
    if [c.source for c in source_code] != [c.source for c in executed_code]:
        raise ValueError("the executed notebook's code cells differ from its source")
    merged = copy.deepcopy(source)
    merged_code = [cell for cell in merged.cells if cell.cell_type == "code"]
    for cell, run in zip(merged_code, executed_code, strict=True):
        cell.outputs = run.outputs
        cell.execution_count = run.execution_count
    return merged


def pytest_configure(config: pytest.Config) -> None:
    target = config.getoption("--nb-cache", default=None)
    if not target:
        return
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn
    from nbmake.nb_result import NotebookResult
    from nbmake.nb_run import NotebookRun

    # Create the cache now: under pytest-xdist (``make notebooks`` runs two chapters at a
    # time) the controller configures first, so the workers only ever open an existing one
    # and never race to create its tables.
    get_cache(target)
    run_notebook = NotebookRun.execute

    def execute_and_cache(self: NotebookRun) -> NotebookResult:
        result = run_notebook(self)
        if result.error is None:
            path = Path(self.filename).resolve()
            source = nbformat.read(str(path), as_version=4)
            get_cache(target).cache_notebook_bundle(
                CacheBundleIn(executed_copy(source, result.nb), str(path)),
                check_validity=False,
                overwrite=True,
            )
        return result

    NotebookRun.execute = execute_and_cache
