"""Tests of companion.model: the tiny Transformer, its attention layers, the lag task
and its scoring. The training loops moved to companion.experiments
(tests/test_experiments.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import companion
from companion import model as M
from companion.attention import MultiHeadAttention
from companion.model import ModelConfig, TinyTransformer

SCHEMES = M.POSITION_SCHEMES


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


def tiny(position: str = "rope", **kwargs: object) -> TinyTransformer:
    companion.seed_everything(0)
    cfg = dict(
        vocab_size=11, dim=16, num_heads=2, num_layers=2, position=position, max_len=32
    )
    cfg.update(kwargs)
    return TinyTransformer(ModelConfig(**cfg))


# ---- The task ------------------------------------------------------------------------


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
    a = M.lag_task(
        2, 8, lag=1, vocab_size=5, generator=torch.Generator().manual_seed(3)
    )
    b = M.lag_task(
        2, 8, lag=1, vocab_size=5, generator=torch.Generator().manual_seed(3)
    )
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


# ---- The attention layers ------------------------------------------------------------


def _one_hook_layers() -> list[tuple[type, str]]:
    from companion import modern, relative, rope_variants

    return [
        (M.RotarySelfAttention, "transform_qk"),
        (M.ALiBiSelfAttention, "score_bias"),
        (modern.QKNormSelfAttention, "transform_qk"),
        (modern.SoftcapSelfAttention, "attention"),
        (relative.T5BiasSelfAttention, "score_bias"),
        (relative.ShawSelfAttention, "attention"),
        (relative.TransformerXLSelfAttention, "attention"),
        (rope_variants.PRoPESelfAttention, None),  # RoPE's hook, other frequencies
    ]


@pytest.mark.parametrize(("cls", "hook"), _one_hook_layers())
def test_each_attention_layer_overrides_one_hook(cls: type, hook: str | None) -> None:
    """Like labml's RotaryPEMultiHeadAttention, which overrides only `get_scores`:
    projections, split, merge and `attend` are the chapter's MultiHeadAttention's; each
    layer replaces one of `attend`'s hooks (and may set `accepts_mask`, and its
    constructor registers what the hook needs)."""
    assert issubclass(cls, MultiHeadAttention)
    own = {name for name in vars(cls) if not name.startswith("__")} - {"accepts_mask"}
    assert own == ({hook} if hook else set()), own
    hooks = ("transform_qk", "score_bias", "attention")
    for base in cls.__mro__[: cls.__mro__.index(MultiHeadAttention)]:
        assert "attend" not in vars(base), base
        assert len(set(vars(base)) & set(hooks)) <= 1, base
    for name in ("_split", "load_torch_weights", "attend"):
        assert getattr(cls, name) is getattr(MultiHeadAttention, name)


def test_default_hooks_are_scaled_dot_product_attention_bit_for_bit() -> None:
    from companion.attention import scaled_dot_product_attention

    attn = MultiHeadAttention(16, 4)
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 4, 5, 4, generator=gen) for _ in range(3))
    mask = torch.rand(2, 1, 5, 5, generator=gen) > 0.3
    for kw in ({}, {"is_causal": True}, {"mask": mask}):
        assert torch.equal(
            attn.attend(q, k, v, **kw), scaled_dot_product_attention(q, k, v, **kw)
        )


def test_a_layer_that_builds_its_own_mask_refuses_one_before_any_hook() -> None:
    class Watched(M.ALiBiSelfAttention):
        def transform_qk(self, query, key):
            raise AssertionError("computed before the mask was refused")

    q = torch.zeros(1, 2, 3, 8)
    with pytest.raises(ValueError, match=r"^mask must be None: Watched builds its own"):
        Watched(16, 2).attend(q, q, q, mask=torch.ones(3, 3, dtype=torch.bool))


def _projections(attn: MultiHeadAttention, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    B, L, D = x.shape
    H = attn.num_heads
    projs = (attn.q_proj, attn.k_proj, attn.v_proj)
    return tuple(p(x).view(B, L, H, D // H).transpose(1, 2) for p in projs)


def _merge(attn: MultiHeadAttention, y: torch.Tensor) -> torch.Tensor:
    B, H, L, Dh = y.shape
    return attn.out_proj(y.transpose(1, 2).reshape(B, L, H * Dh))


def test_attention_without_positions_matches_torch_sdpa() -> None:
    attn = tiny("none").blocks[0].sublayer
    assert type(attn) is M.CausalSelfAttention
    x = torch.randn(2, 7, 16)
    q, k, v = _projections(attn, x)
    expected = _merge(attn, F.scaled_dot_product_attention(q, k, v, is_causal=True))
    torch.testing.assert_close(attn(x), expected, rtol=1e-5, atol=1e-6)


def test_rope_attention_matches_hugging_face_rotation_and_torch_sdpa() -> None:
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    attn = tiny("rope").blocks[0].sublayer
    assert type(attn) is M.RotarySelfAttention
    x = torch.randn(2, 7, 16)
    q, k, v = _projections(attn, x)
    head_dim = 8
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim
    inv_freq = 1.0 / (10000.0**exponents)
    angles = torch.arange(7, dtype=torch.float64)[:, None] * inv_freq[None, :]
    emb = torch.cat([angles, angles], dim=-1)  # HF's half layout
    q_hf, k_hf = apply_rotary_pos_emb(
        q, k, emb.cos().float()[None], emb.sin().float()[None]
    )
    expected = _merge(
        attn, F.scaled_dot_product_attention(q_hf, k_hf, v, is_causal=True)
    )
    torch.testing.assert_close(attn(x), expected, rtol=1e-5, atol=1e-5)


def test_alibi_attention_matches_the_paper_bias_with_torch_sdpa() -> None:
    attn = tiny("alibi", num_heads=4, dim=16).blocks[0].sublayer
    assert type(attn) is M.ALiBiSelfAttention
    x = torch.randn(2, 6, 16)
    q, k, v = _projections(attn, x)
    slopes = torch.tensor([2.0 ** (-8 * (h + 1) / 4) for h in range(4)])  # Press et al.
    i = torch.arange(6)[:, None]
    j = torch.arange(6)[None, :]
    bias = -slopes[:, None, None] * (i - j).float()
    bias = bias.masked_fill(j > i, float("-inf"))
    expected = _merge(attn, F.scaled_dot_product_attention(q, k, v, attn_mask=bias))
    torch.testing.assert_close(attn(x), expected, rtol=1e-5, atol=1e-5)


def test_alibi_layer_has_no_parameters_of_its_own() -> None:
    plain, alibi = M.CausalSelfAttention(16, 4), M.ALiBiSelfAttention(16, 4)
    assert M.parameter_count(plain) == M.parameter_count(alibi) == 4 * (16 * 16 + 16)


# ---- The model -----------------------------------------------------------------------


@pytest.mark.parametrize("position", SCHEMES)
@pytest.mark.parametrize("placement", ["pre", "post"])
def test_logits_shape_for_every_scheme_and_placement(
    position: str, placement: str
) -> None:
    m = tiny(
        position, placement=placement, norm="rms" if placement == "post" else "layer"
    )
    tokens = torch.randint(11, (3, 9))
    assert m(tokens).shape == (3, 9, 11)
    assert m(tokens.int()).shape == (3, 9, 11), "int32 ids work as int64 ones"
    assert m(tokens[:, :0]).shape == (3, 0, 11), "no positions: no logits"


@pytest.mark.parametrize("position", SCHEMES)
def test_the_model_is_causal(position: str) -> None:
    """Changing a future token changes no earlier output, whatever the scheme."""
    m = tiny(position)
    tokens = torch.randint(11, (2, 12), generator=torch.Generator().manual_seed(1))
    changed = tokens.clone()
    changed[:, 7] = (changed[:, 7] + 1) % 11
    with torch.no_grad():
        a, b = m(tokens), m(changed)
    torch.testing.assert_close(a[:, :7], b[:, :7], rtol=0, atol=1e-6)
    assert not torch.allclose(a[:, 7:], b[:, 7:])


def test_without_positions_one_layer_ignores_the_order_of_the_past() -> None:
    """No position information, one layer: permuting earlier tokens leaves the last
    output unchanged (causal attention is a weighted average over an unordered set). A
    second layer breaks this, because earlier hidden states depend on their own
    prefixes."""
    m = tiny("none", num_layers=1)
    tokens = torch.randint(11, (1, 10), generator=torch.Generator().manual_seed(2))
    perm = torch.cat(
        [
            torch.randperm(9, generator=torch.Generator().manual_seed(0)),
            torch.tensor([9]),
        ]
    )
    with torch.no_grad():
        last = m(tokens)[:, -1]
        last_permuted = m(tokens[:, perm])[:, -1]
    torch.testing.assert_close(last, last_permuted, rtol=1e-5, atol=1e-5)
    two_layers = tiny("none", num_layers=2)
    with torch.no_grad():
        gap = (
            (two_layers(tokens)[:, -1] - two_layers(tokens[:, perm])[:, -1]).abs().max()
        )
    assert gap > 1e-3, "two causal layers see order through the prefixes"
    m_rope = tiny("rope")
    with torch.no_grad():
        rotated, permuted = m_rope(tokens)[:, -1], m_rope(tokens[:, perm])[:, -1]
    assert not torch.allclose(rotated, permuted, atol=1e-4)


def test_sinusoidal_model_adds_the_book_encoding() -> None:
    from companion.positional import sinusoidal_encoding

    m = tiny("sinusoidal")
    tokens = torch.randint(11, (1, 5))
    with torch.no_grad():
        x = m.embed(tokens) + sinusoidal_encoding(5, 16)
        expected = m.head(m.final_norm(m.blocks(x)))
        torch.testing.assert_close(m(tokens), expected)


def test_parameter_count_matches_a_hand_count() -> None:
    V, D, layers, max_len = 11, 16, 2, 32
    m = tiny("learned")
    per_norm = 2 * D  # LayerNorm gain and bias
    attn = 4 * (D * D + D)  # W_Q, W_K, W_V, W_O with biases
    ffn = D * 4 * D + 4 * D + 4 * D * D + D
    expected = (
        V * D
        + max_len * D
        + layers * (attn + ffn + 2 * per_norm)
        + per_norm
        + D * V
        + V
    )
    assert M.parameter_count(m) == expected
    assert M.parameter_count(tiny("rope")) == expected - max_len * D


def test_post_ln_has_no_final_norm_and_pre_ln_has_one() -> None:
    assert isinstance(tiny(placement="post").final_norm, nn.Identity)
    assert isinstance(tiny(placement="pre").final_norm, companion.norm.LayerNorm)
    assert isinstance(tiny(norm="rms").final_norm, companion.norm.RMSNorm)
    assert isinstance(tiny(placement="post").blocks[0], companion.norm.PostLNBlock)


# ---- Training and evaluation ---------------------------------------------------------


class _Oracle(nn.Module):
    """Answers the lag task perfectly: one-hot logits of the token ``lag`` back."""

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


def test_position_accuracy_against_a_loop_and_its_mean_is_accuracy() -> None:
    """Oracle: a loop over sequences and positions on the same seeded batch."""
    net = tiny("rope")
    per_position = M.position_accuracy(net, length=12, lag=3, num_sequences=40, seed=5)
    assert per_position.shape == (12,) and per_position.dtype == torch.float64
    assert per_position[:3].isnan().all()
    tokens, targets = M.lag_task(
        40, 12, lag=3, vocab_size=11, generator=torch.Generator().manual_seed(5)
    )
    with torch.no_grad():
        predictions = net(tokens).argmax(dim=-1)
    for t in range(3, 12):
        hits = sum(int(predictions[b, t] == targets[b, t]) for b in range(40))
        assert per_position[t].item() == hits / 40
    pooled = M.accuracy(net, length=12, lag=3, num_sequences=40, seed=5)
    assert abs(per_position[3:].mean().item() - pooled) < 1e-12
    oracle = M.position_accuracy(_Oracle(9, 2), length=10, lag=2, num_sequences=8)
    assert (oracle[2:] == 1).all()


def test_a_causal_model_gives_the_same_position_accuracy_at_every_length() -> None:
    """The outputs at t < n do not depend on the positions after t: the accuracies on
    the first positions of a longer evaluation are those of the shorter one, on the
    same tokens."""
    for position in ("none", "rope", "alibi", "sinusoidal"):
        net = tiny(position)
        tokens = torch.randint(11, (4, 24), generator=torch.Generator().manual_seed(6))
        with torch.no_grad():
            torch.testing.assert_close(net(tokens[:, :8]), net(tokens)[:, :8])


# ---- Bad input: every public name ----------------------------------------------------

_IDS = torch.zeros(1, 4, dtype=torch.long)
BAD_INPUTS = [
    (
        "accuracy",
        lambda: M.accuracy(
            TinyTransformer(
                ModelConfig(vocab_size=8, dim=8, num_heads=2, num_layers=1)
            ),
            length=4,
            lag=1,
            seed=torch.tensor(1.5),
        ),
        TypeError,
        "seed must be an int",
    ),
    # ModelConfig
    (
        "ModelConfig",
        lambda: ModelConfig(vocab_size=0),
        ValueError,
        r"vocab_size must be an int >= 2, got 0",
    ),
    (
        "ModelConfig",
        lambda: ModelConfig(vocab_size=5, dim=10, num_heads=3),
        ValueError,
        r"dim must be divisible by num_heads, got dim=10, num_heads=3",
    ),
    (
        "ModelConfig",
        lambda: ModelConfig(vocab_size=5, dim=6, num_heads=2),
        ValueError,
        r"head_dim = dim / num_heads must be even .* got 3",
    ),
    (
        "ModelConfig",
        lambda: ModelConfig(vocab_size=5, position="relative"),
        ValueError,
        r"position must be one of 'none', 'sinusoidal', 'learned', 'rope', 'alibi', "
        r"got 'relative'",
    ),
    (
        "ModelConfig",
        lambda: ModelConfig(vocab_size=5, norm="batch"),
        ValueError,
        r"norm must be one of 'layer', 'rms', got 'batch'",
    ),
    (
        "ModelConfig",
        lambda: ModelConfig(vocab_size=5, placement=None),
        TypeError,
        r"placement must be one of 'pre', 'post', got None",
    ),
    (
        "ModelConfig",
        lambda: ModelConfig(vocab_size=5, num_layers=1.5),
        TypeError,
        r"num_layers must be an int, got 1.5",
    ),
    (
        "ModelConfig",
        lambda: ModelConfig(vocab_size=True),
        TypeError,
        r"vocab_size must be an int, got True",
    ),
    (
        "ModelConfig",
        lambda: ModelConfig(vocab_size=5, rope_base=1.0),
        ValueError,
        r"rope_base must be a real number > 1, got 1.0",
    ),
    # the attention layers
    (
        "CausalSelfAttention",
        lambda: M.CausalSelfAttention(0, 2),
        ValueError,
        r"dim must be a positive int, got 0",
    ),
    (
        "CausalSelfAttention",
        lambda: M.CausalSelfAttention(16, 3),
        ValueError,
        r"dim must be divisible by num_heads, got dim=16, num_heads=3",
    ),
    (
        "CausalSelfAttention",
        lambda: M.CausalSelfAttention(16, 2)(torch.zeros(2, 16)),
        ValueError,
        r"x must have 3 dimensions \(B, L, D\), got shape \(2, 16\)",
    ),
    (
        "CausalSelfAttention",
        lambda: M.CausalSelfAttention(16, 2)(torch.zeros(1, 3, 8)),
        ValueError,
        r"x must have size 16 \(dim\) in dimension -1, got shape \(1, 3, 8\)",
    ),
    (
        "CausalSelfAttention",
        lambda: M.CausalSelfAttention(16, 2)([[0.0] * 16]),
        TypeError,
        r"x must be a torch.Tensor, got a list",
    ),
    (
        "RotarySelfAttention",
        lambda: M.RotarySelfAttention(12, 4),
        ValueError,
        r"dim / num_heads must be even for RoPE \(it rotates pairs\), got 12 / 4 = 3",
    ),
    (
        "RotarySelfAttention",
        lambda: M.RotarySelfAttention(16, 2, base=-1.0),
        ValueError,
        r"base must be a real number > 1, got -1.0",
    ),
    (
        "RotarySelfAttention",
        lambda: M.RotarySelfAttention(16, 2)(torch.zeros(1, 3, 16, dtype=torch.long)),
        TypeError,
        r"x must be a floating-point tensor, got a tensor of dtype torch.int64",
    ),
    (
        "ALiBiSelfAttention",
        lambda: M.ALiBiSelfAttention(16, 0),
        ValueError,
        r"num_heads must be a positive int, got 0",
    ),
    (
        "ALiBiSelfAttention",
        lambda: M.ALiBiSelfAttention(16, 2).attend(
            *[torch.zeros(1, 2, 3, 8)] * 3, mask=torch.ones(3, 3, dtype=torch.bool)
        ),
        ValueError,
        r"mask must be None: ALiBiSelfAttention builds its own mask",
    ),
    # the model
    (
        "TinyTransformer",
        lambda: TinyTransformer({"vocab_size": 3}),
        TypeError,
        r"config must be a ModelConfig, got a dict",
    ),
    (
        "TinyTransformer",
        lambda: tiny()(torch.zeros(1, 4)),
        TypeError,
        r"input_ids must be an integer tensor, got a tensor of dtype torch.float32",
    ),
    (
        "TinyTransformer",
        lambda: tiny()(torch.zeros(4, dtype=torch.long)),
        ValueError,
        r"input_ids must have 2 dimensions \(B, L\), got shape \(4,\)",
    ),
    (
        "TinyTransformer",
        lambda: tiny()(torch.tensor([[1, 11, 3]])),
        ValueError,
        r"input_ids must be token ids in \[0, 10\] \(vocab_size=11\), "
        r"got ids from 1 to 11",
    ),
    (
        "TinyTransformer",
        lambda: tiny()(torch.tensor([[-1, 2]])),
        ValueError,
        r"input_ids must be token ids in \[0, 10\] \(vocab_size=11\), "
        r"got ids from -1 to 2",
    ),
    (
        "TinyTransformer",
        lambda: tiny()(torch.zeros(1, 2, dtype=torch.long, device="meta")),
        ValueError,
        r"input_ids must hold values, got a tensor on the 'meta' device",
    ),
    (
        "TinyTransformer",
        lambda: tiny("learned", max_len=8)(torch.zeros(1, 9, dtype=torch.long)),
        ValueError,
        r"input_ids must have at most max_len=8 positions \(a learned table has 8 rows",
    ),
    (
        "TinyTransformer",
        lambda: tiny()([[1, 2]]),
        TypeError,
        r"input_ids must be a torch.Tensor, got a list",
    ),
    # parameter_count
    (
        "parameter_count",
        lambda: M.parameter_count("model"),
        TypeError,
        r"model must be a Module, got 'model'",
    ),
    # lag_task
    (
        "lag_task",
        lambda: M.lag_task(0, 5, lag=1, vocab_size=4),
        ValueError,
        r"batch_size must be a positive int, got 0",
    ),
    (
        "lag_task",
        lambda: M.lag_task(2, 3, lag=3, vocab_size=4),
        ValueError,
        r"length must be greater than lag, got length=3, lag=3",
    ),
    (
        "lag_task",
        lambda: M.lag_task(2, 5, lag=0, vocab_size=4),
        ValueError,
        r"lag must be a positive int, got 0",
    ),
    (
        "lag_task",
        lambda: M.lag_task(2, 5, lag=1, vocab_size=1),
        ValueError,
        r"vocab_size must be an int >= 2, got 1",
    ),
    (
        "lag_task",
        lambda: M.lag_task(2.0, 5, lag=1, vocab_size=4),
        TypeError,
        r"batch_size must be an int, got 2.0",
    ),
    (
        "lag_task",
        lambda: M.lag_task(2, 5, lag=1, vocab_size=4, generator=0),
        TypeError,
        r"generator must be a torch.Generator, got 0",
    ),
    (
        "lag_task",
        lambda: M.lag_task(2, 5, lag=1, vocab_size=4, device="gpu"),
        ValueError,
        r"device must be a device such as 'cpu' or 'cuda', got 'gpu'",
    ),
    # check_lag_task, model_config
    (
        "check_lag_task",
        lambda: M.check_lag_task(2, 3, 3, 8),
        ValueError,
        r"length must be greater than lag, got length=3, lag=3",
    ),
    (
        "check_lag_task",
        lambda: M.check_lag_task(2, 8, 1, 1),
        ValueError,
        r"vocab_size must be an int >= 2, got 1",
    ),
    (
        "model_config",
        lambda: M.model_config("model", nn.Linear(2, 2)),
        TypeError,
        r"model.config must be a ModelConfig",
    ),
    # accuracy
    (
        "accuracy",
        lambda: M.accuracy("model", length=4, lag=1),
        TypeError,
        r"model must be a Module, got 'model'",
    ),
    (
        "accuracy",
        lambda: M.accuracy(tiny(), length=4, lag=1, num_sequences=0),
        ValueError,
        r"num_sequences must be a positive int, got 0",
    ),
    (
        "accuracy",
        lambda: M.accuracy(tiny(), length=4, lag=4),
        ValueError,
        r"length must be greater than lag, got length=4, lag=4",
    ),
    # position_accuracy
    (
        "position_accuracy",
        lambda: M.position_accuracy(nn.Linear(2, 2), length=4, lag=1),
        TypeError,
        r"model.config must be a ModelConfig",
    ),
    (
        "position_accuracy",
        lambda: M.position_accuracy(tiny(), length=4, lag=1, seed=-1),
        ValueError,
        r"seed must be an int >= 0, got -1",
    ),
    (
        "position_accuracy",
        lambda: M.position_accuracy(tiny(), length=3, lag=5),
        ValueError,
        r"length must be greater than lag, got length=3, lag=5",
    ),
]


@pytest.mark.parametrize(
    ("name", "thunk", "error", "match"),
    BAD_INPUTS,
    ids=[f"{case[0]}-{i}" for i, case in enumerate(BAD_INPUTS)],
)
def test_bad_input_raises_a_named_error(
    name: str, thunk: object, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        thunk()  # type: ignore[operator]


def test_every_public_name_has_bad_input_cases() -> None:
    covered = {case[0] for case in BAD_INPUTS}
    assert set(M.__all__) <= covered, set(M.__all__) - covered


def test_the_moved_training_loops_still_answer_with_a_warning() -> None:
    """model.train, model.train_batched and model.TrainingRun: deprecated aliases of
    companion.experiments' for one release."""
    from companion import experiments

    for name in ("train", "train_batched", "TrainingRun"):
        with pytest.warns(DeprecationWarning, match=f"experiments.{name}"):
            assert getattr(M, name) is getattr(experiments, name)
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        M.nothing  # noqa: B018
