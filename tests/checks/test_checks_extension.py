"""Chapter 03's checkers (ALiBi, RoPE context extension): correct answers in several
styles, Press et al.'s, BLOOM's, Meta's and Hugging Face's code included, pass; each
named mistake is named."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.bloom.modeling_bloom import build_alibi_tensor

from companion import checks, extension

# ---- check_alibi_slopes --------------------------------------------------------------


def get_slopes(n):
    """Press et al.'s code (ofirpress/attention_with_linear_biases), verbatim."""

    def get_slopes_power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        ratio = start
        return [start * ratio**i for i in range(n)]

    if math.log2(n).is_integer():
        return get_slopes_power_of_2(n)
    closest_power_of_2 = 2 ** math.floor(math.log2(n))
    return (
        get_slopes_power_of_2(closest_power_of_2)
        + get_slopes(2 * closest_power_of_2)[0::2][: n - closest_power_of_2]
    )


def slopes_from_bloom(num_heads):
    """BLOOM's build_alibi_tensor: the bias of key position 1 is the head's slope."""
    alibi = build_alibi_tensor(torch.ones(1, 2), num_heads, torch.float32)  # (H, 1, 2)
    return alibi[:, 0, 1]


def slopes_numpy(h, /):
    c = 2 ** int(np.floor(np.log2(h)))
    first = 2.0 ** (-8.0 * np.arange(1, c + 1) / c)
    extra = 2.0 ** (-8.0 * np.arange(1, 2 * c + 1) / (2 * c))[0::2][: h - c]
    return np.concatenate((first, extra))


@pytest.mark.parametrize(
    "answer",
    [get_slopes, slopes_from_bloom, slopes_numpy, lambda n: extension.alibi_slopes(n)],
    ids=["press-get_slopes", "bloom", "numpy", "companion"],
)
def test_alibi_slopes_accepts(answer) -> None:
    assert checks.check_alibi_slopes(answer)


def test_alibi_slopes_names(named) -> None:
    def power_of_two_only(n):
        return [2 ** (-8 * h / n) for h in range(1, n + 1)]

    def consecutive(n):
        c = 2 ** math.floor(math.log2(n))
        return power_of_two_only(c) + power_of_two_only(2 * c)[: n - c]

    named(
        lambda: checks.check_alibi_slopes(power_of_two_only),
        "power-of-two rule for every head count",
    )
    named(
        lambda: checks.check_alibi_slopes(consecutive), "extra slopes not interleaved"
    )
    named(
        lambda: checks.check_alibi_slopes(lambda n: [2.0**-h for h in range(1, n + 1)]),
        "slope 2^-h for every head count",
    )


# ---- check_ntk_aware_base ------------------------------------------------------------


@pytest.mark.parametrize(
    "answer",
    [
        lambda base, factor, head_dim: base * factor ** (head_dim / (head_dim - 2)),
        lambda b, s, d, /: np.float64(b) * np.power(s, d / (d - 2)),
        lambda b, s, d: torch.tensor(b, dtype=torch.float64) * s ** (d / (d - 2)),
        extension.ntk_aware_base,
    ],
    ids=["python", "numpy", "0-d-tensor", "companion"],
)
def test_ntk_aware_base_accepts(answer) -> None:
    assert checks.check_ntk_aware_base(answer)


@pytest.mark.parametrize(
    ("answer", "name"),
    [
        (
            lambda b, s, d: b * s**d,
            "exponent head_dim instead of head_dim/(head_dim-2)",
        ),
        (lambda b, s, d: b * s, "base multiplied by the factor"),
        (lambda b, s, d: b * s ** ((d - 2) / d), "exponent inverted"),
        (lambda b, s, d: b / s ** (d / (d - 2)), "base divided by the factor"),
    ],
)
def test_ntk_aware_base_names(answer, name, named) -> None:
    named(lambda: checks.check_ntk_aware_base(answer), name)


def test_ntk_aware_base_prints_digits_that_differ() -> None:
    with pytest.raises(checks.CheckError) as info:
        checks.check_ntk_aware_base(lambda b, s, d: b * s ** (d / (d - 2)) * (1 + 1e-5))
    text = str(info.value)
    found = re.search(
        r"expected ([0-9.e+-]+), got ([0-9.e+-]+); relative error 1e-05", text
    )
    # the two numbers are stated once, in one line, with digits enough to differ
    assert found is not None and found[1] != found[2], text
    assert text.count(found[1]) == 1 and text.count(found[2]) == 1, text


# ---- check_yarn_ramp -----------------------------------------------------------------


def ramp_loops(head_dim, base, original_max_position_embeddings, beta_fast, beta_slow):
    def index(turns):
        n0 = original_max_position_embeddings
        return head_dim * math.log(n0 / (turns * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(index(beta_fast)), 0)
    high = min(math.ceil(index(beta_slow)), head_dim - 1)
    if low == high:
        high += 0.001
    return [min(max((i - low) / (high - low), 0.0), 1.0) for i in range(head_dim // 2)]


def ramp_from_hf(d, b, n0, fast, slow, /):
    """Hugging Face's yarn inv_freq = theta * (1 - ramp) + theta / s * ramp, solved."""
    s = 4.0
    config = LlamaConfig(
        hidden_size=2 * d,
        num_attention_heads=2,
        head_dim=d,
        max_position_embeddings=int(n0 * s),
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": b,
            "factor": s,
            "original_max_position_embeddings": n0,
            "beta_fast": fast,
            "beta_slow": slow,
        },
    )
    inv_freq, _ = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    theta = b ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    return (theta - inv_freq.double()) / (theta - theta / s)


def ramp_companion(head_dim, base, n0, fast, slow, *, truncate=True):
    return extension.yarn_ramp(
        head_dim,
        base=base,
        original_max_position_embeddings=n0,
        beta_fast=fast,
        beta_slow=slow,
        truncate=truncate,
    )


@pytest.mark.parametrize(
    "answer",
    [ramp_loops, ramp_from_hf, ramp_companion],
    ids=["loops", "hf", "companion"],
)
def test_yarn_ramp_accepts(answer) -> None:
    assert checks.check_yarn_ramp(answer)


def test_yarn_ramp_names(named) -> None:
    named(
        lambda: checks.check_yarn_ramp(
            lambda d, b, n0, f, s: ramp_loops(d, b, n0, s, f)
        ),
        "beta_fast and beta_slow swapped",
    )
    named(
        lambda: checks.check_yarn_ramp(lambda *a: 1 - ramp_companion(*a)),
        "YaRN ramp reversed",
    )
    named(
        lambda: checks.check_yarn_ramp(lambda *a: ramp_companion(*a, truncate=False)),
        "correction range not rounded outwards",
    )


def ramp_paper(head_dim, base, original_max_position_embeddings, beta_fast, beta_slow):
    """Peng et al.'s Section 3.2 ramp, linear in the turns r = L0 / lambda, as 1 - gamma."""
    out = []
    for i in range(head_dim // 2):
        wavelength = 2 * math.pi * base ** (2 * i / head_dim)
        r = original_max_position_embeddings / wavelength
        gamma = (
            0.0
            if r < beta_slow
            else 1.0
            if r > beta_fast
            else ((r - beta_slow) / (beta_fast - beta_slow))
        )
        out.append(1.0 - gamma)
    return out


def ramp_without_two_pi(head_dim, base, n0, beta_fast, beta_slow):
    """The loops above with the wavelength taken as 1/theta."""

    def index(turns):
        return head_dim * math.log(n0 / turns) / (2 * math.log(base))

    low = max(math.floor(index(beta_fast)), 0)
    high = min(math.ceil(index(beta_slow)), head_dim - 1)
    if low == high:
        high += 0.001
    return [min(max((i - low) / (high - low), 0.0), 1.0) for i in range(head_dim // 2)]


def test_yarn_ramp_names_the_papers_ramp_and_a_missing_two_pi(named) -> None:
    """The chapter shows the paper's ramp first and warns about 2*pi: both named."""
    named(
        lambda: checks.check_yarn_ramp(ramp_paper),
        "the paper's ramp, linear in turns",
    )
    named(
        lambda: checks.check_yarn_ramp(ramp_without_two_pi),
        "2π missing from the wavelength",
    )


# ---- check_llama3_frequencies --------------------------------------------------------


def apply_scaling_meta(head_dim, base, factor, low_freq_factor, high_freq_factor, n0):
    """Meta's apply_scaling (llama-models), with its constants as arguments."""
    freqs = 1.0 / (
        base ** (torch.arange(0, head_dim, 2)[: (head_dim // 2)].double() / head_dim)
    )
    low_freq_wavelen = n0 / low_freq_factor
    high_freq_wavelen = n0 / high_freq_factor
    new_freqs = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            new_freqs.append(freq)
        elif wavelen > low_freq_wavelen:
            new_freqs.append(freq / factor)
        else:
            smooth = (n0 / wavelen - low_freq_factor) / (
                high_freq_factor - low_freq_factor
            )
            new_freqs.append((1 - smooth) * freq / factor + smooth * freq)
    return torch.tensor(new_freqs, dtype=freqs.dtype)


def llama3_hf(d, b, s, lo, hi, n0, /):
    config = LlamaConfig(
        hidden_size=2 * d,
        num_attention_heads=2,
        head_dim=d,
        max_position_embeddings=int(n0 * s),
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": b,
            "factor": s,
            "original_max_position_embeddings": n0,
            "low_freq_factor": lo,
            "high_freq_factor": hi,
        },
    )
    return ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")[0]


def llama3_companion(head_dim, base, factor, lo, hi, n0):
    return extension.llama3_frequencies(
        head_dim,
        base=base,
        factor=factor,
        low_freq_factor=lo,
        high_freq_factor=hi,
        original_max_position_embeddings=n0,
    )


@pytest.mark.parametrize(
    "answer",
    [apply_scaling_meta, llama3_hf, llama3_companion],
    ids=["meta", "hf", "companion"],
)
def test_llama3_frequencies_accepts(answer) -> None:
    assert checks.check_llama3_frequencies(answer)


def _bands(head_dim, base, factor, lo, hi, n0):
    theta = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    wavelength = 2 * math.pi / theta
    return theta, wavelength, (n0 / wavelength - lo) / (hi - lo)


def test_llama3_frequencies_names(named) -> None:
    def bands_swapped(d, b, s, lo, hi, n0):
        theta, _, mu = _bands(d, b, s, lo, hi, n0)
        mu = mu.clamp(0, 1)
        return mu * theta / s + (1 - mu) * theta

    def all_divided(d, b, s, lo, hi, n0):
        return _bands(d, b, s, lo, hi, n0)[0] / s

    def blend_reversed(d, b, s, lo, hi, n0):
        theta, wavelength, mu = _bands(d, b, s, lo, hi, n0)
        out = mu * theta / s + (1 - mu) * theta
        out = torch.where(wavelength < n0 / hi, theta, out)
        return torch.where(wavelength > n0 / lo, theta / s, out)

    named(lambda: checks.check_llama3_frequencies(bands_swapped), "bands swapped")
    named(
        lambda: checks.check_llama3_frequencies(all_divided),
        "every pair divided by the factor",
    )
    named(
        lambda: checks.check_llama3_frequencies(blend_reversed),
        "blend weights reversed in the middle band",
    )


def test_llama3_frequencies_names_a_missing_two_pi(named) -> None:
    """Meta's apply_scaling with the wavelength taken as 1/freq."""

    def without_two_pi(head_dim, base, factor, low_freq_factor, high_freq_factor, n0):
        new_freqs = []
        for i in range(head_dim // 2):
            freq = base ** (-2 * i / head_dim)
            wavelen = 1 / freq  # the mistake: one turn is 2 pi radians
            if wavelen < n0 / high_freq_factor:
                new_freqs.append(freq)
            elif wavelen > n0 / low_freq_factor:
                new_freqs.append(freq / factor)
            else:
                smooth = (n0 / wavelen - low_freq_factor) / (
                    high_freq_factor - low_freq_factor
                )
                new_freqs.append((1 - smooth) * freq / factor + smooth * freq)
        return torch.tensor(new_freqs, dtype=torch.float64)

    named(
        lambda: checks.check_llama3_frequencies(without_two_pi),
        "2π missing from the wavelength",
    )


def test_ntk_aware_base_names_a_float32_computation(named) -> None:
    def in_float32(b, s, d):
        return torch.tensor(b) * torch.tensor(s) ** (d / (d - 2))

    named(lambda: checks.check_ntk_aware_base(in_float32), "computed in float32")


def test_alibi_slopes_preview_shows_the_first_difference() -> None:
    def odd_extras(n):  # the extra slopes taken from [1::2] instead of [0::2]
        closest = 2 ** math.floor(math.log2(n))
        base = extension.alibi_slopes(closest).tolist()
        extra = extension.alibi_slopes(2 * closest).tolist()[1::2]
        return base + extra[: n - closest]

    with pytest.raises(checks.CheckError) as info:
        checks.check_alibi_slopes(odd_extras)
    text = str(info.value)
    assert "first differs at index (8,)" in text or "max |got - expected|" in text
    assert "from flat index" in info.value.got
