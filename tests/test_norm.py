"""Tests for companion.norm: oracles (torch built-ins, Hugging Face, float64 loops),
hypothesis properties, empty inputs, and the bad-input table that tests/test_contract.py
runs (the chapter's checkers are tested in tests/checks/test_checks_norm.py)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from companion import norm

DTYPE_TOL = {
    torch.float32: {"atol": 1e-5, "rtol": 1e-5},
    torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2},
}


def _randn(
    *shape: int, seed: int = 0, dtype=torch.float32, device="cpu"
) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype=dtype, device=device)


# ---- oracle: a float64 loop written from the formulas --------------------------------


def _loop_layer_norm(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float
):
    rows = x.double().reshape(-1, x.shape[-1])
    out = torch.empty_like(rows)
    for i, row in enumerate(rows):
        d = len(row)
        mu = sum(float(v) for v in row) / d
        var = sum((float(v) - mu) ** 2 for v in row) / d
        for j in range(d):
            out[i, j] = float(weight[j]) * (float(row[j]) - mu) / math.sqrt(
                var + eps
            ) + float(bias[j])
    return out.reshape(x.shape)


def test_layer_norm_matches_float64_loop():
    x = 3 * _randn(3, 4, 7) + 2
    w, b = _randn(7, seed=1), _randn(7, seed=2)
    got = norm.layer_norm(x.double(), 7, w.double(), b.double(), eps=1e-5)
    torch.testing.assert_close(
        got, _loop_layer_norm(x, w, b, 1e-5), atol=1e-12, rtol=1e-12
    )


def test_batch_norm_matches_float64_loop():
    x = _randn(5, 3, 4).double()
    got = norm.batch_norm(x, training=True, eps=1e-5)
    for j in range(3):
        vals = [float(v) for v in x[:, j, :].flatten()]
        mu = sum(vals) / len(vals)
        var = sum((v - mu) ** 2 for v in vals) / len(vals)
        expected = (x[:, j, :] - mu) / math.sqrt(var + 1e-5)
        torch.testing.assert_close(got[:, j, :], expected, atol=1e-12, rtol=1e-12)


# ---- oracle: torch built-ins ---------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(8, 5), (4, 5, 7)], ids=["BD", "BDL"])
def test_batch_norm_module_matches_batchnorm1d(device, dtype, shape):
    ref = nn.BatchNorm1d(5, momentum=0.2).to(device=device, dtype=dtype)
    mine = norm.BatchNorm(5, momentum=0.2, device=device, dtype=dtype)
    with torch.no_grad():
        ref.weight.copy_(_randn(5, seed=1))
        ref.bias.copy_(_randn(5, seed=2))
        mine.weight.copy_(ref.weight)
        mine.bias.copy_(ref.bias)
    for step in range(4):  # several steps: the running statistics accumulate
        x = (3 * _randn(*shape, seed=10 + step) + 2).to(device=device, dtype=dtype)
        torch.testing.assert_close(mine(x), ref(x), **DTYPE_TOL[dtype])
    torch.testing.assert_close(mine.running_mean, ref.running_mean, **DTYPE_TOL[dtype])
    torch.testing.assert_close(mine.running_var, ref.running_var, **DTYPE_TOL[dtype])
    ref.eval()
    mine.eval()
    x = (3 * _randn(*shape, seed=99) + 2).to(device=device, dtype=dtype)
    torch.testing.assert_close(mine(x), ref(x), **DTYPE_TOL[dtype])
    assert mine(x).dtype == dtype and mine(x).device.type == torch.device(device).type


def test_batch_norm_running_var_is_unbiased_and_normalizer_biased():
    x = _randn(4, 3) * 2
    rm, rv = torch.zeros(3), torch.ones(3)
    y = norm.batch_norm(x, rm, rv, training=True, momentum=1.0, eps=1e-12)
    torch.testing.assert_close(
        rv, x.var(0, correction=1)
    )  # momentum 1: the batch's unbiased
    torch.testing.assert_close(rm, x.mean(0))
    torch.testing.assert_close(
        y.var(0, correction=0), torch.ones(3), atol=1e-5, rtol=1e-5
    )


def test_batch_norm_eval_does_not_touch_running_stats():
    rm, rv = _randn(3, seed=1), 1 + _randn(3, seed=2).abs()
    rm0, rv0 = rm.clone(), rv.clone()
    x = _randn(4, 3)
    y = norm.batch_norm(x, rm, rv, training=False)
    assert torch.equal(rm, rm0) and torch.equal(rv, rv0)
    torch.testing.assert_close(y, F.batch_norm(x, rm0, rv0, training=False))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("normalized_shape", [(16,), (4, 16)])
def test_layer_norm_matches_torch(device, dtype, normalized_shape):
    x = (2 * _randn(3, 4, 16, seed=3) + 1).to(device=device, dtype=dtype)
    w = _randn(*normalized_shape, seed=4).to(device=device, dtype=dtype)
    b = _randn(*normalized_shape, seed=5).to(device=device, dtype=dtype)
    got = norm.layer_norm(x, normalized_shape, w, b, eps=1e-5)
    torch.testing.assert_close(got, F.layer_norm(x, normalized_shape, w, b, eps=1e-5))
    mod = norm.LayerNorm(normalized_shape, device=device, dtype=dtype)
    ref = nn.LayerNorm(normalized_shape, device=device, dtype=dtype)
    torch.testing.assert_close(mod(x), ref(x))
    assert got.dtype == dtype


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("eps", [1e-6, 1e-5])
def test_rms_norm_matches_torch(device, dtype, eps):
    x = _randn(3, 4, 16, seed=6).to(device=device, dtype=dtype)
    w = _randn(16, seed=7).to(device=device, dtype=dtype)
    ref = nn.RMSNorm(
        16, eps=eps, device=device, dtype=dtype
    )  # eps passed: torch's default differs
    with torch.no_grad():
        ref.weight.copy_(w)
    mod = norm.RMSNorm(16, eps=eps, device=device, dtype=dtype)
    with torch.no_grad():
        mod.weight.copy_(w)
    torch.testing.assert_close(mod(x), ref(x))
    torch.testing.assert_close(
        norm.rms_norm(x, 16, w, eps=eps), F.rms_norm(x, (16,), w, eps=eps)
    )


def test_rms_norm_variants_match_hugging_face(device):
    modeling_llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    modeling_gemma = pytest.importorskip("transformers.models.gemma.modeling_gemma")
    x = (4 * _randn(2, 5, 32, seed=8)).to(device=device, dtype=torch.bfloat16)
    llama = modeling_llama.LlamaRMSNorm(32, eps=1e-6).to(
        device=device, dtype=torch.bfloat16
    )
    gemma = modeling_gemma.GemmaRMSNorm(32, eps=1e-6).to(
        device=device, dtype=torch.bfloat16
    )
    with torch.no_grad():
        llama.weight.copy_(_randn(32, seed=9))
        gemma.weight.copy_(_randn(32, seed=10))
    # bit for bit: same operations in the same order
    assert torch.equal(norm.rms_norm(x, 32, llama.weight, variant="llama"), llama(x))
    assert torch.equal(norm.rms_norm(x, 32, gemma.weight, variant="gemma"), gemma(x))
    mine = norm.RMSNorm(32, variant="gemma", device=device)
    assert torch.count_nonzero(mine.weight) == 0  # Gemma initializes the offset at zero
    # ... and the cast position matters in bfloat16: the variants differ somewhere
    w = llama.weight
    assert not torch.equal(
        norm.rms_norm(x, 32, w, variant="llama"),
        norm.rms_norm(x, 32, w, variant="torch"),
    )


def test_statistics_are_stable_for_large_mean():
    x = 1e4 + _randn(4, 512, seed=11)  # float32: E[x^2] - E[x]^2 loses every digit here
    y = norm.layer_norm(x, 512, eps=1e-5)
    expected = F.layer_norm(x.double(), (512,), eps=1e-5).float()
    torch.testing.assert_close(y, expected, atol=2e-3, rtol=2e-3)
    xb = x.T.contiguous()  # (B, D) with the large mean per feature
    yb = norm.batch_norm(xb, training=True)
    torch.testing.assert_close(
        yb,
        F.batch_norm(xb.double(), None, None, training=True).float(),
        atol=2e-3,
        rtol=2e-3,
    )


def test_half_precision_keeps_dtype_and_stays_finite():
    x = (300 * _randn(2, 8, 64, seed=12)).to(torch.float16)  # x**2 overflows float16
    for out in (
        norm.layer_norm(x, 64),
        norm.rms_norm(x, 64),
        norm.batch_norm(x.transpose(1, 2)),
    ):
        assert out.dtype == torch.float16
        assert torch.isfinite(out).all()


# ---- residual builders ---------------------------------------------------------------


def test_blocks_compute_their_formulas():
    torch.manual_seed(0)
    f = norm.mlp(8)
    ln = norm.LayerNorm(8)
    x = _randn(2, 3, 8)
    torch.testing.assert_close(norm.PreLNBlock(8, f, ln)(x), x + f(ln(x)))
    torch.testing.assert_close(norm.PostLNBlock(8, f, ln)(x), ln(x + f(x)))


@pytest.mark.parametrize("placement", ["pre", "post"])
@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_residual_stack_structure(placement, kind):
    stack = norm.residual_stack(3, 8, placement=placement, norm=kind)
    block = norm.PreLNBlock if placement == "pre" else norm.PostLNBlock
    norm_cls = norm.LayerNorm if kind == "layer" else norm.RMSNorm
    assert all(isinstance(stack[i], block) for i in range(3))
    assert all(isinstance(stack[i].norm, norm_cls) for i in range(3))
    assert len(stack) == (
        4 if placement == "pre" else 3
    )  # Pre-LN ends with a final norm
    y = stack(_randn(2, 5, 8))
    assert y.shape == (2, 5, 8)


def test_post_ln_output_is_normalized():
    stack = norm.residual_stack(4, 16, placement="post")
    y = stack(5 * _randn(3, 16) + 2)
    torch.testing.assert_close(y.mean(-1), torch.zeros(3), atol=1e-5, rtol=0)


# ---- properties ----------------------------------------------------------------------

rows = st.integers(min_value=1, max_value=4)
widths = st.integers(min_value=2, max_value=32)
seeds = st.integers(min_value=0, max_value=2**31 - 1)


@given(b=rows, d=widths, seed=seeds)
def test_layer_norm_rows_have_mean_zero_variance_one(b, d, seed):
    x = 5 * _randn(b, d, seed=seed) + 3
    y = norm.layer_norm(x.double(), d, eps=1e-12)
    torch.testing.assert_close(
        y.mean(-1), torch.zeros(b, dtype=torch.float64), atol=1e-9, rtol=0
    )
    torch.testing.assert_close(
        y.var(-1, correction=0), torch.ones(b, dtype=torch.float64), atol=1e-6, rtol=0
    )


@given(
    b=rows,
    d=widths,
    seed=seeds,
    shift=st.floats(-1e3, 1e3),
    scale=st.floats(0.01, 100.0),
)
def test_layer_norm_shift_and_scale_invariance(b, d, seed, shift, scale):
    x = _randn(b, d, seed=seed).double()
    y = norm.layer_norm(x, d, eps=1e-12)
    torch.testing.assert_close(
        norm.layer_norm(scale * x + shift, d, eps=1e-12), y, atol=1e-6, rtol=1e-6
    )


@given(b=rows, d=widths, seed=seeds, scale=st.floats(0.01, 100.0))
def test_rms_norm_scale_invariance_but_not_shift(b, d, seed, scale):
    x = _randn(b, d, seed=seed).double()
    y = norm.rms_norm(x, d, eps=1e-12)
    torch.testing.assert_close(
        norm.rms_norm(scale * x, d, eps=1e-12), y, atol=1e-6, rtol=1e-6
    )
    torch.testing.assert_close(
        y.square().mean(-1), torch.ones(b, dtype=torch.float64), atol=1e-6, rtol=0
    )


@given(d=widths, seed=seeds, mean=st.floats(1e3, 1e5))
def test_layer_norm_large_mean_stability_float32(d, seed, mean):
    x = (mean + _randn(2, d, seed=seed)).float()
    got = norm.layer_norm(x, d)
    expected = F.layer_norm(x.double(), (d,)).float()
    # float32 keeps ~7 digits of x itself: the error scales with mean * 2^-24
    tol = 4 * mean * 2**-24 * 10
    torch.testing.assert_close(got, expected, atol=tol, rtol=tol)


@given(b=st.integers(2, 6), seed=seeds)
def test_layer_norm_is_independent_of_batch_partners(b, seed):
    x = _randn(b, 3, 8, seed=seed)
    alone = norm.layer_norm(x[:1], 8)
    torch.testing.assert_close(norm.layer_norm(x, 8)[:1], alone)


# ---- bad inputs: the contract (run by tests/test_contract.py) ------------------------

X = torch.zeros(2, 4)
_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
_block = norm.PreLNBlock(4, nn.Linear(4, 4), norm.LayerNorm(4))
_post = norm.PostLNBlock(4, nn.Linear(4, 4), norm.RMSNorm(4))


def _not_a_module(dim):
    return lambda x: x


BAD_INPUTS = [
    (
        "PreLNBlock",
        lambda: norm.PreLNBlock(8, torch.nn.Linear(8, 9), norm.LayerNorm(8))(
            torch.ones(2, 8)
        ),
        ValueError,
        r"^sublayer must return a tensor of its input's shape \(2, 8\)",
    ),
    (
        "PostLNBlock",
        lambda: norm.PostLNBlock(8, torch.nn.Linear(8, 9), norm.LayerNorm(8))(
            torch.ones(2, 8)
        ),
        ValueError,
        r"^sublayer must return a tensor of its input's shape",
    ),
    (
        "LayerNorm",
        lambda: norm.LayerNorm(10**20),
        ValueError,
        "normalized_shape.* must be an int that fits in 64 bits",
    ),
    # layer_norm: tensor type, dtype family, meta, trailing shape, parameters, eps
    (
        "layer_norm",
        lambda: norm.layer_norm([1.0, 2.0], 2),
        TypeError,
        "x must be a torch.Te",
    ),
    (
        "layer_norm",
        lambda: norm.layer_norm(torch.ones(2, 4, dtype=torch.long), 4),
        TypeError,
        "x must be a floating-point tensor, got a tensor of dtype torch.int64",
    ),
    (
        "layer_norm",
        lambda: norm.layer_norm(X.to(torch.complex64), 4),
        TypeError,
        "x must be a floating-point tensor, got a tensor of dtype torch.complex64",
    ),
    (
        "layer_norm",
        lambda: norm.layer_norm(torch.zeros(2, 4, device="meta"), 4),
        ValueError,
        "x must hold values, got a tensor on the 'meta' device",
    ),
    (
        "layer_norm",
        lambda: norm.layer_norm(X, 5),
        ValueError,
        r"x must end with normalized_shape \(5,\), got x of shape \(2, 4\)",
    ),
    (
        "layer_norm",
        lambda: norm.layer_norm(torch.tensor(1.0), 1),
        ValueError,
        "x must have at least 1 dimensions",
    ),
    (
        "layer_norm",
        lambda: norm.layer_norm(X, 0),
        ValueError,
        "normalized_shape must be a pos",
    ),
    (
        "layer_norm",
        lambda: norm.layer_norm(X, 4.0),
        TypeError,
        "normalized_shape must be an",
    ),
    (
        "layer_norm",
        lambda: norm.layer_norm(X, True),
        TypeError,
        "normalized_shape must be an",
    ),
    (
        "layer_norm",
        lambda: norm.layer_norm(X, [2, 0]),
        ValueError,
        r"normalized_shape\[1\] must be a positive int, got 0",
    ),
    (
        "layer_norm",
        lambda: norm.layer_norm(X, 4, eps=0.0),
        ValueError,
        "eps must be a real nu",
    ),
    (
        "layer_norm",
        lambda: norm.layer_norm(X, 4, eps=-1e-5),
        ValueError,
        "eps must be a real",
    ),
    (
        "layer_norm",
        lambda: norm.layer_norm(X, 4, eps="1e-5"),
        TypeError,
        "eps must be a real",
    ),
    (
        "layer_norm",
        lambda: norm.layer_norm(X, 4, eps=float("nan")),
        ValueError,
        "eps must be a finite real number",
    ),
    (
        "layer_norm",
        lambda: norm.layer_norm(X, 4, torch.ones(5)),
        ValueError,
        r"weight must have shape \(4,\), got shape \(5,\)",
    ),
    (
        "layer_norm",
        lambda: norm.layer_norm(X, 4, None, torch.ones(3)),
        ValueError,
        r"bias must have shape \(4,\), got shape \(3,\)",
    ),
    (
        "layer_norm",
        lambda: norm.layer_norm(X, 4, torch.ones(4, dtype=torch.long)),
        TypeError,
        "weight must be a floating-point tensor",
    ),
    (
        "layer_norm",
        lambda: norm.layer_norm(X, 4, torch.ones(4, dtype=torch.complex64)),
        TypeError,
        "weight must be a floating-point tensor",
    ),
    (
        "layer_norm",
        lambda: norm.layer_norm(X, 4, torch.ones(4, device="meta")),
        ValueError,
        "weight must hold values",
    ),
    pytest.param(
        "layer_norm",
        lambda: norm.layer_norm(X, 4, torch.ones(4, device="cuda")),
        ValueError,
        "weight must be on x's device cpu",
        marks=_cuda,
    ),
    # rms_norm
    (
        "rms_norm",
        lambda: norm.rms_norm(X, 3),
        ValueError,
        "x must end with normalized_shape",
    ),
    (
        "rms_norm",
        lambda: norm.rms_norm(X, 4, eps=0),
        ValueError,
        "eps must be a real number >",
    ),
    (
        "rms_norm",
        lambda: norm.rms_norm(X, 4, variant="t5"),
        ValueError,
        "variant must be one of 'torch', 'llama', 'gemma', got 't5'",
    ),
    (
        "rms_norm",
        lambda: norm.rms_norm(X, 4, variant=1),
        TypeError,
        "variant must be one of",
    ),
    (
        "rms_norm",
        lambda: norm.rms_norm(torch.ones(4, dtype=torch.int32), 4),
        TypeError,
        "x must be a floating-point tensor",
    ),
    (
        "rms_norm",
        lambda: norm.rms_norm(X, 4, torch.ones(2, 4)),
        ValueError,
        "weight must have",
    ),
    pytest.param(
        "rms_norm",
        lambda: norm.rms_norm(X.cuda(), 4, torch.ones(4)),
        ValueError,
        "weight must be on x's device cuda",
        marks=_cuda,
    ),
    # batch_norm
    (
        "batch_norm",
        lambda: norm.batch_norm(torch.zeros(4)),
        ValueError,
        r"x must have at least 2 dimensions \(B, D\) or \(B, D, L\), got shape \(4,\)",
    ),
    (
        "batch_norm",
        lambda: norm.batch_norm(torch.zeros(2, 3, 4, 5)),
        ValueError,
        "x must have at most 3 dimensions",
    ),
    (
        "batch_norm",
        lambda: norm.batch_norm(torch.zeros(1, 4)),
        ValueError,
        "x must have more than 1 value per feature in training mode",
    ),
    (
        "batch_norm",
        lambda: norm.batch_norm(X, training=False),
        ValueError,
        "running_mean and running_var are required when training=False",
    ),
    (
        "batch_norm",
        lambda: norm.batch_norm(X, torch.zeros(4)),
        ValueError,
        "running_var must be given with running_mean, got None",
    ),
    (
        "batch_norm",
        lambda: norm.batch_norm(X, torch.zeros(3), torch.ones(3)),
        ValueError,
        r"running_mean must have shape \(4,\), got shape \(3,\)",
    ),
    (
        "batch_norm",
        lambda: norm.batch_norm(X, torch.zeros(4), torch.ones(4, dtype=torch.int64)),
        TypeError,
        "running_var must be a floating-point tensor",
    ),
    (
        "batch_norm",
        lambda: norm.batch_norm(X, momentum=1.5),
        ValueError,
        "momentum must be a real number <= 1, got 1.5",
    ),
    (
        "batch_norm",
        lambda: norm.batch_norm(X, momentum="0.1"),
        TypeError,
        "momentum must be",
    ),
    (
        "batch_norm",
        lambda: norm.batch_norm(X, eps=0.0),
        ValueError,
        "eps must be a real",
    ),
    (
        "batch_norm",
        lambda: norm.batch_norm(X, training=1),
        TypeError,
        "training must be a bool",
    ),
    (
        "batch_norm",
        lambda: norm.batch_norm(X.long()),
        TypeError,
        "x must be a floating-point",
    ),
    pytest.param(
        "batch_norm",
        lambda: norm.batch_norm(X, weight=torch.ones(4, device="cuda")),
        ValueError,
        "weight must be on x's device cpu",
        marks=_cuda,
    ),
    # the modules: arguments, dtype and device
    (
        "BatchNorm",
        lambda: norm.BatchNorm(0),
        ValueError,
        "num_features must be a positive int",
    ),
    (
        "BatchNorm",
        lambda: norm.BatchNorm(4.0),
        TypeError,
        "num_features must be an int",
    ),
    (
        "BatchNorm",
        lambda: norm.BatchNorm(4, momentum=2),
        ValueError,
        "momentum must be a real",
    ),
    (
        "BatchNorm",
        lambda: norm.BatchNorm(4, affine="yes"),
        TypeError,
        "affine must be a bool",
    ),
    (
        "BatchNorm",
        lambda: norm.BatchNorm(4, device="gpu"),
        ValueError,
        "device must be a dev",
    ),
    (
        "BatchNorm",
        lambda: norm.BatchNorm(4, dtype="float32"),
        TypeError,
        "dtype must be a torch.dtype such as torch.float32, got the string 'float32'",
    ),
    (
        "BatchNorm",
        lambda: norm.BatchNorm(4, dtype=torch.int32),
        TypeError,
        "dtype must be a floating torch.dtype",
    ),
    (
        "BatchNorm",
        lambda: norm.BatchNorm(4)(X.long()),
        TypeError,
        "x must be a floating-point",
    ),
    (
        "LayerNorm",
        lambda: norm.LayerNorm(4, eps=0.0),
        ValueError,
        "eps must be a real number",
    ),
    (
        "LayerNorm",
        lambda: norm.LayerNorm(0),
        ValueError,
        "normalized_shape must be a positive",
    ),
    (
        "LayerNorm",
        lambda: norm.LayerNorm(4, bias=1),
        TypeError,
        "bias must be a bool, got 1",
    ),
    (
        "LayerNorm",
        lambda: norm.LayerNorm(4, dtype="bf16"),
        TypeError,
        "dtype must be a torch.dt",
    ),
    (
        "LayerNorm",
        lambda: norm.LayerNorm(4, device="cuda:9"),
        ValueError,
        "device must be a device this machine has, got 'cuda:9'",
    ),
    (
        "LayerNorm",
        lambda: norm.LayerNorm(4)(torch.zeros(2, 5)),
        ValueError,
        "x must end with",
    ),
    (
        "RMSNorm",
        lambda: norm.RMSNorm(4, variant="x"),
        ValueError,
        "variant must be one of 'torch', 'llama', 'gemma', got 'x'",
    ),
    (
        "RMSNorm",
        lambda: norm.RMSNorm(4, dtype="float16"),
        TypeError,
        "dtype must be a torch.d",
    ),
    (
        "RMSNorm",
        lambda: norm.RMSNorm(4)(torch.zeros(2, 3)),
        ValueError,
        "x must end with norm",
    ),
    # the residual builders
    ("mlp", lambda: norm.mlp(0), ValueError, "dim must be a positive int, got 0"),
    ("mlp", lambda: norm.mlp(4.0), TypeError, "dim must be an int, got 4.0"),
    ("mlp", lambda: norm.mlp(4, 0), ValueError, "hidden must be a positive int, got 0"),
    ("mlp", lambda: norm.mlp(4, "8"), TypeError, "hidden must be an int, got '8'"),
    (
        "PreLNBlock",
        lambda: norm.PreLNBlock(0, nn.Identity(), nn.Identity()),
        ValueError,
        "dim must be a positive int",
    ),
    (
        "PreLNBlock",
        lambda: norm.PreLNBlock(4, lambda x: x, nn.Identity()),
        TypeError,
        "sublayer must be a Module, got a function",
    ),
    (
        "PreLNBlock",
        lambda: norm.PreLNBlock(4, nn.Identity(), nn.Identity())(torch.zeros(2, 5)),
        ValueError,
        r"x must have size 4 \(dim\) in dimension -1, got shape \(2, 5\)",
    ),
    (
        "PreLNBlock",
        lambda: _block(torch.zeros(2, 4, dtype=torch.float64)),
        TypeError,
        "x must have sublayer.weight's dtype torch.float32, "
        "got a tensor of dtype torch.float64",
    ),
    (
        "PreLNBlock",
        lambda: _block([[0.0] * 4]),
        TypeError,
        "x must be a torch.Tensor, got a li",
    ),
    pytest.param(
        "PreLNBlock",
        lambda: _block(torch.zeros(2, 4, device="cuda")),
        ValueError,
        "x must be on sublayer.weight's device cpu",
        marks=_cuda,
    ),
    (
        "PostLNBlock",
        lambda: norm.PostLNBlock(4, nn.Identity(), "rms"),
        TypeError,
        "norm must be a Module, got 'rms'",
    ),
    ("PostLNBlock", lambda: _post(torch.zeros(3, 5)), ValueError, "x must have size 4"),
    (
        "PostLNBlock",
        lambda: _post(torch.zeros(3, 4).long()),
        TypeError,
        "x must be a floating",
    ),
    (
        "residual_stack",
        lambda: norm.residual_stack(0, 4),
        ValueError,
        "depth must be a positive",
    ),
    (
        "residual_stack",
        lambda: norm.residual_stack(2.0, 4),
        TypeError,
        "depth must be an int",
    ),
    (
        "residual_stack",
        lambda: norm.residual_stack(2, -4),
        ValueError,
        "dim must be a positive",
    ),
    (
        "residual_stack",
        lambda: norm.residual_stack(2, 4, placement="middle"),
        ValueError,
        "placement must be one of 'pre', 'post', got 'middle'",
    ),
    (
        "residual_stack",
        lambda: norm.residual_stack(2, 4, norm="batch"),
        ValueError,
        "norm must be one of 'layer', 'rms', got 'batch'",
    ),
    (
        "residual_stack",
        lambda: norm.residual_stack(2, 4, sublayer=3),
        TypeError,
        "sublayer must",
    ),
    (
        "residual_stack",
        lambda: norm.residual_stack(2, 4, sublayer=_not_a_module),
        TypeError,
        r"sublayer\(dim\) must be a Module, got a function",
    ),
    (
        "residual_stack",
        lambda: norm.residual_stack(2, 4, final_norm=1),
        TypeError,
        "final_norm",
    ),
    (
        "residual_stack",
        lambda: norm.residual_stack(2, 4, eps=0),
        ValueError,
        "eps must be a real",
    ),
]


# ---- empty inputs give their natural answer ------------------------------------------


@pytest.mark.parametrize("shape", [(0, 4), (2, 0, 4), (0, 3, 4)])
def test_layer_and_rms_norm_of_no_tokens_are_empty(shape):
    x = torch.zeros(shape)
    for y in (
        norm.layer_norm(x, 4, torch.ones(4), torch.zeros(4)),
        norm.rms_norm(x, 4),
    ):
        assert y.shape == x.shape and y.dtype == x.dtype


def test_batch_norm_of_no_features_is_empty():
    x = torch.zeros(3, 0, 5)
    assert norm.batch_norm(x).shape == x.shape
    assert norm.batch_norm(
        torch.zeros(0, 4), torch.zeros(4), torch.ones(4), training=False
    ).shape == (0, 4)


# ---- valid random inputs never raise -------------------------------------------------


@given(
    st.lists(st.integers(0, 3), max_size=2),
    st.integers(1, 6),
    st.sampled_from([torch.float32, torch.float64, torch.bfloat16, torch.float16]),
    st.sampled_from(["torch", "llama", "gemma"]),
    st.booleans(),
    st.floats(1e-8, 1.0),
)
def test_valid_random_inputs_never_raise(lead, d, dtype, variant, affine, eps):
    x = torch.randn(*lead, d).to(dtype)
    w = torch.randn(d) if affine else None
    assert norm.layer_norm(x, d, w, w, eps=eps).shape == x.shape
    assert norm.rms_norm(x, d, w, eps=eps, variant=variant).shape == x.shape
    assert norm.LayerNorm(d, bias=affine, dtype=dtype)(x).dtype == dtype
    assert norm.RMSNorm(d, variant=variant, dtype=dtype)(x).dtype == dtype


@given(
    st.integers(2, 5),
    st.integers(0, 4),
    st.sampled_from([None, 1, 3]),
    st.booleans(),
    st.floats(0.0, 1.0),
)
def test_valid_batch_norm_calls_never_raise(b, d, length, training, momentum):
    x = torch.randn(b, d) if length is None else torch.randn(b, d, length)
    module = norm.BatchNorm(max(d, 1), momentum=momentum) if d else None
    stats = (torch.zeros(d), torch.ones(d))
    y = norm.batch_norm(x, *stats, training=training, momentum=momentum)
    assert y.shape == x.shape
    if module is not None:
        module.train(training)
        assert module(x).shape == x.shape


@given(st.integers(1, 3), st.integers(1, 6), st.sampled_from(["pre", "post"]))
def test_valid_residual_stacks_never_raise(depth, dim, placement):
    stack = norm.residual_stack(depth, dim, placement=placement, norm="rms", eps=1e-5)
    assert stack(torch.randn(2, 3, dim)).shape == (2, 3, dim)
