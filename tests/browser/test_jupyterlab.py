"""The chapters as a learner sees them in JupyterLab, with the project's environment.

Starts ``jupyter lab`` from the running interpreter's environment (``.venv``) on a free
127.0.0.1 port with a random token, on a temporary copy of ``book/`` (nothing in the
repository is opened for writing), with its own config, data, runtime, workspace and
settings folders (notebook windowing off, so every cell is in the page). Each chapter is
opened in headless Chromium and its rendered Markdown cells are read, MathJax/KaTeX's
hidden TeX source and the code editors left out:

* no raw MyST is visible: ``:label:``, ``{ref}``, ``{cite``, ``\\begin{``,
  ``{exercise}``, ``{prf:``...; the book's MyST renders through ``jupyterlab-myst``;
* every exercise's title is shown;
* a solution is folded (its cells collapsed) until its placeholder is clicked;
* a cross-reference or a citation reads as text ("Su et al. [2024]"), never as its bare
  label or bib key (``scripts/jupyterlab_citations.py`` writes the citations' text);
* a checker speaks in one or two lines: a wrong attempt, a pass and a stub for
  ``check_softmax`` (chapter 00's exercise), each run in a scratch notebook next to the
  chapters, print one or two lines, with no traceback frames and no ``Out[n]:``.

Text hidden in a cell's rendered Markdown (``display: none``: the source of a citation
that ``scripts/jupyterlab_citations.py`` hides there) is not what a learner reads and is
left out. Screenshots go to ``_build/jupyterlab/``: ``02_rope-top.png``,
``02_rope-solution-folded.png``, ``02_rope-solution-open.png`` and
``checker-wrong.png``, ``checker-pass.png``, ``checker-stub.png``.
``JUPYTERLAB_WITHOUT_MYST=1`` runs the same checks with the ``jupyterlab-myst``
extension disabled, to show what they catch. Run with
``pytest tests/browser/test_jupyterlab.py --browser`` (``make browser``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BOOK = ROOT / "book"
CHAPTERS = sorted(p.name for p in BOOK.glob("[0-9][0-9]_*.ipynb"))
SHOTS = ROOT / "_build" / "jupyterlab"
JUPYTER = Path(sys.executable).with_name("jupyter")
RAW = (
    ":label:",
    "{ref}",
    "{cite",
    "{numref}",
    "{eq}",
    "{prf:",
    "{exercise}",
    "{solution",
    "{admonition}",
    "{literalinclude}",
    "\\begin{",
)
# a cross-reference left as its bare target name ("ch-rope", "ex-rope-frequencies")
LABEL = re.compile(
    r"(?<![\w/.-])(?:ch|ex|thm|fig|eq|sec|tab)-[a-z0-9]+(?:-[a-z0-9]+)*\b"
)
# a citation left as its bib key ("su2021roformer"): what jupyterlab-myst shows for a
# {cite} role, having no bibliography
BIB_KEYS = sorted(
    re.findall(r"^@\w+\{([^,\s]+),", (BOOK / "references.bib").read_text(), re.M)
)

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run"]

pytestmark = pytest.mark.browser


def _chromium() -> str | None:
    for path in (
        os.environ.get("CHROMIUM"),
        "/usr/bin/chromium",
        shutil.which("chromium"),
    ):
        if path and Path(path).is_file():
            return path
    return None


def _skip_or_fail(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (under CI this is a failure, not a skip)")
    pytest.skip(reason)


# The text a learner reads in each Markdown cell: TeX sources kept for screen readers,
# scripts, toolbars, the (hidden) editor and what the rendered Markdown hides
# (display: none below the rendered cell's root) left out.
CELL_TEXT = """() => [...document.querySelectorAll('.jp-MarkdownCell')].map(cell => {
  const skip = 'annotation, .katex-mathml, mjx-assistive-mml, script, style, '
    + '.jp-InputArea-editor, .jp-cell-toolbar, .jp-InputPlaceholder';
  const hidden = el => {
    const root = el.closest('.jp-RenderedMarkdown, .myst');
    for (let e = el; root && e && e !== root; e = e.parentElement)
      if (getComputedStyle(e).display === 'none') return true;
    return false;
  };
  const walk = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT, {
    acceptNode: n => n.parentElement.closest(skip) || hidden(n.parentElement)
      ? NodeFilter.FILTER_REJECT : NodeFilter.FILTER_ACCEPT});
  let text = '';
  while (walk.nextNode()) text += walk.currentNode.nodeValue;
  const placeholder = cell.querySelector('.jp-InputPlaceholder');
  return {text, folded: placeholder ? placeholder.textContent : null};
})"""


# Chapter 00's exercise as a learner runs it: the stub as the chapter ships it, a wrong
# attempt (normalized along the other axis) and the chapter's solution, each alone in a
# cell, run one by one in a scratch notebook written next to the chapters.
CHECKER_NOTEBOOK = "checker_output.ipynb"
SETUP = "import torch\n\nfrom companion import checks"
ATTEMPTS = {
    "stub": """\
def softmax(x: torch.Tensor, dim: int) -> torch.Tensor:
    raise NotImplementedError


checks.check_softmax(softmax)""",
    "wrong": """\
def softmax(x: torch.Tensor, dim: int) -> torch.Tensor:
    shifted = x - x.amax(dim=0, keepdim=True)
    e = torch.exp(shifted)
    return e / e.sum(dim=0, keepdim=True)


checks.check_softmax(softmax)""",
    "pass": """\
def softmax(x: torch.Tensor, dim: int) -> torch.Tensor:
    shifted = x - x.amax(dim=dim, keepdim=True)
    e = torch.exp(shifted)
    return e / e.sum(dim=dim, keepdim=True)


checks.check_softmax(softmax)""",
}
RUN_BUTTON = (
    ".jp-NotebookPanel-toolbar [data-command='notebook:run-cell-and-select-next']"
)
FIRST_LINE = {
    "stub": "check_softmax: not attempted yet",
    "wrong": "✗ check_softmax: ",
    "pass": "✓ check_softmax: all 3 cases pass",
}
# what a traceback shows: its banner, a frame, an IPython frame header
FRAMES = re.compile(r"Traceback|File \"|^\s*\d+ \w|-{10,}|\.py:\d+|^Cell In\[", re.M)


def _checker_notebook() -> str:
    cells = [SETUP, *ATTEMPTS.values()]
    nb = {
        "cells": [
            {
                "cell_type": "code",
                "execution_count": None,
                "id": f"cell-{i}",
                "metadata": {},
                "outputs": [],
                "source": source,
            }
            for i, source in enumerate(cells)
        ],
        "metadata": {
            "kernelspec": {
                "display_name": "Python 3",
                "language": "python",
                "name": "python3",
            }
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    return json.dumps(nb, indent=1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _exercise_titles(chapter: str) -> list[str]:
    nb = json.loads((BOOK / chapter).read_text())
    titles = []
    for cell in nb["cells"]:
        source = "".join(cell["source"])
        for m in re.finditer(r"```\{exercise\}[ \t]*(.*)", source):
            titles.append(m.group(1).strip())
    return titles


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if not JUPYTER.is_file():
        _skip_or_fail(f"no jupyter next to {sys.executable}")
    home = tmp_path_factory.mktemp("jupyterlab")
    shutil.copytree(BOOK, home / "book")
    (home / "book" / CHECKER_NOTEBOOK).write_text(_checker_notebook())
    settings = home / "settings" / "@jupyterlab" / "notebook-extension"
    settings.mkdir(parents=True)
    (settings / "tracker.jupyterlab-settings").write_text('{"windowingMode": "none"}')
    # no "Would you like to get notified about official Jupyter news?" over the page
    news = home / "settings" / "@jupyterlab" / "apputils-extension"
    news.mkdir(parents=True)
    (news / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    config = home / "config"
    if os.environ.get("JUPYTERLAB_WITHOUT_MYST"):
        (config / "labconfig").mkdir(parents=True)
        (config / "labconfig" / "page_config.json").write_text(
            json.dumps({"disabledExtensions": {"jupyterlab-myst": True}})
        )
    port, token = _free_port(), secrets.token_hex(16)
    env = dict(
        os.environ,
        JUPYTER_CONFIG_DIR=str(config),
        JUPYTER_DATA_DIR=str(home / "data"),
        JUPYTER_RUNTIME_DIR=str(home / "runtime"),
    )
    log = (home / "jupyterlab.log").open("w")
    server = subprocess.Popen(
        [
            str(JUPYTER),
            "lab",
            "--no-browser",
            "--allow-root",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={home / 'book'}",
            f"--LabApp.workspaces_dir={home / 'workspaces'}",
            f"--LabApp.user_settings_dir={home / 'settings'}",
            "--LabApp.extension_manager=readonly",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if server.poll() is not None:
                    pytest.fail(f"jupyter lab exited: {(home / 'jupyterlab.log')}")
                time.sleep(0.5)
        else:
            pytest.fail("jupyter lab did not answer within 2 minutes")
        yield f"{base}/lab/tree/{{}}?token={token}&reset"
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


@pytest.fixture(scope="module")
def page(lab: str) -> Iterator[object]:
    executable = _chromium()
    if executable is None:
        _skip_or_fail("no Chromium found (install Debian's `chromium` package)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        pg = context.new_page()
        pg.set_default_timeout(120_000)
        yield pg
        browser.close()


def _open(page: object, lab: str, chapter: str) -> list[dict]:
    """Open ``chapter`` and wait until every one of its Markdown cells is in the page and
    their text has not changed for two seconds. (JupyterLab renders cells when the browser
    is idle: on a busy machine it can pause for a second mid-way, which a one-second wait
    took for the end, and a chapter's exercise titles were read before they were drawn.)"""
    nb = json.loads((BOOK / chapter).read_text(encoding="utf-8"))
    expected = sum(cell["cell_type"] == "markdown" for cell in nb["cells"])
    page.goto(lab.format(chapter))
    page.wait_for_selector(".jp-Notebook .jp-MarkdownCell")
    cells, last, steady = [], None, 0
    for _ in range(90):
        cells = page.evaluate(CELL_TEXT)
        complete = len(cells) == expected and any(c["text"].strip() for c in cells)
        steady = steady + 1 if complete and cells == last else 0
        if steady >= 2:
            break
        last = cells
        page.wait_for_timeout(1000)
    return cells


_SEEN: dict[str, list[dict]] = {}


def _cells(page: object, lab: str, chapter: str) -> list[dict]:
    """The chapter's rendered Markdown cells, each chapter opened once per session."""
    if chapter not in _SEEN:
        _SEEN[chapter] = _open(page, lab, chapter)
        if chapter.startswith("02_"):
            SHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SHOTS / "02_rope-top.png"))
    return _SEEN[chapter]


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_reads_as_the_book_in_jupyterlab(page, lab, chapter) -> None:
    cells = _cells(page, lab, chapter)
    shown = "\n".join(c["text"] for c in cells)
    raw = [
        f"{pattern!r} in: ...{shown[max(0, i - 50) : i + 60]!r}..."
        for pattern in RAW
        if (i := shown.find(pattern)) >= 0
    ]
    assert not raw, f"{chapter}: raw MyST visible in JupyterLab:\n" + "\n".join(raw)
    # jupyterlab-myst prints typographic quotes (T5’s), the source has straight ones
    plain = shown.translate(str.maketrans({"\u2018": "'", "\u2019": "'"}))
    missing = [t for t in _exercise_titles(chapter) if t not in plain]
    assert not missing, f"{chapter}: exercise titles not shown: {missing}"
    folded = [c for c in cells if c["folded"] is not None]
    assert len(folded) >= len(_exercise_titles(chapter)), (
        f"{chapter}: {len(folded)} folded Markdown cells for "
        f"{len(_exercise_titles(chapter))} exercises: solutions are not folded"
    )


def test_cross_references_read_as_text(page, lab) -> None:
    bare = []
    for chapter in CHAPTERS:
        shown = "\n".join(c["text"] for c in _cells(page, lab, chapter))
        bare += [f"{chapter}: {m.group()}" for m in LABEL.finditer(shown)]
    assert not bare, f"{len(bare)} bare labels: {bare[:10]}"


def test_citations_read_as_text(page, lab) -> None:
    """A citation shows the book's text for it ("Su et al. [2024]"), not its bib key."""
    bare = []
    for chapter in CHAPTERS:
        shown = "\n".join(c["text"] for c in _cells(page, lab, chapter))
        for key in BIB_KEYS:
            for m in re.finditer(rf"(?<![\w-]){re.escape(key)}(?![\w-])", shown):
                context = shown[max(0, m.start() - 40) : m.end() + 20]
                bare.append(f"{chapter}: {key} in ...{context!r}...")
    assert not bare, (
        f"{len(bare)} citations shown as their bib key in JupyterLab (run "
        f"scripts/jupyterlab_citations.py): " + "\n".join(bare[:10])
    )
    missing = []
    for chapter in CHAPTERS:
        shown = "\n".join(c["text"] for c in _cells(page, lab, chapter))
        source = (BOOK / chapter).read_text()
        texts = re.findall(r'<span class=\\"d-none\\">([^<]*)</span>', source)
        missing += [f"{chapter}: {t}" for t in texts if t not in shown]
    assert not missing, f"citation texts not shown: {missing[:10]}"


def test_citations_carry_the_web_books_text() -> None:
    """Every citation in the chapters has its text, as the web book writes it now."""
    spec = importlib.util.spec_from_file_location(
        "jupyterlab_citations", ROOT / "scripts" / "jupyterlab_citations.py"
    )
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    citations = script.Citations()
    stale = {
        chapter: n
        for chapter in CHAPTERS
        if (n := script.process(BOOK / chapter, citations, check=True))
    }
    assert not stale, (
        f"citations without their text or with a stale one: {stale} (run "
        "python scripts/jupyterlab_citations.py)"
    )


def test_a_solution_opens_on_click(page, lab) -> None:
    chapter = next(c for c in CHAPTERS if c.startswith("02_"))
    _open(page, lab, chapter)
    placeholder = page.locator(".jp-MarkdownCell .jp-InputPlaceholder").first
    placeholder.scroll_into_view_if_needed()
    page.wait_for_timeout(500)
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "02_rope-solution-folded.png"))
    before = page.locator(".jp-InputPlaceholder").count()
    placeholder.click()
    page.wait_for_timeout(1000)
    page.screenshot(path=str(SHOTS / "02_rope-solution-open.png"))
    assert page.locator(".jp-InputPlaceholder").count() < before


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_folded_solutions_read_well(page, lab, chapter) -> None:
    """JupyterLab shows a collapsed cell's first source line as its placeholder: the
    solution cells start with a MyST comment ('% Solution (click to open)'), never with
    '```{solution-start} ex-...'."""
    cells = _cells(page, lab, chapter)
    folded = [c["folded"] for c in cells if c["folded"] is not None]
    assert len(folded) >= len(_exercise_titles(chapter))
    raw = [f for f in folded if "```{" in f or ":label:" in f]
    assert not raw, f"{chapter}: placeholders showing raw MyST: {raw[:3]}"


@pytest.fixture(scope="module")
def checker_outputs(page, lab) -> dict[str, dict]:
    """Run each attempt's cell in JupyterLab; what its output area shows."""
    page.goto(lab.format(CHECKER_NOTEBOOK))
    page.wait_for_selector(".jp-Notebook .jp-CodeCell")
    cells = page.locator(".jp-Notebook .jp-CodeCell")
    SHOTS.mkdir(parents=True, exist_ok=True)
    shown = {}
    for i, name in enumerate(["setup", *ATTEMPTS]):
        cell = cells.nth(i)
        prompt = cell.locator(".jp-InputPrompt")
        # select the cell, then the toolbar's run button; again if it did not start
        for _ in range(3):
            prompt.click()
            page.locator(RUN_BUTTON).click()
            page.wait_for_timeout(3000)
            if prompt.inner_text().strip() != "[ ]:":
                break
        # done when the prompt shows the cell's execution count, "[n]:", not "[*]:";
        # the first cell starts the kernel and imports torch (minutes on a busy CPU)
        for _ in range(600):
            if re.fullmatch(r"\[\d+\]:", prompt.inner_text().strip()):
                break
            page.wait_for_timeout(500)
        else:
            page.screenshot(path=str(SHOTS / "checker-timeout.png"))
            pytest.fail(
                f"the {name} cell did not finish within 5 minutes (prompt "
                f"{prompt.inner_text()!r}; _build/jupyterlab/checker-timeout.png)"
            )
        page.wait_for_timeout(300)
        if name == "setup":
            continue
        cell.scroll_into_view_if_needed()
        cell.screenshot(path=str(SHOTS / f"checker-{name}.png"))
        shown[name] = {
            "text": "\n".join(
                o.inner_text() for o in cell.locator(".jp-OutputArea-output").all()
            ),
            "prompts": [
                p.inner_text().strip()
                for p in cell.locator(".jp-OutputArea-prompt").all()
            ],
            "results": cell.locator(".jp-OutputArea-executeResult").count(),
            "height": cell.bounding_box()["height"],
        }
    return shown


@pytest.mark.parametrize("attempt", list(ATTEMPTS))
def test_a_checker_speaks_in_one_or_two_lines(checker_outputs, attempt) -> None:
    out = checker_outputs[attempt]
    lines = out["text"].strip("\n").splitlines()
    assert 1 <= len(lines) <= 2, f"{attempt}: {len(lines)} lines:\n{out['text']}"
    assert lines[0].startswith(FIRST_LINE[attempt]), f"{attempt}: {lines[0]!r}"
    assert not FRAMES.search(out["text"]), f"{attempt}: traceback shown:\n{out['text']}"
    assert out["results"] == 0 and not any(out["prompts"]), (
        f"{attempt}: an Out[n]: under the call: prompts {out['prompts']}"
    )
    # the cell and its message fit on one 1280x900 screen: nothing below the fold
    assert out["height"] < 900, f"{attempt}: the cell is {out['height']:.0f} px tall"
