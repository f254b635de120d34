"""Local Sphinx extension: the book's pages read well on every screen, in search and on paper.

- Drops sphinx-thebe's scripts. Jupyter Book 1.x always loads sphinx-thebe, which injects its
  configuration script twice (a console error, "Identifier 'THEBE_JS_URL' has already been
  declared") and points at a CDN; the book has no live-code button (it reads offline).
- Adds ``static/book.css`` (nothing wider than a phone's screen, figure captions, print
  styles) and ``static/book.js`` (search excerpts and titles without raw TeX or the header's
  buttons; everything folded opens when printing).
- Registers the pybtex style ``authoryear``: the bibliography is labelled "Vaswani et al.,
  2017", like the author-year citations in the text, and sorted by author and year; arXiv
  identifiers (``eprint``) and DOIs are links (pybtex's plain style).
- Lets the single-page build (``--builder singlehtml``, printed to the PDF by
  ``scripts/build_pdf.py``) render every node the HTML build renders.
- Gives the proof index readable entries: "Theorem: Shift theorem" under the chapter's title,
  instead of raw labels (``thm-sinusoidal-shift (book/01_sinusoidal_encoding)``).
- Findable pages: a meta description (the page's first paragraph) and Open Graph tags on every
  page, one viewport tag, and a title without the book's name twice on the front page.
- The link to the whole-book PDF (``<a class="book-pdf-link">`` in the intro) is shown only
  when ``_build/pdf/book.pdf`` exists, and the PDF is then copied next to the site;
  ``scripts/build_pdf.py`` restores the link when it writes the PDF after the HTML build.
- The appendix is numbered as an appendix: "A. Performance and precision", sections "A.1",
  "Fig. A.1" (the chapters of ``_toc.yml``'s parts whose caption starts with "Appendix").
- Chapters as JupyterLab and the web both number them: the YAML block that opens a chapter's
  first cell for jupyterlab-myst (its numbering) is dropped before parsing, and every
  solution folds on the web without the ``:class: dropdown`` that Lab draws as a dead chevron.
- Lighter pages: the theme's Font Awesome bundle (1.5 MB, every icon) is cut down to the icons
  the built pages and the theme's scripts name.
"""

from __future__ import annotations

import html
import json
import re
import shutil
from collections import defaultdict
from pathlib import Path
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx

STATIC = Path(__file__).parent / "static"
ROOT = Path(__file__).resolve().parents[2]
BOOK_PDF = ROOT / "_build" / "pdf" / "book.pdf"
PDF_LINK = re.compile(r'<a class="book-pdf-link" href="([^"]*)">(.*?)</a>', re.S)
PDF_MISSING = (
    r'<span class="book-pdf-link book-pdf-missing" data-href="\1">\2 '
    r"(not built here: <code>make pdf</code> writes it)</span>"
)


# ---- sphinx-thebe ------------------------------------------------------------------------


def _is_thebe(script: Any) -> bool:
    filename = getattr(script, "filename", None) or str(script)
    body = getattr(script, "attributes", {}).get("body", "")
    return "thebe" in filename or "THEBE_JS_URL" in body


def _drop_thebe(
    app: Sphinx, pagename: str, templatename: str, context: dict, doctree: object
) -> None:
    scripts = context.get("script_files")
    if scripts:
        context["script_files"] = [s for s in scripts if not _is_thebe(s)]
    styles = context.get("css_files")
    if styles:
        context["css_files"] = [s for s in styles if "thebe" not in str(s)]


# ---- JupyterLab's numbering and solution markers (issue 37, s6-ux D3, D5) ------------------

# A chapter's first cell opens with a YAML block that only JupyterLab reads: jupyterlab-myst
# takes its ``numbering`` (``enumerator: "9.%s"``: "Exercise 9.1" as on the web; equations
# unnumbered, as on the web). MyST-NB reads no front matter in a cell and would show it as a
# rule and a heading, so it is dropped from the source here, before parsing.
LAB_FRONT_MATTER = re.compile(r"\A---\n(?:.*\n)*?---\n")


def _drop_lab_front_matter(app: Sphinx, docname: str, source: list[str]) -> None:
    if not str(app.env.doc2path(docname)).endswith(".ipynb"):
        return
    notebook = json.loads(source[0])
    first = notebook["cells"][0]
    text = "".join(first["source"])
    match = LAB_FRONT_MATTER.match(text)
    if first["cell_type"] == "markdown" and match:
        first["source"] = text[match.end() :]
        source[0] = json.dumps(notebook, ensure_ascii=False)


# Every solution folds on the web (a dropdown). The chapters' ``solution-start`` markers carry
# no ``:class: dropdown``: jupyterlab-myst draws that class as a chevron on the marker, a
# control that does not open the solution there (it is in the folded cells below the
# marker), so the class is added here.
def _fold_solutions(app: Sphinx, doctree: Any) -> None:
    from sphinx_exercise.nodes import solution_node

    for node in doctree.findall(solution_node):
        if "dropdown" not in node["classes"]:
            node["classes"].append("dropdown")


# ---- findable pages: description, Open Graph, one viewport, one title ---------------------


def _first_paragraph(doctree: Any) -> str:
    if doctree is None:
        return ""
    for para in doctree.findall(nodes.paragraph):
        text = " ".join(para.astext().split())
        if len(text) >= 60:
            return text[:157].rsplit(" ", 1)[0] + "..." if len(text) > 160 else text
    return ""


def _page_metadata(
    app: Sphinx, pagename: str, templatename: str, context: dict, doctree: object
) -> None:
    title = re.sub(r"<[^>]+>", "", context.get("title") or "").strip()
    book = app.config.html_title or app.config.project or ""
    description = _first_paragraph(doctree) or (
        f"{title}: a chapter of {book}" if title else book
    )
    tags = {
        "description": ("name", description),
        "og:title": ("property", title or book),
        "og:description": ("property", description),
        "og:type": (
            "property",
            "book" if pagename == app.config.root_doc else "article",
        ),
        "og:site_name": ("property", book),
    }
    meta = "".join(
        f'<meta {kind}="{name}" content="{html.escape(value, quote=True)}" />\n'
        for name, (kind, value) in tags.items()
    )
    context["metatags"] = context.get("metatags", "") + meta
    # the PDF link, only where the PDF exists (on the site: the single page that becomes
    # the PDF keeps the plain link, which scripts/build_pdf.py prints as text)
    body = context.get("body")
    if (
        app.builder.name == "html"
        and body
        and "book-pdf-link" in body
        and not BOOK_PDF.is_file()
    ):
        context["body"] = PDF_LINK.sub(PDF_MISSING, body)


_VIEWPORT = re.compile(r'\s*<meta name="viewport"[^>]*>')
_TWICE = re.compile(r"<title>\s*([^<]+?)\s*&#8212;\s*\1\s*</title>")


def _one_viewport(outdir: Path) -> None:
    """The theme, its parent and Sphinx's basic layout each write a viewport tag: keep the
    first."""
    for page in outdir.rglob("*.html"):
        text = original = page.read_text(encoding="utf-8")
        tags = _VIEWPORT.findall(text)
        if len(tags) > 1:
            first = text.index(tags[0]) + len(tags[0])
            text = text[:first] + _VIEWPORT.sub("", text[first:])
        # the front page's title is the book's: not "Book — Book"
        text = _TWICE.sub(r"<title>\1</title>", text, count=1)
        if text != original:
            page.write_text(text, encoding="utf-8")


# ---- lighter pages: only the icons the book shows ----------------------------------------

_ICON = re.compile(
    r'(?:"([^"]+)"|([A-Za-z_$][\w$]*)|(\d+)):\[\d+,\d+,\[([^\]]*)\],"[^"]*",'
    r'(?:"[^"]*"|\[[^\]]*\])\]'
)
_STYLE_CLASSES = {
    "fa-solid",
    "fa-regular",
    "fa-brands",
    "fa-lg",
    "fa-fw",
    "fa-xs",
    "fa-sm",
}


def _trim_fontawesome(outdir: Path) -> None:
    """Keep, in each icon pack of the theme's Font Awesome bundle, the icons whose name (or
    alias) a built page or a script names; the library itself is untouched."""
    bundle = outdir / "_static" / "scripts" / "fontawesome.js"
    if not bundle.is_file():
        return
    used = set()
    sources = list(outdir.rglob("*.html")) + list((outdir / "_static").rglob("*.js"))
    for path in sources:
        if path != bundle and "fontawesome" not in path.name:
            text = path.read_text(encoding="utf-8", errors="ignore")
            used |= {m[3:] for m in re.findall(r"\bfa-[a-z0-9-]+", text)}
    used -= {c[3:] for c in _STYLE_CLASSES}
    code = bundle.read_text(encoding="utf-8")
    out, at = [], 0
    for start in [m.end() for m in re.finditer(r"var p=\{", code)]:
        kept, pos = [], start
        while code[pos] != "}":
            m = _ICON.match(code, pos)
            if m is None:
                return  # an unknown layout: leave the bundle whole
            names = {m.group(1) or m.group(2) or m.group(3)}
            names |= set(re.findall(r'"([^"]+)"', m.group(4)))
            if names & used:
                kept.append(m.group(0))
            pos = m.end() + (code[m.end()] == ",")
        out += [code[at:start], ",".join(kept)]
        at = pos
    out.append(code[at:])
    bundle.write_text("".join(out), encoding="utf-8")


def _finish(app: Sphinx, exception: Exception | None) -> None:
    if exception is not None or app.builder.format != "html":
        return
    outdir = Path(app.outdir)
    _one_viewport(outdir)
    _trim_fontawesome(outdir)
    if app.builder.name == "html" and BOOK_PDF.is_file():
        shutil.copyfile(BOOK_PDF, outdir / "book.pdf")


# ---- the appendix numbered as an appendix -------------------------------------------------


def _appendix_docs() -> list[str]:
    """The chapters of the parts of ``_toc.yml`` whose caption starts with "Appendix", in
    order: they are numbered A, B, ... instead of continuing the chapters' numbers."""
    import yaml

    toc_path = ROOT / "_toc.yml"
    if not toc_path.is_file():
        return []
    toc = yaml.safe_load(toc_path.read_text(encoding="utf-8")) or {}
    return [
        str(chapter["file"]).removesuffix(".ipynb").removesuffix(".md")
        for part in toc.get("parts", [])
        if str(part.get("caption", "")).lower().startswith("appendix")
        for chapter in part.get("chapters", [])
    ]


def _letter_appendices(app: Sphinx, env: Any) -> list[str]:
    """Runs after Sphinx (and sphinx-multitoc-numbering) numbered the sections, figures,
    tables, equations, theorems and exercises: an appendix's chapter number N becomes its
    letter, so that its title reads "A. ...", its sections "A.1", its figures "Fig. A.1" on
    the web, in the sidebar, in cross-references and in the PDF (every writer joins the
    numbers with ``".".join(map(str, ...))``)."""
    for k, docname in enumerate(_appendix_docs()):
        secnumbers = env.toc_secnumbers.get(docname)
        if not secnumbers:
            continue
        letter = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[k]
        number = min((v for v in secnumbers.values() if v), key=len, default=())[:1]
        if not number or number[0] == letter:
            continue

        def lettered(numbers: tuple, first: object = number[0], letter: str = letter):
            return (letter, *numbers[1:]) if numbers[:1] == (first,) else numbers

        env.toc_secnumbers[docname] = {
            anchor: lettered(numbers) for anchor, numbers in secnumbers.items()
        }
        # the numbers the sidebar, the page's contents and the prev/next links show
        toc = env.tocs.get(docname)
        title = env.titles.get(docname)
        for node in [*(toc.findall(nodes.reference) if toc else []), title]:
            if node is not None and node.get("secnumber"):
                node["secnumber"] = list(lettered(tuple(node["secnumber"])))
        for figtype, numbers in env.toc_fignumbers.get(docname, {}).items():
            env.toc_fignumbers[docname][figtype] = {
                ident: lettered(value) for ident, value in numbers.items()
            }
    return []


# ---- static files ------------------------------------------------------------------------


def _add_static_path(app: Sphinx) -> None:
    if str(STATIC) not in app.config.html_static_path:
        app.config.html_static_path.append(str(STATIC))


# ---- the single-page build (for the PDF) ------------------------------------------------


def _singlehtml_knows_html_nodes(app: Sphinx) -> None:
    """Sphinx looks up node visitors by builder name and falls back to the format ("html")
    only when no extension registered any for "singlehtml"; one does, so myst-nb's
    HideCodeCellNode (registered for "html") was unknown there. Give "singlehtml" every HTML
    visitor it lacks."""
    if app.builder.name != "singlehtml":
        return
    handlers = app.registry.translation_handlers
    single = handlers.setdefault("singlehtml", {})
    for node, visitors in handlers.get("html", {}).items():
        single.setdefault(node, visitors)


# ---- bibliography: author-year labels ----------------------------------------------------


def _register_authoryear_style() -> None:
    from pybtex.plugin import register_plugin
    from pybtex.richtext import Text
    from pybtex.style.formatting.plain import Style as PlainStyle
    from pybtex.style.labels import BaseLabelStyle

    def last_name(person: Any) -> str:
        return " ".join(str(Text.from_latex(part)) for part in person.last_names)

    class AuthorYearLabelStyle(BaseLabelStyle):
        """ "Su et al., 2024"; "Luong and Manning, 2015"; a, b, ... when two collide."""

        def format_labels(self, sorted_entries: Any) -> Any:
            labels = []
            for entry in sorted_entries:
                people = (
                    entry.persons.get("author") or entry.persons.get("editor") or []
                )
                if not people:
                    who = str(Text.from_latex(entry.fields.get("title", entry.key)))
                elif len(people) == 1:
                    who = last_name(people[0])
                elif len(people) == 2:
                    who = f"{last_name(people[0])} and {last_name(people[1])}"
                else:
                    who = f"{last_name(people[0])} et al."
                labels.append(f"{who}, {entry.fields.get('year', 'n.d.')}")
            seen: dict[str, int] = defaultdict(int)
            for label in labels:
                seen[label] += 1
            suffix: dict[str, int] = defaultdict(int)
            for label in labels:
                if seen[label] > 1:
                    yield label + "abcdefghijklmnopqrstuvwxyz"[suffix[label]]
                    suffix[label] += 1
                else:
                    yield label

    class AuthorYearStyle(PlainStyle):
        default_label_style = "authoryear"
        default_sorting_style = "author_year_title"

    register_plugin(
        "pybtex.style.labels", "authoryear", AuthorYearLabelStyle, force=True
    )
    register_plugin(
        "pybtex.style.formatting", "authoryear", AuthorYearStyle, force=True
    )


# ---- proof index: titles, not labels -----------------------------------------------------


def _record_proof_titles(app: Sphinx, doctree: nodes.document) -> None:
    proofs = getattr(app.env, "proof_list", {})
    for node in doctree.findall(nodes.Element):
        label = node.get("label") if node.get("realtype") else None
        if label and label in proofs:
            proofs[label]["title"] = (
                str(node.get("title", "")).strip().strip("()").strip()
            )


def _patch_proof_index() -> None:
    try:
        from sphinx_proof.domain import ProofIndex
    except ImportError:  # pragma: no cover - sphinx-proof is in requirements.txt
        return

    def generate(self: Any, docnames: Any = None) -> tuple[list, bool]:
        env = self.domain.env
        content: dict[str, list] = defaultdict(list)
        for anchor, values in getattr(env, "proof_list", {}).items():
            docname = values["docname"]
            chapter = env.titles[docname].astext() if docname in env.titles else docname
            kind = values["realtype"].capitalize()
            title = values.get("title") or anchor
            content[chapter].append(
                (f"{kind}: {title}", 0, docname, anchor, "", "", "")
            )
        return sorted((k, sorted(v)) for k, v in content.items()), True

    ProofIndex.generate = generate
    ProofIndex.localname = "Theorems"


def setup(app: Sphinx) -> dict[str, Any]:
    _register_authoryear_style()
    _patch_proof_index()
    app.connect("builder-inited", _add_static_path)
    app.connect("builder-inited", _singlehtml_knows_html_nodes)
    app.connect("source-read", _drop_lab_front_matter)
    app.connect("doctree-read", _record_proof_titles)
    app.connect("doctree-read", _fold_solutions)
    app.connect("env-get-updated", _letter_appendices, priority=900)
    app.connect("html-page-context", _drop_thebe, priority=900)
    app.connect("html-page-context", _page_metadata, priority=900)
    app.connect("build-finished", _finish)
    app.add_css_file("book.css", priority=900)
    app.add_js_file("book.js", priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
