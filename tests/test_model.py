"""Tests of companion.model: the tiny Transformer, the lag task and the training loop."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import companion
from companion import model as M
from companion.model import ModelConfig, TinyTransformer

SCHEMES = M.POSITION_SCHEMES


def tiny(position: str = "rope", **kwargs: object) -> TinyTransformer:
    companion.seed_everything(0)
    cfg = dict(vocab_size=11, dim=16, num_heads=2, num_layers=2, position=position, max_len=32)
    cfg.update(kwargs)
    return TinyTransformer(ModelConfig(**cfg))


# --- the task ---------------------------------------------------------------------------------


def test_lag_task_targets_are_the_tokens_lag_places_back() -> None:
    gen = torch.Generator().manual_seed(0)
    tokens, targets = M.lag_task(4, 10, lag=3, vocab_size=7, generator=gen)
    assert tokens.shape == targets.shape == (4, 10)
    assert tokens.dtype == targets.dtype == torch.long
    assert (targets[:, :3] == M.IGNORE_INDEX).all()
    for b in range(4):
        for t in range(3, 10):
            assert targets[b, t] == tokens[b, t - 3]
    assert tokens.min() >= 0 and tokens.max() < 7


def test_lag_task_is_reproducible_with_a_seeded_generator() -> None:
    a = M.lag_task(2, 8, lag=1, vocab_size=5, generator=torch.Generator().manual_seed(3))
    b = M.lag_task(2, 8, lag=1, vocab_size=5, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (
            dict(batch_size=0, length=5, lag=1, vocab_size=4),
            ValueError,
            r"batch_size must be positive, got 0",
        ),
        (
            dict(batch_size=2, length=3, lag=3, vocab_size=4),
            ValueError,
            r"length must be greater than lag, got length=3, lag=3",
        ),
        (
            dict(batch_size=2, length=5, lag=0, vocab_size=4),
            ValueError,
            r"lag must be positive, got 0",
        ),
        (
            dict(batch_size=2, length=5, lag=1, vocab_size=1),
            ValueError,
            r"vocab_size must be at least 2, got 1",
        ),
        (
            dict(batch_size=2.0, length=5, lag=1, vocab_size=4),
            TypeError,
            r"batch_size must be an int, got float",
        ),
    ],
)
def test_lag_task_validation(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        M.lag_task(**kwargs)


# --- the model --------------------------------------------------------------------------------


@pytest.mark.parametrize("position", SCHEMES)
@pytest.mark.parametrize("placement", ["pre", "post"])
def test_logits_shape_for_every_scheme_and_placement(position: str, placement: str) -> None:
    m = tiny(position, placement=placement, norm="rms" if placement == "post" else "layer")
    tokens = torch.randint(11, (3, 9))
    assert m(tokens).shape == (3, 9, 11)


@pytest.mark.parametrize("position", SCHEMES)
def test_the_model_is_causal(position: str) -> None:
    """Changing a future token must not change any earlier output, whatever the scheme."""
    m = tiny(position)
    tokens = torch.randint(11, (2, 12), generator=torch.Generator().manual_seed(1))
    changed = tokens.clone()
    changed[:, 7] = (changed[:, 7] + 1) % 11
    with torch.no_grad():
        a, b = m(tokens), m(changed)
    torch.testing.assert_close(a[:, :7], b[:, :7], rtol=0, atol=1e-6)
    assert not torch.allclose(a[:, 7:], b[:, 7:])


def test_without_positions_one_layer_ignores_the_order_of_the_past() -> None:
    """No position information, one layer: permuting earlier tokens leaves the last output
    unchanged (causal attention is a weighted average over an unordered set). A second layer
    breaks this, because earlier hidden states depend on their own prefixes."""
    m = tiny("none", num_layers=1)
    tokens = torch.randint(11, (1, 10), generator=torch.Generator().manual_seed(2))
    perm = torch.cat(
        [torch.randperm(9, generator=torch.Generator().manual_seed(0)), torch.tensor([9])]
    )
    with torch.no_grad():
        last = m(tokens)[:, -1]
        last_permuted = m(tokens[:, perm])[:, -1]
    torch.testing.assert_close(last, last_permuted, rtol=1e-5, atol=1e-5)
    two_layers = tiny("none", num_layers=2)
    with torch.no_grad():
        gap = (two_layers(tokens)[:, -1] - two_layers(tokens[:, perm])[:, -1]).abs().max()
    assert gap > 1e-3, "two causal layers see order through the prefixes"
    m_rope = tiny("rope")
    with torch.no_grad():
        assert not torch.allclose(m_rope(tokens)[:, -1], m_rope(tokens[:, perm])[:, -1], atol=1e-4)


def _projections(attn: M.CausalSelfAttention, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    B, L, D = x.shape
    H = attn.num_heads
    q, k, v = attn.qkv(x).split(D, dim=-1)
    return tuple(t.view(B, L, H, D // H).transpose(1, 2) for t in (q, k, v))


def _merge(attn: M.CausalSelfAttention, y: torch.Tensor) -> torch.Tensor:
    B, H, L, Dh = y.shape
    return attn.out(y.transpose(1, 2).reshape(B, L, H * Dh))


def test_attention_without_positions_matches_torch_sdpa() -> None:
    attn = tiny("none").blocks[0].sublayer
    x = torch.randn(2, 7, 16)
    q, k, v = _projections(attn, x)
    expected = _merge(attn, F.scaled_dot_product_attention(q, k, v, is_causal=True))
    torch.testing.assert_close(attn(x), expected, rtol=1e-5, atol=1e-6)


def test_rope_attention_matches_hugging_face_rotation_and_torch_sdpa() -> None:
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    attn = tiny("rope").blocks[0].sublayer
    x = torch.randn(2, 7, 16)
    q, k, v = _projections(attn, x)
    head_dim = 8
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    angles = torch.arange(7, dtype=torch.float64)[:, None] * inv_freq[None, :]
    emb = torch.cat([angles, angles], dim=-1)  # HF's half layout
    q_hf, k_hf = apply_rotary_pos_emb(q, k, emb.cos().float()[None], emb.sin().float()[None])
    expected = _merge(attn, F.scaled_dot_product_attention(q_hf, k_hf, v, is_causal=True))
    torch.testing.assert_close(attn(x), expected, rtol=1e-5, atol=1e-5)


def test_alibi_attention_matches_the_paper_bias_with_torch_sdpa() -> None:
    attn = tiny("alibi", num_heads=4, dim=16).blocks[0].sublayer
    x = torch.randn(2, 6, 16)
    q, k, v = _projections(attn, x)
    slopes = torch.tensor([2.0 ** (-8 * (h + 1) / 4) for h in range(4)])  # Press et al.
    i = torch.arange(6)[:, None]
    j = torch.arange(6)[None, :]
    bias = -slopes[:, None, None] * (i - j).float()
    bias = bias.masked_fill(j > i, float("-inf"))
    expected = _merge(attn, F.scaled_dot_product_attention(q, k, v, attn_mask=bias))
    torch.testing.assert_close(attn(x), expected, rtol=1e-5, atol=1e-5)


def test_sinusoidal_model_adds_the_book_encoding() -> None:
    m = tiny("sinusoidal")
    m_none = tiny("none")
    m_none.load_state_dict(m.state_dict())
    tokens = torch.randint(11, (1, 5))
    pe = (
        companion.positional.sinusoidal_encoding(5, 16)
        if hasattr(companion, "positional")
        else None
    )
    from companion.positional import sinusoidal_encoding

    pe = sinusoidal_encoding(5, 16)
    with torch.no_grad():
        x = m.embed(tokens) + pe
        expected = m.head(m.final_norm(m.blocks(x)))
        torch.testing.assert_close(m(tokens), expected)


def test_learned_table_cannot_encode_past_its_rows() -> None:
    m = tiny("learned", max_len=8)
    m(torch.zeros(1, 8, dtype=torch.long))
    with pytest.raises(
        ValueError, match=r"a learned position table has 8 rows and cannot encode length 9"
    ):
        m(torch.zeros(1, 9, dtype=torch.long))


def test_parameter_count_matches_a_hand_count() -> None:
    V, D, layers, max_len = 11, 16, 2, 32
    m = tiny("learned")
    per_norm = 2 * D  # LayerNorm gain and bias
    attn = 3 * D * D + 3 * D + D * D + D
    ffn = D * 4 * D + 4 * D + 4 * D * D + D
    expected = V * D + max_len * D + layers * (attn + ffn + 2 * per_norm) + per_norm + D * V + V
    assert M.parameter_count(m) == expected
    assert M.parameter_count(tiny("rope")) == expected - max_len * D


def test_post_ln_has_no_final_norm_and_pre_ln_has_one() -> None:
    assert isinstance(tiny(placement="post").final_norm, nn.Identity)
    assert isinstance(tiny(placement="pre").final_norm, companion.norm.LayerNorm)
    assert isinstance(tiny(norm="rms").final_norm, companion.norm.RMSNorm)
    assert isinstance(tiny(placement="post").blocks[0], companion.norm.PostLNBlock)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(vocab_size=0), ValueError, r"vocab_size must be positive, got 0"),
        (
            dict(vocab_size=5, dim=10, num_heads=3),
            ValueError,
            r"dim must be divisible by num_heads, got dim=10, num_heads=3",
        ),
        (
            dict(vocab_size=5, dim=6, num_heads=2),
            ValueError,
            r"head_dim = dim / num_heads must be even .* got 3",
        ),
        (
            dict(vocab_size=5, position="relative"),
            ValueError,
            r"position must be one of .* got 'relative'",
        ),
        (
            dict(vocab_size=5, norm="batch"),
            ValueError,
            r"norm must be one of \('layer', 'rms'\), got 'batch'",
        ),
        (
            dict(vocab_size=5, placement="middle"),
            ValueError,
            r"placement must be one of \('pre', 'post'\), got 'middle'",
        ),
        (dict(vocab_size=5, num_layers=1.5), TypeError, r"num_layers must be an int, got float"),
    ],
)
def test_config_validation(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        ModelConfig(**kwargs)


def test_forward_validation() -> None:
    m = tiny()
    with pytest.raises(TypeError, match=r"tokens must be a torch.long tensor, got torch.float32"):
        m(torch.zeros(1, 4))
    with pytest.raises(ValueError, match=r"tokens must have shape \(B, L\), got \(4,\)"):
        m(torch.zeros(4, dtype=torch.long))
    with pytest.raises(TypeError, match=r"config must be a ModelConfig, got dict"):
        TinyTransformer({"vocab_size": 3})  # type: ignore[arg-type]


# --- training and evaluation ------------------------------------------------------------------


@pytest.mark.parametrize("position", SCHEMES)
def test_every_scheme_trains_and_the_loss_decreases(position: str) -> None:
    """lag=1 with a small vocabulary is learnable in a few dozen steps by every scheme that
    carries position information; without positions the loss still falls (the model learns
    the unigram statistics of the previous tokens) but less."""
    m = tiny(position, num_heads=2)
    run = M.train(m, steps=40, batch_size=16, length=12, lag=1, lr=1e-2, seed=0)
    assert len(run.losses) == 40
    first, last = sum(run.losses[:5]) / 5, sum(run.losses[-5:]) / 5
    assert last < first, f"{position}: loss went from {first:.3f} to {last:.3f}"


def test_training_is_deterministic_with_a_seed() -> None:
    runs = [M.train(tiny("rope"), steps=5, batch_size=4, length=8, lag=1, seed=7) for _ in range(2)]
    assert runs[0].losses == runs[1].losses


def test_warmup_ramps_the_learning_rate_linearly() -> None:
    run = M.train(tiny(), steps=6, batch_size=2, length=6, lag=1, lr=1e-3, warmup_steps=4)
    assert run.learning_rates == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3])


class _Oracle(nn.Module):
    """Answers the lag task perfectly: one-hot logits of the token ``lag`` places back."""

    def __init__(self, vocab_size: int, lag: int) -> None:
        super().__init__()
        self.config = ModelConfig(vocab_size=vocab_size, dim=2, num_heads=1)
        self.lag = lag
        self.dummy = nn.Parameter(torch.zeros(1))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        shifted = torch.roll(tokens, self.lag, dims=1)
        return F.one_hot(shifted, self.config.vocab_size).float()


def test_accuracy_is_one_for_an_oracle_and_chance_for_a_constant() -> None:
    assert M.accuracy(_Oracle(9, 2), length=20, lag=2, num_sequences=32) == 1.0
    wrong = M.accuracy(_Oracle(9, 1), length=20, lag=2, num_sequences=256)
    assert abs(wrong - 1 / 9) < 0.03, "a model answering the wrong lag is at chance"


def test_training_validation() -> None:
    with pytest.raises(ValueError, match=r"steps must be positive, got 0"):
        M.train(tiny(), steps=0, batch_size=2, length=4, lag=1)
    with pytest.raises(ValueError, match=r"warmup_steps must be a non-negative int, got -1"):
        M.train(tiny(), steps=1, batch_size=2, length=4, lag=1, warmup_steps=-1)
    with pytest.raises(ValueError, match=r"lr must be a positive number, got 0"):
        M.train(tiny(), steps=1, batch_size=2, length=4, lag=1, lr=0)
    with pytest.raises(TypeError, match=r"model must be an nn.Module, got str"):
        M.accuracy("model", length=4, lag=1)  # type: ignore[arg-type]
