r"""Training stability and what trained attention reads: chapter :ref:`ch-modern`'s runs.

Chapter 9 trains the tiny RoPE model of chapter 7 (:data:`MODERN_SIZES`, on the lag
task :data:`MODERN_TASK`) with plain attention, QK-norm and soft-capping
(:class:`companion.modern.ModernTinyTransformer`), at a learning rate where the plain
model fails (:data:`STABILITY_RUNS`, :func:`stability_runs`), and reads the trained
models:

* :func:`measure_stability`: losses, spikes, accuracy, the largest scaled logit
  :math:`\max |q \cdot k| / \sqrt{D}`, the rows that went one-hot, the QK-norm bound
  :math:`\sqrt{D}\,\max_i|g_{q,i}|\,\max_i|g_{k,i}|`
  (:func:`companion.modern.qk_norm_logit_bound`) and, with a cap :math:`c`, the scores
  within 1% of it and those where the cap's slope :math:`1 - \tanh^2(s/c)` rounds to 0;
* :func:`first_attention_step`: AdamW's first step on :math:`W_Q` and :math:`W_K`;
* :func:`lag_weight` and :func:`first_token_mass`: the attention weight
  :math:`\bar a_{t, t-k}` on the key the task asks for and :math:`\bar a_{t, 0}` on the
  first token (a sink's signature), each averaged over the probe's sequences
  (:func:`modern_probe`) and its queries; an even spread would put
  :math:`\frac{1}{L - t_0} \sum_{t=t_0}^{L-1} \frac{1}{t + 1}` on the first token
  (:func:`uniform_first_token_share`).

Every model is built and trained by :mod:`companion.experiments`
(:func:`~companion.experiments.run_seeds`), so the numeric variants of ``make claims``
act on it; the chapter and ``tests/test_modern_claims.py`` call these functions, so the
claims the harness checks are the chapter's own.

Shape:
    - :func:`lag_weight`, :func:`first_token_mass`: ``(models, layers, H)``
    - :class:`StabilityMeasures`: ``(seeds,)`` or ``(seeds, layers)`` per field
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from companion import _validate, experiments
from companion.experiments import SeedRuns
from companion.model import (
    CausalSelfAttention,
    ModelConfig,
    TinyTransformer,
    accuracy,
    lag_task,
)
from companion.modern import (
    ModernTinyTransformer,
    QKNormSelfAttention,
    SoftcapSelfAttention,
    attention_maps,
    qk_norm_logit_bound,
)

__all__ = [
    "MODERN_SIZES",
    "MODERN_TASK",
    "STABILITY_CAP",
    "STABILITY_RUNS",
    "STABILITY_STEPS",
    "StabilityMeasures",
    "first_attention_step",
    "first_token_mass",
    "lag_weight",
    "measure_stability",
    "modern_probe",
    "stability_runs",
    "uniform_first_token_share",
]


MODERN_SIZES = ModelConfig(vocab_size=16, dim=32, num_heads=4, num_layers=2)
"""Chapter 9's tiny model — width 32, four heads of width 8, two layers, RoPE."""

MODERN_TASK: dict[str, int] = {"batch_size": 32, "length": 16, "lag": 2}
"""Chapter 9's lag task — 32 sequences of 16 tokens a step, output the token two back."""

STABILITY_RUNS: dict[str, tuple[str, float]] = {
    "plain, lr 0.03": ("rope", 0.03),
    "plain, lr 0.3": ("rope", 0.3),
    "QK-norm, lr 0.3": ("qk_norm", 0.3),
    "soft-cap 5, lr 0.3": ("softcap", 0.3),
}
"""Chapter 9's stability runs — label -> (attention of
:class:`~companion.modern.ModernTinyTransformer`, AdamW learning rate)."""

STABILITY_STEPS = 150
"""Chapter 9's stability runs — optimization steps of every run."""

STABILITY_CAP = 5.0
"""Chapter 9's stability runs — the soft-cap of the ``"softcap"`` runs (Gemma 2's is 50;
this one the tiny model's logits reach)."""


def stability_runs(
    seed_list: Sequence[int],
    *,
    steps: int = STABILITY_STEPS,
    cap: float = STABILITY_CAP,
    labels: Sequence[str] | None = None,
) -> dict[str, SeedRuns]:
    """Chapter 9's stability runs: each of :data:`STABILITY_RUNS` over ``seed_list``.

    Equivalent to the following, for each label::

        experiments.run_seeds(
            lambda: ModernTinyTransformer(MODERN_SIZES, attention=kind, cap=cap),
            seed_list, steps=steps, lr=lr, **MODERN_TASK,
        )

    AdamW without weight decay at a constant learning rate, no warm-up
    (:func:`~companion.experiments.train`).

    Args:
        seed_list: the seeds (e.g. ``seeds(6)``).
        steps: optimization steps of every run.
        cap: the soft-cap of the ``"softcap"`` runs.
        labels: which of :data:`STABILITY_RUNS` to run (``None``: all, in order).

    Returns:
        label -> :class:`~companion.experiments.SeedRuns`.
    """
    steps = _validate.positive_int("steps", steps)
    cap = _validate.positive_real("cap", cap)
    if labels is None:
        labels = tuple(STABILITY_RUNS)
    if isinstance(labels, (str, bytes)) or not isinstance(labels, Sequence):
        raise _validate.fail(TypeError, "labels", "a sequence of run labels", labels)
    chosen = [_validate.choice("labels", label, STABILITY_RUNS) for label in labels]
    runs = {}
    for label in chosen:
        kind, lr = STABILITY_RUNS[label]
        runs[label] = experiments.run_seeds(
            lambda kind=kind: ModernTinyTransformer(
                MODERN_SIZES, attention=kind, cap=cap
            ),
            seed_list,
            steps=steps,
            lr=lr,
            **MODERN_TASK,
        )
    return runs


def modern_probe(num_sequences: int = 64) -> torch.Tensor:
    """The batch on which chapter 9 reads trained models' attention: ``num_sequences`` of
    :data:`MODERN_TASK`'s length from :func:`~companion.model.lag_task`, generator seed
    1234 (no training seed), the same under every variant.

    Shape:
        output: ``(num_sequences, 16)`` token ids.
    """
    num_sequences = _validate.positive_int("num_sequences", num_sequences)
    generator = torch.Generator().manual_seed(1234)
    return lag_task(
        num_sequences,
        MODERN_TASK["length"],
        lag=MODERN_TASK["lag"],
        vocab_size=MODERN_SIZES.vocab_size,
        generator=generator,
    )[0]


@dataclass
class StabilityMeasures:
    """What :func:`measure_stability` reads from one configuration's trained models,
    one entry per seed (``(seeds,)``) or per seed and layer (``(seeds, layers)``).

    Attributes:
        final: mean training loss over the last 20 steps, ``(seeds,)``.
        lowest: the lowest mean training loss over 20 consecutive steps, ``(seeds,)``
            (a run that trained and then spiked near its end keeps it low).
        accuracy: :func:`~companion.model.accuracy` on the lag task, ``(seeds,)``.
        largest_logit: the largest ``|score|`` the attention sees (scaled by
            ``1/sqrt(D)``, after the cap where there is one) on the probe, ``(seeds,)``.
        raw_logit: the same before the cap (the soft-capped model's weights run without
            it); equal to ``largest_logit`` where there is no cap, ``(seeds,)``.
        one_hot: the fraction of the probe's attention rows (every layer, head and
            sequence, queries ``t >= 1``; query 0 sees one key) whose largest weight
            passes 0.99, ``(seeds,)``.
        spike: the largest training loss of a step after the first step whose loss is
            below 0.01 (a trained run's spikes), ``(seeds,)``; NaN where no step gets
            below 0.01.
        saturated: the fraction of the causal scores within 1% of the cap, ``(seeds,)``;
            NaN without a cap.
        zero_slope: the fraction of the causal scores where the cap's slope
            ``1 - tanh^2(s / cap)`` is exactly zero in the model's dtype (``tanh``
            rounded to ``+-1``: no gradient passes), ``(seeds,)``; NaN without a cap.
        bound: :func:`~companion.modern.qk_norm_logit_bound` of each layer's trained
            gains, ``(seeds, layers)``; NaN without QK-norm.
        layer_logit: the largest ``|score|`` of each layer, ``(seeds, layers)``.
        gain: the largest ``|gain|`` of each layer's query and key norms,
            ``(seeds, layers)``; NaN without QK-norm.
    """

    final: torch.Tensor
    lowest: torch.Tensor
    accuracy: torch.Tensor
    largest_logit: torch.Tensor
    raw_logit: torch.Tensor
    one_hot: torch.Tensor
    spike: torch.Tensor
    saturated: torch.Tensor
    zero_slope: torch.Tensor
    bound: torch.Tensor
    layer_logit: torch.Tensor
    gain: torch.Tensor

    def __post_init__(self) -> None:
        _validate.per_seed(self, "final", max_ndim=2)


@torch.no_grad()
def measure_stability(
    runs: SeedRuns, probe: torch.Tensor | None = None
) -> StabilityMeasures:
    """Read the final and lowest loss, the spikes, accuracy, logits, one-hot rows,
    QK-norm bounds and saturation of the trained models of one of
    :func:`stability_runs`' configurations.

    Args:
        runs: one configuration's :class:`~companion.experiments.SeedRuns`.
        probe: token ids to read the attention on (``None``: :func:`modern_probe`).

    Returns:
        A :class:`StabilityMeasures`.
    """
    _validate.instance("runs", runs, SeedRuns, "a SeedRuns")
    probe = modern_probe() if probe is None else probe
    _validate.tensor("probe", probe, dtype="integer", ndim=2, meaning="(B, L)")
    nan = float("nan")
    rows: dict[str, list] = {k: [] for k in StabilityMeasures.__dataclass_fields__}
    for net, curve in zip(runs.models, runs.losses, strict=True):
        _validate.module("runs.models[i]", net, ModernTinyTransformer)
        device = next(net.parameters()).device
        ids = probe.to(device)
        scores = attention_maps(net, ids, scores=True)  # (layers, B, H, L, L)
        finite = [s[s.isfinite()].abs() for s in scores]  # per layer
        top_weight = scores[..., 1:, :].softmax(-1).amax(-1)  # (layers, B, H, L - 1)
        rows["one_hot"].append(top_weight.gt(0.99).double().mean().item())
        low = [i for i, loss in enumerate(curve) if loss < 0.01]
        rows["spike"].append(max(curve[low[0] :]) if low else nan)
        layers = [m for m in net.modules() if isinstance(m, SoftcapSelfAttention)]
        if layers:  # the same weights without the cap
            plain = ModernTinyTransformer(net.config, attention="rope").to(device)
            plain.load_state_dict(net.state_dict())
            raw = attention_maps(plain, ids, scores=True)
            raw_top = raw[raw.isfinite()].abs().max().item()
            cap = layers[0].cap
            saturated = torch.cat(finite).gt(0.99 * cap).double().mean().item()
            tanh = torch.tanh(raw[raw.isfinite()] / cap)  # as softcap computes it
            zero_slope = (1 - tanh * tanh).eq(0).double().mean().item()
        else:
            raw_top = torch.cat(finite).max().item()
            saturated = zero_slope = nan
        qk = [m for m in net.modules() if isinstance(m, QKNormSelfAttention)]
        rows["bound"].append(
            [qk_norm_logit_bound(m.q_norm.weight, m.k_norm.weight) for m in qk]
            or [nan] * len(finite)
        )
        rows["gain"].append(
            [
                torch.cat([m.q_norm.weight, m.k_norm.weight]).abs().max().item()
                for m in qk
            ]
            or [nan] * len(finite)
        )
        rows["final"].append(sum(curve[-20:]) / len(curve[-20:]))
        window = min(20, len(curve))
        rows["lowest"].append(
            torch.tensor(curve, dtype=torch.float64)
            .unfold(0, window, 1)
            .mean(-1)
            .min()
            .item()
        )
        rows["accuracy"].append(
            accuracy(net, length=MODERN_TASK["length"], lag=MODERN_TASK["lag"])
        )
        rows["largest_logit"].append(torch.cat(finite).max().item())
        rows["raw_logit"].append(raw_top)
        rows["saturated"].append(saturated)
        rows["zero_slope"].append(zero_slope)
        rows["layer_logit"].append([f.max().item() for f in finite])
    return StabilityMeasures(
        **{k: torch.tensor(v, dtype=torch.float64) for k, v in rows.items()}
    )


@torch.no_grad()
def _mean_weight(
    models: object,
    probe: object,
    name: str,
    first: object,
    check: Callable[[str, object], int],
    pick: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """What :func:`lag_weight` and :func:`first_token_mass` share: check the models, the
    probe (``None``: :func:`modern_probe`) and the first query ``first`` (by ``check``,
    and less than the probe's length), then, for each model, the weights ``pick`` reads
    from the rows of the queries ``t >= first``, averaged over the probe's sequences and
    those queries: float64 ``(models, layers, H)``."""
    if isinstance(models, nn.Module) or not isinstance(models, Sequence) or not models:
        raise _validate.fail(
            TypeError, "models", "a non-empty sequence of trained models", models
        )
    probe = modern_probe() if probe is None else probe
    _validate.tensor("probe", probe, dtype="integer", ndim=2, meaning="(B, L)")
    first = check(name, first)
    if first >= probe.shape[1]:
        raise ValueError(
            f"{name} must be less than the probe's length ({probe.shape[1]}), "
            f"got {first}"
        )
    out = []
    for i, net in enumerate(models):
        _validate.module(f"models[{i}]", net, TinyTransformer)
        rows = attention_maps(net, probe)[
            ..., first:, :
        ]  # (layers, B, H, L - first, L)
        out.append(pick(rows).mean(dim=(1, 3)).double())  # (layers, H)
    return torch.stack(out)


def lag_weight(
    models: Sequence[nn.Module],
    probe: torch.Tensor | None = None,
    *,
    lag: int = MODERN_TASK["lag"],
) -> torch.Tensor:
    """The attention weight trained tiny models put on the key ``lag`` places back (the
    lag task's answer): for each model, layer and head, averaged over the probe's
    sequences and its queries ``t >= lag``.

    Args:
        models: trained :class:`~companion.model.TinyTransformer` s.
        probe: token ids (``None``: :func:`modern_probe`).
        lag: how far back the key sits.

    Returns:
        float64 ``(models, layers, heads)``.
    """
    return _mean_weight(  # query t's weight on key t - lag: the rows' diagonal
        models,
        probe,
        "lag",
        lag,
        _validate.positive_int,
        lambda rows: rows.diagonal(dim1=-2, dim2=-1),  # (layers, B, H, L - lag)
    )


def first_attention_step(
    seed_list: Sequence[int],
    *,
    lr: float = STABILITY_RUNS["plain, lr 0.3"][1],
    device: torch.device | str | None = None,
) -> dict[str, torch.Tensor]:
    """AdamW's first step on ``W_Q`` and ``W_K`` of every layer of chapter 9's plain
    model, measured: the stability runs' first step
    (:func:`~companion.experiments.train_batched`, one step of :data:`MODERN_TASK` from
    the seed), taken on a model built as they build it.

    Args:
        seed_list: the seeds.
        lr: AdamW's learning rate (the failing plain run's, 0.3).
        device: where to compute.

    Returns:
        ``"initial"``: the weights before the step and ``"step"``: ``|after - before|``,
        each float64 ``(seeds, layers, 2, dim, dim)`` (index 0 of the third axis is
        ``W_Q``, 1 is ``W_K``).
    """
    seed_list = experiments.distinct_seeds("seed_list", seed_list)
    lr = _validate.positive_real("lr", lr)
    initial, step = [], []
    for seed in seed_list:
        net = experiments.build(
            lambda: ModernTinyTransformer(MODERN_SIZES, attention="rope"),
            seed,
            device=device,
        )
        layers = [m for m in net.modules() if isinstance(m, CausalSelfAttention)]

        def weights(layers: list = layers) -> torch.Tensor:
            pairs = [torch.stack([m.q_proj.weight, m.k_proj.weight]) for m in layers]
            return torch.stack(pairs).detach().double()  # (layers, 2, dim, dim)

        before = weights()
        experiments.train_batched([net], seeds=[seed], steps=1, lr=lr, **MODERN_TASK)
        initial.append(before)
        step.append((weights() - before).abs())
    return {"initial": torch.stack(initial), "step": torch.stack(step)}


def uniform_first_token_share(length: int = 16, *, start: int = 4) -> float:
    r"""The weight an even spread puts on the first token, averaged over queries
    ``t = start .. length - 1``: the mean of :math:`1/(t + 1)`."""
    length = _validate.positive_int("length", length)
    start = _validate.nonnegative_int("start", start)
    if start >= length:
        raise ValueError(f"start must be less than length ({length}), got {start}")
    return (1 / (torch.arange(start, length, dtype=torch.float64) + 1)).mean().item()


@torch.no_grad()
def first_token_mass(
    models: Sequence[nn.Module], probe: torch.Tensor | None = None, *, start: int = 4
) -> torch.Tensor:
    """The attention weight trained tiny models put on the first token (a sink's
    signature): for each model, layer and head, averaged over the probe's sequences and
    its queries at ``t >= start``.

    Args:
        models: trained :class:`~companion.model.TinyTransformer` s (e.g. a
            :class:`~companion.experiments.SeedRuns`' ``models``).
        probe: token ids (``None``: :func:`modern_probe`).
        start: the first query counted (the first queries have few keys to choose from).

    Returns:
        float64 ``(models, layers, heads)``; compare with
        :func:`uniform_first_token_share`.
    """
    return _mean_weight(  # query t's weight on key 0: the rows' first column
        models,
        probe,
        "start",
        start,
        _validate.nonnegative_int,
        lambda rows: rows[..., 0],  # (layers, B, H, L - start)
    )
