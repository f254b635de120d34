"""Tests of the build scripts that `make test` relies on (scripts/).

scripts/nbmake_cache.py lets the book build reuse what nbmake executed; if it cached the wrong
thing, the book would render outputs no kernel produced from the current cells. The oracle is
myst-nb's own lookup: the notebook as myst-nb reads it must match the cache entry, and the outputs
merged from it must be the ones a kernel prints for those cells. scripts/stages.py runs make
test's stages, some side by side: the oracle is the wall clock and the exit status.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import nbmake_cache  # noqa: E402

jupyter_cache = pytest.importorskip("jupyter_cache")
myst_read = pytest.importorskip("myst_nb.core.read")


def _notebook(path: Path, *sources: str) -> str:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nb.cells = [nbformat.v4.new_markdown_cell("# A page")]
    nb.cells += [nbformat.v4.new_code_cell(source) for source in sources]
    text = nbformat.writes(nb)
    path.write_text(text, encoding="utf-8")
    return text


def _nbmake(tmp_path: Path, *notebooks: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "scripts")}
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "nbmake_cache",
        "-p",
        "no:cacheprovider",
    ]
    command += [f"--nb-cache={tmp_path / 'cache'}", "--nbmake", "-q"]
    command += [str(nb) for nb in notebooks]
    return subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )


def _cached(tmp_path: Path, notebook: Path) -> nbformat.NotebookNode:
    """What myst-nb renders for ``notebook``: its lookup, then the merge (KeyError if no entry)."""
    cache = jupyter_cache.get_cache(str(tmp_path / "cache"))
    source = myst_read.standard_nb_read(notebook.read_text(encoding="utf-8"))
    cache.match_cache_notebook(source)
    _, merged = cache.merge_match_into_notebook(source)
    return merged


def test_a_chapter_nbmake_runs_is_found_by_myst_nb_with_its_outputs(
    tmp_path: Path,
) -> None:
    good = tmp_path / "good.ipynb"
    text = _notebook(good, "x = 6 * 7", "print(x)", "x + 1")
    bad = tmp_path / "bad.ipynb"
    _notebook(bad, "print('before')", "1 / 0")

    result = _nbmake(tmp_path, good, bad)

    assert result.returncode != 0, "nbmake passed a notebook that raises"
    assert "1 passed" in result.stdout and "1 failed" in result.stdout, result.stdout[
        -2000:
    ]
    merged = _cached(tmp_path, good)
    code = [cell for cell in merged.cells if cell.cell_type == "code"]
    assert code[0].outputs == []
    assert [o.get("text") for o in code[1].outputs] == ["42\n"]
    assert code[2].outputs[0]["data"]["text/plain"] == "43"
    assert good.read_text(encoding="utf-8") == text, (
        "the plugin wrote the source notebook"
    )
    with pytest.raises(KeyError):
        _cached(tmp_path, bad)  # a failed run is never cached


def test_an_edited_cell_misses_the_cache(tmp_path: Path) -> None:
    page = tmp_path / "page.ipynb"
    _notebook(page, "print(1)")
    assert _nbmake(tmp_path, page).returncode == 0
    _cached(tmp_path, page)
    _notebook(page, "print(2)")
    with pytest.raises(KeyError):
        _cached(tmp_path, page)


def test_executed_copy_takes_outputs_only_and_refuses_other_cells() -> None:
    source = nbformat.v4.new_notebook()
    source.cells = [nbformat.v4.new_code_cell("print(1)")]
    source.cells[0].metadata["tags"] = ["keep"]
    executed = nbformat.v4.new_notebook()
    executed.cells = [nbformat.v4.new_code_cell("print(1)")]
    executed.cells[0].metadata["execution"] = {
        "iopub.execute_input": "2026-11-27T00:00:00Z"
    }
    executed.cells[0].outputs = [
        nbformat.v4.new_output("stream", name="stdout", text="1\n")
    ]
    executed.cells[0].execution_count = 1

    merged = nbmake_cache.executed_copy(source, executed)

    assert merged.cells[0].metadata == {"tags": ["keep"]}
    assert merged.cells[0].outputs == executed.cells[0].outputs
    assert merged.cells[0].execution_count == 1
    assert source.cells[0].outputs == []  # the source is not modified
    executed.cells[0].source = "print(2)"
    with pytest.raises(ValueError, match="code cells differ"):
        nbmake_cache.executed_copy(source, executed)


# ---- scripts/stages.py: make test's stage runner ---------------------------------------


def _stages(*specs: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "stages.py"), *specs],
        capture_output=True,
        text=True,
        check=False,
        cwd=cwd,
    )


def _meet(mine: str, other: str) -> str:
    """A stage that leaves a mark and passes only if the other's mark appears within 20 s:
    both pass only when they run at the same time (no clock in the verdict)."""
    return (
        f"touch {mine}; for i in $(seq 200); do [ -e {other} ] && break; sleep 0.1; done; "
        f"[ -e {other} ] && echo from-{mine}"
    )


def test_stages_run_side_by_side_and_report_each(tmp_path: Path) -> None:
    """``&b`` starts with ``a`` (each waits for the other's mark, so both pass only side by
    side), its output is printed whole, a failing stage fails the run, and every stage
    still runs."""
    run = _stages(
        f"a={_meet('a', 'b')}", f"&b={_meet('b', 'a')}", "c=echo c; false", cwd=tmp_path
    )
    out = run.stdout
    assert run.returncode == 1
    assert "from-a" in out and "from-b" in out and "\nc\n" in out
    assert "stages: 2 passed, 1 failed" in out
    summary = out.split("make test summary")[1]
    assert "beside b" in summary and "beside a" in summary


def test_a_lane_runs_its_stages_in_order_beside_the_other_lane(tmp_path: Path) -> None:
    """``a`` ``+b`` ``&c``: ``b`` starts when ``a`` has ended, and both run while ``c``
    does (``c`` passes only if it sees ``a``'s and ``b``'s marks within 20 s, ``a`` only
    if it sees ``c``'s, ``b`` only if ``a`` had ended); each keeps its own log and verdict."""
    run = _stages(
        f"a={_meet('a', 'c')}; touch a-done",
        "+b=[ -e a-done ] && touch b && echo from-b-after-a",
        "&c=touch c; for i in $(seq 200); do [ -e b ] && break; sleep 0.1; done; "
        "[ -e a ] && [ -e b ] && echo from-c",
        "d=echo d",
        cwd=tmp_path,
    )
    out = run.stdout
    assert run.returncode == 0, out
    assert "from-a" in out and "from-b-after-a" in out and "from-c" in out
    assert "side by side: a then b and c" in out
    assert "stages: 4 passed, 0 failed" in out
    summary = out.split("make test summary")[1]
    lines = {line.split()[0]: line for line in summary.splitlines()[1:5]}
    assert lines["a"].endswith("beside c") and lines["b"].endswith("beside c")
    assert lines["c"].endswith("beside a, b") and "beside" not in lines["d"]
    # the oracle catches a b that does not wait for a: here a never marks its end, and b
    # alone fails
    again = tmp_path / "again"
    again.mkdir()
    run = _stages(
        f"a={_meet('a', 'c')}",
        "+b=[ -e a-done ] && echo from-b-after-a",
        f"&c={_meet('c', 'a')}",
        cwd=again,
    )
    assert run.returncode == 1 and "stages: 2 passed, 1 failed" in run.stdout
    assert "===== b: FAILED" in run.stdout


def test_stages_refuse_a_malformed_stage() -> None:
    assert "expected NAME=COMMAND" in _stages("no command").stderr
    assert "no stage before it" in _stages("&first=true").stderr
    assert "no stage before it" in _stages("+first=true").stderr
    assert "two stages named" in _stages("a=true", "&a=true").stderr
