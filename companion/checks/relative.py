r"""Checkers for the chapter on the rest of the position family (:ref:`ch-relative`):
T5's buckets, Shaw et al.'s clipped indices, p-RoPE and Men et al.'s decay sum."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import torch

from companion import relative, rope_variants
from companion.checks._core import Case, Mistake, checker
from companion.rope import rope_frequencies

__all__ = [
    "check_decay_sum",
    "check_p_rope_frequencies",
    "check_shaw_relative_index",
    "check_t5_bucket",
]


@checker
def check_t5_bucket(t5_bucket: Callable[..., object]) -> Iterator[Case]:
    r"""Check a learner's ``t5_bucket(relative_position, bidirectional, num_buckets,
    max_distance)``: T5's bucket of each :math:`j - i`.

    Reference: :func:`companion.relative.t5_relative_position_bucket` (equal to Hugging
    Face's ``T5Attention._relative_position_bucket``). Cases: :math:`j - i` from -200 to
    200 with T5's encoder (32 buckets, 128), its decoder, 16 buckets up to 16, and a
    decoder with 9 buckets up to 128, where the logarithm's precision decides three
    buckets (distances 8, 16 and 64: their quotients by 4 are powers of two, and
    float32's ``log`` rounds the ratio up to a whole bucket where float64's stays just
    below it). Named mistakes: "query minus key" (:math:`i - j` in place of
    :math:`j - i`), "no last bucket" (the logarithmic bucket not clipped at
    ``num_buckets - 1``), "future in the lower half" (the offset of the bidirectional
    case on the past keys), "logarithm in float64" (or Python's ``math.log``: T5's code
    takes it in float32).

    Args:
        t5_bucket: a function returning an integer tensor of buckets.
    """
    rel = torch.arange(-200, 201)
    for bidirectional, buckets, dist in (
        (True, 32, 128),
        (False, 32, 128),
        (True, 16, 16),
        (False, 9, 128),  # float32 and float64 differ at distances 8, 16, 64
    ):
        ref = relative.t5_relative_position_bucket(
            rel, bidirectional=bidirectional, num_buckets=buckets, max_distance=dist
        )
        n = buckets // 2 if bidirectional else buckets
        mistakes = [
            Mistake(
                "query minus key",
                "the bucket is of j - i (key minus query, HF's memory_position - "
                "context_position): past keys have negative relative positions.",
                relative.t5_relative_position_bucket(
                    -rel,
                    bidirectional=bidirectional,
                    num_buckets=buckets,
                    max_distance=dist,
                ),
            ),
            Mistake(
                "no last bucket",
                f"distances from max_distance = {dist} on all share the last bucket "
                f"of a direction ({n - 1}): clip the logarithmic bucket with "
                f"min(..., {n - 1}).",
                _variant(rel, bidirectional, buckets, dist, clip=False),
            ),
        ]
        in_float64 = _variant(rel, bidirectional, buckets, dist, dtype=torch.float64)
        if not torch.equal(in_float64, ref):
            wrong = (in_float64 != ref).nonzero().flatten()
            far = sorted({abs(int(rel[w])) for w in wrong})
            mistakes.append(
                Mistake(
                    "logarithm in float64",
                    "take the logarithm in float32, as T5's code does "
                    "(torch.log of a float32 tensor): in float64 (or with math.log) "
                    f"distances {far} fall one bucket lower.",
                    in_float64,
                )
            )
        if bidirectional:
            mistakes.append(
                Mistake(
                    "future in the lower half",
                    f"keys after the query (j - i > 0) take the upper {n} buckets "
                    f"(offset {n}); keys at or before it the lower ones.",
                    ref + torch.where(rel > 0, -n, n),
                )
            )
        yield Case(
            f"{'encoder' if bidirectional else 'decoder'} buckets, {buckets} buckets, "
            f"max_distance {dist}",
            {
                "relative_position": rel,
                "bidirectional": bidirectional,
                "num_buckets": buckets,
                "max_distance": dist,
            },
            ref,
            mistakes,
            integer="buckets index T5's table of learned biases (an nn.Embedding)",
            atol=0.0,
            rtol=0.0,
        )


def _variant(
    rel: torch.Tensor,
    bidirectional: bool,
    buckets: int,
    dist: int,
    *,
    clip: bool = True,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """T5's buckets, with or without the clip at the last bucket of a direction, the
    logarithm in ``dtype`` (T5's code: clipped, float32)."""
    n = buckets // 2 if bidirectional else buckets
    if bidirectional:
        offset, d = (rel > 0).long() * n, rel.abs()
    else:
        offset, d = torch.zeros_like(rel), (-rel).clamp(min=0)
    exact = n // 2
    ratio = torch.log(d.clamp(min=exact).to(dtype) / exact) / math.log(dist / exact)
    large = exact + (ratio * (n - exact)).long()
    if clip:
        large = large.clamp(max=n - 1)
    return offset + torch.where(d < exact, d, large)


@checker
def check_shaw_relative_index(
    shaw_relative_index: Callable[..., object],
) -> Iterator[Case]:
    r"""Check a learner's ``shaw_relative_index(query_length, key_length,
    max_relative_position)``: the row of Shaw et al.'s table for each pair,
    :math:`\mathrm{clip}(j - i, -K, K) + K`.

    Reference: :func:`companion.relative.shaw_relative_index`. Cases: ``(5, 5)`` with
    :math:`K = 2`, ``(8, 8)`` with :math:`K = 3`, ``(6, 6)`` with :math:`K = 0`.
    Named mistakes: "query minus key" (:math:`i - j`), "no offset K" (the clipped
    distance used as a row, negative), "no clipping".

    Args:
        shaw_relative_index: a function returning an integer ``(L, S)`` tensor.
    """
    for length, k in ((5, 2), (8, 3), (6, 0)):
        rel = relative.relative_positions(length, length)
        yield Case(
            f"rows clip(j - i, -K, K) + K for L = S = {length}, K = {k}",
            {"query_length": length, "key_length": length, "max_relative_position": k},
            relative.shaw_relative_index(length, length, k),
            [
                Mistake(
                    "query minus key",
                    "the row is of j - i (key minus query): the key one place back "
                    "is row K - 1.",
                    (-rel).clamp(-k, k) + k,
                ),
                Mistake(
                    "no offset K",
                    f"clip(j - i, -K, K) runs from -K to K; add K = {k} so that the "
                    "rows run from 0 to 2K.",
                    rel.clamp(-k, k),
                ),
                Mistake(
                    "no clipping",
                    f"distances beyond K = {k} share the last row: clip j - i to "
                    "[-K, K] before adding K.",
                    rel + k,
                ),
            ],
            integer="rows index Shaw et al.'s table of 2K + 1 learned vectors",
            atol=0.0,
            rtol=0.0,
        )


@checker
def check_p_rope_frequencies(
    p_rope_frequencies: Callable[..., object],
) -> Iterator[Case]:
    r"""Check a learner's ``p_rope_frequencies(head_dim, fraction, base)``: RoPE's
    :math:`\theta_i` for the fastest :math:`\lfloor p D/2 \rfloor` pairs, 0 for
    the others.

    Reference: :func:`companion.rope_variants.p_rope_frequencies`. Cases: ``(8, 0.5)``,
    ``(128, 0.25)``, ``(64, 0.75)``, ``(16, 1.0)``, base 10000 (500000 for one), and
    ``(64, 0.3)`` and ``(24, 0.3)``, where :math:`pD/2 = 9.6` and :math:`3.6` are not
    whole. Named mistakes: "slowest pairs kept" (the fastest set to zero instead),
    "pairs removed" (a shorter vector: p-RoPE keeps the width, the slow pairs do not
    turn), "rounded to the nearest" (``round(p D/2)``, where Barbero et al.'s code and
    Hugging Face's ``proportional`` RoPE, as this book, floor: ``int(p * D // 2)``).

    Args:
        p_rope_frequencies: a function returning a ``(D/2,)`` tensor.
    """
    for head_dim, p, base in (
        (8, 0.5, 1e4),
        (128, 0.25, 5e5),
        (64, 0.75, 1e4),
        (16, 1.0, 1e4),
        (64, 0.3, 1e4),  # p D/2 = 9.6: floored 9, rounded 10
        (24, 0.3, 1e4),  # p D/2 = 3.6: floored 3 (Hugging Face), rounded 4
    ):
        theta = rope_frequencies(head_dim, base=base)
        kept = int(p * head_dim // 2)
        rounded = theta.clone()
        rounded[round(p * head_dim / 2) :] = 0.0
        slow = theta.clone()
        slow[: head_dim // 2 - kept] = 0.0
        yield Case(
            f"the fastest {kept} of {head_dim // 2} pairs turn (D = {head_dim}, p = {p})",
            {"head_dim": head_dim, "fraction": p, "base": base},
            rope_variants.p_rope_frequencies(head_dim, p, base=base),
            [
                Mistake(
                    "slowest pairs kept",
                    "p-RoPE drops the lowest frequencies (the last pairs, the slow "
                    "ones) and keeps the fastest: theta_i for i < floor(p D/2).",
                    slow,
                ),
                Mistake(
                    "pairs removed",
                    "keep all D/2 entries: the dropped pairs get frequency 0 (they do "
                    "not turn, and carry content at every distance).",
                    theta[:kept],
                ),
            ]
            + (
                [
                    Mistake(
                        "rounded to the nearest",
                        f"p D/2 = {p * head_dim / 2:g}: floor it ({kept} pairs turn), "
                        "int(p * D // 2) as Barbero et al.'s code and Hugging Face's "
                        f"proportional RoPE do; round() gives {round(p * head_dim / 2)}.",
                        rounded,
                    )
                ]
                if round(p * head_dim / 2) != kept
                else []
            ),
            atol=1e-12,
            rtol=1e-6,
        )


@checker
def check_decay_sum(decay_sum: Callable[..., object]) -> Iterator[Case]:
    r"""Check a learner's ``decay_sum(offsets, head_dim, base)``: Men et al.'s
    :math:`B(m) = \sum_{i=0}^{D/2-1} \cos(m\,\theta_i)` at each offset :math:`m`.

    Reference: :func:`companion.rope_variants.rope_decay_sum`. Cases: offsets 0 to 4095 at
    :math:`D = 128`, :math:`b = 10^4` (Llama 2), and 0 to 100 at :math:`D = 8`,
    :math:`b = 100`. Named mistakes: "sine in place of cosine", "averaged over the
    pairs" (divided by :math:`D/2`), "sum over D frequencies" (:math:`\theta_i =
    b^{-i/D}` for :math:`i < D`, twice the pairs). Tolerance ``atol=2e-3``: frequencies
    or angles in float32 (``base ** (-torch.arange(0, D, 2) / D)`` is float32) put
    :math:`B(m)` up to 4.5e-4 off at :math:`m \approx 4000`; the named mistakes are off
    by more than 1.

    Args:
        decay_sum: a function returning a float ``(M,)`` tensor.
    """
    for head_dim, base, count in ((128, 1e4, 4096), (8, 100.0, 101)):
        m = torch.arange(count, dtype=torch.float64)
        theta = rope_frequencies(head_dim, base=base)
        angles = m[:, None] * theta
        all_d = base ** (-torch.arange(head_dim, dtype=torch.float64) / head_dim)
        mistakes = [
            Mistake(
                "sine in place of cosine",
                "the score of q = k = 1 at offset m is the sum of cos(m theta_i): "
                "B(0) = D/2.",
                angles.sin().sum(dim=-1),
            ),
            Mistake(
                "averaged over the pairs",
                "B(m) is the sum over the D/2 pairs, not the mean (B(0) = D/2).",
                angles.cos().mean(dim=-1),
            ),
            Mistake(
                "sum over D frequencies",
                "there are D/2 pairs, theta_i = b^(-2i/D) for i < D/2.",
                (m[:, None] * all_d).cos().sum(dim=-1),
            ),
        ]
        prop = f"B(m) for D = {head_dim}, b = {base:g}, m = 0..{count - 1}"
        inputs = {"offsets": m, "head_dim": head_dim, "base": base}
        reference = rope_variants.rope_decay_sum(m, head_dim, base=base)
        # atol: a float32 answer is correct (4.5e-4 off at m = 3535)
        yield Case(prop, inputs, reference, mistakes, atol=2e-3, rtol=0.0)
