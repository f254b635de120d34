r"""A tiny decoder-only Transformer built from the book's parts, and its training loops.

The capstone chapter ("A tiny Transformer") trains this model with each position scheme
of the book and measures what the earlier chapters claimed: does the scheme matter, and
does it extrapolate past the training length? Every part comes from ``companion``:

* attention: :class:`companion.attention.MultiHeadAttention`; the RoPE and ALiBi layers
  subclass it and override only its position step, :meth:`~companion.attention.MultiHeadAttention.attend`;
* positions: :func:`companion.positional.sinusoidal_encoding`, a learned table,
  :func:`companion.rope.apply_rope` on queries and keys, or
  :func:`companion.extension.alibi_bias` on the scores; or none at all;
* normalization: :class:`companion.norm.LayerNorm` or :class:`companion.norm.RMSNorm`,
  placed by :class:`companion.norm.PreLNBlock` or :class:`companion.norm.PostLNBlock`;
* the MLP: :func:`companion.norm.mlp`.

The task, :func:`lag_task`, asks the model to output at each position the token ``lag``
places back: the answer is defined at any length, and it can only be found by position.

:func:`train` is the plain training loop, one model at a time. :func:`train_batched`
trains several models of one configuration (one per seed, each at its own number of
steps if asked) as a single batched model with :func:`torch.func.stack_module_state` and
:func:`torch.vmap`: the same updates, computed together. :func:`accuracy` scores a
trained model over every position of a batch; :func:`position_accuracy` position by
position, so that positions inside and past the training length can be told apart.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn
from torch.nn import functional as F

from companion import _validate
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
    "TrainingRun",
    "accuracy",
    "lag_task",
    "parameter_count",
    "position_accuracy",
    "train",
    "train_batched",
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
    own. The position schemes that act inside attention subclass this and override only
    :meth:`~companion.attention.MultiHeadAttention.attend`.

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

    The only override is the position step: rotate ``q`` and ``k`` by
    :func:`companion.rope.apply_rope` (half layout, as Hugging Face LLaMA), then attend.
    The cos/sin table is computed from the input's length at each call, so the layer
    runs at any length.

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

    def attend(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        *,
        mask: torch.Tensor | None = None,
        is_causal: bool = False,
    ) -> torch.Tensor:
        L, S = query.shape[-2], key.shape[-2]
        freqs = self.rope_frequencies
        cos_q, sin_q = rope_cos_sin(torch.arange(S - L, S), freqs, dtype=query.dtype)
        cos_k, sin_k = rope_cos_sin(torch.arange(S), freqs, dtype=key.dtype)
        query = apply_rope(query, cos_q.to(query.device), sin_q.to(query.device))
        key = apply_rope(key, cos_k.to(key.device), sin_k.to(key.device))
        return super().attend(query, key, value, mask=mask, is_causal=is_causal)


class ALiBiSelfAttention(CausalSelfAttention):
    """Causal self-attention with ALiBi: the bias :math:`-m_h (i - j)` on the scores.

    The only override is the position step: :func:`companion.extension.alibi_bias`
    (causal mask included) becomes the additive mask of the attention. No parameters are
    added.

    Args:
        dim: model width ``D``.
        num_heads: heads ``H``.

    Shape:
        - input: ``(B, L, D)``
        - output: ``(B, L, D)``
    """

    def attend(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        *,
        mask: torch.Tensor | None = None,
        is_causal: bool = False,
    ) -> torch.Tensor:
        if mask is not None:
            raise ValueError(
                "mask must be None: ALiBiSelfAttention builds its own mask (the bias, "
                f"causal when is_causal=True), got {_validate.describe(mask)}"
            )
        L, S = query.shape[-2], key.shape[-2]
        bias = alibi_bias(
            self.num_heads,
            L,
            S,
            is_causal=is_causal,
            dtype=query.dtype,
            device=query.device,
        )  # (H, L, S), -inf above the diagonal when causal
        return super().attend(query, key, value, mask=bias)


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
    _task_sizes(batch_size, length, lag, vocab_size)
    if generator is not None:
        _validate.instance("generator", generator, torch.Generator, "a torch.Generator")
    device = _validate.device("device", device)
    tokens = torch.randint(vocab_size, (batch_size, length), generator=generator)
    targets = torch.full_like(tokens, IGNORE_INDEX)
    targets[:, lag:] = tokens[:, :-lag]
    return tokens.to(device), targets.to(device)


def _task_sizes(
    batch_size: object, length: object, lag: object, vocab_size: object
) -> None:
    _validate.positive_int("batch_size", batch_size)
    _validate.positive_int("length", length)
    _validate.positive_int("lag", lag)
    _validate.integer("vocab_size", vocab_size, minimum=2)
    if length <= lag:  # type: ignore[operator]
        raise ValueError(
            f"length must be greater than lag, got length={length}, lag={lag}"
        )


# ---- Training and evaluation ---------------------------------------------------------


@dataclass
class TrainingRun:
    """What :func:`train` returns: the loss at every step and the learning rate used."""

    losses: list[float] = field(default_factory=list)
    learning_rates: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in ("losses", "learning_rates"):
            value = getattr(self, name)
            if not isinstance(value, list):
                raise _validate._fail(TypeError, name, "a list of floats", value)
        if len(self.learning_rates) != len(self.losses):
            raise ValueError(
                f"learning_rates must hold one rate per loss ({len(self.losses)}), got "
                f"{len(self.learning_rates)}"
            )


def _trainable(name: str, model: object) -> ModelConfig:
    """A module with a ``.config`` (a :class:`TinyTransformer`); returns the config."""
    _validate.module(name, model)
    config = getattr(model, "config", None)
    _validate.instance(f"{name}.config", config, ModelConfig, "a ModelConfig")
    return config  # type: ignore[return-value]


def _schedule(
    steps: object, lr: object, warmup_steps: object, seed: object
) -> tuple[int, float, int]:
    steps = _validate.positive_int("steps", steps)
    lr = _validate.positive_real("lr", lr)
    warmup_steps = _validate.nonnegative_int("warmup_steps", warmup_steps)
    _validate.integer("seed", seed, minimum=0)
    return steps, lr, warmup_steps


SCHEDULES = ("constant", "cosine")


def _rate(lr: float, warmup_steps: int, step: int, steps: int, schedule: str) -> float:
    """Linear warm-up over ``warmup_steps``, then constant or a cosine decay to zero."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if schedule == "constant":
        return lr
    progress = (step - warmup_steps) / max(1, steps - warmup_steps)  # 0 .. 1
    return lr * 0.5 * (1.0 + math.cos(math.pi * progress))


def train(
    model: nn.Module,
    *,
    steps: int,
    batch_size: int,
    length: int,
    lag: int,
    lr: float = 3e-3,
    warmup_steps: int = 0,
    schedule: str = "constant",
    seed: int = 0,
) -> TrainingRun:
    """Train ``model`` on :func:`lag_task` with AdamW and a cross-entropy loss.

    The learning rate rises linearly over ``warmup_steps`` (none by default) and then
    stays constant (``schedule="constant"``, so a comparison with and without warm-up
    changes one thing only) or falls to zero along half a cosine (``"cosine"``).
    Batches come from a generator seeded with ``seed``; seed the model's initialization
    yourself (:func:`companion.environment.seed_everything`) before building it.

    Args:
        model: a :class:`TinyTransformer` (any module with its ``.config`` that maps
            ``(B, L)`` ids to logits).
        steps: optimization steps.
        batch_size: sequences per step.
        length: training length ``L_train``.
        lag: the task's lag.
        lr: peak learning rate.
        warmup_steps: linear warm-up steps (0 for none).
        schedule: ``"constant"`` or ``"cosine"`` after the warm-up.
        seed: seed of the batch generator, a non-negative int.

    Returns:
        A :class:`TrainingRun` with one loss per step.
    """
    config = _trainable("model", model)
    steps, lr, warmup_steps = _schedule(steps, lr, warmup_steps, seed)
    schedule = _validate.choice("schedule", schedule, SCHEDULES)
    _task_sizes(batch_size, length, lag, config.vocab_size)
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    run = TrainingRun()
    model.train()
    for step in range(steps):
        rate = _rate(lr, warmup_steps, step, steps, schedule)
        for group in optimizer.param_groups:
            group["lr"] = rate
        tokens, targets = lag_task(
            batch_size,
            length,
            lag=lag,
            vocab_size=config.vocab_size,
            generator=generator,
            device=device,
        )
        logits = model(tokens)  # (B, L, V)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())  # skips -100
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        run.losses.append(loss.item())
        run.learning_rates.append(rate)
    model.eval()
    return run


class _Logits(nn.Module):
    """Wraps a :class:`TinyTransformer` to call it without the value checks (vmap)."""

    def __init__(self, net: TinyTransformer) -> None:
        super().__init__()
        self.net = net

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.net._logits(input_ids)


def train_batched(
    models: Sequence[TinyTransformer],
    *,
    seeds: Sequence[int],
    steps: int | Sequence[int],
    batch_size: int,
    length: int,
    lag: int,
    lr: float = 3e-3,
    warmup_steps: int | Sequence[int] = 0,
    schedule: str = "constant",
    targets: Callable[[torch.Tensor], torch.Tensor] | None = None,
    progress: bool = False,
) -> list[TrainingRun]:
    """Train several models of one configuration at once, as one batched model.

    Equivalent to the following, computed together::

        [train(m, steps=n, warmup_steps=w, ..., seed=s)
         for m, s, n, w in zip(models, seeds, steps, warmup_steps)]

    The models' parameters are stacked along a new leading axis
    (:func:`torch.func.stack_module_state`), one forward pass is
    :func:`torch.vmap` of :func:`torch.func.functional_call` over that axis and over the
    models' own batches, and one AdamW update (``weight_decay=0``, as :func:`train`)
    steps all stacked tensors, each model at its own learning rate. AdamW acts element
    by element, so each model gets exactly its own update; the batched matrix products
    may round differently from one-at-a-time ones (last-bit differences). The trained
    weights are copied back into ``models``.

    ``steps`` and ``warmup_steps`` may differ between the models: a model with fewer
    steps follows its own schedule, compressed into its steps as :func:`train` would,
    and then leaves the batch (its parameters set aside, no longer computed; its run
    records its own steps). So one call trains, for example, the same seeds at two
    budgets.

    Args:
        models: :class:`TinyTransformer` s with equal configs, on one device, each built
            from its own seed.
        seeds: one batch-generator seed per model, as :func:`train`'s ``seed``.
        steps: optimization steps, one number for every model or one per model.
        batch_size: sequences per step and model.
        length: training length ``L_train``.
        lag: the task's lag.
        lr: peak learning rate.
        warmup_steps: linear warm-up steps (0 for none), one number or one per model.
        schedule: ``"constant"`` or ``"cosine"`` after the warm-up, as :func:`train`.
        targets: another task on the same tokens: a function from a ``(B, L)`` batch of
            token ids to its ``(B, L)`` integer targets (``-100`` where nothing is
            scored), used instead of the lag task's targets. ``None``: the lag task.
        progress: print the mean loss ten times during training (for interactive use).

    Returns:
        One :class:`TrainingRun` per model, in order.
    """
    if isinstance(models, nn.Module) or not isinstance(models, Sequence) or not models:
        raise _validate._fail(
            TypeError, "models", "a non-empty sequence of TinyTransformers", models
        )
    for i, m in enumerate(models):
        _validate.module(f"models[{i}]", m, TinyTransformer)
        if m.config != models[0].config:
            raise ValueError(
                f"models must share one config, got models[{i}].config={m.config} and "
                f"models[0].config={models[0].config}"
            )
        _validate.same_device(
            f"models[{i}]'s parameters",
            m.embed.weight,
            "models[0]'s parameters",
            models[0].embed.weight,
        )
    if len({id(m) for m in models}) != len(models):
        raise ValueError("models must be distinct modules, got the same module twice")
    if isinstance(seeds, (str, bytes)) or not isinstance(seeds, Sequence):
        raise _validate._fail(TypeError, "seeds", "a sequence of ints", seeds)
    if len(seeds) != len(models):
        raise ValueError(
            f"seeds must hold one seed per model ({len(models)}), "
            f"got {len(seeds)} seeds"
        )
    seeds = [
        _validate.integer(f"seeds[{i}]", s, minimum=0) for i, s in enumerate(seeds)
    ]
    step_counts = _per_model("steps", steps, len(models), _validate.positive_int)
    warmups = _per_model(
        "warmup_steps", warmup_steps, len(models), _validate.nonnegative_int
    )
    lr = _validate.positive_real("lr", lr)
    schedule = _validate.choice("schedule", schedule, SCHEDULES)
    config = models[0].config
    _task_sizes(batch_size, length, lag, config.vocab_size)
    if targets is not None:
        _validate.callable_("targets", targets)
    progress = _validate.flag("progress", progress)

    device = models[0].embed.weight.device
    base = _Logits(models[0])
    wrapped = [_Logits(m) for m in models]
    params, buffers = torch.func.stack_module_state(wrapped)  # name -> (M, ...)
    buffers = {name: b[0] for name, b in buffers.items()}  # equal in every model

    def loss_of(p: dict, tokens: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        logits = torch.func.functional_call(base, (p, buffers), (tokens,))  # (B, L, V)
        return F.cross_entropy(logits.flatten(0, 1), target.flatten())  # skips -100

    batched_loss = torch.vmap(loss_of)  # over the models' axis of p, tokens, targets
    generators = [torch.Generator().manual_seed(s) for s in seeds]
    moments = {
        name: (torch.zeros_like(p), torch.zeros_like(p)) for name, p in params.items()
    }
    runs = [TrainingRun() for _ in models]
    active = list(range(len(models)))  # the models still training, in stacked order
    trained: dict[int, dict[str, torch.Tensor]] = {}  # model -> its final parameters
    total = max(step_counts)
    every = max(1, total // 10)
    for step in range(total):
        if any(step_counts[i] == step for i in active):  # some models are done:
            keep = [k for k, i in enumerate(active) if step_counts[i] > step]
            for k, i in enumerate(active):  # set them aside, stop computing them
                if step_counts[i] == step:
                    trained[i] = {n: p[k].detach().clone() for n, p in params.items()}
            params = {n: p.detach()[keep].requires_grad_() for n, p in params.items()}
            moments = {n: (m[keep], v[keep]) for n, (m, v) in moments.items()}
            active = [active[k] for k in keep]
        rates = [_rate(lr, warmups[i], step, step_counts[i], schedule) for i in active]
        batches = [
            lag_task(
                batch_size,
                length,
                lag=lag,
                vocab_size=config.vocab_size,
                generator=generators[i],
            )
            for i in active
        ]
        tokens = torch.stack([t for t, _ in batches]).to(device)  # (M, B, L)
        if targets is None:
            target = torch.stack([y for _, y in batches]).to(device)  # (M, B, L)
        else:
            target = torch.stack([_task_targets(targets, t) for t in tokens])
        losses = batched_loss(params, tokens, target)  # (M,)
        # no shared parameter: each model gets its own gradient
        grads = torch.autograd.grad(losses.sum(), list(params.values()))
        _adamw_step(params, grads, moments, rates, step + 1)
        for i, value, rate in zip(active, losses.tolist(), rates, strict=True):
            runs[i].losses.append(value)
            runs[i].learning_rates.append(rate)
        if progress and ((step + 1) % every == 0 or step + 1 == total):
            print(f"step {step + 1:>5}/{total}: mean loss {losses.mean().item():.4f}")
    for k, i in enumerate(active):
        trained[i] = {n: p[k].detach() for n, p in params.items()}
    with torch.no_grad():
        for i, m in enumerate(wrapped):
            for name, p in m.named_parameters():
                p.copy_(trained[i][name])
    for m in models:
        m.eval()
    return runs


def _per_model(
    name: str, value: object, count: int, check: Callable[[str, object], int]
) -> list[int]:
    """One checked value per model: ``value`` itself, or its items (one per model)."""
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        if len(value) != count:
            raise ValueError(
                f"{name} must be one number or one per model ({count}), "
                f"got {len(value)} values"
            )
        return [check(f"{name}[{i}]", v) for i, v in enumerate(value)]
    return [check(name, value)] * count


def _task_targets(
    targets: Callable[[torch.Tensor], torch.Tensor], tokens: torch.Tensor
) -> torch.Tensor:
    """``targets(tokens)``, checked to be integer targets of the tokens' shape."""
    out = _validate.tensor("targets(tokens)", targets(tokens), dtype="integer")
    _validate.shape("targets(tokens)", out, tokens.shape, "of the tokens")
    return out.long()


_BETAS, _EPS = (0.9, 0.999), 1e-8  # torch.optim.AdamW's defaults


@torch.no_grad()
def _adamw_step(
    params: dict[str, torch.Tensor],
    grads: Sequence[torch.Tensor],
    moments: dict[str, tuple[torch.Tensor, torch.Tensor]],
    rates: list[float],
    step: int,
) -> None:
    """One AdamW step (``weight_decay=0``) on stacked parameters, model ``i`` at
    ``rates[i]``: torch.optim.AdamW's arithmetic, with a learning rate per model."""
    beta1, beta2 = _BETAS
    bias_correction1 = 1 - beta1**step
    bias_correction2_sqrt = (1 - beta2**step) ** 0.5
    first = next(iter(params.values()))
    step_size = torch.tensor(
        [r / bias_correction1 for r in rates], dtype=first.dtype, device=first.device
    )  # (M,)
    for (name, p), g in zip(params.items(), grads, strict=True):
        exp_avg, exp_avg_sq = moments[name]
        exp_avg.lerp_(g, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(_EPS)
        size = step_size.view(-1, *([1] * (p.ndim - 1)))  # (M, 1, ...)
        p.sub_(size * exp_avg / denom)


def _hits(
    model: nn.Module, length: int, lag: int, num_sequences: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Checked arguments; ``(hit, scored)`` on one seeded evaluation batch, ``(B, L)``."""
    config = _trainable("model", model)
    _validate.positive_int("num_sequences", num_sequences)
    _task_sizes(num_sequences, length, lag, config.vocab_size)
    seed = _validate.integer("seed", seed, minimum=0)
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    tokens, targets = lag_task(
        num_sequences,
        length,
        lag=lag,
        vocab_size=config.vocab_size,
        generator=generator,
        device=device,
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
    depends only on positions ``0..t``: the accuracies at ``t < n`` are the same at
    every evaluation length ``>= n``, and one evaluation at the longest length gives
    every shorter one.

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
