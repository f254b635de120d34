"""The whole-book PDF (``make pdf`` writes ``_build/pdf/book.pdf``) holds the whole book and
reads like a book.

Read back with pypdf: every page of the table of contents appears by its title (chapters,
notation, API, references), no formula is left as raw TeX (a TeX fragment may appear only
inside code the book prints: a notebook cell or a companion source shown with
literalinclude), code split across pages keeps its spaces, the solutions are printed (each solution's code is in the text, not folded
away) in a "Solutions" section at the end of their chapter, and no piece of the web page's
interface is printed. As a book: no link points to a local file (``file://``), every
internal link lands on a page of the PDF, the contents page gives every chapter with the
page it starts on, the bookmarks nest part > chapter > section and each opens a page that
shows its heading, every page but the title page carries a running header (its chapter's
title) and a page number, and no page is blank. Run with
``pytest tests/browser/test_pdf.py --browser`` (its own stage of ``make test``, after the book
and ``make pdf``). Without a PDF the test skips, except under CI (``CI`` set).
"""

from __future__ import annotations

import itertools
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
def _reader() -> object:
    if not PDF.is_file():
        if os.environ.get("CI"):
            pytest.fail(
                f"{PDF} is missing: `make pdf` did not run (a failure under CI)"
            )
        pytest.skip(f"no {PDF.relative_to(ROOT)}: run `make pdf` first")
    from pypdf import PdfReader

    return PdfReader(PDF)


@cache
def _page_texts() -> tuple[str, ...]:
    """Each page's text, read by PDFium (pypdfium2): 380 pages in a few seconds, where
    pypdf's `extract_text` took 158 s of one core in make test (pypdf still reads the
    outline and the links)."""
    _reader()  # fails or skips as the others do when there is no PDF
    import pypdfium2

    document = pypdfium2.PdfDocument(PDF)
    try:
        return tuple(
            document[i].get_textpage().get_text_bounded() for i in range(len(document))
        )
    finally:
        document.close()


@cache
def _pdf_text() -> str:
    return "\n".join(_page_texts())


def _outline() -> list[tuple[int, str, int]]:
    """The bookmarks as (depth, title, 0-based page), in order."""
    reader = _reader()
    found: list[tuple[int, str, int]] = []

    def walk(items: list, depth: int) -> None:
        for item in items:
            if isinstance(item, list):
                walk(item, depth + 1)
            else:
                found.append(
                    (depth, item.title, reader.get_destination_page_number(item))
                )

    walk(reader.outline, 0)
    return found


def _links() -> list[dict]:
    """Every link annotation: its page and its /A or /Dest."""
    links = []
    for number, page in enumerate(_reader().pages):
        for ref in page.get("/Annots") or []:
            annot = ref.get_object()
            if annot.get("/Subtype") == "/Link":
                links.append(
                    {"page": number, "A": annot.get("/A"), "Dest": annot.get("/Dest")}
                )
    return links


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
        return [
            {
                "type": c["cell_type"],
                "source": "".join(c["source"]),
                "tags": c.get("metadata", {}).get("tags", []),
            }
            for c in cells
        ]
    return [
        {"type": "markdown", "source": path.read_text(encoding="utf-8"), "tags": []}
    ]


#: cell tags whose input the PDF does not print (myst-nb folds or drops it)
UNPRINTED_INPUT = {"hide-input", "remove-input", "remove-cell", "hide-cell"}


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


def test_code_keeps_its_spaces_on_every_page() -> None:
    """A code block split across pages keeps the spaces between its tokens on the page it
    continues onto (Paged.js passed over Pygments' whitespace-only text there: "x=1")."""
    spaced = " ".join(_pdf_text().split())
    squashed = _squash(_pdf_text())
    checked, lost = 0, []
    for path in _toc_files():
        for cell in _cells(path):
            if cell["type"] != "code" or UNPRINTED_INPUT & set(cell["tags"]):
                continue  # its input is not printed: a match would be some other text's
            for line in cell["source"].splitlines():
                # an assignment as ruff formats it, ASCII only (extraction keeps it whole)
                if not (line.isascii() and re.match(r"\s*[A-Za-z_]\w* = \S", line)):
                    continue
                words = " ".join(line.split())[:40]
                if _squash(words) not in squashed:
                    continue  # a cell the book does not print (remove-input)
                checked += 1
                if words not in spaced:
                    lost.append(f"{path.stem}: {words!r}")
    assert checked > 500, f"only {checked} printed assignments found"
    assert not lost, f"{len(lost)} code lines printed without their spaces: {lost[:5]}"


def test_no_web_interface_is_printed() -> None:
    text = _pdf_text()
    printed = {word: text.count(word) for word in CHROME if word in text}
    assert not printed, f"interface text printed: {printed}"


# ---- A book: links, contents, bookmarks, running headers -------------------------------


def test_no_link_points_to_a_local_file() -> None:
    links = _links()
    assert len(links) > 100, f"only {len(links)} links in the PDF: nothing checked"
    uris = [str(link["A"].get("/URI")) for link in links if link["A"] is not None]
    local = [u for u in uris if u != "None" and not u.startswith(("https:", "http:"))]
    assert not local, f"{len(local)} links that are not public URLs, e.g. {local[:3]}"


def test_every_internal_link_lands_on_a_page() -> None:
    reader = _reader()
    pages = {page.indirect_reference.idnum: n for n, page in enumerate(reader.pages)}
    named = reader.named_destinations
    internal, dead = 0, []
    for link in _links():
        action = link["A"]
        dest = link["Dest"]
        if action is not None and action.get("/S") == "/GoTo":
            dest = action.get("/D")
        if dest is None:
            continue
        internal += 1
        if isinstance(dest, str) or not hasattr(dest, "__getitem__"):
            target = named.get(str(dest))
            page = reader.get_destination_page_number(target) if target else None
        else:
            ref = dest[0]
            page = pages.get(getattr(ref, "idnum", None))
        if page is None:
            dead.append(f"p. {link['page'] + 1}: {dest}")
    assert internal > 300, (
        f"only {internal} internal links (cross-references, citations)"
    )
    assert not dead, f"{len(dead)} internal links land nowhere, e.g. {dead[:5]}"


def _chapter_titles() -> list[str]:
    return [_title(path) for path in _toc_files()]


def test_contents_gives_every_chapter_with_its_page() -> None:
    texts = _page_texts()
    outline = _outline()
    start = next(page for _, title, page in outline if title == "Contents")
    end = min(page for _, title, page in outline if page > start)
    lines = "\n".join(texts[start:end]).splitlines()
    problems = []
    for title in _chapter_titles():
        entry = [ln for ln in lines if _squash(title) in _squash(ln)]
        number = re.search(r"(\d+)\s*$", entry[0]) if entry else None
        if not number:
            problems.append(f"{title!r}: no contents line with a page number")
            continue
        page = int(number.group(1)) - 1
        starts = [
            p
            for _, t, p in outline
            if re.fullmatch(r"(\d+\.|[A-Z]\.)?" + re.escape(_squash(title)), _squash(t))
        ]
        if page not in starts or _squash(title) not in _squash(texts[page]):
            problems.append(
                f"{title!r}: contents says page {page + 1}, bookmarks {starts[:3]}"
            )
    assert not problems, "\n".join(problems)


def test_bookmarks_nest_parts_chapters_sections_and_open_their_heading() -> None:
    outline = _outline()
    texts = _page_texts()
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    captions = [part["caption"] for part in toc.get("parts", [])]
    top = [title for depth, title, _ in outline if depth == 0]
    assert [c for c in captions if c in top] == captions, (
        f"parts {captions} are not top-level bookmarks: {top}"
    )
    # every chapter of a part is a bookmark one level below its part
    problems = []
    for part in toc.get("parts", []):
        at = next(
            i for i, (d, t, _) in enumerate(outline) if d == 0 and t == part["caption"]
        )
        children = []
        for depth, title, _ in outline[at + 1 :]:
            if depth == 0:
                break
            if depth == 1:
                children.append(_squash(title))
        for chapter in part["chapters"]:
            path = next(
                p
                for p in _toc_files()
                if p.with_suffix("").as_posix().endswith(chapter["file"])
            )
            if not any(_squash(_title(path)) in child for child in children):
                problems.append(
                    f"{_title(path)!r} is not a bookmark under {part['caption']!r}"
                )
    assert sum(1 for depth, _, _ in outline if depth == 2) > 40, (
        "too few section bookmarks"
    )
    # each bookmark opens a page that shows its heading, with the heading's own spaces
    # (a heading with a formula: its words; MathJax's glyphs extract their own way)
    for _depth, title, page in outline:
        spaced = " ".join(texts[page].split())
        if re.fullmatch(r"[\d.]*\s*[A-Za-z ,:'’-]+", title):
            if " ".join(title.split()) not in spaced:
                problems.append(
                    f"bookmark {title!r} is not a heading of page {page + 1}"
                )
        elif not all(w in spaced for w in re.findall(r"[A-Za-z]{3,}", title)):
            problems.append(f"bookmark {title!r} opens page {page + 1}, which lacks it")
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems[:20])


def test_pages_have_running_header_and_number_and_none_is_blank() -> None:
    texts = _page_texts()
    outline = _outline()
    captions = {
        part["caption"]
        for part in yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))[
            "parts"
        ]
    }
    chapters, top = [], ""
    for depth, title, page in outline:
        top = title if depth == 0 else top
        if (depth == 0 and title not in captions) or (depth == 1 and top in captions):
            chapters.append((page, title))
    headers = {_squash(title) for _, title, _ in outline}
    problems = []
    for number, text in enumerate(texts[1:], start=1):
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        if not any(ln == str(number + 1) for ln in lines[:3]):
            problems.append(f"page {number + 1}: no page number among {lines[:3]}")
        body = [ln for ln in lines if ln != str(number + 1)]
        if body and _squash(body[0]) in headers:
            body = body[1:]  # the running header alone is no content
        if not body:
            problems.append(f"page {number + 1} is blank")
    # the page after each chapter's first page is headed by the chapter's title
    for (page, title), (nxt, _) in itertools.pairwise(chapters):
        if nxt > page + 1:
            head = texts[page + 1].splitlines()[0]
            if _squash(head) != _squash(title) and _squash(title) not in _squash(
                head + texts[page + 1].splitlines()[1]
            ):
                problems.append(f"page {page + 2}: header {head!r}, chapter {title!r}")
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems[:20])


def test_solutions_are_collected_at_the_end_of_their_chapter() -> None:
    outline = _outline()
    solutions = _solution_code()
    chapters = [(i, title) for i, (depth, title, _) in enumerate(outline) if depth == 1]
    with_solutions = []
    for (i, title), nxt in zip(
        chapters, [*chapters[1:], (len(outline), "")], strict=True
    ):
        inside = [t for depth, t, _ in outline[i + 1 : nxt[0]] if depth == 2]
        if "Solutions" in inside:
            with_solutions.append(_squash(title))
            assert inside[-1] == "Solutions", (
                f"{title}: Solutions is not its last section"
            )
    expected = [_squash(_title(p)) for p in _toc_files() if p.stem in solutions]
    missing = [t for t in expected if not any(t in w for w in with_solutions)]
    assert not missing, f"chapters with solutions but no Solutions section: {missing}"
    # every exercise with a solution links to it
    blocks = sum(
        len(re.findall(r"\{solution(?:-start)?\}", c["source"]))
        for p in _toc_files()
        for c in _cells(p)
    )
    links = _squash(_pdf_text()).count("Solutionattheendofthechapter")
    assert blocks and links == blocks, f"{links} links to solutions, {blocks} solutions"


# ---- icons, the API reference, the appendix (review s6-ux m2, m3, m6) --------------------

REPORT = ROOT / "_build" / "pdf" / "book.json"


@cache
def _report() -> dict:
    _reader()  # skips (or fails under CI) without a PDF
    return json.loads(REPORT.read_text(encoding="utf-8"))


@cache
def _fonts() -> tuple[frozenset[str], ...]:
    """The fonts each page uses, without the subset prefix ("AAAAAA+")."""
    found = []
    for page in _reader().pages:
        fonts = (page.get("/Resources") or {}).get("/Font") or {}
        found.append(
            frozenset(
                re.sub(r"^/?([A-Z]{6}\+)?", "", str(f.get_object().get("/BaseFont")))
                for f in fonts.values()
            )
        )
    return tuple(found)


def test_box_icons_print_in_the_icon_font() -> None:
    """Every exercise, solution, theorem and note box prints its icon from the theme's icon
    font (it printed a missing-glyph box in the text font): build_pdf.py measured each box's
    icon after pagination, and the PDF embeds the icon font on the pages with boxes."""
    icons = _report().get("iconCheck")
    assert icons, "build_pdf.py did not check the icons"
    assert icons["icons"] >= 40, icons
    assert icons["wrongFont"] == 0 and icons["fontLoaded"], icons
    fonts = _fonts()
    assert len(icons["pages"]) >= 20, icons["pages"]
    without = [
        n for n in icons["pages"] if "FontAwesome6Free-Solid" not in fonts[n - 1]
    ]
    assert not without, f"pages with box icons but no icon font: {without[:10]}"


def _api_pages() -> range:
    outline = _outline()
    at = [
        k for k, (_, title, _) in enumerate(outline) if title.endswith("API reference")
    ]
    assert len(at) == 1, f"bookmarks named 'API reference': {len(at)}"
    depth, _, first = outline[at[0]]
    following = [p for d, _, p in outline[at[0] + 1 :] if d <= depth]
    last = following[0] if following else len(_reader().pages)
    return range(first, last)


def test_the_api_reference_is_its_input_contract_in_print() -> None:
    """The API reference fills a small part of the PDF (it was 149 of 473 pages): the input
    contract's tables, which name every public module, and a note that sends the reader to
    the web page and help() for the docstrings."""
    pages = _api_pages()
    total = len(_reader().pages)
    assert len(pages) <= 0.08 * total, (
        f"the API reference takes {len(pages)} of {total} pages"
    )
    text = _squash("\n".join(_page_texts()[i] for i in pages))
    modules = [
        *sorted(
            f"companion.{p.stem}"
            for p in (ROOT / "companion").glob("*.py")
            if not p.stem.startswith("_")
        ),
        "companion.checks",
    ]
    missing = [m for m in modules if m not in text]
    assert not missing, f"the printed API reference does not name {missing}"
    assert "help(companion." in text and "book/api.md" in text, (
        "the printed API reference does not say where the docstrings are"
    )
    report = _report()
    assert report.get("apiSectionsDropped", 0) >= 10, report.get("apiSectionsDropped")


def test_the_appendix_is_numbered_as_an_appendix() -> None:
    """The appendix's title, sections and figures are lettered (A, A.1, Fig. A.1), in the
    contents, the text and the bookmarks; no number continues the chapters' into it."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    appendices = [
        chapter["file"]
        for part in toc["parts"]
        if part.get("caption", "").lower().startswith("appendix")
        for chapter in part["chapters"]
    ]
    assert appendices, "_toc.yml has no appendix part"
    text = _squash(_pdf_text())
    titles = [t for _, t, _ in _outline()]
    for letter, doc in zip("ABCDEFGH", appendices, strict=False):
        path = next(p for p in _toc_files() if p.with_suffix("").match(doc))
        title = _title(path)
        assert _squash(f"{letter}. {title}") in text, (
            f"no '{letter}. {title}' in the PDF"
        )
        assert any(t.startswith(f"{letter}. ") for t in titles), (
            f"no bookmark '{letter}. {title}'"
        )
        assert any(t.startswith(f"{letter}.1. ") for t in titles), (
            f"the appendix's first section is not bookmarked as {letter}.1"
        )
    numbered_parts = [p for p in toc["parts"] if p.get("numbered")]
    chapters = sum(
        len(p["chapters"])
        for p in numbered_parts
        if not p.get("caption", "").lower().startswith("appendix")
    )
    assert not re.search(rf"Fig\.{chapters + 1}\.\d", text), (
        f"a figure numbered as chapter {chapters + 1}"
    )
