"""The context-extension chapter's claims (book/03_context_extension.ipynb).

YaRN: the paper's ramp is linear in the turns r = L0 / lambda, the ramp Hugging Face
transformers implements (and the package matches) is linear in the pair index; they agree at
both ends and differ by up to 1.76x in frequency in the chapter's running example. The
oracles are transformers' ROPE_INIT_FUNCTIONS and the paper's formula written out here.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from companion.extension import yarn_frequencies, yarn_ramp
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
    alpha: float = 1.0,
    beta: float = 32.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """YaRN's NTK-by-parts as the paper writes it: gamma(r) linear in r, 1 = untouched."""
    theta = torch.tensor(
        [base ** (-2 * i / head_dim) for i in range(head_dim // 2)], dtype=torch.float64
    )
    turns = n0 * theta / (2 * math.pi)
    gamma = ((turns - alpha) / (beta - alpha)).clamp(0.0, 1.0)
    return (1 - gamma) * theta / factor + gamma * theta, gamma


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
    paper, gamma = _paper_frequencies(128, 1e4, 4.0, 2048)
    ratio = ours / paper
    assert 1.75 < ratio.max().item() < 1.77
    assert int(ratio.argmax()) == 29
    assert ratio.min().item() > 0.999
    rho = yarn_ramp(128, base=1e4, original_max_position_embeddings=2048)
    assert torch.equal(gamma == 1, rho == 0)  # the untouched pairs agree
    assert torch.equal(gamma == 0, rho == 1)  # and so do the fully interpolated ones


def test_ramps_are_linear_in_index_and_in_turns() -> None:
    head_dim, base, n0 = 128, 1e4, 2048
    rho = yarn_ramp(head_dim, base=base, original_max_position_embeddings=n0)
    inside = ((rho > 0) & (rho < 1)).nonzero().flatten()
    steps = rho[inside].diff()
    torch.testing.assert_close(steps, torch.full_like(steps, steps[0].item()))  # in i
    _, gamma = _paper_frequencies(head_dim, base, 4.0, n0)
    theta = rope_frequencies(head_dim, base=base)
    turns = n0 * theta / (2 * math.pi)
    mid = (gamma > 0) & (gamma < 1)
    torch.testing.assert_close(gamma[mid], (turns[mid] - 1) / 31)  # linear in r
    assert not torch.allclose(gamma[mid].diff(), gamma[mid].diff()[0])  # not in i


def test_note_theta_with_two_pi_moves_the_slow_pairs() -> None:
    """The study note on the Transformer's theta = 2 pi / 10000^(2i/d) versus 1 / ..."""
    theta = rope_frequencies(128, base=1e4)
    note_theta = 2 * math.pi * theta
    slow = int((2 * math.pi / theta > 2048).sum())
    slow_note = int((2 * math.pi / note_theta > 2048).sum())
    assert (slow, slow_note) == (23, 11)
