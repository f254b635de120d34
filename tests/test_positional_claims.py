"""The claims chapter 01 (sinusoidal encoding) makes in its prose, against oracles.

Every number the chapter prints next to a sentence has a test here that fails if the
claim stops holding: attention without positions is permutation equivariant and an RNN
is not; the shift block is the textbook rotation matrix (R(-b) in the book's row form),
not its transpose; equal offsets give equal distances, D - 2 sum cos; concatenation has
cross terms after the projections and contains addition as a special case; fairseq's and
tensor2tensor's table is not a column permutation of the paper's (Hugging Face's FSMT
and Marian ports are the oracles); the exp recipe for the frequencies is 8.9-10.5 times
less accurate than pow in float32; the study notes' recurrence is wrong (its cos line
puts sin(a + b)'s terms where cos a cos b belongs: 0.6403 vs 0.4536), the dot product of
two pairs is cos(a - b), not sin(a - b), the note's function fails for an odd width, the
RoPE note's numpy loop needs its undefined names, and the dot product first rises at
offset 11 for D = 128.
"""

from __future__ import annotations

import math

import pytest
import torch

from companion.positional import (
    shift_matrix,
    sinusoidal_dot_products,
    sinusoidal_encoding,
    sinusoidal_frequencies,
)

F64 = torch.float64


# ---- independent references ----------------------------------------------------------


def loop_encoding(num_positions: int, dim: int) -> torch.Tensor:
    """Float64 oracle from the paper's formula, one entry at a time."""
    out = torch.empty(num_positions, dim, dtype=F64)
    for pos in range(num_positions):
        for i in range(dim // 2):
            angle = pos / 10000 ** (2 * i / dim)
            out[pos, 2 * i], out[pos, 2 * i + 1] = math.sin(angle), math.cos(angle)
    return out


def loop_attention(x: torch.Tensor, w_q, w_k, w_v) -> torch.Tensor:
    """One head of softmax attention written as loops (rows: q = x W_Q)."""
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    out = torch.empty_like(v)
    for m in range(x.shape[0]):
        scores = [float(q[m] @ k[n]) / math.sqrt(x.shape[1]) for n in range(x.shape[0])]
        top = max(scores)
        weights = [math.exp(s - top) for s in scores]
        total = sum(weights)
        out[m] = sum(w / total * v[n] for n, w in enumerate(weights))
    return out


def loop_rnn(x: torch.Tensor, w_ih, w_hh, b) -> torch.Tensor:
    """Elman RNN, h_t = tanh(x_t W_ih + h_(t-1) W_hh + b), the states as rows."""
    h = torch.zeros(w_hh.shape[0], dtype=x.dtype)
    states = []
    for t in range(x.shape[0]):
        h = torch.tanh(x[t] @ w_ih + h @ w_hh + b)
        states.append(h)
    return torch.stack(states)


def row_rotation(a: float) -> torch.Tensor:
    """The book's R(a): [x, y] -> [x, y] R(a), counterclockwise."""
    return torch.tensor(
        [[math.cos(a), math.sin(a)], [-math.sin(a), math.cos(a)]], dtype=F64
    )


def fairseq_table(num_positions: int, dim: int) -> torch.Tensor:
    """The formula the chapter quotes for fairseq / tensor2tensor, float64."""
    half = dim // 2
    omega = torch.exp(torch.arange(half, dtype=F64) * -math.log(10000) / (half - 1))
    angles = torch.arange(num_positions, dtype=F64)[:, None] * omega
    return torch.cat([angles.sin(), angles.cos()], dim=1)


def permutation_lower_bound(table: torch.Tensor, paper: torch.Tensor) -> float:
    """Max over table's columns of the min over paper's columns of max |difference|."""
    closest = [(paper - column[:, None]).abs().amax(0).min() for column in table.T]
    return max(closest).item()


# ---- why attention needs positions ---------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_attention_permutes_with_its_input_an_rnn_does_not(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    dim, length = 8, 6
    x = torch.randn(length, dim, generator=gen, dtype=F64)
    w_q, w_k, w_v = (
        torch.randn(dim, dim, generator=gen, dtype=F64) / 3 for _ in range(3)
    )
    w_ih, w_hh = (torch.randn(dim, dim, generator=gen, dtype=F64) / 3 for _ in range(2))
    b = torch.randn(dim, generator=gen, dtype=F64) / 3
    perm = torch.randperm(length, generator=gen)
    while torch.equal(perm, torch.arange(length)):
        perm = torch.randperm(length, generator=gen)
    attn = loop_attention(x, w_q, w_k, w_v)
    torch.testing.assert_close(loop_attention(x[perm], w_q, w_k, w_v), attn[perm])
    rnn = loop_rnn(x, w_ih, w_hh, b)
    assert (loop_rnn(x[perm], w_ih, w_hh, b) - rnn[perm]).abs().max() > 0.05


def test_the_loop_rnn_is_torchs_rnn() -> None:
    """The oracle above is what nn.RNN computes (the chapter uses nn.RNN)."""
    torch.manual_seed(0)
    rnn = torch.nn.RNN(4, 4, batch_first=True).double()
    x = torch.randn(5, 4, dtype=F64)
    w_ih, w_hh = rnn.weight_ih_l0.detach().T, rnn.weight_hh_l0.detach().T
    b = (rnn.bias_ih_l0 + rnn.bias_hh_l0).detach()
    with torch.no_grad():
        torch.testing.assert_close(rnn(x[None])[0][0], loop_rnn(x, w_ih, w_hh, b))


# ---- the shift block and distances ---------------------------------------------------


@pytest.mark.parametrize("b", [0.7, -1.3, 2.5, 0.01])
def test_shift_block_is_the_textbook_matrix_and_r_of_minus_b(b: float) -> None:
    phi = shift_matrix(b, 2)  # one block, omega_0 = 1
    textbook = torch.tensor(
        [[math.cos(b), -math.sin(b)], [math.sin(b), math.cos(b)]]
    ).double()
    swap = torch.tensor([[0.0, 1.0], [1.0, 0.0]], dtype=F64)
    torch.testing.assert_close(phi, textbook)
    torch.testing.assert_close(phi, row_rotation(-b))
    torch.testing.assert_close(phi, swap @ row_rotation(b) @ swap)
    assert not torch.allclose(
        phi, phi.T
    )  # so "the transpose of the textbook matrix" is false


@pytest.mark.parametrize("dim", [8, 64, 128])
def test_equal_offsets_give_equal_distances(dim: int) -> None:
    table = loop_encoding(120, dim)
    torch.testing.assert_close(sinusoidal_encoding(120, dim, dtype=F64), table)
    for m, n in [(0, 0), (5, 2), (119, 3), (40, 77), (100, 99)]:
        squared = float(((table[m] - table[n]) ** 2).sum())
        formula = dim - 2 * sum(
            math.cos((m - n) / 10000 ** (2 * i / dim)) for i in range(dim // 2)
        )
        assert squared == pytest.approx(formula, abs=1e-10)
    for offset in (1, 7, 50):
        d = (table[offset:] - table[:-offset]).norm(dim=1)
        assert float(d.max() - d.min()) < 1e-12


def test_distance_formula_via_package_dot_products() -> None:
    pe = sinusoidal_encoding(400, 64, dtype=F64)
    pos = torch.arange(400, dtype=F64)
    formula = 64 - 2 * sinusoidal_dot_products(pos[:, None] - pos[None, :], 64)
    assert (torch.cdist(pe, pe) ** 2 - formula).abs().max() < 1e-9


# ---- adding versus concatenating -----------------------------------------------------


@pytest.mark.parametrize("seed", range(10))
def test_concatenation_has_cross_terms_and_contains_addition(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    d_x = d_p = 16
    x_m, x_n, p_m, p_n = torch.randn(4, d_x, generator=gen, dtype=F64)
    w_q = torch.randn(d_x + d_p, 8, generator=gen, dtype=F64) / 5
    w_k = torch.randn(d_x + d_p, 8, generator=gen, dtype=F64) / 5
    score = (torch.cat([x_m, p_m]) @ w_q) @ (torch.cat([x_n, p_n]) @ w_k)
    (wq1, wq2), (wk1, wk2) = w_q.split(d_x), w_k.split(d_x)
    cross = [x_m @ wq1 @ wk2.T @ p_n, p_m @ wq2 @ wk1.T @ x_n]
    four = x_m @ wq1 @ wk1.T @ x_n + sum(cross) + p_m @ wq2 @ wk2.T @ p_n
    torch.testing.assert_close(four, score)
    assert min(abs(float(c)) for c in cross) > 1e-4
    w = torch.randn(d_x, 8, generator=gen, dtype=F64)
    torch.testing.assert_close(
        torch.cat([x_m, p_m]) @ torch.cat([w, w]), (x_m + p_m) @ w
    )


# ---- tables in the wild --------------------------------------------------------------


def test_fairseq_table_is_another_encoding_not_a_permutation() -> None:
    transformers = pytest.importorskip("transformers")
    from transformers.models.fsmt.modeling_fsmt import SinusoidalPositionalEmbedding

    del transformers
    hf = SinusoidalPositionalEmbedding.get_embedding(1000, 512, None).double()
    ours = fairseq_table(1000, 512)
    torch.testing.assert_close(hf, ours, atol=2e-4, rtol=0)  # HF builds it in float32
    paper = sinusoidal_encoding(1000, 512, dtype=F64)
    assert permutation_lower_bound(ours, paper) > 1.0  # the chapter prints 1.103
    omega = torch.exp(torch.arange(256, dtype=F64) * -math.log(10000) / 255)
    assert float(omega[-1]) == pytest.approx(1e-4, rel=1e-12)
    assert float(sinusoidal_frequencies(512)[-1]) == pytest.approx(1.0366e-4, rel=1e-4)


def test_marian_table_is_the_paper_with_columns_permuted() -> None:
    pytest.importorskip("transformers")
    from transformers.models.marian.modeling_marian import (
        MarianSinusoidalPositionalEmbedding,
    )

    emb = MarianSinusoidalPositionalEmbedding(300, 64)
    marian = emb.create_weight().double()
    paper = sinusoidal_encoding(300, 64, dtype=F64)
    to_halves = torch.cat([torch.arange(0, 64, 2), torch.arange(1, 64, 2)])
    torch.testing.assert_close(marian, paper[:, to_halves], atol=1e-6, rtol=0)
    assert permutation_lower_bound(marian, paper) < 1e-6


# ---- frequencies in float32 ----------------------------------------------------------


@pytest.mark.parametrize("dim", [64, 512, 4096])
def test_exp_recipe_is_about_ten_times_less_accurate(dim: int) -> None:
    two_i = torch.arange(0, dim, 2, dtype=torch.float32)
    ref = torch.tensor([10000.0 ** (-j / dim) for j in range(0, dim, 2)], dtype=F64)
    by_pow = 10000.0 ** (-two_i / dim)
    by_exp = torch.exp(two_i * (-math.log(10000.0) / dim))
    rel_pow = ((by_pow.double() - ref) / ref).abs().max().item()
    rel_exp = ((by_exp.double() - ref) / ref).abs().max().item()
    assert 8.0 < rel_exp / rel_pow < 12.0  # the chapter prints 8.9 to 10.5
    ulp = torch.ldexp(torch.ones_like(ref), torch.frexp(ref).exponent - 24)
    assert ((by_pow.double() - ref).abs() / ulp).max() < 1.0


# ---- the study notes' mistakes -------------------------------------------------------


def test_the_notes_recurrence_is_wrong_and_the_right_one_holds() -> None:
    table = loop_encoding(60, 16)
    k = 9
    s, c = table[:-k, 0::2], table[:-k, 1::2]
    sk, ck = table[k, 0::2], table[k, 1::2]
    torch.testing.assert_close(s * ck + c * sk, table[k:, 0::2])  # sin(a + b)
    torch.testing.assert_close(c * ck - s * sk, table[k:, 1::2])  # cos(a + b)
    notes_sin = s * sk + c * ck  # PE(pos,2i)PE(k,2i) + PE(pos,2i+1)PE(k,2i+1)
    notes_cos = c * sk + s * ck - s * sk
    assert (notes_sin - table[k:, 0::2]).abs().max() > 0.5
    assert (notes_cos - table[k:, 1::2]).abs().max() > 0.5


def test_dot_product_first_rises_at_offset_11_for_d128() -> None:
    g = [
        sum(math.cos(k / 10000 ** (2 * i / 128)) for i in range(64)) for k in range(20)
    ]
    rises = [k for k in range(19) if g[k + 1] > g[k]]
    assert rises[0] == 11
    assert min(sinusoidal_dot_products(torch.arange(20001.0), 128)) < -17


def test_the_notes_cos_recurrence_puts_sin_terms_where_cos_a_cos_b_belongs() -> None:
    """At a = 0.7, b = 0.4: the note's cos a sin b + sin a cos b - sin a sin b is 0.6403,
    cos(a + b) = cos a cos b - sin a sin b is 0.4536; the first two terms are sin(a + b)."""
    a, b = 0.7, 0.4
    notes = (
        math.cos(a) * math.sin(b)
        + math.sin(a) * math.cos(b)
        - math.sin(a) * math.sin(b)
    )
    assert notes == pytest.approx(
        math.sin(a + b) - math.sin(a) * math.sin(b), abs=1e-15
    )
    assert round(notes, 4) == 0.6403
    assert round(math.cos(a + b), 4) == 0.4536


def test_the_dot_product_of_two_pairs_is_cos_not_the_notes_sin() -> None:
    """E8: [sin a, cos a] . [sin b, cos b] = cos(a - b) (0.9553), not sin(a - b) (0.2955)."""
    a, b = 0.7, 0.4
    pe = torch.tensor([[math.sin(a), math.cos(a)], [math.sin(b), math.cos(b)]])
    dot = float(pe[0] @ pe[1])
    assert dot == pytest.approx(math.cos(a - b), abs=1e-7)
    assert round(math.cos(a - b), 4) == 0.9553 and round(math.sin(a - b), 4) == 0.2955
    assert abs(dot - math.sin(a - b)) > 0.5


def test_the_notes_function_fails_for_odd_width_and_the_package_says_why() -> None:
    """E16: the study note's get_sinusoidal_encoding raises a RuntimeError at d_model = 5
    (pe[:, 1::2] has 2 columns, div_term 3); the package raises a ValueError on dim."""

    def notes_function(max_len: int, d_model: int) -> torch.Tensor:
        pe = torch.zeros(max_len, d_model)
        position = torch.arange(0, max_len).unsqueeze(1).float()
        div_term = torch.exp(
            torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model)
        )
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        return pe

    with pytest.raises(RuntimeError, match="must match"):
        notes_function(10, 5)
    with pytest.raises(ValueError, match="dim must be an even int, got 5"):
        sinusoidal_encoding(10, 5)
    # at an even width it is the float32-angle recipe: close, not exact
    gap = (notes_function(100, 512).double() - loop_encoding(100, 512)).abs().max()
    assert 1e-7 < gap < 1e-4


NOTES_NUMPY = """
def get_position_angle_vec(position):
    return [position / np.power(10000, 2 * (hid_j // 2) / hidden_dim) for hid_j in range(hidden_dim)]

position_angle_vecs = np.array([get_position_angle_vec(pos_i) for pos_i in range(seq_len)])
position_angle_vecs[:, 0::2] = np.sin(position_angle_vecs[:, 0::2])
position_angle_vecs[:, 1::2] = np.cos(position_angle_vecs[:, 1::2])
positional_embeddings = torch.FloatTensor(position_angle_vecs).unsqueeze(0)
"""


def test_the_rope_notes_numpy_loop_needs_its_names_then_matches() -> None:
    """E14: as printed it names np, torch, seq_len and hidden_dim without defining them."""
    np = pytest.importorskip("numpy")
    with pytest.raises(NameError, match="'np' is not defined"):
        exec(NOTES_NUMPY, {})
    names = {"np": np, "torch": torch, "seq_len": 50, "hidden_dim": 16}
    exec(NOTES_NUMPY, names)
    torch.testing.assert_close(
        names["positional_embeddings"][0], loop_encoding(50, 16).float()
    )
