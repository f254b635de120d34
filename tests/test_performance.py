"""Tests for companion.performance: oracle tests (numpy.spacing, Hugging Face's rotary
table, torch.nn.functional), hypothesis properties, and the validation table. No test
asserts on time."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from companion.norm import layer_norm
from companion.performance import (
    ROPE_RECIPES,
    attention_flops,
    compare_timings,
    keep_freed_memory,
    max_abs_error,
    memory_traffic,
    naive_softmax_attention,
    one_pass_layer_norm,
    peak_live_bytes,
    rope_error_by_position,
    rope_table,
    tensor_bytes,
    ulp,
)
from companion.rope import apply_rope, rope_cos_sin, rope_frequencies

transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding  # noqa: E402

# ---- oracle tests --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dtype", "np_dtype"),
    [
        (torch.float32, np.float32),
        (torch.float64, np.float64),
        (torch.float16, np.float16),
    ],
)
def test_ulp_matches_numpy_spacing(dtype: torch.dtype, np_dtype: type) -> None:
    values = np.array(
        [1e-30, 1e-3, 0.7, 1.0, 3.0, 1000.5, 2.0**20, 6e4], dtype=np.float64
    )
    values = values[values < np.finfo(np_dtype).max]
    values = values.astype(
        np_dtype
    )  # numbers of that format: spacing is defined on them
    expected = np.spacing(values).astype(np.float64)
    got = ulp(torch.from_numpy(values.astype(np.float64)), dtype=dtype).numpy()
    np.testing.assert_array_equal(got, expected)


def test_ulp_bfloat16_and_subnormals() -> None:
    # bfloat16 keeps 8 significant bits: spacing 2**-7 in [1, 2), 2**13 at 2**20
    assert ulp(1.5, dtype=torch.bfloat16).item() == 2.0**-7
    assert ulp(2.0**20, dtype=torch.bfloat16).item() == 2.0**13
    # below the smallest normal float32 the spacing is that of the subnormals
    assert ulp(0.0).item() == ulp(1e-42).item() == 2.0**-149
    nxt = torch.nextafter(torch.tensor(1.0), torch.tensor(2.0)) - 1.0
    assert ulp(1.0).item() == nxt.item()


def test_rope_table_float32_angles_is_hugging_face() -> None:
    head_dim = 64
    positions = torch.tensor([0, 1, 7, 4095, 2**16 + 3, 2**20 - 1])
    config = LlamaConfig(
        hidden_size=2 * head_dim,
        num_attention_heads=2,
        head_dim=head_dim,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    x = torch.zeros(1, 1, head_dim)
    hf_cos, hf_sin = LlamaRotaryEmbedding(config)(
        x, positions[None]
    )  # (1, L, D) repeated
    cos, sin = rope_table(positions, head_dim, recipe="float32-angles")
    torch.testing.assert_close(cos, hf_cos[0, :, : head_dim // 2], rtol=0, atol=0)
    torch.testing.assert_close(sin, hf_sin[0, :, : head_dim // 2], rtol=0, atol=0)


def test_rope_table_other_recipes_are_the_package_table() -> None:
    positions = torch.arange(0, 2**20, 9973)
    freqs = rope_frequencies(32)
    cos, sin = rope_table(positions, 32, recipe="float64-angles")
    ref_cos, ref_sin = rope_cos_sin(positions, freqs)
    assert torch.equal(cos, ref_cos) and torch.equal(sin, ref_sin)
    cos16, sin16 = rope_table(positions, 32, recipe="bfloat16-table")
    assert cos16.dtype == sin16.dtype == torch.bfloat16
    assert torch.equal(cos16, ref_cos.to(torch.bfloat16))


def test_rope_error_of_package_within_4_ulps_at_2_to_the_20() -> None:
    # the claim the appendix makes and `make bench` reports as a goal
    positions = torch.tensor([1.0, 2.0**10, 2.0**15, 2.0**20])
    errors = rope_error_by_position(positions, 128, recipe="float64-angles")
    assert errors.in_ulps().max().item() <= 4.0
    # Hugging Face's float32 angles are off by up to half of 0.125 rad at 2**20: far
    # worse
    hf = rope_error_by_position(positions, 128, recipe="float32-angles")
    assert hf.error[-1].item() > 1e-3
    assert hf.error[0].item() == errors.error[0].item()  # same table at position 1
    # a bfloat16 table errs by its own rounding (about 2**-9 relative) at every position
    bf = rope_error_by_position(positions, 128, recipe="bfloat16-table")
    assert (bf.error > 1e-4 * bf.scale).all() and (bf.error < 2.0**-6 * bf.scale).all()


def test_rope_error_reference_is_exact_rotation() -> None:
    # the float64 reference keeps each pair's length: the scale is the input's max pair
    # norm
    errors = rope_error_by_position(torch.tensor([0.0, 5.0]), 16, num_vectors=3)
    x = torch.randn(3, 16, generator=torch.Generator().manual_seed(0))
    assert errors.error[0].item() == 0.0  # position 0: cos = 1, sin = 0, exact
    assert errors.scale[0].item() == pytest.approx(x.abs().max().item())


def test_one_pass_layer_norm_matches_torch_for_small_means() -> None:
    x = torch.randn(6, 64, dtype=torch.float64)
    torch.testing.assert_close(one_pass_layer_norm(x), F.layer_norm(x, (64,)))


def test_one_pass_layer_norm_breaks_for_large_means_where_two_pass_does_not() -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(16, 256, generator=gen) + 1e3  # float32, mean 1e3, std 1
    exact = layer_norm(x.double(), 256)  # float64 on the same float32 inputs
    one_pass = max_abs_error(one_pass_layer_norm(x), exact)
    two_pass = max_abs_error(layer_norm(x, 256), exact)
    torch_ln = max_abs_error(F.layer_norm(x, (256,)), exact)
    # the rounding of the mean itself (about an ulp of 1e3) bounds any float32 algorithm
    assert two_pass <= 2 * ulp(1e3).item() and torch_ln <= 2 * ulp(1e3).item()
    assert one_pass > 100 * max(two_pass, torch_ln)
    # at mean 1e4 the one-pass variance comes out negative for some rows: NaN
    assert max_abs_error(one_pass_layer_norm(x - 1e3 + 1e4), exact) == math.inf


def test_naive_softmax_attention_matches_sdpa_then_overflows() -> None:
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 5, 8, generator=gen) for _ in range(3))
    torch.testing.assert_close(
        naive_softmax_attention(q, k, v), F.scaled_dot_product_attention(q, k, v)
    )
    big = 1000 * q  # logits in the thousands: exp overflows in float32
    out = naive_softmax_attention(big, k, v)
    assert not torch.isfinite(out).all()
    assert max_abs_error(out, F.scaled_dot_product_attention(big, k, v)) == math.inf


def test_max_abs_error_turns_a_nan_into_a_failing_error() -> None:
    """The docstring's claims: the plain max is NaN, which `err < tol` rejects but the
    negated check and Python's max over a list let through; max_abs_error gives inf."""
    approx, reference, tol = torch.tensor([0.0, math.nan, 2.0]), torch.zeros(3), 1e-5
    plain = (approx - reference).abs().max().item()
    assert math.isnan(plain) and not (plain < tol) and not (plain > tol)
    assert max([1e-7, plain]) == 1e-7  # a NaN after the first entry is skipped
    err = max_abs_error(approx, reference)
    assert err == math.inf and not (err < tol) and err > tol
    assert max([1e-7, err]) == math.inf
    assert max_abs_error(torch.tensor([1.0, -3.0]), torch.tensor([1.5, 0.0])) == 3.0


def test_tensor_bytes_and_attention_flops() -> None:
    a = torch.zeros(3, 5)
    b = torch.zeros(7, dtype=torch.bfloat16)
    assert tensor_bytes(a, b) == 3 * 5 * 4 + 7 * 2
    assert tensor_bytes() == 0
    # count the multiply-adds of the two products by hand for a tiny case
    bsz, h, n, s, d = 2, 3, 4, 5, 6
    assert attention_flops(bsz, h, n, s, d) == 2 * (2 * bsz * h * n * s * d)


def test_compare_timings_measures_every_case() -> None:
    calls = {"a": 0, "b": 0}

    def make(name: str):
        def fn() -> None:
            calls[name] += 1

        return fn

    medians = compare_timings(
        {"a": make("a"), "b": make("b")}, min_run_time=0.01, rounds=2
    )
    assert list(medians) == ["a", "b"]
    assert all(t > 0 and math.isfinite(t) for t in medians.values())
    assert calls["a"] > 2 and calls["b"] > 2  # warm-up plus at least one call per round


@pytest.mark.parametrize("requested", [None, 1, 2])
def test_compare_timings_runs_cases_with_the_requested_threads(requested) -> None:
    """torch.utils.benchmark.Timer alone runs with one thread; the caller's setting
    must hold."""
    seen: set[int] = set()

    def fn() -> None:
        seen.add(torch.get_num_threads())

    before = torch.get_num_threads()
    compare_timings({"a": fn}, min_run_time=0.01, rounds=1, num_threads=requested)
    assert seen == {before if requested is None else requested}
    assert torch.get_num_threads() == before  # restored afterwards


def test_keep_freed_memory_applies_on_glibc_only() -> None:
    import platform

    expected = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    assert keep_freed_memory(2**20) is expected
    x = torch.ones(2**19)  # 2 MiB: allocations still work and hold what was written
    assert x.clone().sum().item() == 2**19


# ---- properties ----------------------------------------------------------------------


@given(
    st.floats(min_value=1e-30, max_value=1e30, allow_nan=False, allow_infinity=False)
)
def test_ulp_brackets_the_value(x: float) -> None:
    u = ulp(x).item()
    # |x| lies in [2**k, 2**(k+1)) with ulp = 2**k * eps: eps*|x|/2 < u <= eps*|x|
    eps = torch.finfo(torch.float32).eps
    assert eps * x / 2 < u <= eps * x
    assert ulp(2 * x).item() == 2 * u  # the binade doubles, the spacing doubles
    assert ulp(-x).item() == u


@given(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False))
def test_float32_rounding_is_within_half_an_ulp(x: float) -> None:
    rounded = torch.tensor(x, dtype=torch.float64).float().double().item()
    assert abs(rounded - x) <= ulp(x).item() / 2


@given(st.sampled_from(ROPE_RECIPES), st.integers(min_value=1, max_value=8))
def test_rope_error_is_zero_at_position_zero(recipe: str, half: int) -> None:
    errors = rope_error_by_position(
        torch.tensor([0]), 2 * half, recipe=recipe, num_vectors=2
    )
    assert errors.error.item() == 0.0


# ---- bad inputs: the contract (run by tests/test_contract.py) ------------------------


def _noop() -> None:
    return None


_meta = torch.empty(3, device="meta")
_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
_errors = rope_error_by_position(torch.arange(2), 4, num_vectors=1)

NO_BAD_INPUTS = {
    "MemoryTraffic": "a record that memory_traffic fills; no argument to check"
}

BAD_INPUTS = [
    (
        "naive_softmax_attention",
        lambda: naive_softmax_attention(torch.ones(2, 4), torch.ones(3, 4), None),
        TypeError,
        "value must be a torch.Tensor, got None",
    ),
    (
        "rope_table",
        lambda: rope_table(torch.arange(4), 10**20),
        ValueError,
        "head_dim must be .* that fits in 64 bits",
    ),
    (
        "ulp",
        lambda: ulp(1.0, dtype=torch.int32),
        TypeError,
        "dtype must be a floating torch",
    ),
    (
        "ulp",
        lambda: ulp(1.0, dtype="float32"),
        TypeError,
        "dtype must be a torch.dtype such as torch.float32, got the string 'float32'",
    ),
    ("ulp", lambda: ulp("1"), TypeError, "x must be a real number, got '1'"),
    ("ulp", lambda: ulp(True), TypeError, "x must be a real number, got True"),
    ("ulp", lambda: ulp(1j), TypeError, "x must be a real number, got 1j"),
    ("ulp", lambda: ulp(math.inf), ValueError, "x must be finite"),
    ("ulp", lambda: ulp(torch.tensor([1.0, math.nan])), ValueError, "x must be finite"),
    (
        "ulp",
        lambda: ulp(torch.ones(2, dtype=torch.complex64)),
        TypeError,
        "x must be a floating or integer tensor",
    ),
    ("ulp", lambda: ulp(_meta), ValueError, "x must hold values"),
    (
        "PositionErrors.in_ulps",
        lambda: _errors.in_ulps("float32"),
        TypeError,
        "dtype must be a torch.dtype such as torch.float32",
    ),
    (
        "max_abs_error",
        lambda: max_abs_error([1.0], torch.ones(1)),
        TypeError,
        "approx must be a torch.Tensor, got a list",
    ),
    (
        "max_abs_error",
        lambda: max_abs_error(torch.ones(1), 1.0),
        TypeError,
        "reference must be a torch.Tensor, got 1.0",
    ),
    (
        "max_abs_error",
        lambda: max_abs_error(torch.ones(3), torch.ones(4)),
        ValueError,
        "approx and reference must broadcast",
    ),
    (
        "max_abs_error",
        lambda: max_abs_error(torch.ones(3, dtype=torch.complex64), torch.ones(3)),
        TypeError,
        "approx must be a floating or integer or bool tensor",
    ),
    (
        "max_abs_error",
        lambda: max_abs_error(_meta, _meta),
        ValueError,
        "approx must hold",
    ),
    pytest.param(
        "max_abs_error",
        lambda: max_abs_error(torch.ones(3), torch.ones(3, device="cuda")),
        ValueError,
        "reference must be on approx's device cpu",
        marks=_cuda,
    ),
    (
        "tensor_bytes",
        lambda: tensor_bytes(torch.ones(1), 3),
        TypeError,
        r"tensors\[1\] must be a torch.Tensor, got 3",
    ),
    (
        "tensor_bytes",
        lambda: tensor_bytes(_meta),
        ValueError,
        r"tensors\[0\] must hold values",
    ),
    (
        "attention_flops",
        lambda: attention_flops(1, 1, 0, 1, 1),
        ValueError,
        "length must be a positive int, got 0",
    ),
    (
        "attention_flops",
        lambda: attention_flops(1, 1, 1, 1, 2.0),
        TypeError,
        "head_dim must be an int, got 2.0",
    ),
    (
        "attention_flops",
        lambda: attention_flops(True, 1, 1, 1, 1),
        TypeError,
        "batch must be an",
    ),
    (
        "rope_table",
        lambda: rope_table([0, 1], 8),
        TypeError,
        "positions must be a torch.Tensor",
    ),
    (
        "rope_table",
        lambda: rope_table(torch.zeros(2, 2), 8),
        ValueError,
        r"positions must have 1 dimensions, got shape \(2, 2\)",
    ),
    (
        "rope_table",
        lambda: rope_table(torch.zeros(2, dtype=torch.complex64), 8),
        TypeError,
        "positions must be an integer or floating tensor",
    ),
    (
        "rope_table",
        lambda: rope_table(torch.arange(3), 8, recipe="fp32"),
        ValueError,
        "recipe must be one of 'float64-angles', 'float32-angles', 'bfloat16-table'",
    ),
    (
        "rope_table",
        lambda: rope_table(torch.arange(3), 8, recipe=32),
        TypeError,
        "recipe must",
    ),
    (
        "rope_table",
        lambda: rope_table(torch.tensor([0.0, math.inf]), 8),
        ValueError,
        "positions must be finite, got NaN or inf",
    ),
    (
        "rope_table",
        lambda: rope_table(torch.arange(3), 7),
        ValueError,
        "head_dim must be an even int, got 7",
    ),
    (
        "rope_table",
        lambda: rope_table(torch.arange(3), "8"),
        TypeError,
        "head_dim must be an",
    ),
    (
        "rope_table",
        lambda: rope_table(torch.arange(3), 8, base=1.0),
        ValueError,
        "base must be",
    ),
    (
        "rope_error_by_position",
        lambda: rope_error_by_position(torch.tensor([-1]), 8),
        ValueError,
        "positions must be non-negative and not NaN",
    ),
    (
        "rope_error_by_position",
        lambda: rope_error_by_position(torch.tensor([math.nan]), 8),
        ValueError,
        "positions must be non-negative and not NaN",
    ),
    (
        "rope_error_by_position",
        lambda: rope_error_by_position(torch.zeros(0), 8),
        ValueError,
        r"positions must not be empty, got shape \(0,\)",
    ),
    (
        "rope_error_by_position",
        lambda: rope_error_by_position(torch.arange(2), 8, num_vectors=0),
        ValueError,
        "num_vectors must be a positive int, got 0",
    ),
    (
        "rope_error_by_position",
        lambda: rope_error_by_position(torch.arange(2), 8, generator=0),
        TypeError,
        "generator must be a Generator, got 0",
    ),
    (
        "rope_error_by_position",
        lambda: rope_error_by_position(torch.arange(2), 7),
        ValueError,
        "head_dim must be an even int, got 7",
    ),
    (
        "one_pass_layer_norm",
        lambda: one_pass_layer_norm(torch.ones(2, 2, dtype=torch.int64)),
        TypeError,
        "x must be a floating-point tensor",
    ),
    (
        "one_pass_layer_norm",
        lambda: one_pass_layer_norm(torch.tensor(1.0)),
        ValueError,
        "x must have at least 1 dimensions",
    ),
    (
        "one_pass_layer_norm",
        lambda: one_pass_layer_norm(torch.ones(2, 2), eps=-1.0),
        ValueError,
        "eps must be a real number > 0",
    ),
    (
        "naive_softmax_attention",
        lambda: naive_softmax_attention(
            torch.ones(2, 4), torch.ones(2, 3), torch.ones(2, 3)
        ),
        ValueError,
        r"query and key must have the same feature-width \(D\) size",
    ),
    (
        "naive_softmax_attention",
        lambda: naive_softmax_attention(
            torch.ones(2, 4), torch.ones(2, 4).double(), torch.ones(2, 3)
        ),
        TypeError,
        "key must have query's dtype",
    ),
    (
        "naive_softmax_attention",
        lambda: naive_softmax_attention(
            torch.ones(2, 0), torch.ones(2, 0), torch.ones(2, 3)
        ),
        ValueError,
        "query must have a positive feature width D",
    ),
    (
        "keep_freed_memory",
        lambda: keep_freed_memory(0),
        ValueError,
        "limit_bytes must be a pos",
    ),
    (
        "keep_freed_memory",
        lambda: keep_freed_memory(1.5),
        TypeError,
        "limit_bytes must be an",
    ),
    (
        "memory_traffic",
        lambda: memory_traffic(3),
        TypeError,
        "fn must be callable, got 3",
    ),
    (
        "peak_live_bytes",
        lambda: peak_live_bytes("not a function"),
        TypeError,
        "fn must be callable, got",
    ),
    (
        "compare_timings",
        lambda: compare_timings({}),
        ValueError,
        "cases must hold at least one name -> callable",
    ),
    (
        "compare_timings",
        lambda: compare_timings([_noop]),
        TypeError,
        "cases must be a mapping",
    ),
    (
        "compare_timings",
        lambda: compare_timings({"a": 1}),
        TypeError,
        r"cases\['a'\] must be callable, got 1",
    ),
    (
        "compare_timings",
        lambda: compare_timings({1: _noop}),
        TypeError,
        "cases key 1 must be",
    ),
    (
        "compare_timings",
        lambda: compare_timings({"a": _noop}, min_run_time=0),
        ValueError,
        "min_run_time must be a real number > 0, got 0",
    ),
    (
        "compare_timings",
        lambda: compare_timings({"a": _noop}, min_run_time="0.2"),
        TypeError,
        "min_run_time must be a real number",
    ),
    (
        "compare_timings",
        lambda: compare_timings({"a": _noop}, rounds=0),
        ValueError,
        "rounds must be a positive int",
    ),
    (
        "compare_timings",
        lambda: compare_timings({"a": _noop}, num_threads=0),
        ValueError,
        "num_threads must be a positive int, got 0",
    ),
    (
        "compare_timings",
        lambda: compare_timings({"a": _noop}, num_threads=1.5),
        TypeError,
        "num_threads must be an int",
    ),
]


# ---- empty inputs and valid random inputs --------------------------------------------


def test_empty_inputs_give_their_natural_answer() -> None:
    assert max_abs_error(torch.zeros(0), torch.zeros(0)) == 0.0
    assert tensor_bytes() == 0 and tensor_bytes(torch.zeros(0, 3)) == 0
    assert ulp(torch.zeros(0)).shape == (0,)
    assert one_pass_layer_norm(torch.zeros(0, 4)).shape == (0, 4)
    assert memory_traffic(_noop).ops == []
    assert peak_live_bytes(_noop) == 0
    assert rope_table(torch.zeros(0, dtype=torch.int64), 8)[0].shape == (0, 4)


@given(
    st.lists(st.floats(-1e30, 1e30), min_size=0, max_size=5),
    st.sampled_from([torch.float16, torch.bfloat16, torch.float32, torch.float64]),
    st.sampled_from(ROPE_RECIPES),
    st.integers(1, 4),
    st.integers(0, 2**20),
)
def test_valid_random_inputs_never_raise(values, dtype, recipe, half, position) -> None:
    x = torch.tensor(values, dtype=torch.float64)
    assert ulp(x, dtype=dtype).shape == x.shape
    assert max_abs_error(x.float(), x) >= 0.0
    assert tensor_bytes(x, x.float()) == 12 * len(values)
    positions = torch.tensor([0, position])
    cos, _ = rope_table(positions, 2 * half, recipe=recipe)
    assert cos.shape == (2, half)
    if values:
        assert one_pass_layer_norm(x).shape == x.shape


# ---- the appendix's plot helper ------------------------------------------------------


def test_ratio_bars_draws_one_bar_per_ratio_and_validates() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from companion.plotting import ratio_bars

    fig, ax = plt.subplots()
    try:
        assert ratio_bars(ax, {"a": 1.0, "b": 2.5}, reference="clone") is ax
        widths = sorted(p.get_width() for p in ax.patches)
        assert widths == [1.0, 2.5]
        at = {
            t.get_text(): y
            for t, y in zip(ax.get_yticklabels(), ax.get_yticks(), strict=True)
        }
        assert at["a"] > at["b"]  # the first ratio is drawn on top
        with pytest.raises(TypeError, match=r"ax\b"):
            ratio_bars(None, {"a": 1.0})
        with pytest.raises(ValueError, match=r"ratios\b"):
            ratio_bars(ax, {})
        with pytest.raises(ValueError, match=r"ratios\b"):
            ratio_bars(ax, {"a": 0.0})
    finally:
        plt.close(fig)


# ---- memory_traffic: counts checked against hand counts ------------------------------


def test_memory_traffic_of_single_operators() -> None:
    x = torch.randn(6, 8)
    row = torch.randn(1, 8)
    out = torch.empty(6, 8)
    n, r = x.numel() * 4, row.numel() * 4
    assert memory_traffic(lambda: x.clone()).ops == [("clone", n, n)]
    assert memory_traffic(lambda: x * row).ops == [
        ("mul", n + r, n)
    ]  # broadcast row: 8 floats
    assert memory_traffic(lambda: torch.mul(x, row, out=out)).ops == [("mul", n + r, n)]
    assert memory_traffic(lambda: out.copy_(x)).ops == [
        ("copy_", n, n)
    ]  # dst is not read
    y = x.clone()
    assert memory_traffic(lambda: y.add_(x)).ops == [("add_", 2 * n, n)]  # self is read
    assert memory_traffic(lambda: torch.cat((x, x))).ops == [("cat", 2 * n, 2 * n)]
    assert memory_traffic(lambda: row.expand(100, 8) * 2.0).ops == [("mul", r, 100 * r)]
    # views and fresh buffers move nothing
    assert (
        memory_traffic(lambda: (x.t(), x.view(48), x[2:], torch.empty_like(x))).ops
        == []
    )
    t = memory_traffic(lambda: (x * row).sum())
    assert (t.read, t.written, t.total) == (n + r + n, n + 4, 2 * n + r + n + 4)


def test_memory_traffic_explains_the_rope_formulas() -> None:
    """Hand counts, in bytes of x, for Hugging Face's formula and the package's two
    layouts."""
    from transformers.models.llama.modeling_llama import rotate_half

    B, H, L, D = 1, 4, 16, 8
    x = torch.randn(B, H, L, D)
    cos, sin = rope_cos_sin(torch.arange(L), rope_frequencies(D))  # (L, D/2)
    hf_cos, hf_sin = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)  # (L, D)
    xb = tensor_bytes(x)
    table = tensor_bytes(cos)  # (L, D/2) float32; HF's table is twice that
    # x*cos (x + 2 table -> x), -x2 (x/2 -> x/2), cat (x -> x), rot*sin (x + 2 table ->
    # x), add (2x -> x)
    hf = memory_traffic(lambda: x * hf_cos + rotate_half(x) * hf_sin)
    assert hf.total == 10 * xb + 4 * table
    # per half: mul (x/2 + table -> x/2), addcmul_ (x/2 + x/2 + table -> x/2), twice
    half = memory_traffic(lambda: apply_rope(x, cos, sin))
    assert [name for name, _, _ in half.ops] == ["mul", "addcmul_", "mul", "addcmul_"]
    assert half.total == 5 * xb + 4 * table
    # interleaved: the complex table (2 tables -> 2 tables), one complex multiply
    inter = memory_traffic(lambda: apply_rope(x, cos, sin, layout="interleaved"))
    assert inter.total == 2 * xb + 6 * table


# ---- one memory meter for traffic and peak memory ------------------------------------


def test_one_watch_counts_traffic_and_peak_memory_at_once() -> None:
    """memory_traffic and attention.measure_peak_memory share one dispatch mode:
    watching both at once gives each one's own count."""
    from companion.attention import measure_peak_memory, scaled_dot_product_attention
    from companion.performance import _TensorWatch

    q = torch.randn(2, 16, 8)

    def fn():
        return scaled_dot_product_attention(q, q, q)

    both = _TensorWatch(traffic=True, live=True)
    with both:
        fn()
    assert both.ops == memory_traffic(fn).ops
    assert both.peak == measure_peak_memory(fn, device="cpu") > tensor_bytes(q)
    scores = 2 * 16 * 16 * 4  # the (B, L, S) float32 matrix must have been live
    assert both.peak >= scores


def test_peak_live_bytes_counts_what_lives_at_once() -> None:
    """Oracle: float32 buffers of known size; two alive together, then one at a time."""

    def together() -> None:
        a = torch.empty(1000)
        b = torch.empty(500)
        del a, b

    def one_after_another() -> None:
        a = torch.empty(1000)
        del a
        b = torch.empty(500)
        del b

    before = torch.ones(10_000)  # made before the call: never counted
    assert peak_live_bytes(together) == 4 * 1500
    assert peak_live_bytes(one_after_another) == 4 * 1000
    assert (
        peak_live_bytes(lambda: before.view(100, 100)) == 0
    )  # a view allocates nothing
