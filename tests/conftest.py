"""Shared fixtures: the devices every dtype/device-parametrised test runs on, and the
hypothesis profile."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch
from hypothesis import HealthCheck, settings

# Without a GPU, Triton kernels (companion/kernels.py) run through Triton's interpreter, which
# Triton chooses when it is first imported: set it before any test module imports Triton.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# `make claims`'s one-thread variant: OMP_NUM_THREADS=1 reaches torch's intra-op pool at
# start-up; set it explicitly too, as the variant promises.
if os.environ.get("OMP_NUM_THREADS") == "1":
    torch.set_num_threads(1)

settings.register_profile(
    "book",
    max_examples=60,
    deadline=None,  # CPU time on a shared 2-core machine varies; tests never assert on time
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,  # same examples on every run: a failure reproduces
)
settings.load_profile("book")

DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param(
        "cuda",
        id="cuda",
        marks=[
            pytest.mark.cuda,
            pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
        ],
    ),
]


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> torch.device:
    """Each test that takes ``device`` runs on the CPU and, when present, on CUDA."""
    return torch.device(request.param)


@pytest.fixture
def one_thread() -> Iterator[None]:
    """torch on one thread for the test (``pytestmark =
    pytest.mark.usefixtures("one_thread")`` in a file of small models or tensors): one
    thread is faster there, and two thrash on a busy 2-core CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--browser",
        action="store_true",
        default=False,
        help="run tests/browser: open the built book (_build/html) in headless Chromium",
    )


def pytest_ignore_collect(collection_path, config: pytest.Config) -> bool | None:
    """tests/browser checks the *built* book, so it runs only when asked (`make browser`,
    after the build), never as part of the unit tests."""
    if collection_path.name == "browser" and not config.getoption("--browser"):
        return True
    return None


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A ``trained(chapter=N)`` test records its chapter, for `make claims`'s table."""
    marker = item.get_closest_marker("trained")
    if marker is not None and "chapter" in marker.kwargs:
        item.user_properties.append(("chapter", str(marker.kwargs["chapter"])))
