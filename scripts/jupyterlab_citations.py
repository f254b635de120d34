"""Citations that read as the book's text in JupyterLab ("Su et al. [2024]"), not keys.

``jupyterlab-myst`` (2.7.0) renders MyST in JupyterLab but reads no bibliography: every
``{cite:t}`` / ``{cite:p}`` role shows its bare key (``su2021roformer``) as a "Citation
Not Found" warning. This script writes, in front of each citation in the chapters'
Markdown cells, the text the web book shows for it, computed by sphinxcontrib-bibtex's
own author-year style from ``book/references.bib``, and hides each of the two where it
does not belong::

    <span class="d-none">Su et al. [2024]</span>
    <span class="hidden">{cite:t}`su2021roformer`</span>

(written on one line, with no break between the two spans).

* ``d-none`` (Bootstrap, in the book's theme) hides the text on the web and in the PDF
  (printed from the HTML), which show the citation exactly as before;
* ``hidden`` (a class of jupyterlab-myst's own stylesheet, which renders the MyST; no
  stylesheet of the book's theme defines it) hides the role in JupyterLab, which shows
  the text.

The same device gives the companion's API roles a short name in JupyterLab. The web
book's ``{func}`~companion.modern.receptive_field``` shows ``receptive_field()`` (the
``~`` keeps the last name), which jupyterlab-myst (it knows no Python domain) shows as
the literal ``~companion.modern.receptive_field``; and the explicit-title form
``{func}`receptive_field() <companion.modern.receptive_field>``` shows, literally, all of
it. So each such role gets the web's short name in front of it, as code::

    <span class="d-none">`receptive_field()`</span>
    <span class="hidden">{func}`~companion.modern.receptive_field`</span>

(again on one line): ``name()`` for ``{func}``/``{meth}``, as Sphinx writes them, and
``name`` for ``{class}``, ``{data}``, ``{attr}``, ``{mod}``.

Authors write plain ``{cite:t}`key``` and ``{func}`~companion...``` and run this script (load-modify-save of each
notebook, only the Markdown cells that change); it is idempotent: a wrapped citation
has its text recomputed (after a change to the .bib file), nothing else moves.
``--check`` changes nothing and exits 1 when a citation is unwrapped or its text is
stale.

Usage: python scripts/jupyterlab_citations.py [--check] [NOTEBOOK ...]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
BIB = BOOK / "references.bib"

ROLE = r"\{cite:(?P<kind>[a-z]+)\}`(?P<keys>[^`]+)`"
WRAPPED = re.compile(
    r'<span class="d-none">(?P<text>[^<]*)</span>'
    r'<span class="hidden">' + ROLE + "</span>"
)
CITATION = re.compile(WRAPPED.pattern + "|" + ROLE.replace("?P<", "?P<bare_"))
# a role of the companion's API with Sphinx's "~" (last name only)
API_ROLE = (
    r"\{(?P<role>func|meth|class|data|attr|mod)\}`~(?P<target>companion\.[\w.]+)`"
)
API = re.compile(
    r'<span class="d-none">`[^`<]*`</span><span class="hidden">'
    + API_ROLE
    + "</span>|"
    + API_ROLE.replace("?P<", "?P<bare_")
)


def short_name(role: str, target: str) -> str:
    """What Sphinx shows for ``{role}`~target```: the last name, with ``()`` for a
    function or a method (``add_function_parentheses``, on by default)."""
    name = target.rsplit(".", 1)[-1]
    return f"{name}()" if role in ("func", "meth") else name


def wrap_api(match: re.Match[str]) -> str:
    role = match.group("role") or match.group("bare_role")
    target = match.group("target") or match.group("bare_target")
    return (
        f'<span class="d-none">`{short_name(role, target)}`</span>'
        f'<span class="hidden">{{{role}}}`~{target}`</span>'
    )


class _Builder:
    """Enough of a Sphinx builder for sphinxcontrib-bibtex to render a reference."""

    name = "html"

    def get_relative_uri(self, fromdocname: str, todocname: str) -> str:
        return f"{todocname}.html"


class Citations:
    """The text sphinxcontrib-bibtex's ``author_year`` style gives a citation, keys in
    the order of the book's bibliography (pybtex's ``author_year_title`` sorting, as
    ``book/_ext/book_html.py``'s ``authoryear`` style uses)."""

    def __init__(self, bib: Path = BIB) -> None:
        import pybtex.plugin
        from pybtex.database import parse_file
        from sphinxcontrib.bibtex.style.referencing.author_year import (
            AuthorYearReferenceStyle,
        )

        self.entries = parse_file(str(bib)).entries
        self.style = AuthorYearReferenceStyle()
        self.backend = pybtex.plugin.find_plugin("pybtex.backends", "docutils")()
        sorting = pybtex.plugin.find_plugin("pybtex.style.sorting", "author_year_title")
        order = sorting().sort(list(self.entries.values()))
        self.rank = {entry.key: i for i, entry in enumerate(order)}

    def text(self, kind: str, keys: str) -> str:
        from sphinxcontrib.bibtex.style.referencing import format_references
        from sphinxcontrib.bibtex.style.template import SphinxReferenceInfo

        names = [k.strip() for k in keys.split(",")]
        missing = [k for k in names if k not in self.entries]
        if missing:
            raise KeyError(f"not in {BIB.name}: {', '.join(missing)}")
        info = SphinxReferenceInfo(
            _Builder(), "chapter", "bibliography", "", None, "", ""
        )
        refs = [
            (self.entries[k], None, info)
            for k in sorted(names, key=self.rank.__getitem__)
        ]
        nodes = format_references(self.style, kind, refs).render(self.backend)
        return "".join(node.astext() for node in nodes)

    def wrap(self, match: re.Match[str]) -> str:
        kind = match.group("kind") or match.group("bare_kind")
        keys = match.group("keys") or match.group("bare_keys")
        text = self.text(kind, keys)
        return (
            f'<span class="d-none">{text}</span>'
            f'<span class="hidden">{{cite:{kind}}}`{keys}`</span>'
        )


def _source(cell: dict[str, Any]) -> str:
    src = cell["source"]
    return src if isinstance(src, str) else "".join(src)


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def process(path: Path, citations: Citations, *, check: bool) -> int:
    """Wrap or refresh each citation and each ``~companion`` role in ``path``'s
    Markdown cells; how many changed."""
    raw = path.read_text(encoding="utf-8")
    nb = json.loads(raw)
    changed = 0
    for cell in nb["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        old = _source(cell)
        new = API.sub(wrap_api, CITATION.sub(citations.wrap, old))
        if new != old:
            changed += sum(
                a != b
                for pattern in (CITATION, API)
                for a, b in zip(pattern.findall(old), pattern.findall(new), strict=True)
            )
            if not check:
                src = cell["source"]
                cell["source"] = new if isinstance(src, str) else _lines(new)
    if changed and not check:
        # as nbformat (JupyterLab, nbstripout) writes it, so that saving changes nothing
        text = json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
        path.write_text(text, encoding="utf-8")
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing")
    parser.add_argument("notebooks", nargs="*", type=Path)
    args = parser.parse_args(argv)
    notebooks = args.notebooks or sorted(BOOK.glob("[0-9][0-9]_*.ipynb"))
    citations = Citations()
    total = 0
    for path in notebooks:
        n = process(path, citations, check=args.check)
        total += n
        if n:
            verb = "to wrap or refresh" if args.check else "wrapped or refreshed"
            print(f"{path.name}: {n} citation(s) or API role(s) {verb}")
    if args.check and total:
        print("run: python scripts/jupyterlab_citations.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
