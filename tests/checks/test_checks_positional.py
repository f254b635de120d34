"""Chapter 01's checkers (sinusoidal encoding): correct answers in several styles pass,
each named mistake is named."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from companion import checks, positional

# ---- check_sinusoidal_encoding -------------------------------------------------------


def encoding_loops(num_positions, dim):
    out = torch.empty(num_positions, dim)
    for pos in range(num_positions):
        for i in range(dim // 2):
            angle = pos / 10000.0 ** (2 * i / dim)  # Python floats: float64
            out[pos, 2 * i], out[pos, 2 * i + 1] = math.sin(angle), math.cos(angle)
    return out


def encoding_numpy(num_positions, dim):
    angles = np.arange(num_positions)[:, None] / 10000.0 ** (np.arange(0, dim, 2) / dim)
    out = np.empty((num_positions, dim))
    out[:, 0::2], out[:, 1::2] = np.sin(angles), np.cos(angles)
    return out


def encoding_distilbert(n, d, /):
    """Hugging Face's create_sinusoidal_embeddings (DistilBERT, XLM): fills ``out``."""
    from transformers.models.distilbert.modeling_distilbert import (
        create_sinusoidal_embeddings,
    )

    out = torch.empty(n, d)
    create_sinusoidal_embeddings(n, d, out)
    return out


def _table(n, d, *, exponent=None, base=10000.0, swap=False, halves=False, scale=1.0):
    """A learner's table with one thing changed."""
    pos = torch.arange(n, dtype=torch.float64)[:, None]
    if exponent is None:
        w = scale * base ** (-2.0 * torch.arange(d // 2, dtype=torch.float64) / d)
        ang = pos * w
        a, b = (ang.cos(), ang.sin()) if swap else (ang.sin(), ang.cos())
        if halves:
            return torch.cat((a, b), -1).float()
        return torch.stack((a, b), -1).flatten(-2).float()
    j = torch.arange(d, dtype=torch.float64)
    ang = pos * base ** (-exponent(j, d))
    out = ang.clone()
    out[:, 0::2], out[:, 1::2] = ang[:, 0::2].sin(), ang[:, 1::2].cos()
    return out.float()


def annotated_transformer(num_positions, dim):
    pe = torch.zeros(num_positions, dim)
    position = torch.arange(0, num_positions).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, dim, 2) * -(math.log(10000.0) / dim))
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term)
    return pe


@pytest.mark.parametrize(
    "answer",
    [
        encoding_loops,
        encoding_numpy,
        encoding_distilbert,
        lambda n, d: positional.sinusoidal_encoding(n, d),
        lambda n, d: _table(n, d),
    ],
    ids=["loops", "numpy", "hf-distilbert", "companion", "torch-float64"],
)
def test_sinusoidal_encoding_accepts(answer) -> None:
    assert checks.check_sinusoidal_encoding(answer)


@pytest.mark.parametrize(
    ("options", "name"),
    [
        ({"swap": True}, "sin and cos swapped"),
        ({"exponent": lambda j, d: (j // 2) / d}, "exponent i/D instead of 2i/D"),
        ({"exponent": lambda j, d: 2.0 * j / d}, "pair index running over all D dims"),
        ({"exponent": lambda j, d: j / d}, "column index j/D in the exponent"),
        ({"base": 1000.0}, "base 1000 instead of 10000"),
        (
            {"exponent": lambda j, d: -2.0 * (j // 2) / d},
            "exponent with the wrong sign",
        ),
        ({"scale": 2 * math.pi}, "a factor 2*pi in the frequency"),
        ({"halves": True}, "halves layout instead of interleaved"),
    ],
)
def test_sinusoidal_encoding_names(options, name, named) -> None:
    named(
        lambda: checks.check_sinusoidal_encoding(lambda n, d: _table(n, d, **options)),
        name,
    )


def test_sinusoidal_encoding_names_float32_angles(named) -> None:
    err = named(
        lambda: checks.check_sinusoidal_encoding(annotated_transformer),
        "angles computed in float32",
    )
    assert "accurate at large positions" in err.prop


def test_sinusoidal_encoding_reports_crash_and_shape() -> None:
    def crashes(num_positions, dim):
        raise RuntimeError("boom")

    with pytest.raises(checks.CheckError, match="runs without error"):
        checks.check_sinusoidal_encoding(crashes)
    with pytest.raises(checks.CheckError, match=r"another order \(axes \[0, 1\]"):
        checks.check_sinusoidal_encoding(
            lambda n, d: positional.sinusoidal_encoding(n, d).mT
        )


# ---- check_wavelengths ---------------------------------------------------------------


@pytest.mark.parametrize(
    "answer",
    [
        lambda dim: [2 * math.pi * 10000.0 ** (2 * i / dim) for i in range(dim // 2)],
        lambda dim: 2 * np.pi * 10000.0 ** (np.arange(0, dim, 2) / dim),
        lambda dim: positional.sinusoidal_wavelengths(dim),
        lambda d, /: 2 * math.pi / positional.sinusoidal_frequencies(d),
    ],
    ids=["list", "numpy", "companion", "from-frequencies"],
)
def test_wavelengths_accepts(answer) -> None:
    assert checks.check_wavelengths(answer)


@pytest.mark.parametrize(
    ("answer", "name"),
    [
        (
            lambda d: positional.sinusoidal_frequencies(d),
            "frequency instead of wavelength",
        ),
        (
            lambda d: 1 / positional.sinusoidal_frequencies(d),
            "wavelength without the 2*pi",
        ),
        (
            lambda d: (
                2 * math.pi * 10000.0 ** (torch.arange(d // 2, dtype=torch.float64) / d)
            ),
            "exponent i/D instead of 2i/D",
        ),
        (  # review R3a-12 (e)
            lambda d: math.pi * 10000.0 ** (2 * torch.arange(d // 2) / d),
            "half a period (pi instead of 2*pi)",
        ),
    ],
)
def test_wavelengths_names(answer, name, named) -> None:
    named(lambda: checks.check_wavelengths(answer), name)


# ---- check_shift_matrix --------------------------------------------------------------


def shift_loops(k, dim):
    t = torch.zeros(dim, dim, dtype=torch.float64)
    for i in range(dim // 2):
        b = k / 10000.0 ** (2 * i / dim)
        t[2 * i, 2 * i], t[2 * i, 2 * i + 1] = math.cos(b), -math.sin(b)
        t[2 * i + 1, 2 * i], t[2 * i + 1, 2 * i + 1] = math.sin(b), math.cos(b)
    return t


@pytest.mark.parametrize(
    "answer",
    [
        shift_loops,
        lambda k, dim: positional.shift_matrix(k, dim),
        lambda k, d, /: shift_loops(k, d).numpy(),
    ],
    ids=["loops", "companion", "numpy"],
)
def test_shift_matrix_accepts(answer) -> None:
    assert checks.check_shift_matrix(answer)


def test_shift_matrix_names(named) -> None:
    named(
        lambda: checks.check_shift_matrix(lambda k, d: shift_loops(k, d).mT),
        "sin entries with the wrong sign (blocks transposed)",
    )

    def raw_angle(k, dim):
        c, s = math.cos(k), math.sin(k)
        return torch.block_diag(*[torch.tensor([[c, -s], [s, c]])] * (dim // 2))

    named(lambda: checks.check_shift_matrix(raw_angle), "angle k instead of k * w_i")

    def pe_k_on_diagonal(k, dim):
        w = positional.sinusoidal_frequencies(dim)
        return torch.diag(torch.stack(((k * w).sin(), (k * w).cos()), -1).flatten())

    named(lambda: checks.check_shift_matrix(pe_k_on_diagonal), "PE(k) on the diagonal")


# ---- check_dot_product_curve ---------------------------------------------------------


def dot_from_rows(offsets, dim):
    """The dot product of actual rows PE(m) and PE(m + k), m = 400."""
    w = positional.sinusoidal_frequencies(dim)

    def row(p):
        return torch.stack(((p * w).sin(), (p * w).cos()), -1).flatten(-2)

    m = torch.full_like(offsets, 400.0)
    return (row(m[:, None]) * row((m + offsets)[:, None])).sum(-1)


@pytest.mark.parametrize(
    "answer",
    [
        dot_from_rows,
        lambda offsets, dim: positional.sinusoidal_dot_products(offsets, dim),
        lambda k, d, /: np.cos(
            k.numpy()[:, None] / 10000.0 ** (np.arange(0, d, 2) / d)
        ).sum(-1),
    ],
    ids=["rows", "companion", "numpy"],
)
def test_dot_product_curve_accepts(answer) -> None:
    assert checks.check_dot_product_curve(answer)


@pytest.mark.parametrize(
    ("answer", "name"),
    [
        (
            lambda k, d: (
                (k[:, None] * positional.sinusoidal_frequencies(d)).sin().sum(-1)
            ),
            "sum of sines instead of cosines",
        ),
        (
            lambda k, d: 2 * positional.sinusoidal_dot_products(k, d),
            "each pair counted twice",
        ),
        (
            lambda k, d: positional.sinusoidal_dot_products(k, d) / (d / 2),
            "cosine similarity instead of the dot product",
        ),
    ],
)
def test_dot_product_curve_names(answer, name, named) -> None:
    named(lambda: checks.check_dot_product_curve(answer), name)


# ---- check_shift_recurrence ----------------------------------------------------------


def _recurrence(pe_pos, pe_k, variant="right"):
    s, c = pe_pos[:, 0::2], pe_pos[:, 1::2]
    sk, ck = pe_k[0::2], pe_k[1::2]
    if variant == "notes":
        new_s, new_c = s * sk + c * ck, c * sk + s * ck - s * sk
    elif variant == "notes-cosine":  # the sine fixed, the notes' cosine line kept
        new_s, new_c = s * ck + c * sk, c * sk + s * ck - s * sk
    elif variant == "plus":
        new_s, new_c = s * ck + c * sk, c * ck + s * sk
    else:
        new_s, new_c = s * ck + c * sk, c * ck - s * sk
    return torch.stack((new_s, new_c), -1).flatten(-2)


def recurrence_loops(pe_pos, pe_k):
    out = pe_pos.clone()
    for n in range(pe_pos.shape[0]):
        for i in range(pe_pos.shape[1] // 2):
            sa, ca = pe_pos[n, 2 * i].item(), pe_pos[n, 2 * i + 1].item()
            sb, cb = pe_k[2 * i].item(), pe_k[2 * i + 1].item()
            out[n, 2 * i], out[n, 2 * i + 1] = sa * cb + ca * sb, ca * cb - sa * sb
    return out


@pytest.mark.parametrize(
    "answer",
    [_recurrence, recurrence_loops, lambda a, b, /: _recurrence(a, b).numpy()],
    ids=["vectorized", "loops", "numpy"],
)
def test_shift_recurrence_accepts(answer) -> None:
    assert checks.check_shift_recurrence(answer)


def test_shift_recurrence_names(named) -> None:
    named(
        lambda: checks.check_shift_recurrence(lambda p, k: _recurrence(p, k, "notes")),
        "the recurrence printed in the notes",
    )
    named(
        lambda: checks.check_shift_recurrence(
            lambda p, k: _recurrence(p, k, "notes-cosine")
        ),
        "the notes' cosine line",
    )
    named(
        lambda: checks.check_shift_recurrence(lambda p, k: _recurrence(p, k, "plus")),
        "cos(a+b) with a plus sign",
    )


# ---- check_normalized_positions ------------------------------------------------------


@pytest.mark.parametrize(
    "answer",
    [
        lambda n: torch.linspace(0, 1, n),
        lambda n: np.linspace(0.0, 1.0, n),
        lambda n, /: [p / (n - 1) for p in range(n)],
    ],
    ids=["linspace", "numpy", "list"],
)
def test_normalized_positions_accepts(answer) -> None:
    assert checks.check_normalized_positions(answer)


def test_normalized_positions_names(named) -> None:
    named(
        lambda: checks.check_normalized_positions(lambda n: torch.arange(n) / n),
        "divided by L instead of L - 1",
    )
    named(
        lambda: checks.check_normalized_positions(lambda n: (torch.arange(n) + 1) / n),
        "positions counted from 1",
    )


def test_wavelengths_names_one_per_dimension(named) -> None:
    def per_dimension(dim):
        i = torch.arange(dim, dtype=torch.float64)
        return 2 * torch.pi * 10000.0 ** (2 * i / dim)

    named(
        lambda: checks.check_wavelengths(per_dimension), "one wavelength per dimension"
    )


def test_shift_matrix_row_form_rotation_is_not_called_the_column_vector_one() -> None:
    with pytest.raises(checks.CheckError) as info:
        checks.check_shift_matrix(lambda k, d: positional.shift_matrix(k, d).mT)
    assert "row-form rotation R(b)" in str(info.value)
    assert "you built the column-vector" not in str(info.value)
