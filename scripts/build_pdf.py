"""Print the whole book to one PDF: ``_build/pdf/book.pdf`` (``make pdf``).

Route: Jupyter Book's single-page HTML build (``--builder singlehtml``; it reuses the
execution cache in ``_build/.jupyter_cache``, so no chapter runs again when ``make book`` ran
first), served on 127.0.0.1 and opened in headless Chromium through Playwright (both already
needed by the browser tests), then paginated by Paged.js (``scripts/pdf/``: the polyfill
0.4.3 from the npm registry, MIT, vendored so the build needs no network) with the page
styles in ``scripts/pdf/book-pages.css``, and printed by Chromium.

Before pagination the page is made a book:

- a title page and a contents page whose entries carry their page numbers
  (``target-counter``), a page for each part of ``_toc.yml``, each chapter on a new page with
  its title as the running header (``string-set``) and page numbers in the footer;
- every link is either a fragment of the book (``#id``: Chromium prints it as a link to the
  page it names) or a public ``http(s)`` URL; links to pages that are not in the book (the
  general index, the PDF itself) become plain text;
- each chapter's solutions move to a "Solutions" section at the end of the chapter, and each
  exercise gets a link to its solution with the solution's page number.

The bookmarks (part > chapter > section) are written afterwards with pypdf from the
headings' pages and positions as Paged.js laid them out, with the headings' text (formulas
as their Unicode text). Figures are SVG, so they stay vector graphics in the PDF. A copy goes
to ``_build/html/book.pdf`` when the HTML book exists, so the intro's link to the PDF works
on the built site.

Usage: python scripts/build_pdf.py [--no-build]   (--no-build: reuse _build/singlehtml)
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
SINGLE = ROOT / "_build" / "singlehtml"
PDF = ROOT / "_build" / "pdf" / "book.pdf"
REPORT = ROOT / "_build" / "pdf" / "book.json"
HTML = ROOT / "_build" / "html"
PAGED = ROOT / "scripts" / "pdf" / "paged.polyfill.min.js"
PAGE_CSS = ROOT / "scripts" / "pdf" / "book-pages.css"
CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--no-first-run",
]

# Runs in the page once it has loaded: wait for MathJax and the images, open everything
# folded, and report what could stop the print.
READY = """async () => {
    if (window.MathJax && MathJax.startup) { await MathJax.startup.promise; }
    for (const img of Array.from(document.images)) {
        img.loading = 'eager';
        if (!img.complete) {
            await new Promise((ok) => { img.onload = ok; img.onerror = ok; });
        }
    }
    document.querySelectorAll('details').forEach((d) => { d.open = true; });
    document.querySelectorAll('.toggle-hidden')
        .forEach((el) => el.classList.remove('toggle-hidden'));
    const formulas = document.querySelectorAll('.math');
    let untypeset = 0;
    formulas.forEach((el) => { if (!el.querySelector('mjx-container')) untypeset += 1; });
    return {
        formulas: formulas.length,
        untypeset: untypeset,
        errors: document.querySelectorAll('mjx-merror').length,
        images: document.images.length,
        broken: Array.from(document.images).filter((i) => !i.naturalWidth).length,
    };
}"""

# Runs in the page: turn the single-page build into a book (see the module docstring).
# ``book`` = {title, subtitle, author, parts: [{caption, numbered, docs: [docname]}]}.
MAKE_BOOK = r"""(book) => {
    const article = document.querySelector('article.bd-article')
        || document.querySelector('article');
    const text = (el) => {
        // A heading's text as a reader sees it: formulas as their Unicode text (MathJax's
        // assistive MathML), no "#" permalink, whitespace as single spaces.
        const copy = el.cloneNode(true);
        copy.querySelectorAll('.headerlink').forEach((e) => e.remove());
        copy.querySelectorAll('mjx-container').forEach((m) => {
            const mml = m.querySelector('mjx-assistive-mml');
            m.replaceWith(document.createTextNode(mml ? mml.textContent : ''));
        });
        return copy.textContent.replace(/\s+/g, ' ').trim();
    };
    const stats = {
        internal: 0, external: 0, unlinked: [], missing: [], solutions: 0,
        solutionLinks: 0,
    };

    // ---- a solution's title links to its exercise again: the site's script (book.js)
    // unlinked it so that a tap opens the dropdown, and kept the target in data-book-href
    article.querySelectorAll('.admonition-title [data-book-href]').forEach((span) => {
        const a = document.createElement('a');
        a.className = 'reference internal';
        a.setAttribute('href', span.dataset.bookHref);
        while (span.firstChild) a.appendChild(span.firstChild);
        span.replaceWith(a);
    });

    // ---- interface out: permalinks, buttons, the theme's page furniture ----------------
    article.querySelectorAll('.headerlink, button, .copybtn, .toggle-button')
        .forEach((e) => e.remove());

    // ---- chapters and parts ------------------------------------------------------------
    const chapters = [];  // {docname, section, title, part}
    let partNumber = 0;
    for (const part of book.parts) {
        const firstSpan = document.getElementById('document-' + part.docs[0]);
        let partSection = null;
        if (firstSpan && part.caption) {
            partNumber += 1;
            partSection = document.createElement('section');
            partSection.className = 'book-part';
            partSection.id = 'book-part-' + partNumber;
            partSection.innerHTML = '<p class="book-part-number">Part ' + partNumber
                + '</p><h1></h1>';
            partSection.querySelector('h1').textContent = part.caption;
            firstSpan.parentNode.insertBefore(partSection, firstSpan);
        }
        for (const doc of part.docs) {
            const span = document.getElementById('document-' + doc);
            if (!span) { stats.missing.push(doc); continue; }
            let section = span.nextElementSibling;
            while (section && section.tagName !== 'SECTION') section = section.nextElementSibling;
            if (!section) { stats.missing.push(doc); continue; }
            section.classList.add('book-chapter');
            // links to the chapter land on its title: the marker span before it stays on
            // the previous page, and section ids repeat across chapters ("references")
            const heading = section.querySelector(':scope > h1, :scope > h2');
            if (heading) {
                heading.id = 'book-chapter-' + (chapters.length + 1);
                span.bookHeading = heading;
            }
            chapters.push({doc, section, part: partSection, marker: heading || span});
        }
    }
    // the root page (the intro) is a chapter too, before the first part
    const rootSpan = article.querySelector('section');
    if (rootSpan && !rootSpan.classList.contains('book-chapter')) {
        rootSpan.classList.add('book-chapter');
        chapters.unshift({doc: book.root, section: rootSpan, part: null, marker: rootSpan});
    }

    // ---- the API reference prints its input contract (a row per public function: what
    // it accepts, when it refuses), not the generated docstrings: those were 149 of 473
    // pages (review s6-ux m3) and stay on the web page and in help(). Links to a dropped
    // docstring lead to its module's table of the contract.
    const api = chapters.find((c) => c.doc === book.api);
    if (api) {
        const heads = new Map();
        for (const h of api.section.querySelectorAll('section section > :is(h3, h4, h5)')) {
            const name = text(h);
            if (/^companion(\.\w+)*$/.test(name) && h.parentElement.id) {
                heads.set(name, h.parentElement.id);
            }
        }
        const contract = api.section.querySelector('#the-input-contract')
            || api.section.querySelector(':scope > section');
        const gone = new Map();
        for (const sub of Array.from(api.section.querySelectorAll(':scope > section'))) {
            if (!sub.querySelector('dl.py')) continue;
            for (const el of [sub, ...sub.querySelectorAll('[id]')]) {
                let name = el.id.replace(/^module-/, '');
                while (name && !heads.has(name)) {
                    name = name.includes('.') ? name.slice(0, name.lastIndexOf('.')) : '';
                }
                gone.set(el.id, name ? heads.get(name) : contract.id);
            }
            sub.remove();
            stats.apiSectionsDropped = (stats.apiSectionsDropped || 0) + 1;
        }
        stats.apiRetargeted = 0;
        for (const a of Array.from(article.querySelectorAll('a[href*="#"]'))) {
            const fragment = decodeURIComponent(a.getAttribute('href').split('#')[1]);
            if (gone.has(fragment)) {
                a.setAttribute('href', '#' + gone.get(fragment));
                stats.apiRetargeted += 1;
            }
        }
        const note = document.createElement('p');
        note.className = 'book-api-note';
        note.textContent = 'In this printed book the reference is the input contract below: '
            + 'every public function of the package with the arguments it accepts and '
            + 'when it refuses a value. Every signature and docstring is on the web '
            + "book's API page (book/api.md in " + book.repository + ') and in Python, '
            + 'e.g. help(companion.rope.apply_rope).';
        const title = api.section.querySelector(':scope > h1, :scope > h2');
        (title.nextElementSibling || title).after(note);
    }

    // ---- ids that are not CSS identifiers ("document-book/02_rope") get ones that are:
    // Paged.js looks elements up by selector
    const renamed = new Map();
    document.querySelectorAll('[id]').forEach((el, i) => {
        if (/^[A-Za-z][\w-]*$/.test(el.id)) return;
        renamed.set(el.id, el);
        el.id = 'book-id' + i + '-' + el.id.replace(/[^\w-]/g, '-');
    });
    const byId = (id) => renamed.get(id) || document.getElementById(id);

    // ---- solutions: to the end of their chapter, with a link from the exercise ---------
    for (const chapter of chapters) {
        const solutions = Array.from(chapter.section.querySelectorAll('div.solution'))
            .filter((s) => s.closest('section.book-chapter') === chapter.section);
        if (!solutions.length) continue;
        const box = document.createElement('section');
        box.className = 'book-solutions';
        box.id = 'book-solutions-' + chapter.section.id;
        box.innerHTML = '<h3>Solutions</h3>';
        for (const solution of solutions) {
            solution.classList.remove('dropdown');
            const toExercise = solution.querySelector('.admonition-title a[href]');
            const exerciseId = toExercise
                ? decodeURIComponent(toExercise.getAttribute('href').split('#')[1] || '')
                : '';
            const exercise = exerciseId && byId(exerciseId);
            if (exercise && solution.id) {
                const link = document.createElement('p');
                link.className = 'book-solution-link';
                link.innerHTML = '<a>Solution at the end of the chapter</a>';
                link.querySelector('a').setAttribute('href', '#' + solution.id);
                exercise.appendChild(link);
                stats.solutionLinks += 1;
            }
            box.appendChild(solution);
            stats.solutions += 1;
        }
        chapter.section.appendChild(box);
    }

    // ---- links: a fragment of this book, a public URL, or plain text -------------------
    for (const a of Array.from(article.querySelectorAll('a[href]'))) {
        const href = a.getAttribute('href');
        let url;
        try { url = new URL(href, document.baseURI); } catch (e) { url = null; }
        if (url && (url.protocol === 'https:' || url.protocol === 'http:')
                && url.hostname !== location.hostname) {
            stats.external += 1;
            continue;
        }
        if (url && url.protocol === 'mailto:') { stats.external += 1; continue; }
        const fragment = url && url.hash ? decodeURIComponent(url.hash.slice(1)) : '';
        let target = fragment && byId(fragment);
        if (!target && url && !fragment) {
            // a link to a whole page of the book: its document marker
            const m = url.pathname.match(/\/(book\/[^/]+)\.html$/);
            if (m) target = byId('document-' + m[1]);
        }
        if (target) {
            if (target.bookHeading) target = target.bookHeading;
            if (!target.id) target.id = 'book-target-' + stats.internal;
            a.setAttribute('href', '#' + target.id);
            stats.internal += 1;
        } else {
            stats.unlinked.push(href);
            const span = document.createElement('span');
            span.className = a.className;
            while (a.firstChild) span.appendChild(a.firstChild);
            a.replaceWith(span);
        }
    }

    // ---- front matter: title page and contents -----------------------------------------
    const front = document.createElement('div');
    front.className = 'book-front';
    const titlePage = document.createElement('div');
    titlePage.className = 'book-title-page';
    titlePage.innerHTML = '<p class="book-title"></p><p class="book-subtitle"></p>'
        + '<p class="book-author"></p>';
    titlePage.querySelector('.book-title').textContent = book.title;
    titlePage.querySelector('.book-subtitle').textContent = book.subtitle;
    titlePage.querySelector('.book-author').textContent = book.author;
    const contents = document.createElement('nav');
    contents.className = 'book-contents';
    contents.id = 'book-contents';
    contents.innerHTML = '<h2>Contents</h2><ul></ul>';
    const list = contents.querySelector('ul');
    const entry = (cls, id, label) => {
        const li = document.createElement('li');
        li.className = cls;
        li.innerHTML = '<a><span class="book-contents-title"></span></a>';
        li.querySelector('a').setAttribute('href', '#' + id);
        li.querySelector('span').textContent = label;
        list.appendChild(li);
    };
    let lastPart = null;
    for (const chapter of chapters) {
        if (chapter.part && chapter.part !== lastPart) {
            entry('book-contents-part', chapter.part.id,
                  chapter.part.querySelector('.book-part-number').textContent + ': '
                  + text(chapter.part.querySelector('h1')));
            lastPart = chapter.part;
        }
        const h1 = chapter.section.querySelector(':scope > h1, :scope > h2');
        entry('book-contents-chapter', chapter.marker.id, text(h1));
    }
    front.appendChild(titlePage);
    front.appendChild(contents);
    article.insertBefore(front, article.firstChild);

    // ---- code keeps its spaces and line ends on a page it continues onto: laying out the
    // rest of a split block, Paged.js steps from an element to the next *significant*
    // node, passing over whitespace-only text, and Pygments writes the spaces and newlines
    // between tokens as such text ("x = 1" read "x=1" there, lines ran together). Each
    // goes into a span of its own: an element is never passed over.
    for (const pre of article.querySelectorAll('pre')) {
        const walker = document.createTreeWalker(pre, NodeFilter.SHOW_TEXT);
        const blank = [];
        while (walker.nextNode()) {
            if (!/[^\t\n\r ]/.test(walker.currentNode.data)) blank.push(walker.currentNode);
        }
        for (const node of blank) {
            const span = document.createElement('span');
            span.className = 'book-ws';
            node.replaceWith(span);
            span.appendChild(node);
        }
    }

    // ---- the empty anchor Sphinx's single-page build puts before a chapter
    // (span#book-id462-document-book-04_relative_positions) goes inside that chapter:
    // left at the end of the chapter before, it could spill alone onto a page of its
    // own (a blank page) ahead of the next chapter's page break, and a link to the
    // chapter then opened that page.
    const chapterSections = Array.from(article.querySelectorAll('section.book-chapter'));
    for (const span of Array.from(article.querySelectorAll('span[id*="document-"]'))) {
        if (span.textContent.trim() || span.childElementCount) continue;
        const next = chapterSections.find(
            (c) => span.compareDocumentPosition(c) & Node.DOCUMENT_POSITION_FOLLOWING);
        if (next) next.insertBefore(span, next.firstChild);
    }

    // ---- the article alone on the page -------------------------------------------------
    document.body.replaceChildren(article);
    document.body.className = '';
    // Every style sheet becomes the text Paged.js reads, from the CSSOM (MathJax writes its
    // styles there), with url()s made absolute, and without the rules for states that
    // paper has not (:hover, :focus...) and selectors Paged.js cannot query.
    const unprintable = /:nth-|:hover|:focus|:active|:visited|:has\(|:is\(|:where\(|::?-(webkit|moz|ms)-|::selection|::placeholder|:target/;
    const prune = (holder) => {
        for (let i = holder.cssRules.length - 1; i >= 0; i--) {
            const rule = holder.cssRules[i];
            if (rule.selectorText !== undefined && unprintable.test(rule.selectorText)) {
                holder.deleteRule(i);
            } else if (rule.cssRules && rule.deleteRule) {
                prune(rule);
            }
        }
    };
    const sheets = [];
    for (const sheet of Array.from(document.styleSheets)) {
        const owner = sheet.ownerNode;
        if (!owner || (sheet.media && sheet.media.mediaText.includes('screen'))) continue;
        let css = '';
        try {
            prune(sheet);
            const base = sheet.href || document.baseURI;
            css = Array.from(sheet.cssRules).map((r) => r.cssText).join('\n')
                .replace(/url\(\s*(["']?)([^"')]+)\1\s*\)/g,
                         (m, q, u) => u.startsWith('data:') ? m
                             : 'url("' + new URL(u, base).href + '")');
        } catch (e) { continue; }
        sheets.push([owner, css]);
    }
    for (const [owner, css] of sheets) {
        const style = document.createElement('style');
        style.textContent = css;
        owner.replaceWith(style);
    }
    stats.stylesheets = sheets.length;
    stats.chapters = chapters.map(
        (c) => text(c.section.querySelector(':scope > h1, :scope > h2')));
    return stats;
}"""

# Runs after Paged.js: does every box's icon print in the icon font (not as a missing-glyph
# box in the text font, review s6-ux m2; book-pages.css names the font)?
ICONS = r"""async () => {
    await document.fonts.ready;
    const titles = Array.from(
        document.querySelectorAll('.pagedjs_page .admonition > .admonition-title'));
    const drawn = titles.filter((t) => {
        const content = getComputedStyle(t, '::after').content;
        return content && content !== 'none' && content !== 'normal' && content !== '""';
    });
    const wrong = drawn.filter(
        (t) => !/Font Awesome 6 Free/.test(getComputedStyle(t, '::after').fontFamily));
    const all = Array.from(document.querySelectorAll('.pagedjs_page'));
    const pages = new Set(drawn.map((t) => all.indexOf(t.closest('.pagedjs_page')) + 1));
    return {
        boxes: titles.length,
        icons: drawn.length,
        pages: Array.from(pages).sort((a, b) => a - b),
        wrongFont: wrong.length,
        fontLoaded: Array.from(document.fonts).some(
            (f) => /Font Awesome 6 Free/.test(f.family) && f.status === 'loaded'),
    };
}"""

# Runs after Paged.js: where every heading landed (bookmarks), and the pages' contents.
LAID_OUT = r"""() => {
    const pages = Array.from(document.querySelectorAll('.pagedjs_page'));
    const text = (el) => {
        const copy = el.cloneNode(true);
        copy.querySelectorAll('.headerlink').forEach((e) => e.remove());
        copy.querySelectorAll('mjx-container').forEach((m) => {
            const mml = m.querySelector('mjx-assistive-mml');
            m.replaceWith(document.createTextNode(mml ? mml.textContent : ''));
        });
        return copy.textContent.replace(/\s+/g, ' ').trim();
    };
    const headings = [];
    const query = [
        '.book-front nav > h2',
        'section.book-part > h1',
        // the root page's title is an h1, the chapters' (nested in it) h2
        'section.book-chapter > h1',
        'section.book-chapter > h2',
        'section.book-chapter > section > h2',
        'section.book-chapter > section > h3',
        'section.book-solutions > h3',
    ].join(', ');
    for (const h of document.querySelectorAll(query)) {
        const page = h.closest('.pagedjs_page');
        if (!page) continue;
        const level = h.matches('section.book-part > h1') ? 0
            : h.matches('section.book-chapter > h1, section.book-chapter > h2, nav > h2')
                ? 1 : 2;
        const pageBox = page.getBoundingClientRect();
        headings.push({
            level: level,
            title: text(h),
            page: pages.indexOf(page),
            top: h.getBoundingClientRect().top - pageBox.top,
            height: pageBox.height,
            width: pageBox.width,
            part: h.matches('section.book-part > h1'),
        });
    }
    const blank = [];
    pages.forEach((page, i) => {
        const area = page.querySelector('.pagedjs_page_content');
        const words = area ? area.textContent.trim().length : 0;
        const pictures = area ? area.querySelectorAll('img, svg, mjx-container').length : 0;
        if (!words && !pictures) blank.push(i + 1);
    });
    return {pages: pages.length, headings: headings, blank: blank};
}"""


def _chromium() -> str:
    for path in (
        os.environ.get("CHROMIUM"),
        *CHROMIUM_CANDIDATES,
        shutil.which("chromium"),
    ):
        if path and Path(path).is_file():
            return path
    sys.exit("build_pdf: no Chromium found (install Debian's `chromium` package)")


def build_singlehtml() -> None:
    jb = Path(sys.executable).with_name("jupyter-book")
    command = [str(jb), "build", str(ROOT), "--builder", "singlehtml"]
    print("build_pdf:", " ".join(command), flush=True)
    subprocess.run(command, check=True, cwd=ROOT)


def book_plan() -> dict[str, object]:
    """Title, subtitle, author and the parts of ``_toc.yml`` with their pages."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    intro = (ROOT / f"{toc['root']}.md").read_text(encoding="utf-8")
    subtitle = next(
        (ln.strip("*_ ") for ln in intro.splitlines() if ln.startswith("*")), ""
    )
    parts = [
        {
            "caption": part.get("caption", ""),
            "numbered": bool(part.get("numbered")),
            "docs": [chapter["file"] for chapter in part.get("chapters", [])],
        }
        for part in toc.get("parts", [])
    ]
    return {
        "title": config.get("title", ""),
        "subtitle": subtitle,
        "author": config.get("author", ""),
        "root": toc["root"],
        "parts": parts,
        # the page whose generated docstrings the PDF leaves to the web (review s6-ux m3)
        "api": "book/api",
        "repository": config.get("repository", {}).get("url", ""),
    }


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def print_pdf() -> dict[str, object]:
    from playwright.sync_api import sync_playwright

    # The single page is written as the root document (book/intro.html) but its links to
    # _static/ and _images/ are relative to the build's top folder: serve a copy there.
    root = SINGLE / "book" / "intro.html"
    if not root.is_file():
        sys.exit(f"build_pdf: {root} is missing (run without --no-build)")
    shutil.copyfile(root, SINGLE / "whole-book.html")
    PDF.parent.mkdir(parents=True, exist_ok=True)
    raw = PDF.with_suffix(".raw.pdf")
    handler = functools.partial(_Quiet, directory=str(SINGLE))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}/whole-book.html"
    started = time.monotonic()
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=_chromium(), args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1000, "height": 1400})
                page.set_default_timeout(900_000)  # the whole book on a shared CPU
                errors: list[str] = []
                page.on("pageerror", lambda exc: errors.append(str(exc)))
                page.goto(url, wait_until="load")
                ready = page.evaluate(READY)
                if ready["untypeset"] or ready["errors"] or ready["broken"]:
                    sys.exit(f"build_pdf: the page is not ready to print: {ready}")
                # Lay out in print media: the sizes Paged.js measures are the printed ones.
                page.emulate_media(media="print")
                made = page.evaluate(MAKE_BOOK, book_plan())
                if made["missing"]:
                    sys.exit(
                        f"build_pdf: pages of _toc.yml not found: {made['missing']}"
                    )
                page.add_style_tag(content=PAGE_CSS.read_text(encoding="utf-8"))
                page.evaluate("() => { window.PagedConfig = {auto: false}; }")
                page.add_script_tag(content=PAGED.read_text(encoding="utf-8"))
                print(
                    f"build_pdf: paginating ({time.monotonic() - started:.0f} s)",
                    flush=True,
                )
                # (the theme's own script fails on the single page's ids at load: not ours)
                errors.clear()
                page.evaluate(
                    """async () => {
                        const previewer = new Paged.Previewer();
                        const flow = await previewer.preview();
                        window.bookPages = flow.total;
                    }"""
                )
                laid = page.evaluate(LAID_OUT)
                laid["iconCheck"] = page.evaluate(ICONS)
                icons = laid["iconCheck"]
                if icons["icons"] and (icons["wrongFont"] or not icons["fontLoaded"]):
                    sys.exit(
                        f"build_pdf: box icons would print as empty boxes: {icons}"
                    )
                if errors:
                    sys.exit(f"build_pdf: errors in the page: {errors[:5]}")
                print(
                    f"build_pdf: {laid['pages']} pages laid out "
                    f"({time.monotonic() - started:.0f} s); printing",
                    flush=True,
                )
                page.pdf(
                    path=str(raw),
                    prefer_css_page_size=True,
                    print_background=True,
                    outline=False,
                    tagged=False,
                )
            finally:
                browser.close()
    finally:
        httpd.shutdown()
        httpd.server_close()
    write_outline(raw, PDF, laid["headings"])
    raw.unlink()
    report = {**ready, **made, **laid}
    REPORT.write_text(json.dumps(report, indent=1), encoding="utf-8")
    return report


def write_outline(source: Path, target: Path, headings: list[dict]) -> None:
    """Bookmarks: parts hold their chapters, chapters their sections; each bookmark opens
    its heading's page at the heading."""
    from pypdf import PdfReader, PdfWriter
    from pypdf.generic import Fit

    writer = PdfWriter(clone_from=PdfReader(source))
    parents: list[object | None] = [None, None, None]
    for h in headings:
        index = h["page"]
        if not 0 <= index < len(writer.pages):
            continue
        height = float(writer.pages[index].mediabox.height)
        top = max(0.0, height - h["top"] * 0.75)  # CSS px -> pt, printed at 1:1
        level = h["level"]
        if level == 1 and parents[0] is None:
            parent = None
        elif level == 2:
            parent = parents[1] or parents[0]
        elif level == 1:
            parent = parents[0]
        else:
            parent = None
        item = writer.add_outline_item(
            title=h["title"],
            page_number=index,
            parent=parent,
            fit=Fit.xyz(left=0, top=top),
        )
        if level == 0:
            parents = [item, None, None]
        elif level == 1:
            parents[1] = item
            if not h.get("part") and parent is None:
                parents[0] = None
    writer.page_mode = "/UseOutlines"
    with target.open("wb") as out:
        writer.write(out)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--no-build", action="store_true", help="reuse _build/singlehtml"
    )
    args = parser.parse_args(argv)
    if not args.no_build:
        build_singlehtml()
    report = print_pdf()
    size = PDF.stat().st_size / 2**20
    print(
        f"build_pdf: wrote {PDF.relative_to(ROOT)} ({size:.1f} MiB, {report['pages']} "
        f"pages; {report['formulas']} formulas, {report['images']} images, "
        f"{report['internal']} internal and {report['external']} external links, "
        f"{len(report['unlinked'])} links to pages outside the book made plain text, "
        f"{report['solutions']} solutions moved to their chapter's end, "
        f"{report['solutionLinks']} linked from their exercise)"
    )
    if report["blank"]:
        print(f"build_pdf: blank pages: {report['blank']}")
    if HTML.is_dir():
        shutil.copyfile(PDF, HTML / "book.pdf")
        print(
            f"build_pdf: copied to {(HTML / 'book.pdf').relative_to(ROOT)} for the site"
        )
        restore_pdf_link()
    return 0


MISSING_LINK = re.compile(
    r'<span class="book-pdf-link book-pdf-missing" data-href="([^"]*)">(.*?) '
    r"\(not built here: <code>make pdf</code> writes it\)</span>",
    re.S,
)


def restore_pdf_link() -> None:
    """The HTML build showed the PDF link as plain text when no PDF existed
    (book/_ext/book_html.py); now that it does, make it a link again."""
    for page in HTML.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        if "book-pdf-missing" in text:
            text = MISSING_LINK.sub(r'<a class="book-pdf-link" href="\1">\2</a>', text)
            page.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
