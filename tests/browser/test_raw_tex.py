"""No built page shows raw TeX outside its math and code.

A formula that MyST does not recognise as math reaches the reader as source: ``$\\langle
f_q(x_m, m) ...``, or, when a line inside ``$...$`` starts with ``- ``, as a bullet point
holding half a formula. MathJax typesets only what the build marked as math (the
``.math`` spans and blocks), so the check can read the built HTML statically: every text
node outside math, code blocks, scripts and styles must be free of TeX commands and of
``$``-delimited TeX. It runs with the browser tests (``pytest tests/browser --browser``)
because it needs the built book (``_build/html``, or ``BOOK_HTML``), not because it needs
Chromium.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HTML = Path(os.environ.get("BOOK_HTML", ROOT / "_build" / "html")).resolve()

pytestmark = pytest.mark.browser

# where TeX is expected: MathJax's input and output, code, and non-text elements
SKIP_TAGS = (
    "pre",
    "code",
    "script",
    "style",
    "mjx-container",
    "svg",
    "textarea",
    "kbd",
)
SKIP_CLASSES = ("math", "highlight", "MathJax", "MathJax_Display")
TEX_COMMANDS = (
    "langle rangle frac dfrac tfrac begin end sum prod int sqrt cdot cdots ldots dots "
    "mathrm mathbb mathbf mathcal operatorname text left right bigl bigr Bigl Bigr "
    "le leq ge geq neq approx times infty partial nabla top overline hat tilde bar "
    "quad qquad lVert rVert lfloor rfloor lceil rceil mid in to "
    "alpha beta gamma delta epsilon varepsilon eta theta kappa lambda mu pi phi psi "
    "rho sigma tau omega xi zeta ell Delta Theta Sigma Omega"
).split()
TEX = re.compile(r"\\(?:" + "|".join(TEX_COMMANDS) + r")(?![A-Za-z])")
# a `$` that opens or closes TeX: followed by a letter, `\`, `{` or `$`, or closing one
DOLLAR = re.compile(r"\$(?=[A-Za-z\\{$(])|(?<=[A-Za-z}\)])\$")
DELIMITERS = re.compile(r"\\[()\[\]]")


def _pages() -> list[Path]:
    if not HTML.is_dir():
        return []
    return sorted(
        p
        for p in HTML.rglob("*.html")
        if not any(part.startswith("_") for part in p.relative_to(HTML).parts)
    )


PAGES = _pages()


def raw_tex(html: str) -> list[str]:
    """Text outside math and code that looks like TeX, each with its context."""
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(html, "html.parser")
    for tag in soup.find_all(SKIP_TAGS):
        tag.decompose()
    # whole class names only: every chapter sits in a section of class "mathjax_ignore"
    for tag in soup.find_all(
        class_=lambda c: c in SKIP_CLASSES or (c or "").startswith("highlight-")
    ):
        tag.decompose()
    found = []
    body = soup.body or soup
    for text in body.find_all(string=True):
        if text.parent is not None and text.parent.name in ("title", "[document]"):
            continue
        string = str(text)
        for pattern in (TEX, DOLLAR, DELIMITERS):
            for match in pattern.finditer(string):
                start, stop = max(0, match.start() - 40), match.end() + 40
                found.append(" ".join(string[start:stop].split()))
    return found


def test_checker_catches_raw_tex_and_spares_math_and_code() -> None:
    broken = (
        '<body><p>Now the score: "$\\langle f_q(x_m,m), f_k\\rangle = (k_n^{(1)}</p>'
        "<ul><li><p>k_n^{(2)}\\sin(n\\theta))</p></li></ul>"
        "<p>and $x$ inline, \\(a\\) unmarked</p></body>"
    )
    found = raw_tex(broken)
    assert any("\\langle" in f for f in found), found
    assert any("\\theta" in f for f in found), found
    assert any("$x$" in f for f in found), found
    assert any("\\(a\\)" in f for f in found), found
    clean = (
        '<body><p>A <span class="math notranslate nohighlight">\\(\\langle q, k '
        '\\rangle\\)</span> score costs $5.</p><div class="math">\\[\\frac{1}{2}'
        '\\]</div><pre>$ echo $HOME \\theta</pre><div class="highlight">\\sum</div>'
        "<p><code>\\frac</code> and <mjx-container>\\sum</mjx-container></p></body>"
    )
    assert raw_tex(clean) == []


@pytest.mark.parametrize(
    "page_path", PAGES, ids=[str(p.relative_to(HTML)) for p in PAGES]
)
def test_page_shows_no_raw_tex(page_path: Path) -> None:
    found = raw_tex(page_path.read_text(encoding="utf-8"))
    assert not found, (
        f"{page_path.relative_to(HTML)} shows TeX outside math (a formula the build did "
        f"not recognise; a line inside $...$ that starts with '- ' or '+ ' becomes a "
        f"list item): {found[:5]}"
    )


def test_there_is_a_built_book() -> None:
    if not PAGES:
        message = f"no built book at {HTML}: run `jupyter-book build .` first"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
