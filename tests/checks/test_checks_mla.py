"""Chapter 9's MLA checkers (companion.checks.mla): correct answers in several styles
pass; each named mistake is named; the stub is "not attempted"."""

from __future__ import annotations

import pytest
import torch

from companion.checks import CheckError
from companion.checks.mla import check_absorbed_scores, check_mla_cache_bytes

# ---- check_mla_cache_bytes -----------------------------------------------------------


def test_mla_cache_bytes_accepts_numbers_and_tensors() -> None:
    assert check_mla_cache_bytes(lambda n, h, r, dr, b, t: n * (r + dr) * b * t)
    assert check_mla_cache_bytes(
        lambda n, h, r, dr, b, t: torch.tensor(n * (r + dr) * b * t)
    )
    assert check_mla_cache_bytes(lambda n, h, r, dr, b, t: float(n * (r + dr) * b) * t)


def test_mla_cache_bytes_names_each_mistake(named) -> None:
    for name, wrong in {
        "rope key cached per head": lambda n, h, r, dr, b, t: n * (r + h * dr) * b * t,
        "latent cached twice": lambda n, h, r, dr, b, t: n * (2 * r + dr) * b * t,
        "rope key left out": lambda n, h, r, dr, b, t: n * r * b * t,
        "one layer only": lambda n, h, r, dr, b, t: (r + dr) * b * t,
        "bits, not bytes": lambda n, h, r, dr, b, t: 8 * n * (r + dr) * b * t,
    }.items():
        named(lambda wrong=wrong: check_mla_cache_bytes(wrong), name)


def test_mla_cache_bytes_counts_tokens_in_words() -> None:
    # review B7: "for 1 token", "for 4096 tokens"
    with pytest.raises(CheckError) as info:
        check_mla_cache_bytes(lambda n, h, r, dr, b, t: n * (r + dr) * b * t + 1)
    assert info.value.prop == "bytes MLA caches for 1 token"
    with pytest.raises(CheckError) as info:
        check_mla_cache_bytes(lambda n, h, r, dr, b, t: n * (r + dr) * b * t + (t > 1))
    assert info.value.prop == "bytes MLA caches for 4096 tokens"


def test_mla_cache_bytes_stub_is_not_attempted() -> None:
    def mla_cache_bytes(num_layers, num_heads, kv_lora_rank, qk_rope, size, tokens):
        raise NotImplementedError

    assert check_mla_cache_bytes(mla_cache_bytes).passed is False


# ---- check_absorbed_scores -----------------------------------------------------------


def _einsum(q_nope, q_rope, latent, k_rope, w_uk, scale):
    q = torch.einsum("hld,hrd->hlr", q_nope, w_uk)  # W_UK^T absorbed into the query
    return scale * (q @ latent.T + q_rope @ k_rope.T)


def _concatenated(q_nope, q_rope, latent, k_rope, w_uk, scale):
    """One key of width r + dR, shared by all heads: MQA over the cache [c, k^R]."""
    q = torch.cat((q_nope @ w_uk.mT, q_rope), dim=-1)  # (H, L, r + dR)
    key = torch.cat((latent, k_rope), dim=-1)  # (S, r + dR)
    return (q @ key.T) * scale


def _float32(q_nope, q_rope, latent, k_rope, w_uk, scale):
    return _einsum(
        *(t.float() for t in (q_nope, q_rope, latent, k_rope, w_uk)), scale
    ).double()


def test_absorbed_scores_accepts_each_style() -> None:
    assert check_absorbed_scores(_einsum)
    assert check_absorbed_scores(_concatenated)


def test_absorbed_scores_accepts_a_float32_detour_and_refuses_a_small_error() -> None:
    """A float32 computation is a correct answer (its rounding, ~1e-8 relative, is
    inside the 1e-6 tolerance); an error of 1e-4 is not, and is no named mistake."""
    import pytest

    from companion.checks import CheckError

    assert check_absorbed_scores(_float32)
    with pytest.raises(CheckError) as info:
        check_absorbed_scores(lambda *args: _einsum(*args) + 1e-4)
    assert info.value.mistake is None


def test_absorbed_scores_names_each_mistake(named) -> None:
    def no_rope(q_nope, q_rope, latent, k_rope, w_uk, scale):
        return scale * (q_nope @ w_uk.mT @ latent.T)

    def no_scale(q_nope, q_rope, latent, k_rope, w_uk, scale):
        return _einsum(q_nope, q_rope, latent, k_rope, w_uk, 1.0)

    def rope_unscaled(q_nope, q_rope, latent, k_rope, w_uk, scale):
        return scale * (q_nope @ w_uk.mT @ latent.T) + q_rope @ k_rope.T

    named(lambda: check_absorbed_scores(no_rope), "rope part left out")
    named(lambda: check_absorbed_scores(no_scale), "scale left out")
    named(lambda: check_absorbed_scores(rope_unscaled), "rope part not scaled")
    named(
        lambda: check_absorbed_scores(lambda *a: _einsum(*a).softmax(-1)),
        "softmax applied",
    )


def test_absorbed_scores_names_a_transposed_w_uk_where_it_fits(named) -> None:
    """Where dn != r a transposed W_UK fails by its shape (a CheckError of the first
    case); where dn == r (the second case) by its values, named."""
    import pytest

    from companion.checks import CheckError

    def transposed(q_nope, q_rope, latent, k_rope, w_uk, scale):
        q = q_nope @ w_uk  # W_UK where W_UK^T belongs
        return scale * (q @ latent.T + q_rope @ k_rope.T)

    def transposed_where_square(q_nope, q_rope, latent, k_rope, w_uk, scale):
        if w_uk.shape[1] != w_uk.shape[2]:
            return _einsum(q_nope, q_rope, latent, k_rope, w_uk, scale)
        return transposed(q_nope, q_rope, latent, k_rope, w_uk, scale)

    with pytest.raises(CheckError):
        check_absorbed_scores(transposed)
    named(lambda: check_absorbed_scores(transposed_where_square), "W_UK transposed")


def test_absorbed_scores_stub_is_not_attempted() -> None:
    def absorbed_scores(q_nope, q_rope, latent, k_rope, w_uk, scale):
        raise NotImplementedError

    assert check_absorbed_scores(absorbed_scores).passed is False
