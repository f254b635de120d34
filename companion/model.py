r"""A tiny decoder-only Transformer built from the book's parts, and its training loops.

The capstone chapter ("A tiny Transformer") trains this model with the position schemes
of chapters 1-3 (none, sinusoidal, RoPE, ALiBi, and a learned table in an exercise) and
measures what the earlier chapters claimed: does the scheme matter, and does it
extrapolate past the training length? (Chapter 4 trains the rest of the position family,
through :mod:`companion.relative`.) Every part comes from ``companion``:

* attention: :class:`companion.attention.MultiHeadAttention`; the RoPE and ALiBi layers
  subclass it and override one hook of its per-head step
  :meth:`~companion.attention.MultiHeadAttention.attend`: RoPE
  :meth:`~companion.attention.MultiHeadAttention.transform_qk`, ALiBi
  :meth:`~companion.attention.MultiHeadAttention.score_bias`;
* positions: :func:`companion.positional.sinusoidal_encoding`, a learned table,
  :func:`companion.rope.apply_rope` on queries and keys, or
  :func:`companion.extension.alibi_bias` on the scores; or none at all;
* normalization: :class:`companion.norm.LayerNorm` or :class:`companion.norm.RMSNorm`,
  placed by :class:`companion.norm.PreLNBlock` or :class:`companion.norm.PostLNBlock`;
* the MLP: :func:`companion.norm.mlp`.

The task, :func:`lag_task`, asks the model to output at each position the token ``lag``
places back: the answer is defined at any length, and it can only be found by position.

The training loops live in :mod:`companion.experiments`, the one home of the book's
training (seeds, the jitter that stands for another processor, result tables):
:func:`companion.experiments.train` and :func:`companion.experiments.train_batched`, and
the capstone's experiments themselves live in :mod:`companion.capstone`.
``model.train``, ``model.train_batched`` and ``model.TrainingRun`` still work for one
release and warn (:class:`DeprecationWarning`). :func:`accuracy` scores a trained model
over every position of a batch; :func:`position_accuracy` position by position, so that
positions inside and past the training length can be told apart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from companion import _deprecation, _validate
from companion.attention import MultiHeadAttention
from companion.extension import alibi_bias
from companion.norm import LayerNorm, PostLNBlock, PreLNBlock, RMSNorm, mlp
from companion.positional import sinusoidal_encoding
from companion.rope import apply_rope, rope_cos_sin, rope_frequencies

__all__ = [
    "ALiBiSelfAttention",
    "CausalSelfAttention",
    "ModelConfig",
    "RotarySelfAttention",
    "TinyTransformer",
    "accuracy",
    "check_lag_task",
    "lag_task",
    "model_config",
    "parameter_count",
    "position_accuracy",
]

PositionScheme = Literal["none", "sinusoidal", "learned", "rope", "alibi"]
POSITION_SCHEMES: tuple[str, ...] = ("none", "sinusoidal", "learned", "rope", "alibi")
IGNORE_INDEX = -100  # torch's default ignore_index of cross_entropy


@dataclass(frozen=True)
class ModelConfig:
    """Sizes and choices of a :class:`TinyTransformer`.

    Args:
        vocab_size: number of token ids, at least 2.
        dim: model width ``D``.
        num_heads: attention heads ``H``; ``dim`` must be divisible by it.
        num_layers: number of Transformer blocks.
        position: ``"none"``, ``"sinusoidal"``, ``"learned"``, ``"rope"`` or
            ``"alibi"``.
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
        _validate.integer("vocab_size", self.vocab_size, minimum=2)
        for name in ("dim", "num_heads", "num_layers", "max_len"):
            _validate.positive_int(name, getattr(self, name))
        if self.dim % self.num_heads:
            raise ValueError(
                f"dim must be divisible by num_heads, got dim={self.dim}, "
                f"num_heads={self.num_heads}"
            )
        if (self.dim // self.num_heads) % 2:
            raise ValueError(
                "head_dim = dim / num_heads must be even (RoPE rotates pairs), got "
                f"{self.dim // self.num_heads}"
            )
        _validate.choice("position", self.position, POSITION_SCHEMES)
        _validate.choice("norm", self.norm, ("layer", "rms"))
        _validate.choice("placement", self.placement, ("pre", "post"))
        _validate.real("rope_base", self.rope_base, exclusive_minimum=1.0)


# ---- Attention: the chapter's multi-head attention, with a position step -------------


class CausalSelfAttention(MultiHeadAttention):
    """Causal self-attention without position information: the plain causal mask.

    :class:`companion.attention.MultiHeadAttention` called with ``query = key = value =
    x`` and ``is_causal=True``; the projections, the head split and the merge are its
    own. The position schemes that act inside attention subclass this and override one
    hook of :meth:`~companion.attention.MultiHeadAttention.attend`.

    Args:
        dim: model width ``D``.
        num_heads: heads ``H``; must divide ``dim``.

    Shape:
        - input: ``(B, L, D)``
        - output: ``(B, L, D)``
    """

    def __init__(self, dim: int, num_heads: int) -> None:
        dim = _validate.positive_int("dim", dim)
        num_heads = _validate.positive_int("num_heads", num_heads)
        if dim % num_heads:
            raise ValueError(
                "dim must be divisible by num_heads, got "
                f"dim={dim}, num_heads={num_heads}"
            )
        super().__init__(dim, num_heads)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        """Attend from every position of ``x`` to itself and the positions before it."""
        _validate.tensor("x", x, ndim=3, meaning="(B, L, D)")
        _validate.size("x", x, -1, self.embed_dim, "dim")
        return super().forward(x, x, x, is_causal=True)


class RotarySelfAttention(CausalSelfAttention):
    """Causal self-attention with RoPE: queries and keys rotated before the scores.

    The only override is the hook
    :meth:`~companion.attention.MultiHeadAttention.transform_qk`: rotate ``q`` and
    ``k`` by :func:`companion.rope.apply_rope` (half layout, as Hugging Face LLaMA).
    The cos/sin table is computed from the input's length at each call, so the layer
    runs at any length; the queries sit at the last ``L`` of the ``S`` key positions.

    Args:
        dim: model width ``D``.
        num_heads: heads ``H``; ``dim / num_heads`` must be even.
        base: the RoPE base.

    Shape:
        - input: ``(B, L, D)``
        - output: ``(B, L, D)``
    """

    def __init__(self, dim: int, num_heads: int, *, base: float = 10000.0) -> None:
        super().__init__(dim, num_heads)
        if self.head_dim % 2:
            raise ValueError(
                "dim / num_heads must be even for RoPE (it rotates pairs), got "
                f"{dim} / {num_heads} = {self.head_dim}"
            )
        base = _validate.real("base", base, exclusive_minimum=1.0)
        freqs = rope_frequencies(self.head_dim, base=base)  # (D/2,) theta_i, float64
        self.register_buffer("rope_frequencies", freqs, persistent=False)

    def transform_qk(
        self, query: torch.Tensor, key: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate ``query`` (positions S - L to S - 1) and ``key`` (0 to S - 1)."""
        L, S = query.shape[-2], key.shape[-2]
        freqs = self.rope_frequencies
        cos_q, sin_q = rope_cos_sin(torch.arange(S - L, S), freqs, dtype=query.dtype)
        cos_k, sin_k = rope_cos_sin(torch.arange(S), freqs, dtype=key.dtype)
        query = apply_rope(query, cos_q.to(query.device), sin_q.to(query.device))
        key = apply_rope(key, cos_k.to(key.device), sin_k.to(key.device))
        return query, key  # (B, H, L, D/H), (B, H, S, D/H)


class ALiBiSelfAttention(CausalSelfAttention):
    """Causal self-attention with ALiBi: the bias :math:`-a_h (m - n)` on the scores.

    Head ``h`` adds ``-a_h (m - n)`` to the score of the query at position ``m`` for the
    key at ``n``, with slope ``a_h`` (the book's notation; Press et al. write ``m`` for
    the slope).

    The only override is the hook
    :meth:`~companion.attention.MultiHeadAttention.score_bias`:
    :func:`companion.extension.alibi_bias` (causal mask included) is added to the
    scores. No parameters are added;
    :meth:`~companion.attention.MultiHeadAttention.attend` takes no ``mask``.

    Args:
        dim: model width ``D``.
        num_heads: heads ``H``.

    Shape:
        - input: ``(B, L, D)``
        - output: ``(B, L, D)``
    """

    accepts_mask = False

    def score_bias(
        self, query: torch.Tensor, key: torch.Tensor, *, is_causal: bool
    ) -> torch.Tensor:
        """ALiBi's bias for ``L`` queries and ``S`` keys, ``-inf`` above the diagonal
        when ``is_causal``."""
        L, S = query.shape[-2], key.shape[-2]
        return alibi_bias(
            self.num_heads,
            L,
            S,
            is_causal=is_causal,
            dtype=query.dtype,
            device=query.device,
        )  # (H, L, S), -inf above the diagonal when causal


# ---- The model -----------------------------------------------------------------------


class TinyTransformer(nn.Module):
    """A decoder-only Transformer small enough to train on a laptop CPU in seconds.

    Token embedding, then the position scheme (added to the embedding for
    ``"sinusoidal"`` and ``"learned"``; inside attention for ``"rope"`` and ``"alibi"``;
    nothing for ``"none"``), ``num_layers`` blocks of causal self-attention and MLP,
    each wrapped in a Pre-LN or Post-LN residual block, a final norm for Pre-LN, and a
    linear head.

    A learned table has ``config.max_len`` rows and cannot encode a longer input:
    :meth:`forward` raises a :class:`ValueError` then. Rows the training never reached
    stay at their random initialization: past the training length the table encodes
    nothing it learned (the capstone's third exercise measures it).

    Args:
        config: the sizes and choices.

    Shape:
        - input: token ids ``input_ids`` of shape ``(B, L)``, integers in
          ``[0, vocab_size)``
        - output: logits ``(B, L, vocab_size)``
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        _validate.instance("config", config, ModelConfig, "a ModelConfig")
        self.config = config
        D = config.dim
        self.embed = nn.Embedding(config.vocab_size, D)
        if config.position == "learned":
            self.position_table = nn.Embedding(config.max_len, D)
        block = PreLNBlock if config.placement == "pre" else PostLNBlock
        blocks = []
        for _ in range(config.num_layers):
            blocks.append(block(D, self._attention(), self._norm()))
            blocks.append(block(D, mlp(D), self._norm()))
        self.blocks = nn.Sequential(*blocks)
        self.final_norm = self._norm() if config.placement == "pre" else nn.Identity()
        self.head = nn.Linear(D, config.vocab_size)

    def _attention(self) -> CausalSelfAttention:
        c = self.config
        if c.position == "rope":
            return RotarySelfAttention(c.dim, c.num_heads, base=c.rope_base)
        if c.position == "alibi":
            return ALiBiSelfAttention(c.dim, c.num_heads)
        return CausalSelfAttention(c.dim, c.num_heads)

    def _norm(self) -> nn.Module:
        if self.config.norm == "layer":
            return LayerNorm(self.config.dim)
        return RMSNorm(self.config.dim, eps=1e-6)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Logits of the next token at every position of ``input_ids``."""
        _validate.tensor(
            "input_ids", input_ids, dtype="integer", ndim=2, meaning="(B, L)"
        )
        _validate.same_device("input_ids", input_ids, "the model", self.embed.weight)
        B, L = input_ids.shape
        V = self.config.vocab_size
        if input_ids.numel() == 0:  # no positions (or no sequences): no logits
            return self.head.weight.new_zeros(B, L, V)
        low, high = input_ids.min().item(), input_ids.max().item()
        if low < 0 or high >= V:
            raise ValueError(
                f"input_ids must be token ids in [0, {V - 1}] (vocab_size={V}), "
                f"got ids from {low} to {high}"
            )
        if self.config.position == "learned" and L > self.config.max_len:
            raise ValueError(
                f"input_ids must have at most max_len={self.config.max_len} positions "
                f"(a learned table has {self.config.max_len} rows and cannot encode "
                f"more), got length {L}; build the model with max_len >= {L}"
            )
        return self._logits(input_ids.long())

    def _logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """:meth:`forward` without the checks (they read values, which vmap cannot)."""
        L = input_ids.shape[-1]
        x = self.embed(
            input_ids
        )  # (B, L, D); N(0, 1) entries, the scale of the encodings
        if self.config.position == "learned":
            x = x + self.position_table.weight[:L]  # (L, D) broadcasts over B
        elif self.config.position == "sinusoidal":
            x = x + sinusoidal_encoding(
                L, self.config.dim, dtype=x.dtype, device=x.device
            )
        x = self.final_norm(self.blocks(x))  # (B, L, D)
        return self.head(x)  # (B, L, V)


def attention_inputs(
    net: TinyTransformer, input_ids: torch.Tensor
) -> list[tuple[CausalSelfAttention, torch.Tensor]]:
    """Run ``net`` once on ``input_ids``; each of its attention layers, in order, with the
    input ``(B, L, D)`` it saw (recorded by forward pre-hooks, removed afterwards). The
    probes that recompute a trained layer's weights start here (not in ``__all__``)."""
    layers = [m for m in net.modules() if isinstance(m, CausalSelfAttention)]
    inputs: list[torch.Tensor] = []
    hooks = [
        m.register_forward_pre_hook(lambda _, a: inputs.append(a[0])) for m in layers
    ]
    try:
        net(input_ids)
    finally:
        for h in hooks:
            h.remove()
    return list(zip(layers, inputs, strict=True))


def parameter_count(model: nn.Module) -> int:
    """Number of trainable parameters of ``model``.

    Args:
        model: any :class:`torch.nn.Module`.
    """
    _validate.module("model", model)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


# ---- The task ------------------------------------------------------------------------


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
    ``-100`` (skipped by :func:`torch.nn.functional.cross_entropy` and by
    :func:`accuracy`). The answer is defined at every length, and content alone cannot
    find it: a model must know where "``lag`` places back" is.

    Args:
        batch_size: sequences in the batch.
        length: ``L``, longer than ``lag``.
        lag: how far back the answer is, positive.
        vocab_size: number of token ids, at least 2.
        generator: a seeded CPU generator for reproducible batches.
        device: where to put the batch.

    Returns:
        ``(tokens, targets)``.

    Shape:
        - tokens: ``(B, L)`` long
        - targets: ``(B, L)`` long, ``-100`` at positions ``t < lag``
    """
    check_lag_task(batch_size, length, lag, vocab_size)
    if generator is not None:
        _validate.instance("generator", generator, torch.Generator, "a torch.Generator")
    device = _validate.device("device", device)
    tokens = torch.randint(vocab_size, (batch_size, length), generator=generator)
    targets = torch.full_like(tokens, IGNORE_INDEX)
    targets[:, lag:] = tokens[:, :-lag]
    return tokens.to(device), targets.to(device)


def check_lag_task(
    batch_size: object, length: object, lag: object, vocab_size: object
) -> None:
    """Check the sizes of a :func:`lag_task` batch (raises ``ValueError``/``TypeError``
    naming the argument); the training loops of :mod:`companion.experiments` use it."""
    _validate.positive_int("batch_size", batch_size)
    _validate.positive_int("length", length)
    _validate.positive_int("lag", lag)
    _validate.integer("vocab_size", vocab_size, minimum=2)
    if length <= lag:  # type: ignore[operator]
        raise ValueError(
            f"length must be greater than lag, got length={length}, lag={lag}"
        )


# ---- Training and evaluation ---------------------------------------------------------


def model_config(name: str, model: object) -> ModelConfig:
    """Check that ``model`` is a module with a ``.config`` (a :class:`TinyTransformer`)
    and return that :class:`ModelConfig`; ``name`` names the argument in the error."""
    _validate.module(name, model)
    config = getattr(model, "config", None)
    _validate.instance(f"{name}.config", config, ModelConfig, "a ModelConfig")
    return config  # type: ignore[return-value]


def _hits(
    model: nn.Module, length: int, lag: int, num_sequences: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Checked arguments; ``(hit, scored)`` on one seeded evaluation batch, ``(B, L)``."""
    config = model_config("model", model)
    _validate.positive_int("num_sequences", num_sequences)
    check_lag_task(num_sequences, length, lag, config.vocab_size)
    seed = _validate.integer("seed", seed, minimum=0)
    tokens, targets = lag_task(
        num_sequences,
        length,
        lag=lag,
        vocab_size=config.vocab_size,
        generator=torch.Generator().manual_seed(seed),  # one seeded batch
        device=next(model.parameters()).device,
    )
    was_training = model.training
    model.eval()
    predictions = model(tokens).argmax(dim=-1)  # (B, L)
    model.train(was_training)
    return predictions == targets, targets != IGNORE_INDEX


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

    The positions are pooled: for a causal model evaluated past its training length,
    :func:`position_accuracy` separates the positions it was trained on from the new
    ones.

    Args:
        model: a trained :class:`TinyTransformer` (any module with its ``.config``).
        length: evaluation length (may exceed the training length).
        lag: the task's lag.
        num_sequences: sequences to evaluate on.
        seed: seed of the evaluation batch (different from training seeds by default).

    Returns:
        The accuracy in ``[0, 1]``; chance is ``1 / vocab_size``.
    """
    hit, scored = _hits(model, length, lag, num_sequences, seed)
    return hit[scored].double().mean().item()


@torch.no_grad()
def position_accuracy(
    model: nn.Module,
    *,
    length: int,
    lag: int,
    num_sequences: int = 256,
    seed: int = 1234,
) -> torch.Tensor:
    """Accuracy at each position ``t``, over ``num_sequences`` sequences of the lag task.

    The evaluation batch is :func:`accuracy`'s (same ``seed``), so the mean over
    positions ``t >= lag`` is :func:`accuracy`. In a causal model the output at ``t``
    depends only on positions ``0..t``: *on the same tokens*, the accuracies at
    ``t < n`` do not depend on the evaluation length. This function draws a new batch
    for each ``length`` (the first ``n`` columns of a ``(B, 64)`` draw are not a
    ``(B, n)`` draw), so to compare positions across lengths evaluate once, at the
    longest length, and slice the result.

    Args:
        model: a trained :class:`TinyTransformer` (any module with its ``.config``).
        length: evaluation length ``L`` (may exceed the training length).
        lag: the task's lag.
        num_sequences: sequences to evaluate on.
        seed: seed of the evaluation batch.

    Returns:
        A float64 tensor of the accuracy at each position, ``nan`` at ``t < lag``
        (no answer there).

    Shape:
        - output: ``(L,)``
    """
    hit, scored = _hits(model, length, lag, num_sequences, seed)
    out = hit.double().mean(dim=0).cpu()  # (L,)
    out[~scored[0].cpu()] = math.nan
    return out


# Deprecated aliases, for one release: the training loops moved to companion.experiments.
__getattr__ = _deprecation.moved_names(
    __name__, dict.fromkeys(("TrainingRun", "train", "train_batched"), "experiments")
)
