"""The whole-book PDF (``make pdf`` writes ``_build/pdf/book.pdf``) holds the whole book.

Read back with pypdf: every page of the table of contents appears by its title (chapters,
notation, API, references), no formula is left as raw TeX (a TeX fragment may appear only
inside code the book prints: a notebook cell or a companion source shown with
literalinclude), the solutions are printed (each solution's code is in the text, not folded
away), and no piece of the web page's interface is printed. Run with
``pytest tests/browser/test_pdf.py --browser`` (its own stage of ``make test``, after the book
and ``make pdf``). Without a PDF the test skips, except under CI (``CI`` set).
"""

from __future__ import annotations

import json
import os
import re
from functools import cache
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PDF = ROOT / "_build" / "pdf" / "book.pdf"
# TeX that MathJax would have typeset: a delimiter or a command only math uses.
RAW_TEX = re.compile(
    r"\$\$|\\\(|\\\)|\\\[|\\\]|\\(?:frac|sqrt|mathrm|begin|end|sum|top)\b"
)
CHROME = (
    "Show code cell",
    "Hide code cell",
    "Toggle",
    "Back to top",
    "Repository",
    "Copy to",
)

pytestmark = pytest.mark.browser


def _squash(text: str) -> str:
    """Text with every whitespace removed (PDF extraction breaks lines its own way) and
    typographic quotes made plain (Sphinx's smartquotes)."""
    text = text.translate(
        str.maketrans({"\u2019": "'", "\u2018": "'", "\u201c": '"', "\u201d": '"'})
    )
    return re.sub(r"\s+", "", text)


@cache
def _pdf_text() -> str:
    if not PDF.is_file():
        if os.environ.get("CI"):
            pytest.fail(
                f"{PDF} is missing: `make pdf` did not run (a failure under CI)"
            )
        pytest.skip(f"no {PDF.relative_to(ROOT)}: run `make pdf` first")
    from pypdf import PdfReader

    return "\n".join(page.extract_text() or "" for page in PdfReader(PDF).pages)


def _toc_files() -> list[Path]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    names = [toc["root"]]
    for part in toc.get("parts", []):
        names += [chapter["file"] for chapter in part.get("chapters", [])]
    files = []
    for name in names:
        for suffix in (".ipynb", ".md"):
            if (ROOT / f"{name}{suffix}").is_file():
                files.append(ROOT / f"{name}{suffix}")
    return files


def _cells(path: Path) -> list[dict]:
    if path.suffix == ".ipynb":
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        return [{"type": c["cell_type"], "source": "".join(c["source"])} for c in cells]
    return [{"type": "markdown", "source": path.read_text(encoding="utf-8")}]


def _title(path: Path) -> str:
    for cell in _cells(path):
        if cell["type"] != "markdown":
            continue
        match = re.search(r"^# (.+)$", cell["source"], flags=re.M)
        if match:
            return re.sub(r"[`*_]", "", match.group(1)).strip()
    raise AssertionError(f"{path.name} has no '# ' title")


def _printed_code() -> str:
    """Every piece of code the book can print, squashed: notebook cells, code fences, inline
    code and the companion sources (literalinclude)."""
    parts = [
        p.read_text(encoding="utf-8")
        for p in sorted((ROOT / "companion").rglob("*.py"))
    ]
    for path in _toc_files():
        parts += [c["source"] for c in _cells(path) if c["type"] == "code"]
        parts += [c["source"] for c in _cells(path) if "```" in c["source"]]
        parts += [
            span
            for c in _cells(path)
            for span in re.findall(r"`([^`\n]+)`", c["source"])
        ]
    return _squash("\n".join(parts))


def _solution_code() -> dict[str, list[str]]:
    """Chapter -> the code cells inside its {solution-start} ... {solution-end} blocks."""
    found: dict[str, list[str]] = {}
    for path in _toc_files():
        inside = False
        for cell in _cells(path):
            if "{solution-start}" in cell["source"]:
                inside = True
            elif "{solution-end}" in cell["source"]:
                inside = False
            elif inside and cell["type"] == "code" and cell["source"].strip():
                found.setdefault(path.stem, []).append(cell["source"])
    return found


@pytest.mark.parametrize("path", _toc_files(), ids=lambda p: p.stem)
def test_every_page_of_the_book_is_in_the_pdf(path: Path) -> None:
    title = _title(path)
    assert _squash(title) in _squash(_pdf_text()), (
        f"{path.name}: title {title!r} not in the PDF"
    )


def test_no_formula_is_left_as_raw_tex() -> None:
    """Each TeX fragment in the PDF (the whitespace-free run of text around it) must be
    code the book prints on purpose."""
    code = _printed_code()
    raw = []
    for line in _pdf_text().splitlines():
        for match in RAW_TEX.finditer(line):
            start = line.rfind(" ", 0, match.start()) + 1
            end = line.find(" ", match.end())
            token = line[start : None if end < 0 else end]
            if _squash(token) not in code:
                raw.append(f"{token!r} in {line.strip()[:80]!r}")
    assert not raw, f"{len(raw)} raw TeX fragments outside printed code, e.g. {raw[:5]}"


def test_the_solutions_are_printed_unfolded() -> None:
    solutions = _solution_code()
    assert solutions, "the book has no solution blocks: nothing to check"
    text = _squash(_pdf_text())
    missing = []
    for chapter, cells in solutions.items():
        for source in cells:
            # the first three lines of each solution cell, in order; other text may
            # come between them where a page break splits the cell (the PDF's text
            # order puts the next page's first lines there)
            lines = [ln for ln in source.splitlines() if ln.strip()]
            at = 0
            for line in lines[:3]:
                at = text.find(_squash(line), at)
                if at < 0:
                    missing.append(f"{chapter}: {lines[0][:60]}")
                    break
    assert not missing, f"{len(missing)} solutions not printed, e.g. {missing[:5]}"


def test_no_web_interface_is_printed() -> None:
    text = _pdf_text()
    printed = {word: text.count(word) for word in CHROME if word in text}
    assert not printed, f"interface text printed: {printed}"
