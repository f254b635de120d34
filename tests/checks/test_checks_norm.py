"""Chapter 06's checkers (normalization): correct answers in several styles, torch's and
Hugging Face's modules included, pass; each named mistake is named."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from companion import checks, norm

# ---- check_layer_norm ----------------------------------------------------------------


def layer_norm_loops(x, weight, bias, eps):
    rows = x.reshape(-1, x.shape[-1]).tolist()
    out = []
    for row in rows:
        mean = sum(row) / len(row)
        var = sum((v - mean) ** 2 for v in row) / len(row)
        out.append([(v - mean) / math.sqrt(var + eps) for v in row])
    return torch.tensor(out).reshape(x.shape) * weight + bias


def layer_norm_module(x, weight, bias, eps):
    module = torch.nn.LayerNorm(x.shape[-1], eps=eps)
    with torch.no_grad():
        module.weight.copy_(weight)
        module.bias.copy_(bias)
        return module(x)


def layer_norm_in_place(x, weight, bias, eps):
    var, mean = torch.var_mean(x, dim=-1, correction=0, keepdim=True)
    return x.sub_(mean).div_(torch.sqrt(var + eps)).mul_(weight).add_(bias)


def layer_norm_numpy(x, w, b, eps, /):
    a = x.numpy().astype(np.float64)
    return (a - a.mean(-1, keepdims=True)) / np.sqrt(
        a.var(-1, keepdims=True) + eps
    ) * w.numpy() + b.numpy()


def layer_norm_two_pass(x, weight, bias, eps):
    """Float32 throughout: the mean, then the mean of the squared deviations."""
    centered = x - x.mean(-1, keepdim=True)
    return (
        centered / torch.sqrt(centered.pow(2).mean(-1, keepdim=True) + eps) * (weight)
        + bias
    )


@pytest.mark.parametrize(
    "answer",
    [
        layer_norm_two_pass,
        layer_norm_loops,
        layer_norm_module,
        layer_norm_in_place,
        layer_norm_numpy,
        lambda x, weight, bias, eps: F.layer_norm(x, x.shape[-1:], weight, bias, eps),
        lambda x, weight, bias, eps: norm.layer_norm(
            x, x.shape[-1], weight, bias, eps=eps
        ),
    ],
    ids=[
        "two-pass",
        "loops",
        "nn.LayerNorm",
        "in-place",
        "numpy",
        "F.layer_norm",
        "companion",
    ],
)
def test_layer_norm_accepts(answer) -> None:
    assert checks.check_layer_norm(answer)


def _ln(
    x, weight, bias, eps, *, correction=0, outside=False, dim=-1, gain=True, shift=True
):
    var, mean = torch.var_mean(x, dim=dim, correction=correction, keepdim=True)
    y = (x - mean) / (var.sqrt() + eps if outside else torch.sqrt(var + eps))
    y = y * weight if gain else y
    return y + bias if shift else y


@pytest.mark.parametrize(
    ("options", "name"),
    [
        ({"correction": 1}, "unbiased variance"),
        ({"outside": True}, "eps outside the square root"),
        (
            {"correction": 1, "outside": True},
            "unbiased std with eps outside the square root (the Annotated "
            "Transformer's LayerNorm)",
        ),
        ({"dim": 0}, "normalizing over the batch axis"),
        ({"gain": False}, "forgetting the gain"),
        ({"shift": False}, "forgetting the bias"),
    ],
)
def test_layer_norm_names(options, name, named) -> None:
    named(lambda: checks.check_layer_norm(lambda *a: _ln(*a, **options)), name)


def test_layer_norm_names_the_cancelling_variance(named) -> None:
    """E[x^2] - E[x]^2 in float32 passes small-mean rows and fails the 1e4 case."""

    def one_pass(x, weight, bias, eps):
        mean = torch.mean(x, dim=-1, keepdim=True)
        var = torch.mean(x * x, dim=-1, keepdim=True) - mean * mean
        return weight * (x - mean) / torch.sqrt(var + eps) + bias

    err = named(
        lambda: checks.check_layer_norm(one_pass),
        "E[x^2] - E[x]^2 (catastrophic cancellation)",
    )
    assert "large mean" in str(err)


# ---- check_rms_norm ------------------------------------------------------------------


def rms_norm_hf(x, weight, eps):
    """Hugging Face's LlamaRMSNorm."""
    module = LlamaRMSNorm(x.shape[-1], eps=eps)
    with torch.no_grad():
        module.weight.copy_(weight)
        return module(x)


def rms_norm_loops(x, weight, eps, /):
    rows = x.reshape(-1, x.shape[-1]).tolist()
    out = [
        [v / math.sqrt(sum(u * u for u in row) / len(row) + eps) for v in row]
        for row in rows
    ]
    return torch.tensor(out).reshape(x.shape) * weight


@pytest.mark.parametrize(
    "answer",
    [
        rms_norm_hf,
        rms_norm_loops,
        lambda x, weight, eps: F.rms_norm(x, x.shape[-1:], weight, eps),
        lambda x, weight, eps: norm.rms_norm(x, x.shape[-1], weight, eps=eps),
        lambda x, w, eps: (
            (x.numpy() / np.sqrt((x.numpy() ** 2).mean(-1, keepdims=True) + eps))
            * w.numpy()
        ),
    ],
    ids=["hf-LlamaRMSNorm", "loops", "F.rms_norm", "companion", "numpy"],
)
def test_rms_norm_accepts(answer) -> None:
    assert checks.check_rms_norm(answer)


def _rms(x, weight, eps, *, center=False, outside=False, gain=True, total=False):
    if center:
        x = x - x.mean(-1, keepdim=True)
    ms = (
        x.square().sum(-1, keepdim=True) if total else x.square().mean(-1, keepdim=True)
    )
    y = x / (ms.sqrt() + eps) if outside else x * torch.rsqrt(ms + eps)
    return y * weight if gain else y


@pytest.mark.parametrize(
    ("options", "name"),
    [
        ({"center": True}, "subtracting the mean"),
        ({"outside": True}, "eps outside the square root"),
        ({"gain": False}, "forgetting the gain"),
        ({"total": True}, "sum of squares instead of the mean"),
    ],
)
def test_rms_norm_names(options, name, named) -> None:
    named(lambda: checks.check_rms_norm(lambda *a: _rms(*a, **options)), name)


# ---- check_batch_norm ----------------------------------------------------------------


def batch_norm_in_place(x, running_mean, running_var, weight, bias, momentum, eps):
    """torch's F.batch_norm updates the running statistics in place."""
    y = F.batch_norm(x, running_mean, running_var, weight, bias, True, momentum, eps)
    return y, running_mean, running_var


def batch_norm_module(x, running_mean, running_var, weight, bias, momentum, eps):
    module = torch.nn.BatchNorm1d(x.shape[1], eps=eps, momentum=momentum)
    with torch.no_grad():
        module.weight.copy_(weight)
        module.bias.copy_(bias)
        module.running_mean.copy_(running_mean)
        module.running_var.copy_(running_var)
        y = module(x)
    return [y, module.running_mean, module.running_var]  # a list is fine


def batch_norm_numpy(x, rm, rv, w, b, momentum, eps, /):
    a = x.numpy().astype(np.float64)
    n = a.shape[0]
    mean, var = a.mean(0), a.var(0)
    y = (a - mean) / np.sqrt(var + eps) * w.numpy() + b.numpy()
    new_rm = (1 - momentum) * rm.numpy() + momentum * mean
    new_rv = (1 - momentum) * rv.numpy() + momentum * var * n / (n - 1)
    return y, new_rm, new_rv


@pytest.mark.parametrize(
    "answer",
    [batch_norm_in_place, batch_norm_module, batch_norm_numpy],
    ids=["F.batch_norm-in-place", "nn.BatchNorm1d-list", "numpy"],
)
def test_batch_norm_accepts(answer) -> None:
    assert checks.check_batch_norm(answer)


def _bn(x, rm, rv, weight, bias, momentum, eps, *, correction=0, outside=False, dim=0,
        gain=True, run_biased=False, swap_mean=False, swap_var=False):  # fmt: skip
    n = x.shape[0]
    var, mean = torch.var_mean(x, dim=dim, correction=correction, keepdim=True)
    y = (x - mean) / (var.sqrt() + eps if outside else torch.sqrt(var + eps))
    y = (y * weight if gain else y) + bias
    bvar, bmean = torch.var_mean(x, dim=0, correction=0)
    run_var = bvar if run_biased else bvar * n / (n - 1)
    mm = 1 - momentum if swap_mean else momentum
    mv = 1 - momentum if swap_var else momentum
    return y, (1 - mm) * rm + mm * bmean, (1 - mv) * rv + mv * run_var


@pytest.mark.parametrize(
    ("options", "name"),
    [
        ({"correction": 1}, "unbiased variance"),
        ({"outside": True}, "eps outside the square root"),
        ({"dim": -1}, "normalizing over the feature axis"),
        ({"gain": False}, "forgetting the gain"),
        ({"run_biased": True}, "biased variance in the running estimate"),
        ({"swap_mean": True}, "momentum the wrong way round"),
        ({"swap_var": True}, "momentum the wrong way round"),
    ],
)
def test_batch_norm_names(options, name, named) -> None:
    named(lambda: checks.check_batch_norm(lambda *a: _bn(*a, **options)), name)


def test_batch_norm_wants_three_results() -> None:
    with pytest.raises(
        checks.CheckError, match=r"returns \(y, running_mean, running_var\)"
    ):
        checks.check_batch_norm(lambda x, *a: x)


# ---- check_variance ------------------------------------------------------------------


def variance_welford(x, dim):
    moved = x.movedim(dim, -1).double()
    mean = torch.zeros(moved.shape[:-1], dtype=torch.float64)
    m2 = torch.zeros_like(mean)
    for n in range(moved.shape[-1]):
        delta = moved[..., n] - mean
        mean += delta / (n + 1)
        m2 += delta * (moved[..., n] - mean)
    return (m2 / moved.shape[-1]).float()


@pytest.mark.parametrize(
    "answer",
    [
        lambda x, dim: torch.var(x, dim=dim, correction=0),
        lambda x, dim: (x - x.mean(dim, keepdim=True)).square().mean(dim),
        variance_welford,
        lambda a, axis, /: np.var(a.numpy(), axis=axis),
    ],
    ids=["torch.var", "two-pass", "welford", "numpy"],
)
def test_variance_accepts(answer) -> None:
    assert checks.check_variance(answer)


def test_variance_names(named) -> None:
    named(
        lambda: checks.check_variance(
            lambda x, d: x.square().mean(d) - x.mean(d).square()
        ),
        "E[x^2] - E[x]^2 (catastrophic cancellation)",
    )
    named(
        lambda: checks.check_variance(lambda x, d: torch.var(x, dim=d, correction=1)),
        "unbiased variance",
    )


# ---- check_residual_blocks -----------------------------------------------------------


def pre(x, sublayer, norm):
    return x + sublayer(norm(x))


def post(x, sublayer, norm):
    return norm(x + sublayer(x))


def test_residual_blocks_accepts() -> None:
    assert checks.check_residual_blocks(pre, post)

    def pre_in_place(h, f, n, /):
        return h.add_(f(n(h)))

    def post_numpy(x, sublayer, norm):
        return norm(x + sublayer(x)).numpy()

    assert checks.check_residual_blocks(pre_in_place, post_numpy)


def test_residual_blocks_names(named) -> None:
    named(lambda: checks.check_residual_blocks(post, post), "Post-LN order")
    named(lambda: checks.check_residual_blocks(pre, pre), "Pre-LN order")
    named(
        lambda: checks.check_residual_blocks(lambda x, f, n: f(n(x)), post),
        "no residual",
    )
    named(
        lambda: checks.check_residual_blocks(lambda x, f, n: n(x) + f(n(x)), post),
        "residual added to the normalized input",
    )
    named(
        lambda: checks.check_residual_blocks(pre, lambda x, f, n: n(f(x))),
        "no residual",
    )
    named(
        lambda: checks.check_residual_blocks(pre, lambda x, f, n: x + n(f(x))),
        "normalized the sublayer output only",
    )
