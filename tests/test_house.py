"""The house rules of companion (issue 33), checked on the source tree.

(a) Every module imports alone in a fresh interpreter, and the static import graph (every
``import`` statement of every module, those inside functions included, parsed with
``ast``, and ``importlib.import_module("companion.x")`` calls; not those of a module
``__getattr__``, which imports a deprecated name's new home on first use) has no
circle beyond ``KNOWN_CIRCLES``; (b) no module imports another module's
``_private`` name (``from companion.x import _name`` or ``x._name``) beyond
``KNOWN_PRIVATE_IMPORTS``; (c) no module is over ``MAX_LINES`` lines beyond ``OVERSIZE``.

Each allowance is held to exactly what is found: fixing a circle, a private import or an
oversized module fails the test until its entry is removed, so the lists only shrink.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "companion"
MAX_LINES = 1000

#: import circles (the modules of each strongly connected component of the graph)
KNOWN_CIRCLES: set[frozenset[str]] = set()

#: (importer, imported private name) pairs still to give a public home
KNOWN_PRIVATE_IMPORTS: set[tuple[str, str]] = set()

#: modules allowed over MAX_LINES for now: module -> why
OVERSIZE: dict[str, str] = {}


# ---- reading the package -------------------------------------------------------------


def _modules() -> dict[str, Path]:
    """Every module of companion (subpackages included): dotted name -> file."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _package_of(module: str) -> str:
    is_package = MODULES[module].name == "__init__.py"
    return module if is_package else module.rpartition(".")[0]


def _imports(module: str) -> tuple[set[str], set[str]]:
    """The companion modules ``module`` imports (anywhere in the file) and the private
    names of other modules it takes (``companion.x._name``)."""
    tree = ast.parse(MODULES[module].read_text(), filename=str(MODULES[module]))
    targets: set[str] = set()
    private: set[str] = set()
    aliases: dict[str, str] = {}  # local name -> companion module it is bound to
    deprecated = {  # a module __getattr__ imports a moved name's new home on first use
        id(n)
        for f in tree.body
        if isinstance(f, ast.FunctionDef) and f.name == "__getattr__"
        for n in ast.walk(f)
    }
    for node in ast.walk(tree):
        if (  # importlib.import_module("companion.x"): a late import, still an edge
            id(node) not in deprecated
            and isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value in MODULES
        ):
            targets.add(node.args[0].value)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name in MODULES:
                    targets.add(a.name)
                    if a.asname:
                        aliases[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from . import x, from .x import y
                anchor = _package_of(module).split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            if base not in MODULES:
                continue
            for a in node.names:
                sub = f"{base}.{a.name}"
                if sub in MODULES:  # a module: from companion import rope
                    targets.add(sub)
                    aliases[a.asname or a.name] = sub
                    continue
                targets.add(base)
                if a.name.startswith("_") and not a.name.startswith("__"):
                    private.add(f"{base}.{a.name}")
    for node in ast.walk(tree):  # rope._angles, performance._TensorWatch, ...
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and f"{aliases[node.value.id]}.{node.attr}" not in MODULES
        ):
            private.add(f"{aliases[node.value.id]}.{node.attr}")
    targets.discard(module)
    return targets, private


def _circles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: set[frozenset[str]] = set()

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.add(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


GRAPH = {m: _imports(m)[0] for m in MODULES}


# ---- (a) imports -----------------------------------------------------------------------


def test_the_graph_reader_sees_what_it_should() -> None:
    """The reader itself: a module-level import, one inside a function, one through
    ``importlib``, and a module imported through ``from companion import``."""
    assert "companion._validate" in GRAPH["companion.positional"]
    assert "companion.kernels" in GRAPH["companion.rope"]  # inside apply_rope
    assert "companion.checks._core" in GRAPH["companion.checks.relative"]
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == {
        frozenset("abc")
    }
    assert _circles({"a": {"b"}, "b": set()}) == set()


def test_import_circles_are_exactly_the_known_ones() -> None:
    found = _circles(GRAPH)
    new = found - KNOWN_CIRCLES
    fixed = KNOWN_CIRCLES - found
    assert not new, f"new import circles in companion: {[sorted(c) for c in new]}"
    assert not fixed, f"circles gone, remove from KNOWN_CIRCLES: {fixed}"


# One interpreter imports the third-party packages once, then forks a child per module that
# imports that module first: each child starts with no companion module loaded, as a fresh
# interpreter would, without paying torch's import 37 times (a fresh interpreter per module
# took minutes of `make test`). Where fork is missing (Windows), one interpreter per module.
_IMPORT_ALONE = r"""
import json, os, sys, traceback, warnings
import numpy, torch  # noqa: F401 - imported once, before the fork
modules = sys.argv[1:]
report = {}
for module in modules:
    if not hasattr(os, "fork"):
        break
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        warnings.simplefilter("error", DeprecationWarning)
        try:
            __import__(module)
            message = ""
        except BaseException:
            message = traceback.format_exc()
        os.write(write, message.encode())
        os._exit(0)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 65536):
        chunks.append(chunk)
    os.close(read)
    os.waitpid(pid, 0)
    report[module] = b"".join(chunks).decode()
print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def imported_alone() -> dict[str, str]:
    """module -> the traceback of importing it first ("" when it imported)."""
    out = subprocess.run(
        [sys.executable, "-c", _IMPORT_ALONE, *sorted(MODULES)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("module", sorted(MODULES))
def test_every_module_imports_alone_in_a_fresh_interpreter(
    module, imported_alone
) -> None:
    """Importing one module first (the way a learner's notebook may) works: no circle
    that only bites in some import order. ``companion.kernels`` needs Triton; where it
    is missing the module must say so."""
    if module in imported_alone:
        error = imported_alone[module]
    else:  # no fork on this platform
        out = subprocess.run(
            [
                sys.executable,
                "-W",
                "error::DeprecationWarning",
                "-c",
                f"import {module}",
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=300,
        )
        error = "" if out.returncode == 0 else out.stderr
    triton_modules = ("companion.kernels", "companion._triton")
    triton_modules += ("companion._flash", "companion._rope_kernel")
    if module in triton_modules and "needs Triton" in error:
        pytest.skip("Triton is not installed (companion.kernels says so)")
    assert not error, error[-2000:]


def test_the_import_check_sees_a_failing_import(tmp_path: Path) -> None:
    """The forked check reports an import that raises (and one that warns) as failed."""
    (tmp_path / "broken_mod.py").write_text("raise RuntimeError('boom')\n")
    (tmp_path / "warning_mod.py").write_text(
        "import warnings\nwarnings.warn('old', DeprecationWarning)\n"
    )
    (tmp_path / "fine_mod.py").write_text("x = 1\n")
    out = subprocess.run(
        [sys.executable, "-c", _IMPORT_ALONE, "broken_mod", "warning_mod", "fine_mod"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        timeout=300,
    )
    report = json.loads(out.stdout.strip().splitlines()[-1])
    if not report:
        pytest.skip("no os.fork on this platform")
    assert "boom" in report["broken_mod"]
    assert "DeprecationWarning" in report["warning_mod"]
    assert report["fine_mod"] == ""


# ---- (b) private names -----------------------------------------------------------------


def test_private_imports_are_exactly_the_known_ones() -> None:
    found = {(m, name) for m in MODULES for name in _imports(m)[1]}
    new = found - KNOWN_PRIVATE_IMPORTS
    fixed = KNOWN_PRIVATE_IMPORTS - found
    assert not new, f"private names imported across modules: {sorted(new)}"
    assert not fixed, f"no longer imported, remove from KNOWN_PRIVATE_IMPORTS: {fixed}"


# ---- (c) size --------------------------------------------------------------------------


def test_no_module_over_the_line_limit_beyond_the_allowance() -> None:
    lines = {m: len(p.read_text().splitlines()) for m, p in MODULES.items()}
    over = {m for m, n in lines.items() if n > MAX_LINES}
    assert all(isinstance(why, str) and why for why in OVERSIZE.values()), "say why"
    new = {m: lines[m] for m in over - set(OVERSIZE)}
    fixed = set(OVERSIZE) - over
    assert not new, f"modules over {MAX_LINES} lines: {new}"
    assert not fixed, f"now within {MAX_LINES} lines, remove from OVERSIZE: {fixed}"


def test_the_package_installs_with_every_subpackage() -> None:
    """pyproject's package list names every folder of companion/ that holds code (a
    non-editable install, ``pip install git+...``, would leave out one it does not name)."""
    import tomllib

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    declared = pyproject["tool"]["setuptools"].get("packages")
    if declared is None:  # automatic discovery finds every subpackage
        return
    folders = sorted(
        ".".join(p.parent.relative_to(ROOT).parts)
        for p in (ROOT / "companion").rglob("__init__.py")
        if "__pycache__" not in p.parts
    )
    missing = [f for f in folders if f not in declared]
    assert not missing, f"pyproject.toml's packages leave out {missing}"
