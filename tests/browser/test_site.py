"""The built book in a real browser.

After `make book` (or the strict build in `make test`), serve ``_build/html`` on 127.0.0.1,
open every page in headless Chromium (Debian's ``chromium``, driven by Playwright with
``executable_path``) and check what a reader would see: no console errors, no failed requests,
no request to any host but 127.0.0.1, every formula typeset by the book's own MathJax, every
image loaded with a non-zero size, and the solution dropdowns opening on click. A screenshot of
each page goes to ``_build/screenshots/``.

Run with ``pytest tests/browser --browser`` (``make browser``). Without Chromium the tests skip
with a message, except under CI (``CI`` set), where a missing browser is a failure.
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import pytest

ROOT = Path(__file__).resolve().parents[2]
HTML = ROOT / "_build" / "html"
SHOTS = ROOT / "_build" / "screenshots"
CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

pytestmark = pytest.mark.browser


def _chromium() -> str | None:
    for path in (os.environ.get("CHROMIUM"), *CHROMIUM_CANDIDATES, shutil.which("chromium")):
        if path and Path(path).is_file():
            return path
    return None


def _pages() -> list[Path]:
    if not HTML.is_dir():
        return []
    return sorted(
        p
        for p in HTML.rglob("*.html")
        if not any(part.startswith("_") for part in p.relative_to(HTML).parts)
    )


PAGES = _pages()


def _skip_or_fail(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (under CI this is a failure, not a skip)")
    pytest.skip(reason)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    if not PAGES:
        _skip_or_fail("no built book in _build/html: run `make book` first")
    handler = functools.partial(_QuietHandler, directory=str(HTML))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    executable = _chromium()
    if executable is None:
        _skip_or_fail("no Chromium found (install Debian's `chromium` package)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:  # pragma: no cover - playwright is in requirements.txt
        _skip_or_fail("playwright is not installed")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


class PageVisit:
    """One page opened in a fresh browser context, with everything it asked for recorded."""

    def __init__(self, browser: object, url: str) -> None:
        self.context = browser.new_context(viewport={"width": 1280, "height": 900})
        self.page = self.context.new_page()
        self.console_errors: list[str] = []
        self.failed: list[str] = []
        self.foreign: list[str] = []
        self.page.on(
            "console",
            lambda msg: self.console_errors.append(msg.text) if msg.type == "error" else None,
        )
        self.page.on("pageerror", lambda exc: self.console_errors.append(str(exc)))
        self.page.on("requestfailed", lambda req: self.failed.append(f"{req.url} ({req.failure})"))
        self.page.on(
            "response",
            lambda res: (
                self.failed.append(f"{res.url} (HTTP {res.status})") if res.status >= 400 else None
            ),
        )
        # Any request to another host is recorded and refused: the book must read offline.
        self.page.route("**/*", self._route)
        self.page.goto(url, wait_until="load")
        self.page.wait_for_load_state("networkidle")

    def _route(self, route: object) -> None:
        url = route.request.url
        parsed = urlparse(url)
        if parsed.scheme in ("data", "blob", "about") or parsed.hostname == "127.0.0.1":
            route.continue_()
        else:
            self.foreign.append(url)
            route.abort()

    def close(self) -> None:
        self.context.close()


def _typeset(page: object) -> dict[str, int]:
    """Wait for MathJax (when the page has math) and count formulas and typeset results."""
    return page.evaluate(
        """async () => {
            const formulas = document.querySelectorAll('.math');
            if (formulas.length && window.MathJax && MathJax.startup) {
                await MathJax.startup.promise;
            }
            let untypeset = 0;
            formulas.forEach((el) => { if (!el.querySelector('mjx-container')) untypeset += 1; });
            return {
                formulas: formulas.length,
                untypeset: untypeset,
                errors: document.querySelectorAll('mjx-merror').length,
                mathjax: !!window.MathJax,
            };
        }"""
    )


def _broken_images(page: object) -> list[str]:
    return page.evaluate(
        """async () => {
            const images = Array.from(document.images);
            for (const img of images) {
                img.loading = 'eager';
                if (!img.complete) {
                    await new Promise((ok) => { img.onload = ok; img.onerror = ok; });
                }
            }
            return images
                .filter((img) => !(img.naturalWidth > 0 && img.naturalHeight > 0))
                .map((img) => img.getAttribute('src'));
        }"""
    )


@pytest.mark.parametrize(
    "page_path", PAGES, ids=[str(p.relative_to(HTML)) for p in PAGES] if PAGES else None
)
def test_page_reads_offline_and_renders(server: str, browser: object, page_path: Path) -> None:
    rel = page_path.relative_to(HTML)
    visit = PageVisit(browser, f"{server}/{rel.as_posix()}")
    try:
        math = _typeset(visit.page)
        broken = _broken_images(visit.page)
        shot = SHOTS / rel.with_suffix(".png")
        shot.parent.mkdir(parents=True, exist_ok=True)
        visit.page.screenshot(path=str(shot), full_page=True)

        assert not visit.foreign, f"{rel}: requests to other hosts: {visit.foreign}"
        assert not visit.failed, f"{rel}: failed requests: {visit.failed}"
        assert not visit.console_errors, f"{rel}: console errors: {visit.console_errors}"
        if math["formulas"]:
            assert math["mathjax"], f"{rel}: has formulas but no MathJax loaded"
            assert math["untypeset"] == 0, f"{rel}: {math['untypeset']} formulas not typeset"
            assert math["errors"] == 0, f"{rel}: {math['errors']} MathJax errors"
        assert not broken, f"{rel}: images not loaded: {broken}"
    finally:
        visit.close()


def test_the_book_has_math_and_figures(server: str, browser: object) -> None:
    """Guards the checks above against passing vacuously: the book as a whole has formulas and
    images, and MathJax typesets them from the book's own folder."""
    pages_with_math = [p for p in PAGES if 'class="math' in p.read_text(encoding="utf-8")]
    assert pages_with_math, "no page of the book contains a formula"
    visit = PageVisit(browser, f"{server}/{pages_with_math[0].relative_to(HTML).as_posix()}")
    try:
        math = _typeset(visit.page)
        assert math["formulas"] > 0 and math["untypeset"] == 0
        sources = visit.page.evaluate(
            "() => Array.from(document.scripts).map((s) => s.src).filter((s) => /mathjax/i.test(s))"
        )
        assert sources and all(s.startswith(server) for s in sources), sources
    finally:
        visit.close()


def test_solution_dropdowns_open_on_click(server: str, browser: object) -> None:
    pages = [p for p in PAGES if "solution dropdown" in p.read_text(encoding="utf-8")]
    if not pages:
        pytest.skip("no chapter has a solution dropdown yet")
    for page_path in pages:
        rel = page_path.relative_to(HTML).as_posix()
        visit = PageVisit(browser, f"{server}/{rel}")
        try:
            solution = visit.page.locator("div.solution.dropdown").first
            button = solution.locator("button.toggle-button").first
            body = solution.locator("section").first
            button.wait_for(state="visible")
            assert not body.is_visible(), f"{rel}: the solution is visible before a click"
            button.click()
            body.wait_for(state="visible")
            assert body.is_visible(), f"{rel}: the solution did not open on click"
        finally:
            visit.close()


def test_book_reads_from_disk_without_a_server(browser: object) -> None:
    """A reader who downloads the built folder opens it with file://: math still renders."""
    pages = [p for p in PAGES if 'class="math' in p.read_text(encoding="utf-8")]
    if not pages:
        _skip_or_fail("no built page with formulas: run `make book` first")
    context = browser.new_context()
    page = context.new_page()
    foreign: list[str] = []
    page.on(
        "request",
        lambda req: foreign.append(req.url) if not req.url.startswith(("file:", "data:")) else None,
    )
    try:
        page.goto(pages[0].as_uri(), wait_until="load")
        math = _typeset(page)
        assert math["formulas"] > 0 and math["untypeset"] == 0 and math["errors"] == 0
        assert not foreign, f"a page opened from disk asked the network for: {foreign}"
    finally:
        context.close()
