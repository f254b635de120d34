r"""Checkers for the book's exercises.

A checker runs a learner's function on a handful of cases and compares the result with the
package's reference. When something is off it raises :class:`CheckError`, whose message says
*which property* failed, *on what input*, what was expected and what came, and, when the
answer matches a known mistake, names that mistake::

    >>> check_softmax(my_softmax)
    CheckError: check_softmax: 'rows sum to one along dim' failed on x=(2, 5) float32, dim=-1
      expected: tensor([...])
      got:      tensor([...])
      max |got - expected| = 0.31 at index (0, 2)
      This is the known mistake "softmax over the wrong axis": ...

Every checker returns ``True`` when all cases pass, so a solution cell can end with it.

Writing a checker (the pattern every chapter follows):

1. Build a few small, seeded cases, including edge cases (large values, odd shapes).
2. For each case, compute the reference with the package and call :func:`expect_close` with
   the learner's result, naming the property and the inputs.
3. Pass :func:`expect_close` the outputs of the *known wrong variants* of the exercise
   (``mistakes``), so a learner who made one of them is told which.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

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
    ) -> None:
        self.check = check
        self.prop = prop
        self.inputs = inputs
        self.expected = expected
        self.got = got
        self.mistake = mistake
        lines = [f"{check}: {prop!r} failed on {inputs}"]
        if expected or got:
            lines.append(f"  expected: {expected}")
            lines.append(f"  got:      {got}")
        if detail:
            lines.append(f"  {detail}")
        super().__init__("\n".join(lines))


@dataclass(frozen=True)
class Mistake:
    """A known wrong answer to an exercise.

    Args:
        name: a short name the learner will recognise, e.g. ``"sin and cos swapped"``.
        explanation: one or two sentences on what is wrong and how to fix it.
        output: what the wrong variant returns on the case being checked.
    """

    name: str
    explanation: str
    output: torch.Tensor


def describe_inputs(inputs: Mapping[str, object]) -> str:
    """Format a case's inputs for a message: tensors by shape and dtype, others by ``repr``."""
    parts = []
    for key, value in inputs.items():
        if isinstance(value, torch.Tensor):
            shape = tuple(value.shape)
            parts.append(f"{key}={shape} {str(value.dtype).removeprefix('torch.')}")
        else:
            parts.append(f"{key}={value!r}")
    return ", ".join(parts) if parts else "(no inputs)"


def _short(t: torch.Tensor, n: int = 6) -> str:
    flat = t.detach().flatten().to("cpu", torch.float64)
    head = ", ".join(f"{v:.4g}" for v in flat[:n].tolist())
    more = f", ... ({flat.numel()} values)" if flat.numel() > n else ""
    return f"[{head}{more}] shape={tuple(t.shape)}"


def expect_close(
    got: object,
    expected: torch.Tensor,
    *,
    check: str,
    prop: str,
    inputs: Mapping[str, object],
    atol: float = 1e-5,
    rtol: float = 1e-4,
    mistakes: Sequence[Mistake] = (),
    check_dtype: bool = False,
) -> None:
    """Raise :class:`CheckError` unless ``got`` matches ``expected`` within tolerance.

    The checks run in the order a learner needs them: is it a tensor, does the shape match,
    the dtype (if ``check_dtype``), is it finite, are the values close. When the values are
    not close, each known mistake is tried and named if the answer matches it.

    Args:
        got: the learner's result.
        expected: the reference result.
        check: the checker's name, for the message.
        prop: the property being checked, for the message.
        inputs: the case's inputs, described in the message with :func:`describe_inputs`.
        atol: absolute tolerance.
        rtol: relative tolerance.
        mistakes: known wrong answers on this case, tried in order.
        check_dtype: also require ``got.dtype == expected.dtype``.
    """
    where = describe_inputs(inputs)
    if not isinstance(got, torch.Tensor):
        raise CheckError(
            check,
            prop,
            where,
            "Return a torch.Tensor (convert NumPy arrays with torch.as_tensor).",
            expected=f"a torch.Tensor of shape {tuple(expected.shape)}",
            got=f"a {type(got).__name__}",
        )
    if got.shape != expected.shape:
        raise CheckError(
            check,
            prop,
            where,
            "The shapes differ: check which axes you reduce, stack or transpose.",
            expected=f"shape {tuple(expected.shape)}",
            got=f"shape {tuple(got.shape)}",
        )
    if check_dtype and got.dtype != expected.dtype:
        raise CheckError(
            check,
            prop,
            where,
            "The output should keep the dtype the exercise asks for.",
            expected=str(expected.dtype),
            got=str(got.dtype),
        )
    got64 = got.detach().to("cpu", torch.float64)
    exp64 = expected.detach().to("cpu", torch.float64)
    if not torch.isfinite(got64).all() and torch.isfinite(exp64).all():
        bad = (~torch.isfinite(got64)).nonzero()[0].tolist()
        raise CheckError(
            check,
            prop,
            where,
            f"Your result has NaN or inf (first at index {tuple(bad)}) where the reference is "
            "finite: look for an overflow (exp of a large number) or a division by zero.",
            expected=_short(expected),
            got=_short(got),
        )
    if torch.allclose(got64, exp64, atol=atol, rtol=rtol, equal_nan=True):
        return
    for mistake in mistakes:
        wrong = mistake.output.detach().to("cpu", torch.float64)
        if wrong.shape == got64.shape and torch.allclose(
            got64, wrong, atol=atol, rtol=rtol, equal_nan=True
        ):
            raise CheckError(
                check,
                prop,
                where,
                f'This is the known mistake "{mistake.name}": {mistake.explanation}',
                expected=_short(expected),
                got=_short(got),
                mistake=mistake.name,
            )
    err = (got64 - exp64).abs()
    err = torch.where(torch.isnan(err), torch.full_like(err, float("inf")), err)
    worst = torch.unravel_index(err.argmax(), err.shape)
    index = tuple(int(i) for i in worst)
    raise CheckError(
        check,
        prop,
        where,
        f"max |got - expected| = {err.max().item():.3g} at index {index} "
        f"(expected {exp64[index].item():.6g}, got {got64[index].item():.6g}; "
        f"tolerance atol={atol:g}, rtol={rtol:g}).",
        expected=_short(expected),
        got=_short(got),
    )


def _call(fn: Callable[..., object], check: str, inputs: Mapping[str, object]) -> object:
    """Call the learner's function, turning a crash into a readable :class:`CheckError`."""
    if not callable(fn):
        raise TypeError(f"{check} expects a function, got {type(fn).__name__}")
    try:
        return fn(**inputs)
    except Exception as exc:  # the learner's code may raise anything
        raise CheckError(
            check,
            "runs without error",
            describe_inputs(inputs),
            f"Calling your function raised {type(exc).__name__}: {exc}",
        ) from exc


# ---------------------------------------------------------------------------------------------
# Setting up (book/00_environment): a first exercise, to meet the checker pattern.
# ---------------------------------------------------------------------------------------------


def _reference_softmax(x: torch.Tensor, dim: int) -> torch.Tensor:
    return torch.softmax(x, dim=dim)


def check_softmax(softmax: Callable[..., torch.Tensor]) -> bool:
    r"""Check a learner's ``softmax(x, dim)`` against :func:`torch.softmax`.

    Properties checked: the values on small inputs; the normalisation along ``dim`` (not
    another axis); no overflow for logits of size ``1e4`` (subtract the maximum first).

    Args:
        softmax: a function ``softmax(x, dim) -> Tensor``.

    Returns:
        ``True`` when every case passes.

    Raises:
        CheckError: naming the property that failed, the input, expected and got.
    """
    check = "check_softmax"
    gen = torch.Generator().manual_seed(0)
    cases = [
        ("matches the definition exp(x_i) / sum_j exp(x_j)", torch.randn(2, 5, generator=gen), -1),
        ("normalises along dim, not another axis", torch.randn(3, 4, generator=gen), 0),
        (
            "stays finite for large logits (subtract the max first)",
            torch.tensor([[1.0e4, 0.0, -1.0e4], [1000.0, 1000.0, 999.0]]),
            -1,
        ),
    ]
    for prop, x, dim in cases:
        inputs = {"x": x, "dim": dim}
        got = _call(softmax, check, inputs)
        other = 0 if dim in (-1, x.ndim - 1) else -1
        mistakes = [
            Mistake(
                "softmax over the wrong axis",
                f"your weights sum to one along dim={other}; they must sum to one along "
                f"dim={dim}.",
                torch.softmax(x, dim=other),
            ),
            Mistake(
                "normalised by the sum of x instead of the sum of exp(x)",
                "divide exp(x) by exp(x).sum(dim, keepdim=True).",
                torch.exp(x) / x.sum(dim=dim, keepdim=True),
            ),
        ]
        expect_close(
            got,
            _reference_softmax(x, dim),
            check=check,
            prop=prop,
            inputs=inputs,
            atol=1e-6,
            rtol=1e-5,
            mistakes=mistakes,
        )
    return True


# ---------------------------------------------------------------------------------------------
# Chapter sections below: each chapter adds its checkers in its own section, in reading order.
# ---------------------------------------------------------------------------------------------
