r"""Checkers for chapter 03 (:ref:`ch-extension`): ALiBi and RoPE context extension."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import torch

from companion import extension, rope
from companion.checks._core import Case, Mistake, checker, f64

__all__ = [
    "check_alibi_slopes",
    "check_llama3_frequencies",
    "check_ntk_aware_base",
    "check_yarn_ramp",
]


def _power_of_two_slopes(heads: int) -> list[float]:
    """2^(-8h/H), h = 1..H: the power-of-two rule applied to any H."""
    return [2.0 ** (-8.0 * h / heads) for h in range(1, heads + 1)]


@checker
def check_alibi_slopes(alibi_slopes: Callable[..., object]) -> Iterator[Case]:
    r"""Check a learner's ``alibi_slopes(num_heads) -> (H,)``: Press et al.'s rule.

    Reference: :func:`companion.extension.alibi_slopes`. Cases: 8 heads (a power of
    two), then 12, 6, 24 and 1 (the interleaved rule). A list of floats is a fine
    answer, so Press et al.'s own ``get_slopes(n)`` passes. Named mistakes:
    "power-of-two rule for every head count" (:math:`2^{-8h/H}` for any :math:`H`),
    "extra slopes not interleaved" (taken consecutively instead of every other one),
    "slope 2^-h for every head count".

    Args:
        alibi_slopes: a function ``alibi_slopes(num_heads)`` returning the slopes.
    """
    for num_heads in (8, 12, 6, 24, 1):
        closest = 2 ** (num_heads.bit_length() - 1)
        extra = _power_of_two_slopes(2 * closest)[: num_heads - closest]
        mistakes = [
            Mistake(
                "power-of-two rule for every head count",
                f"2^(-8h/H) is the rule only when H is a power of two. For H = "
                f"{num_heads} heads take the slopes of c = {closest} heads, then every "
                f"other slope of 2c = {2 * closest} heads, from the first "
                f"(2^(-4/{closest}), 2^(-12/{closest}), ...), for the other H - c.",
                f64(_power_of_two_slopes(num_heads)),
            ),
            Mistake(
                "extra slopes not interleaved",
                f"the H - c = {num_heads - closest} extra heads take every other slope "
                f"of the 2c = {2 * closest}-head sequence, from the first ([0::2] in "
                "the reference code); you took its first slopes in a row.",
                f64(_power_of_two_slopes(closest) + extra),
            ),
            Mistake(
                "slope 2^-h for every head count",
                "1/2, 1/4, ... is the 8-head sequence; for H heads the ratio is "
                "2^(-8/H).",
                f64([2.0**-k for k in range(1, num_heads + 1)]),
            ),
        ]
        power_of_two = num_heads & (num_heads - 1) == 0
        yield Case(
            "geometric slopes 2^(-8h/H) for a power of two"
            if power_of_two
            else "interleaved rule for a head count that is not a power of two",
            {"num_heads": num_heads},
            extension.alibi_slopes(num_heads, dtype=torch.float64),
            mistakes,
            atol=1e-7,
            rtol=1e-5,
        )


@checker
def check_ntk_aware_base(ntk_aware_base: Callable[..., object]) -> Iterator[Case]:
    r"""Check a learner's ``ntk_aware_base(base, factor, head_dim) -> float``.

    Reference: :func:`companion.extension.ntk_aware_base`, :math:`b\,s^{D/(D-2)}`, to a
    relative ``1e-9`` (a Python float or a 0-d tensor). Named mistakes: "exponent
    head_dim instead of head_dim/(head_dim-2)", "base multiplied by the factor"
    (exponent 1), "exponent inverted" (:math:`(D-2)/D`), "base divided by the factor",
    "computed in float32" (right to about 7 digits only).

    Args:
        ntk_aware_base: a function ``ntk_aware_base(base, factor, head_dim)``.
    """
    for b, s, d in ((10000.0, 4.0, 64), (500000.0, 8.0, 128), (10000.0, 2.0, 16)):
        right = extension.ntk_aware_base(b, s, d)
        mistakes = [
            Mistake(
                "computed in float32",
                "your value is right to float32 precision (about 7 digits) but not to "
                "the 1e-9 asked: compute in Python floats or float64 (a float32 "
                "tensor, or torch.tensor(base) with its default dtype, rounds it).",
                f64(right),
                rtol=1e-6,  # float32 keeps 24 bits: 6e-8 relative per rounding
            ),
            Mistake(
                "exponent head_dim instead of head_dim/(head_dim-2)",
                "the exponent is D/(D-2), chosen so that the slowest pair "
                "(i = D/2 - 1, exponent (D-2)/D) is slowed by exactly the factor.",
                f64(b * s**d),
            ),
            Mistake(
                "base multiplied by the factor",
                "b*s slows the slowest pair by s^((D-2)/D), slightly less than s; "
                "raise the factor to the power D/(D-2).",
                f64(b * s),
            ),
            Mistake(
                "exponent inverted",
                "use s^(D/(D-2)), not s^((D-2)/D): the base must grow enough that "
                "b'^(-(D-2)/D) = b^(-(D-2)/D) / s.",
                f64(b * s ** ((d - 2) / d)),
            ),
            Mistake(
                "base divided by the factor",
                "a smaller base makes every pair faster; the NTK base is larger than "
                "b.",
                f64(b / s ** (d / (d - 2))),
            ),
        ]
        yield Case(
            "the slowest pair slowed by the factor, the fastest unchanged",
            {"base": b, "factor": s, "head_dim": d},
            f64(right),
            mistakes,
            atol=0.0,
            rtol=1e-9,
        )


def _ramp(
    head_dim: int,
    base: float,
    n0: int,
    fast: float,
    slow: float,
    truncate: bool = True,
    turn: float = 2 * math.pi,
) -> torch.Tensor:
    """HF transformers' ``find_correction_range`` + ``linear_ramp_factor``, in float64,
    for any order of ``fast`` and ``slow`` (a swapped pair is a known mistake); ``turn``
    is the angle of one turn (``1`` is the mistake of a wavelength ``1/θ``)."""

    def index(turns: float) -> float:
        return head_dim * math.log(n0 / (turns * turn)) / (2 * math.log(base))

    low, high = index(fast), index(slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001
    i = torch.arange(head_dim // 2, dtype=torch.float64)
    return ((i - low) / (high - low)).clamp(0.0, 1.0)


@checker
def check_yarn_ramp(yarn_ramp: Callable[..., torch.Tensor]) -> Iterator[Case]:
    r"""Check a learner's YaRN ramp ``yarn_ramp(head_dim, base,
    original_max_position_embeddings, beta_fast, beta_slow) -> (D/2,)``.

    The arguments come positionally, in this order. Reference:
    :func:`companion.extension.yarn_ramp`: the interpolation weight :math:`\rho_i` of
    chapter 03 (0 = pair untouched, 1 = fully interpolated; HF transformers' rounding of
    the range). Named mistakes: "the paper's ramp, linear in turns" (the formula of
    Peng et al.'s Section 3.2, which the chapter shows first), "2π missing from the
    wavelength" (:math:`\lambda_i = 1/\theta_i`), "beta_fast and beta_slow swapped",
    "YaRN ramp reversed", "correction range not rounded outwards" (no
    ``floor``/``ceil``).

    Args:
        yarn_ramp: the learner's function, arguments as above.
    """
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
        expected = extension.yarn_ramp(
            head_dim,
            base=base,
            original_max_position_embeddings=n0,
            beta_fast=fast,
            beta_slow=slow,
        )
        theta = rope.rope_frequencies(head_dim, base=base).double()
        turns = n0 * theta / (2 * math.pi)  # r_i = L0 / lambda_i
        mistakes = [
            Mistake(
                "the paper's ramp, linear in turns",
                "ρ_i = clamp((r_fast - r_i) / (r_fast - r_slow), 0, 1), linear in the "
                "number of turns r_i = L0/λ_i, is the YaRN paper's formula; this "
                "exercise asks for the ramp of the authors' code and HF transformers, "
                "linear in the pair index i between low = floor(i(r_fast)) and "
                "high = ceil(i(r_slow)).",
                ((fast - turns) / (fast - slow)).clamp(0.0, 1.0),
            ),
            Mistake(
                "2π missing from the wavelength",
                "a pair's wavelength is λ_i = 2π/θ_i (one turn is 2π radians), so the "
                "index where it turns r times is i(r) = D ln(L0 / (2π r)) / (2 ln b); "
                "without 2π every threshold moves to slower pairs (larger i).",
                _ramp(head_dim, base, n0, fast, slow, turn=1.0),
            ),
            Mistake(
                "beta_fast and beta_slow swapped",
                f"low comes from beta_fast = r_fast = {fast} turns (pairs turning more "
                f"often are kept, ρ_i = 0) and high from beta_slow = r_slow = {slow}; "
                "you computed the range with the two exchanged.",
                _ramp(head_dim, base, n0, slow, fast),
            ),
            Mistake(
                "YaRN ramp reversed",
                "fast pairs (small i, more than r_fast turns in L0 tokens) must get "
                "ρ_i = 0 (kept as they are) and slow pairs ρ_i = 1 (interpolated): "
                "ρ_i = clamp((i - low) / (high - low), 0, 1), low from beta_fast, high "
                "from beta_slow.",
                1 - expected,
            ),
            Mistake(
                "correction range not rounded outwards",
                "HF transformers (truncate=True, the default) floors low and ceils "
                "high before building the ramp.",
                _ramp(head_dim, base, n0, fast, slow, truncate=False),
            ),
        ]
        yield Case(
            "ρ_i = 0 for pairs with > r_fast turns, 1 for pairs with < r_slow turns",
            inputs,
            expected,
            mistakes,
            atol=1e-6,
            rtol=1e-5,
        )


@checker
def check_llama3_frequencies(
    llama3_frequencies: Callable[..., torch.Tensor],
) -> Iterator[Case]:
    r"""Check a learner's ``llama3_frequencies(head_dim, base, factor, low_freq_factor,
    high_freq_factor, original_max_position_embeddings) -> (D/2,)``.

    The arguments come positionally, in this order. Reference:
    :func:`companion.extension.llama3_frequencies` (Meta's ``apply_scaling``). Named
    mistakes: "2π missing from the wavelength" (:math:`\lambda_i = 1/\theta_i`),
    "bands swapped" (high frequencies scaled, low ones kept), "every pair divided by
    the factor" (plain position interpolation), "blend weights reversed in the middle
    band".

    Args:
        llama3_frequencies: the learner's function, arguments as above.
    """
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
        expected = extension.llama3_frequencies(**inputs)
        theta = rope.rope_frequencies(head_dim, base=base)
        wavelength = 2 * math.pi / theta
        mu = ((n0 / wavelength - lo) / (hi - lo)).clamp(0.0, 1.0)
        outer = (wavelength > n0 / lo) | (wavelength < n0 / hi)
        swapped = mu * theta / factor + (1 - mu) * theta
        inverse = 1 / theta  # the mistaken wavelength, without 2π
        mu_inverse = ((n0 / inverse - lo) / (hi - lo)).clamp(0.0, 1.0)
        blended = (1 - mu_inverse) * theta / factor + mu_inverse * theta
        no_two_pi = torch.where(
            inverse < n0 / hi,
            theta,
            torch.where(inverse > n0 / lo, theta / factor, blended),
        )
        mistakes = [
            Mistake(
                "2π missing from the wavelength",
                "a pair's wavelength is λ_i = 2π/θ_i (one turn is 2π radians), not "
                "1/θ_i; without 2π every wavelength is 2π times too short, and the "
                "band edges L0/high_freq_factor and L0/low_freq_factor fall on "
                "slower pairs than Meta's apply_scaling uses.",
                no_two_pi,
            ),
            Mistake(
                "bands swapped",
                f"pairs with wavelength λ_i above L0/low_freq_factor = {n0}/{lo:g} "
                "(slow pairs, which never turned in the training length) are divided "
                f"by the factor; pairs with λ_i below L0/high_freq_factor = "
                f"{n0}/{hi:g} are kept.",
                swapped,
            ),
            Mistake(
                "every pair divided by the factor",
                "that is position interpolation; Llama 3 keeps the high-frequency "
                "band.",
                theta / factor,
            ),
            Mistake(
                "blend weights reversed in the middle band",
                "in the middle band θ'_i = (1 - μ_i) θ_i / s + μ_i θ_i with "
                "μ_i = (L0/λ_i - low_freq_factor) / (high_freq_factor - "
                "low_freq_factor): μ_i = 1 at the fast edge.",
                torch.where(outer, expected, swapped),
            ),
        ]
        yield Case(
            "high band kept, low band divided by the factor, middle blended",
            inputs,
            expected,
            mistakes,
            atol=0.0,
            rtol=1e-5,
        )
