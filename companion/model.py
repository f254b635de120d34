r"""A tiny decoder-only Transformer assembled from the book's parts, and its training loop.

The capstone chapter ("A tiny Transformer") trains this model with each position scheme of the
book and measures what the earlier chapters claimed: does the scheme matter, and does it
extrapolate past the training length? Every part comes from ``companion``:

* attention: :func:`companion.attention.scaled_dot_product_attention` (causal);
* positions: :func:`companion.positional.sinusoidal_encoding`, a learned table,
  :func:`companion.rope.apply_rope` on queries and keys, or
  :func:`companion.extension.alibi_bias` on the scores; or none at all;
* normalization: :class:`companion.norm.LayerNorm` or :class:`companion.norm.RMSNorm`, placed by
  :class:`companion.norm.PreLNBlock` or :class:`companion.norm.PostLNBlock`;
* the MLP: :func:`companion.norm.mlp`.

The task, :func:`lag_task`, asks the model to output at each position the token ``lag``
places back: the answer is defined at any length, and it can only be found by position.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn
from torch.nn import functional as F

from companion.attention import scaled_dot_product_attention
from companion.extension import alibi_bias
from companion.norm import LayerNorm, PostLNBlock, PreLNBlock, RMSNorm, mlp
from companion.positional import sinusoidal_encoding
from companion.rope import apply_rope, rope_cos_sin, rope_frequencies

PositionScheme = Literal["none", "sinusoidal", "learned", "rope", "alibi"]
POSITION_SCHEMES: tuple[str, ...] = ("none", "sinusoidal", "learned", "rope", "alibi")
IGNORE_INDEX = -100


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    return value


def _choice(name: str, value: object, options: tuple[str, ...]) -> str:
    if value not in options:
        raise ValueError(f"{name} must be one of {options}, got {value!r}")
    return str(value)


@dataclass(frozen=True)
class ModelConfig:
    """Sizes and choices of a :class:`TinyTransformer`.

    Args:
        vocab_size: number of token ids.
        dim: model width ``D``.
        num_heads: attention heads ``H``; ``dim`` must be divisible by it.
        num_layers: number of Transformer blocks.
        position: ``"none"``, ``"sinusoidal"``, ``"learned"``, ``"rope"`` or ``"alibi"``.
        norm: ``"layer"`` (LayerNorm) or ``"rms"`` (RMSNorm).
        placement: ``"pre"`` (Pre-LN, with a final norm) or ``"post"`` (Post-LN).
        max_len: rows of the learned position table (only for ``position="learned"``).
        rope_base: the RoPE base (only for ``position="rope"``).
    """

    vocab_size: int
    dim: int = 64
    num_heads: int = 4
    num_layers: int = 2
    position: PositionScheme = "rope"
    norm: Literal["layer", "rms"] = "layer"
    placement: Literal["pre", "post"] = "pre"
    max_len: int = 256
    rope_base: float = 10000.0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "dim", "num_heads", "num_layers", "max_len"):
            _positive_int(name, getattr(self, name))
        if self.dim % self.num_heads:
            raise ValueError(
                f"dim must be divisible by num_heads, got dim={self.dim}, "
                f"num_heads={self.num_heads}"
            )
        if (self.dim // self.num_heads) % 2:
            raise ValueError(
                f"head_dim = dim / num_heads must be even (RoPE rotates pairs), got "
                f"{self.dim // self.num_heads}"
            )
        _choice("position", self.position, POSITION_SCHEMES)
        _choice("norm", self.norm, ("layer", "rms"))
        _choice("placement", self.placement, ("pre", "post"))


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention whose position handling is one of the book's schemes.

    RoPE rotates queries and keys (half layout, as Hugging Face LLaMA); ALiBi adds its bias,
    causal mask included, to the scores; every other scheme uses the plain causal mask. The
    cos/sin table or the bias is computed from the input's length at each call, so the layer
    runs at any length.

    Shape:
        - input: ``(B, L, D)``
        - output: ``(B, L, D)``
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.head_dim = config.dim // config.num_heads
        self.position = config.position
        self.qkv = nn.Linear(config.dim, 3 * config.dim)
        self.out = nn.Linear(config.dim, config.dim)
        if self.position == "rope":
            freqs = rope_frequencies(self.head_dim, base=config.rope_base)
            self.register_buffer("rope_frequencies", freqs, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, L, D = x.shape
        qkv = self.qkv(x).view(B, L, 3, self.num_heads, self.head_dim)  # (B, L, 3, H, Dh)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (B, H, L, Dh)
        mask = None
        if self.position == "rope":
            cos, sin = rope_cos_sin(
                torch.arange(L, device=x.device), self.rope_frequencies, dtype=x.dtype
            )  # (L, Dh/2)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        elif self.position == "alibi":
            mask = alibi_bias(self.num_heads, L, L, dtype=x.dtype, device=x.device)  # (H, L, L)
        if mask is None:
            y = scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, L, Dh)
        else:
            y = scaled_dot_product_attention(q, k, v, mask=mask)
        return self.out(y.transpose(1, 2).reshape(B, L, D))  # (B, L, D)


class TinyTransformer(nn.Module):
    """A decoder-only Transformer small enough to train on a laptop CPU in seconds.

    Token embedding, then the position scheme (added to the embedding for ``"sinusoidal"``
    and ``"learned"``; inside attention for ``"rope"`` and ``"alibi"``; nothing for
    ``"none"``), ``num_layers`` blocks of causal self-attention and MLP, each wrapped in a
    Pre-LN or Post-LN residual block, a final norm for Pre-LN, and a linear head.

    A learned table has ``config.max_len`` rows and cannot encode a longer input:
    :meth:`forward` raises a :class:`ValueError` then. Rows the training never reached stay at
    their random initialisation; the capstone chapter measures what that does.

    Args:
        config: the sizes and choices.

    Shape:
        - input: token ids ``(B, L)``
        - output: logits ``(B, L, vocab_size)``
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if not isinstance(config, ModelConfig):
            raise TypeError(f"config must be a ModelConfig, got {type(config).__name__}")
        self.config = config
        D = config.dim
        self.embed = nn.Embedding(config.vocab_size, D)
        if config.position == "learned":
            self.position_table = nn.Embedding(config.max_len, D)
        blocks = []
        block = PreLNBlock if config.placement == "pre" else PostLNBlock
        for _ in range(config.num_layers):
            blocks.append(block(D, CausalSelfAttention(config), self._norm()))
            blocks.append(block(D, mlp(D), self._norm()))
        self.blocks = nn.Sequential(*blocks)
        self.final_norm = self._norm() if config.placement == "pre" else nn.Identity()
        self.head = nn.Linear(D, config.vocab_size)

    def _norm(self) -> nn.Module:
        if self.config.norm == "layer":
            return LayerNorm(self.config.dim)
        return RMSNorm(self.config.dim, eps=1e-6)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if not isinstance(tokens, torch.Tensor) or tokens.dtype != torch.long:
            got = tokens.dtype if isinstance(tokens, torch.Tensor) else type(tokens).__name__
            raise TypeError(f"tokens must be a torch.long tensor, got {got}")
        if tokens.ndim != 2:
            raise ValueError(f"tokens must have shape (B, L), got {tuple(tokens.shape)}")
        L = tokens.shape[1]
        x = self.embed(tokens)  # (B, L, D); N(0, 1) entries, the scale of the encodings
        if self.config.position == "learned":
            if L > self.config.max_len:
                raise ValueError(
                    f"a learned position table has {self.config.max_len} rows and cannot "
                    f"encode length {L}; build the model with max_len >= {L}"
                )
            x = x + self.position_table.weight[:L]  # (L, D) broadcasts over B
        elif self.config.position == "sinusoidal":
            x = x + sinusoidal_encoding(L, self.config.dim, dtype=x.dtype, device=x.device)
        x = self.final_norm(self.blocks(x))  # (B, L, D)
        return self.head(x)  # (B, L, V)


def parameter_count(model: nn.Module) -> int:
    """Number of trainable parameters of ``model``."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


# ---------------------------------------------------------------------------------------------
# The task
# ---------------------------------------------------------------------------------------------


def lag_task(
    batch_size: int,
    length: int,
    *,
    lag: int,
    vocab_size: int,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of the "token ``lag`` places back" task.

    Tokens are uniform random ids; the target at position ``t`` is the token at
    ``t - lag``. The first ``lag`` positions have no answer and carry the ignore index
    ``-100`` (skipped by :func:`torch.nn.functional.cross_entropy` and by :func:`accuracy`).
    The answer is defined at every length, and content alone cannot find it: a model must
    know where "``lag`` places back" is.

    Args:
        batch_size: sequences in the batch.
        length: ``L``, longer than ``lag``.
        lag: how far back the answer is, positive.
        vocab_size: number of token ids, at least 2.
        generator: a seeded generator for reproducible batches.
        device: where to put the batch.

    Returns:
        ``(tokens, targets)``.

    Shape:
        - tokens: ``(B, L)`` long
        - targets: ``(B, L)`` long, ``-100`` at positions ``t < lag``
    """
    _positive_int("batch_size", batch_size)
    _positive_int("length", length)
    _positive_int("lag", lag)
    _positive_int("vocab_size", vocab_size)
    if vocab_size < 2:
        raise ValueError(f"vocab_size must be at least 2, got {vocab_size}")
    if length <= lag:
        raise ValueError(f"length must be greater than lag, got length={length}, lag={lag}")
    tokens = torch.randint(vocab_size, (batch_size, length), generator=generator)
    targets = torch.full_like(tokens, IGNORE_INDEX)
    targets[:, lag:] = tokens[:, :-lag]
    return tokens.to(device), targets.to(device)


# ---------------------------------------------------------------------------------------------
# Training and evaluation
# ---------------------------------------------------------------------------------------------


@dataclass
class TrainingRun:
    """What :func:`train` returns: the loss at every step and the learning rate used."""

    losses: list[float] = field(default_factory=list)
    learning_rates: list[float] = field(default_factory=list)


def _check_model(model: object) -> nn.Module:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    return model


def train(
    model: nn.Module,
    *,
    steps: int,
    batch_size: int,
    length: int,
    lag: int,
    lr: float = 3e-3,
    warmup_steps: int = 0,
    seed: int = 0,
) -> TrainingRun:
    """Train ``model`` on :func:`lag_task` with AdamW and a cross-entropy loss.

    The learning rate rises linearly over ``warmup_steps`` (none by default) and then stays
    constant, so a comparison with and without warm-up changes one thing only. Batches come
    from a generator seeded with ``seed``; seed the model's initialisation yourself
    (:func:`companion.environment.seed_everything`) before building it.

    Args:
        model: a :class:`TinyTransformer` (any model mapping ``(B, L)`` ids to logits).
        steps: optimisation steps.
        batch_size: sequences per step.
        length: training length ``L_train``.
        lag: the task's lag.
        lr: peak learning rate.
        warmup_steps: linear warm-up steps (0 for none).
        seed: seed of the batch generator.

    Returns:
        A :class:`TrainingRun` with one loss per step.
    """
    model = _check_model(model)
    _positive_int("steps", steps)
    if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
        raise ValueError(f"warmup_steps must be a non-negative int, got {warmup_steps!r}")
    if not isinstance(lr, (int, float)) or isinstance(lr, bool) or not lr > 0:
        raise ValueError(f"lr must be a positive number, got {lr!r}")
    vocab_size = model.config.vocab_size if hasattr(model, "config") else None
    if vocab_size is None:
        raise TypeError("model must have a .config with vocab_size (a TinyTransformer)")
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    run = TrainingRun()
    model.train()
    for step in range(steps):
        rate = lr * min(1.0, (step + 1) / warmup_steps) if warmup_steps else lr
        for group in optimizer.param_groups:
            group["lr"] = rate
        tokens, targets = lag_task(
            batch_size, length, lag=lag, vocab_size=vocab_size, generator=generator, device=device
        )
        logits = model(tokens)  # (B, L, V)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        run.losses.append(loss.item())
        run.learning_rates.append(rate)
    model.eval()
    return run


@torch.no_grad()
def accuracy(
    model: nn.Module,
    *,
    length: int,
    lag: int,
    num_sequences: int = 256,
    seed: int = 1234,
) -> float:
    """Fraction of positions ``t >= lag`` where the model's top token is the right one.

    Args:
        model: a trained :class:`TinyTransformer`.
        length: evaluation length (may exceed the training length).
        lag: the task's lag.
        num_sequences: sequences to evaluate on.
        seed: seed of the evaluation batch (different from training seeds by default).

    Returns:
        The accuracy in ``[0, 1]``; chance is ``1 / vocab_size``.
    """
    model = _check_model(model)
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    tokens, targets = lag_task(
        num_sequences,
        length,
        lag=lag,
        vocab_size=model.config.vocab_size,
        generator=generator,
        device=device,
    )
    was_training = model.training
    model.eval()
    predictions = model(tokens).argmax(dim=-1)  # (B, L)
    model.train(was_training)
    scored = targets != IGNORE_INDEX
    return (predictions[scored] == targets[scored]).double().mean().item()
