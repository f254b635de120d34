"""Order of the browser checks: page by page, so that a page opened once serves every check
of it (test_site.py's ``_visit``), and under ``pytest -n`` one worker per page.

Within one page and screen size, the checks that only read the page run first and the ones
that click or scroll last: reading (rank 0-1) before clicking (rank 2). Every page's checks
form one ``xdist_group`` (run with ``--dist loadgroup``), and so do JupyterLab's, which share
one JupyterLab server.
"""

from __future__ import annotations

import pytest

# test name -> (screen size, rank); a None size is taken from the test's ``screen``
# parameter (test_small_screens_fit_and_navigate, test_code_and_outputs_fit_on_a_laptop,
# test_each_chapter_shows_its_diagram).
PAGE_CHECKS = {
    "test_page_reads_offline_and_renders": ("desktop", 0),
    "test_figures_are_sharp_captioned_and_described": ("desktop", 1),
    "test_solution_dropdowns_open_on_click": ("desktop", 2),
    "test_figure_text_is_readable_on_a_phone": ("phone", 0),
    "test_small_screens_fit_and_navigate": (None, 1),
    "test_code_and_outputs_fit_on_a_laptop": (None, 1),
    "test_phone_numbers_formulas_names_and_titles": ("phone", 1),
    "test_phone_details": ("phone", 2),
    "test_each_chapter_shows_its_diagram": (None, 0),
}
SCREEN_ORDER = {"desktop": 0, "phone": 1, "tablet": 2, "wide": 3}


def _page_key(item: pytest.Item) -> tuple[str, int, int] | None:
    check = PAGE_CHECKS.get(item.originalname)
    if check is None or item.module.__name__.rsplit(".", 1)[-1] != "test_site":
        return None
    params = item.callspec.params
    screen = check[0] or params.get("screen")
    if screen not in SCREEN_ORDER:  # no built book: pytest's empty parametrization
        return None
    return str(params["page_path"]), SCREEN_ORDER[screen], check[1]


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    slots = [i for i, item in enumerate(items) if _page_key(item) is not None]
    ordered = sorted((items[i] for i in slots), key=_page_key)
    for i, item in zip(slots, ordered, strict=True):
        items[i] = item
    for item in items:
        key = _page_key(item)
        if key is not None:
            item.add_marker(pytest.mark.xdist_group(f"page:{key[0]}"))
        elif item.module.__name__.rsplit(".", 1)[-1] == "test_jupyterlab":
            item.add_marker(pytest.mark.xdist_group("jupyterlab"))
