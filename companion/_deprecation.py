"""Deprecated aliases for names that moved to another module: one home for the warning.

A module whose names moved sets ``__getattr__ = moved_names(__name__, {name: module})``;
Python calls a module's ``__getattr__`` only for a name it does not define (PEP 562), so
``old.name`` and ``from old import name`` still answer, with a ``DeprecationWarning``
that names the new home, for one release. The new module is imported on first use, so
importing the old one does not import it.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping


def moved_names(module: str, moves: Mapping[str, str]) -> Callable[[str], object]:
    """A module ``__getattr__`` for the names in ``moves`` (name -> the module of
    ``companion`` it moved to, e.g. ``"experiments"``)."""
    moves = dict(moves)

    def __getattr__(name: str) -> object:
        if name not in moves:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        new = f"companion.{moves[name]}"
        warnings.warn(
            f"{module}.{name} moved to {new}.{name}; the alias goes in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(new), name)

    return __getattr__
