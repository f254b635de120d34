r"""Checkers for multi-head latent attention (:mod:`companion.mla`) in chapter 9
(:ref:`ch-modern`): the cache it keeps and the absorbed scores."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from torch import Tensor

from companion.checks._core import Case, Mistake, checker, f64, plural

__all__ = ["check_absorbed_scores", "check_mla_cache_bytes"]


# the cases of check_mla_cache_bytes: (layers, heads, r, d_R, bytes, tokens)
_CACHE_CASES = (
    (61, 128, 512, 64, 2, 1),  # DeepSeek-V3 (HF's DeepseekV3Config defaults)
    (61, 128, 512, 64, 4, 4096),  # the same at 4096 tokens in float32
    (3, 4, 8, 4, 8, 10),  # a small one
)


@checker
def check_mla_cache_bytes(mla_cache_bytes: Callable[..., object]) -> Iterator[Case]:
    r"""Check ``mla_cache_bytes(num_layers, num_heads, kv_lora_rank, qk_rope_head_dim,
    bytes_per_element, tokens)``: the bytes MLA's cache holds.

    Each layer keeps, per token, the latent :math:`c` (``kv_lora_rank`` numbers) and the
    one rope key :math:`k^R` that all heads share (``qk_rope_head_dim``):
    :math:`n_\text{layers} (r + d_R)\, b\, T`, whatever the number of heads. The answer
    may be a Python number or a 0-d tensor. Named mistakes: "rope key cached per head",
    "latent cached twice", "rope key left out", "one layer only", "bits, not bytes".

    Args:
        mla_cache_bytes: a function of six ints returning the number of bytes.
    """
    for layers, heads, r, dr, size, tokens in _CACHE_CASES:
        per = layers * size * tokens
        yield Case(
            f"bytes MLA caches for {plural(tokens, 'token')}",
            {
                "num_layers": layers,
                "num_heads": heads,
                "kv_lora_rank": r,
                "qk_rope_head_dim": dr,
                "bytes_per_element": size,
                "tokens": tokens,
            },
            f64(per * (r + dr)),
            [
                Mistake(
                    "rope key cached per head",
                    "the rope key k^R is ONE head shared by all query heads (as in "
                    "multi-query attention): qk_rope_head_dim numbers per token, not "
                    "num_heads times that.",
                    f64(per * (r + heads * dr)),
                ),
                Mistake(
                    "latent cached twice",
                    "keys and values are both read from the same latent c: it is "
                    "cached once, not once for keys and once for values.",
                    f64(per * (2 * r + dr)),
                ),
                Mistake(
                    "rope key left out",
                    "besides the latent, each token's rotated rope key is cached (it "
                    "cannot be rebuilt from c: it was projected from x).",
                    f64(per * r),
                ),
                Mistake(
                    "one layer only",
                    f"every one of the {layers} layers has its own latent cache.",
                    f64(size * tokens * (r + dr)),
                ),
                Mistake(
                    "bits, not bytes",
                    "bytes_per_element is already in bytes (2 for bfloat16): the "
                    "answer is a number of bytes, not 8 times that.",
                    f64(8 * per * (r + dr)),
                ),
            ],
            atol=0.5,
            rtol=0.0,
        )


def _inputs(
    heads: int, length: int, keys: int, nope: int, rope: int, rank: int, seed: int
) -> dict[str, object]:
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    return {
        "q_nope": randn(heads, length, nope),
        "q_rope": randn(heads, length, rope),
        "latent": randn(keys, rank),
        "k_rope": randn(keys, rope),
        "w_uk": randn(heads, rank, nope) / rank**0.5,
        "scale": (nope + rope) ** -0.5,
    }


def _naive_scores(q_nope, q_rope, latent, k_rope, w_uk, scale) -> Tensor:
    """Per-head keys up-projected from the latents, then ordinary scores."""
    k_nope = torch.einsum("sr,hrd->hsd", latent, w_uk)  # (H, S, dn): k^C = c W_UK,h
    return scale * (q_nope @ k_nope.mT + q_rope @ k_rope.T)  # (H, L, S)


@checker
def check_absorbed_scores(absorbed_scores: Callable[..., Tensor]) -> Iterator[Case]:
    r"""Check ``absorbed_scores(q_nope, q_rope, latent, k_rope, w_uk, scale)``: MLA's
    scores read from the latent cache, without forming a key per head.

    Head :math:`h`'s key is :math:`k^C_{h,j} = c_j W_{UK,h}` (row convention,
    ``w_uk[h]`` of shape ``(r, dn)``; ``kv_b_proj.weight`` stores its transpose), so its
    score of query :math:`i` and cached token :math:`j` is
    :math:`\text{scale}\,\bigl[(q^C_{h,i} W_{UK,h}^\top) \cdot c_j
    + q^R_{h,i} \cdot k^R_j\bigr]`: :math:`W_{UK,h}^\top` is multiplied into the query
    (width :math:`r`), and the rope part adds the one shared rope key. The reference
    forms the keys and takes ordinary dot products; the answer must equal it. Named
    mistakes: "rope part left out", "W_UK transposed", "scale left out", "rope part
    not scaled", "softmax applied". A float32 computation passes (tolerance 1e-6).

    Args:
        absorbed_scores: a function of ``q_nope (H, L, dn)``, ``q_rope (H, L, dR)``
            (already rotated), ``latent (S, r)``, ``k_rope (S, dR)`` (rotated),
            ``w_uk (H, r, dn)`` and the float ``scale``, returning ``(H, L, S)``.
    """
    # (H, L, S, dn, dR, r): a prefill; one decoding query with dn == r, where a
    # transposed W_UK still fits
    for shape, seed in (((2, 3, 5, 4, 2, 6), 0), ((3, 1, 7, 4, 4, 4), 1)):
        x = _inputs(*shape, seed=seed)
        right = _naive_scores(**x)
        nope = torch.einsum("hld,hrd,sr->hls", x["q_nope"], x["w_uk"], x["latent"])
        rope = x["q_rope"] @ x["k_rope"].T
        mistakes = [
            Mistake(
                "rope part left out",
                "the score adds the rope part q^R . k^R (RoPE on a 64-wide part "
                "of each head, with the shared rope key) to the absorbed part.",
                x["scale"] * nope,
            ),
            Mistake(
                "scale left out",
                "both parts are multiplied by the softmax scale (1/sqrt(dn + dR), "
                "times DeepSeek's mscale^2 with YaRN).",
                nope + rope,
            ),
            Mistake(
                "rope part not scaled",
                "the scale multiplies the whole score, the rope part too.",
                x["scale"] * nope + rope,
            ),
            Mistake(
                "softmax applied",
                "return the scores, before the softmax (the weights come after the "
                "mask, outside this function).",
                torch.softmax(right, dim=-1),
            ),
        ]
        if shape[3] == shape[5]:  # dn == r: a transposed W_UK has the right shape
            wrong = torch.einsum("hld,hdr,sr->hls", x["q_nope"], x["w_uk"], x["latent"])
            mistakes.append(
                Mistake(
                    "W_UK transposed",
                    "head h's key is k^C = c W_UK,h (w_uk[h] is (r, dn)), so the "
                    "absorbed query is q^C W_UK,h^T, of width r: "
                    "q_nope[h] @ w_uk[h].T.",
                    x["scale"] * (wrong + rope),
                )
            )
        yield Case(
            f"equals the scores of the up-projected keys (H, L, S) = {shape[:3]}",
            x,
            right,
            mistakes,
            atol=1e-6,  # a float32 computation of these O(1) scores passes
            rtol=1e-6,
        )
