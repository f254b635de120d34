"""Chapter 10's checkers (the sink column, iRoPE's layer pattern, chunked attention,
proportional RoPE's pair count): correct answers in several styles pass (lists, NumPy,
tensors, Hugging Face's own expressions); each named mistake is named; a stub is "not
attempted yet"."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from companion import masks
from companion.checks import attention_2026 as checks


def _stub(*args):
    raise NotImplementedError


# ---- check_sink_softmax --------------------------------------------------------------


def sink_cat(scores, sinks):
    """GPT-OSS's eager attention: concatenate the sink column, softmax, drop it."""
    column = sinks[:, None, None].expand(*scores.shape[:2], 1)
    return torch.softmax(torch.cat([scores, column], -1), -1)[..., :-1]


def sink_lse(scores, sinks):
    """exp(s - logsumexp over the row and the sink)."""
    column = sinks[:, None, None].expand(*scores.shape[:2], 1)
    lse = torch.logsumexp(torch.cat([scores, column], -1), -1, keepdim=True)
    return (scores - lse).exp()


def sink_numpy(scores, sinks):
    s, k = np.asarray(scores, dtype=np.float64), np.asarray(sinks, dtype=np.float64)
    top = np.maximum(s.max(-1, keepdims=True), k[:, None, None])
    e = np.exp(s - top)
    return (e / (e.sum(-1, keepdims=True) + np.exp(k[:, None, None] - top))).tolist()


@pytest.mark.parametrize(
    "answer", [sink_cat, sink_lse, sink_numpy], ids=["cat", "lse", "numpy-list"]
)
def test_sink_softmax_accepts(answer) -> None:
    assert checks.check_sink_softmax(answer)


def test_sink_softmax_names(named) -> None:
    named(
        lambda: checks.check_sink_softmax(lambda s, k: torch.softmax(s, -1)),
        "sink ignored",
    )
    named(
        lambda: checks.check_sink_softmax(
            lambda s, k: s.exp() / (s.exp().sum(-1, keepdim=True) + k[:, None, None])
        ),
        "sink not exponentiated",
    )
    named(
        lambda: checks.check_sink_softmax(lambda s, k: sink_cat(s, k[:1].expand_as(k))),
        "one sink for every head",
    )

    def column_kept(s, k):
        column = k[:, None, None].expand(*s.shape[:2], 1)
        return torch.softmax(torch.cat([s, column], -1), -1)  # (H, L, S + 1)

    named(lambda: checks.check_sink_softmax(column_kept), "sink column kept")


def test_sink_softmax_reference_is_gpt_oss_eager_attention() -> None:
    """The checker's reference equals the concatenation (a fully masked row: zeros)."""
    scores = torch.randn(2, 3, 4, dtype=torch.float64)
    scores[0, 0] = float("-inf")
    sinks = torch.tensor([0.5, -1.0], dtype=torch.float64)
    got = checks._sink_weights(scores, sinks)
    torch.testing.assert_close(got, sink_cat(scores, sinks))
    assert (got[0, 0] == 0).all()


# ---- check_nope_layers ---------------------------------------------------------------


def nope_hf(num_layers, interval):
    """transformers' Llama4TextConfig default, verbatim."""
    return [int((i + 1) % interval != 0) for i in range(num_layers)]


def nope_torch(num_layers, interval):
    return (torch.arange(1, num_layers + 1) % interval).bool()


@pytest.mark.parametrize("answer", [nope_hf, nope_torch], ids=["hf", "torch-bool"])
def test_nope_layers_accepts(answer) -> None:
    assert checks.check_nope_layers(answer)


def test_nope_layers_names(named) -> None:
    named(
        lambda: checks.check_nope_layers(
            lambda n, k: [int(i % k != 0) for i in range(n)]
        ),
        "counted from layer 0",
    )
    named(
        lambda: checks.check_nope_layers(
            lambda n, k: [int((i + 1) % k == 0) for i in range(n)]
        ),
        "flags inverted",
    )
    named(
        lambda: checks.check_nope_layers(
            lambda n, k: [int(i % k != 0 or i == 0) for i in range(n)]
        ),
        "NoPE after the interval",
    )
    named(
        lambda: checks.check_nope_layers(
            lambda n, k: [i for i in range(n) if (i + 1) % k == 0]
        ),
        "NoPE layer indices, not flags",
    )


@pytest.mark.parametrize("family", ["Llama4TextConfig", "SmolLM3Config"])
def test_nope_layers_reference_is_transformers_default(family) -> None:
    """Every case's reference is the default ``no_rope_layers`` that transformers builds
    for that many layers and that interval."""
    transformers = pytest.importorskip("transformers")
    config_cls = getattr(transformers, family)
    seen = []

    def from_transformers(n, k):
        seen.append((n, k))
        config = config_cls(num_hidden_layers=n, no_rope_layer_interval=k)
        return config.no_rope_layers

    assert checks.check_nope_layers(from_transformers)
    assert len(seen) == 5  # every case, not only the first


# ---- check_chunked_mask --------------------------------------------------------------


def chunked_loop(length, chunk_size):
    return [
        [j <= i and j // chunk_size == i // chunk_size for j in range(length)]
        for i in range(length)
    ]


def chunked_companion(length, chunk_size):
    mod = masks.chunked_causal(chunk_size)
    return masks.materialize_mask(mod, 1, length, length)[0, 0].int()


@pytest.mark.parametrize(
    "answer", [chunked_loop, chunked_companion], ids=["loop", "companion-int"]
)
def test_chunked_mask_accepts(answer) -> None:
    assert checks.check_chunked_mask(answer)


def _grid(length):
    return torch.arange(length)[:, None], torch.arange(length)[None, :]


def test_chunked_mask_names(named) -> None:
    def not_causal(n, c):
        i, j = _grid(n)
        return i // c == j // c

    def sliding(n, c):
        i, j = _grid(n)
        return (j <= i) & (j > i - c)

    def plain(n, c):
        i, j = _grid(n)
        return j <= i

    def inverted(n, c):
        return ~torch.tensor(chunked_loop(n, c))

    named(lambda: checks.check_chunked_mask(not_causal), "not causal")
    named(
        lambda: checks.check_chunked_mask(sliding), "sliding window instead of chunks"
    )
    named(lambda: checks.check_chunked_mask(plain), "chunks ignored")
    named(lambda: checks.check_chunked_mask(inverted), "mask inverted")


# ---- check_proportional_pairs --------------------------------------------------------


@pytest.mark.parametrize(
    "answer",
    [
        lambda d, p: int(p * d // 2),
        lambda d, p: float(math.floor(p * d / 2)),
        lambda d, p: int(p * d) // 2,
        lambda d, p: np.int64(int(p * d // 2)),
        lambda d, p: torch.tensor(int(p * d // 2)),
    ],
    ids=["hf", "float-floor", "width-halved", "numpy", "tensor"],
)
def test_proportional_pairs_accepts(answer) -> None:
    assert checks.check_proportional_pairs(answer)


def test_proportional_pairs_names(named) -> None:
    named(
        lambda: checks.check_proportional_pairs(lambda d, p: round(p * d / 2)),
        "rounded",
    )
    named(
        lambda: checks.check_proportional_pairs(lambda d, p: int(p * d)),
        "rotary width, not pairs",
    )
    named(
        lambda: checks.check_proportional_pairs(lambda d, p: math.ceil(p * d / 2)),
        "rounded up",
    )
    named(
        lambda: checks.check_proportional_pairs(lambda d, p: d // 2 - int(p * d // 2)),
        "still pairs counted",
    )


def test_proportional_pairs_reference_is_hugging_face_s_count() -> None:
    """Every case's reference is the number of nonzero frequencies of transformers'
    ``proportional`` RoPE for that head width and fraction."""
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    seen = []

    def from_transformers(d, p):
        seen.append((d, p))
        config = transformers.LlamaConfig(
            hidden_size=2 * d,
            num_attention_heads=2,
            head_dim=d,
            rope_parameters={
                "rope_type": "proportional",
                "rope_theta": 10000.0,
                "partial_rotary_factor": p,
            },
        )
        inv_freq, _ = ROPE_INIT_FUNCTIONS["proportional"](config, "cpu")
        return int((inv_freq != 0).sum())

    assert checks.check_proportional_pairs(from_transformers)
    assert len(seen) == 6


# ---- stubs ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "check",
    [
        checks.check_sink_softmax,
        checks.check_nope_layers,
        checks.check_chunked_mask,
        checks.check_proportional_pairs,
        checks.check_sink_gradient,
    ],
)
def test_stub_is_not_attempted(check, capsys) -> None:
    result = check(_stub)
    assert result == False  # noqa: E712 - a CheckResult compares equal to False
    assert "not attempted yet" in capsys.readouterr().out


# ---- check_sink_gradient ---------------------------------------------------------------


def grad_closed(output, grad_output, lse, sinks):
    """The closed form, written out."""
    d = (grad_output * output).sum(-1)
    return -(torch.sigmoid(sinks[None, :, None] - lse) * d).sum(dim=(0, 2))


def grad_softplus(output, grad_output, lse, sinks):
    """p_sink as exp(sigma - logaddexp(lse, sigma)), summed with einsum, as a list."""
    p = torch.exp(sinks[None, :, None] - torch.logaddexp(lse, sinks[None, :, None]))
    return (-torch.einsum("bhl,bhld,bhld->h", p, grad_output, output)).tolist()


def grad_numpy_loop(output, grad_output, lse, sinks):
    o, g, ell, k = (
        np.asarray(x, dtype=np.float64) for x in (output, grad_output, lse, sinks)
    )
    out = np.zeros(k.shape[0])
    for b in range(o.shape[0]):
        for h in range(o.shape[1]):
            for i in range(o.shape[2]):
                p = 1.0 / (1.0 + math.exp(ell[b, h, i] - k[h]))  # -inf lse: p = 1
                out[h] -= p * float(g[b, h, i] @ o[b, h, i])
    return out


def grad_float32(output, grad_output, lse, sinks):
    """The closed form computed wholly in float32."""
    o, g, ell, k = (
        torch.as_tensor(x).float() for x in (output, grad_output, lse, sinks)
    )
    return grad_closed(o, g, ell, k)


@pytest.mark.parametrize(
    "answer",
    [grad_closed, grad_softplus, grad_numpy_loop, grad_float32],
    ids=["closed", "softplus-einsum-list", "numpy-loop", "float32"],
)
def test_sink_gradient_accepts(answer) -> None:
    assert checks.check_sink_gradient(answer)


def test_sink_gradient_reference_is_autograd() -> None:
    """On inputs like the checker's (not its own), the closed form the checker accepts,
    grad_closed, equals autograd's gradient."""
    gen = torch.Generator().manual_seed(3)
    q, k, v = (
        torch.randn(2, 3, 5, 4, generator=gen, dtype=torch.float64) for _ in "qkv"
    )
    sinks = torch.tensor([-0.5, 0.3, 1.2], dtype=torch.float64, requires_grad=True)
    mask = torch.ones(5, 5, dtype=torch.bool).tril()
    mask[:, 0] = False  # an empty first row
    out = masks.attention_with_sinks(q, k, v, sinks, mask=mask)
    grad_out = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    (auto,) = torch.autograd.grad(out, sinks, grad_out)
    lse = torch.logsumexp((q @ k.mT / 2.0).masked_fill(~mask, float("-inf")), -1)
    torch.testing.assert_close(
        grad_closed(out.detach(), grad_out, lse, sinks.detach()), auto
    )


def test_sink_gradient_names(named) -> None:
    named(
        lambda: checks.check_sink_gradient(
            lambda o, g, ell, k: -grad_closed(o, g, ell, k)
        ),
        "sign flipped",
    )
    named(
        lambda: checks.check_sink_gradient(
            lambda o, g, ell, k: -(g * o).sum(dim=(0, 2, 3))
        ),
        "sink share left out",
    )
    named(
        lambda: checks.check_sink_gradient(
            lambda o, g, ell, k: (
                -(torch.sigmoid(ell - k[None, :, None]) * (g * o).sum(-1)).sum(
                    dim=(0, 2)
                )
            )
        ),
        "keys' share for the sink's",
    )
    named(
        lambda: checks.check_sink_gradient(
            lambda o, g, ell, k: (
                -((k[None, :, None] - ell).exp() * (g * o).sum(-1)).sum(dim=(0, 2))
            )
        ),
        "sink share from a log-sum-exp with the sink",
    )
    named(
        lambda: checks.check_sink_gradient(
            lambda o, g, ell, k: grad_closed(o, g, ell, k).sum()
        ),
        "summed over every head",
    )
