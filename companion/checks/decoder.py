r"""Checkers for chapter 8 (:ref:`ch-real-models`): the KV cache, key/value heads."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import torch
from torch import Tensor

from companion.attention import scaled_dot_product_attention
from companion.checks._core import Case, Mistake, checker, f64, plural

__all__ = ["check_cached_attention", "check_kv_cache_bytes", "check_repeat_kv"]


@checker
def check_kv_cache_bytes(kv_cache_bytes: Callable[..., object]) -> Iterator[Case]:
    r"""Check ``kv_cache_bytes(num_layers, num_heads, num_kv_heads, head_dim,
    bytes_per_element, tokens)``: the bytes a KV cache holds.

    Each layer stores a key and a value of ``head_dim`` numbers per *key/value* head and
    per token: :math:`2 \cdot n_\text{layers} \cdot H_{kv} \cdot D \cdot b \cdot T`. The
    answer may be a Python number or a 0-d tensor. Named mistakes: "counted the query
    heads", "keys only", "one layer only", "head_dim split across heads", "bits, not
    bytes".

    Args:
        kv_cache_bytes: a function of six ints returning the number of bytes.
    """
    # (layers, heads, kv heads, head_dim, bytes, tokens): GPT-2 medium, Llama-3-8B, MQA.
    # No case has layers == heads: there "one layer only" and "head_dim split across
    # heads" give the same number.
    for layers, heads, kv, dim, size, tokens in (
        (24, 16, 16, 64, 2, 1),
        (32, 32, 8, 128, 2, 4096),
        (2, 8, 1, 16, 4, 10),
    ):
        right = 2 * layers * kv * dim * size * tokens
        mistakes = [
            Mistake(
                "counted the query heads",
                "only the key/value heads are cached: with grouped-query attention "
                f"{heads} query heads share {kv} key/value heads.",
                f64(2 * layers * heads * dim * size * tokens),
            ),
            Mistake(
                "keys only",
                "each layer caches a key AND a value per head and token: a factor 2.",
                f64(layers * kv * dim * size * tokens),
            ),
            Mistake(
                "one layer only",
                f"every one of the {layers} layers has its own cache.",
                f64(2 * kv * dim * size * tokens),
            ),
            Mistake(
                "head_dim split across heads",
                f"head_dim ({dim}) is already the width of ONE head (model width / "
                "heads): each key/value head stores all of it, do not divide it by "
                "the number of heads.",
                f64(2 * layers * kv * dim * size * tokens / heads),
            ),
            Mistake(  # the third case (8 query heads, 1 kv head) gives "query heads"
                "bits, not bytes",
                "bytes_per_element is already in bytes (2 for float16): the answer is "
                "a number of bytes, not 8 times that.",
                f64(8 * right),
            ),
        ]
        if heads == kv:  # "counted the query heads" gives the right answer here
            mistakes = mistakes[1:]
        yield Case(
            f"bytes of the keys and values cached for {plural(tokens, 'token')}",
            {
                "num_layers": layers,
                "num_heads": heads,
                "num_kv_heads": kv,
                "head_dim": dim,
                "bytes_per_element": size,
                "tokens": tokens,
            },
            f64(right),
            mistakes,
            atol=0.5,
            rtol=0.0,
        )


def _repeat_kv(x: Tensor, groups: int) -> Tensor:
    """Hugging Face's ``repeat_kv``: output head ``h`` is key head ``h // groups``."""
    return x.repeat_interleave(groups, dim=1)


@checker
def check_repeat_kv(repeat_kv: Callable[..., Tensor]) -> Iterator[Case]:
    r"""Check ``repeat_kv(x, groups)``: one copy of each key/value head per query head.

    ``x`` is ``(B, H_kv, S, D)``; the answer is ``(B, H_kv * groups, S, D)`` whose head
    ``h`` is key/value head ``h // groups``, the grouping of Hugging Face's Llama
    (``repeat_kv``) and of Meta's reference. Named mistake: "heads tiled, not grouped"
    (``x.repeat(1, groups, 1, 1)`` gives head ``h`` key head ``h % H_kv``).

    Args:
        repeat_kv: a function ``(x (B, H_kv, S, D), groups) -> (B, H_kv*groups, S, D)``.
    """
    gen = torch.Generator().manual_seed(0)
    for kv, groups in ((2, 3), (4, 2), (1, 4), (3, 1)):
        x = torch.randn(2, kv, 5, 4, generator=gen)
        mistakes = []
        if kv > 1 and groups > 1:
            mistakes.append(
                Mistake(
                    "heads tiled, not grouped",
                    "query head h uses key/value head h // G (G = groups, the query "
                    "heads per key/value head): repeat each head G times in place "
                    "(repeat_interleave on dim 1), not the whole stack of heads.",
                    x.repeat(1, groups, 1, 1),
                )
            )
        yield Case(
            f"head h is key/value head h // G (H_kv={kv}, G={groups})",
            {"x": x, "groups": groups},
            _repeat_kv(x, groups),
            mistakes,
            atol=0.0,
            rtol=0.0,
        )


def _cached(q: Tensor, k: Tensor, v: Tensor, past_k: Tensor, past_v: Tensor):
    keys = torch.cat((past_k, k), dim=-2)  # (B, H, S+1, D)
    values = torch.cat((past_v, v), dim=-2)
    return scaled_dot_product_attention(q, keys, values), keys, values


@checker
def check_cached_attention(cached_attention: Callable[..., object]) -> Iterator[Case]:
    r"""Check ``cached_attention(query, key, value, past_key, past_value)``: one
    decoding step of attention with a KV cache.

    ``query``, ``key``, ``value`` belong to the one new token, ``(B, H, 1, D)`` (keys
    already rotated); ``past_key``, ``past_value`` are the cache, ``(B, H, S, D)``. The
    answer is the triple ``(output, keys, values)``: the attention output
    ``(B, H, 1, D)`` of the new query over all ``S + 1`` keys, and the grown cache
    ``(B, H, S + 1, D)`` with the new key and value last. Named mistakes: "new token
    left out" (attends to the cache only), "top-left causal mask" (``is_causal=True``
    with one query lets it see only the first key), "no 1/sqrt(D) scale", "new key put
    first".

    Args:
        cached_attention: a function of five tensors returning
            ``(output, keys, values)``.
    """
    gen = torch.Generator().manual_seed(1)
    for batch, heads, length, dim in ((1, 2, 5, 8), (2, 3, 1, 4), (1, 1, 9, 16)):
        q, k, v = (torch.randn(batch, heads, 1, dim, generator=gen) for _ in range(3))
        past_k, past_v = (
            torch.randn(batch, heads, length, dim, generator=gen) for _ in range(2)
        )
        out, keys, values = _cached(q, k, v, past_k, past_v)
        top_left = scaled_dot_product_attention(q, keys[..., :1, :], values[..., :1, :])
        unscaled = scaled_dot_product_attention(q, keys, values, scale=1.0)
        first_k, first_v = (
            torch.cat((k, past_k), dim=-2),
            torch.cat((v, past_v), dim=-2),
        )
        mistakes = [
            Mistake(
                "new token left out",
                "append the new key and value to the cache before attending: the new "
                "token attends to itself too.",
                (scaled_dot_product_attention(q, past_k, past_v), None, None),
            ),
            Mistake(
                "top-left causal mask",
                "with one query and S + 1 keys, is_causal=True (torch's top-left mask) "
                "lets the query see only key 0; the newest query may see every cached "
                "key, so use no mask (or a bottom-right one).",
                (top_left, None, None),
            ),
            Mistake(
                "no 1/sqrt(D) scale",
                f"scale the scores by 1/sqrt(D) = {1 / math.sqrt(dim):.4g}.",
                (unscaled, None, None),
            ),
            Mistake(
                "new key put first",
                "the cache is in position order: append the new key and value at the "
                "end (dim -2), so that position S is row S.",
                (None, first_k, first_v),
            ),
        ]
        yield Case(
            f"one new query over S + 1 keys (S={length}, D={dim})",
            {
                "query": q,
                "key": k,
                "value": v,
                "past_key": past_k,
                "past_value": past_v,
            },
            (out, keys, values),
            mistakes,
            atol=1e-5,
            rtol=1e-4,
            parts=("output", "keys", "values"),
        )
