"""Checks of the book's sources: the table of contents, notebook hygiene, the chapter
skeleton and the exercise pattern. Fast; no notebook is executed here (nbmake does that)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
NOTEBOOKS = sorted(BOOK.glob("*.ipynb"))
NB_IDS = [nb.name for nb in NOTEBOOKS]


def toc_files() -> list[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]]

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if "file" in node:
                files.append(node["file"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(toc.get("parts", []))
    walk(toc.get("chapters", []))
    return files


def load(nb: Path) -> dict:
    return json.loads(nb.read_text(encoding="utf-8"))


def code_cells(nb: dict) -> list[dict]:
    return [c for c in nb["cells"] if c["cell_type"] == "code"]


def source(cell: dict) -> str:
    src = cell["source"]
    return "".join(src) if isinstance(src, list) else src


def test_there_are_chapters() -> None:
    assert NOTEBOOKS, "book/ holds no notebooks"


def test_every_toc_entry_exists() -> None:
    missing = [
        f
        for f in toc_files()
        if not any((ROOT / f"{f}{ext}").exists() for ext in (".md", ".ipynb"))
        and not (ROOT / f).exists()
    ]
    assert not missing, f"_toc.yml lists files that do not exist: {missing}"


def test_every_page_is_in_the_toc() -> None:
    listed = {str(Path(f).with_suffix("")) for f in toc_files()}
    pages = sorted(BOOK.glob("*.ipynb")) + sorted(BOOK.glob("*.md"))
    orphans = [
        p.name for p in pages if str(p.relative_to(ROOT).with_suffix("")) not in listed
    ]
    assert not orphans, f"pages not in _toc.yml (they would not be built): {orphans}"


def test_chapter_files_follow_the_layout() -> None:
    """book/NN_topic.ipynb: a two-digit number and a snake_case topic."""
    bad = [
        nb.name
        for nb in NOTEBOOKS
        if not re.fullmatch(r"\d\d_[a-z0-9_]+\.ipynb", nb.name)
    ]
    assert not bad, f"notebooks not named NN_topic.ipynb: {bad}"


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=NB_IDS)
def test_no_committed_outputs(nb_path: Path) -> None:
    dirty = [
        i
        for i, c in enumerate(load(nb_path)["cells"])
        if c["cell_type"] == "code"
        and (c.get("outputs") or c.get("execution_count") is not None)
    ]
    assert not dirty, f"{nb_path.name}: code cells {dirty} have outputs; run nbstripout"


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=NB_IDS)
def test_first_code_cell_imports_companion_and_seeds(nb_path: Path) -> None:
    cells = code_cells(load(nb_path))
    assert cells, f"{nb_path.name} has no code cell"
    first = source(cells[0])
    assert re.search(r"^\s*(import companion|from companion\b)", first, re.M), (
        f"{nb_path.name}: the first code cell must import from companion, got:\n{first}"
    )
    assert re.search(r"seed_everything\(|manual_seed\(", first), (
        f"{nb_path.name}: the first code cell must seed the random generators, got:\n{first}"
    )


def web_number(name: str) -> str:
    """The chapter's number as the web book prints it before an exercise's ("9." in
    Exercise 9.1), from _toc.yml as the web numbers: the chapters of the numbered parts
    count on across parts in reading order, those of a part captioned "Appendix ..." take
    letters ("A."), a chapter outside the numbered parts is unnumbered (""). ``name``: a
    file name or path, e.g. "09_modern_decoders.ipynb" or "book/09_modern_decoders"."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    numbers: dict[str, str] = {}
    count = letters = 0
    for part in toc.get("parts", []):
        appendix = str(part.get("caption", "")).lower().startswith("appendix")
        for chapter in part.get("chapters", []):
            if not part.get("numbered"):
                continue
            if appendix:
                numbers[chapter["file"]] = f"{'ABCDEFGHIJ'[letters]}."
                letters += 1
            else:
                count += 1
                numbers[chapter["file"]] = f"{count}."
    return numbers.get(f"book/{Path(name).stem}", "")


def web_enumerator(nb_path: Path) -> str:
    """The front matter's enumerator for the chapter's exercises: "9.%s", "A.%s", "%s"."""
    return f"{web_number(nb_path.name)}%s"


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=NB_IDS)
def test_chapter_opens_with_label_and_title(nb_path: Path) -> None:
    """The first cell: JupyterLab's front matter (issue 37, D5: jupyterlab-myst numbers the
    exercises as the web does, "Exercise 9.1", and no equation, as the web numbers none;
    book/_ext/book_html.py drops the block from the web and the PDF), then the chapter's
    label and title."""
    first = source(load(nb_path)["cells"][0])
    front = re.match(r"---\n(.*?\n)---\n", first, re.S)
    assert front, (
        f"{nb_path.name}: the first cell must open with JupyterLab's front matter"
    )
    # a blank line before the closing `---`: without it CommonMark reads the block as a
    # setext heading (an <h2> "numbering: ..." in VS Code, GitHub, nbconvert) and
    # JupyterLab's Table of Contents lists it above the chapter's title (review R4, F1)
    assert front.group(1).endswith("\n\n"), (
        f"{nb_path.name}: the front matter needs a blank line before its closing `---`"
    )
    assert yaml.safe_load(front.group(1)) == {
        "numbering": {"enumerator": web_enumerator(nb_path), "equation": False}
    }, f"{nb_path.name}: front matter {front.group(1)!r}"
    assert re.match(r"\(ch-[a-z0-9-]+\)=\n# \S", first[front.end() :]), (
        f"{nb_path.name}: the first cell must be a label `(ch-...)=` and a `# Title`"
    )


NETWORK = re.compile(
    r"https?://|\burllib\b|\brequests\b|\bhttpx\b|\bsocket\b|from_pretrained|hf_hub_download"
    r"|snapshot_download|load_dataset|torch\.hub|\bwget\b|\bcurl\b|!pip|%pip"
)


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=NB_IDS)
def test_no_notebook_touches_the_network(nb_path: Path) -> None:
    hits = [
        (i, m.group(0))
        for i, cell in enumerate(load(nb_path)["cells"])
        if cell["cell_type"] == "code"
        for m in [NETWORK.search(source(cell))]
        if m
    ]
    assert not hits, f"{nb_path.name}: code cells that may reach the network: {hits}"


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=NB_IDS)
def test_exercises_have_gated_solutions_that_run_a_checker(nb_path: Path) -> None:
    cells = load(nb_path)["cells"]
    exercises = []
    solutions: dict[str, list[dict]] = {}
    current: str | None = None
    for cell in cells:
        text = source(cell)
        if cell["cell_type"] == "markdown":
            exercises += re.findall(r"```\{exercise\}[^\n]*\n:label: (\S+)", text)
            start = re.search(r"```\{solution-start\} (\S+)", text)
            if start:
                assert current is None, f"{nb_path.name}: nested solution-start"
                current = start.group(1)
                solutions[current] = []
            if "{solution-end}" in text:
                assert current is not None, (
                    f"{nb_path.name}: solution-end without a start"
                )
                current = None
        elif current is not None:
            solutions[current].append(cell)
    assert current is None, f"{nb_path.name}: solution {current} is never closed"
    orphans = sorted(set(solutions) - set(exercises))
    assert not orphans, (
        f"{nb_path.name}: solutions without an exercise block: {orphans}"
    )
    for label in exercises:
        assert label in solutions, f"{nb_path.name}: exercise {label} has no solution"
        body = "\n".join(source(c) for c in solutions[label])
        assert re.search(r"\bcheck\w*\(", body), (
            f"{nb_path.name}: the solution to {label} must call its checker"
        )
        skipped = [
            c
            for c in solutions[label]
            if "skip-execution" in c.get("metadata", {}).get("tags", [])
        ]
        assert not skipped, f"{nb_path.name}: the solution to {label} must run at build"


def test_solution_markers_draw_no_dead_control_in_jupyterlab() -> None:
    """No solution marker carries ``:class: dropdown``: jupyterlab-myst draws it as a chevron
    that does not open the solution (issue 37, D3). The web folds every solution all the
    same (book/_ext/book_html.py adds the class; test_site's dropdown tests click them)."""
    blocks = [
        (nb_path.name, block)
        for nb_path in NOTEBOOKS
        for cell in load(nb_path)["cells"]
        for block in re.findall(r"```\{solution(?:-start)?\}[^`]*```", source(cell))
    ]
    assert len(blocks) >= 40, f"only {len(blocks)} solutions found"
    dropdowns = [name for name, block in blocks if "dropdown" in block]
    assert not dropdowns, f"solution markers with a dropdown class in {dropdowns}"
    ext = (ROOT / "book" / "_ext" / "book_html.py").read_text(encoding="utf-8")
    assert '"doctree-read", _fold_solutions' in ext, "the web no longer folds them"


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=lambda p: p.stem)
def test_cross_references_carry_their_text_on_one_line(nb_path: Path) -> None:
    """JupyterLab (jupyterlab-myst) cannot resolve a label in another notebook, so every
    {ref}/{numref}/{doc} names its link text, and on one line: a title broken over a line
    end is read as no title there and the bare label shows (Sphinx accepts both)."""
    nb = json.loads(nb_path.read_text(encoding="utf-8"))
    bad = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        for m in re.finditer(r"\{(?:ref|numref|doc)\}`([^`]*)`", source(cell)):
            text = m.group(1)
            if "<" not in text or "\n" in text:
                bad.append(text.replace("\n", "\\n"))
    assert not bad, (
        f"{nb_path.name}: cross-references without one-line link text: {bad}"
    )


def test_every_module_has_a_test_file() -> None:
    """companion/topic.py <-> tests/test_topic.py. Private modules (a leading underscore) are
    engines of a public one and are tested through it (``_rope_fast`` by test_rope); the
    validation layer has tests of its own (test_validate)."""
    modules = sorted((ROOT / "companion").glob("*.py"))
    missing = [
        m.name
        for m in modules
        if not m.stem.startswith("_")
        and not (ROOT / "tests" / f"test_{m.stem}.py").exists()
    ]
    assert (ROOT / "tests" / "test_validate.py").exists(), (
        "the validation layer has no tests"
    )
    assert not missing, f"companion modules without tests/test_<module>.py: {missing}"


# ---- Learners in plain Jupyter -------------------------------------------------------------
# nbmake executes every cell in order; with no cell carrying a tag that changes execution, that
# is exactly what "Run All" does in JupyterLab or Notebook 7. So the notebooks stage of
# `make test` is the plain-Jupyter run, and these tests keep it so.

EXECUTION_TAGS = {"skip-execution", "raises-exception", "skip", "remove_cell_execution"}


def solution_cells(nb: dict) -> list[tuple[int, dict]]:
    """Every cell from a solution-start marker to its solution-end marker, both included."""
    out, inside = [], False
    for i, cell in enumerate(nb["cells"]):
        text = source(cell)
        starts = cell["cell_type"] == "markdown" and "{solution-start}" in text
        if starts or inside:
            out.append((i, cell))
        inside = (inside or starts) and not (
            cell["cell_type"] == "markdown" and "{solution-end}" in text
        )
    return out


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=NB_IDS)
def test_no_cell_changes_how_it_executes(nb_path: Path) -> None:
    tagged = [
        (i, sorted(EXECUTION_TAGS & set(c.get("metadata", {}).get("tags", []))))
        for i, c in enumerate(load(nb_path)["cells"])
        if EXECUTION_TAGS & set(c.get("metadata", {}).get("tags", []))
    ]
    assert not tagged, (
        f"{nb_path.name}: cells {tagged} carry tags that nbmake or the build honour and "
        "Jupyter ignores: Run All would then differ from what the tests execute"
    )


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=NB_IDS)
def test_solutions_are_folded_in_jupyter(nb_path: Path) -> None:
    nb = load(nb_path)
    unfolded = [
        i
        for i, c in solution_cells(nb)
        if not c.get("metadata", {}).get("jupyter", {}).get("source_hidden")
    ]
    assert not unfolded, (
        f"{nb_path.name}: solution cells {unfolded} are not collapsed "
        "(metadata.jupyter.source_hidden: true)"
    )
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "markdown" and "{solution-start}" in source(cell):
            before = nb["cells"][i - 1]
            assert "remove-cell" in before.get("metadata", {}).get(
                "tags", []
            ) and "Solution" in source(before), (
                f"{nb_path.name}: cell {i - 1} must be a readable 'Solution (folded)' line for "
                "Jupyter users, tagged remove-cell (the web book shows a dropdown instead)"
            )


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=NB_IDS)
def test_exercise_stubs_run_their_checker_without_stopping(nb_path: Path) -> None:
    """A stub raises NotImplementedError inside the function and calls its checker, which
    reports "not attempted yet" instead of raising; its output is hidden in the web book."""
    folded = {i for i, _ in solution_cells(load(nb_path))}
    for i, cell in enumerate(load(nb_path)["cells"]):
        text = source(cell)
        if (
            cell["cell_type"] != "code"
            or "NotImplementedError" not in text
            or i in folded
        ):
            continue
        assert re.search(r"\bcheck\w*\(", text), (
            f"{nb_path.name}: stub {i} calls no checker"
        )
        # chapter 0 (Setting up) shows its stub's "not attempted yet" on purpose: it explains the pattern
        assert nb_path.name.startswith("00_") or "remove-output" in cell.get(
            "metadata", {}
        ).get("tags", []), f"{nb_path.name}: stub {i} must be tagged remove-output"


# Import name -> distribution name, where they differ.
DISTRIBUTION = {"PIL": "pillow", "yaml": "pyyaml", "sklearn": "scikit-learn"}


def chapter_imports() -> dict[str, set[str]]:
    """Top-level modules imported by the chapters' code cells -> the chapters importing them."""
    import ast

    found: dict[str, set[str]] = {}
    for nb_path in NOTEBOOKS:
        for cell in code_cells(load(nb_path)):
            code = "\n".join(
                line
                for line in source(cell).splitlines()
                if not line.lstrip().startswith(("%", "!"))
            )
            for node in ast.walk(ast.parse(code)):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif (
                    isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                ):
                    names = [node.module]
                for name in names:
                    found.setdefault(name.split(".")[0], set()).add(nb_path.name)
    return found


def test_every_module_a_chapter_imports_is_declared() -> None:
    """One install (`pip install -e ".[book]"`) brings everything a chapter imports."""
    import sys

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        declared += extra
    names = {
        re.split(r"[<>=!~\[ ;]", d, maxsplit=1)[0].lower().replace("_", "-")
        for d in declared
    }
    local = {"companion", "IPython"}  # the package itself; IPython comes with Jupyter
    missing = {
        module: sorted(chapters)
        for module, chapters in chapter_imports().items()
        if module not in sys.stdlib_module_names
        and module not in local
        and DISTRIBUTION.get(module, module).lower().replace("_", "-") not in names
    }
    assert not missing, (
        f"imported by chapters but not declared in pyproject.toml: {missing}"
    )
    assert "book" in project.get("optional-dependencies", {}), (
        "the [book] extra is missing"
    )


def test_book_extra_is_what_the_environment_report_checks() -> None:
    """Chapter 0's environment report checks every module the chapters import."""
    import sys

    from companion import environment

    checked = {p.name.lower() for p in environment.environment_report().packages}
    unchecked = [
        m
        for m in chapter_imports()
        if m not in sys.stdlib_module_names
        and m not in {"companion", "IPython"}
        and DISTRIBUTION.get(m, m).lower() not in checked
    ]
    assert not unchecked, f"environment_report does not check {unchecked}"


# --- the outline: no section is lost silently ----------------------------------------
OUTLINE = ROOT / "tests" / "book_outline.txt"
OUTLINE_HELP = (
    "if the change is on purpose, regenerate the pinned outline with "
    "`python tests/test_book.py --update-outline` and commit tests/book_outline.txt"
)
_FENCE = re.compile(r"^\s*(`{3,}|~{3,}|:{3,})(.*)$")
_HEADING = re.compile(r"^(#{1,3})\s+(.+?)\s*#*\s*$")
_TARGET = re.compile(r"^\((?P<label>[^()\s]+)\)=\s*$")
_DIRECTIVE = re.compile(r"^\{(?P<name>[\w:-]+)\}\s*(?P<title>.*)$")
_OPTION = re.compile(r"^\s*:(?P<key>[\w-]+):\s*(?P<value>.*)$")
#: Directives whose title the outline pins (the admonition family of MyST/Sphinx).
ADMONITIONS = {
    "admonition", "attention", "caution", "danger", "error", "hint", "important",
    "note", "seealso", "tip", "warning",
}  # fmt: skip


def outline(nb: dict) -> list[str]:
    """What a chapter must keep, in reading order: its `#`..`###` headings, its `(label)=`
    targets, its admonitions by title (`{admonition} Common mistakes`, a bare `{note}`) and
    its exercises by label (`{exercise} ex-rope-frequencies`).

    Code blocks (```python, a bare ``` and the like) are skipped; the bodies of MyST
    directives (```{note}, :::{admonition}) are read, since they are markdown. Fences are
    tracked as a stack, so a directive's closing fence closes it and opens nothing.
    """
    entries: list[str] = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        stack: list[tuple[str, int, bool]] = []  # (fence char, length, is code)
        exercise: int | None = None  # index of an {exercise} entry awaiting its :label:
        for line in source(cell).splitlines():
            match = _FENCE.match(line)
            if (
                stack and stack[-1][2]
            ):  # inside a code block: only its own fence closes it
                char, length, _ = stack[-1]
                if (
                    match
                    and match.group(1)[0] == char
                    and len(match.group(1)) >= length
                ):
                    if not match.group(2).strip():
                        stack.pop()
                continue
            if match:
                fence, info = match.group(1), match.group(2).strip()
                exercise = None
                if not info:
                    if (
                        stack
                        and stack[-1][0] == fence[0]
                        and len(fence) >= stack[-1][1]
                    ):
                        stack.pop()  # a directive ends
                    else:
                        stack.append((fence[0], len(fence), True))  # a bare code block
                    continue
                directive = _DIRECTIVE.match(info)
                if directive is None:  # ```python and the like
                    stack.append((fence[0], len(fence), fence[0] != ":"))
                    continue
                stack.append((fence[0], len(fence), False))
                name, title = directive.group("name"), directive.group("title").strip()
                if name in ADMONITIONS:
                    entries.append(f"{{{name}}} {title}".rstrip())
                elif name == "exercise":
                    entries.append(f"{{exercise}} {title}".rstrip())
                    exercise = len(entries) - 1
                continue
            if exercise is not None:
                option = _OPTION.match(line)
                if option and option.group("key") == "label":
                    entries[exercise] = f"{{exercise}} {option.group('value').strip()}"
                    exercise = None
                    continue
                if option is None:
                    exercise = None  # the options end: an exercise without a label
            if heading := _HEADING.match(line):
                entries.append(f"{heading.group(1)} {heading.group(2)}")
            elif target := _TARGET.match(line.strip()):
                entries.append(f"({target.group('label')})=")
    return entries


def outline_lines(notebooks: list[Path] = NOTEBOOKS) -> list[str]:
    return [f"{nb.name} | {entry}" for nb in notebooks for entry in outline(load(nb))]


def pinned_outline() -> dict[str, list[str]]:
    pinned: dict[str, list[str]] = {}
    for line in OUTLINE.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#!"):
            name, _, entry = line.partition(" | ")
            pinned.setdefault(name, []).append(entry)
    return pinned


def outline_difference(name: str, now: list[str], pinned: list[str]) -> str:
    """'' when equal, else which headings/targets the chapter lost, gained or moved."""
    if now == pinned:
        return ""
    lost = [e for e in pinned if e not in now]
    gained = [e for e in now if e not in pinned]
    parts = [f"book/{name}:"]
    if lost:
        parts.append(f"lost {lost}")
    if gained:
        parts.append(f"gained {gained}")
    if not lost and not gained:
        parts.append("the same headings in another order")
    return " ".join(parts) + f" ({OUTLINE_HELP})"


def test_outline_file_is_pinned() -> None:
    assert OUTLINE.is_file(), f"{OUTLINE} is missing ({OUTLINE_HELP})"
    names = set(pinned_outline())
    assert names == set(NB_IDS), (
        f"the pinned outline lists {sorted(names ^ set(NB_IDS))} that are not both "
        f"pinned and chapters ({OUTLINE_HELP})"
    )


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=NB_IDS)
def test_chapter_keeps_its_sections(nb_path: Path) -> None:
    """Every heading, `(label)=` target, admonition title and exercise label pinned in
    tests/book_outline.txt is still there, in the same order."""
    message = outline_difference(
        nb_path.name, outline(load(nb_path)), pinned_outline().get(nb_path.name, [])
    )
    assert not message, message


@pytest.mark.parametrize(
    "nb_path",
    [nb for nb in NOTEBOOKS if not nb.name.startswith("00_")],
    ids=lambda p: p.stem,
)
def test_every_numbered_chapter_has_a_common_mistakes_box(nb_path: Path) -> None:
    """The house style: an admonition titled "Common mistakes" in every chapter but
    Setting up (a subtitle after a colon is fine: "Common mistakes: mixing the layouts")."""
    boxes = [e for e in outline(load(nb_path)) if e.startswith("{admonition} ")]
    assert any(
        re.fullmatch(r"\{admonition\} Common mistakes(:.*)?", e) for e in boxes
    ), f"{nb_path.name}: no admonition titled 'Common mistakes' (has {boxes})"


def test_outline_reader_sees_headings_and_targets_but_not_code() -> None:
    nb = {
        "cells": [
            {"cell_type": "markdown", "source": "(ch-x)=\n# Title\n\n## Part\ntext"},
            {"cell_type": "code", "source": "# ## not a heading"},
            {"cell_type": "markdown", "source": "```python\n# comment\n```\n### Sub"},
            {
                "cell_type": "markdown",
                "source": "```{note}\n## In a note\n```\n#### Deep\n## After a note",
            },
        ]
    }
    assert outline(nb) == [
        "(ch-x)=",
        "# Title",
        "## Part",
        "### Sub",
        "{note}",
        "## In a note",
        "## After a note",  # the note's closing fence opens no code block
    ]
    lost = outline_difference("x.ipynb", ["# Title"], ["# Title", "## Part"])
    assert "book/x.ipynb: lost ['## Part']" in lost


def test_outline_reader_pins_admonition_titles_and_exercise_labels() -> None:
    nb = {
        "cells": [
            {
                "cell_type": "markdown",
                "source": ":::{admonition} Common mistakes\n:class: warning\n\n"
                "1. **Wrong.**\n   ```python\n   # ## not a heading\n   ```\n:::\n## Exercises",
            },
            {
                "cell_type": "markdown",
                "source": "````{exercise} The frequencies\n:label: ex-freq\n\nWrite:\n"
                "```python\n# ## not a heading\n```\n````\n"
                "```{exercise} Unlabelled\nText\n```\n"
                "```{solution-start} ex-freq\n:class: dropdown\n```",
            },
        ]
    }
    assert outline(nb) == [
        "{admonition} Common mistakes",
        "## Exercises",
        "{exercise} ex-freq",
        "{exercise} Unlabelled",
    ]


@pytest.mark.parametrize(
    ("chapter", "entry"),
    [
        ("01_sinusoidal_encoding.ipynb", "{admonition} Common mistakes"),
        ("02_rope.ipynb", "{exercise} ex-rope-frequencies"),
    ],
)
def test_outline_guard_fails_when_a_box_or_an_exercise_is_deleted(
    chapter: str, entry: str
) -> None:
    """The guard can fail: delete, in memory, the markdown cell that holds a chapter's
    "Common mistakes" box or one exercise; the outline then reports it lost."""
    nb = load(BOOK / chapter)
    now = outline(nb)
    assert entry in now, f"{chapter} has no {entry!r} to delete"
    kept = {
        "cells": [
            c
            for c in nb["cells"]
            if not (c["cell_type"] == "markdown" and entry in outline({"cells": [c]}))
        ]
    }
    message = outline_difference(chapter, outline(kept), now)
    assert "lost" in message and entry in message, message


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["--update-outline"]:
        sys.exit("usage: python tests/test_book.py --update-outline")
    OUTLINE.write_text(
        "#! Headings (#..###), (label)= targets, admonition titles and exercise labels of\n"
        "#! every chapter, pinned by tests/test_book.py; regenerate:\n"
        "#! python tests/test_book.py --update-outline\n"
        + "\n".join(outline_lines())
        + "\n",
        encoding="utf-8",
    )
    print(f"wrote {OUTLINE.relative_to(ROOT)}: {len(outline_lines())} entries")


def test_bibliography_keeps_arxiv_ids_in_eprint_only() -> None:
    """The bib style links `eprint` as arXiv:ID; an id typed into another field renders unlinked.

    Mirrors the browser test `test_bibliography_is_author_year_with_links` so the unit stage catches it
    before the book is built.
    """
    bib = (BOOK / "references.bib").read_text(encoding="utf-8")
    entries = re.split(r"\n(?=@)", bib)
    stray = []
    for entry in entries:
        key = re.match(r"@\w+\{([^,]+),", entry.strip())
        for field, value in re.findall(
            r"^\s*(\w+)\s*=\s*\{(.*)\},?\s*$", entry, flags=re.M
        ):
            if field.lower() == "eprint":
                continue
            if re.search(r"arXiv:\s*\d{4}\.\d{4,5}", value):
                stray.append(f"{key.group(1) if key else '?'}: {field}")
    assert not stray, f"arXiv ids outside the eprint field (render unlinked): {stray}"


def test_every_listing_names_a_file_and_an_object_that_exist() -> None:
    """A ``literalinclude`` of a chapter shows code from its file: the file exists and,
    with ``:pyobject:``, holds that function, class or ``Class.method`` (a module split
    moved the appendix's kernels out of the file its listings named; only the book
    build with -n -W saw it)."""
    import ast

    pattern = re.compile(r"```\{literalinclude\}\s+(\S+)\s*\n(?::pyobject:\s*(\S+))?")
    problems, found = [], 0
    for page in sorted([*BOOK.glob("*.ipynb"), *BOOK.glob("*.md")]):
        text = page.read_text(encoding="utf-8")
        if page.suffix == ".ipynb":
            text = "\n".join("".join(c["source"]) for c in json.loads(text)["cells"])
        for target, name in pattern.findall(text):
            found += 1
            path = (BOOK / target).resolve()
            if not path.is_file():
                problems.append(f"{page.name}: {target} does not exist")
                continue
            scope = ast.parse(path.read_text(encoding="utf-8")).body
            kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
            for part in name.split(".") if name else []:  # "Class.method", as Sphinx
                match = [n for n in scope if isinstance(n, kinds) and n.name == part]
                if not match:
                    problems.append(f"{page.name}: {target} has no {name}")
                    break
                scope = match[0].body
    assert found >= 5, found  # the pattern still reads the book's listings
    assert not problems, problems
