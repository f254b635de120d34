"""Helpers shared by the checker tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from companion.checks import CheckError


def assert_named(call: Callable[[], object], name: str) -> CheckError:
    """``call()`` raises a :class:`CheckError` that names the known mistake ``name``."""
    with pytest.raises(CheckError) as info:
        call()
    assert info.value.mistake == name, str(info.value)
    assert f'known mistake "{name}"' in str(info.value)
    return info.value


@pytest.fixture
def named() -> Callable[[Callable[[], object], str], CheckError]:
    """The :func:`assert_named` helper, as a fixture."""
    return assert_named
