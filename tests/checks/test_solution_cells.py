"""The chapters' solution cells as JupyterLab shows them (issue 37, s6-ux D3 and D6).

JupyterLab shows a folded cell's first source line as its placeholder, so every cell of
a solution, from its ``{solution-start}`` marker to its ``{solution-end}`` marker, starts
with one of four neutral lines and nothing else on that line: the learner sees
"# Reference solution", never the first line of the answer. The code cells' mark is also
what makes a checker called there print "(reference solution)" after Run All
(``companion/checks/_core.py``). And the notebooks carry the metadata JupyterLab writes
when it opens them, so opening a chapter does not modify it
(``tests/browser/test_jupyterlab.py`` checks both in the real JupyterLab).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from companion.checks._core import REFERENCE_MARK

BOOK = Path(__file__).resolve().parents[2] / "book"
CHAPTERS = sorted(BOOK.glob("[0-9][0-9]_*.ipynb"))

# what a solution cell's first line may be, by the cell's place in the solution
START = "% Solution (click to open)"
END = "% End of the solution"
CODE = REFERENCE_MARK  # "# Reference solution"
PROSE = "% Reference solution, continued"


def _source(cell: dict) -> str:
    src = cell["source"]
    return src if isinstance(src, str) else "".join(src)


def _solutions(path: Path) -> list[list[dict]]:
    """Each solution's cells, its two markers included."""
    solutions, current = [], None
    for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
        source = _source(cell)
        if "```{solution-start}" in source:
            current = [cell]
        elif current is not None:
            current.append(cell)
            if "```{solution-end}" in source:
                solutions.append(current)
                current = None
    assert current is None, f"{path.name}: a solution-start without its solution-end"
    return solutions


def test_every_chapter_with_exercises_has_solutions() -> None:
    counts = {p.name: len(_solutions(p)) for p in CHAPTERS}
    exercises = {
        p.name: len(re.findall(r"```\{exercise\}", p.read_text(encoding="utf-8")))
        for p in CHAPTERS
    }
    assert counts == exercises
    assert sum(counts.values()) >= 40, counts


def _expected_first_line(cell: dict, k: int, n: int) -> str:
    if k == 0:
        return START
    if k == n - 1:
        return END
    return CODE if cell["cell_type"] == "code" else PROSE


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_solution_cells_start_with_a_neutral_line(path: Path) -> None:
    """The first line of every solution cell is exactly the neutral line for its kind:
    no code, no number, no word of the answer can appear on it."""
    wrong = []
    for solution in _solutions(path):
        for k, cell in enumerate(solution):
            first = _source(cell).split("\n", 1)[0]
            expected = _expected_first_line(cell, k, len(solution))
            if first != expected:
                wrong.append(f"{first!r} (should be {expected!r})")
    assert not wrong, (
        f"{path.name}: solution cells whose first line is not neutral: "
        + ("; ".join(wrong[:5]))
    )


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_solution_cells_are_folded_and_checkers_run_from_marked_cells(
    path: Path,
) -> None:
    for solution in _solutions(path):
        for cell in solution:
            hidden = cell["metadata"].get("jupyter", {}).get("source_hidden")
            assert hidden is True, f"{path.name}: unfolded {_source(cell)[:60]!r}"
    # a checker in the chapter is called either from the learner's cell (outside a
    # solution) or from a cell marked as the reference solution, never from another
    marked = [
        c
        for s in _solutions(path)
        for c in s
        if c["cell_type"] == "code" and "checks.check_" in _source(c)
    ]
    assert all(_source(c).startswith(REFERENCE_MARK) for c in marked)


def test_the_neutral_lines_are_neutral() -> None:
    """What the test above demands cannot carry an answer: four fixed lines, two MyST
    comments (invisible on the web), one Python comment."""
    assert {START, END, CODE, PROSE} == {
        "% Solution (click to open)",
        "% End of the solution",
        "# Reference solution",
        "% Reference solution, continued",
    }


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_notebooks_carry_the_metadata_jupyterlab_writes(path: Path) -> None:
    """JupyterLab writes the kernel's spec and language_info into a notebook it opens;
    committed as it writes them, opening a chapter changes nothing (s6-ux D6), and
    nbstripout (0.9) keeps both keys, so ``make strip-check`` agrees."""
    from ipykernel.ipkernel import IPythonKernel

    meta = json.loads(path.read_text(encoding="utf-8"))["metadata"]
    assert meta["kernelspec"] == {
        "display_name": "Python 3 (ipykernel)",
        "language": "python",
        "name": "python3",
    }
    info = dict(meta["language_info"])
    # the kernel reports its own Python's version: the committed one is the book's
    # environment's (a learner on another Python gets this one line changed)
    version = info.pop("version")
    assert re.fullmatch(r"3\.\d+\.\d+", version), version
    expected = {k: v for k, v in IPythonKernel.language_info.items() if k != "version"}
    assert info == expected
