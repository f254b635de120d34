"""Tests for companion.extension: ALiBi and RoPE context extension.

Oracles: Hugging Face transformers' ROPE_INIT_FUNCTIONS (linear, dynamic, yarn, llama3)
    on
several configurations, float64 loops written from the papers' formulas, ALiBi slopes
from the paper's rule and published constants, and BLOOM's build_alibi_tensor.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from companion import checks
from companion.extension import (
    alibi_bias,
    alibi_slopes,
    dynamic_ntk_frequencies,
    linear_scaling_frequencies,
    llama3_frequencies,
    ntk_aware_base,
    ntk_scaling_frequencies,
    rope_wavelengths,
    yarn_attention_factor,
    yarn_correction_range,
    yarn_frequencies,
    yarn_ramp,
)
from companion.rope import rope_frequencies

transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402


def hf_config(
    head_dim: int, max_position_embeddings: int, rope_parameters: dict
) -> LlamaConfig:
    """A small LlamaConfig built in code (no download) carrying the RoPE parameters."""
    return LlamaConfig(
        hidden_size=head_dim * 2,
        num_attention_heads=2,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        rope_parameters=dict(rope_parameters),
    )


def assert_matches_hf(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    # HF computes in float32; ours in float64. Compare at float32 precision.
    assert theirs.shape == ours.shape
    torch.testing.assert_close(ours, theirs.to(torch.float64), rtol=2e-6, atol=0.0)


# ---- oracle tests: HF transformers ---------------------------------------------------

CONFIGS = [
    # head_dim, base, factor, original length
    (64, 10000.0, 2.0, 2048),
    (128, 10000.0, 4.0, 4096),
    (128, 500000.0, 8.0, 8192),
    (96, 1000000.0, 16.0, 32768),
    (32, 10000.0, 1.0, 512),
]


@pytest.mark.parametrize(("head_dim", "base", "factor", "n0"), CONFIGS)
def test_linear_matches_hf(head_dim: int, base: float, factor: float, n0: int) -> None:
    cfg = hf_config(
        head_dim, n0, {"rope_type": "linear", "rope_theta": base, "factor": factor}
    )
    theirs, attn = ROPE_INIT_FUNCTIONS["linear"](cfg, "cpu")
    assert attn == 1.0
    assert_matches_hf(
        linear_scaling_frequencies(head_dim, base=base, factor=factor), theirs
    )


@pytest.mark.parametrize(("head_dim", "base", "factor", "n0"), CONFIGS)
@pytest.mark.parametrize("seq_fraction", [0.25, 1.0, 1.5, 3.0, 10.0])
def test_dynamic_matches_hf(
    head_dim: int, base: float, factor: float, n0: int, seq_fraction: float
) -> None:
    seq_len = max(1, int(seq_fraction * n0))
    cfg = hf_config(
        head_dim, n0, {"rope_type": "dynamic", "rope_theta": base, "factor": factor}
    )
    theirs, attn = ROPE_INIT_FUNCTIONS["dynamic"](cfg, "cpu", seq_len=seq_len)
    assert attn == 1.0
    ours = dynamic_ntk_frequencies(
        head_dim,
        base=base,
        factor=factor,
        original_max_position_embeddings=n0,
        seq_len=seq_len,
    )
    assert_matches_hf(ours, theirs)


@pytest.mark.parametrize(("head_dim", "base", "factor", "n0"), CONFIGS)
@pytest.mark.parametrize(
    ("beta_fast", "beta_slow"), [(32.0, 1.0), (16.0, 2.0), (4.0, 4.0)]
)
@pytest.mark.parametrize("truncate", [True, False])
def test_yarn_matches_hf(
    head_dim: int,
    base: float,
    factor: float,
    n0: int,
    beta_fast: float,
    beta_slow: float,
    truncate: bool,
) -> None:
    params = {
        "rope_type": "yarn",
        "rope_theta": base,
        "factor": factor,
        "original_max_position_embeddings": n0,
        "beta_fast": beta_fast,
        "beta_slow": beta_slow,
        "truncate": truncate,
    }
    cfg = hf_config(head_dim, int(n0 * factor), params)
    theirs, attn = ROPE_INIT_FUNCTIONS["yarn"](cfg, "cpu")
    ours, ours_attn = yarn_frequencies(
        head_dim,
        base=base,
        factor=factor,
        original_max_position_embeddings=n0,
        beta_fast=beta_fast,
        beta_slow=beta_slow,
        truncate=truncate,
    )
    assert_matches_hf(ours, theirs)
    assert ours_attn == pytest.approx(attn, rel=1e-12)


@pytest.mark.parametrize(("head_dim", "base", "factor", "n0"), CONFIGS)
@pytest.mark.parametrize(("low", "high"), [(1.0, 4.0), (2.0, 8.0), (0.5, 32.0)])
def test_llama3_matches_hf(
    head_dim: int, base: float, factor: float, n0: int, low: float, high: float
) -> None:
    params = {
        "rope_type": "llama3",
        "rope_theta": base,
        "factor": factor,
        "low_freq_factor": low,
        "high_freq_factor": high,
        "original_max_position_embeddings": n0,
    }
    cfg = hf_config(head_dim, int(n0 * max(factor, 2.0)), params)
    theirs, attn = ROPE_INIT_FUNCTIONS["llama3"](cfg, "cpu")
    assert attn == 1.0
    ours = llama3_frequencies(
        head_dim,
        base=base,
        factor=factor,
        low_freq_factor=low,
        high_freq_factor=high,
        original_max_position_embeddings=n0,
    )
    assert_matches_hf(ours, theirs)


def test_llama3_defaults_are_llama31() -> None:
    # Meta's Llama 3.1 config: head_dim 128, base 500000, factor 8, 1, 4, 8192.
    params = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    theirs, _ = ROPE_INIT_FUNCTIONS["llama3"](hf_config(128, 131072, params), "cpu")
    assert_matches_hf(llama3_frequencies(128), theirs)


# ---- oracle tests: formulas written out in float64 loops -----------------------------


def test_ntk_base_formula_and_endpoints() -> None:
    for d, b, s in [(64, 10000.0, 4.0), (128, 500000.0, 8.0), (4, 10.0, 2.0)]:
        nb = ntk_aware_base(b, s, d)
        assert nb == pytest.approx(b * s ** (d / (d - 2)), rel=1e-15)
        ratio = ntk_scaling_frequencies(d, base=b, factor=s) / rope_frequencies(
            d, base=b
        )
        assert ratio[0].item() == pytest.approx(
            1.0, abs=1e-15
        )  # highest frequency untouched
        assert ratio[-1].item() == pytest.approx(
            1 / s, rel=1e-12
        )  # lowest slowed like PI
        expected = torch.tensor(
            [s ** (-2 * i / (d - 2)) for i in range(d // 2)], dtype=torch.float64
        )
        torch.testing.assert_close(ratio, expected, rtol=1e-12, atol=0.0)


def test_dynamic_is_original_up_to_training_length_and_ntk_at_factor_times() -> None:
    d, b, s, n0 = 64, 10000.0, 4.0, 1024
    theta = rope_frequencies(d, base=b)
    for n in (1, 100, n0):
        got = dynamic_ntk_frequencies(
            d, base=b, factor=s, original_max_position_embeddings=n0, seq_len=n
        )
        torch.testing.assert_close(got, theta, rtol=1e-14, atol=0.0)
    at_target = dynamic_ntk_frequencies(
        d, base=b, factor=s, original_max_position_embeddings=n0, seq_len=int(s * n0)
    )
    # s * (s n0)/n0 - (s - 1) = s^2 - s + 1: dynamic overshoots the static NTK factor
    torch.testing.assert_close(
        at_target,
        ntk_scaling_frequencies(d, base=b, factor=s * s - s + 1),
        rtol=1e-14,
        atol=0.0,
    )


def test_yarn_ramp_loop_oracle() -> None:
    d, b, n0 = 128, 10000.0, 4096
    for fast, slow in [(32.0, 1.0), (8.0, 2.0)]:
        low = d * math.log(n0 / (fast * 2 * math.pi)) / (2 * math.log(b))
        high = d * math.log(n0 / (slow * 2 * math.pi)) / (2 * math.log(b))
        low, high = max(math.floor(low), 0), min(math.ceil(high), d - 1)
        expected = [min(1.0, max(0.0, (i - low) / (high - low))) for i in range(d // 2)]
        got = yarn_ramp(
            d,
            base=b,
            original_max_position_embeddings=n0,
            beta_fast=fast,
            beta_slow=slow,
        )
        torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64))
        assert yarn_correction_range(
            d,
            base=b,
            original_max_position_embeddings=n0,
            beta_fast=fast,
            beta_slow=slow,
        ) == (float(low), float(high))


def test_yarn_pairs_with_many_rotations_are_untouched() -> None:
    d, b, n0, s = 128, 10000.0, 4096, 16.0
    theta = rope_frequencies(d, base=b)
    inv, attn = yarn_frequencies(
        d, base=b, factor=s, original_max_position_embeddings=n0
    )
    rotations = (
        n0 * theta / (2 * math.pi)
    )  # turns of each pair over the training length
    untouched = (
        rotations > 32 * 2
    )  # well above beta_fast (the truncation widens the ramp by one)
    assert untouched.any()
    torch.testing.assert_close(inv[untouched], theta[untouched], rtol=0.0, atol=0.0)
    fully = rotations < 0.5
    assert fully.any()
    torch.testing.assert_close(inv[fully], theta[fully] / s, rtol=1e-14, atol=0.0)
    assert attn == pytest.approx(0.1 * math.log(s) + 1)


def test_yarn_attention_factor_values() -> None:
    assert yarn_attention_factor(1.0) == 1.0
    assert yarn_attention_factor(0.5) == 1.0
    assert yarn_attention_factor(math.e) == pytest.approx(1.1)
    assert yarn_attention_factor(16.0) == pytest.approx(1 + 0.1 * math.log(16.0))
    _, fixed = yarn_frequencies(
        32, factor=4.0, original_max_position_embeddings=512, attention_factor=1.5
    )
    assert fixed == 1.5


def test_llama3_bands_from_the_definition() -> None:
    d, b, s, lo, hi, n0 = 128, 500000.0, 8.0, 1.0, 4.0, 8192
    theta = rope_frequencies(d, base=b)
    got = llama3_frequencies(
        d,
        base=b,
        factor=s,
        low_freq_factor=lo,
        high_freq_factor=hi,
        original_max_position_embeddings=n0,
    )
    expected = []
    for t in theta.tolist():
        wavelength = 2 * math.pi / t
        if wavelength < n0 / hi:
            expected.append(t)
        elif wavelength > n0 / lo:
            expected.append(t / s)
        else:
            mu = (n0 / wavelength - lo) / (hi - lo)
            expected.append((1 - mu) * t / s + mu * t)
    torch.testing.assert_close(
        got, torch.tensor(expected, dtype=torch.float64), rtol=1e-14, atol=0.0
    )


def test_wavelengths() -> None:
    theta = rope_frequencies(16)
    torch.testing.assert_close(
        rope_wavelengths(theta) * theta, torch.full_like(theta, 2 * math.pi)
    )


# ---- ALiBi ---------------------------------------------------------------------------


def reference_slopes(n: int) -> list[float]:
    """Press et al.'s get_slopes, written out from the paper's rule (independent "
    "oracle)."""

    def power_of_2(k: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(k) - 3)))
        return [start * start**i for i in range(k)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + reference_slopes(2 * closest)[0::2][: n - closest]


PUBLISHED = {
    8: [2.0**-k for k in range(1, 9)],
    12: [2.0**-k for k in range(1, 9)] + [2.0**-0.5, 2.0**-1.5, 2.0**-2.5, 2.0**-3.5],
    16: [2.0 ** (-k / 2) for k in range(1, 17)],
    32: [2.0 ** (-k / 4) for k in range(1, 33)],
}


@pytest.mark.parametrize("num_heads", sorted(PUBLISHED))
def test_alibi_published_constants(num_heads: int) -> None:
    got = alibi_slopes(num_heads, dtype=torch.float64)
    torch.testing.assert_close(
        got, torch.tensor(PUBLISHED[num_heads], dtype=torch.float64)
    )


@pytest.mark.parametrize(
    "num_heads", [1, 2, 3, 5, 6, 7, 8, 12, 16, 20, 24, 32, 40, 64, 71, 96]
)
def test_alibi_slopes_match_reference_and_bloom(num_heads: int) -> None:
    """Against the paper's rule and BLOOM's public ``build_alibi_tensor``.

    For one sequence of n tokens BLOOM's tensor is ``slope_h * j`` at key j, so key 1
    holds the slopes themselves."""
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    got = alibi_slopes(num_heads, dtype=torch.float64)
    torch.testing.assert_close(
        got, torch.tensor(reference_slopes(num_heads), dtype=torch.float64)
    )
    bloom = build_alibi_tensor(torch.ones(1, 3), num_heads, torch.float32)  # (H, 1, 3)
    torch.testing.assert_close(
        alibi_slopes(num_heads), bloom[:, 0, 1], rtol=1e-6, atol=0
    )


def test_alibi_bias_matches_bloom_after_softmax() -> None:
    # BLOOM adds m * j (not -m (i - j)); the two differ by m * i, constant along each
    # row, so
    # the attention weights agree once the causal mask is applied.
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    h, n = 12, 9
    bloom = build_alibi_tensor(torch.ones(1, n), h, torch.float64).reshape(h, 1, n)
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    scores = torch.randn(
        h, n, n, dtype=torch.float64, generator=torch.Generator().manual_seed(0)
    )
    theirs = torch.softmax((scores + bloom).masked_fill(~causal, float("-inf")), dim=-1)
    ours = torch.softmax(scores + alibi_bias(h, n, n, dtype=torch.float64), dim=-1)
    torch.testing.assert_close(ours, theirs)


def test_alibi_bias_loop_oracle_with_cache_offset() -> None:
    h, q, k = 6, 3, 7
    slopes = reference_slopes(h)
    got = alibi_bias(h, q, k, dtype=torch.float64)
    for head in range(h):
        for i in range(q):
            pos = i + k - q
            for j in range(k):
                want = -slopes[head] * (pos - j) if j <= pos else -math.inf
                assert got[head, i, j].item() == want
    sym = alibi_bias(h, q, k, is_causal=False, dtype=torch.float64)
    assert sym[0, 0, k - 1].item() == pytest.approx(-slopes[0] * (k - 1 - (k - q)))


def test_alibi_bias_in_sdpa(device: torch.device) -> None:
    gen = torch.Generator().manual_seed(1)
    b, h, n, d = 2, 4, 6, 8
    q, k, v = (torch.randn(b, h, n, d, generator=gen).to(device) for _ in range(3))
    bias = alibi_bias(h, n, n, device=device)
    assert bias.device.type == device.type
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d) + bias
    torch.testing.assert_close(out, torch.softmax(scores, -1) @ v, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_alibi_dtype_and_device(dtype: torch.dtype, device: torch.device) -> None:
    slopes = alibi_slopes(12, dtype=dtype, device=device)
    bias = alibi_bias(12, 4, 4, dtype=dtype, device=device)
    assert slopes.dtype == dtype and bias.dtype == dtype
    assert slopes.device.type == device.type and bias.device.type == device.type
    torch.testing.assert_close(
        slopes.double().cpu(), alibi_slopes(12, dtype=torch.float64), rtol=1e-2, atol=0
    )


# ---- property tests ------------------------------------------------------------------

dims = st.sampled_from([4, 8, 16, 32, 64, 128])
bases = st.sampled_from([100.0, 10000.0, 500000.0])
factors = st.floats(min_value=1.0, max_value=64.0, allow_nan=False)


@given(d=dims, b=bases, s=factors)
def test_every_method_only_slows_frequencies(d: int, b: float, s: float) -> None:
    theta = rope_frequencies(d, base=b)
    n0 = 2048
    methods = [
        linear_scaling_frequencies(d, base=b, factor=s),
        ntk_scaling_frequencies(d, base=b, factor=s),
        yarn_frequencies(d, base=b, factor=s, original_max_position_embeddings=n0)[0],
        llama3_frequencies(d, base=b, factor=s, original_max_position_embeddings=n0),
        dynamic_ntk_frequencies(
            d, base=b, factor=s, original_max_position_embeddings=n0, seq_len=3 * n0
        ),
    ]
    for inv in methods:
        ratio = inv / theta
        assert bool((ratio <= 1 + 1e-12).all()), (
            "a scaled frequency is faster than the original"
        )
    # no static method slows a pair by more than the factor (dynamic does, past s * n0)
    for inv in methods[:4]:
        assert bool((inv / theta >= 1 / s - 1e-12).all())


@given(d=dims, b=bases, s=factors, n0=st.sampled_from([256, 2048, 8192]))
def test_ratio_is_monotone_in_the_pair_index(
    d: int, b: float, s: float, n0: int
) -> None:
    # high-frequency pairs are never slowed more than low-frequency pairs
    theta = rope_frequencies(d, base=b)
    for inv in [
        ntk_scaling_frequencies(d, base=b, factor=s),
        yarn_frequencies(d, base=b, factor=s, original_max_position_embeddings=n0)[0],
        llama3_frequencies(d, base=b, factor=s, original_max_position_embeddings=n0),
    ]:
        ratio = inv / theta
        assert bool((ratio[1:] <= ratio[:-1] + 1e-12).all())


@given(d=dims)
def test_factor_one_is_the_identity(d: int) -> None:
    theta = rope_frequencies(d)
    for inv in [
        linear_scaling_frequencies(d, factor=1.0),
        ntk_scaling_frequencies(d, factor=1.0),
        yarn_frequencies(d, factor=1.0, original_max_position_embeddings=1024)[0],
        llama3_frequencies(
            d, base=10000.0, factor=1.0, original_max_position_embeddings=1024
        ),
    ]:
        torch.testing.assert_close(inv, theta, rtol=1e-14, atol=0.0)
    assert (
        yarn_frequencies(d, factor=1.0, original_max_position_embeddings=1024)[1] == 1.0
    )


@given(h=st.integers(min_value=1, max_value=200))
def test_alibi_slopes_properties(h: int) -> None:
    m = alibi_slopes(h, dtype=torch.float64)
    assert m.shape == (h,)
    assert bool(((m > 0) & (m < 1)).all())
    assert len(set(m.tolist())) == h  # every head has its own slope
    closest = 2 ** math.floor(math.log2(h))
    # the first `closest` heads form a decreasing geometric sequence with ratio = first
    # slope
    head = m[:closest]
    torch.testing.assert_close(
        head[1:] / head[:-1],
        torch.full((closest - 1,), head[0].item(), dtype=torch.float64),
    )


@given(h=st.integers(1, 16), q=st.integers(1, 12), extra=st.integers(0, 6))
def test_alibi_bias_is_relative(h: int, q: int, extra: int) -> None:
    k = q + extra
    bias = alibi_bias(h, q, k, dtype=torch.float64)
    big = alibi_bias(h, q + 5, k + 5, dtype=torch.float64)
    # shifting every position by 5 leaves the bias of the last q queries unchanged
    torch.testing.assert_close(big[:, 5:, 5:], bias)
    assert bool(
        (bias[..., -1][:, -1] == 0).all()
    )  # the newest query sees itself with bias 0


# ---- validation table ----------------------------------------------------------------

N0 = {"original_max_position_embeddings": 512}

# (public name, call, exception, message): the bad-input contract, also run by
# tests/test_contract.py for every name in companion.extension.__all__
BAD_INPUTS = [
    (
        "yarn_correction_range",
        lambda: yarn_correction_range(
            8, original_max_position_embeddings=16, beta_fast=32.0, beta_slow=1e-320
        ),
        ValueError,
        "beta_slow must give a finite correction dimension",
    ),
    (
        "yarn_ramp",
        lambda: yarn_ramp(8, original_max_position_embeddings=16, beta_fast=1e308),
        ValueError,
        "beta_fast must give a finite correction dimension",
    ),
    (
        "linear_scaling_frequencies",
        lambda: linear_scaling_frequencies(64, factor=0.5),
        ValueError,
        r"factor must be a real number >= 1, got 0.5",
    ),
    (
        "linear_scaling_frequencies",
        lambda: linear_scaling_frequencies(63, factor=2.0),
        ValueError,
        r"head_dim must be an even int, got 63",
    ),
    (
        "linear_scaling_frequencies",
        lambda: linear_scaling_frequencies(64.0, factor=2.0),
        TypeError,
        r"head_dim must be an even int, got 64.0",
    ),
    (
        "linear_scaling_frequencies",
        lambda: linear_scaling_frequencies(64, factor=2.0, base=1.0),
        ValueError,
        r"base must be a real number > 1, got 1.0",
    ),
    (
        "linear_scaling_frequencies",
        lambda: linear_scaling_frequencies(64, factor="2"),
        TypeError,
        r"factor must be a real number, got '2'",
    ),
    (
        "linear_scaling_frequencies",
        lambda: linear_scaling_frequencies(64, factor=2 + 0j),
        TypeError,
        r"factor must be a real number, got \(2\+0j\)",
    ),
    (
        "linear_scaling_frequencies",
        lambda: linear_scaling_frequencies(64, factor=math.inf),
        ValueError,
        r"factor must be a finite real number, got inf",
    ),
    (
        "ntk_aware_base",
        lambda: ntk_aware_base(10000.0, 0.9, 64),
        ValueError,
        r"factor must be a real number >= 1, got 0.9",
    ),
    (
        "ntk_aware_base",
        lambda: ntk_aware_base(10000.0, 2.0, 2),
        ValueError,
        r"head_dim must be an even int >= 4, got 2",
    ),
    (
        "ntk_aware_base",
        lambda: ntk_aware_base(10000.0, 1e308, 64),
        ValueError,
        r"factor must be small enough for base \* factor \*\* \(D/\(D-2\)\) to be a "
        r"finite float, got factor=1e\+308",
    ),
    (
        "ntk_aware_base",
        lambda: ntk_aware_base(None, 2.0, 64),
        TypeError,
        r"base must be a real number, got None",
    ),
    (
        "ntk_scaling_frequencies",
        lambda: ntk_scaling_frequencies(64, factor=0.0),
        ValueError,
        r"factor must be a real number >= 1, got 0.0",
    ),
    (
        "ntk_scaling_frequencies",
        lambda: ntk_scaling_frequencies(True, factor=2.0),
        TypeError,
        r"head_dim must be an even int, got True",
    ),
    (
        "dynamic_ntk_frequencies",
        lambda: dynamic_ntk_frequencies(
            64, factor=2.0, original_max_position_embeddings=0, seq_len=10
        ),
        ValueError,
        r"original_max_position_embeddings must be a positive int, got 0",
    ),
    (
        "dynamic_ntk_frequencies",
        lambda: dynamic_ntk_frequencies(
            64, factor=2.0, original_max_position_embeddings=10, seq_len=-1
        ),
        ValueError,
        r"seq_len must be an int >= 0, got -1",
    ),
    (
        "dynamic_ntk_frequencies",
        lambda: dynamic_ntk_frequencies(
            64, factor=2.0, original_max_position_embeddings=10, seq_len=2.5
        ),
        TypeError,
        r"seq_len must be an int, got 2.5",
    ),
    (
        "dynamic_ntk_frequencies",
        lambda: dynamic_ntk_frequencies(
            2, factor=2.0, original_max_position_embeddings=10, seq_len=5
        ),
        ValueError,
        r"head_dim must be an even int >= 4, got 2",
    ),
    (
        "yarn_correction_range",
        lambda: yarn_correction_range(64, beta_fast=1.0, beta_slow=32.0, **N0),
        ValueError,
        r"beta_fast must be >= beta_slow, got beta_fast=1, beta_slow=32",
    ),
    (
        "yarn_correction_range",
        lambda: yarn_correction_range(64, beta_slow=0.0, **N0),
        ValueError,
        r"beta_slow must be a real number > 0, got 0.0",
    ),
    (
        "yarn_correction_range",
        lambda: yarn_correction_range(64, original_max_position_embeddings=512.0),
        TypeError,
        r"original_max_position_embeddings must be an int, got 512.0",
    ),
    (
        "yarn_correction_range",
        lambda: yarn_correction_range(64, truncate="no", **N0),
        TypeError,
        r"truncate must be a bool, got 'no'",
    ),
    (
        "yarn_frequencies",
        lambda: yarn_frequencies(64, factor=4.0, beta_slow=0.0, **N0),
        ValueError,
        r"beta_slow must be a real number > 0, got 0.0",
    ),
    (
        "yarn_frequencies",
        lambda: yarn_frequencies(64, factor=0.5, **N0),
        ValueError,
        r"factor must be a real number >= 1, got 0.5",
    ),
    (
        "yarn_frequencies",
        lambda: yarn_frequencies(64, factor=2.0, attention_factor=-1.0, **N0),
        ValueError,
        r"attention_factor must be a real number > 0, got -1.0",
    ),
    (
        "yarn_frequencies",
        lambda: yarn_frequencies(64, factor=2.0, base=0.5, **N0),
        ValueError,
        r"base must be a real number > 1, got 0.5",
    ),
    (
        "yarn_ramp",
        lambda: yarn_ramp(64, truncate=1, **N0),
        TypeError,
        r"truncate must be a bool, got 1",
    ),
    (
        "yarn_ramp",
        lambda: yarn_ramp(0, **N0),
        ValueError,
        r"head_dim must be a positive even int, got 0",
    ),
    (
        "yarn_attention_factor",
        lambda: yarn_attention_factor(0.0),
        ValueError,
        r"factor must be a real number > 0, got 0.0",
    ),
    (
        "yarn_attention_factor",
        lambda: yarn_attention_factor(torch.tensor([2.0])),
        TypeError,
        r"factor must be a real number, got a tensor of dtype torch.float32",
    ),
    (
        "llama3_frequencies",
        lambda: llama3_frequencies(128, factor=0.5),
        ValueError,
        r"factor must be a real number >= 1, got 0.5",
    ),
    (
        "llama3_frequencies",
        lambda: llama3_frequencies(128, low_freq_factor=4.0, high_freq_factor=1.0),
        ValueError,
        r"high_freq_factor must be > low_freq_factor, got high_freq_factor=1, "
        r"low_freq_factor=4",
    ),
    (
        "llama3_frequencies",
        lambda: llama3_frequencies(128, low_freq_factor=0.0),
        ValueError,
        r"low_freq_factor must be a real number > 0, got 0.0",
    ),
    (
        "llama3_frequencies",
        lambda: llama3_frequencies(128, original_max_position_embeddings=0),
        ValueError,
        r"original_max_position_embeddings must be a positive int, got 0",
    ),
    (
        "alibi_slopes",
        lambda: alibi_slopes(0),
        ValueError,
        r"num_heads must be a positive int, got 0",
    ),
    (
        "alibi_slopes",
        lambda: alibi_slopes(-4),
        ValueError,
        r"num_heads must be a positive int, got -4",
    ),
    (
        "alibi_slopes",
        lambda: alibi_slopes(8.0),
        TypeError,
        r"num_heads must be an int, got 8.0",
    ),
    (
        "alibi_slopes",
        lambda: alibi_slopes(True),
        TypeError,
        r"num_heads must be an int, got True",
    ),
    # an integer dtype would round every slope (all below 1) to 0: refused
    (
        "alibi_slopes",
        lambda: alibi_slopes(8, dtype=torch.int64),
        TypeError,
        r"dtype must be a floating torch.dtype, got torch.int64",
    ),
    (
        "alibi_slopes",
        lambda: alibi_slopes(8, dtype=torch.complex64),
        TypeError,
        r"dtype must be a floating torch.dtype, got torch.complex64",
    ),
    (
        "alibi_slopes",
        lambda: alibi_slopes(8, dtype="float32"),
        TypeError,
        r"dtype must be a torch.dtype such as torch.float32, got the string 'float32'",
    ),
    (
        "alibi_slopes",
        lambda: alibi_slopes(8, device="cuda:9"),
        ValueError,
        r"device must be a device this machine has, got 'cuda:9'",
    ),
    (
        "alibi_slopes",
        lambda: alibi_slopes(8, device="meta"),
        ValueError,
        r"device must be a 'cpu', 'cuda' or 'mps' device, got device 'meta'",
    ),
    (
        "alibi_bias",
        lambda: alibi_bias(0, 4, 4),
        ValueError,
        r"num_heads must be a positive int, got 0",
    ),
    (
        "alibi_bias",
        lambda: alibi_bias(4, 5, 4),
        ValueError,
        r"key_length must be >= query_length .*, got key_length=4, query_length=5",
    ),
    (
        "alibi_bias",
        lambda: alibi_bias(4, -1, 4),
        ValueError,
        r"query_length must be an int >= 0, got -1",
    ),
    (
        "alibi_bias",
        lambda: alibi_bias(4, 4, 4, dtype=torch.int64),
        TypeError,
        r"dtype must be a floating torch.dtype, got torch.int64",
    ),
    (
        "alibi_bias",
        lambda: alibi_bias(4, 4, 4, dtype="bfloat16"),
        TypeError,
        r"dtype must be a torch.dtype such as torch.bfloat16, got the string "
        r"'bfloat16'",
    ),
    (
        "alibi_bias",
        lambda: alibi_bias(4, 4, 4, is_causal=None),
        TypeError,
        r"is_causal must be a bool, got None",
    ),
    (
        "alibi_bias",
        lambda: alibi_bias(4, 4, 4, is_causal=1),
        TypeError,
        r"is_causal must be a bool, got 1",
    ),
    (
        "alibi_bias",
        lambda: alibi_bias(4, 4, 4, device="cuda:9"),
        ValueError,
        r"device must be a device this machine has",
    ),
    (
        "rope_wavelengths",
        lambda: rope_wavelengths(torch.tensor([1.0, 0.0])),
        ValueError,
        r"frequencies must all be positive, got values down to 0",
    ),
    (
        "rope_wavelengths",
        lambda: rope_wavelengths(torch.tensor([1.0, math.nan])),
        ValueError,
        r"frequencies must all be positive",
    ),
    (
        "rope_wavelengths",
        lambda: rope_wavelengths([1.0]),
        TypeError,
        r"frequencies must be a torch.Tensor, got a list",
    ),
    (
        "rope_wavelengths",
        lambda: rope_wavelengths(torch.tensor([1, 2])),
        TypeError,
        r"frequencies must be a floating-point tensor, got a tensor of dtype "
        r"torch.int64",
    ),
    (
        "rope_wavelengths",
        lambda: rope_wavelengths(torch.tensor([1j])),
        TypeError,
        r"frequencies must be a floating-point tensor, got a tensor of dtype "
        r"torch.complex64",
    ),
    (
        "rope_wavelengths",
        lambda: rope_wavelengths(torch.ones(2, device="meta")),
        ValueError,
        r"frequencies must hold values, got a tensor on the 'meta' device",
    ),
]


@pytest.mark.parametrize(
    ("name", "call", "error", "match"),
    BAD_INPUTS,
    ids=[f"{row[0]}-{i}" for i, row in enumerate(BAD_INPUTS)],
)
def test_bad_input(name, call, error, match) -> None:
    with pytest.raises(error, match=match):
        call()


def test_every_public_name_has_a_bad_input_case() -> None:
    from companion import extension

    assert set(extension.__all__) <= {row[0] for row in BAD_INPUTS}


def test_empty_inputs_give_the_empty_answer() -> None:
    assert alibi_bias(4, 0, 0).shape == (4, 0, 0)
    assert alibi_bias(4, 0, 5).shape == (4, 0, 5)
    assert rope_wavelengths(torch.zeros(0)).shape == (0,)
    theta = rope_frequencies(16)
    got = dynamic_ntk_frequencies(
        16, factor=4.0, original_max_position_embeddings=8, seq_len=0
    )
    torch.testing.assert_close(got, theta, rtol=1e-14, atol=0.0)


@given(
    d=st.integers(2, 64).map(lambda n: 2 * n),
    b=st.one_of(st.floats(1.5, 1e7), st.integers(2, 10**7)),
    s=st.one_of(st.floats(1.0, 1e3), st.integers(1, 1000)),
    n0=st.integers(1, 10**6),
    seq_len=st.integers(0, 10**7),
    fast=st.floats(1.0, 64.0),
    slow=st.floats(0.01, 1.0),
    truncate=st.booleans(),
    low=st.floats(0.01, 8.0),
    gap=st.floats(0.01, 32.0),
    heads=st.integers(1, 128),
    lengths=st.tuples(st.integers(0, 12), st.integers(0, 6)),
    is_causal=st.booleans(),
    dtype=st.sampled_from(
        [torch.float32, torch.float64, torch.bfloat16, torch.float16]
    ),
)
def test_valid_random_inputs_never_raise(
    d,
    b,
    s,
    n0,
    seq_len,
    fast,
    slow,
    truncate,
    low,
    gap,
    heads,
    lengths,
    is_causal,
    dtype,
) -> None:
    beta = {"beta_fast": fast, "beta_slow": slow, "truncate": truncate}
    outs = [
        linear_scaling_frequencies(d, base=b, factor=s),
        ntk_scaling_frequencies(d, base=b, factor=s),
        dynamic_ntk_frequencies(
            d, base=b, factor=s, original_max_position_embeddings=n0, seq_len=seq_len
        ),
        yarn_ramp(d, base=b, original_max_position_embeddings=n0, **beta),
        yarn_frequencies(
            d, base=b, factor=s, original_max_position_embeddings=n0, **beta
        )[0],
        llama3_frequencies(
            d,
            base=b,
            factor=s,
            low_freq_factor=low,
            high_freq_factor=low + gap,
            original_max_position_embeddings=n0,
        ),
    ]
    for out in outs:
        assert out.shape == (d // 2,) and bool(torch.isfinite(out).all())
    low_i, high_i = yarn_correction_range(
        d, base=b, original_max_position_embeddings=n0, **beta
    )
    assert 0 <= low_i and high_i <= d - 1
    assert ntk_aware_base(b, s, d) >= b and yarn_attention_factor(s) >= 1.0
    assert rope_wavelengths(outs[0]).shape == (d // 2,)
    q, extra = lengths
    assert alibi_slopes(heads, dtype=dtype).dtype == dtype
    bias = alibi_bias(heads, q, q + extra, is_causal=is_causal, dtype=dtype)
    assert bias.shape == (heads, q, q + extra) and bias.dtype == dtype


# ---- checkers: accept the reference, reject the named mistakes -----------------------


def test_check_alibi_slopes_accepts_reference() -> None:
    assert checks.check_alibi_slopes(lambda num_heads: alibi_slopes(num_heads))


def test_check_alibi_slopes_names_power_of_two_only() -> None:
    def power_of_two_only(num_heads: int) -> torch.Tensor:
        return torch.tensor(
            [2 ** (-8 * k / num_heads) for k in range(1, num_heads + 1)]
        )

    with pytest.raises(
        checks.CheckError, match="power-of-two rule for every head count"
    ) as err:
        checks.check_alibi_slopes(power_of_two_only)
    assert err.value.mistake == "power-of-two rule for every head count"


def test_check_alibi_slopes_names_not_interleaved() -> None:
    def not_interleaved(num_heads: int) -> torch.Tensor:
        closest = 2 ** math.floor(math.log2(num_heads))
        more = reference_slopes(2 * closest)[: num_heads - closest]
        return torch.tensor(reference_slopes(closest) + more)

    with pytest.raises(checks.CheckError, match="extra slopes not interleaved"):
        checks.check_alibi_slopes(not_interleaved)


def test_check_ntk_base_accepts_and_names_mistakes() -> None:
    assert checks.check_ntk_aware_base(ntk_aware_base)
    with pytest.raises(
        checks.CheckError,
        match="exponent head_dim instead of head_dim/\\(head_dim-2\\)",
    ):
        checks.check_ntk_aware_base(
            lambda base, factor, head_dim: base * factor**head_dim
        )
    with pytest.raises(checks.CheckError, match="base multiplied by the factor"):
        checks.check_ntk_aware_base(lambda base, factor, head_dim: base * factor)
    with pytest.raises(checks.CheckError, match="exponent inverted"):
        checks.check_ntk_aware_base(
            lambda base, factor, head_dim: base * factor ** ((head_dim - 2) / head_dim)
        )


def test_check_yarn_ramp_accepts_and_names_mistakes() -> None:
    assert checks.check_yarn_ramp(
        lambda d, b, n0, fast, slow: yarn_ramp(
            d,
            base=b,
            original_max_position_embeddings=n0,
            beta_fast=fast,
            beta_slow=slow,
        )
    )

    def reversed_ramp(
        head_dim, base, original_max_position_embeddings, beta_fast, beta_slow
    ):
        r = yarn_ramp(
            head_dim,
            base=base,
            original_max_position_embeddings=original_max_position_embeddings,
            beta_fast=beta_fast,
            beta_slow=beta_slow,
        )
        return 1 - r

    def untruncated(
        head_dim, base, original_max_position_embeddings, beta_fast, beta_slow
    ):
        return yarn_ramp(
            head_dim,
            base=base,
            original_max_position_embeddings=original_max_position_embeddings,
            beta_fast=beta_fast,
            beta_slow=beta_slow,
            truncate=False,
        )

    with pytest.raises(checks.CheckError, match="YaRN ramp reversed"):
        checks.check_yarn_ramp(reversed_ramp)
    with pytest.raises(
        checks.CheckError, match="correction range not rounded outwards"
    ):
        checks.check_yarn_ramp(untruncated)


def test_check_llama3_accepts_and_names_mistakes() -> None:
    assert checks.check_llama3_frequencies(
        lambda d, b, s, lo, hi, n0: llama3_frequencies(
            d,
            base=b,
            factor=s,
            low_freq_factor=lo,
            high_freq_factor=hi,
            original_max_position_embeddings=n0,
        )
    )

    def bands_swapped(
        head_dim,
        base,
        factor,
        low_freq_factor,
        high_freq_factor,
        original_max_position_embeddings,
    ):
        theta = rope_frequencies(head_dim, base=base)
        wavelength = 2 * math.pi / theta
        n0 = original_max_position_embeddings
        mu = (
            (n0 / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
        ).clamp(0, 1)
        return (
            mu * theta / factor + (1 - mu) * theta
        )  # high frequencies scaled, low kept

    def all_divided(
        head_dim,
        base,
        factor,
        low_freq_factor,
        high_freq_factor,
        original_max_position_embeddings,
    ):
        return rope_frequencies(head_dim, base=base) / factor

    def blend_reversed(
        head_dim,
        base,
        factor,
        low_freq_factor,
        high_freq_factor,
        original_max_position_embeddings,
    ):
        theta = rope_frequencies(head_dim, base=base)
        wavelength = 2 * math.pi / theta
        n0 = original_max_position_embeddings
        mu = (n0 / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
        out = mu * theta / factor + (1 - mu) * theta
        out = torch.where(wavelength < n0 / high_freq_factor, theta, out)
        return torch.where(wavelength > n0 / low_freq_factor, theta / factor, out)

    with pytest.raises(
        checks.CheckError, match="blend weights reversed in the middle band"
    ):
        checks.check_llama3_frequencies(blend_reversed)
    with pytest.raises(checks.CheckError, match="bands swapped"):
        checks.check_llama3_frequencies(bands_swapped)
    with pytest.raises(checks.CheckError, match="every pair divided by the factor"):
        checks.check_llama3_frequencies(all_divided)
