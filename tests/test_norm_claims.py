"""The claims chapter 06 (Normalization) makes in its prose, against oracles.

Scale drift through random layers (g^30) and its reset by LayerNorm; the two effects of
BatchNorm on padded sentences (the padding and the batch partner change a sentence's
output; LayerNorm's changes by exactly zero); the unbiased running variance;
nn.RMSNorm's default eps per dtype; one bfloat16 step between the torch and LLaMA cast
orders and a third more error for LLaMA's; Gemma's offset gain; E[x^2] - E[x]^2 against
the two-pass variance; eps inside and outside the root; (D - 1)/D for an unbiased std;
float16 overflow; the gradient at initialization of Post-LN and Pre-LN stacks (flat
against falling with depth, in every seed); Adam's first step, the same size in both
placements and moving a deep Post-LN stack's output more; later Pre-LN blocks changing the
residual stream less; BatchNorm's gain and bias undoing it where LayerNorm's cannot; the
Annotated Transformer's LayerNorm off by 1/(2D). Oracles: torch's F.layer_norm, F.batch_norm, F.rms_norm, nn.BatchNorm1d, float64
loops.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from companion import norm

F64 = torch.float64


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


# ---- why normalize -------------------------------------------------------------------


def test_scale_drifts_geometrically_and_layer_norm_resets_it() -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(256, 64, dtype=F64, generator=gen)
    weights = [torch.randn(64, 64, dtype=F64, generator=gen) / 8 for _ in range(30)]
    for gain, low, high in ((1.1, 10, 40), (0.9, 0.01, 0.1)):
        h = x
        for w in weights:
            h = h @ (gain * w)
        assert low < h.std() < high, (gain, h.std())  # 1.1^30 = 17.4, 0.9^30 = 0.042
    h = x
    for w in weights:
        h = F.layer_norm(h @ (1.1 * w), (64,))
    assert abs(h.std() - 1) < 0.01


# ---- BatchNorm and sentences ---------------------------------------------------------


def _padded(sentences: list[torch.Tensor], length: int) -> torch.Tensor:
    out = torch.zeros(len(sentences), length, sentences[0].shape[-1], dtype=F64)
    for i, s in enumerate(sentences):
        out[i, : len(s)] = s
    return out


def _torch_bn(x: torch.Tensor) -> torch.Tensor:
    """(B, L, D) tokens through F.batch_norm in training mode, features on axis 1."""
    return F.batch_norm(x.transpose(1, 2), None, None, training=True).transpose(1, 2)


def test_padding_and_the_batch_partner_change_batch_norm_not_layer_norm() -> None:
    gen = torch.Generator().manual_seed(2)
    wo_ai_ni = torch.randn(3, 8, dtype=F64, generator=gen) + 1
    jin_tian = torch.randn(6, 8, dtype=F64, generator=gen) + 1
    other = torch.randn(6, 8, dtype=F64, generator=gen) - 1
    for f, changes in ((_torch_bn, True), (lambda t: F.layer_norm(t, (8,)), False)):
        first = f(_padded([wo_ai_ni, jin_tian], 6))[0, :3]
        padded_more = f(_padded([wo_ai_ni, jin_tian], 10))[0, :3]
        partner = f(_padded([wo_ai_ni, other], 6))[0, :3]
        gaps = ((first - padded_more).abs().max(), (first - partner).abs().max())
        if changes:
            assert min(gaps) > 0.1
        else:
            assert max(gaps) == 0
        # and the package agrees with torch on the same inputs
    x = _padded([wo_ai_ni, jin_tian], 6).transpose(1, 2)
    torch.testing.assert_close(
        norm.batch_norm(x), F.batch_norm(x, None, None, training=True)
    )


def test_running_variance_is_unbiased_and_eval_mode_ignores_the_partner() -> None:
    gen = torch.Generator().manual_seed(3)
    x = 3 * torch.randn(8, 4, dtype=F64, generator=gen) + 2
    mean, var = torch.zeros(4, dtype=F64), torch.ones(4, dtype=F64)
    norm.batch_norm(x, mean, var, momentum=1.0)
    n = x.shape[0]
    loop_var = [
        sum((x[i, j] - x[:, j].mean()) ** 2 for i in range(n)) / (n - 1)
        for j in range(4)
    ]
    torch.testing.assert_close(var, torch.stack(loop_var))
    bn = norm.BatchNorm(4).double()
    bn(x)
    bn.eval()
    a, b = bn(torch.cat([x[:1], x[1:2]])), bn(torch.cat([x[:1], -x[1:2]]))
    assert torch.equal(a[0], b[0])


def test_batchnorm1d_on_tokens_normalizes_the_wrong_axis() -> None:
    with pytest.raises(RuntimeError):
        nn.BatchNorm1d(8)(torch.randn(2, 5, 8))  # (B, L, D) with L != D
    square = torch.randn(2, 8, 8, generator=torch.Generator().manual_seed(4))
    wrong = nn.BatchNorm1d(8)(square)
    right = norm.batch_norm(square.transpose(1, 2)).transpose(1, 2)
    assert (wrong - right).abs().max() > 0.1


# ---- LayerNorm and RMSNorm -----------------------------------------------------------


def test_layer_norm_invariances_and_rms_norm_only_to_scaling() -> None:
    x = torch.randn(4, 16, dtype=F64, generator=torch.Generator().manual_seed(5)) + 0.5
    torch.testing.assert_close(
        norm.layer_norm(7.5 * x - 3.0, 16, eps=1e-12),
        norm.layer_norm(x, 16, eps=1e-12),
        rtol=0,
        atol=1e-10,
    )
    base = norm.rms_norm(x, 16, eps=1e-12)
    assert (norm.rms_norm(5 * x, 16, eps=1e-12) - base).abs().max() < 1e-10
    assert (norm.rms_norm(x + 1, 16, eps=1e-12) - base).abs().max() > 0.1


def test_batch_norm_gain_and_bias_can_undo_it_and_layer_norms_cannot() -> None:
    """BatchNorm's statistics are per feature, like gamma and beta: gamma = sqrt(var +
    eps), beta = mean give the batch back. LayerNorm's are per token: x and 3x + 5 give
    one output, so no per-feature gain and bias can give both back."""
    x = torch.randn(10, 16, dtype=F64, generator=torch.Generator().manual_seed(11))
    var, mean = torch.var_mean(x, dim=0, correction=0)
    undone = F.batch_norm(
        x, None, None, torch.sqrt(var + 1e-5), mean, training=True, eps=1e-5
    )
    torch.testing.assert_close(undone, x, rtol=0, atol=1e-12)
    token = x[0]
    same = F.layer_norm(3 * token + 5, (16,), eps=1e-20) - F.layer_norm(
        token, (16,), eps=1e-20
    )
    assert same.abs().max() < 1e-14
    assert (3 * token + 5 - token).abs().max() > 1  # two different tokens


@pytest.mark.parametrize(
    ("dtype", "compute"),
    [
        (torch.float32, torch.float32),
        (torch.bfloat16, torch.float32),
        (torch.float64, torch.float64),
    ],
)
def test_torch_rms_norm_default_eps_is_the_compute_types_epsilon(
    dtype: torch.dtype, compute: torch.dtype
) -> None:
    assert nn.RMSNorm(16).eps is None
    x = (1e-3 * torch.randn(2, 16, generator=torch.Generator().manual_seed(6))).to(
        dtype
    )
    out = nn.RMSNorm(16).to(dtype)(x)
    assert torch.equal(out, F.rms_norm(x, (16,), eps=torch.finfo(compute).eps))


def test_cast_before_the_gain_costs_one_bfloat16_step_and_a_third_more_error() -> None:
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(256, 512, generator=gen).to(torch.bfloat16)
    w = (1 + 0.2 * torch.randn(512, generator=gen)).to(torch.bfloat16)
    x_hat = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6)
    exact = x_hat * w.double()
    torch_order = norm.rms_norm(x, 512, w, variant="torch")
    llama_order = norm.rms_norm(x, 512, w, variant="llama")
    bits = (
        torch_order.view(torch.int16).int() - llama_order.view(torch.int16).int()
    ).abs()
    assert bits.max() == 1
    assert (
        0.15 < (torch_order != llama_order).float().mean() < 0.35
    )  # "about a quarter"
    errors = [
        ((out.double() - exact).abs() / exact.abs().clamp_min(1e-3)).mean()
        for out in (torch_order, llama_order)
    ]
    assert 1.2 < errors[1] / errors[0] < 1.5


def test_gemma_offset_keeps_finer_gains_than_a_direct_bfloat16_gain() -> None:
    delta = torch.linspace(-0.01, 0.01, 2001, dtype=F64)
    direct = ((1 + delta).to(torch.bfloat16).double() - (1 + delta)).abs().max()
    offset = ((1 + delta.to(torch.bfloat16).double()) - (1 + delta)).abs().max()
    assert 0.99 * 2**-8 < direct <= 2**-8 and offset < direct / 100


# ---- numerics ------------------------------------------------------------------------


@pytest.mark.parametrize("order", ["in order", "features permuted"])
def test_naive_variance_cancels_and_the_two_pass_one_does_not(order: str) -> None:
    """The chapter's 64 rows; with the features summed in another order (another
    processor's) the naive variance still misses and still gives NaN rows."""
    x = 1e4 + torch.randn(64, 1024, generator=torch.Generator().manual_seed(4))
    if order != "in order":
        x = x[:, torch.randperm(1024, generator=torch.Generator().manual_seed(1))]
    exact = x.double().var(dim=-1, correction=0)
    naive = x.pow(2).mean(-1) - x.mean(-1).pow(2)
    two_pass = (x - x.mean(-1, keepdim=True)).pow(2).mean(-1)
    assert (naive.double() - exact).abs().max() > 1  # the true variance is about 1
    naive_ln = (x - x.mean(-1, keepdim=True)) / torch.sqrt(naive.unsqueeze(-1) + 1e-5)
    assert naive_ln.isnan().any(-1).sum() > 0  # some rows' variance comes out < 0
    torch.testing.assert_close(two_pass.double(), exact, rtol=1e-3, atol=0)
    reference = F.layer_norm(x.double(), (1024,))
    # float32 knows the mean of numbers near 1e4 to about 1e-3 (its step there is
    # 1e-3): the package's error is of that size (1e-3 to 2e-3 over 64 rows), not 0
    assert (norm.layer_norm(x, 1024) - reference).abs().max() < 1e-2


def test_eps_inside_or_outside_the_root() -> None:
    gen = torch.Generator().manual_seed(7)
    for spread, low, high in ((1.0, 1e-6, 1e-5), (1e-4, 0.5, math.inf)):
        t = spread * torch.randn(1, 64, dtype=F64, generator=gen)
        var, mean = torch.var_mean(t, dim=-1, correction=0, keepdim=True)
        inside = (t - mean) / torch.sqrt(var + 1e-5)
        outside = (t - mean) / (var.sqrt() + 1e-5)
        rel = ((inside - outside).abs() / outside.abs()).max()
        assert low < rel < high, (spread, rel)


@pytest.mark.parametrize("d", [8, 512])
def test_unbiased_std_gives_an_output_variance_of_d_minus_one_over_d(d: int) -> None:
    t = torch.randn(100, d, dtype=F64, generator=torch.Generator().manual_seed(8))
    out = (t - t.mean(-1, keepdim=True)) / t.std(-1, keepdim=True)
    torch.testing.assert_close(
        out.var(-1, correction=0), torch.full((100,), (d - 1) / d, dtype=F64)
    )


def test_float16_squares_overflow_and_the_package_does_not() -> None:
    gen = torch.Generator().manual_seed(9)
    xh = (300 * torch.randn(2, 64, generator=gen)).to(torch.float16)
    assert torch.isinf(xh.pow(2)).any()
    naive = xh / torch.sqrt(xh.pow(2).mean(-1, keepdim=True) + 1e-6)
    assert (naive == 0).all()
    good = norm.rms_norm(xh, 64)
    assert good.dtype == torch.float16
    assert abs(good.float().pow(2).mean().sqrt() - 1) < 1e-2


@pytest.mark.parametrize("d", [512, 64])
@pytest.mark.parametrize("seed", [5, 6, 7])
def test_annotated_transformer_layer_norm_is_off_by_one_over_2d(
    d: int, seed: int
) -> None:
    """In float64 the largest relative difference is 1 - sqrt((D-1)/D) to 1e-5 (eps/std),
    whatever the data and the order of summation; that is within 5% of 1/(2D)."""
    t = torch.randn(4, 10, d, dtype=F64, generator=torch.Generator().manual_seed(seed))
    rel = []
    for features in (torch.arange(d), torch.randperm(d)):
        tf = t[..., features]
        std = tf.std(-1, keepdim=True)  # unbiased, as the Annotated Transformer's
        annotated = (tf - tf.mean(-1, keepdim=True)) / (std + 1e-6)
        reference = F.layer_norm(tf, (d,), eps=1e-6)
        rel.append(
            ((annotated - reference).abs() / reference.abs().clamp_min(1e-6)).max()
        )
    assert abs(rel[1] - rel[0]) / rel[0] < 1e-9
    assert abs(rel[0] - (1 - math.sqrt((d - 1) / d))) < 1e-5
    assert abs(rel[0] * 2 * d - 1) < 0.05


def test_gemma_offset_loaded_as_a_plain_gain_is_one_too_small() -> None:
    gen = torch.Generator().manual_seed(6)
    offset = 0.1 * torch.randn(16, generator=gen, dtype=F64)
    x = torch.randn(4, 16, generator=gen, dtype=F64)
    right = norm.rms_norm(x, 16, offset, variant="gemma")
    x_hat = x / x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()  # independent
    torch.testing.assert_close(right, (1 + offset) * x_hat)
    torch.testing.assert_close(norm.rms_norm(x, 16, offset), right - x_hat)
    untrained = norm.RMSNorm(16, variant="gemma").weight.detach().double()
    assert norm.rms_norm(x, 16, untrained).abs().max() == 0  # all outputs zero


# ---- Post-LN and Pre-LN at initialization --------------------------------------------


def _last_block_grads(placement: str, seed: int, kind: str = "layer") -> list[float]:
    """The chapter's measurement: gradient norm of the last block's output
    projection."""
    out = []
    for depth in (2, 4, 8, 16, 32):
        torch.manual_seed(seed)
        stack = norm.residual_stack(depth, 64, placement=placement, norm=kind)
        for m in stack.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_normal_(m.weight)
                nn.init.zeros_(m.bias)
        head = nn.Linear(64, 100)
        x = torch.randn(8, 8, 64)
        target = torch.randint(100, (8, 8))
        F.cross_entropy(head(stack(x)).flatten(0, 1), target.flatten()).backward()
        out.append(stack[depth - 1].sublayer[2].weight.grad.norm().item())
    return out


def _fitted_slope(values: list[float]) -> float:
    """Least-squares slope of log(values) against log(depth), computed in float64."""
    xs = [math.log(d) for d in (2, 4, 8, 16, 32)]
    ys = [math.log(v) for v in values]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((a - mx) * (b - my) for a, b in zip(xs, ys, strict=True)) / sum(
        (a - mx) ** 2 for a in xs
    )


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_post_ln_gradient_is_flat_in_depth_and_pre_ln_falls(
    seed: int, kind: str
) -> None:
    """The chapter asserts this for seeds 0-2, with LayerNorm and (its exercise) with
    RMSNorm; seeds 3-4 check that it is no accident."""
    assert abs(_fitted_slope(_last_block_grads("post", seed, kind))) < 0.1
    assert -0.45 < _fitted_slope(_last_block_grads("pre", seed, kind)) < -0.2


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_at_depth_16_post_ln_gradients_exceed_pre_ln_most_at_the_top(seed: int) -> None:
    grads = {}
    for placement in ("post", "pre"):
        torch.manual_seed(seed)
        stack = norm.residual_stack(16, 64, placement=placement)
        for m in stack.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_normal_(m.weight)
                nn.init.zeros_(m.bias)
        head = nn.Linear(64, 100)
        x = torch.randn(8, 8, 64)
        target = torch.randint(100, (8, 8))
        F.cross_entropy(head(stack(x)).flatten(0, 1), target.flatten()).backward()
        grads[placement] = torch.tensor(
            [stack[i].sublayer[2].weight.grad.norm().item() for i in range(16)]
        )
    ratio = grads["post"] / grads["pre"]
    assert (ratio > 1).all()
    assert ratio[0] < 1.2 and ratio[-1] > 1.7


def _first_adam_step(placement: str, depth: int, seed: int) -> tuple[float, float]:
    """Chapter 06's measurement: one AdamW step (lr 1e-3) from the Xavier-initialized
    stack; the last block's update norm and the relative change of the output."""
    torch.manual_seed(seed)
    stack = norm.residual_stack(depth, 64, placement=placement)
    for m in stack.modules():
        if isinstance(m, nn.Linear):
            nn.init.xavier_normal_(m.weight)
            nn.init.zeros_(m.bias)
    head = nn.Linear(64, 100)
    x = torch.randn(8, 8, 64)
    target = torch.randint(100, (8, 8))
    with torch.no_grad():
        before = stack(x)
    weight = stack[depth - 1].sublayer[2].weight
    weight_before = weight.detach().clone()
    F.cross_entropy(head(stack(x)).flatten(0, 1), target.flatten()).backward()
    torch.optim.AdamW(stack.parameters(), lr=1e-3, weight_decay=0.0).step()
    with torch.no_grad():
        change = ((stack(x) - before).norm() / before.norm()).item()
    return (weight.detach() - weight_before).norm().item(), change


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_adams_first_step_ignores_the_gradient_and_post_ln_amplifies_it(
    seed: int,
) -> None:
    """Adam's first update is lr * sign(g): lr * sqrt(n) for n weights, in both
    placements, although Post-LN's gradient is about twice Pre-LN's at depth 16; the
    same step moves a deep Post-LN stack's output more (Liu et al., 2020)."""
    moved = {}
    for placement in ("post", "pre"):
        updates, moved[placement] = zip(
            *(_first_adam_step(placement, n, seed) for n in (2, 4, 16, 32)),
            strict=True,
        )
        for u in updates:
            assert abs(u / (1e-3 * math.sqrt(64 * 256)) - 1) < 1e-3
    ratio = [a / b for a, b in zip(moved["post"], moved["pre"], strict=True)]
    assert ratio[0] < 1.1 and ratio[2] > 1.5 and ratio[3] > 1.5
    assert ratio[1] < 1.2  # small at depth 4, the capstone's depth
    assert moved["post"][0] < moved["post"][1] < moved["post"][2] < moved["post"][3]


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_later_pre_ln_blocks_change_the_residual_stream_less(seed: int) -> None:
    torch.manual_seed(seed)
    stack = norm.residual_stack(32, 64, placement="pre")
    for m in stack.modules():
        if isinstance(m, nn.Linear):
            nn.init.xavier_normal_(m.weight)
            nn.init.zeros_(m.bias)
    h, shares = torch.randn(8, 8, 64), []
    with torch.no_grad():
        for block in list(stack)[:32]:
            out = block(h)
            shares.append(((out - h).norm() / h.norm()).item())
            h = out
    assert shares[-1] < shares[0] / 2
