r"""The shared core of the exercise checkers: cases, known mistakes, the comparison.

A chapter's checker is a generator of :class:`Case` objects wrapped by :func:`checker`;
the core calls the learner's function on each case and compares the answer with the
case's reference. Everything a learner meets is decided here, once:

* the learner's function is called **positionally**, in the order of ``Case.inputs``
  (the order the exercise states), on **deep copies** of the inputs, so parameter names
  are free (``get_slopes(n)`` is fine) and an answer that changes its input in place is
  judged on its result only;
* the answer may be a :class:`torch.Tensor`, a NumPy array, a nested list or a Python
  number: anything :func:`torch.as_tensor` turns into the right values (Python floats
  stay float64);
* a stub (``raise NotImplementedError``, or a body of ``pass``/``...``) is *not
  attempted yet*: the checker prints one line and returns ``False``, so Run All goes on;
* a wrong answer raises :class:`CheckError` naming the property, the input, what was
  expected and what came, with enough digits for the two to differ and the relative
  error, and names the known mistake (:class:`Mistake`) the answer matches.
"""

from __future__ import annotations

import copy
import dis
import functools
import inspect
import math
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from companion import _validate

__all__ = [
    "Case",
    "CheckError",
    "CheckResult",
    "Mistake",
    "checker",
    "describe_inputs",
    "expect_close",
    "known_mistake",
]

NOT_ATTEMPTED = (
    "{check}: not attempted yet - write your function above, then run this cell again."
)
PASSED = "✓ {check}: {cases}"
# A solution's code cells start with this line (the book's solution cells, which
# JupyterLab shows folded with their first line as the placeholder): a checker called from
# such a cell says its pass is the reference solution's, not the learner's.
REFERENCE_MARK = "# Reference solution"
PASSED_REFERENCE = "✓ {check} (reference solution): {cases}"


def _in_reference_solution() -> bool:
    """The checker runs in an IPython cell whose source starts with
    :data:`REFERENCE_MARK` (IPython stores a cell's source in ``In`` before running it)."""
    try:
        from IPython import get_ipython
    except ImportError:  # IPython is not a dependency of the companion package
        return False
    shell = get_ipython()
    cells = getattr(shell, "user_ns", {}).get("In") if shell is not None else None
    return bool(cells) and str(cells[-1]).lstrip().startswith(REFERENCE_MARK)


class CheckResult:
    """What a checker returns: true when every case passed, false for a stub.

    It compares equal to ``True``/``False`` and works with ``and``/``assert``; in
    IPython and Jupyter it displays nothing (the checker has already printed its one
    line), so no ``Out:`` appears under the call.
    """

    __slots__ = ("cases", "check", "passed")

    def __init__(self, check: str, passed: bool, cases: int) -> None:
        self.check = check
        self.passed = passed
        self.cases = cases

    def __bool__(self) -> bool:
        return self.passed

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (bool, CheckResult)):
            return self.passed == bool(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.passed)

    def __repr__(self) -> str:
        return f"CheckResult({self.check!r}, passed={self.passed}, cases={self.cases})"

    def _ipython_display_(self) -> None:
        """Show nothing: the line printed by the checker says it all."""


def passed_cases(n: int) -> str:
    """How many cases passed, in words: "the 1 case passes" or "all n cases pass"."""
    return "the 1 case passes" if n == 1 else f"all {n} cases pass"


def plural(n: int, noun: str) -> str:
    """``n`` and ``noun`` in words: "1 token", "4096 tokens"."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def tally(check: str, passed: Iterable[object]) -> CheckResult:
    """Count the cases ``passed`` yields (one item per case that passed), then print
    the checker's one line and return its :class:`CheckResult`: "✓ ... all N cases
    pass" (with "(reference solution)" after the checker's name when the cell that runs
    it is one of the book's solution cells) and a true result, or "not attempted yet" and a false one when a case meets
    the exercise's stub (:class:`NotAttempted`). A failed case raises
    :class:`CheckError` through it. :func:`checker` runs every checker's cases here; a
    checker whose cases are not :class:`Case` objects (``check_stablelm_port``) does
    too."""
    count = 0
    try:
        for _ in passed:
            count += 1
    except NotAttempted:
        print(NOT_ATTEMPTED.format(check=check))
        return CheckResult(check, False, count)
    line = PASSED_REFERENCE if _in_reference_solution() else PASSED
    print(line.format(check=check, cases=passed_cases(count)))
    return CheckResult(check, True, count)


def f64(value: object) -> torch.Tensor:
    """``value`` (a number or a nested list of them) as a float64 tensor: an expected
    answer computed in Python floats, compared at float64 precision."""
    return torch.as_tensor(value, dtype=torch.float64)


# ---- errors and mistakes -------------------------------------------------------------


class CheckError(AssertionError):
    """A learner's function failed a property of an exercise.

    Attributes:
        check: the checker's name, e.g. ``"check_softmax"``.
        prop: the property that failed, e.g. ``"rows sum to one"``.
        inputs: a readable description of the failing input.
        expected: what the reference gives (a short string).
        got: what the learner's function gave (a short string).
        mistake: the name of the known mistake the answer matches, or ``None``.
    """

    def __init__(
        self,
        check: str,
        prop: str,
        inputs: str,
        detail: str,
        *,
        expected: str = "",
        got: str = "",
        mistake: str | None = None,
        grid: str = "",
        in_detail: bool = False,
    ) -> None:
        self.check = check
        self.prop = prop
        self.inputs = inputs
        self.expected = expected
        self.got = got
        self.mistake = mistake
        self.detail = detail
        self.grid = grid
        # the numbers are shown once: a drawn grid replaces the flat preview, and a
        # detail that already reads "expected 9, got 11" is not followed by them again
        self._shown = bool(expected or got) and not grid and not in_detail
        lines = [f"{check}: {prop!r} failed on {inputs}"]
        if self._shown:
            lines.append(f"  expected: {expected}")
            lines.append(f"  got:      {got}")
        if detail:
            lines.append(f"  {detail}")
        if grid:
            lines.extend(f"  {row}" for row in grid.splitlines())
        super().__init__("\n".join(lines))

    def _render_traceback_(self) -> list[str]:
        """What IPython and Jupyter show instead of a traceback: the diagnosis in one
        line, then the failing input with expected and got in a second, and none of
        the checker's own frames. Outside IPython the exception is an ordinary one."""
        first = f"\x1b[31m✗ {self.check}\x1b[0m: {self.detail or self.prop}"
        second = f"  {self.prop!r} on {self.inputs}"
        if self.grid:  # a small mask: the two grids side by side, not flattened
            return [first, second + ":", *(f"    {r}" for r in self.grid.splitlines())]
        if self._shown:
            second += f": expected {self.expected}; got {self.got}"
        return [first, second]


@dataclass(frozen=True)
class Mistake:
    """A known wrong answer to an exercise.

    Args:
        name: a short name the learner will recognize, e.g. ``"sin and cos swapped"``.
        explanation: one or two sentences on what is wrong and how to fix it.
        output: what the wrong variant returns on the case being checked; for an answer
            that is a tuple, a tuple with ``None`` for the parts the mistake leaves
            right.
        atol: the mistake's own tolerance, when it is recognized by the size of the
            error rather than by exact values (angles in float32: each order of
            operations rounds differently); ``None`` uses the case's tolerance.
        rtol: likewise, relative.
    """

    name: str
    explanation: str
    output: object
    atol: float | None = None
    rtol: float | None = None

    def __post_init__(self) -> None:
        _validate.instance("name", self.name, str, "a str")
        _validate.instance("explanation", self.explanation, str, "a str")
        _validate.optional(_validate.real, "atol", self.atol, minimum=0.0)
        _validate.optional(_validate.real, "rtol", self.rtol, minimum=0.0)


def known_mistake(name: str, explanation: str) -> Callable[[object], Mistake]:
    """A known mistake whose output each case computes: ``known_mistake(name, why)``
    returns ``output -> Mistake(name, why, output)``, so a checker names the mistake once
    and feeds it each case's wrong output."""
    _validate.instance("name", name, str, "a str")
    _validate.instance("explanation", explanation, str, "a str")
    return functools.partial(Mistake, name, explanation)


class NotAttempted(Exception):
    """The learner's function is still the exercise's stub."""


def _known(
    mistake: Mistake, check: str, prop: str, where: str, **shown: str
) -> CheckError:
    """The error for an answer that matches ``mistake``: its name and explanation,
    with ``shown`` (``expected``, ``got``, ``grid``) as :class:`CheckError` takes them."""
    return CheckError(
        check,
        prop,
        where,
        f'This is the known mistake "{mistake.name}": {mistake.explanation}',
        mistake=mistake.name,
        **shown,
    )


# ---- describing values ---------------------------------------------------------------


def describe_inputs(inputs: Mapping[str, object]) -> str:
    """Format a case's inputs: tensors by shape and dtype, functions by name, others by
    ``repr``."""
    _validate.instance(
        "inputs", inputs, Mapping, "a mapping of argument names to values"
    )
    parts = []
    for key, value in inputs.items():
        if isinstance(value, Tensor):
            dtype = str(value.dtype).removeprefix("torch.")
            parts.append(f"{key}={tuple(value.shape)} {dtype}")
        elif callable(value):
            parts.append(f"{key}={getattr(value, '__name__', type(value).__name__)}")
        else:
            parts.append(f"{key}={value!r}")
    return ", ".join(parts) if parts else "(no inputs)"


def _short(t: Tensor, digits: int = 4, n: int = 6, start: int = 0) -> str:
    """The first ``n`` values of ``t`` (flattened) from flat index ``start``."""
    flat = t.detach().flatten().to("cpu", torch.float64)
    start = max(0, min(start, flat.numel() - n))
    head = ", ".join(f"{v:.{digits}g}" for v in flat[start : start + n].tolist())
    before = f"... (from flat index {start}) " if start else ""
    more = f", ... ({flat.numel()} values)" if flat.numel() > start + n else ""
    return f"[{before}{head}{more}] shape={tuple(t.shape)}"


def _number(value: float, digits: int = 4) -> str:
    """``value`` as a learner writes it: ``9`` for an integer value, else ``digits``
    significant digits."""
    if math.isfinite(value) and value == int(value) and abs(value) < 2**53:
        return str(int(value))
    return f"{value:.{digits}g}"


def _shown(t: Tensor, digits: int = 4, start: int = 0) -> str:
    """A value for the message: a 0-d answer as its number (``9``), a tensor as
    :func:`_short`'s preview."""
    if t.ndim == 0:
        return _number(t.detach().to("cpu", torch.float64).item(), digits)
    return _short(t, digits, start=start)


GRID_MAX = 12  # masks up to 12 x 12 are drawn as grids


def _grid(expected: Tensor, got: Tensor) -> str:
    """Two small 2-D masks side by side, one row per query: ``1`` where the entry is
    true, ``.`` where it is false; empty for anything larger or not 2-D."""
    if expected.ndim != 2 or max(expected.shape) > GRID_MAX:
        return ""

    def rows(t: Tensor) -> list[str]:
        return [" ".join("1" if v else "." for v in row) for row in t.tolist()]

    left, right = rows(expected), rows(got)
    width = max(len("expected"), len(left[0]) if left else 0)
    lines = [f"{'expected':<{width}}   got"]
    lines += [f"{a:<{width}}   {b}" for a, b in zip(left, right, strict=True)]
    return "\n".join(lines)


def _boolean_difference(
    got: Tensor, expected: Tensor, *, check: str, prop: str, where: str
) -> CheckError | None:
    """Compare a boolean answer as booleans (no tolerance): ``None`` when every entry
    agrees, else the error that says how many entries differ and where the first is,
    with small masks drawn as grids."""
    got_bool = got.detach().to("cpu") != 0
    exp_bool = expected.detach().to("cpu")
    wrong = got_bool != exp_bool
    if not wrong.any():
        return None
    first = tuple(int(i) for i in wrong.nonzero()[0].tolist())
    extra = int((got_bool & ~exp_bool).sum())
    missing = int((~got_bool & exp_bool).sum())
    kinds = [
        f"{n} {a} where {b} is expected"
        for n, a, b in ((extra, "True", "False"), (missing, "False", "True"))
        if n
    ]
    detail = (
        f"{int(wrong.sum())} of {wrong.numel()} entries differ ({', '.join(kinds)}); "
        f"the first at index {first}: expected {bool(exp_bool[first])}, got "
        f"{bool(got_bool[first])}."
    )
    return CheckError(
        check,
        prop,
        where,
        detail,
        expected=_short(exp_bool.to(torch.float64), 1),
        got=_short(got_bool.to(torch.float64), 1),
        grid=_grid(exp_bool, got_bool),
    )


def _shape_diagnosis(got: tuple[int, ...], expected: tuple[int, ...]) -> str:
    """Say in words how the shape ``got`` differs from ``expected``."""
    if len(got) != len(expected):
        diff = len(expected) - len(got)
        if diff > 0:
            words = f"{diff} axis fewer" if diff == 1 else f"{diff} axes fewer"
            hint = "did a sum, a mean or an index drop an axis that should stay?"
        else:
            words = f"{-diff} axis more" if diff == -1 else f"{-diff} axes more"
            hint = "did a stack, an unsqueeze or broadcasting add one?"
        return (
            f"Your answer has {len(got)} axes, {words} than the {len(expected)} "
            f"expected: {hint}"
        )
    differ = [i for i, (g, e) in enumerate(zip(got, expected, strict=True)) if g != e]
    if sorted(got) == sorted(expected):
        return (
            f"The shapes differ: the right sizes in another order (axes {differ} "
            "differ): an axis is transposed or a layout is swapped."
        )
    parts = []
    for i in differ:
        g, e = got[i], expected[i]
        ratio = ""
        if e and g == 2 * e:
            ratio = " (twice as long: one value per dimension where one per pair?)"
        elif g and e == 2 * g:
            ratio = " (half as long)"
        parts.append(f"axis {i} has length {g} where {e} is expected{ratio}")
    return "The shapes differ: " + "; ".join(parts) + "."


def _first_difference(got: Tensor, expected: Tensor, atol: float, rtol: float) -> int:
    """The flat index of the first entry out of tolerance (0 when none)."""
    bad = ~torch.isclose(got, expected, atol=atol, rtol=rtol, equal_nan=True)
    flat = bad.flatten().nonzero()
    return int(flat[0]) if flat.numel() else 0


def _digits(a: float, b: float) -> int:
    """The fewest significant digits (4 to 17) that print ``a`` and ``b`` apart."""
    for digits in range(4, 18):
        if f"{a:.{digits}g}" != f"{b:.{digits}g}":
            return digits
    return 17


def as_tensor(value: object) -> Tensor | None:
    """``value`` as a tensor when it holds numbers (tensor, array, nested list, number),
    else ``None``. Python floats become float64, as NumPy makes them."""
    if isinstance(value, Tensor):
        return value
    if value is None or isinstance(value, (str, bytes, Mapping)):
        return None
    try:
        return torch.as_tensor(np.asarray(value))
    except (TypeError, ValueError, RuntimeError):
        pass
    try:
        return torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError):
        pass
    try:
        parts = [torch.as_tensor(v) for v in value]  # type: ignore[union-attr]
        return torch.stack(parts)
    except (TypeError, ValueError, RuntimeError):
        return None


# ---- the comparison ------------------------------------------------------------------


def _close(a: Tensor, b: Tensor, atol: float, rtol: float) -> bool:
    return a.shape == b.shape and torch.allclose(
        a, b, atol=atol, rtol=rtol, equal_nan=True
    )


def expect_close(
    got: object,
    expected: Tensor,
    *,
    check: str,
    prop: str,
    inputs: Mapping[str, object],
    atol: float = 1e-5,
    rtol: float = 1e-4,
    mistakes: Sequence[Mistake] = (),
    check_dtype: bool = False,
    integer: bool | str = False,
) -> None:
    """Raise :class:`CheckError` unless ``got`` matches ``expected`` within tolerance.

    The checks run in the order a learner needs them: does it hold numbers, the shape,
    the dtype (exact if ``check_dtype``, an integer dtype if ``integer``), is it finite,
    are the values close. When they are not, each known mistake is tried in order and
    named if the answer matches it; otherwise the worst entry is reported with enough
    digits to differ and its relative error.

    Args:
        got: the learner's result: a tensor, a NumPy array, a nested list or a number.
        expected: the reference result.
        check: the checker's name, for the message.
        prop: the property being checked, for the message.
        inputs: the case's inputs, described with :func:`describe_inputs`.
        atol: absolute tolerance.
        rtol: relative tolerance.
        mistakes: known wrong answers on this case, tried in order.
        check_dtype: also require ``got``'s dtype to be ``expected``'s.
        integer: also require an integer dtype: ``True`` for class indices (a float
            answer is the known mistake "float targets", as ``F.cross_entropy`` reads
            targets), or a string saying why the answer must be integers (it indexes a
            table, ...), shown when it is not.
    """
    _validate.tensor("expected", expected, dtype=None)
    _validate.instance("integer", integer, (bool, str), "a bool or a reason (str)")
    _validate.real("atol", atol, minimum=0.0)
    _validate.real("rtol", rtol, minimum=0.0)
    where = describe_inputs(inputs)
    tensor = as_tensor(got)
    if tensor is None:
        raise CheckError(
            check,
            prop,
            where,
            "Return a number (int or float, or a 0-d tensor)."
            if expected.ndim == 0
            else "Return a torch.Tensor (NumPy arrays and lists of numbers are fine too).",
            expected="a number"
            if expected.ndim == 0
            else f"a tensor of shape {tuple(expected.shape)}",
            got=_validate.describe(got),
        )
    if tensor.shape != expected.shape:
        for mistake in mistakes:
            wrong = as_tensor(mistake.output)
            if wrong is None or wrong.shape != tensor.shape:
                continue
            m_atol = atol if mistake.atol is None else mistake.atol
            m_rtol = rtol if mistake.rtol is None else mistake.rtol
            if _close(
                tensor.detach().to("cpu", torch.float64),
                wrong.detach().to("cpu", torch.float64),
                m_atol,
                m_rtol,
            ):
                raise _known(
                    mistake,
                    check,
                    prop,
                    where,
                    expected=f"shape {tuple(expected.shape)}",
                    got=f"shape {tuple(tensor.shape)}",
                )
        raise CheckError(
            check,
            prop,
            where,
            _shape_diagnosis(tuple(tensor.shape), tuple(expected.shape)),
            expected=f"shape {tuple(expected.shape)}",
            got=f"shape {tuple(tensor.shape)}",
        )
    if check_dtype and tensor.dtype != expected.dtype:
        how = str(expected.dtype).removeprefix("torch.")
        got64 = tensor.detach().to("cpu", torch.float64)
        # a known mistake of another dtype than the reference's (an additive float
        # mask where a boolean one is asked for): named by its values, exactly
        for mistake in mistakes:
            wrong = as_tensor(mistake.output)
            if wrong is not None and wrong.dtype != expected.dtype:
                if _close(got64, wrong.detach().to("cpu", torch.float64), 0.0, 0.0):
                    raise _known(
                        mistake,
                        check,
                        prop,
                        where,
                        expected=str(expected.dtype),
                        got=str(tensor.dtype),
                    )
        fix = f"compute in {how}, or end with .to(torch.{how})"
        if expected.dtype == torch.bool and not bool(
            ((got64 == 0) | (got64 == 1)).all()
        ):  # .to(torch.bool) would make every nonzero entry True
            odd = got64[(got64 != 0) & (got64 != 1)][0].item()
            fix = (
                f"it holds values other than 0 and 1, such as {_number(odd)}: "
                ".to(torch.bool) would make every nonzero entry True, so compute the "
                "True/False answer itself"
            )
        raise CheckError(
            check,
            prop,
            where,
            f"The exercise asks for {how}; your answer is "
            f"{str(tensor.dtype).removeprefix('torch.')} ({fix}).",
            expected=str(expected.dtype),
            got=str(tensor.dtype),
        )
    not_integer = tensor.dtype.is_floating_point or tensor.dtype.is_complex
    if isinstance(integer, str) and not_integer:
        raise CheckError(
            check,
            prop,
            where,
            f"Return an integer tensor (torch.long): {integer}.",
            expected=f"an integer dtype such as {expected.dtype}",
            got=str(tensor.dtype),
        )
    if integer is True and not_integer:
        raise CheckError(
            check,
            prop,
            where,
            'This is the known mistake "float targets": targets are class indices, so '
            "return an integer tensor (torch.long), as F.cross_entropy requires; it "
            "reads a float tensor as class probabilities.",
            expected=f"an integer dtype such as {expected.dtype}",
            got=str(tensor.dtype),
            mistake="float targets",
        )
    got64 = tensor.detach().to("cpu", torch.float64)
    exp64 = expected.detach().to("cpu", torch.float64)
    if expected.dtype == torch.bool:  # a mask: compared as booleans, exactly
        wrong_mask = _boolean_difference(
            tensor, expected, check=check, prop=prop, where=where
        )
        if wrong_mask is None:
            return
        for mistake in mistakes:
            wrong = as_tensor(mistake.output)
            if wrong is not None and wrong.shape == tensor.shape:
                if torch.equal(wrong.detach().to("cpu") != 0, tensor.detach() != 0):
                    raise _known(
                        mistake,
                        check,
                        prop,
                        where,
                        expected=wrong_mask.expected,
                        got=wrong_mask.got,
                        grid=wrong_mask.grid,
                    )
        raise wrong_mask
    if not torch.isfinite(got64).all() and torch.isfinite(exp64).all():
        bad = tuple((~torch.isfinite(got64)).nonzero()[0].tolist())
        raise CheckError(
            check,
            prop,
            where,
            f"Your result has NaN or inf (first at index {bad}) where the reference is "
            "finite: look for an overflow (exp of a large number) or a division by "
            "zero.",
            expected=_short(expected),
            got=_short(tensor),
        )
    if _close(got64, exp64, atol, rtol):
        return
    err = (got64 - exp64).abs()
    err = torch.where(torch.isnan(err), torch.full_like(err, math.inf), err)
    index = tuple(int(i) for i in torch.unravel_index(err.argmax(), err.shape))
    e, g = exp64[index].item(), got64[index].item()
    # enough digits that the largest difference and the first one (where the previews
    # start) both print apart
    first = _first_difference(got64, exp64, atol, rtol)
    digits = max(
        _digits(e, g),
        _digits(exp64.flatten()[first].item(), got64.flatten()[first].item()),
    )
    for mistake in mistakes:
        wrong = as_tensor(mistake.output)
        m_atol = atol if mistake.atol is None else mistake.atol
        m_rtol = rtol if mistake.rtol is None else mistake.rtol
        if wrong is not None and _close(
            got64, wrong.detach().to("cpu", torch.float64), m_atol, m_rtol
        ):
            start = first - 1 if first else 0
            raise _known(
                mistake,
                check,
                prop,
                where,
                expected=_shown(expected, digits, start=start),
                got=_shown(tensor, digits, start=start),
            )
    relative = f"{abs(g - e) / abs(e):.2g}" if e != 0 else "inf"
    if exp64.ndim == 0:  # a number: "expected 9, got 11", no shapes or indices
        integers = e == int(e) and g == int(g) if math.isfinite(g) else False
        detail = f"expected {_number(e, digits)}, got {_number(g, digits)}"
        if not integers:
            detail += (
                f"; relative error {relative} (tolerance atol={atol:g}, rtol={rtol:g})"
            )
        raise CheckError(
            check,
            prop,
            where,
            detail + ".",
            expected=_number(e, digits),
            got=_number(g, digits),
            in_detail=True,
        )
    first_index = tuple(
        int(i) for i in torch.unravel_index(torch.tensor(first), err.shape)
    )
    count = int(
        (~torch.isclose(got64, exp64, atol=atol, rtol=rtol, equal_nan=True)).sum()
    )
    first_text = (
        f"first differs at index {first_index}; "
        if first_index != index and exp64.numel() > 1
        else ""
    )
    exact = atol == 0 and rtol == 0 and bool((exp64 == exp64.round()).all())
    # whole numbers compared exactly (indices, counts): no tolerance to speak of
    closing = "" if exact else f"; relative error {relative}; tolerance atol={atol:g}, "
    closing += "" if exact else f"rtol={rtol:g}"
    raise CheckError(
        check,
        prop,
        where,
        f"{count} of {exp64.numel()} values differ; {first_text}max |got - expected| "
        f"= {err.max().item():.3g} at index {index} (expected {e:.{digits}g}, got "
        f"{g:.{digits}g}{closing}).",
        expected=_short(expected, digits, start=first - 1 if first else 0),
        got=_short(tensor, digits, start=first - 1 if first else 0),
    )


# ---- calling the learner's function --------------------------------------------------


def _is_stub_body(fn: Callable[..., object]) -> bool:
    """``fn``'s body only returns ``None`` (``pass``, ``...``, a docstring)."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return False
    ops = [
        (i.opname, i.argval)
        for i in dis.get_instructions(code)
        if i.opname not in ("RESUME", "NOP", "CACHE")
    ]
    return ops in (
        [("LOAD_CONST", None), ("RETURN_VALUE", None)],
        [("RETURN_CONST", None)],
    )


def _raised_by_library(exc: BaseException) -> bool:
    """The exception was raised inside an installed package (torch, NumPy), not by the
    learner's own code."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return False
    filename = tb.tb_frame.f_code.co_filename
    return any(
        p in filename
        for p in ("site-packages", "dist-packages", f"{os.sep}torch{os.sep}")
    )


def _where_raised(exc: BaseException) -> str:
    """`` (line N: `code`)`` for the learner's own frame nearest the error, if any."""
    tb = exc.__traceback__
    found = ""
    while tb is not None:
        code = tb.tb_frame.f_code
        name = code.co_filename
        own = not any(
            p in name for p in ("site-packages", "dist-packages", f"{os.sep}companion")
        )
        if own and not name.startswith("<frozen"):
            import linecache

            line = linecache.getline(name, tb.tb_lineno).strip()
            found = f" (in {code.co_name}, line {tb.tb_lineno}"
            found += f": `{line}`)" if line else ")"
        tb = tb.tb_next
    return found


def _hint_for(exc: BaseException, args: Sequence[object]) -> str:
    """A sentence for torch's shape errors that learners meet most."""
    text = str(exc)
    batched = any(isinstance(a, Tensor) and a.dim() > 2 for a in args)
    if "size of tensor a" in text and "must match" in text and batched:
        return (
            ". The inputs are batched: `x.T` reverses ALL axes, batch included; "
            "transpose the last two with `x.mT` or `x.transpose(-2, -1)`."
        )
    if "cannot be multiplied" in text or "mat1 and mat2" in text:
        return (
            ". A matrix product needs (..., n, k) @ (..., k, m): transpose the "
            "second operand's last two axes (`x.mT`) or check which axis is which."
        )
    return ""


def call(fn: Callable[..., object], check: str, inputs: Mapping[str, object]) -> object:
    """Call ``fn`` positionally with deep copies of ``inputs`` (in their order).

    A stub raises :class:`NotAttempted`; any other exception becomes a
    :class:`CheckError`
    that shows the call."""
    args = copy.deepcopy(list(inputs.values()))
    shown = f"{getattr(fn, '__name__', 'your function')}({', '.join(inputs)})"
    try:
        out = fn(*args)
    except NotImplementedError as exc:
        if _raised_by_library(exc):
            raise CheckError(
                check,
                "runs without error",
                describe_inputs(inputs),
                f"Calling {shown} raised NotImplementedError inside a library: {exc}",
            ) from exc
        raise NotAttempted(check) from None
    except Exception as exc:  # the learner's code may raise anything
        raise CheckError(
            check,
            "runs without error",
            describe_inputs(inputs),
            f"Calling {shown} (positional arguments, in this order) raised "
            f"{type(exc).__name__}: {exc}{_where_raised(exc)}{_hint_for(exc, args)}",
        ) from exc
    if out is None:
        if _is_stub_body(fn):
            raise NotAttempted(check)
        raise CheckError(
            check,
            "returns a value",
            describe_inputs(inputs),
            f"{shown} returned None: end it with a return statement.",
        )
    return out


# ---- cases and checkers --------------------------------------------------------------


@dataclass
class Case:
    """One call of the learner's function and the answer it must give.

    Args:
        prop: the property this case checks, shown in the message.
        inputs: the arguments, in the order the exercise states (passed positionally).
        expected: the reference answer; a tuple of tensors when the answer is a tuple.
        mistakes: known wrong answers on this case, tried in order.
        atol: absolute tolerance.
        rtol: relative tolerance.
        check_dtype: require the reference's exact dtype.
        integer: require an integer dtype: ``True`` for class indices, or a string
            saying why (see :func:`expect_close`).
        parts: names of the parts of a tuple answer, e.g. ``("cos", "sin")``.
        learner: which of the checker's function arguments to call (its parameter name);
            ``None``: the first.
        shown: the inputs to show in a message, when they differ from ``inputs``.
    """

    prop: str
    inputs: dict[str, object]
    expected: object
    mistakes: Sequence[Mistake] = ()
    atol: float = 1e-5
    rtol: float = 1e-4
    check_dtype: bool = False
    integer: bool | str = False
    parts: tuple[str, ...] | None = None
    learner: str | None = None
    shown: dict[str, object] | None = field(default=None)

    def __post_init__(self) -> None:
        _validate.instance("prop", self.prop, str, "a str")
        _validate.instance(
            "inputs", self.inputs, dict, "a dict of argument names to values"
        )
        _validate.real("atol", self.atol, minimum=0.0)
        _validate.real("rtol", self.rtol, minimum=0.0)


def run_case(check: str, fn: Callable[..., object], case: Case) -> None:
    """Call ``fn`` on ``case`` and compare its answer (each part of a tuple answer)."""
    got = call(fn, check, case.inputs)
    shown = case.inputs if case.shown is None else case.shown
    options = {
        "check": check,
        "inputs": shown,
        "atol": case.atol,
        "rtol": case.rtol,
        "check_dtype": case.check_dtype,
        "integer": case.integer,
    }
    if case.parts is None:
        expect_close(
            got, case.expected, prop=case.prop, mistakes=case.mistakes, **options
        )
        return
    parts = case.parts
    if not (isinstance(got, (tuple, list)) and len(got) == len(parts)):
        kind = "a pair" if len(parts) == 2 else f"a tuple of {len(parts)}"
        raise CheckError(
            check,
            f"returns ({', '.join(parts)})",
            describe_inputs(shown),
            f"Return {kind} ({', '.join(parts)}).",
            expected=f"{kind} of tensors",
            got=_validate.describe(got),
        )
    for k, part in enumerate(parts):
        mistakes = [
            Mistake(m.name, m.explanation, m.output[k], m.atol, m.rtol)  # type: ignore
            for m in case.mistakes
            if m.output[k] is not None  # type: ignore[index]
        ]
        expected = case.expected[k]  # type: ignore[index]
        prop = f"{case.prop} ({part})"
        expect_close(got[k], expected, prop=prop, mistakes=mistakes, **options)


_RETURNS = """
    Returns:
        A ``CheckResult``, true (after printing "✓ ... all N cases pass") when
        every case passes; false, after printing "not attempted yet", for the
        exercise's stub. It compares equal to ``True``/``False`` and shows no ``Out:``
        in Jupyter.

    Raises:
        CheckError: naming the property that failed, the input, expected and got.
    """


def checker(body: Callable[..., Iterable[Case]]) -> Callable[..., CheckResult]:
    """Make a checker from ``body``, a generator of :class:`Case` objects.

    ``body``'s positional parameters are the learner's functions (validated as
    callables, a ``TypeError`` naming the parameter otherwise); its keyword-only
    parameters are options the body validates itself. The checker prints one line and
    returns a true ``CheckResult`` when every case passes, prints a "not attempted
    yet" line and returns a false one for a stub, and raises :class:`CheckError` on the
    first case that fails.
    """
    _validate.callable_("body", body)
    signature = inspect.signature(body)
    learners = [
        name
        for name, p in signature.parameters.items()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    check = body.__name__
    if body.__doc__ and "Returns:" not in body.__doc__:
        body.__doc__ = body.__doc__.rstrip() + "\n" + _RETURNS

    @functools.wraps(body)
    def run(*args: object, **kwargs: object) -> CheckResult:
        bound = signature.bind(*args, **kwargs)
        fns = {
            name: _validate.callable_(name, bound.arguments[name]) for name in learners
        }

        def passed() -> Iterator[None]:
            for case in body(*args, **kwargs):
                run_case(check, fns[case.learner or learners[0]], case)
                yield None

        return tally(check, passed())

    return run
