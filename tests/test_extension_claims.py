"""The context-extension chapter's claims (book/03_context_extension.ipynb).

YaRN: the paper's ramp is linear in the turns r = L0 / lambda; the ramp of the authors'
reference code, which Hugging Face transformers ported (and the package matches), is
linear in the pair index; they agree at both ends and differ by up to 1.76x in frequency
in the chapter's running example. Llama 3's bands are the paper's ramp with edges 1 and
4 turns.
Dynamic NTK overshoots because its factor is s: with factor 1 the scale is l / L0. The
extra ALiBi slopes of a head count that is not a power of two: the first is steeper than
every base slope, the others fall between two. The oracles are transformers'
ROPE_INIT_FUNCTIONS, the authors' code and the paper's formula written out here.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from companion.extension import (
    alibi_slopes,
    dynamic_ntk_frequencies,
    yarn_frequencies,
    yarn_ramp,
)
from companion.rope import rope_frequencies

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="IProgress not found")
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS


def _paper_frequencies(
    head_dim: int,
    base: float,
    factor: float,
    n0: int,
    r_slow: float = 1.0,
    r_fast: float = 32.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """YaRN's NTK-by-parts as the paper writes it, linear in the turns r: returns the
    frequencies and the interpolation weight rho = 1 - gamma (0 = untouched); r_slow and
    r_fast are the paper's alpha and beta."""
    theta = torch.tensor(
        [base ** (-2 * i / head_dim) for i in range(head_dim // 2)], dtype=torch.float64
    )
    turns = n0 * theta / (2 * math.pi)
    rho = ((r_fast - turns) / (r_fast - r_slow)).clamp(0.0, 1.0)
    return theta * ((1 - rho) + rho / factor), rho


def _hf_yarn(head_dim: int, base: float, factor: float, n0: int) -> torch.Tensor:
    cfg = LlamaConfig(
        hidden_size=2 * head_dim,
        num_attention_heads=2,
        head_dim=head_dim,
        max_position_embeddings=int(n0 * factor),
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": base,
            "factor": factor,
            "original_max_position_embeddings": n0,
        },
    )
    inv_freq, _ = ROPE_INIT_FUNCTIONS["yarn"](cfg, "cpu")
    return inv_freq.double()


CONFIGS = [
    (128, 1e4, 4.0, 2048),
    (128, 1e4, 4.0, 4096),
    (64, 1e4, 4.0, 2048),
    (128, 5e5, 8.0, 8192),
]


@pytest.mark.parametrize(("head_dim", "base", "factor", "n0"), CONFIGS)
def test_package_is_transformers_ramp_not_the_papers(
    head_dim: int, base: float, factor: float, n0: int
) -> None:
    ours, _ = yarn_frequencies(
        head_dim, base=base, factor=factor, original_max_position_embeddings=n0
    )
    theirs = _hf_yarn(head_dim, base, factor, n0)
    torch.testing.assert_close(ours, theirs, rtol=2e-6, atol=0.0)
    paper, _ = _paper_frequencies(head_dim, base, factor, n0)
    assert (
        theirs / paper
    ).max() > 1.5  # transformers does not implement the paper's ramp


def test_running_example_ratio_is_1_76() -> None:
    """D = 128, b = 10^4, L0 = 2048, s = 4: largest ratio 1.757, on pair 29."""
    ours, _ = yarn_frequencies(
        128, base=1e4, factor=4.0, original_max_position_embeddings=2048
    )
    paper, rho_paper = _paper_frequencies(128, 1e4, 4.0, 2048)
    ratio = ours / paper
    assert 1.75 < ratio.max().item() < 1.77
    assert int(ratio.argmax()) == 29
    assert ratio.min().item() > 0.999
    rho = yarn_ramp(128, base=1e4, original_max_position_embeddings=2048)
    assert torch.equal(rho_paper == 0, rho == 0)  # the untouched pairs agree
    assert torch.equal(
        rho_paper == 1, rho == 1
    )  # and so do the fully interpolated ones


def test_ramps_are_linear_in_index_and_in_turns() -> None:
    head_dim, base, n0 = 128, 1e4, 2048
    rho = yarn_ramp(head_dim, base=base, original_max_position_embeddings=n0)
    inside = ((rho > 0) & (rho < 1)).nonzero().flatten()
    steps = rho[inside].diff()
    torch.testing.assert_close(steps, torch.full_like(steps, steps[0].item()))  # in i
    _, rho_paper = _paper_frequencies(head_dim, base, 4.0, n0)
    theta = rope_frequencies(head_dim, base=base)
    turns = n0 * theta / (2 * math.pi)
    mid = (rho_paper > 0) & (rho_paper < 1)
    torch.testing.assert_close(rho_paper[mid], (32 - turns[mid]) / 31)  # linear in r
    assert not torch.allclose(
        rho_paper[mid].diff(), rho_paper[mid].diff()[0]
    )  # not in i


def test_note_theta_with_two_pi_moves_the_slow_pairs() -> None:
    """The study note on the Transformer's theta = 2 pi / 10000^(2i/d) versus 1 / ..."""
    theta = rope_frequencies(128, base=1e4)
    note_theta = 2 * math.pi * theta
    slow = int((2 * math.pi / theta > 2048).sum())
    slow_note = int((2 * math.pi / note_theta > 2048).sum())
    assert (slow, slow_note) == (23, 11)


def _authors_yarn_ramp(dim: int, base: float, n0: int, beta_fast=32, beta_slow=1):
    """The YaRN authors' reference code (jquesnelle/yarn, scaled_rope), ported line for
    line: _yarn_find_correction_range, then 1 - inv_freq_mask's ramp over dim // 2."""

    def find_correction_dim(num_rotations):
        return (dim * math.log(n0 / (num_rotations * 2 * math.pi))) / (
            2 * math.log(base)
        )

    low = math.floor(find_correction_dim(beta_fast))
    high = math.ceil(find_correction_dim(beta_slow))
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    linear_func = (torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)
    return torch.clamp(linear_func, 0, 1)


@pytest.mark.parametrize(("head_dim", "base", "factor", "n0"), CONFIGS)
def test_the_index_ramp_is_the_yarn_authors_code(
    head_dim: int, base: float, factor: float, n0: int
) -> None:
    ours = yarn_ramp(head_dim, base=base, original_max_position_embeddings=n0)
    authors = _authors_yarn_ramp(head_dim, base, n0)
    torch.testing.assert_close(ours, authors.double(), rtol=0, atol=1e-7)


@pytest.mark.parametrize(
    ("head_dim", "base", "factor", "n0"),
    [(128, 1e4, 4.0, 2048), (128, 5e5, 8.0, 8192), (64, 1e4, 16.0, 4096)],
)
def test_llama3_is_the_papers_ramp_with_edges_1_and_4(
    head_dim: int, base: float, factor: float, n0: int
) -> None:
    """mu_i = (r_i - 1) / 3 = 1 - rho_i with r_slow = 1, r_fast = 4 (transformers'
    llama3 as the oracle)."""
    cfg = LlamaConfig(
        hidden_size=2 * head_dim,
        num_attention_heads=2,
        head_dim=head_dim,
        max_position_embeddings=int(n0 * factor),
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": base,
            "factor": factor,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": n0,
        },
    )
    hf, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg, "cpu")
    paper, rho = _paper_frequencies(head_dim, base, factor, n0, r_slow=1.0, r_fast=4.0)
    torch.testing.assert_close(paper, hf.double(), rtol=2e-6, atol=0.0)
    assert ((rho > 0) & (rho < 1)).any()  # the blend is exercised


@pytest.mark.parametrize("seq_len", [4096, 8192, 16384])
def test_dynamic_ntk_overshoot_comes_from_the_factor(seq_len: int) -> None:
    """Factor 1 gives the scale l / L0; factor s gives s l / L0 - (s - 1): 13 at 8192"""
    head_dim, base, n0 = 128, 1e4, 2048

    def at_scale(scale: float) -> torch.Tensor:
        i = torch.arange(head_dim // 2, dtype=torch.float64)
        return (base * scale ** (head_dim / (head_dim - 2))) ** (-2 * i / head_dim)

    for factor, scale in ((1.0, seq_len / n0), (4.0, 4 * seq_len / n0 - 3)):
        got = dynamic_ntk_frequencies(
            head_dim,
            base=base,
            factor=factor,
            original_max_position_embeddings=n0,
            seq_len=seq_len,
        )
        torch.testing.assert_close(got, at_scale(scale))
    assert 4 * 8192 / n0 - 3 == 13


@pytest.mark.parametrize("num_heads", [3, 5, 6, 7, 12, 20, 24, 40, 71, 96, 112])
def test_extra_alibi_slopes_first_above_all_others_between(num_heads: int) -> None:
    slopes = alibi_slopes(num_heads, dtype=torch.float64)
    c = 2 ** math.floor(math.log2(num_heads))
    base_slopes, extra = slopes[:c], slopes[c:]
    assert extra[0] > base_slopes.max()
    for a in extra[1:]:
        assert ((base_slopes[:-1] > a) & (base_slopes[1:] < a)).any()
    if num_heads == 12:
        assert round(float(extra[0]), 4) == 0.7071 and float(base_slopes.max()) == 0.5
