"""Print the whole book to one PDF: ``_build/pdf/book.pdf`` (``make pdf``).

Route: Jupyter Book's single-page HTML build (``--builder singlehtml``; it reuses the
execution cache in ``_build/.jupyter_cache``, so no chapter runs again when ``make book`` ran
first), opened from disk in headless Chromium through Playwright, both already needed by the
browser tests. Before printing, the script waits until MathJax (served from the book's own
``_static``; no network) has typeset every formula and every image has loaded, opens every
folded element (solutions, hidden cells' outputs), and prints with the book's print styles
(``book/_ext/static/book.css``: no buttons or sidebars, outputs whole). Figures are SVG, so
they stay vector graphics in the PDF. A copy goes to ``_build/html/book.pdf`` when the HTML
book exists, so the intro's link to the PDF works on the built site.

Usage: python scripts/build_pdf.py [--no-build]   (--no-build: reuse _build/singlehtml)
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SINGLE = ROOT / "_build" / "singlehtml"
PDF = ROOT / "_build" / "pdf" / "book.pdf"
HTML = ROOT / "_build" / "html"
CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--no-first-run",
]

# Runs in the page: wait for MathJax and the images, open everything folded, report.
PREPARE = """async () => {
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


def print_pdf() -> dict[str, int]:
    from playwright.sync_api import sync_playwright

    # The single page is written as the root document (book/intro.html) but its links to
    # _static/ and _images/ are relative to the build's top folder: open a copy there.
    root = SINGLE / "book" / "intro.html"
    if not root.is_file():
        sys.exit(f"build_pdf: {root} is missing (run without --no-build)")
    index = SINGLE / "whole-book.html"
    shutil.copyfile(root, index)
    PDF.parent.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=_chromium(), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 1400})
            page.set_default_timeout(300_000)  # MathJax on the whole book takes a while
            page.goto(index.as_uri(), wait_until="load")
            report = page.evaluate(PREPARE)
            if report["untypeset"] or report["errors"] or report["broken"]:
                sys.exit(f"build_pdf: the page is not ready to print: {report}")
            page.emulate_media(media="print")
            page.pdf(
                path=str(PDF),
                format="A4",
                print_background=True,
                margin={
                    "top": "16mm",
                    "bottom": "18mm",
                    "left": "16mm",
                    "right": "16mm",
                },
                display_header_footer=True,
                header_template="<span></span>",
                footer_template=(
                    '<div style="font-size:8px;width:100%;text-align:center;color:#666">'
                    '<span class="pageNumber"></span> / <span class="totalPages"></span></div>'
                ),
                outline=True,
                tagged=True,
            )
        finally:
            browser.close()
    return report


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
        f"build_pdf: wrote {PDF.relative_to(ROOT)} ({size:.1f} MiB; {report['formulas']} "
        f"formulas typeset, {report['images']} images)"
    )
    if HTML.is_dir():
        shutil.copyfile(PDF, HTML / "book.pdf")
        print(
            f"build_pdf: copied to {(HTML / 'book.pdf').relative_to(ROOT)} for the site"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
