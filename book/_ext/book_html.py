"""Local Sphinx extension: keep the built pages self-contained and free of console errors.

Jupyter Book 1.x always loads sphinx-thebe, which injects its configuration script twice
(a console error, "Identifier 'THEBE_JS_URL' has already been declared") and points at a CDN.
The book has no live-code button (it reads offline), so its scripts are dropped from every page.
"""

from __future__ import annotations

from typing import Any

from sphinx.application import Sphinx


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


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("html-page-context", _drop_thebe, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
