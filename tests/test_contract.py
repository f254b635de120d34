"""The bad-input contract of every public companion name, in one table-driven test.

Each module's test file, ``tests/test_<module>.py`` (and, for the exercise checkers,
each ``tests/checks/test_checks_<chapter>.py`` that has one), defines ``BAD_INPUTS``: a
list of ``(public_name, thunk, exc_type, match_regex)`` (or ``pytest.param`` of those
four, to add marks such as a CUDA skip). ``public_name`` is a name in the module's
``__all__``, or ``Class.method``. Here every case runs and must raise ``exc_type`` (a
``TypeError`` or ``ValueError``) whose message matches ``match_regex`` and names an
argument of the function it calls. And every callable name in a module's ``__all__``
must have a case: a new public name without one fails
:func:`test_every_public_name_has_a_bad_input_case`. A name that takes no input a caller
could get wrong (a result record) is listed in the test file's ``NO_BAD_INPUTS``, name
-> why.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

TESTS = Path(__file__).resolve().parent

#: companion's public modules, in reading order (one not written yet is skipped)
MODULES = [
    "environment",
    "plotting",
    "positional",
    "rope",
    "extension",
    "relative",
    "rope_variants",
    "position_comparison",
    "hybrid_positions",
    "sink_comparison",
    "attention",
    "norm",
    "model",
    "capstone",
    "experiments",
    "decoder",
    "families",
    "gemma4",
    "mla",
    "llama4",
    "gpt_oss",
    "modern",
    "stability",
    "masks",
    "linear_attention",
    "qwen3_next",
    "performance",
    "kernels",
    "diagrams",
]

#: names a message may use for an argument that is not a parameter of the signature
ARGUMENTS_BEYOND_THE_SIGNATURE = {
    "environment.default_device": {"COMPANION_DEVICE"},  # read from the environment
    "positional.inverse_frequencies": {"head_dim"},  # `name`: the caller's argument
    "experiments.init_jitter": {"COMPANION_INIT_JITTER"},
    "experiments.seed_offset": {"COMPANION_SEED_OFFSET"},
    "experiments.seeds": {"COMPANION_SEED_OFFSET"},
    # **overrides: ModelConfig's fields
    "capstone.capstone_model": {
        "dim",
        "num_heads",
        "num_layers",
        "placement",
        "max_len",
    },
}


# ---- collecting the tables -----------------------------------------------------------


def _load(path: Path) -> ModuleType | None:
    """Import a test file under a private name; ``None`` when it skips itself (an
    optional
    dependency missing)."""
    name = "_contract_" + "_".join(path.relative_to(TESTS).with_suffix("").parts)
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except pytest.skip.Exception:
        return None
    sys.modules[name] = module
    return module


def _targets() -> dict[str, list[Path]]:
    """companion module -> the test files whose tables cover it. The checkers' tables
    (every ``tests/checks/test_*.py`` that has one) together cover ``companion.checks``,
    whose ``__init__`` exports every chapter's checkers."""
    targets = {
        name: [TESTS / f"test_{name}.py"]
        for name in MODULES
        if importlib.util.find_spec(f"companion.{name}") is not None
    }
    checks = [
        path
        for path in sorted((TESTS / "checks").glob("test_*.py"))
        if "BAD_INPUTS" in path.read_text()
    ]
    if checks:
        targets["checks"] = checks
    return targets


def _table(case: object) -> tuple[tuple, tuple]:
    """A case's four values and its marks (a plain tuple or a ``pytest.param``)."""
    return (case.values, case.marks) if hasattr(case, "values") else (case, ())


def _cases() -> list:
    cases = []
    for module, paths in _targets().items():
        for path in paths:
            tests = _load(path) if path.exists() else None
            tables = [  # BAD_INPUTS, and a module's section tables (*_BAD_INPUTS)
                (k, v) for k, v in sorted(vars(tests or object()).items())
                if k.endswith("BAD_INPUTS") and isinstance(v, list)
            ]  # fmt: skip
            for table, rows in tables:
                for i, case in enumerate(rows):
                    values, marks = _table(case)
                    prefix = "" if table == "BAD_INPUTS" else f"{table}-"
                    ident = f"{module}.{values[0]}-{path.stem}-{prefix}{i}"
                    cases.append(pytest.param(module, *values, marks=marks, id=ident))
    return cases


def _resolve(module: str, public_name: str) -> object:
    obj: object = importlib.import_module(f"companion.{module}")
    for part in public_name.split("."):
        obj = getattr(obj, part)
    return obj


def _argument_names(obj: object) -> set[str]:
    """Parameter names of a function, or of a class's constructor and public methods."""
    functions = [obj]
    if inspect.isclass(obj):
        functions = [obj.__init__] + [
            f
            for n, f in inspect.getmembers(obj, inspect.isfunction)
            if (not n.startswith("_") and n in vars(obj)) or n == "forward"
        ]
    names = set()
    for f in functions:
        try:
            names |= set(inspect.signature(f).parameters) - {"self"}
        except (TypeError, ValueError):  # a builtin without a signature
            continue
    return names


# ---- every case raises a named TypeError or ValueError -------------------------------


@pytest.mark.parametrize(
    ("module", "public_name", "thunk", "exc_type", "match"), _cases()
)
def test_bad_input_raises_a_named_error(module, public_name, thunk, exc_type, match):
    assert exc_type in (TypeError, ValueError), "the contract: TypeError or ValueError"
    with pytest.raises(exc_type, match=match) as info:
        thunk()
    assert type(info.value) is exc_type, f"raised a {type(info.value).__name__}"
    target = _resolve(module, public_name)
    if not callable(target):
        return  # a constant (the choices of an argument, a read-only mapping)
    arguments = _argument_names(target)
    arguments |= ARGUMENTS_BEYOND_THE_SIGNATURE.get(f"{module}.{public_name}", set())
    message = str(info.value)
    named = [a for a in arguments if re.search(rf"(?<![\w.]){re.escape(a)}\b", message)]
    assert named, f"the message names none of {sorted(arguments)}: {message!r}"


# ---- every public name has a case ----------------------------------------------------


@pytest.mark.parametrize(("module", "paths"), list(_targets().items()), ids=str)
def test_every_public_name_has_a_bad_input_case(module, paths):
    names, exempt = set(), {}
    for path in paths:
        if not path.exists():
            pytest.fail(f"companion.{module} has no test file {path.name}")
        tests = _load(path)
        if tests is None:
            pytest.skip(f"{path.name} skips itself (an optional dependency is missing)")
        if not hasattr(tests, "BAD_INPUTS"):
            pytest.fail(f"{path.name} defines no BAD_INPUTS for companion.{module}")
        exempt |= getattr(tests, "NO_BAD_INPUTS", {})
        for key, rows in vars(tests).items():  # BAD_INPUTS and section tables
            if key.endswith("BAD_INPUTS") and isinstance(rows, list):
                names |= {_table(case)[0][0] for case in rows}
    assert all(isinstance(why, str) and why for why in exempt.values()), "say why"
    for name in names:  # every case names something that exists
        _resolve(module, name)
    public = importlib.import_module(f"companion.{module}").__all__
    covered = {name.split(".")[0] for name in names} | set(exempt)
    missing = [n for n in public if callable(_resolve(module, n)) and n not in covered]
    assert not missing, f"companion.{module}'s public names with no case: {missing}"


def test_every_public_module_is_listed() -> None:
    """A new module of companion joins MODULES, so its names need cases too."""
    companion = TESTS.parent / "companion"
    public = {p.stem for p in companion.glob("*.py") if not p.stem.startswith("_")}
    assert public <= set(MODULES), f"add to MODULES: {sorted(public - set(MODULES))}"
