r"""Checkers for chapter 02 (:ref:`ch-rope`): rotary position embedding."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from companion import _validate, rope
from companion.checks._core import Case, Mistake, checker

__all__ = [
    "check_apply_rope",
    "check_rope_attention",
    "check_rope_cos_sin",
    "check_rope_frequencies",
    "check_rope_weight_permutation",
]


def _rotate(
    x: torch.Tensor,
    positions: torch.Tensor,
    base: float,
    *,
    layout: str = "half",
    exponent: float = 2.0,
    sign: float = 1.0,
) -> torch.Tensor:
    """RoPE in float64, right and wrong: pair i at position m turns by
    sign * m * theta_i with theta_i = base^(-exponent * i / D); pairs (i, i + D/2) or
    (2i, 2i + 1)."""
    dim = x.shape[-1]
    theta = base ** (-exponent * torch.arange(dim // 2, dtype=torch.float64) / dim)
    angle = positions.to(torch.float64)[:, None] * theta  # (L, D/2)
    cos, sin = angle.cos(), sign * angle.sin()
    x64 = x.to(torch.float64)
    if layout == "half":
        a, b = x64[..., : dim // 2], x64[..., dim // 2 :]
        out = torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)
    else:
        a, b = x64[..., 0::2], x64[..., 1::2]
        out = torch.stack((a * cos - b * sin, b * cos + a * sin), dim=-1).flatten(-2)
    return out.to(x.dtype)


@checker
def check_rope_frequencies(
    rope_frequencies: Callable[..., torch.Tensor],
) -> Iterator[Case]:
    r"""Check a learner's ``rope_frequencies(head_dim, base)``: :math:`b^{-2i/D}`.

    Properties checked: one frequency per *pair* (``D/2`` values), the exponent
    ``-2i/D``, for several widths and bases, in float64 as the exercise asks (a
    float32 answer is refused by its dtype). Named mistakes: "frequencies
    base^(-i/D)", "exponent with the wrong sign", "computed in float32" (cast at the
    end).

    Args:
        rope_frequencies: a function ``rope_frequencies(head_dim, base) -> (D/2,)``.
    """
    for head_dim, base in [(8, 10000.0), (64, 10000.0), (16, 500000.0)]:
        i = torch.arange(head_dim // 2, dtype=torch.float64)
        reference = rope.rope_frequencies(head_dim, base=base)
        mistakes = [
            Mistake(
                "computed in float32",
                "your values are right to float32 precision (about 7 digits), cast to "
                "float64 at the end: compute the powers in float64 "
                "(torch.arange(..., dtype=torch.float64)).",
                reference,
                rtol=1e-5,
            ),
            Mistake(
                "frequencies base^(-i/D)",
                "the exponent runs over the pair index i = 0 .. D/2-1 and is -2i/D, so "
                "the slowest pair turns at about 1/base per position; with -i/D it "
                "only reaches 1/sqrt(base).",
                base ** (-i / head_dim),
            ),
            Mistake(
                "exponent with the wrong sign",
                "θ_i = base**(-2i/D) decreases from 1; base**(2i/D) grows to "
                "nearly base radians per position.",
                base ** (2 * i / head_dim),
            ),
        ]
        yield Case(
            "θ_i = base^(-2i/D), one per pair, in float64",
            {"head_dim": head_dim, "base": base},
            reference,
            mistakes,
            atol=0.0,
            rtol=1e-12,
            check_dtype=True,  # the exercise asks for float64
        )


@checker
def check_apply_rope(
    apply_rope: Callable[..., torch.Tensor], *, layout: str = "half"
) -> Iterator[Case]:
    r"""Check a learner's ``apply_rope(x, positions, base)`` for the given ``layout``.

    Properties checked: the rotation of pair ``i`` at position ``m`` by
    :math:`m\theta_i`, counterclockwise (:math:`(a, b) \mapsto (a\cos - b\sin, b\cos +
    a\sin)`), with the pairs of ``layout`` (``"half"``: ``(i, i + D/2)``, Hugging
    Face's; ``"interleaved"``: ``(2i, 2i + 1)``, Meta's), for positions that do not
    start at 0. Named mistakes: "rotating the wrong pairs for the declared layout", "the
    sign of the rotation flipped", "frequencies base^(-i/D)", "positions ignored".
    Hugging Face's ``LlamaRotaryEmbedding`` with ``apply_rotary_pos_emb`` passes (its
    float32 angles are within tolerance at the positions checked, up to 4096).

    Args:
        apply_rope: a function ``apply_rope(x, positions, base) -> Tensor`` with ``x``
            of shape ``(..., L, D)`` and integer ``positions`` of shape ``(L,)``.
        layout: the pairing the learner's function declares, one of
            ``companion.rope.LAYOUTS``.
    """
    layout = _validate.choice("layout", layout, rope.LAYOUTS)
    other = "interleaved" if layout == "half" else "half"
    pairs = "(i, i + D/2)" if layout == "half" else "(2i, 2i + 1)"
    gen = torch.Generator().manual_seed(0)
    cases = [
        (
            "rotates pair i by m θ_i",
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
        mistakes = [
            Mistake(
                "rotating the wrong pairs for the declared layout",
                f"layout={layout!r} pairs {pairs}; your function rotated the pairs of "
                f"layout={other!r}.",
                _rotate(x, positions, base, layout=other),
            ),
            Mistake(
                "the sign of the rotation flipped",
                "pair (a, b) at angle t becomes (a cos t - b sin t, b cos t + a sin "
                "t), a multiplication by e^(+i t) (i the imaginary unit); you rotated "
                "by -t (clockwise).",
                _rotate(x, positions, base, layout=layout, sign=-1.0),
            ),
            Mistake(
                "frequencies base^(-i/D)",
                "θ_i = base**(-2i/D) over the pair index i = 0 .. D/2-1.",
                _rotate(x, positions, base, layout=layout, exponent=1.0),
            ),
            Mistake(
                "positions ignored",
                "rotate row l by the angle of positions[l], not by l: position ids "
                "need not start at 0 or be consecutive (a KV cache, packed sequences).",
                _rotate(x, torch.arange(x.shape[-2]), base, layout=layout),
            ),
        ]
        inputs = {"x": x, "positions": positions, "base": base}
        yield Case(
            prop,
            inputs,
            _rotate(x, positions, base, layout=layout),
            mistakes,
            shown={**inputs, "layout": layout},
        )


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    weights = torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, dim=-1)
    return weights @ v  # (B, H, L, D)


@checker
def check_rope_attention(rope_attention: Callable[..., torch.Tensor]) -> Iterator[Case]:
    r"""Check a learner's ``rope_attention(query, key, value, positions, base)``.

    The reference rotates query and key with RoPE (half layout), leaves the values
    alone, and returns ``softmax(q k^T / sqrt(D)) v`` (no mask). Named mistakes:
    "rotating v", "RoPE left out".

    Args:
        rope_attention: a function ``(query, key, value, positions, base) -> Tensor`` on
            ``(B, H, L, D)`` tensors with ``positions`` of shape ``(L,)``.
    """
    gen = torch.Generator().manual_seed(1)
    for positions in (torch.arange(5), torch.arange(5) + 40):
        q, k, v = (
            torch.randn(2, 2, 5, 8, generator=gen, dtype=torch.float64) for _ in "qkv"
        )
        rq, rk, rv = (_rotate(t, positions, 10000.0) for t in (q, k, v))
        mistakes = [
            Mistake(
                "rotating v",
                "RoPE rotates queries and keys only; the values carry content, not "
                "position, and rotating them mixes each output's coordinates by the "
                "key's position.",
                _attend(rq, rk, rv),
            ),
            Mistake(
                "RoPE left out",
                "rotate query and key (with the same positions) before the dot "
                "products.",
                _attend(q, k, v),
            ),
        ]
        yield Case(
            "softmax(R q (R k)^T / sqrt(D)) v",
            {"query": q, "key": k, "value": v, "positions": positions, "base": 10000.0},
            _attend(rq, rk, v),
            mistakes,
        )


@checker
def check_rope_weight_permutation(
    convert: Callable[..., torch.Tensor],
) -> Iterator[Case]:
    r"""Check a learner's ``convert(weight, num_heads)``: interleaved rows to half.

    ``weight`` is a query or key projection ``(num_heads * D, d_model)`` trained with
    the interleaved layout (Meta's checkpoints); the answer permutes the ``D`` output
    rows of each head with :func:`companion.rope.interleaved_to_half_permutation`, so
    that the half layout (Hugging Face) gives the same attention scores. Named mistakes:
    "permutation in the wrong direction", "one permutation over all rows instead of one
    per head".

    Args:
        convert: a function ``convert(weight, num_heads) -> Tensor`` of the same shape.
    """
    gen = torch.Generator().manual_seed(2)
    for num_heads, head_dim, d_model in [(2, 8, 6), (3, 4, 5)]:
        weight = torch.randn(num_heads * head_dim, d_model, generator=gen)
        per_head = weight.view(num_heads, head_dim, d_model)  # (H, D, d_model)
        forward = rope.interleaved_to_half_permutation(head_dim)
        backward = rope.half_to_interleaved_permutation(head_dim)
        mistakes = [
            Mistake(
                "permutation in the wrong direction",
                "row i of the half layout is row p[i] = 2i (i < D/2) of the "
                "interleaved one: index with interleaved_to_half_permutation, not its "
                "inverse.",
                per_head[:, backward].reshape(weight.shape),
            ),
            Mistake(
                "one permutation over all rows instead of one per head",
                "the pairs live inside each head: view the rows as (num_heads, D, "
                "d_model) and permute the D axis.",
                weight[rope.interleaved_to_half_permutation(num_heads * head_dim)],
            ),
        ]
        yield Case(
            "rows of each head permuted from interleaved to half layout",
            {"weight": weight, "num_heads": num_heads},
            per_head[:, forward].reshape(weight.shape),
            mistakes,
            atol=0.0,
            rtol=0.0,
        )


def _float32_angles(
    positions: torch.Tensor, head_dim: int, base: float
) -> torch.Tensor:
    """Hugging Face's ``LlamaRotaryEmbedding`` recipe (Meta's
    ``precompute_freqs_cis`` is the same): ``inv_freq`` and the angles in float32."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (base**exponents)  # (D/2,) float32
    return positions.float()[:, None] * inv_freq  # (L, D/2) float32


@checker
def check_rope_cos_sin(
    rope_cos_sin: Callable[..., tuple[torch.Tensor, torch.Tensor]],
) -> Iterator[Case]:
    r"""Check a learner's ``rope_cos_sin(positions, head_dim, base) -> (cos, sin)``.

    Properties checked: ``cos`` and ``sin`` of :math:`m\theta_i`, shape ``(L, D/2)``,
    float32, within ``3e-7`` of the float64-angle table (a few float32 rounding steps of
    values near 1) at positions up to :math:`2^{20}`. Named mistakes: "angles computed
    in float32" (the recipe of Hugging Face's ``LlamaRotaryEmbedding`` and Meta's
    ``precompute_freqs_cis``, off by up to a few hundredths of a radian at the positions
    checked; recognized by the size of the error, whatever the order of operations),
    "frequencies base^(-i/D)".

    Args:
        rope_cos_sin: a function ``(positions, head_dim, base) -> (cos, sin)``.
    """
    cases = [
        ("cos and sin of m θ_i", torch.arange(6), 8, 10000.0),
        (
            "float32-accurate at positions near 2^20",
            torch.tensor([2**20 - 1, 1_000_003, 777_777]),
            16,
            10000.0,
        ),
    ]
    for prop, positions, head_dim, base in cases:
        theta = rope.rope_frequencies(head_dim, base=base)
        angle = positions.to(torch.float64)[:, None] * theta  # (L, D/2) float64
        wrong = positions.to(torch.float64)[:, None] * base ** (
            -torch.arange(head_dim // 2, dtype=torch.float64) / head_dim
        )
        ang32 = _float32_angles(positions, head_dim, base)
        mistakes = [
            Mistake(
                "frequencies base^(-i/D)",
                "θ_i = base**(-2i/D) over the pair index i = 0 .. D/2-1.",
                (wrong.cos().float(), wrong.sin().float()),
            ),
            Mistake(
                "angles computed in float32",
                "this is the recipe of Hugging Face's LlamaRotaryEmbedding and Meta's "
                "precompute_freqs_cis: m θ_i in float32 keeps about 7 significant "
                "digits, so at m near 2^20 the angle is off by up to a few hundredths "
                "of a radian. Form the angles in float64, take cos and sin, then cast "
                "to float32.",
                (ang32.cos().double(), ang32.sin().double()),
                atol=0.25,
                rtol=0.0,
            ),
        ]
        yield Case(
            prop,
            {"positions": positions, "head_dim": head_dim, "base": base},
            (angle.cos().float(), angle.sin().float()),
            mistakes,
            atol=3e-7,
            rtol=0.0,
            check_dtype=True,
            parts=("cos", "sin"),
        )
