r"""Checkers for chapter 06 (:ref:`ch-normalization`): LayerNorm, RMSNorm, BatchNorm."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F

from companion import norm
from companion.checks._core import Case, Mistake, checker, known_mistake

__all__ = [
    "check_batch_norm",
    "check_layer_norm",
    "check_residual_blocks",
    "check_rms_norm",
    "check_variance",
]


def _norm_rows(
    x: torch.Tensor,
    dim: int,
    *,
    correction: int = 0,
    eps: float,
    eps_outside: bool = False,
) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) over ``dim``; / (std + eps) if ``eps_outside``."""
    var, mean = torch.var_mean(x, dim=dim, correction=correction, keepdim=True)
    if eps_outside:
        return (x - mean) / (var.sqrt() + eps)
    return (x - mean) / torch.sqrt(var + eps)


_eps_outside = known_mistake(
    "eps outside the square root",
    "compute (x - mean) / sqrt(var + eps), not (x - mean) / (std + eps).",
)
_no_gain = known_mistake(
    "forgetting the gain", "multiply the normalized x by weight before adding bias."
)


@checker
def check_layer_norm(layer_norm: Callable[..., torch.Tensor]) -> Iterator[Case]:
    r"""Check a learner's ``layer_norm(x, weight, bias, eps)`` over the last dim.

    The reference is :func:`companion.norm.layer_norm` (equal to
    :func:`torch.nn.functional.layer_norm`). Named mistakes: "unbiased variance", "eps
    outside the square root", "unbiased std with eps outside the square root (the
    Annotated Transformer's LayerNorm)", "normalizing over the batch axis", "forgetting
    the gain", "forgetting the bias", and, on rows with a large mean (``1e4`` + noise in
    float32, compared with a float64 computation of the same numbers to ``1e-2``),
    "E[x^2] - E[x]^2 (catastrophic cancellation)".

    Args:
        layer_norm: a function ``layer_norm(x, weight, bias, eps) -> Tensor``.
    """
    gen = torch.Generator().manual_seed(0)
    cases = [
        (
            "matches the definition on small-variance (B, D) rows, where eps matters",
            1e-2 * torch.randn(3, 8, generator=gen),
        ),
        (
            "matches the definition on (B, D) rows",
            2 * torch.randn(4, 6, generator=gen) + 1,
        ),
        (
            "normalizes each token of (B, L, D) over D only",
            torch.randn(2, 3, 5, generator=gen),
        ),
        (
            "stays accurate for rows with a large mean (x = 1e4 + noise, float32)",
            1e4 + torch.randn(4, 64, generator=gen),
        ),
    ]
    eps = 1e-5
    for prop, x in cases:
        d = x.shape[-1]
        weight = 1 + 0.5 * torch.randn(d, generator=gen)
        bias = 0.5 * torch.randn(d, generator=gen)
        large_mean = x.mean().abs() > 100
        mean = x.mean(-1, keepdim=True)
        naive_var = x.square().mean(-1, keepdim=True) - mean.square()  # may be < 0
        mistakes = [
            Mistake(
                "E[x^2] - E[x]^2 (catastrophic cancellation)",
                "for a large mean both terms are huge and nearly equal, and float32 "
                "keeps ~7 digits, so the variance comes out as a multiple of float32's "
                "step at 1e8 (zero or negative included): subtract the mean first, "
                "then average the squares, or use torch.var_mean(x, -1, correction=0).",
                (x - mean) / torch.sqrt(naive_var + eps) * weight + bias,
            ),
            Mistake(
                "unbiased variance",
                "LayerNorm divides by D, not D - 1: use x.var(dim=-1, unbiased=False) "
                "(torch's Tensor.std/var default is unbiased).",
                _norm_rows(x, -1, correction=1, eps=eps) * weight + bias,
            ),
            _eps_outside(_norm_rows(x, -1, eps=eps, eps_outside=True) * weight + bias),
            Mistake(
                "unbiased std with eps outside the square root (the Annotated "
                "Transformer's LayerNorm)",
                "a_2 * (x - mean) / (x.std(-1) + eps) + b_2 uses the unbiased std and "
                "adds eps to it; use the biased variance and sqrt(var + eps).",
                _norm_rows(x, -1, correction=1, eps=eps, eps_outside=True) * weight
                + bias,
            ),
            Mistake(
                "normalizing over the batch axis",
                "that is BatchNorm's axis: LayerNorm takes the mean and variance of "
                "each token over its features (dim=-1), not over dim=0.",
                _norm_rows(x, 0, eps=eps) * weight + bias,
            ),
            _no_gain(_norm_rows(x, -1, eps=eps) + bias),
            Mistake(
                "forgetting the bias",
                "add bias after multiplying by weight.",
                _norm_rows(x, -1, eps=eps) * weight,
            ),
        ]
        reference = norm.layer_norm(  # float64 from the same float32 numbers
            x.double(), d, weight.double(), bias.double(), eps=eps
        ).to(x.dtype)
        yield Case(
            prop,
            {"x": x, "weight": weight, "bias": bias, "eps": eps},
            reference,
            mistakes,
            # float32 rounds the mean of numbers near 1e4 to ~1e-3: any correct
            # float32 answer is within 3e-3 there; the cancellation misses by far more
            **({"atol": 1e-2, "rtol": 1e-2} if large_mean else {}),
        )


@checker
def check_rms_norm(rms_norm: Callable[..., torch.Tensor]) -> Iterator[Case]:
    r"""Check a learner's ``rms_norm(x, weight, eps)`` over the last dim.

    The reference is :func:`torch.nn.functional.rms_norm`. Named mistakes: "subtracting
    the mean" (that is LayerNorm), "eps outside the square root", "forgetting the gain",
    "sum of squares instead of the mean".

    Args:
        rms_norm: a function ``rms_norm(x, weight, eps) -> Tensor``.
    """
    gen = torch.Generator().manual_seed(1)
    cases = [
        (
            "matches the definition x / rms(x) * weight",
            torch.randn(4, 6, generator=gen) + 1,
            1e-6,
        ),
        (
            "eps inside the square root (small inputs)",
            3e-3 * torch.randn(2, 3, 8, generator=gen),
            1e-5,
        ),
    ]
    for prop, x, eps in cases:
        d = x.shape[-1]
        weight = 1 + 0.5 * torch.randn(d, generator=gen)
        ms = x.square().mean(-1, keepdim=True)
        mistakes = [
            Mistake(
                "subtracting the mean",
                "that is LayerNorm: RMSNorm divides x itself by sqrt(mean(x^2) + eps).",
                _norm_rows(x, -1, eps=eps) * weight,
            ),
            Mistake(
                "eps outside the square root",
                "compute x / sqrt(mean(x^2) + eps), not x / (sqrt(mean(x^2)) + eps).",
                x / (ms.sqrt() + eps) * weight,
            ),
            Mistake(
                "forgetting the gain",
                "multiply the normalized x by weight.",
                x * torch.rsqrt(ms + eps),
            ),
            Mistake(
                "sum of squares instead of the mean",
                "divide the sum of squares by D (use .mean(-1), not .sum(-1)).",
                x * torch.rsqrt(x.square().sum(-1, keepdim=True) + eps) * weight,
            ),
        ]
        yield Case(
            prop,
            {"x": x, "weight": weight, "eps": eps},
            F.rms_norm(x, (d,), weight, eps=eps),
            mistakes,
        )


@checker
def check_batch_norm(batch_norm: Callable[..., object]) -> Iterator[Case]:
    r"""Check a learner's training-mode ``batch_norm`` on ``(B, D)`` input.

    The learner's function is called as ``batch_norm(x, running_mean, running_var,
    weight, bias, momentum, eps)`` and returns ``(y, new_running_mean,
    new_running_var)`` (a tuple or a list; updating the running statistics in place and
    returning them is fine). The reference is :func:`torch.nn.functional.batch_norm`
    with ``training=True``. Named mistakes: "unbiased variance" (to normalize), "eps
    outside the square root", "normalizing over the feature axis" (that is LayerNorm),
    "forgetting the gain", "biased variance in the running estimate", "momentum the
    wrong way round".

    Args:
        batch_norm: the learner's function, see above.
    """
    gen = torch.Generator().manual_seed(2)
    cases = [
        (
            "training mode on (B, D)",
            2 * torch.randn(5, 4, generator=gen) + 3,
            1e-5,
            0.1,
        ),
        (
            "eps inside the square root (small-variance features)",
            1e-2 * torch.randn(6, 3, generator=gen),
            1e-5,
            0.3,
        ),
    ]
    for prop, x, eps, momentum in cases:
        n, d = x.shape
        weight = 1 + 0.5 * torch.randn(d, generator=gen)
        bias = 0.5 * torch.randn(d, generator=gen)
        rm0 = torch.randn(d, generator=gen)
        rv0 = 1 + torch.rand(d, generator=gen)
        rm, rv = rm0.clone(), rv0.clone()
        y = F.batch_norm(
            x, rm, rv, weight, bias, training=True, momentum=momentum, eps=eps
        )
        var_b, mean_b = torch.var_mean(x, dim=0, correction=0)
        swapped = "momentum the wrong way round"
        mistakes = [
            Mistake(
                "unbiased variance",
                "normalize with the biased batch variance (divide by B); the unbiased "
                "one only enters running_var.",
                (_norm_rows(x, 0, correction=1, eps=eps) * weight + bias, None, None),
            ),
            _eps_outside(
                (
                    _norm_rows(x, 0, eps=eps, eps_outside=True) * weight + bias,
                    None,
                    None,
                )
            ),
            Mistake(
                "normalizing over the feature axis",
                "that is LayerNorm: BatchNorm takes statistics per feature over the "
                "batch (dim=0).",
                (_norm_rows(x, -1, eps=eps) * weight + bias, None, None),
            ),
            _no_gain((_norm_rows(x, 0, eps=eps) + bias, None, None)),
            Mistake(
                swapped,
                "torch's momentum weighs the NEW batch: r = (1 - momentum) * r + "
                "momentum * batch_mean.",
                (None, momentum * rm0 + (1 - momentum) * mean_b, None),
            ),
            Mistake(
                "biased variance in the running estimate",
                "running_var tracks the unbiased variance: multiply the batch variance "
                "by B / (B - 1) before the update.",
                (None, None, (1 - momentum) * rv0 + momentum * var_b),
            ),
            Mistake(
                swapped,
                "r = (1 - momentum) * r + momentum * batch_var_unbiased.",
                (None, None, momentum * rv0 + (1 - momentum) * var_b * n / (n - 1)),
            ),
        ]
        inputs = {
            "x": x,
            "running_mean": rm0,
            "running_var": rv0,
            "weight": weight,
            "bias": bias,
            "momentum": momentum,
            "eps": eps,
        }
        yield Case(
            prop,
            inputs,
            (y, rm, rv),
            mistakes,
            parts=("y", "running_mean", "running_var"),
        )


@checker
def check_variance(variance: Callable[..., torch.Tensor]) -> Iterator[Case]:
    r"""Check a learner's numerically stable biased ``variance(x, dim)``.

    The reference is a float64 two-pass variance of the same float32 numbers. Named
    mistakes: "E[x^2] - E[x]^2 (catastrophic cancellation)" (for a large mean),
    "unbiased variance".

    Args:
        variance: a function ``variance(x, dim) -> Tensor`` returning the biased
            variance along ``dim`` (dim removed).
    """
    gen = torch.Generator().manual_seed(3)
    cases = [
        ("biased variance along dim", torch.randn(4, 16, generator=gen), -1),
        ("along dim=0", torch.randn(16, 3, generator=gen), 0),
        (
            "stable for a large mean (x = 1e4 + noise, float32)",
            1e4 + torch.randn(4, 256, generator=gen),
            -1,
        ),
    ]
    for prop, x, dim in cases:
        x64 = x.double()
        mistakes = [
            Mistake(
                "E[x^2] - E[x]^2 (catastrophic cancellation)",
                "for a large mean both terms are huge and nearly equal, and float32 "
                "keeps ~7 digits: subtract the mean first, then average the squares "
                "(two passes), or use torch.var_mean(x, dim, correction=0).",
                x.square().mean(dim) - x.mean(dim).square(),
            ),
            Mistake(
                "unbiased variance",
                "divide by n, not n - 1 (correction=0).",
                x64.var(dim=dim, correction=1).to(x.dtype),
            ),
        ]
        yield Case(
            prop,
            {"x": x, "dim": dim},
            x64.var(dim=dim, correction=0).to(x.dtype),
            mistakes,
            atol=1e-3,
            rtol=1e-3,
        )


@checker
def check_residual_blocks(
    pre_ln: Callable[..., torch.Tensor], post_ln: Callable[..., torch.Tensor]
) -> Iterator[Case]:
    r"""Check a learner's ``pre_ln(x, sublayer, norm)``, ``post_ln(x, sublayer, norm)``.

    Pre-LN is :math:`x + F(\mathrm{Norm}(x))`, Post-LN is :math:`\mathrm{Norm}(x +
    F(x))`. Named mistakes: "Post-LN order", "Pre-LN order", "no residual", "residual
    added to the normalized input", "normalized the sublayer output only".

    Args:
        pre_ln: the learner's Pre-LN block as a function.
        post_ln: the learner's Post-LN block as a function.
    """
    gen = torch.Generator().manual_seed(4)
    d = 6
    x = 3 * torch.randn(2, 4, d, generator=gen) + 1
    w = torch.randn(d, d, generator=gen) / d**0.5

    def sublayer(t: torch.Tensor) -> torch.Tensor:
        return torch.tanh(t @ w)

    def norm(t: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(t, (d,))

    pre, post = x + sublayer(norm(x)), norm(x + sublayer(x))
    inputs = {"x": x, "sublayer": sublayer, "norm": norm}
    yield Case(
        "Pre-LN: x + sublayer(norm(x))",
        inputs,
        pre,
        [
            Mistake("Post-LN order", "Pre-LN normalizes the sublayer's INPUT.", post),
            Mistake(
                "no residual", "add x back: x + sublayer(norm(x)).", sublayer(norm(x))
            ),
            Mistake(
                "residual added to the normalized input",
                "the residual stream carries x itself, not norm(x).",
                norm(x) + sublayer(norm(x)),
            ),
        ],
        learner="pre_ln",
    )
    yield Case(
        "Post-LN: norm(x + sublayer(x))",
        inputs,
        post,
        [
            Mistake("Pre-LN order", "Post-LN normalizes the SUM x + sublayer(x).", pre),
            Mistake("no residual", "normalize x + sublayer(x).", norm(sublayer(x))),
            Mistake(
                "normalized the sublayer output only",
                "the norm applies to the sum, not to sublayer(x) alone.",
                x + norm(sublayer(x)),
            ),
        ],
        learner="post_ln",
    )
