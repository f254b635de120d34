"""The claims chapter 02 (RoPE) makes in its prose, against oracles.

The derivation's three steps (radius fixed, angle = own angle + phi(m), phi linear) read
off the package's rotation and failing for other candidates; the score is a function of
m - n and not symmetric, s(10, 7) != s(7, 10), with Hugging Face's
apply_rotary_pos_emb as the oracle; the row-form rotation is the complex multiplication;
the additive position term p_m A p_n^T is not Toeplitz although p_m p_n^T is; with
Hugging Face's float32 angles pair 0 is exact and pair 1 is the worst (0.03-0.1 rad near
2^20), and the table error grows with slope 1 in m; the three position terms of the
additive score each break the structure in every draw, but "within a factor of two" is
not a claim that holds; the relative upper bound falls from 32.5 to about a third by
distance 100 and decays on average only (496 of its first 1024 steps rise), through the
summation-by-parts steps written out; a reflection at odd positions passes the real-score
requirement and fails the complex one; a float32 angle's error is relative, about
m theta_i 2^-23.
"""

from __future__ import annotations

import cmath
import math

import pytest
import torch

from companion.positional import sinusoidal_encoding
from companion.rope import apply_rope, rope_cos_sin, rope_frequencies

transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig  # noqa: E402
from transformers.models.llama.modeling_llama import (  # noqa: E402
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

F64 = torch.float64


# ---- independent references ----------------------------------------------------------


def row_rotation(a: float) -> torch.Tensor:
    """The book's R(a) in row form: [x, y] -> [x, y] R(a), counterclockwise."""
    return torch.tensor(
        [[math.cos(a), math.sin(a)], [-math.sin(a), math.cos(a)]], dtype=F64
    )


def loop_score(q: list[float], k: list[float], m: int, n: int, base: float) -> float:
    """RoPE score from the formula, interleaved pairs, one complex product per pair."""
    dim = len(q)
    total = 0.0
    for i in range(dim // 2):
        theta = base ** (-2.0 * i / dim)
        qi, ki = complex(q[2 * i], q[2 * i + 1]), complex(k[2 * i], k[2 * i + 1])
        total += (
            qi
            * cmath.exp(1j * m * theta)
            * (ki * cmath.exp(1j * n * theta)).conjugate()
        ).real
    return total


def hf_score(q: torch.Tensor, k: torch.Tensor, m: int, n: int) -> float:
    """The same score through Hugging Face's LLaMA rotary code (half layout)."""
    dim = q.shape[-1]
    config = LlamaConfig(hidden_size=2 * dim, num_attention_heads=2, head_dim=dim)
    emb = LlamaRotaryEmbedding(config)
    x = q.float()[None, None, None]  # (1, 1, 1, D)
    cos_m, sin_m = emb(x, torch.tensor([[m]]))
    cos_n, sin_n = emb(x, torch.tensor([[n]]))
    q_rot, _ = apply_rotary_pos_emb(x, x, cos_m, sin_m)
    k_rot, _ = apply_rotary_pos_emb(k.float()[None, None, None], x, cos_n, sin_n)
    return float((q_rot * k_rot).sum())


def diagonal_spread(s: torch.Tensor) -> float:
    n = s.shape[0]
    return max(
        float(s.diagonal(o).max() - s.diagonal(o).min()) for o in range(-n + 1, n)
    )


# ---- the derivation ------------------------------------------------------------------


@pytest.mark.parametrize("theta", [0.3, 1.0, 0.05])
def test_package_rotation_has_the_three_derived_properties(theta: float) -> None:
    positions = torch.arange(0, 300)
    cos, sin = rope_cos_sin(positions, torch.tensor([theta], dtype=F64), dtype=F64)
    gen = torch.Generator().manual_seed(0)
    vectors = torch.randn(4, 2, generator=gen, dtype=F64)
    images = []
    for v in vectors:
        out = apply_rope(v.expand(len(positions), 2), cos, sin, layout="interleaved")
        images.append(torch.complex(out[:, 0], out[:, 1]))
    images = torch.stack(images)  # (4, L)
    z = torch.complex(vectors[:, 0], vectors[:, 1])
    assert (images.abs() - z.abs()[:, None]).abs().max() < 1e-12  # 1. radius
    phi = torch.angle(images * z.conj()[:, None])
    assert (phi - phi[0]).abs().max() < 1e-12  # 2. same phi(m) for every vector
    steps = torch.remainder(phi[0, 1:] - phi[0, :-1], 2 * math.pi)
    assert (steps - theta % (2 * math.pi)).abs().max() < 1e-10  # 3. linear in m


@pytest.mark.parametrize(
    "candidate",
    [
        lambda z, m: (1 + m / 100) * z * cmath.exp(0.3j * m),  # radius depends on m
        lambda z, m: z * cmath.exp(0.3j * m * m),  # angle not linear in m
        lambda z, m: z * cmath.exp(0.3j * math.sqrt(m)),  # angle not linear in m
    ],
)
def test_candidates_that_break_a_step_fail_the_requirement(candidate) -> None:
    q, k = complex(0.7, -1.2), complex(-0.4, 0.9)
    shifts = ((3, 1, 5), (10, 7, 40), (0, 4, 100))

    def change(f) -> float:
        """max |f(q, m) conj f(k, n) - f(q, m + t) conj f(k, n + t)|."""
        return max(
            abs(f(q, m) * f(k, n).conjugate() - f(q, m + t) * f(k, n + t).conjugate())
            for m, n, t in shifts
        )

    assert change(candidate) > 0.1
    assert change(lambda z, m: z * cmath.exp(0.3j * m)) < 1e-12


@pytest.mark.parametrize("alpha", [0.3, -2.0, 2.1])
def test_row_rotation_is_complex_multiplication_counterclockwise(alpha: float) -> None:
    row = torch.tensor([0.8, -0.3], dtype=F64)
    z = complex(0.8, -0.3) * cmath.exp(1j * alpha)
    torch.testing.assert_close(
        row @ row_rotation(alpha), torch.tensor([z.real, z.imag]).double()
    )
    # [1, 0] turns towards [0, 1] for a small positive angle: counterclockwise
    assert (torch.tensor([1.0, 0.0], dtype=F64) @ row_rotation(0.1))[1] > 0
    cos, sin = rope_cos_sin(
        torch.tensor([1]), torch.tensor([alpha], dtype=F64), dtype=F64
    )
    out = apply_rope(row[None], cos, sin, layout="interleaved")[0]
    torch.testing.assert_close(out, row @ row_rotation(alpha))


# ---- the score -----------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(20))
def test_score_depends_on_m_minus_n_and_is_not_symmetric(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, 8, generator=gen, dtype=F64)
    s_10_7 = loop_score(q.tolist(), k.tolist(), 10, 7, 10000.0)
    s_7_10 = loop_score(q.tolist(), k.tolist(), 7, 10, 10000.0)
    assert abs(loop_score(q.tolist(), k.tolist(), 110, 107, 10000.0) - s_10_7) < 1e-9
    cross = q[1::2] * k[0::2] - q[0::2] * k[1::2]
    theta = rope_frequencies(8)
    predicted = float(-2 * (cross * torch.sin(3 * theta)).sum())
    assert s_10_7 - s_7_10 == pytest.approx(predicted, abs=1e-12)
    assert abs(s_10_7 - s_7_10) > 1e-6


def test_hugging_face_score_is_not_symmetric_either() -> None:
    gen = torch.Generator().manual_seed(3)
    q, k = torch.randn(2, 8, generator=gen, dtype=F64)
    s_10_7, s_7_10 = hf_score(q, k, 10, 7), hf_score(q, k, 7, 10)
    assert abs(s_10_7 - s_7_10) > 0.01
    assert hf_score(q, k, 30, 27) == pytest.approx(s_10_7, abs=1e-4)
    # HF's half layout: the interleaved loop after the permutation [0, 2, .., 1, 3, ..]
    p_inv = torch.tensor([0, 4, 1, 5, 2, 6, 3, 7])
    expected = loop_score(q[p_inv].tolist(), k[p_inv].tolist(), 10, 7, 10000.0)
    assert s_10_7 == pytest.approx(expected, abs=1e-4)


def test_additive_position_term_is_not_toeplitz_but_pp_is() -> None:
    gen = torch.Generator().manual_seed(0)
    w_q, w_k = (torch.randn(16, 16, generator=gen, dtype=F64) / 4 for _ in range(2))
    p = sinusoidal_encoding(32, 16, dtype=F64)
    assert diagonal_spread(p @ p.T) < 1e-12
    assert diagonal_spread(p @ w_q @ w_k.T @ p.T) > 0.1


def test_position_terms_each_break_the_structure_but_not_within_two() -> None:
    gen = torch.Generator().manual_seed(1)
    p = sinusoidal_encoding(24, 16, dtype=F64)
    ratios, smallest = [], []
    for _ in range(200):
        w_q, w_k = (torch.randn(16, 16, generator=gen, dtype=F64) / 4 for _ in range(2))
        x = torch.randn(16, generator=gen, dtype=F64).expand(24, 16)
        a = w_q @ w_k.T
        three = [
            diagonal_spread(x @ a @ p.T),
            diagonal_spread(p @ a @ x.T),
            diagonal_spread(p @ a @ p.T),
        ]
        ratios.append(max(three) / min(three))
        smallest.append(min(three))
    assert min(smallest) > 0.1  # every term with a p breaks the Toeplitz structure
    within_two = sum(r < 2 for r in ratios) / len(ratios)
    assert 0.2 < within_two < 0.9  # so "within a factor of two" is no general claim


# ---- precision -----------------------------------------------------------------------


def hf_angles(positions: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Hugging Face's float32 angles: position_ids.float() * inv_freq (its buffer)."""
    config = LlamaConfig(
        hidden_size=2 * head_dim, num_attention_heads=2, head_dim=head_dim
    )
    inv_freq = LlamaRotaryEmbedding(config).inv_freq
    assert inv_freq.dtype == torch.float32
    return positions[:, None].float() * inv_freq


def test_float32_angles_pair_zero_exact_pair_one_worst() -> None:
    top = torch.arange(2**20 - 4096, 2**20)
    angle32 = hf_angles(top, 128)
    angle64 = top[:, None].double() * rope_frequencies(128)
    error = (angle32.double() - angle64).abs().amax(0)
    assert error[0] == 0
    assert int(error.argmax()) == 1
    assert 0.03 < float(error[1]) < 0.1  # the chapter prints 0.0624


def test_float32_angle_table_error_grows_like_m() -> None:
    gen = torch.Generator().manual_seed(0)
    theta = rope_frequencies(128)
    log_m, log_err = [], []
    for e in range(8, 21):
        pos = torch.randint(2**e, 2 ** (e + 1), (64,), generator=gen)
        angle = hf_angles(pos, 128)
        exact = pos[:, None].double() * theta
        err = max(
            float((angle.cos().double() - exact.cos()).abs().max()),
            float((angle.sin().double() - exact.sin()).abs().max()),
        )
        log_m.append(e + 0.5)
        log_err.append(math.log2(err))
    design = torch.tensor([[lm, 1.0] for lm in log_m], dtype=F64)
    fit = torch.linalg.lstsq(design, torch.tensor(log_err, dtype=F64)[:, None]).solution
    slope, intercept = fit.flatten().tolist()
    assert 0.9 < slope < 1.1
    assert 5e-8 < 2**intercept < 1.2e-7
    companion_cos, _ = rope_cos_sin(torch.tensor([2**20 - 1]), theta)
    exact = (torch.tensor([2**20 - 1]).double()[:, None] * theta).cos()
    assert (companion_cos.double() - exact).abs().max() <= 2**-24


# ---- long-term decay -----------------------------------------------------------------


def test_relative_upper_bound_falls_to_about_a_third_by_100() -> None:
    theta = rope_frequencies(128)

    def bound(d: int) -> float:
        partial, total = 0j, 0.0
        for t in theta.tolist():
            partial += cmath.exp(1j * d * t)
            total += abs(partial)
        return total / 64

    assert bound(0) == pytest.approx(32.5)
    assert 0.25 < bound(100) / bound(0) < 0.4


def test_relative_upper_bound_rises_on_496_of_its_first_1024_steps() -> None:
    """Decays on average only: a float64 loop over the partial sums, d = 0 .. 1024."""
    theta = rope_frequencies(128).tolist()

    def bound(d: int) -> float:
        partial, total = 0j, 0.0
        for t in theta:
            partial += cmath.exp(1j * d * t)
            total += abs(partial)
        return total / 64

    values = [bound(d) for d in range(1025)]
    rises = sum(values[d + 1] > values[d] for d in range(1024))
    assert rises == 496


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_summation_by_parts_and_the_real_part_bound(seed: int) -> None:
    """sum h_i e^{i d theta_i} = -sum S_{i+1} (h_{i+1} - h_i) with S_0 = 0, h_{D/2} = 0,
    and |score| = |Re(...)| <= |...| <= max|h_{i+1} - h_i| sum_j |S_j| (a float64 loop)."""
    gen = torch.Generator().manual_seed(seed)
    theta = rope_frequencies(16).tolist()
    h = [
        complex(*torch.randn(2, generator=gen, dtype=torch.float64).tolist())
        for _ in theta
    ]
    for d in (0, 3, 50, 700):
        direct = sum(hi * cmath.exp(1j * d * t) for hi, t in zip(h, theta, strict=True))
        partial = [0j]  # S_0 .. S_{D/2}
        for t in theta:
            partial.append(partial[-1] + cmath.exp(1j * d * t))
        h_ext = [*h, 0j]  # h_{D/2} = 0
        by_parts = -sum(
            partial[i + 1] * (h_ext[i + 1] - h_ext[i]) for i in range(len(h))
        )
        assert abs(direct - by_parts) < 1e-12
        bound = max(abs(h_ext[i + 1] - h_ext[i]) for i in range(len(h))) * sum(
            abs(s) for s in partial[1:]
        )
        assert abs(direct.real) <= abs(direct) <= bound + 1e-12


def test_a_reflection_passes_the_real_requirement_but_not_the_complex_one() -> None:
    """f(q, m) = q F^m, F = diag(1, -1): <f(q,m), f(k,n)> depends on m - n and f(q, 0) = q,
    yet F is no rotation and f(q,m) conj f(k,n) changes under a common shift."""
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 2, generator=gen, dtype=torch.float64)

    def f(v: torch.Tensor, m: int) -> torch.Tensor:  # a loop, not matrix_power
        out = v.clone()
        for _ in range(m):
            out = torch.stack([out[0], -out[1]])
        return out

    for m, n, t in ((3, 1, 5), (10, 7, 40), (0, 4, 101), (2, 9, 1)):
        assert abs(float(f(q, m) @ f(k, n)) - float(f(q, m + t) @ f(k, n + t))) < 1e-12
    assert torch.equal(f(q, 0), q)
    basis = torch.eye(2, dtype=F64)
    assert torch.linalg.det(torch.stack([f(basis[0], 1), f(basis[1], 1)])) == -1

    def c(v: torch.Tensor) -> complex:
        return complex(float(v[0]), float(v[1]))

    even = c(f(q, 2)) * c(f(k, 0)).conjugate()
    odd = c(f(q, 3)) * c(f(k, 1)).conjugate()
    assert abs(even - odd) > 1e-3 and abs(even - odd.conjugate()) < 1e-12


@pytest.mark.parametrize(
    ("head_dim", "half_steps", "per_position"),
    [(128, (2.5, 3.5), (5e-8, 7e-8)), (4096, (3.5, 4.0), (1.0e-7, 2**-23))],
)
def test_float32_angle_error_is_relative_about_m_theta_2_to_minus_23(
    head_dim: int, half_steps: tuple[float, float], per_position: tuple[float, float]
) -> None:
    """HF's float32 angles at the 4096 positions below 2^20 against float64 angles built
    from the formula: about m theta_i 2^-23, i.e. 3.0 (D = 128) and 3.9 (D = 4096) half
    steps of the float32 grid, 1.1e-7 m at D = 4096."""
    top = torch.arange(2**20 - 4096, 2**20)
    exact = top[:, None].double() * torch.tensor(
        [10000.0 ** (-2 * i / head_dim) for i in range(head_dim // 2)], dtype=F64
    )
    error = (hf_angles(top, head_dim).double() - exact).abs()[:, 1:]  # pairs 1 ..
    exact = exact[:, 1:]
    half_step = torch.ldexp(torch.ones_like(exact), torch.frexp(exact).exponent - 25)
    assert half_steps[0] < (error / half_step).max() < half_steps[1]
    assert 0.9 < (error / (exact * 2**-23)).max() < 1.3
    assert per_position[0] < (error / top[:, None]).max() < per_position[1]
