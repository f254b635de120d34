r"""Checkers for chapter 1 (:ref:`ch-sinusoidal`): the sinusoidal position encoding."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator

import torch

from companion import positional
from companion.checks._core import Case, Mistake, checker

__all__ = [
    "check_dot_product_curve",
    "check_normalized_positions",
    "check_shift_matrix",
    "check_shift_recurrence",
    "check_sinusoidal_encoding",
    "check_wavelengths",
]


def _frequencies(dim: int, base: float = 10000.0) -> torch.Tensor:
    """ω_i = base^(-2i/D), float64, over the pair index i."""
    return base ** (-2.0 * torch.arange(dim // 2, dtype=torch.float64) / dim)


def _sinusoid_table(
    num_positions: int,
    dim: int,
    *,
    base: float = 10000.0,
    pair_exponent: Callable[[torch.Tensor, int], torch.Tensor] | None = None,
    swap: bool = False,
    halves: bool = False,
    scale: float = 1.0,
) -> torch.Tensor:
    """Right and wrong variants of the sinusoidal table, for naming mistakes.

    ``pair_exponent(j, dim)`` maps the column index ``j`` to the exponent ``e`` in
    ``w = base**(-e)``; by default ``e = 2i/D`` over the pair index ``i``."""
    pos = torch.arange(num_positions, dtype=torch.float64)[:, None]
    first, second = (torch.cos, torch.sin) if swap else (torch.sin, torch.cos)
    if pair_exponent is not None:  # one frequency per column
        j = torch.arange(dim, dtype=torch.float64)
        ang = pos * scale * base ** (-pair_exponent(j, dim))  # (L, D)
        out = ang.clone()
        out[:, 0::2], out[:, 1::2] = first(ang[:, 0::2]), second(ang[:, 1::2])
        return out.float()
    ang = pos * scale * _frequencies(dim, base)  # (L, D/2)
    if halves:
        return torch.cat((first(ang), second(ang)), dim=-1).float()
    return torch.stack((first(ang), second(ang)), dim=-1).flatten(-2).float()


@checker
def check_sinusoidal_encoding(fn: Callable[..., torch.Tensor]) -> Iterator[Case]:
    r"""Check a learner's ``fn(num_positions, dim) -> (L, D)`` sinusoidal table.

    Reference: :func:`companion.positional.sinusoidal_encoding` (interleaved layout,
    base 10000). Properties checked: the values on small tables; accuracy at large
    positions (angles in float64). Named mistakes: "sin and cos swapped", "exponent i/D
    instead of 2i/D", "pair index running over all D dims", "column index j/D in the
    exponent", "base 1000 instead of 10000", "exponent with the wrong sign", "a factor
    2*pi in the frequency", "halves layout instead of interleaved", "angles computed in
    float32".

    Args:
        fn: a function ``fn(num_positions, dim)`` returning a tensor of shape ``(L,
            D)``.
    """
    cases = [
        (
            "matches PE(pos, 2i) = sin(pos ω_i), PE(pos, 2i+1) = cos(pos ω_i)",
            3,
            4,
            1e-5,
        ),
        ("matches the formula on a wider table", 40, 16, 1e-5),
        ("accurate at large positions", 20000, 8, 2e-6),
    ]
    for prop, num_positions, dim, atol in cases:
        table = functools.partial(_sinusoid_table, num_positions, dim)
        # float64, so that the preview in a message shows the exact values (cos 0.01 =
        # 0.99995 reads 1, where its float32 rounding 0.99994999 would read 0.9999)
        reference = positional.sinusoidal_encoding(
            num_positions, dim, dtype=torch.float64
        )
        mistakes = [
            Mistake(
                "sin and cos swapped",
                "column 2i holds the sine and column 2i+1 the cosine, so "
                "PE(0) = [0, 1, 0, 1, ...].",
                table(swap=True),
            ),
            Mistake(
                "exponent i/D instead of 2i/D",
                "with pair index i = 0 .. D/2-1 the frequency is 10000**(-2i/D); with "
                "i/D the lowest frequency is only 10000**(-1/2).",
                table(pair_exponent=lambda j, d: (j // 2) / d),
            ),
            Mistake(
                "pair index running over all D dims",
                "both columns 2i and 2i+1 of a pair share the frequency "
                "10000**(-2i/D), where i = column // 2 is the pair index; you used the "
                "column index.",
                table(pair_exponent=lambda j, d: 2.0 * j / d),
            ),
            Mistake(
                "column index j/D in the exponent",
                "the cosine column 2i+1 shares the frequency of the sine column 2i: "
                "the exponent is 2*(j // 2)/D for column j, not j/D.",
                table(pair_exponent=lambda j, d: j / d),
            ),
            Mistake(
                "base 1000 instead of 10000",
                "the frequencies run from 1 down to about 1/10000: the base is 10000.",
                table(base=1000.0),
            ),
            Mistake(
                "exponent with the wrong sign",
                "the frequency 10000**(-2i/D) shrinks with i (the angle is "
                "pos / 10000**(2i/D)); you multiplied pos by 10000**(2i/D).",
                table(pair_exponent=lambda j, d: -2.0 * (j // 2) / d),
            ),
            Mistake(
                "a factor 2*pi in the frequency",
                "the angle is pos * 10000**(-2i/D), with no 2*pi: the wavelengths are "
                "2*pi * 10000**(2i/D).",
                table(scale=2.0 * torch.pi),
            ),
            Mistake(
                "halves layout instead of interleaved",
                "[all sines, all cosines] is the halves layout (Marian); this exercise "
                "asks for the paper's interleaved one: sin in even columns, cos in odd "
                "columns.",
                table(halves=True),
            ),
        ]
        if num_positions > 1000:
            # float32 angles are off by a few 1e-3 at pos = 2e4 and the exact error
            # depends on the order of operations, so this mistake is recognized by its
            # size.
            mistakes.append(
                Mistake(
                    "angles computed in float32",
                    "pos ω_i in float32 is off by about pos ω_i * 1e-7 radians "
                    "(hundredths of a radian near pos = 1e6); form positions and "
                    "frequencies in float64, take sin/cos, then cast.",
                    reference,
                    atol=0.05,
                    rtol=0.0,
                )
            )
        inputs = {"num_positions": num_positions, "dim": dim}
        yield Case(prop, inputs, reference, mistakes, atol=atol, rtol=0.0)


@checker
def check_wavelengths(fn: Callable[..., torch.Tensor]) -> Iterator[Case]:
    r"""Check a learner's wavelengths ``fn(dim) -> (D/2,)``: :math:`2\pi/\omega_i`.

    Reference: :func:`companion.positional.sinusoidal_wavelengths`. Named mistakes:
    "frequency instead of wavelength", "wavelength without the 2*pi", "half a period (pi
    instead of 2*pi)", "exponent i/D instead of 2i/D", "one wavelength per dimension" (D
    values, not D/2).

    Args:
        fn: a function ``fn(dim)`` returning a tensor of shape ``(D // 2,)``.
    """
    for dim in (4, 16, 512):
        omega = _frequencies(dim)
        i = torch.arange(dim // 2, dtype=torch.float64)
        mistakes = [
            Mistake(
                "frequency instead of wavelength",
                "the wavelength is the number of positions per full turn, 2*pi / ω_i.",
                omega,
            ),
            Mistake(
                "wavelength without the 2*pi",
                "sin(pos ω_i) repeats when pos ω_i grows by 2*pi, so the period is "
                "2*pi / ω_i.",
                1.0 / omega,
            ),
            Mistake(
                "half a period (pi instead of 2*pi)",
                "after pos ω_i grows by pi, sin(pos ω_i) has only changed sign; it "
                "takes 2*pi to come back to the same value, so the period is "
                "2*pi / ω_i.",
                torch.pi / omega,
            ),
            Mistake(
                "exponent i/D instead of 2i/D",
                "ω_i = 10000**(-2i/D) for the pair index i = 0 .. D/2-1.",
                2.0 * torch.pi * 10000.0 ** (i / dim),
            ),
            Mistake(
                "one wavelength per dimension",
                f"the two columns of a pair share one frequency: return D/2 = "
                f"{dim // 2} wavelengths, one per pair i = 0 .. D/2-1, not {dim}.",
                2.0
                * torch.pi
                * 10000.0 ** (2 * torch.arange(dim, dtype=torch.float64) / dim),
            ),
            Mistake(
                "one wavelength per dimension",
                f"the two columns of a pair share one frequency: return D/2 = "
                f"{dim // 2} wavelengths, one per pair, not {dim} (one per column).",
                (2.0 * torch.pi / omega).repeat_interleave(2),
            ),
        ]
        prop = "the wavelength of every pair, in positions"
        inputs = {"dim": dim}
        yield Case(
            prop,
            inputs,
            positional.sinusoidal_wavelengths(dim),
            mistakes,
            atol=0.0,
            rtol=1e-5,
        )


@checker
def check_shift_matrix(fn: Callable[..., torch.Tensor]) -> Iterator[Case]:
    r"""Check a learner's ``fn(k, dim) -> (D, D)`` shift matrix :math:`T(k)`.

    Reference: :func:`companion.positional.shift_matrix`, with
    :math:`\mathrm{PE}(\text{pos}+k) = \mathrm{PE}(\text{pos})\,T(k)` for row vectors.
    Named mistakes: "sin entries with the wrong sign (blocks transposed)" (the
    row-form R(b), which shifts by -k), "angle k instead of k * w_i", "PE(k) on the
    diagonal".

    Args:
        fn: a function ``fn(k, dim)`` returning a tensor of shape ``(D, D)``.
    """
    for k, dim in ((1, 4), (7, 8), (-3, 6), (2.5, 8)):
        reference = positional.shift_matrix(k, dim)
        ones = torch.ones(dim // 2, dtype=torch.float64)
        c, s = torch.cos(k * ones), torch.sin(k * ones)
        blocks = torch.stack((torch.stack((c, -s), -1), torch.stack((s, c), -1)), -2)
        omega = _frequencies(dim)
        pe_k = torch.stack((torch.sin(k * omega), torch.cos(k * omega)), -1).flatten()
        mistakes = [
            Mistake(
                "sin entries with the wrong sign (blocks transposed)",
                "your blocks are [[cos b, sin b], [-sin b, cos b]], the row-form "
                "rotation R(b) of the notation page, which moves the stored pair "
                "[sin a, cos a] to angle a - b: a shift by -k. The pair is stored "
                "sine first, so the shift is R(-b) = [[cos b, -sin b], [sin b, "
                "cos b]] (entry for entry the column-vector textbook rotation).",
                reference.mT,
            ),
            Mistake(
                "angle k instead of k * w_i",
                "block i rotates by k ω_i, the angle pair i advances over k positions.",
                torch.block_diag(*blocks),
            ),
            Mistake(
                "PE(k) on the diagonal",
                "T(k) is not diag(PE(k)): each 2x2 block mixes the sine and the cosine "
                "of a pair.",
                torch.diag(pe_k),
            ),
        ]
        prop = "PE(pos + k) = PE(pos) @ T(k) for every pos"
        inputs = {"k": k, "dim": dim}
        yield Case(prop, inputs, reference, mistakes, atol=1e-6, rtol=1e-5)


@checker
def check_dot_product_curve(fn: Callable[..., torch.Tensor]) -> Iterator[Case]:
    r"""Check a learner's dot-product curve ``fn(offsets, dim)``: PE(m) . PE(m + k).

    Reference: :func:`companion.positional.sinusoidal_dot_products`,
    :math:`\psi(k) = \sum_i \cos(k\,\omega_i)`. Named mistakes: "sum of sines instead of
    cosines", "each pair counted twice", "cosine similarity instead of the dot product".

    Args:
        fn: a function ``fn(offsets, dim)`` with ``offsets`` a float64 tensor, returning
            a tensor of the same shape.
    """
    for offsets, dim in (
        (torch.arange(0.0, 6.0, dtype=torch.float64), 8),
        (torch.tensor([-50.0, -7.0, 0.0, 7.0, 300.0], dtype=torch.float64), 64),
    ):
        reference = positional.sinusoidal_dot_products(offsets, dim)
        angles = offsets[:, None] * _frequencies(dim)
        mistakes = [
            Mistake(
                "sum of sines instead of cosines",
                "sin(m ω) sin(n ω) + cos(m ω) cos(n ω) = cos((m - n) ω): the curve is "
                "a sum of cosines, and ψ(0) = D/2.",
                torch.sin(angles).sum(-1),
            ),
            Mistake(
                "each pair counted twice",
                "a pair (sin, cos) contributes one cosine cos(k ω_i), not two: ψ(0) = "
                "D/2.",
                2.0 * reference,
            ),
            Mistake(
                "cosine similarity instead of the dot product",
                "every PE row has squared norm D/2; the exercise asks for the raw dot "
                "product.",
                reference / (dim / 2),
            ),
        ]
        prop = "ψ(k) = PE(pos)·PE(pos + k), the same for every pos"
        inputs = {"offsets": offsets, "dim": dim}
        yield Case(prop, inputs, reference, mistakes, atol=1e-6, rtol=1e-6)


def _interleave(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.stack((a, b), dim=-1).flatten(-2)


@checker
def check_shift_recurrence(fn: Callable[..., torch.Tensor]) -> Iterator[Case]:
    r"""Check a learner's ``fn(pe_pos, pe_k) -> PE(pos + k)`` from products of entries.

    ``pe_pos`` holds the rows :math:`\mathrm{PE}(\text{pos})` of several positions,
    ``pe_k`` the row :math:`\mathrm{PE}(k)`; the answer is every
    :math:`\mathrm{PE}(\text{pos}+k)`, from :math:`\sin(a+b)` and
    :math:`\cos(a+b) = \cos a\cos b - \sin a\sin b`. Named mistakes: "the recurrence
    printed in the notes" (``cos(a-b)`` for the sine, and for the cosine sin(a+b)'s two
    terms where ``cos a cos b`` belongs), "the notes' cosine line" (the sine right, the
    cosine as in the notes), "cos(a+b) with a plus sign".

    Args:
        fn: a function ``fn(pe_pos, pe_k)`` with ``pe_pos`` of shape ``(L, D)`` and
            ``pe_k`` of shape ``(D,)``, returning a tensor of shape ``(L, D)``.
    """
    for k, dim in ((5, 8), (13, 16)):
        table = positional.sinusoidal_encoding(40, dim, dtype=torch.float64)
        pe_pos, pe_k = table[2:20], table[k]
        sp, cp = pe_pos[:, 0::2], pe_pos[:, 1::2]
        sk, ck = pe_k[0::2], pe_k[1::2]
        mistakes = [
            Mistake(
                "the recurrence printed in the notes",
                "PE(pos,2i)PE(k,2i) + PE(pos,2i+1)PE(k,2i+1) is cos(a - b), not sin(a "
                "+ b); and the cosine line cos a sin b + sin a cos b - sin a sin b "
                "starts with sin(a+b)'s two terms where cos a cos b belongs. Use "
                "sin(a+b) = sin a cos b + cos a sin b and cos(a+b) = cos a cos b - "
                "sin a sin b.",
                _interleave(sp * sk + cp * ck, cp * sk + sp * ck - sp * sk),
            ),
            Mistake(
                "the notes' cosine line",
                "the sine is right, but the cosine line of the notes, cos a sin b + "
                "sin a cos b - sin a sin b, starts with sin(a+b)'s two terms where "
                "cos a cos b belongs: cos(a+b) = cos a cos b - sin a sin b.",
                _interleave(sp * ck + cp * sk, cp * sk + sp * ck - sp * sk),
            ),
            Mistake(
                "cos(a+b) with a plus sign",
                "cos(a + b) = cos a cos b - sin a sin b (a minus sign); with a plus it "
                "is cos(a - b).",
                _interleave(sp * ck + cp * sk, cp * ck + sp * sk),
            ),
        ]
        inputs = {"pe_pos": pe_pos, "pe_k": pe_k}
        yield Case(
            "PE(pos + k) from the rows PE(pos) and PE(k) alone",
            inputs,
            table[2 + k : 20 + k],
            mistakes,
            atol=1e-6,
            rtol=1e-6,
            shown={**inputs, "k": k},
        )


@checker
def check_normalized_positions(fn: Callable[..., torch.Tensor]) -> Iterator[Case]:
    r"""Check a learner's naive encoding ``fn(num_positions) -> (L,)``: pos / (L - 1).

    Properties checked: the values for a few lengths ``L >= 2`` (first position 0, last
    1). Named mistakes: "divided by L instead of L - 1", "positions counted from 1".

    Args:
        fn: a function ``fn(num_positions)`` returning a float tensor of shape ``(L,)``.
    """
    for num_positions in (2, 5, 50):
        pos = torch.arange(num_positions, dtype=torch.float64)
        mistakes = [
            Mistake(
                "divided by L instead of L - 1",
                "the last position is L - 1; divide by L - 1 so that it maps to "
                "exactly 1.",
                pos / num_positions,
            ),
            Mistake(
                "positions counted from 1",
                "positions start at 0, so the first token maps to 0 and the last to 1.",
                (pos + 1) / num_positions,
            ),
        ]
        prop = "PE(pos) = pos / (L - 1): 0 for the first token, 1 for the last"
        inputs = {"num_positions": num_positions}
        yield Case(
            prop, inputs, pos / (num_positions - 1), mistakes, atol=1e-6, rtol=1e-6
        )
