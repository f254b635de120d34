r"""Checkers for chapter 10 (:ref:`ch-attention-2026`): GPT-OSS's sink column and its
gradient, Llama 4's iRoPE layer pattern, chunked attention and the pair count of
proportional RoPE."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import torch

from companion import masks
from companion.checks._core import Case, Mistake, checker, f64
from companion.rope_variants import p_rope_frequencies

__all__ = [
    "check_chunked_mask",
    "check_nope_layers",
    "check_proportional_pairs",
    "check_sink_gradient",
    "check_sink_softmax",
]


def _sink_weights(scores: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """The reference, through :func:`companion.masks.attention_with_sinks`: identity
    values read the weights back. scores (H, L, S), sinks (H,) -> (H, L, S)."""
    h, _, s = scores.shape
    # queries and keys that make q k^T = scores exactly: q = scores, k = identity
    q = scores.double()[None]  # (1, H, L, S)
    k = torch.eye(s, dtype=torch.float64).expand(1, h, s, s)  # (1, H, S, S)
    finite = torch.isfinite(q)
    out = masks.attention_with_sinks(
        q.nan_to_num(neginf=0.0), k, k, sinks.double(), mask=finite, scale=1.0
    )
    return out[0]  # (H, L, S)


@checker
def check_sink_softmax(sink_softmax: Callable[..., object]) -> Iterator[Case]:
    r"""Check ``sink_softmax(scores, sinks) -> (H, L, S)``: GPT-OSS's weights with a
    learned sink per head.

    Reference: the softmax of each row over its scores and one more column, the head's
    sink :math:`\sigma_h`, with that column dropped:
    :math:`p_{ij} = e^{s_{ij}} / (e^{\sigma_h} + \sum_k e^{s_{ik}})`
    (:func:`companion.masks.attention_with_sinks`); masked scores are ``-inf``, and a
    row with every score masked gives zeros. Any number type and layout of numbers
    passes. Named mistakes: "sink ignored" (a plain softmax, which is also what
    dividing the kept weights by their own sum gives), "sink not exponentiated"
    (:math:`\sigma_h` added to the denominator as it is), "one sink for every head"
    (the first head's sink used for all), "sink column kept" (the weights of all
    :math:`S + 1` columns returned).

    Args:
        sink_softmax: a function ``sink_softmax(scores (H, L, S), sinks (H,))``.
    """
    gen = torch.Generator().manual_seed(10)
    causal = torch.ones(4, 4, dtype=torch.bool).tril()
    padded = causal.clone()
    padded[:, :1] = False  # key 0 is padding: query 0 sees no key at all
    cases = [
        ("each row's weights sum to one less the sink's share", None, (2, 3, 5)),
        ("masked keys get no weight", causal, (2, 4, 4)),
        ("a row with every key masked gives zeros", padded, (3, 4, 4)),
    ]
    for prop, allowed, shape in cases:
        scores = 2.0 * torch.randn(shape, generator=gen, dtype=torch.float64)
        if allowed is not None:
            scores = scores.masked_fill(~allowed, float("-inf"))
        sinks = torch.linspace(-1.0, 1.5, shape[0], dtype=torch.float64)
        right = _sink_weights(scores, sinks)
        plain = torch.softmax(scores, -1).nan_to_num(0.0)
        exp = scores.exp()
        raw = exp / (exp.sum(-1, keepdim=True) + sinks[:, None, None])
        first = _sink_weights(scores, sinks[:1].expand(shape[0]))
        column = sinks[:, None, None].expand(*shape[:2], 1)  # (H, L, 1)
        kept = torch.softmax(torch.cat([scores, column], -1), -1)  # (H, L, S + 1)
        mistakes = [
            Mistake(
                "sink ignored",
                "append the head's sink logit as one more column of every row before "
                "the softmax, then drop that column: the weights then sum to less "
                "than one.",
                plain,
            ),
            Mistake(
                "sink not exponentiated",
                "the sink is a logit like the scores: it adds e^sink to the "
                "denominator, not sink itself.",
                raw,
            ),
            Mistake(
                "one sink for every head",
                "each head h has its own sink sinks[h]: broadcast it over that head's "
                "rows, sinks[:, None, None].",
                first,
            ),
            Mistake(
                "sink column kept",
                "drop the sink's column after the softmax, [..., :-1]: it takes weight "
                "but has no value to mix, so the answer has S columns, not S + 1.",
                kept,
            ),
        ]
        yield Case(
            prop,
            {"scores": scores, "sinks": sinks},
            right,
            mistakes,
            atol=1e-6,
            rtol=1e-5,
        )


@checker
def check_sink_gradient(sink_grad: Callable[..., object]) -> Iterator[Case]:
    r"""Check ``sink_grad(output, grad_output, lse, sinks) -> (H,)``: the gradient of the
    loss with respect to each head's sink logit.

    Reference: :func:`companion.masks.sink_gradient`,
    :math:`\partial\mathcal{L}/\partial\sigma_h = -\sum_{b,i} p_{\mathrm{sink},bhi} D_{bhi}`
    with :math:`D_i = \sum_d dO_{id} O_{id}` and
    :math:`p_{\mathrm{sink},i} = \operatorname{sigmoid}(\sigma_h - \ell_i)`, where
    ``output`` is the attention output *with* the sink
    (:func:`companion.masks.attention_with_sinks`) and ``lse`` each row's log-sum-exp
    *without* it (``-inf`` for a row with every key masked). The cases come from real
    attention, so the reference is also autograd's. A tensor, a NumPy array or a list
    passes, in float64 or float32 (``atol=1e-6``, ``rtol=1e-5``). Named mistakes: "sign
    flipped", "sink share left out" (:math:`-\sum D`), "keys' share for the sink's"
    (:math:`\operatorname{sigmoid}(\ell_i - \sigma_h)`, the weight the keys keep), "sink
    share from a log-sum-exp with the sink" (:math:`e^{\sigma_h - \ell_i}`, right only for
    a kernel's log-sum-exp that includes the sink), "summed over every head" (one 0-d
    total for all heads).

    Args:
        sink_grad: a function ``sink_grad(output (B, H, L, Dv), grad_output (B, H, L, Dv),
            lse (B, H, L), sinks (H,))``.
    """
    gen = torch.Generator().manual_seed(11)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    padded = causal.clone()
    padded[:, :1] = False  # key 0 is padding: query 0 sees no key at all
    cases = [
        ("a sink per head, every row sees keys", None),
        ("a row with every key masked adds nothing", padded),
    ]
    for prop, allowed in cases:
        q, k, v = (
            torch.randn(2, 3, 5, 4, generator=gen, dtype=torch.float64) for _ in "qkv"
        )
        sinks = torch.tensor([-0.5, 0.3, 1.2], dtype=torch.float64)
        mask = causal if allowed is None else allowed
        output = masks.attention_with_sinks(q, k, v, sinks, mask=mask)
        grad_output = torch.randn(output.shape, generator=gen, dtype=torch.float64)
        scores = (q @ k.transpose(-2, -1) / 2.0).masked_fill(~mask, float("-inf"))
        lse = torch.logsumexp(scores, -1)  # (B, H, L); -inf on an empty row
        right = masks.sink_gradient(output, grad_output, lse, sinks)
        d = (grad_output * output).sum(-1)  # (B, H, L)
        share = torch.sigmoid(sinks[None, :, None] - lse)
        keys = torch.sigmoid(lse - sinks[None, :, None])
        mistakes = [
            Mistake(
                "sign flipped",
                "the sink column's value is 0, so raising its logit moves weight from "
                "the keys to nothing and shrinks the output: the gradient is "
                "-sum p_sink * D, with a minus.",
                -right,
            ),
            Mistake(
                "sink share left out",
                "multiply each row's D_i by the sink's share of that row, "
                "p_sink = sigmoid(sink - lse), before summing.",
                -d.sum(dim=(0, 2)),
            ),
            Mistake(
                "keys' share for the sink's",
                "the sink's share is sigmoid(sink - lse), the sink over everything; "
                "sigmoid(lse - sink) is what the keys keep.",
                -(keys * d).sum(dim=(0, 2)),
            ),
            Mistake(
                "sink share from a log-sum-exp with the sink",
                "this lse leaves the sink out, so p_sink = sigmoid(sink - lse); "
                "exp(sink - lse) is the share only when lse already includes the sink, "
                "as a FlashAttention kernel with sinks stores it.",
                -((sinks[None, :, None] - lse).exp() * d).sum(dim=(0, 2)),
            ),
            Mistake(
                "summed over every head",
                "each head has its own sink: sum over the batch and the queries, "
                "dims (0, 2), and keep the heads apart.",
                -(share * d).sum(),  # one number, shape ()
            ),
        ]
        yield Case(
            prop,
            {
                "output": output,
                "grad_output": grad_output,
                "lse": lse,
                "sinks": sinks,
            },
            right,
            mistakes,
            atol=1e-6,
            rtol=1e-5,
        )


@checker
def check_nope_layers(nope_layers: Callable[..., object]) -> Iterator[Case]:
    r"""Check ``nope_layers(num_layers, interval) -> list``: Llama 4's (and SmolLM3's)
    ``no_rope_layers`` flags.

    Reference: Hugging Face's default, one flag per layer, 1 where the layer uses RoPE
    and 0 where it uses none: layer :math:`l` is NoPE when :math:`(l + 1)` is a multiple
    of ``interval`` (layers 3, 7, 11, ... for 4). A list, a tuple, a tensor or an array
    of 0/1 (or bools) passes. Named mistakes: "counted from layer 0" (NoPE at 0, 4, 8,
    ...), "flags inverted" (1 for NoPE), "NoPE after the interval" (the layer after
    each multiple, 4, 8, ...), "NoPE layer indices, not flags" (``[3, 7]`` for 8
    layers).

    Args:
        nope_layers: a function ``nope_layers(num_layers, interval)``.
    """
    for num_layers, interval in ((8, 4), (48, 4), (36, 4), (10, 3), (5, 1)):
        layer = torch.arange(num_layers)
        right = ((layer + 1) % interval != 0).double()
        mistakes = [
            Mistake(
                "counted from layer 0",
                "the layers are numbered from 0 and the NoPE layer is the last of each "
                "group of interval: layer l is NoPE when (l + 1) % interval == 0.",
                (layer % interval != 0).double(),
            ),
            Mistake(
                "flags inverted",
                "no_rope_layers holds 1 where the layer USES RoPE and 0 where it "
                "does not (Hugging Face's convention).",
                1.0 - right,
            ),
            Mistake(
                "NoPE after the interval",
                "the NoPE layer closes its group of interval layers (3, 7, ... for "
                "4), it does not open the next one.",
                ((layer % interval != 0) | (layer == 0)).double(),
            ),
            Mistake(
                "NoPE layer indices, not flags",
                "return one flag per layer (num_layers of them), 1 where the layer uses "
                "RoPE and 0 where it does not, not the indices of the NoPE layers.",
                layer[(layer + 1) % interval == 0].double(),
            ),
        ]
        yield Case(
            "RoPE flags per layer, 0 on every interval-th layer",
            {"num_layers": num_layers, "interval": interval},
            right,
            mistakes,
            atol=0.0,
            rtol=0.0,
        )


@checker
def check_chunked_mask(chunked_mask: Callable[..., object]) -> Iterator[Case]:
    r"""Check ``chunked_mask(length, chunk_size) -> (L, L) bool``: Llama 4's chunked
    attention.

    Reference: :func:`companion.masks.chunked_causal` materialized
    (:func:`companion.masks.materialize_mask`): query :math:`i` may attend key
    :math:`j` when :math:`j \le i` and both lie in the same chunk,
    :math:`\lfloor j / C \rfloor = \lfloor i / C \rfloor`. ``True`` = may attend; bools
    or 0/1 numbers pass. Named mistakes: "not causal" (the whole chunk, later keys
    included), "sliding window instead of chunks" (:math:`i - C < j \le i`), "chunks
    ignored" (plain causal), "mask inverted".

    Args:
        chunked_mask: a function ``chunked_mask(length, chunk_size)``.
    """
    for length, chunk in ((8, 3), (10, 5), (6, 1), (5, 8)):
        i = torch.arange(length)[:, None]
        j = torch.arange(length)[None, :]
        right = masks.materialize_mask(masks.chunked_causal(chunk), 1, length, length)
        right = right[0, 0]
        same = (i // chunk) == (j // chunk)
        mistakes = [
            Mistake(
                "not causal",
                "inside its chunk a query still sees only the keys up to itself: "
                "combine the chunk test with j <= i.",
                same,
            ),
            Mistake(
                "sliding window instead of chunks",
                "a chunk is fixed (keys floor(j / C) == floor(i / C)); a window "
                "i - C < j <= i moves with the query, so the first query of a chunk "
                "would still see the previous chunk.",
                (j <= i) & (j > i - chunk),
            ),
            Mistake(
                "chunks ignored",
                "each query sees only the keys of its own chunk: add "
                "j // chunk_size == i // chunk_size to the causal test.",
                j <= i,
            ),
            Mistake(
                "mask inverted",
                "return True where attending is ALLOWED, as "
                "F.scaled_dot_product_attention and FlexAttention expect.",
                ~right,
            ),
        ]
        yield Case(
            "causal inside fixed chunks of chunk_size keys",
            {"length": length, "chunk_size": chunk},
            right,
            mistakes,
            atol=0.0,
            rtol=0.0,
        )


@checker
def check_proportional_pairs(
    proportional_pairs: Callable[..., object],
) -> Iterator[Case]:
    r"""Check ``proportional_pairs(head_dim, fraction) -> int``: how many pairs Gemma 4's
    ``proportional`` RoPE turns.

    Reference: Hugging Face's count, ``int(fraction * head_dim // 2)`` in float
    arithmetic (the nonzero frequencies of
    :func:`companion.rope_variants.p_rope_frequencies`): :math:`D = 24`,
    :math:`p = 0.3` turns 3 pairs. Any number type passes. Named mistakes: "rounded"
    (:math:`\lfloor pD/2 + 1/2 \rfloor`: 4 there), "rotary width, not pairs"
    (:math:`pD` dimensions counted), "rounded up" (the ceiling: 3 for :math:`D = 16`,
    :math:`p = 0.3`, where the floor and a rounding give 2), "still pairs counted"
    (:math:`D/2` less the count).

    Args:
        proportional_pairs: a function ``proportional_pairs(head_dim, fraction)``.
    """
    for head_dim, fraction in (
        (16, 0.3),  # 2.4: the floor and a rounding agree, the ceiling does not
        (24, 0.3),  # 3.6: the floor is not a rounding
        (64, 0.3),
        (512, 0.25),
        (128, 1.0),
        (16, 0.0),
    ):
        kept = int((p_rope_frequencies(head_dim, fraction) != 0).sum())
        mistakes = [
            Mistake(
                "rounded",
                "Hugging Face floors the count, int(fraction * head_dim // 2): "
                f"{head_dim} x {fraction} / 2 = {head_dim * fraction / 2:g} pairs "
                f"turn as {kept}, not as the nearest integer.",
                f64(math.floor(head_dim * fraction / 2 + 0.5)),
            ),
            Mistake(
                "rotary width, not pairs",
                "RoPE turns pairs of dimensions: fraction * head_dim dimensions are "
                "half as many pairs.",
                f64(int(fraction * head_dim)),
            ),
            Mistake(
                "rounded up",
                "the count is floored, not rounded up.",
                f64(math.ceil(head_dim * fraction / 2)),
            ),
            Mistake(
                "still pairs counted",
                "count the pairs that turn (the fastest, fraction * head_dim // 2 of "
                "them), not the head_dim // 2 - that many left still.",
                f64(head_dim // 2 - kept),
            ),
        ]
        yield Case(
            "pairs that turn, floored as Hugging Face counts them",
            {"head_dim": head_dim, "fraction": fraction},
            f64(kept),
            mistakes,
            atol=0.0,
            rtol=0.0,
        )
