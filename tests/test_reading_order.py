"""The reading order works for a newcomer (issue 37): read in the order of `_toc.yml`, no
chapter explains a thing with a chapter the reader has not reached yet.

A *forward reference* is a `{ref}`, `{numref}`, `{doc}` or `{eq}` in a chapter's Markdown
whose target (a `(label)=`, an exercise's `:label:` or a page) lies in a later chapter. Each
one is either a **pointer** (the sentence is complete without the later chapter: it says
where a topic is taken further, measured, or used) or an **explanation** (the sentence
needs the later chapter to be understood). Pointers are allowed and listed in
:data:`POINTERS`, each with the number of such references and the reason it is only a
pointer; anything else is an explanation, and their number is held at
:data:`EXPLAINING_FORWARD_REFERENCES` = 0: a concept a chapter uses before its own chapter
is explained where it is first used (attention in the sinusoidal chapter's "Attention in
one page"; the small trained model of the position family's chapter in the paragraph that
uses it), and the reference to its
own chapter is then a pointer. A new forward reference fails the test until it is
classified here.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest
from test_book import toc_files

ROOT = Path(__file__).resolve().parents[1]

#: (chapter, target label) -> (how many references, why each is a pointer only).
POINTERS: dict[tuple[str, str], tuple[int, str]] = {
    ("01_sinusoidal_encoding", "ch-rope"): (
        5,
        "names rotary embedding as where the frequencies live on, as the next step of the "
        "complex view, as the owner of the letter g, and as the fix for the non-relative "
        "scores this chapter computes; the chapter's own argument is complete without it",
    ),
    ("01_sinusoidal_encoding", "ch-attention"): (
        1,
        "Attention in one page explains all of attention the position chapters use and "
        "points to the attention chapter for the full story",
    ),
    ("01_sinusoidal_encoding", "ch-performance"): (
        1,
        "the appendix measures the whole timing table; the chapter prints its own ratio",
    ),
    ("01_sinusoidal_encoding", "ch-tiny-transformer"): (
        1,
        "where extrapolation is measured by training; the sentence states its own point",
    ),
    ("01_sinusoidal_encoding", "ch-extension"): (
        2,
        "where methods that stretch a context are covered, and where the cited survey's "
        "road is walked",
    ),
    ("02_rope", "ch-performance"): (
        3,
        "the roofline and the side-by-side timings are measured in the appendix; the "
        "chapter's byte count stands on its own",
    ),
    ("02_rope", "ch-real-models"): (
        1,
        "names the families that use RoPE, which that chapter rebuilds",
    ),
    ("03_context_extension", "ch-real-models"): (
        1,
        "the KV cache is explained in the sentence that uses it; that chapter builds one",
    ),
    ("03_context_extension", "ch-relative"): (
        1,
        "the book's own train-short-test-long measurement follows in the next chapter; "
        "this one quotes the paper's numbers",
    ),
    ("04_relative_positions", "ch-tiny-transformer"): (
        2,
        "the small model and task are described in the paragraph that uses them; the "
        "capstone builds them",
    ),
    ("04_relative_positions", "ch-real-models"): (
        1,
        "from_hf builds the decoder there; here only its LongRoPE copy is used",
    ),
    ("05_attention", "ch-performance"): (
        4,
        "timings (the median of several runs), the CPU's machine balance and the loop "
        "order of the first FlashAttention are measured or told in the appendix",
    ),
    ("06_normalization", "ch-real-models"): (
        1,
        "names the families and their norms, which that chapter reads from the configs",
    ),
    ("06_normalization", "sec-tiny-warmup"): (
        2,
        "the warm-up is tested by training in the capstone; this chapter's measurements "
        "at initialization stand on their own",
    ),
    ("08_real_models", "ch-modern"): (
        7,
        "the families of 2024-2025, their sliding caches, padded batches and DeepSeek-V3 "
        "are the next chapter's subject; this one uses the four classic families",
    ),
}

#: Forward references that a sentence needs in order to be understood: the number argued
#: for in issue 37 is zero.
EXPLAINING_FORWARD_REFERENCES = 0

ROLE = re.compile(r"\{(ref|numref|doc|eq)\}`([^`]*)`")
LABEL = re.compile(r"^\(([^()\s]+)\)=\s*$", re.M)
EXERCISE_LABEL = re.compile(r"^:label:\s*(\S+)\s*$", re.M)


toc_pages = toc_files  # test_book's reader of _toc.yml, in reading order


def markdown_of(page: str) -> list[str]:
    nb = ROOT / f"{page}.ipynb"
    if nb.exists():
        cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
        return [
            "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
            for c in cells
            if c["cell_type"] == "markdown"
        ]
    return [(ROOT / f"{page}.md").read_text(encoding="utf-8")]


def forward_references(
    chapters: list[tuple[str, list[str]]],
) -> list[tuple[str, str, str]]:
    """(chapter, target, sentence) for every reference from a chapter to a later one.

    ``chapters`` is the reading order: (name, its Markdown texts). A target is a
    `(label)=`, an exercise's `:label:` or a chapter's name (for `{doc}`)."""
    where: dict[str, int] = {}
    for i, (name, texts) in enumerate(chapters):
        where[name] = i
        for text in texts:
            for label in LABEL.findall(text) + EXERCISE_LABEL.findall(text):
                where[label] = i
    found = []
    for i, (name, texts) in enumerate(chapters):
        for text in texts:
            for match in ROLE.finditer(text):
                body = match.group(2)
                explicit = re.search(r"<([^<>]+)>\s*$", body)
                target = (explicit.group(1) if explicit else body).strip()
                target = target.rsplit("/", 1)[-1]  # {doc}`book/02_rope` -> 02_rope
                if where.get(target, -1) > i:
                    start = text.rfind("\n\n", 0, match.start()) + 1
                    end = text.find("\n\n", match.end())
                    sentence = " ".join(text[start : end if end > 0 else None].split())
                    found.append((name, target, sentence))
    return found


def book_chapters() -> list[tuple[str, list[str]]]:
    """The numbered chapters and the setting-up chapter, in reading order (the intro, the
    notation and run-locally pages are maps and references, not steps of the path)."""
    return [
        (Path(page).name, markdown_of(page))
        for page in toc_pages()
        if re.fullmatch(r"book/\d\d_[a-z0-9_]+", page)
    ]


def test_forward_references_are_pointers_only() -> None:
    found = forward_references(book_chapters())
    counts = Counter((name, target) for name, target, _ in found)
    explaining = [f for f in found if (f[0], f[1]) not in POINTERS]
    assert len(explaining) == EXPLAINING_FORWARD_REFERENCES, (
        "references to a later chapter that are not listed as pointers (explain the "
        "concept where it is used, or add the pair to POINTERS with the reason it is "
        "only a pointer):\n"
        + "\n".join(f"- {n} -> {t}: {s[:300]}" for n, t, s in explaining)
    )
    wrong = {
        pair: (counts.get(pair, 0), expected)
        for pair, (expected, _) in POINTERS.items()
        if counts.get(pair, 0) != expected
    }
    assert not wrong, (
        "pointers whose count changed (found, listed): "
        f"{wrong}; classify the new or removed reference and update POINTERS:\n"
        + "\n".join(f"- {n} -> {t}: {s[:300]}" for n, t, s in found if (n, t) in wrong)
    )


def test_the_pointer_list_holds_every_forward_reference() -> None:
    """The argued number, in words: as many pointers as POINTERS lists, and nothing else."""
    found = forward_references(book_chapters())
    assert len(found) == sum(n for n, _ in POINTERS.values()) + (
        EXPLAINING_FORWARD_REFERENCES
    )


def test_the_finder_sees_forward_and_not_backward_references() -> None:
    chapters = [
        (
            "01_a",
            ["(ch-a)=\n# A\n\nSee {ref}`B <ch-b>` for it.\n\nAnd {numref}`fig-b`."],
        ),
        (
            "02_b",
            [
                "(ch-b)=\n# B\n\nAs in {ref}`ch-a`.",
                "(fig-b)=\n```{exercise} x\n:label: ex-b\n```",
            ],
        ),
        ("03_c", ["# C\n\n{doc}`book/02_b` and {ref}`the exercise <ex-b>`."]),
    ]
    found = forward_references(chapters)
    assert [(n, t) for n, t, _ in found] == [("01_a", "ch-b"), ("01_a", "fig-b")]
    assert found[0][2] == "See {ref}`B <ch-b>` for it."


def test_attention_is_explained_before_the_position_chapters_use_it() -> None:
    """The sinusoidal chapter opens with the one-page account of attention, before the
    first section that computes with it, and the RoPE, context-extension and position-family
    chapters, which come before the attention chapter, point to that page in their opening
    cell."""
    chapters = dict(book_chapters())
    first = chapters["01_sinusoidal_encoding"]
    primer = next(i for i, t in enumerate(first) if "(sec-attention-one-page)=" in t)
    uses = next(
        i for i, t in enumerate(first) if "## Why attention needs positions" in t
    )
    assert primer < uses
    for name in ("02_rope", "03_context_extension", "04_relative_positions"):
        assert "<sec-attention-one-page>`" in chapters[name][0], name


@pytest.mark.parametrize("name", [n for n, _ in book_chapters()])
def test_chapter_opens_with_why_and_what_you_will_be_able_to_do(name: str) -> None:
    """The opening cell: a paragraph of why the chapter matters, then a "You will be able
    to" list of at least three bullets."""
    opening = dict(book_chapters())[name][0]
    head, sep, tail = opening.partition("**You will be able to**")
    assert sep, f"{name}: no 'You will be able to' list in the opening cell"
    paragraphs = [
        p
        for p in head.split("\n\n")
        if p.strip() and not p.lstrip().startswith(("(", "#"))
    ]
    assert paragraphs and len(" ".join(paragraphs).split()) >= 40, (
        f"{name}: no paragraph on why the chapter matters before the list"
    )
    bullets = re.findall(r"^- \S", tail.split("\n\n\n")[0], re.M)
    assert len(bullets) >= 3, f"{name}: the list has {len(bullets)} bullets"


@pytest.mark.parametrize("name", [n for n, _ in book_chapters()])
def test_no_chapter_opens_on_a_study_note(name: str) -> None:
    """The study notes are introduced once, in the intro; a chapter states the correct
    thing first, and its first section's first paragraph is not a note's text."""
    texts = dict(book_chapters())[name]
    title_end = re.search(r"^# .*$", texts[0], re.M).end()
    why = texts[0][title_end:].strip().split("\n\n")[0]
    assert "study note" not in why.lower(), (
        f"{name}: the opening paragraph quotes a note"
    )
    section = next(t for t in texts[1:] if re.search(r"^## ", t, re.M))
    body = section[re.search(r"^## .*$", section, re.M).end() :].strip()
    first_paragraph = body.split("\n\n")[0]
    assert "study note" not in first_paragraph.lower(), (
        f"{name}: the first section opens on a study note: {first_paragraph[:200]}"
    )


def test_the_intro_introduces_the_study_notes() -> None:
    intro = (ROOT / "book" / "intro.md").read_text(encoding="utf-8")
    assert re.search(r"^## The study notes", intro, re.M), (
        "the intro has no section that says what the study notes are"
    )


@pytest.mark.parametrize("name", [n for n, _ in book_chapters()])
def test_a_long_import_cell_is_folded_on_the_web(name: str) -> None:
    """The opening is prose: an import cell of 20 lines or more is tagged `hide-input`,
    as figure cells are (the web shows a "Show code" button; Jupyter runs it as is)."""
    cells = json.loads((ROOT / "book" / f"{name}.ipynb").read_text(encoding="utf-8"))[
        "cells"
    ]
    first = next(c for c in cells if c["cell_type"] == "code")
    lines = "".join(first["source"]).splitlines()
    tags = first.get("metadata", {}).get("tags", [])
    assert len(lines) < 20 or "hide-input" in tags, (
        f"{name}: the import cell has {len(lines)} lines and is not tagged hide-input"
    )
