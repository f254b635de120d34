"""Chapter 02's checkers (RoPE): correct answers in several styles, Hugging Face's and
Meta's code included, pass; each named mistake is named."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import (
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

from companion import checks, rope

# ---- check_rope_frequencies ----------------------------------------------------------


def hf_inv_freq(head_dim, base):
    """Hugging Face's compute_default_rope_parameters (float32)."""
    return 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))


@pytest.mark.parametrize(
    "answer",
    [
        lambda head_dim, base: [
            base ** (-2 * i / head_dim) for i in range(head_dim // 2)
        ],
        lambda d, b, /: b ** (-np.arange(0, d, 2) / d),
        lambda d, b: 1.0 / b ** (torch.arange(0, d, 2, dtype=torch.float64) / d),
        lambda head_dim, base: rope.rope_frequencies(head_dim, base=base),
    ],
    ids=["list", "numpy", "hf-style-float64", "companion"],
)
def test_rope_frequencies_accepts(answer) -> None:
    assert checks.check_rope_frequencies(answer)


def test_rope_frequencies_names(named) -> None:
    def i_over_d(head_dim, base):
        return base ** (-torch.arange(head_dim // 2, dtype=torch.float64) / head_dim)

    def flipped(head_dim, base):
        return base ** (2 * torch.arange(head_dim // 2, dtype=torch.float64) / head_dim)

    named(lambda: checks.check_rope_frequencies(i_over_d), "frequencies base^(-i/D)")
    named(
        lambda: checks.check_rope_frequencies(lambda d, b: hf_inv_freq(d, b).double()),
        "computed in float32",
    )
    named(
        lambda: checks.check_rope_frequencies(flipped), "exponent with the wrong sign"
    )


# ---- check_apply_rope ----------------------------------------------------------------


def _cos_sin64(positions, dim, base, exponent=2.0):
    theta = base ** (-exponent * torch.arange(dim // 2, dtype=torch.float64) / dim)
    angle = positions.to(torch.float64)[:, None] * theta  # (L, D/2)
    return angle.cos(), angle.sin()


def rope_half_hf(x, positions, base):
    """transformers' apply_rotary_pos_emb, with a float64-angle table."""
    cos, sin = _cos_sin64(positions, x.shape[-1], base)
    cos, sin = (
        torch.cat((cos, cos), -1).to(x.dtype),
        torch.cat((sin, sin), -1).to(x.dtype),
    )
    q, _ = apply_rotary_pos_emb(x, x, cos, sin, unsqueeze_dim=0)
    return q


def rope_half_hf_float32(x, positions, base):
    """transformers' LlamaRotaryEmbedding + apply_rotary_pos_emb: float32 angles."""
    d = x.shape[-1]
    config = LlamaConfig(
        hidden_size=2 * d,
        num_attention_heads=2,
        head_dim=d,
        rope_parameters={"rope_type": "default", "rope_theta": base},
    )
    cos, sin = LlamaRotaryEmbedding(config)(x, positions[None])  # (1, L, D)
    q, _ = apply_rotary_pos_emb(x, x, cos[0], sin[0], unsqueeze_dim=0)
    return q


def rope_interleaved_meta(x, positions, base):
    """Meta's apply_rotary_emb: pairs as complex numbers (freqs_cis in float64)."""
    cos, sin = _cos_sin64(positions, x.shape[-1], base)
    freqs_cis = torch.complex(cos, sin)  # (L, D/2)
    x_ = torch.view_as_complex(x.double().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(x_ * freqs_cis).flatten(-2).to(x.dtype)


def rope_loops(layout):
    def fn(x, positions, base):
        d, out = x.shape[-1], x.clone()
        for row, m in enumerate(positions.tolist()):
            for i in range(d // 2):
                t = m * base ** (-2 * i / d)
                j, k = (i, i + d // 2) if layout == "half" else (2 * i, 2 * i + 1)
                a, b = x[..., row, j], x[..., row, k]
                out[..., row, j] = a * math.cos(t) - b * math.sin(t)
                out[..., row, k] = b * math.cos(t) + a * math.sin(t)
        return out

    return fn


def rope_half_in_place(x, positions, base):
    cos, sin = (t.to(x.dtype) for t in _cos_sin64(positions, x.shape[-1], base))
    a, b = x.chunk(2, dim=-1)  # views into x
    a_old = a.clone()
    a.mul_(cos).sub_(b * sin)
    b.mul_(cos).add_(a_old * sin)
    return x


def rope_companion(layout):
    def fn(tokens, where, theta_base, /):
        cos, sin = rope.rope_cos_sin(
            where, rope.rope_frequencies(tokens.shape[-1], base=theta_base)
        )
        return rope.apply_rope(tokens, cos, sin, layout=layout)

    return fn


@pytest.mark.parametrize(
    ("layout", "answer"),
    [
        ("half", rope_half_hf),
        ("half", rope_loops("half")),
        ("half", rope_half_in_place),
        ("half", rope_companion("half")),
        ("interleaved", rope_interleaved_meta),
        ("interleaved", rope_loops("interleaved")),
        ("interleaved", rope_companion("interleaved")),
    ],
    ids=[
        "hf",
        "loops-half",
        "in-place",
        "companion-half",
        "meta",
        "loops-il",
        "companion-il",
    ],
)
def test_apply_rope_accepts(layout, answer) -> None:
    assert checks.check_apply_rope(answer, layout=layout)


def _learner(layout, *, exponent=2.0, sign=1.0, ignore_positions=False):
    def fn(x, positions, base):
        if ignore_positions:
            positions = torch.arange(x.shape[-2])
        cos, sin = _cos_sin64(positions, x.shape[-1], base, exponent)
        return rope.apply_rope(x, cos.float(), sign * sin.float(), layout=layout)

    return fn


@pytest.mark.parametrize("layout", rope.LAYOUTS)
def test_apply_rope_names(layout, named) -> None:
    other = "interleaved" if layout == "half" else "half"
    cases = [
        (_learner(other), "rotating the wrong pairs for the declared layout"),
        (_learner(layout, sign=-1.0), "the sign of the rotation flipped"),
        (_learner(layout, exponent=1.0), "frequencies base^(-i/D)"),
        (_learner(layout, ignore_positions=True), "positions ignored"),
    ]
    for answer, name in cases:
        named(
            lambda answer=answer: checks.check_apply_rope(answer, layout=layout), name
        )


def test_apply_rope_accepts_hugging_faces_production_code() -> None:
    # float32 angles are within the tolerance at positions up to 4096
    assert checks.check_apply_rope(rope_half_hf_float32, layout="half")


# ---- check_rope_attention ------------------------------------------------------------


def _rope_attention(rotate_v=False, rotate_qk=True):
    def fn(query, key, value, positions, base):
        if rotate_qk:
            query, key = (
                rope_half_hf(query, positions, base),
                rope_half_hf(key, positions, base),
            )
        if rotate_v:
            value = rope_half_hf(value, positions, base)
        return torch.nn.functional.scaled_dot_product_attention(query, key, value)

    return fn


def rope_attention_by_hand(q, k, v, pos, base, /):
    q, k = rope_loops("half")(q, pos, base), rope_loops("half")(k, pos, base)
    weights = torch.softmax(q @ k.mT / math.sqrt(q.shape[-1]), dim=-1)
    return (weights @ v).numpy()


@pytest.mark.parametrize(
    "answer",
    [_rope_attention(), rope_attention_by_hand],
    ids=["sdpa-hf", "by-hand-numpy"],
)
def test_rope_attention_accepts(answer) -> None:
    assert checks.check_rope_attention(answer)


def test_rope_attention_names(named) -> None:
    named(
        lambda: checks.check_rope_attention(_rope_attention(rotate_v=True)),
        "rotating v",
    )
    named(
        lambda: checks.check_rope_attention(_rope_attention(rotate_qk=False)),
        "RoPE left out",
    )


# ---- check_rope_weight_permutation ---------------------------------------------------


def permute_hf(w, n_heads, /):
    """``permute`` of transformers' convert_llama_weights_to_hf.py (Meta -> HF)."""
    dim1, dim2 = w.shape
    return (
        w.view(n_heads, dim1 // n_heads // 2, 2, dim2)
        .transpose(1, 2)
        .reshape(dim1, dim2)
    )


def permute_companion(weight, num_heads):
    d = weight.shape[0] // num_heads
    p = rope.interleaved_to_half_permutation(d)
    return weight.view(num_heads, d, -1)[:, p].reshape(weight.shape)


def permute_loops(weight, num_heads):
    d = weight.shape[0] // num_heads
    rows = []
    for h in range(num_heads):
        head = weight[h * d : (h + 1) * d]
        rows += [head[2 * i] for i in range(d // 2)] + [
            head[2 * i + 1] for i in range(d // 2)
        ]
    return torch.stack(rows)


@pytest.mark.parametrize(
    "answer",
    [permute_hf, permute_companion, permute_loops],
    ids=["hf", "companion", "loops"],
)
def test_rope_weight_permutation_accepts(answer) -> None:
    assert checks.check_rope_weight_permutation(answer)


def test_rope_weight_permutation_names(named) -> None:
    def backwards(weight, num_heads):
        d = weight.shape[0] // num_heads
        p = rope.half_to_interleaved_permutation(d)
        return weight.view(num_heads, d, -1)[:, p].reshape(weight.shape)

    def one_for_all(weight, num_heads):
        return weight[rope.interleaved_to_half_permutation(weight.shape[0])]

    named(
        lambda: checks.check_rope_weight_permutation(backwards),
        "permutation in the wrong direction",
    )
    named(
        lambda: checks.check_rope_weight_permutation(one_for_all),
        "one permutation over all rows instead of one per head",
    )


# ---- check_rope_cos_sin --------------------------------------------------------------


def cos_sin_numpy(positions, head_dim, base):
    angle = positions.numpy()[:, None] * base ** (-np.arange(0, head_dim, 2) / head_dim)
    return np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)


@pytest.mark.parametrize(
    "answer",
    [
        lambda positions, head_dim, base: tuple(
            t.float() for t in _cos_sin64(positions, head_dim, base)
        ),
        cos_sin_numpy,
        lambda p, d, b, /: list(rope.rope_cos_sin(p, rope.rope_frequencies(d, base=b))),
    ],
    ids=["float64-angles", "numpy", "companion-list"],
)
def test_rope_cos_sin_accepts(answer) -> None:
    assert checks.check_rope_cos_sin(answer)


def cos_sin_hf(positions, head_dim, base):
    """transformers' LlamaRotaryEmbedding: one half of its (L, D) table."""
    config = LlamaConfig(
        hidden_size=2 * head_dim,
        num_attention_heads=2,
        head_dim=head_dim,
        rope_parameters={"rope_type": "default", "rope_theta": base},
    )
    x = torch.zeros(1, len(positions), head_dim)
    cos, sin = LlamaRotaryEmbedding(config)(x, positions[None])
    return cos[0, :, : head_dim // 2], sin[0, :, : head_dim // 2]


def cos_sin_meta(positions, head_dim, base):
    """Meta's precompute_freqs_cis (llama/model.py), at the given positions."""
    freqs = 1.0 / (
        base ** (torch.arange(0, head_dim, 2)[: (head_dim // 2)].float() / head_dim)
    )
    t = positions.to(torch.float32)
    freqs = torch.outer(t, freqs).float()
    freqs_cis = torch.polar(torch.ones_like(freqs), freqs)  # complex64
    return freqs_cis.real, freqs_cis.imag


@pytest.mark.parametrize("answer", [cos_sin_hf, cos_sin_meta], ids=["hf", "meta"])
def test_rope_cos_sin_names_the_hf_and_meta_recipe(answer, named) -> None:
    err = named(lambda: checks.check_rope_cos_sin(answer), "angles computed in float32")
    assert "Hugging Face's LlamaRotaryEmbedding and Meta's precompute_freqs_cis" in str(
        err
    )


def test_rope_cos_sin_names_and_explains(named) -> None:
    def wrong_freqs(positions, head_dim, base):
        return tuple(
            t.float() for t in _cos_sin64(positions, head_dim, base, exponent=1.0)
        )

    named(lambda: checks.check_rope_cos_sin(wrong_freqs), "frequencies base^(-i/D)")
    with pytest.raises(checks.CheckError, match=r"Return a pair \(cos, sin\)"):
        checks.check_rope_cos_sin(lambda p, d, b: _cos_sin64(p, d, b)[0])
    with pytest.raises(
        checks.CheckError, match=r"expected: torch.float32\n  got:      torch.float64"
    ):
        checks.check_rope_cos_sin(lambda p, d, b: _cos_sin64(p, d, b))


def test_rope_frequencies_wants_the_float64_the_exercise_asks_for() -> None:
    with pytest.raises(
        checks.CheckError, match="asks for float64; your answer is float32"
    ):
        checks.check_rope_frequencies(hf_inv_freq)
