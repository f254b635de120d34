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


class _NotAttempted(Exception):
    """Raised inside a checker when the learner's function is still the stub."""


def _call(fn: Callable[..., object], check: str, inputs: Mapping[str, object]) -> object:
    """Call the learner's function, turning a crash into a readable :class:`CheckError`."""
    if not callable(fn):
        raise TypeError(f"{check} expects a function, got {type(fn).__name__}")
    try:
        return fn(**inputs)
    except NotImplementedError:
        raise _NotAttempted(check) from None
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
                f"your weights sum to one along dim={other}; they must sum to one along dim={dim}.",
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


# ---- Sinusoidal positional encoding (book/01_sinusoidal_encoding) ----


def _sinusoid_table(
    num_positions: int,
    dim: int,
    *,
    base: float = 10000.0,
    pair_exponent: Callable[[torch.Tensor, int], torch.Tensor] | None = None,
    swap: bool = False,
    halves: bool = False,
    scale: float = 1.0,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """Wrong (and right) variants of the sinusoidal table, for naming mistakes.

    ``pair_exponent(j, dim)`` maps the column index ``j`` to the exponent ``e`` in
    ``omega = base**(-e)``; by default ``e = 2i/D`` over the pair index ``i``.
    """
    if pair_exponent is None:
        i = torch.arange(dim // 2, dtype=dtype)
        omega = scale * base ** (-2.0 * i / dim)  # (D/2,)
    else:
        omega = scale * base ** (-pair_exponent(torch.arange(dim, dtype=dtype), dim))  # (D,)
    pos = torch.arange(num_positions, dtype=dtype)[:, None]
    if omega.numel() == dim:  # one frequency per column
        ang = pos * omega  # (L, D)
        out = ang.clone()
        first, second = (torch.cos, torch.sin) if swap else (torch.sin, torch.cos)
        out[:, 0::2] = first(ang[:, 0::2])
        out[:, 1::2] = second(ang[:, 1::2])
        return out.to(torch.float32)
    ang = pos * omega  # (L, D/2)
    first, second = (torch.cos, torch.sin) if swap else (torch.sin, torch.cos)
    if halves:
        return torch.cat((first(ang), second(ang)), dim=-1).to(torch.float32)
    return torch.stack((first(ang), second(ang)), dim=-1).flatten(-2).to(torch.float32)


def check_sinusoidal_encoding(fn: Callable[..., torch.Tensor]) -> bool:
    r"""Check a learner's ``fn(num_positions, dim) -> (L, D)`` sinusoidal table.

    Reference: :func:`companion.positional.sinusoidal_encoding` (interleaved layout, base
    10000). Properties checked: the values on small tables; accuracy at large positions
    (angles in float64). Named mistakes: sin and cos swapped, exponent ``i/D`` instead of
    ``2i/D``, pair index running over all ``D`` columns, base 1000, the wrong sign in the
    exponent, a factor :math:`2\pi` in the frequency, the halves layout, float32 angles.

    Args:
        fn: a function ``fn(num_positions, dim)`` returning a tensor of shape ``(L, D)``.

    Returns:
        ``True`` when every case passes.

    Raises:
        CheckError: naming the property that failed, the input, expected and got.
    """
    from companion.positional import sinusoidal_encoding

    check = "check_sinusoidal_encoding"
    cases = [
        (
            "matches PE(pos, 2i) = sin(pos w_i), PE(pos, 2i+1) = cos(pos w_i)",
            3,
            4,
            1e-5,
        ),
        ("matches the formula on a wider table", 40, 16, 1e-5),
        ("accurate at large positions (form the angles in float64)", 20000, 8, 2e-6),
    ]
    for prop, num_positions, dim, atol in cases:
        inputs = {"num_positions": num_positions, "dim": dim}
        got = _call(fn, check, inputs)
        mistakes = [
            Mistake(
                "sin and cos swapped",
                "column 2i holds the sine and column 2i+1 the cosine, so PE(0) = [0, 1, 0, 1, ...].",
                _sinusoid_table(num_positions, dim, swap=True),
            ),
            Mistake(
                "exponent i/D instead of 2i/D",
                "with pair index i = 0 .. D/2-1 the frequency is 10000**(-2i/D); with i/D the "
                "lowest frequency is only 10000**(-1/2).",
                _sinusoid_table(num_positions, dim, pair_exponent=lambda j, d: (j // 2) / d),
            ),
            Mistake(
                "pair index running over all D dims",
                "both columns 2i and 2i+1 of a pair share the frequency 10000**(-2i/D), where "
                "i = column // 2 is the pair index; you used the column index in the exponent.",
                _sinusoid_table(num_positions, dim, pair_exponent=lambda j, d: 2.0 * j / d),
            ),
            Mistake(
                "column index j/D in the exponent",
                "the cosine column 2i+1 shares the frequency of the sine column 2i: the exponent "
                "is 2*(j // 2)/D for column j, not j/D.",
                _sinusoid_table(num_positions, dim, pair_exponent=lambda j, d: j / d),
            ),
            Mistake(
                "base 1000 instead of 10000",
                "the frequencies run from 1 down to about 1/10000: the base is 10000.",
                _sinusoid_table(num_positions, dim, base=1000.0),
            ),
            Mistake(
                "exponent with the wrong sign",
                "the frequency 10000**(-2i/D) shrinks with i (the angle is pos / 10000**(2i/D)); "
                "you multiplied pos by 10000**(2i/D).",
                _sinusoid_table(num_positions, dim, pair_exponent=lambda j, d: -2.0 * (j // 2) / d),
            ),
            Mistake(
                "a factor 2*pi in the frequency",
                "the angle is pos * 10000**(-2i/D), with no 2*pi: the wavelengths are "
                "2*pi * 10000**(2i/D).",
                _sinusoid_table(num_positions, dim, scale=2.0 * torch.pi),
            ),
            Mistake(
                "halves layout instead of interleaved",
                "[all sines, all cosines] is the tensor2tensor layout; this exercise asks for the "
                "paper's interleaved one: sin in even columns, cos in odd columns.",
                _sinusoid_table(num_positions, dim, halves=True),
            ),
        ]
        reference = sinusoidal_encoding(num_positions, dim)
        try:
            expect_close(
                got,
                reference,
                check=check,
                prop=prop,
                inputs=inputs,
                atol=atol,
                rtol=0.0,
                mistakes=mistakes,
            )
        except CheckError as err:
            # float32 angles are wrong by a few 1e-3 at pos = 2e4 and the exact error depends
            # on the order of operations, so this mistake is recognised by its size.
            if not isinstance(got, torch.Tensor) or got.shape != reference.shape:
                raise
            gap = (got.detach().to("cpu", torch.float64) - reference.double()).abs().max()
            if err.mistake is None and num_positions > 1000 and gap < 0.05:
                raise CheckError(
                    check,
                    prop,
                    describe_inputs(inputs),
                    'This is the known mistake "angles computed in float32": pos * w_i in '
                    "float32 is off by up to about pos * 6e-8 radians (hundredths of a radian near "
                    "pos = 1e6); form "
                    "positions and frequencies in float64, take sin/cos, then cast.",
                    expected=_short(reference),
                    got=_short(got),
                    mistake="angles computed in float32",
                ) from None
            raise
    return True


def check_wavelengths(fn: Callable[..., torch.Tensor]) -> bool:
    r"""Check a learner's ``fn(dim) -> (D/2,)`` wavelengths :math:`\lambda_i = 2\pi/\omega_i`.

    Reference: :func:`companion.positional.sinusoidal_wavelengths`. Named mistakes: the
    frequency instead of the wavelength, a period without :math:`2\pi`, exponent ``i/D``.

    Args:
        fn: a function ``fn(dim)`` returning a tensor of shape ``(D // 2,)``.

    Returns:
        ``True`` when every case passes.

    Raises:
        CheckError: naming the property that failed, the input, expected and got.
    """
    from companion.positional import sinusoidal_frequencies, sinusoidal_wavelengths

    check = "check_wavelengths"
    for dim in (4, 16, 512):
        inputs = {"dim": dim}
        got = _call(fn, check, inputs)
        omega = sinusoidal_frequencies(dim)
        i = torch.arange(dim // 2, dtype=torch.float64)
        mistakes = [
            Mistake(
                "frequency instead of wavelength",
                "the wavelength is the number of positions per full turn, 2*pi / w_i.",
                omega,
            ),
            Mistake(
                "wavelength without the 2*pi",
                "sin(pos * w) repeats when pos * w grows by 2*pi, so the period is 2*pi / w_i.",
                1.0 / omega,
            ),
            Mistake(
                "exponent i/D instead of 2i/D",
                "w_i = 10000**(-2i/D) for the pair index i = 0 .. D/2-1.",
                2.0 * torch.pi * 10000.0 ** (i / dim),
            ),
        ]
        expect_close(
            got,
            sinusoidal_wavelengths(dim),
            check=check,
            prop="wavelength of pair i is 2*pi * 10000**(2i/D)",
            inputs=inputs,
            atol=0.0,
            rtol=1e-5,
            mistakes=mistakes,
        )
    return True


def check_shift_matrix(fn: Callable[..., torch.Tensor]) -> bool:
    r"""Check a learner's ``fn(k, dim) -> (D, D)`` shift matrix :math:`T(k)`.

    Reference: :func:`companion.positional.shift_matrix`, with
    :math:`\mathrm{PE}(\text{pos}+k) = \mathrm{PE}(\text{pos})\,T(k)` for row vectors.
    Named mistakes: the transposed blocks (the column-vector rotation, signs of the sines
    flipped), the angle ``k`` instead of ``k * w_i``, the rotation by ``pos``-free
    ``PE(k)`` laid on the diagonal.

    Args:
        fn: a function ``fn(k, dim)`` returning a tensor of shape ``(D, D)``.

    Returns:
        ``True`` when every case passes.

    Raises:
        CheckError: naming the property that failed, the input, expected and got.
    """
    from companion.positional import shift_matrix, sinusoidal_frequencies

    check = "check_shift_matrix"
    for k, dim in ((1, 4), (7, 8), (-3, 6), (2.5, 8)):
        inputs = {"k": k, "dim": dim}
        got = _call(fn, check, inputs)
        reference = shift_matrix(k, dim)
        ones = torch.ones(dim // 2, dtype=torch.float64)
        c, s = torch.cos(k * ones), torch.sin(k * ones)
        raw_angle = torch.block_diag(
            *torch.stack((torch.stack((c, -s), -1), torch.stack((s, c), -1)), -2)
        )
        omega = sinusoidal_frequencies(dim)
        diag = torch.diag(torch.stack((torch.sin(k * omega), torch.cos(k * omega)), -1).flatten())
        mistakes = [
            Mistake(
                "sin entries with the wrong sign (blocks transposed)",
                "for a ROW vector [sin a, cos a] times the block, the block must be "
                "[[cos b, -sin b], [sin b, cos b]]; you built the column-vector rotation, "
                "which shifts by -k.",
                reference.mT,
            ),
            Mistake(
                "angle k instead of k * w_i",
                "block i rotates by k * w_i, the angle pair i advances over k positions.",
                raw_angle,
            ),
            Mistake(
                "PE(k) on the diagonal",
                "T(k) is not diag(PE(k)): each 2x2 block mixes the sine and the cosine of a pair.",
                diag,
            ),
        ]
        expect_close(
            got,
            reference,
            check=check,
            prop="PE(pos + k) = PE(pos) @ T(k) for every pos (block-diagonal rotation)",
            inputs=inputs,
            atol=1e-6,
            rtol=1e-5,
            mistakes=mistakes,
        )
    return True


def check_dot_product_curve(fn: Callable[..., torch.Tensor]) -> bool:
    r"""Check a learner's ``fn(offsets, dim)``: :math:`g(k) = \mathrm{PE}(m)\cdot\mathrm{PE}(m+k)`.

    Reference: :func:`companion.positional.sinusoidal_dot_products`,
    :math:`g(k) = \sum_i \cos(k\,\omega_i)`. Named mistakes: a sum of sines, each pair
    counted twice, the cosine similarity instead of the dot product.

    Args:
        fn: a function ``fn(offsets, dim)`` with ``offsets`` a float64 tensor, returning a
            tensor of the same shape.

    Returns:
        ``True`` when every case passes.

    Raises:
        CheckError: naming the property that failed, the input, expected and got.
    """
    from companion.positional import sinusoidal_dot_products, sinusoidal_frequencies

    check = "check_dot_product_curve"
    for offsets, dim in (
        (torch.arange(0.0, 6.0, dtype=torch.float64), 8),
        (torch.tensor([-50.0, -7.0, 0.0, 7.0, 300.0], dtype=torch.float64), 64),
    ):
        inputs = {"offsets": offsets, "dim": dim}
        got = _call(fn, check, inputs)
        reference = sinusoidal_dot_products(offsets, dim)
        angles = offsets[:, None] * sinusoidal_frequencies(dim)
        mistakes = [
            Mistake(
                "sum of sines instead of cosines",
                "sin(m w) sin(n w) + cos(m w) cos(n w) = cos((m - n) w): the curve is a sum of "
                "cosines, and g(0) = D/2.",
                torch.sin(angles).sum(-1),
            ),
            Mistake(
                "each pair counted twice",
                "a pair (sin, cos) contributes one cosine cos(k w_i), not two: g(0) = D/2.",
                2.0 * reference,
            ),
            Mistake(
                "cosine similarity instead of the dot product",
                "every PE row has squared norm D/2; the exercise asks for the raw dot product.",
                reference / (dim / 2),
            ),
        ]
        expect_close(
            got,
            reference,
            check=check,
            prop="g(k) = sum_i cos(k w_i), a function of the offset only",
            inputs=inputs,
            atol=1e-6,
            rtol=1e-6,
            mistakes=mistakes,
        )
    return True


def check_shift_recurrence(fn: Callable[..., torch.Tensor]) -> bool:
    r"""Check a learner's ``fn(pe_pos, pe_k) -> PE(pos + k)`` built from products of entries.

    ``pe_pos`` holds the rows :math:`\mathrm{PE}(\text{pos})` of several positions, ``pe_k``
    the row :math:`\mathrm{PE}(k)`; the answer is every :math:`\mathrm{PE}(\text{pos}+k)`, from
    :math:`\sin(a+b)` and :math:`\cos(a+b) = \cos a\cos b - \sin a\sin b`. Named mistakes:
    the recurrence printed in the notes (``cos(a-b)`` for the sine, an extra term for the
    cosine), and ``cos(a+b)`` with a plus sign.

    Args:
        fn: a function ``fn(pe_pos, pe_k)`` with ``pe_pos`` of shape ``(N, D)`` and ``pe_k``
            of shape ``(D,)``, returning a tensor of shape ``(N, D)``.

    Returns:
        ``True`` when every case passes.

    Raises:
        CheckError: naming the property that failed, the input, expected and got.
    """
    from companion.positional import sinusoidal_encoding

    check = "check_shift_recurrence"
    for k, dim in ((5, 8), (13, 16)):
        table = sinusoidal_encoding(40, dim, dtype=torch.float64)
        pe_pos, pe_k = table[2:20], table[k]
        inputs = {"pe_pos": pe_pos, "pe_k": pe_k}
        got = _call(fn, check, inputs)
        sp, cp = pe_pos[:, 0::2], pe_pos[:, 1::2]
        sk, ck = pe_k[0::2], pe_k[1::2]

        def interleave(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return torch.stack((a, b), dim=-1).flatten(-2)

        mistakes = [
            Mistake(
                "the recurrence printed in the notes",
                "PE(pos,2i)PE(k,2i) + PE(pos,2i+1)PE(k,2i+1) is cos(a - b), not sin(a + b); "
                "use sin(a+b) = sin a cos b + cos a sin b and "
                "cos(a+b) = cos a cos b - sin a sin b.",
                interleave(sp * sk + cp * ck, cp * sk + sp * ck - sp * sk),
            ),
            Mistake(
                "cos(a+b) with a plus sign",
                "cos(a + b) = cos a cos b - sin a sin b (a minus sign); with a plus it is cos(a - b).",
                interleave(sp * ck + cp * sk, cp * ck + sp * sk),
            ),
        ]
        expect_close(
            got,
            table[2 + k : 20 + k],
            check=check,
            prop="PE(pos+k) from PE(pos) and PE(k): sin(a+b), cos(a+b)",
            inputs={"pe_pos": pe_pos, "pe_k": pe_k, "k": k},
            atol=1e-6,
            rtol=1e-6,
            mistakes=mistakes,
        )
    return True


def check_normalized_positions(fn: Callable[..., torch.Tensor]) -> bool:
    r"""Check a learner's ``fn(num_positions) -> (L,)`` naive encoding :math:`\text{pos}/(L-1)`.

    Properties checked: the values for a few lengths ``L >= 2`` (first position 0, last 1).
    Named mistakes: dividing by ``L`` instead of ``L - 1``, counting positions from 1.

    Args:
        fn: a function ``fn(num_positions)`` returning a float tensor of shape ``(L,)``.

    Returns:
        ``True`` when every case passes.

    Raises:
        CheckError: naming the property that failed, the input, expected and got.
    """
    check = "check_normalized_positions"
    for num_positions in (2, 5, 50):
        inputs = {"num_positions": num_positions}
        got = _call(fn, check, inputs)
        pos = torch.arange(num_positions, dtype=torch.float64)
        mistakes = [
            Mistake(
                "divided by L instead of L - 1",
                "the last position is L - 1; divide by L - 1 so that it maps to exactly 1.",
                pos / num_positions,
            ),
            Mistake(
                "positions counted from 1",
                "positions start at 0, so the first token maps to 0 and the last to 1.",
                (pos + 1) / num_positions,
            ),
        ]
        expect_close(
            got,
            pos / (num_positions - 1),
            check=check,
            prop="PE(pos) = pos / (L - 1): 0 for the first token, 1 for the last",
            inputs=inputs,
            atol=1e-6,
            rtol=1e-6,
            mistakes=mistakes,
        )
    return True


# ---- Normalization (book/05_normalization) ----


def _norm_rows(
    x: torch.Tensor,
    dim: int | tuple[int, ...],
    *,
    correction: int,
    eps: float,
    eps_outside: bool = False,
) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) over ``dim`` (or / (std + eps) when ``eps_outside``)."""
    var, mean = torch.var_mean(x, dim=dim, correction=correction, keepdim=True)
    if eps_outside:
        return (x - mean) / (var.sqrt() + eps)
    return (x - mean) / torch.sqrt(var + eps)


def check_layer_norm(layer_norm: Callable[..., torch.Tensor]) -> bool:
    r"""Check a learner's ``layer_norm(x, weight, bias, eps)`` over the last dim.

    The reference is :func:`torch.nn.functional.layer_norm`. Named mistakes: unbiased
    variance, eps outside the square root (and both together, the Annotated Transformer's
    ``(x - mean) / (std + eps)``), normalizing over the batch axis, forgetting the gain,
    forgetting the bias.

    Args:
        layer_norm: a function ``layer_norm(x, weight, bias, eps) -> Tensor``.

    Returns:
        ``True`` when every case passes.

    Raises:
        CheckError: naming the property that failed, the input, expected and got.
    """
    check = "check_layer_norm"
    gen = torch.Generator().manual_seed(0)
    cases = [
        (
            "matches the definition on small-variance (B, D) rows, where eps matters",
            1e-2 * torch.randn(3, 8, generator=gen),
            1e-5,
        ),
        ("matches the definition on (B, D) rows", 2 * torch.randn(4, 6, generator=gen) + 1, 1e-5),
        (
            "normalizes each token of (B, L, D) over D only",
            torch.randn(2, 3, 5, generator=gen),
            1e-5,
        ),
    ]
    for prop, x, eps in cases:
        d = x.shape[-1]
        weight = 1 + 0.5 * torch.randn(d, generator=gen)
        bias = 0.5 * torch.randn(d, generator=gen)
        inputs = {"x": x, "weight": weight, "bias": bias, "eps": eps}
        got = _call(layer_norm, check, inputs)
        mistakes = [
            Mistake(
                "unbiased variance",
                "LayerNorm divides by D, not D - 1: use x.var(dim=-1, unbiased=False) "
                "(torch's Tensor.std/var default is unbiased).",
                _norm_rows(x, -1, correction=1, eps=eps) * weight + bias,
            ),
            Mistake(
                "eps outside the square root",
                "compute (x - mean) / sqrt(var + eps), not (x - mean) / (std + eps).",
                _norm_rows(x, -1, correction=0, eps=eps, eps_outside=True) * weight + bias,
            ),
            Mistake(
                "unbiased std with eps outside the square root (the Annotated Transformer's "
                "LayerNorm)",
                "a_2 * (x - mean) / (x.std(-1) + eps) + b_2 uses the unbiased std and adds eps "
                "to it; use the biased variance and sqrt(var + eps).",
                _norm_rows(x, -1, correction=1, eps=eps, eps_outside=True) * weight + bias,
            ),
            Mistake(
                "normalizing over the batch axis",
                "that is BatchNorm's axis: LayerNorm takes the mean and variance of each token "
                "over its features (dim=-1), not over dim=0.",
                _norm_rows(x, 0, correction=0, eps=eps) * weight + bias,
            ),
            Mistake(
                "forgetting the gain",
                "multiply the normalized x by weight before adding bias.",
                _norm_rows(x, -1, correction=0, eps=eps) + bias,
            ),
            Mistake(
                "forgetting the bias",
                "add bias after multiplying by weight.",
                _norm_rows(x, -1, correction=0, eps=eps) * weight,
            ),
        ]
        expected = torch.nn.functional.layer_norm(x, (d,), weight, bias, eps=eps)
        expect_close(got, expected, check=check, prop=prop, inputs=inputs, mistakes=mistakes)
    return True


def check_rms_norm(rms_norm: Callable[..., torch.Tensor]) -> bool:
    r"""Check a learner's ``rms_norm(x, weight, eps)`` over the last dim.

    The reference is :func:`torch.nn.functional.rms_norm`. Named mistakes: subtracting the
    mean (that is LayerNorm), eps outside the square root, forgetting the gain, dividing by
    the root of the sum of squares instead of the mean.

    Args:
        rms_norm: a function ``rms_norm(x, weight, eps) -> Tensor``.

    Returns:
        ``True`` when every case passes.

    Raises:
        CheckError: naming the property that failed, the input, expected and got.
    """
    check = "check_rms_norm"
    gen = torch.Generator().manual_seed(1)
    cases = [
        ("matches the definition x / rms(x) * weight", torch.randn(4, 6, generator=gen) + 1, 1e-6),
        (
            "eps inside the square root (small inputs)",
            3e-3 * torch.randn(2, 3, 8, generator=gen),
            1e-5,
        ),
    ]
    for prop, x, eps in cases:
        d = x.shape[-1]
        weight = 1 + 0.5 * torch.randn(d, generator=gen)
        inputs = {"x": x, "weight": weight, "eps": eps}
        got = _call(rms_norm, check, inputs)
        ms = x.square().mean(-1, keepdim=True)
        mistakes = [
            Mistake(
                "subtracting the mean",
                "that is LayerNorm: RMSNorm divides x itself by sqrt(mean(x^2) + eps).",
                _norm_rows(x, -1, correction=0, eps=eps) * weight,
            ),
            Mistake(
                "eps outside the square root",
                "compute x / sqrt(mean(x^2) + eps), not x / (sqrt(mean(x^2)) + eps).",
                x / (ms.sqrt() + eps) * weight,
            ),
            Mistake(
                "forgetting the gain",
                "multiply the normalized x by weight.",
                x * torch.rsqrt(ms + eps),
            ),
            Mistake(
                "sum of squares instead of the mean",
                "divide the sum of squares by D (use .mean(-1), not .sum(-1)).",
                x * torch.rsqrt(x.square().sum(-1, keepdim=True) + eps) * weight,
            ),
        ]
        expected = torch.nn.functional.rms_norm(x, (d,), weight, eps=eps)
        expect_close(got, expected, check=check, prop=prop, inputs=inputs, mistakes=mistakes)
    return True


def check_batch_norm(batch_norm: Callable[..., object]) -> bool:
    r"""Check a learner's training-mode ``batch_norm`` on ``(B, D)`` input.

    The learner's function is called as ``batch_norm(x, running_mean, running_var, weight,
    bias, momentum, eps)`` and must return ``(y, new_running_mean, new_running_var)``. The
    reference is :func:`torch.nn.functional.batch_norm` with ``training=True``. Named
    mistakes: unbiased variance (to normalize), eps outside the square root, normalizing
    over the feature axis (that is LayerNorm), forgetting the gain, the biased variance in
    the running estimate, the momentum the wrong way round.

    Args:
        batch_norm: the learner's function, see above.

    Returns:
        ``True`` when every case passes.

    Raises:
        CheckError: naming the property that failed, the input, expected and got.
    """
    check = "check_batch_norm"
    gen = torch.Generator().manual_seed(2)
    cases = [
        ("training mode on (B, D)", 2 * torch.randn(5, 4, generator=gen) + 3, 1e-5, 0.1),
        (
            "eps inside the square root (small-variance features)",
            1e-2 * torch.randn(6, 3, generator=gen),
            1e-5,
            0.3,
        ),
    ]
    for prop, x, eps, momentum in cases:
        n, d = x.shape
        weight = 1 + 0.5 * torch.randn(d, generator=gen)
        bias = 0.5 * torch.randn(d, generator=gen)
        rm0 = torch.randn(d, generator=gen)
        rv0 = 1 + torch.rand(d, generator=gen)
        rm, rv = rm0.clone(), rv0.clone()
        expected = torch.nn.functional.batch_norm(
            x, rm, rv, weight, bias, training=True, momentum=momentum, eps=eps
        )
        inputs = {
            "x": x,
            "running_mean": rm0.clone(),
            "running_var": rv0.clone(),
            "weight": weight,
            "bias": bias,
            "momentum": momentum,
            "eps": eps,
        }
        got = _call(batch_norm, check, inputs)
        if not (isinstance(got, tuple) and len(got) == 3):
            raise CheckError(
                check,
                "returns (y, running_mean, running_var)",
                describe_inputs(inputs),
                "Return the normalized x and the two updated running statistics as a tuple.",
                expected="a tuple of 3 tensors",
                got=f"a {type(got).__name__}",
            )
        y, got_rm, got_rv = got
        y_mistakes = [
            Mistake(
                "unbiased variance",
                "normalize with the biased batch variance (divide by B); the unbiased one only "
                "enters running_var.",
                _norm_rows(x, 0, correction=1, eps=eps) * weight + bias,
            ),
            Mistake(
                "eps outside the square root",
                "compute (x - mean) / sqrt(var + eps), not (x - mean) / (std + eps).",
                _norm_rows(x, 0, correction=0, eps=eps, eps_outside=True) * weight + bias,
            ),
            Mistake(
                "normalizing over the feature axis",
                "that is LayerNorm: BatchNorm takes statistics per feature over the batch (dim=0).",
                _norm_rows(x, -1, correction=0, eps=eps) * weight + bias,
            ),
            Mistake(
                "forgetting the gain",
                "multiply the normalized x by weight before adding bias.",
                _norm_rows(x, 0, correction=0, eps=eps) + bias,
            ),
        ]
        expect_close(
            y, expected, check=check, prop=f"{prop}: output", inputs=inputs, mistakes=y_mistakes
        )
        var_b, mean_b = torch.var_mean(x, dim=0, correction=0)
        expect_close(
            got_rm,
            rm,
            check=check,
            prop=f"{prop}: running_mean update",
            inputs=inputs,
            mistakes=[
                Mistake(
                    "momentum the wrong way round",
                    "torch's momentum weighs the NEW batch: r = (1 - momentum) * r + momentum * "
                    "batch_mean.",
                    momentum * rm0 + (1 - momentum) * mean_b,
                )
            ],
        )
        expect_close(
            got_rv,
            rv,
            check=check,
            prop=f"{prop}: running_var update",
            inputs=inputs,
            mistakes=[
                Mistake(
                    "biased variance in the running estimate",
                    "running_var tracks the unbiased variance: multiply the batch variance by "
                    "B / (B - 1) before the update.",
                    (1 - momentum) * rv0 + momentum * var_b,
                ),
                Mistake(
                    "momentum the wrong way round",
                    "r = (1 - momentum) * r + momentum * batch_var_unbiased.",
                    momentum * rv0 + (1 - momentum) * var_b * n / (n - 1),
                ),
            ],
        )
    return True


def check_variance(variance: Callable[..., torch.Tensor]) -> bool:
    r"""Check a learner's numerically stable biased ``variance(x, dim)``.

    The reference is a float64 two-pass variance of the same float32 numbers. Named
    mistakes: :math:`E[x^2] - E[x]^2` (catastrophic cancellation for a large mean), the
    unbiased variance.

    Args:
        variance: a function ``variance(x, dim) -> Tensor`` returning the biased variance
            along ``dim`` (dim removed).

    Returns:
        ``True`` when every case passes.

    Raises:
        CheckError: naming the property that failed, the input, expected and got.
    """
    check = "check_variance"
    gen = torch.Generator().manual_seed(3)
    cases = [
        ("biased variance along dim", torch.randn(4, 16, generator=gen), -1),
        ("along dim=0", torch.randn(16, 3, generator=gen), 0),
        (
            "stable for a large mean (x = 1e4 + noise, float32)",
            1e4 + torch.randn(4, 256, generator=gen),
            -1,
        ),
    ]
    for prop, x, dim in cases:
        inputs = {"x": x, "dim": dim}
        got = _call(variance, check, inputs)
        x64 = x.double()
        expected = x64.var(dim=dim, correction=0).to(x.dtype)
        naive = (x.square().mean(dim) - x.mean(dim).square()).to(x.dtype)
        mistakes = [
            Mistake(
                "E[x^2] - E[x]^2 (catastrophic cancellation)",
                "for a large mean both terms are huge and nearly equal, and float32 keeps ~7 "
                "digits: subtract the mean first, then average the squares (two passes), or "
                "use torch.var_mean(x, dim, correction=0).",
                naive,
            ),
            Mistake(
                "unbiased variance",
                "divide by n, not n - 1 (correction=0).",
                x64.var(dim=dim, correction=1).to(x.dtype),
            ),
        ]
        expect_close(
            got,
            expected,
            check=check,
            prop=prop,
            inputs=inputs,
            atol=1e-3,
            rtol=1e-3,
            mistakes=mistakes,
        )
    return True


def check_residual_blocks(
    pre_ln: Callable[..., torch.Tensor], post_ln: Callable[..., torch.Tensor]
) -> bool:
    r"""Check a learner's ``pre_ln(x, sublayer, norm)`` and ``post_ln(x, sublayer, norm)``.

    Pre-LN is :math:`x + F(\mathrm{Norm}(x))`, Post-LN is :math:`\mathrm{Norm}(x + F(x))`.
    Named mistakes: the other placement, a missing residual, adding the residual to the
    normalized input.

    Args:
        pre_ln: the learner's Pre-LN block as a function.
        post_ln: the learner's Post-LN block as a function.

    Returns:
        ``True`` when both pass.

    Raises:
        CheckError: naming the property that failed, the input, expected and got.
    """
    check = "check_residual_blocks"
    gen = torch.Generator().manual_seed(4)
    d = 6
    x = 3 * torch.randn(2, 4, d, generator=gen) + 1
    w = torch.randn(d, d, generator=gen) / d**0.5

    def sublayer(t: torch.Tensor) -> torch.Tensor:
        return torch.tanh(t @ w)

    def norm(t: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.layer_norm(t, (d,))

    pre = x + sublayer(norm(x))
    post = norm(x + sublayer(x))
    inputs = {"x": x, "sublayer": sublayer, "norm": norm}
    got = _call(pre_ln, check, inputs)
    expect_close(
        got,
        pre,
        check=check,
        prop="Pre-LN: x + sublayer(norm(x))",
        inputs=inputs,
        mistakes=[
            Mistake("Post-LN order", "Pre-LN normalizes the sublayer's INPUT.", post),
            Mistake("no residual", "add x back: x + sublayer(norm(x)).", sublayer(norm(x))),
            Mistake(
                "residual added to the normalized input",
                "the residual stream carries x itself, not norm(x).",
                norm(x) + sublayer(norm(x)),
            ),
        ],
    )
    got = _call(post_ln, check, inputs)
    expect_close(
        got,
        post,
        check=check,
        prop="Post-LN: norm(x + sublayer(x))",
        inputs=inputs,
        mistakes=[
            Mistake("Pre-LN order", "Post-LN normalizes the SUM x + sublayer(x).", pre),
            Mistake("no residual", "normalize x + sublayer(x).", norm(sublayer(x))),
            Mistake(
                "normalized the sublayer output only",
                "the norm applies to the sum, not to sublayer(x) alone.",
                x + norm(sublayer(x)),
            ),
        ],
    )
    return True


# ---- Beyond the training length: ALiBi and RoPE context extension (book/03_context_extension) ----


def _power_of_two_slopes(n: int) -> list[float]:
    """2^(-8k/n), k = 1..n: the power-of-two rule applied to any n (a known mistake for others)."""
    return [2.0 ** (-8.0 * k / n) for k in range(1, n + 1)]


def check_alibi_slopes(alibi_slopes: Callable[..., torch.Tensor]) -> bool:
    r"""Check a learner's ``alibi_slopes(num_heads) -> (H,)`` against Press et al.'s rule.

    Reference: :func:`companion.extension.alibi_slopes`. Cases: 8 heads (a power of two), then
    12, 6, 24 and 1 (the interleaved rule). Known mistakes named: the power-of-two formula
    :math:`2^{-8h/n}` used for every head count; the extra slopes taken consecutively instead
    of every other one; one slope :math:`2^{-h}` per head.

    Args:
        alibi_slopes: a function ``alibi_slopes(num_heads) -> Tensor``.

    Returns:
        ``True`` when every case passes.

    Raises:
        CheckError: naming the property that failed, the input, expected and got.
    """
    from companion.extension import alibi_slopes as reference

    check = "check_alibi_slopes"
    for num_heads in (8, 12, 6, 24, 1):
        inputs = {"num_heads": num_heads}
        got = _call(alibi_slopes, check, inputs)
        if isinstance(got, (list, tuple)):
            got = torch.tensor(got, dtype=torch.float64)
        closest = 2 ** (num_heads.bit_length() - 1)
        consecutive = (
            _power_of_two_slopes(closest) + _power_of_two_slopes(2 * closest)[: num_heads - closest]
        )
        mistakes = [
            Mistake(
                "power-of-two rule for every head count",
                f"2^(-8h/n) is the rule only when n is a power of two. For {num_heads} heads take "
                f"the {closest} slopes of {closest} heads, then every other slope of "
                f"{2 * closest} heads (2^(-4/{closest}), 2^(-12/{closest}), ...) for the rest.",
                torch.tensor(_power_of_two_slopes(num_heads), dtype=torch.float64),
            ),
            Mistake(
                "extra slopes not interleaved",
                f"the extra heads take the odd-numbered slopes of the {2 * closest}-head sequence "
                "([0::2] in the reference code), which fall between the first ones; you took "
                "its first slopes in a row.",
                torch.tensor(consecutive, dtype=torch.float64),
            ),
            Mistake(
                "slope 2^-h for every head count",
                "1/2, 1/4, ... is the 8-head sequence; in general the ratio is 2^(-8/n).",
                torch.tensor([2.0**-k for k in range(1, num_heads + 1)], dtype=torch.float64),
            ),
        ]
        prop = (
            "geometric slopes 2^(-8h/n) for a power of two"
            if num_heads & (num_heads - 1) == 0
            else "interleaved rule for a head count that is not a power of two"
        )
        expect_close(
            got,
            reference(num_heads, dtype=torch.float64),
            check=check,
            prop=prop,
            inputs=inputs,
            atol=1e-7,
            rtol=1e-5,
            mistakes=mistakes,
        )
    return True


def check_ntk_aware_base(ntk_aware_base: Callable[..., object]) -> bool:
    r"""Check a learner's ``ntk_aware_base(base, factor, head_dim) -> float``.

    Reference: :func:`companion.extension.ntk_aware_base`, :math:`b\,s^{D/(D-2)}`. Known
    mistakes named: exponent ``head_dim``; exponent 1 (``base * factor``); the exponent
    inverted, :math:`(D-2)/D`; the base divided instead of multiplied.

    Args:
        ntk_aware_base: a function ``ntk_aware_base(base, factor, head_dim) -> float``.

    Returns:
        ``True`` when every case passes.

    Raises:
        CheckError: naming the property that failed, the input, expected and got.
    """
    from companion.extension import ntk_aware_base as reference

    check = "check_ntk_aware_base"
    for base, factor, head_dim in ((10000.0, 4.0, 64), (500000.0, 8.0, 128), (10000.0, 2.0, 16)):
        inputs = {"base": base, "factor": factor, "head_dim": head_dim}
        got = _call(ntk_aware_base, check, inputs)
        if isinstance(got, (int, float)) and not isinstance(got, bool):
            got = torch.tensor(float(got), dtype=torch.float64)
        d = head_dim
        mistakes = [
            Mistake(
                "exponent head_dim instead of head_dim/(head_dim-2)",
                "the exponent is D/(D-2), chosen so that the lowest pair (i = D/2 - 1, exponent "
                "(D-2)/D) is slowed by exactly the factor.",
                torch.tensor(base * factor**d, dtype=torch.float64),
            ),
            Mistake(
                "base multiplied by the factor",
                "b*s slows the lowest pair by s^((D-2)/D), slightly less than s; raise the "
                "factor to the power D/(D-2).",
                torch.tensor(base * factor, dtype=torch.float64),
            ),
            Mistake(
                "exponent inverted",
                "use s^(D/(D-2)), not s^((D-2)/D): the base must grow enough that "
                "b'^(-(D-2)/D) = b^(-(D-2)/D) / s.",
                torch.tensor(base * factor ** ((d - 2) / d), dtype=torch.float64),
            ),
            Mistake(
                "base divided by the factor",
                "a smaller base makes every pair faster; the NTK base is larger than b.",
                torch.tensor(base / factor ** (d / (d - 2)), dtype=torch.float64),
            ),
        ]
        expect_close(
            got,
            torch.tensor(reference(base, factor, head_dim), dtype=torch.float64),
            check=check,
            prop="the lowest pair slowed by the factor, the highest unchanged",
            inputs=inputs,
            atol=0.0,
            rtol=1e-9,
            mistakes=mistakes,
        )
    return True


def check_yarn_ramp(yarn_ramp: Callable[..., torch.Tensor]) -> bool:
    r"""Check a learner's YaRN ramp ``yarn_ramp(head_dim, *, base,
    original_max_position_embeddings, beta_fast, beta_slow) -> (D/2,)``.

    Reference: :func:`companion.extension.yarn_ramp` (0 = pair untouched, 1 = fully
    interpolated; HF transformers' rounding of the range). Known mistakes named: the ramp
    reversed (or ``beta_fast`` and ``beta_slow`` swapped, which is the same thing); the
    correction range not rounded outwards (no ``floor``/``ceil``).

    Args:
        yarn_ramp: the learner's function, keyword arguments as above.

    Returns:
        ``True`` when every case passes.

    Raises:
        CheckError: naming the property that failed, the input, expected and got.
    """
    from companion.extension import yarn_ramp as reference

    check = "check_yarn_ramp"
    cases = [
        (128, 10000.0, 4096, 32.0, 1.0),
        (64, 500000.0, 8192, 32.0, 1.0),
        (128, 10000.0, 2048, 16.0, 2.0),
    ]
    for head_dim, base, n0, fast, slow in cases:
        inputs = {
            "head_dim": head_dim,
            "base": base,
            "original_max_position_embeddings": n0,
            "beta_fast": fast,
            "beta_slow": slow,
        }
        got = _call(yarn_ramp, check, inputs)
        expected = reference(**inputs)
        mistakes = [
            Mistake(
                "YaRN ramp reversed",
                "fast pairs (small i, more than beta_fast turns over the training length) must "
                "get 0 (kept as they are) and slow pairs 1 (interpolated): ramp = "
                "clamp((i - low) / (high - low), 0, 1) with low from beta_fast, high from "
                "beta_slow.",
                1 - expected,
            ),
            Mistake(
                "correction range not rounded outwards",
                "HF transformers (truncate=True, the default) floors low and ceils high before "
                "building the ramp.",
                reference(**inputs, truncate=False),
            ),
        ]
        expect_close(
            got,
            expected,
            check=check,
            prop="0 for pairs with > beta_fast turns, 1 for pairs with < beta_slow turns",
            inputs=inputs,
            atol=1e-6,
            rtol=1e-5,
            mistakes=mistakes,
        )
    return True


def check_llama3_frequencies(llama3_frequencies: Callable[..., torch.Tensor]) -> bool:
    r"""Check a learner's ``llama3_frequencies(head_dim, *, base, factor, low_freq_factor,
    high_freq_factor, original_max_position_embeddings) -> (D/2,)``.

    Reference: :func:`companion.extension.llama3_frequencies` (Meta's ``apply_scaling``).
    Known mistakes named: the bands swapped (high frequencies scaled, low ones kept); every pair
    divided by the factor (plain position interpolation); the blend weights reversed in the
    middle band.

    Args:
        llama3_frequencies: the learner's function, keyword arguments as above.

    Returns:
        ``True`` when every case passes.

    Raises:
        CheckError: naming the property that failed, the input, expected and got.
    """
    import math

    from companion.extension import llama3_frequencies as reference
    from companion.rope import rope_frequencies

    check = "check_llama3_frequencies"
    cases = [
        (128, 500000.0, 8.0, 1.0, 4.0, 8192),
        (64, 10000.0, 4.0, 1.0, 4.0, 2048),
        (128, 500000.0, 32.0, 2.0, 8.0, 8192),
    ]
    for head_dim, base, factor, lo, hi, n0 in cases:
        inputs = {
            "head_dim": head_dim,
            "base": base,
            "factor": factor,
            "low_freq_factor": lo,
            "high_freq_factor": hi,
            "original_max_position_embeddings": n0,
        }
        got = _call(llama3_frequencies, check, inputs)
        theta = rope_frequencies(head_dim, base=base)
        wavelength = 2 * math.pi / theta
        mu = ((n0 / wavelength - lo) / (hi - lo)).clamp(0.0, 1.0)
        low_band, high_band = wavelength > n0 / lo, wavelength < n0 / hi
        reversed_blend = torch.where(
            low_band | high_band, reference(**inputs), mu * theta / factor + (1 - mu) * theta
        )
        mistakes = [
            Mistake(
                "bands swapped",
                f"pairs with wavelength above {n0}/low_freq_factor (slow pairs, which never "
                f"turned in the training length) are divided by the factor; pairs with wavelength "
                f"below {n0}/high_freq_factor are kept.",
                mu * theta / factor + (1 - mu) * theta,
            ),
            Mistake(
                "every pair divided by the factor",
                "that is position interpolation; Llama 3 keeps the high-frequency band.",
                theta / factor,
            ),
            Mistake(
                "blend weights reversed in the middle band",
                "in the middle band theta' = (1 - mu) theta / s + mu theta with "
                "mu = (L0 / wavelength - low) / (high - low): mu = 1 at the fast edge.",
                reversed_blend,
            ),
        ]
        expect_close(
            got,
            reference(**inputs),
            check=check,
            prop="high band kept, low band divided by the factor, middle blended",
            inputs=inputs,
            atol=0.0,
            rtol=1e-5,
            mistakes=mistakes,
        )
    return True


# ---- Rotary position embedding (book/02_rope) ----


def _rope_reference(
    x: torch.Tensor,
    positions: torch.Tensor,
    base: float,
    *,
    layout: str = "half",
    exponent: str = "2i/D",
    sign: float = 1.0,
) -> torch.Tensor:
    """Right and wrong RoPE variants, for naming mistakes (``exponent`` ``"2i/D"`` or ``"i/D"``)."""
    from companion.rope import apply_rope, rope_cos_sin, rope_frequencies

    dim = x.shape[-1]
    freqs = rope_frequencies(dim, base=base)  # (D/2,)
    if exponent == "i/D":
        freqs = base ** (-torch.arange(dim // 2, dtype=torch.float64) / dim)
    cos, sin = rope_cos_sin(positions, freqs, dtype=torch.float64)  # (L, D/2)
    out = apply_rope(x.to(torch.float64), cos, sign * sin, layout=layout)
    return out.to(x.dtype)


def check_rope_frequencies(rope_frequencies: Callable[..., torch.Tensor]) -> bool:
    r"""Check a learner's ``rope_frequencies(head_dim, base)``: :math:`\theta_i = \text{base}^{-2i/D}`.

    Properties checked: one frequency per *pair* (``D/2`` values), the exponent ``-2i/D``
    (not ``-i/D``, not ``+2i/D``), for several widths and bases.

    Args:
        rope_frequencies: a function ``rope_frequencies(head_dim, base) -> Tensor (D/2,)``.

    Returns:
        ``True`` when every case passes.

    Raises:
        CheckError: naming the property that failed, the input, expected and got.
    """
    from companion.rope import rope_frequencies as reference

    check = "check_rope_frequencies"
    for head_dim, base in [(8, 10000.0), (64, 10000.0), (16, 500000.0)]:
        inputs = {"head_dim": head_dim, "base": base}
        got = _call(rope_frequencies, check, inputs)
        i = torch.arange(head_dim // 2, dtype=torch.float64)
        mistakes = [
            Mistake(
                "frequencies base^(-i/D)",
                "the exponent runs over the pair index i = 0 .. D/2-1 and is -2i/D, so the "
                "slowest pair turns at about 1/base per position; with -i/D it only reaches "
                "1/sqrt(base).",
                base ** (-i / head_dim),
            ),
            Mistake(
                "exponent with the wrong sign",
                "theta_i = base**(-2i/D) decreases from 1; base**(2i/D) grows to nearly base "
                "radians per position.",
                base ** (2 * i / head_dim),
            ),
        ]
        expect_close(
            got,
            reference(head_dim, base=base),
            check=check,
            prop="theta_i = base^(-2i/D), one per pair",
            inputs=inputs,
            atol=0.0,
            rtol=1e-5,
            mistakes=mistakes,
        )
    return True


def check_apply_rope(apply_rope: Callable[..., torch.Tensor], *, layout: str = "half") -> bool:
    r"""Check a learner's ``apply_rope(x, positions, base)`` for the declared ``layout``.

    Properties checked: the rotation of pair ``i`` at position ``m`` by :math:`m\theta_i`,
    counter-clockwise (:math:`(a, b) \mapsto (a\cos - b\sin, b\cos + a\sin)`), with the pairs
    of ``layout`` (``"half"``: ``(i, i + D/2)``; ``"interleaved"``: ``(2i, 2i + 1)``), for
    positions that do not start at 0. Named mistakes: rotating the wrong pairs for the
    declared layout, the sign of the rotation flipped, frequencies ``base^(-i/D)``, positions
    ignored.

    Args:
        apply_rope: a function ``apply_rope(x, positions, base) -> Tensor`` with ``x`` of shape
            ``(..., L, D)`` and integer ``positions`` of shape ``(L,)``.
        layout: the pairing the learner's function declares.

    Returns:
        ``True`` when every case passes.

    Raises:
        CheckError: naming the property that failed, the input, expected and got.
    """
    from companion.rope import LAYOUTS

    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    check = "check_apply_rope"
    other = "interleaved" if layout == "half" else "half"
    gen = torch.Generator().manual_seed(0)
    cases = [
        (
            "rotates pair i by m*theta_i",
            torch.randn(2, 3, 6, 8, generator=gen),
            torch.arange(1, 7),
            10000.0,
        ),
        (
            "uses the given positions, not 0..L-1",
            torch.randn(1, 2, 4, 8, generator=gen),
            torch.tensor([7, 3, 100, 4096]),
            10000.0,
        ),
        (
            "works for another width and base",
            torch.randn(3, 5, 16, generator=gen),
            torch.arange(5) + 11,
            500.0,
        ),
    ]
    for prop, x, positions, base in cases:
        inputs = {"x": x, "positions": positions, "base": base}
        got = _call(apply_rope, check, inputs)
        mistakes = [
            Mistake(
                "rotating the wrong pairs for the declared layout",
                f"layout={layout!r} pairs "
                + ("(i, i + D/2)" if layout == "half" else "(2i, 2i + 1)")
                + f"; your function rotated the pairs of layout={other!r}.",
                _rope_reference(x, positions, base, layout=other),
            ),
            Mistake(
                "the sign of the rotation flipped",
                "pair (a, b) at angle t becomes (a cos t - b sin t, b cos t + a sin t), a "
                "multiplication by e^{+it}; you rotated by -t (clockwise).",
                _rope_reference(x, positions, base, layout=layout, sign=-1.0),
            ),
            Mistake(
                "frequencies base^(-i/D)",
                "theta_i = base**(-2i/D) over the pair index i = 0 .. D/2-1.",
                _rope_reference(x, positions, base, layout=layout, exponent="i/D"),
            ),
            Mistake(
                "positions ignored",
                "rotate row l by the angle of positions[l], not by l: position ids need not "
                "start at 0 or be consecutive (a KV cache, packed sequences).",
                _rope_reference(x, torch.arange(x.shape[-2]), base, layout=layout),
            ),
        ]
        expect_close(
            got,
            _rope_reference(x, positions, base, layout=layout),
            check=check,
            prop=prop,
            inputs={**inputs, "layout": layout},
            atol=1e-5,
            rtol=1e-4,
            mistakes=mistakes,
        )
    return True


def check_rope_attention(rope_attention: Callable[..., torch.Tensor]) -> bool:
    r"""Check a learner's ``rope_attention(query, key, value, positions, base)``.

    The reference rotates query and key with RoPE (half layout), leaves the values alone, and
    returns ``softmax(q k^T / sqrt(D)) v`` (no mask). Named mistakes: rotating v, leaving
    RoPE out.

    Args:
        rope_attention: a function ``(query, key, value, positions, base) -> Tensor`` on
            ``(B, H, L, D)`` tensors with ``positions`` of shape ``(L,)``.

    Returns:
        ``True`` when every case passes.

    Raises:
        CheckError: naming the property that failed, the input, expected and got.
    """
    check = "check_rope_attention"
    gen = torch.Generator().manual_seed(1)

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        weights = torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, dim=-1)
        return weights @ v  # (B, H, L, D)

    for positions in (torch.arange(5), torch.arange(5) + 40):
        q, k, v = (torch.randn(2, 2, 5, 8, generator=gen, dtype=torch.float64) for _ in range(3))
        inputs = {"query": q, "key": k, "value": v, "positions": positions, "base": 10000.0}
        got = _call(rope_attention, check, inputs)
        rq, rk, rv = (_rope_reference(t, positions, 10000.0) for t in (q, k, v))
        mistakes = [
            Mistake(
                "rotating v",
                "RoPE rotates queries and keys only; the values carry content, not position, "
                "and rotating them mixes each output's coordinates by the key's position.",
                attend(rq, rk, rv),
            ),
            Mistake(
                "RoPE left out",
                "rotate query and key (with the same positions) before the dot products.",
                attend(q, k, v),
            ),
        ]
        expect_close(
            got,
            attend(rq, rk, v),
            check=check,
            prop="softmax(R q (R k)^T / sqrt(D)) v",
            inputs=inputs,
            atol=1e-5,
            rtol=1e-4,
            mistakes=mistakes,
        )
    return True


def check_rope_weight_permutation(convert: Callable[..., torch.Tensor]) -> bool:
    r"""Check a learner's ``convert(weight, num_heads)``: interleaved-layout rows to half layout.

    ``weight`` is a query or key projection ``(num_heads * D, d_model)`` trained with the
    interleaved layout (Meta's checkpoints); the answer permutes the ``D`` output rows of each
    head with :func:`companion.rope.interleaved_to_half_permutation`, so that the half layout
    (Hugging Face) gives the same attention scores. Named mistakes: the permutation in the
    wrong direction, one permutation over all rows instead of one per head.

    Args:
        convert: a function ``convert(weight, num_heads) -> Tensor`` of the same shape.

    Returns:
        ``True`` when every case passes.

    Raises:
        CheckError: naming the property that failed, the input, expected and got.
    """
    from companion.rope import half_to_interleaved_permutation, interleaved_to_half_permutation

    check = "check_rope_weight_permutation"
    gen = torch.Generator().manual_seed(2)
    for num_heads, head_dim, d_model in [(2, 8, 6), (3, 4, 5)]:
        weight = torch.randn(num_heads * head_dim, d_model, generator=gen)
        inputs = {"weight": weight, "num_heads": num_heads}
        got = _call(convert, check, inputs)
        per_head = weight.view(num_heads, head_dim, d_model)  # (H, D, d_model)
        p = interleaved_to_half_permutation(head_dim)
        mistakes = [
            Mistake(
                "permutation in the wrong direction",
                "row i of the half layout is row p[i] = 2i (i < D/2) of the interleaved one: "
                "index with interleaved_to_half_permutation, not its inverse.",
                per_head[:, half_to_interleaved_permutation(head_dim)].reshape(weight.shape),
            ),
            Mistake(
                "one permutation over all rows instead of one per head",
                "the pairs live inside each head: view the rows as (num_heads, D, d_model) and "
                "permute the D axis.",
                weight[interleaved_to_half_permutation(num_heads * head_dim)],
            ),
        ]
        expect_close(
            got,
            per_head[:, p].reshape(weight.shape),
            check=check,
            prop="rows of each head permuted from interleaved to half layout",
            inputs=inputs,
            atol=0.0,
            rtol=0.0,
            mistakes=mistakes,
        )
    return True


def check_rope_cos_sin(rope_cos_sin: Callable[..., tuple[torch.Tensor, torch.Tensor]]) -> bool:
    r"""Check a learner's float32 ``rope_cos_sin(positions, head_dim, base) -> (cos, sin)``.

    Properties checked: ``cos`` and ``sin`` of :math:`m\theta_i`, shape ``(L, D/2)``, float32,
    within ``3e-7`` of the float64-angle table (a few float32 rounding steps of values near 1)
    at positions up to :math:`2^{20}`. Named mistakes: angles computed in float32 (off by up to
    about ``5e-3`` radians at the positions checked), frequencies ``base^(-i/D)``.

    Args:
        rope_cos_sin: a function ``(positions, head_dim, base) -> (cos, sin)``.

    Returns:
        ``True`` when every case passes.

    Raises:
        CheckError: naming the property that failed, the input, expected and got.
    """
    from companion.rope import rope_cos_sin as reference
    from companion.rope import rope_frequencies

    check = "check_rope_cos_sin"
    cases = [
        ("cos and sin of m * theta_i", torch.arange(6), 8, 10000.0),
        (
            "float32-accurate at positions near 2^20",
            torch.tensor([2**20 - 1, 1_000_003, 777_777]),
            16,
            10000.0,
        ),
    ]
    for prop, positions, head_dim, base in cases:
        inputs = {"positions": positions, "head_dim": head_dim, "base": base}
        got = _call(rope_cos_sin, check, inputs)
        if not (isinstance(got, tuple | list) and len(got) == 2):
            raise CheckError(check, prop, describe_inputs(inputs), "Return a pair (cos, sin).")
        freqs = rope_frequencies(head_dim, base=base)
        ang32 = positions[:, None].float() * freqs.float()  # (L, D/2) float32 angles
        wrong_freqs = base ** (-torch.arange(head_dim // 2, dtype=torch.float64) / head_dim)
        expected = reference(positions, freqs, dtype=torch.float32)
        wrong = reference(positions, wrong_freqs, dtype=torch.float32)
        for index, name in enumerate(("cos", "sin")):
            expect_close(
                got[index],
                expected[index],
                check=check,
                prop=f"{prop} ({name})",
                inputs=inputs,
                atol=3e-7,
                rtol=0.0,
                check_dtype=True,
                mistakes=[
                    Mistake(
                        "angles computed in float32",
                        "m * theta in float32 keeps about 7 significant digits, so at m near "
                        "2^20 the angle is off by up to a few hundredths of a radian; form the angles in "
                        "float64, take cos and sin, then cast to float32.",
                        (torch.cos(ang32), torch.sin(ang32))[index],
                    ),
                    Mistake(
                        "frequencies base^(-i/D)",
                        "theta_i = base**(-2i/D) over the pair index i = 0 .. D/2-1.",
                        wrong[index],
                    ),
                ],
            )
    return True


# ---- Attention, from alignment scores to FlashAttention's trick (book/04_attention) ----


def _attention_inputs(
    gen: torch.Generator, batch: tuple[int, ...], length: int, source: int, width: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    query = torch.randn(*batch, length, width, generator=gen)
    key = torch.randn(*batch, source, width, generator=gen)
    value = torch.randn(*batch, source, 3, generator=gen)
    return query, key, value


_MISSING_SCALE = (
    "missing 1/sqrt(d_k)",
    "divide the scores q·k by sqrt(d_k) (the last dimension of query) before the softmax; "
    "without it their variance grows like d_k and the softmax saturates.",
)
_WRONG_AXIS = (
    "softmax over the wrong axis",
    "the weights of one query must sum to one over the keys: softmax(scores, dim=-1), not dim=-2.",
)


def check_attention(attention: Callable[..., torch.Tensor]) -> bool:
    r"""Check a learner's ``attention(query, key, value)``: softmax(QKᵀ/√d_k) V.

    Properties checked: the output of scaled dot-product attention on small inputs with
    ``L != S``, and on ``d_k = 64`` where a missing scale changes the result a lot. Names the
    mistakes "missing 1/sqrt(d_k)" and "softmax over the wrong axis".

    Args:
        attention: a function ``attention(query, key, value) -> Tensor`` for ``(..., L, D)``,
            ``(..., S, D)``, ``(..., S, Dv)`` inputs.

    Returns:
        ``True`` when every case passes.

    Raises:
        CheckError: naming the property that failed, the input, expected and got.
    """
    from companion.attention import scaled_dot_product_attention as sdpa

    check = "check_attention"
    gen = torch.Generator().manual_seed(0)
    cases = [
        ("softmax(Q Kᵀ / sqrt(d_k)) V on a small batch", (2,), 4, 6, 8),
        ("softmax(Q Kᵀ / sqrt(d_k)) V with d_k = 64", (1, 2), 5, 7, 64),
    ]
    for prop, batch, length, source, width in cases:
        query, key, value = _attention_inputs(gen, batch, length, source, width)
        inputs = {"query": query, "key": key, "value": value}
        got = _call(attention, check, inputs)
        scores = query @ key.transpose(-2, -1) / width**0.5
        mistakes = [
            Mistake(*_MISSING_SCALE, sdpa(query, key, value, scale=1.0)),
            Mistake(*_WRONG_AXIS, torch.softmax(scores, dim=-2) @ value),
            Mistake(
                "divided by d_k instead of sqrt(d_k)",
                "the scale is 1/sqrt(d_k): d_k ** -0.5, not 1 / d_k.",
                sdpa(query, key, value, scale=1.0 / width),
            ),
        ]
        expect_close(
            got, sdpa(query, key, value), check=check, prop=prop, inputs=inputs, mistakes=mistakes
        )
    return True


def check_masked_attention(attention: Callable[..., torch.Tensor]) -> bool:
    r"""Check a learner's ``attention(query, key, value, mask)`` with a boolean mask.

    The mask follows ``F.scaled_dot_product_attention``: ``True`` where a query may attend.
    Properties checked: a padding mask that broadcasts over queries, and a general ``(L, S)``
    mask. Names the mistakes "mask applied after the softmax", "mask inverted" and
    "missing 1/sqrt(d_k)".

    Args:
        attention: a function ``attention(query, key, value, mask) -> Tensor``.

    Returns:
        ``True`` when every case passes.

    Raises:
        CheckError: naming the property that failed, the input, expected and got.
    """
    from companion.attention import scaled_dot_product_attention as sdpa

    check = "check_masked_attention"
    gen = torch.Generator().manual_seed(1)
    padding = torch.tensor([[True, True, True, False, False]]).unsqueeze(1)  # (1, 1, S)
    general = torch.tensor(
        [
            [True, False, True, False, True],
            [False, True, True, True, False],
            [True, True, False, False, False],
            [False, False, False, True, True],
        ]
    )  # (L, S): every row has both True and False
    cases = [
        ("padding keys get zero weight (mask broadcast over queries)", padding),
        ("a general boolean mask, True = may attend", general),
    ]
    for prop, mask in cases:
        query, key, value = _attention_inputs(gen, (1,), 4, 5, 8)
        inputs = {"query": query, "key": key, "value": value, "mask": mask}
        got = _call(attention, check, inputs)
        weights = torch.softmax(query @ key.transpose(-2, -1) / 8**0.5, dim=-1)
        mistakes = [
            Mistake(
                "mask applied after the softmax",
                "zeroing weights after the softmax leaves rows that no longer sum to one; "
                "set the masked scores to -inf BEFORE the softmax.",
                weights.masked_fill(~mask, 0.0) @ value,
            ),
            Mistake(
                "mask inverted",
                "here True means 'may attend' (torch's F.scaled_dot_product_attention); "
                "nn.MultiheadAttention uses the opposite convention.",
                sdpa(query, key, value, mask=~mask),
            ),
            Mistake(*_MISSING_SCALE, sdpa(query, key, value, mask=mask, scale=1.0)),
        ]
        expect_close(
            got,
            sdpa(query, key, value, mask=mask),
            check=check,
            prop=prop,
            inputs=inputs,
            mistakes=mistakes,
        )
    return True


def check_causal_mask(causal_mask: Callable[..., torch.Tensor]) -> bool:
    r"""Check a learner's ``causal_mask(query_length, key_length)``: boolean, top-left aligned.

    The reference is ``torch.ones(L, S, dtype=torch.bool).tril()``: query ``i`` may attend to
    key ``j`` when ``j <= i`` (itself included), which is what ``is_causal=True`` means in
    ``F.scaled_dot_product_attention``. Names the mistakes "causal mask off by one", "mask
    inverted" and "bottom-right alignment".

    Args:
        causal_mask: a function ``causal_mask(query_length, key_length) -> Tensor`` (bool).

    Returns:
        ``True`` when every case passes.

    Raises:
        CheckError: naming the property that failed, the input, expected and got.
    """
    check = "check_causal_mask"
    cases = [
        ("query i attends to keys j <= i, itself included", 5, 5),
        ("top-left alignment when L < S", 3, 6),
        ("top-left alignment when L > S", 6, 3),
    ]
    for prop, length, source in cases:
        inputs = {"query_length": length, "key_length": source}
        got = _call(causal_mask, check, inputs)
        ones = torch.ones(length, source, dtype=torch.bool)
        mistakes = [
            Mistake(
                "causal mask off by one (the diagonal is excluded)",
                "a token may attend to itself: use tril(diagonal=0), i.e. j <= i, not j < i.",
                ones.tril(diagonal=-1),
            ),
            Mistake(
                "causal mask off by one (one future key is visible)",
                "query i may see keys j <= i only: use tril(diagonal=0), not tril(diagonal=1).",
                ones.tril(diagonal=1),
            ),
            Mistake(
                "mask inverted",
                "return True where attending is ALLOWED (j <= i), as F.scaled_dot_product_"
                "attention expects; triu(diagonal=1) is the 'blocked' mask.",
                ~ones.tril(),
            ),
        ]
        if length != source:
            mistakes.append(
                Mistake(
                    "bottom-right alignment",
                    "is_causal in torch aligns the diagonal at the top-left corner (j <= i); "
                    "you aligned it at the bottom-right (j <= i + S - L).",
                    ones.tril(diagonal=source - length),
                )
            )
        expect_close(
            got,
            ones.tril(),
            check=check,
            prop=prop,
            inputs=inputs,
            mistakes=mistakes,
            check_dtype=True,
        )
    return True


def check_split_heads(split_heads: Callable[..., torch.Tensor]) -> bool:
    r"""Check a learner's ``split_heads(x, num_heads)``: ``(B, L, E) -> (B, H, L, E/H)``.

    Head ``h`` must hold features ``h*E/H ... (h+1)*E/H - 1`` of every token, as
    ``nn.MultiheadAttention`` and every Transformer implementation split them. Names the mistake
    of reshaping straight to ``(B, H, L, E/H)``.

    Args:
        split_heads: a function ``split_heads(x, num_heads) -> Tensor``.

    Returns:
        ``True`` when every case passes.

    Raises:
        CheckError: naming the property that failed, the input, expected and got.
    """
    check = "check_split_heads"
    gen = torch.Generator().manual_seed(2)
    for batch, length, width, heads in ((2, 5, 12, 3), (1, 4, 8, 4)):
        x = torch.randn(batch, length, width, generator=gen)
        inputs = {"x": x, "num_heads": heads}
        got = _call(split_heads, check, inputs)
        expected = x.view(batch, length, heads, width // heads).transpose(1, 2)
        mistakes = [
            Mistake(
                "reshaped to (B, H, L, E/H) directly",
                "view(B, H, L, E/H) mixes tokens across heads; reshape to (B, L, H, E/H) "
                "first, then transpose(1, 2).",
                x.reshape(batch, heads, length, width // heads),
            )
        ]
        expect_close(
            got,
            expected,
            check=check,
            prop="head h holds features h*E/H ... (h+1)*E/H - 1 of every token",
            inputs=inputs,
            mistakes=mistakes,
            atol=0.0,
            rtol=0.0,
        )
    return True


def _tiled_without_rescale(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, block_size: int
) -> torch.Tensor:
    """The known wrong tiled attention: running max kept, old sums not rescaled."""
    scores = query @ key.transpose(-2, -1) / query.shape[-1] ** 0.5
    m = torch.full((*scores.shape[:-1], 1), -torch.inf)
    total = torch.zeros_like(m)
    acc = torch.zeros(*scores.shape[:-1], value.shape[-1])
    for j0 in range(0, key.shape[-2], block_size):
        s = scores[..., j0 : j0 + block_size]
        m = torch.maximum(m, s.amax(-1, keepdim=True))
        p = torch.exp(s - m)
        total = total + p.sum(-1, keepdim=True)
        acc = acc + p @ value[..., j0 : j0 + block_size, :]
    return acc / total


def check_tiled_attention(tiled_attention: Callable[..., torch.Tensor]) -> bool:
    r"""Check a learner's ``tiled_attention(query, key, value, block_size)`` (online softmax).

    Properties checked: equality with full attention when ``block_size`` does not divide
    ``S``; with one key per block; and with large scores (``|q·k|/√d`` in the hundreds), where
    only a running maximum keeps ``exp`` finite. Names the mistake "running sums not rescaled".

    Args:
        tiled_attention: a function ``tiled_attention(query, key, value, block_size)``.

    Returns:
        ``True`` when every case passes.

    Raises:
        CheckError: naming the property that failed, the input, expected and got.
    """
    from companion.attention import scaled_dot_product_attention as sdpa

    check = "check_tiled_attention"
    gen = torch.Generator().manual_seed(3)
    cases = [
        ("equals full attention; block_size does not divide S", 1.0, 4),
        ("equals full attention with one key per block", 1.0, 1),
        ("stays finite for large scores (keep a running max)", 60.0, 3),
    ]
    for prop, spread, block in cases:
        query, key, value = _attention_inputs(gen, (2,), 6, 10, 8)
        query = query * spread
        inputs = {"query": query, "key": key, "value": value, "block_size": block}
        got = _call(tiled_attention, check, inputs)
        mistakes = [
            Mistake(
                "running sums not rescaled",
                "when the running max grows from m_old to m_new, multiply the running sum "
                "and the accumulated output by exp(m_old - m_new) before adding the new block.",
                _tiled_without_rescale(query, key, value, block),
            )
        ]
        expect_close(
            got,
            sdpa(query, key, value),
            check=check,
            prop=prop,
            inputs=inputs,
            mistakes=mistakes,
        )
    return True


# ---- A tiny Transformer (book/06_tiny_transformer) ----


def _lag_reference(tokens: torch.Tensor, lag: int) -> torch.Tensor:
    targets = torch.full_like(tokens, -100)
    targets[:, lag:] = tokens[:, :-lag]
    return targets


def check_lag_targets(lag_targets: Callable[..., torch.Tensor]) -> bool:
    """Check ``lag_targets(tokens, lag)`` against :func:`companion.model.lag_task`'s rule.

    Rejects, by name: the shift in the wrong direction (the token ``lag`` places ahead), the
    unscored positions filled with 0 instead of ``-100``, and a lag off by one.

    Args:
        lag_targets: a function ``(tokens (B, L) long, lag) -> targets (B, L) long``.

    Returns:
        ``True`` when every case passes.
    """
    check = "check_lag_targets"
    gen = torch.Generator().manual_seed(0)
    for lag, length in ((2, 10), (1, 5), (3, 7)):
        tokens = torch.randint(1, 9, (3, length), generator=gen)
        inputs = {"tokens": tokens, "lag": lag}
        got = _call(lag_targets, check, inputs)
        ahead = torch.full_like(tokens, -100)
        ahead[:, :-lag] = tokens[:, lag:]
        zeros = torch.zeros_like(tokens)
        zeros[:, lag:] = tokens[:, :-lag]
        mistakes = [
            Mistake(
                "shifted the wrong way",
                f"the target at t must be the token at t - {lag} (in the past), not t + {lag}.",
                ahead,
            ),
            Mistake(
                "unscored positions filled with 0",
                f"the first {lag} positions have no answer: mark them with -100, the ignore "
                "index of cross_entropy, or they train the model to predict token 0.",
                zeros,
            ),
            Mistake(
                "lag off by one",
                f"use tokens[:, :-lag] for positions lag.. (got the answer for lag {lag + 1}).",
                _lag_reference(tokens, lag + 1) if lag + 1 < length else ahead,
            ),
        ]
        expect_close(
            got,
            _lag_reference(tokens, lag).to(torch.float64),
            check=check,
            prop=f"target at t is the token at t - lag, -100 for t < lag (lag={lag})",
            inputs=inputs,
            atol=0,
            rtol=0,
            mistakes=mistakes,
        )
    return True


def check_masked_accuracy(masked_accuracy: Callable[..., torch.Tensor]) -> bool:
    """Check ``masked_accuracy(logits, targets)``: the accuracy over scored positions only.

    Rejects, by name: counting the unscored (``-100``) positions.

    Args:
        masked_accuracy: a function ``(logits (B, L, V), targets (B, L)) -> 0-d tensor``.

    Returns:
        ``True`` when every case passes.
    """
    check = "check_masked_accuracy"
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 6, 5, generator=gen)
    targets = logits.argmax(dim=-1)  # a perfect model...
    targets[:, :2] = -100  # ...with two unscored positions per sequence
    targets[0, 3] = (targets[0, 3] + 1) % 5  # and one mistake
    inputs = {"logits": logits, "targets": targets}
    got = _call(masked_accuracy, check, inputs)
    if isinstance(got, (int, float)) and not isinstance(got, bool):
        got = torch.tensor(float(got), dtype=torch.float64)  # a Python number is fine too
    scored = targets != -100
    expected = (logits.argmax(-1)[scored] == targets[scored]).double().mean()
    mistakes = [
        Mistake(
            "counted the unscored positions",
            "select the positions with targets != -100 before averaging; each unscored "
            "position otherwise counts as a miss.",
            (logits.argmax(-1) == targets).double().mean(),
        ),
    ]
    expect_close(
        got,
        expected,
        check=check,
        prop="fraction of scored positions whose argmax is the target",
        inputs=inputs,
        atol=1e-9,
        rtol=0,
        mistakes=mistakes,
    )
    return True


def check_absolute_targets(absolute_targets: Callable[..., torch.Tensor]) -> bool:
    """Check ``absolute_targets(tokens, period)``: the target at position ``t`` is
    ``t mod period`` for every sequence.

    Rejects, by name: positions counted from 1, and ``t // period`` instead of the remainder.

    Args:
        absolute_targets: a function ``(tokens (B, L) long, period) -> (B, L) long``.

    Returns:
        ``True`` when every case passes.
    """
    check = "check_absolute_targets"
    gen = torch.Generator().manual_seed(2)
    for period, length in ((5, 12), (3, 4)):
        tokens = torch.randint(0, 9, (2, length), generator=gen)
        inputs = {"tokens": tokens, "period": period}
        got = _call(absolute_targets, check, inputs)
        t = torch.arange(length).expand(2, length)
        mistakes = [
            Mistake(
                "positions counted from 1",
                "the first token is at position 0, as in every chapter of the book.",
                (t + 1) % period,
            ),
            Mistake(
                "quotient instead of remainder", "use t % period, not t // period.", t // period
            ),
        ]
        expect_close(
            got,
            (t % period).to(torch.float64),
            check=check,
            prop=f"target at t is t mod {period}, whatever the tokens",
            inputs=inputs,
            atol=0,
            rtol=0,
            mistakes=mistakes,
        )
    return True


def _report_stub(checker: Callable[..., bool]) -> Callable[..., bool]:
    """Wrap a checker: a stub (``raise NotImplementedError``) prints a line, returns False."""
    import functools

    @functools.wraps(checker)
    def wrapper(*args: object, **kwargs: object) -> bool:
        try:
            return checker(*args, **kwargs)
        except _NotAttempted:
            print(
                f"{checker.__name__}: not attempted yet - write your function above, "
                "then run this cell again."
            )
            return False

    return wrapper


for _name in [n for n in list(globals()) if n.startswith("check_")]:
    globals()[_name] = _report_stub(globals()[_name])
del _name
