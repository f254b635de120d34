"""Chapter 8's checkers (real models: the KV cache and grouped-query heads): correct
answers in several styles pass; each named mistake is named."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from companion import checks

# ---- check_kv_cache_bytes ------------------------------------------------------------


@pytest.mark.parametrize(
    "answer",
    [
        lambda layers, heads, kv, dim, size, tokens: (
            2 * layers * kv * dim * size * tokens
        ),
        lambda *a: torch.tensor(2 * a[0] * a[2] * a[3] * a[4] * a[5]),
        lambda layers, heads, kv, dim, size, tokens: float(
            np.prod([2, layers, kv, dim, size, tokens], dtype=np.float64)
        ),
    ],
    ids=["int", "tensor", "numpy-float"],
)
def test_kv_cache_bytes_accepts(answer) -> None:
    assert checks.check_kv_cache_bytes(answer)


def test_kv_cache_bytes_names(named) -> None:
    named(
        lambda: checks.check_kv_cache_bytes(
            lambda n, h, kv, d, b, t: 2 * n * h * d * b * t
        ),
        "counted the query heads",
    )
    named(
        lambda: checks.check_kv_cache_bytes(
            lambda n, h, kv, d, b, t: n * kv * d * b * t
        ),
        "keys only",
    )
    named(
        lambda: checks.check_kv_cache_bytes(
            lambda n, h, kv, d, b, t: 2 * kv * d * b * t
        ),
        "one layer only",
    )


def test_kv_cache_bytes_names_bits_and_counts_tokens_in_words(named) -> None:
    # review B7: the unit slip is named; "1 token", not "1 tokens"
    err = named(
        lambda: checks.check_kv_cache_bytes(
            lambda n, h, kv, d, b, t: 2 * n * kv * d * b * t * 8
        ),
        "bits, not bytes",
    )
    assert err.prop == "bytes of the keys and values cached for 1 token"


def test_kv_cache_bytes_states_an_unnamed_number_once() -> None:
    # review B7: "expected 98304, got 196608" once, in the plain and the Jupyter form
    with pytest.raises(checks.CheckError) as info:
        checks.check_kv_cache_bytes(
            lambda n, h, kv, d, b, t: 2 * n * kv * d * b * (t + 1)
        )
    err = info.value
    assert err.mistake is None and err.detail == "expected 98304, got 196608."
    assert str(err).count("196608") == 1, str(err)
    assert "\n".join(err._render_traceback_()).count("196608") == 1


def test_kv_cache_bytes_stub_is_not_attempted(capsys) -> None:
    def kv_cache_bytes(num_layers, num_heads, num_kv_heads, head_dim, size, tokens):
        raise NotImplementedError

    assert checks.check_kv_cache_bytes(kv_cache_bytes).passed is False
    assert "not attempted yet" in capsys.readouterr().out


# ---- check_repeat_kv -----------------------------------------------------------------


def repeat_expand(x, groups):
    b, kv, s, d = x.shape
    return x[:, :, None].expand(b, kv, groups, s, d).reshape(b, kv * groups, s, d)


def repeat_loop(x, groups):
    return torch.stack([x[:, h // groups] for h in range(x.shape[1] * groups)], dim=1)


@pytest.mark.parametrize(
    "answer",
    [
        repeat_expand,
        repeat_loop,
        lambda x, g: x.repeat_interleave(g, dim=1),
        lambda x, g: np.repeat(x.numpy(), g, axis=1),
    ],
    ids=["expand", "loop", "repeat_interleave", "numpy"],
)
def test_repeat_kv_accepts(answer) -> None:
    assert checks.check_repeat_kv(answer)


def test_repeat_kv_names(named) -> None:
    named(lambda: checks.check_repeat_kv(lambda x, g: x.repeat(1, g, 1, 1)),
          "heads tiled, not grouped")  # fmt: skip


# ---- check_cached_attention ----------------------------------------------------------


def cached_sdpa(query, key, value, past_key, past_value):
    keys = torch.cat([past_key, key], dim=2)
    values = torch.cat([past_value, value], dim=2)
    return F.scaled_dot_product_attention(query, keys, values), keys, values


def cached_by_hand(q, k, v, pk, pv):
    keys, values = torch.cat((pk, k), -2), torch.cat((pv, v), -2)
    weights = torch.softmax(q @ keys.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
    return weights @ values, keys, values


@pytest.mark.parametrize(
    "answer", [cached_sdpa, cached_by_hand], ids=["sdpa", "by-hand"]
)
def test_cached_attention_accepts(answer) -> None:
    assert checks.check_cached_attention(answer)


def test_cached_attention_names(named) -> None:
    def left_out(q, k, v, pk, pv):
        keys, values = torch.cat((pk, k), -2), torch.cat((pv, v), -2)
        return F.scaled_dot_product_attention(q, pk, pv), keys, values

    def top_left(q, k, v, pk, pv):
        keys, values = torch.cat((pk, k), -2), torch.cat((pv, v), -2)
        out = F.scaled_dot_product_attention(q, keys, values, is_causal=True)
        return out, keys, values

    def unscaled(q, k, v, pk, pv):
        keys, values = torch.cat((pk, k), -2), torch.cat((pv, v), -2)
        return F.scaled_dot_product_attention(q, keys, values, scale=1.0), keys, values

    def first(q, k, v, pk, pv):
        out = cached_sdpa(q, k, v, pk, pv)[0]
        return out, torch.cat((k, pk), -2), torch.cat((v, pv), -2)

    named(lambda: checks.check_cached_attention(left_out), "new token left out")
    named(lambda: checks.check_cached_attention(top_left), "top-left causal mask")
    named(lambda: checks.check_cached_attention(unscaled), "no 1/sqrt(D) scale")
    named(lambda: checks.check_cached_attention(first), "new key put first")


def test_kv_cache_bytes_names_head_dim_split_across_heads(named) -> None:
    named(
        lambda: checks.check_kv_cache_bytes(
            lambda n, h, kv, d, b, t: 2 * n * kv * (d // h) * b * t
        ),
        "head_dim split across heads",
    )
