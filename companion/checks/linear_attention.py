r"""Checkers for chapter 11 (:ref:`ch-linear-attention`): one step of the gated delta
rule, its chunked form, Qwen3-Next's gates and the bytes of its state cache."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import Tensor

from companion import linear_attention as la
from companion import qwen3_next
from companion.checks._core import Case, Mistake, checker, f64, plural

__all__ = [
    "check_chunked_delta_rule",
    "check_delta_rule_step",
    "check_hybrid_cache_bytes",
    "check_qwen3_next_gates",
]

F64 = torch.float64


def _randn(gen: torch.Generator, *shape: int) -> Tensor:
    return torch.randn(*shape, generator=gen, dtype=F64)


# ---- one step of the gated delta rule ------------------------------------------------


def _step(state, q, k, v, alpha, beta, *, correct_with=None, decay_after=False):
    """One step in the storage convention M (D, Dv); variants for the mistakes."""
    decayed = state if decay_after else alpha * state
    seen = decayed if correct_with is None else correct_with
    u = beta * (v - seen.T @ k)  # (Dv,)
    new = decayed + torch.outer(k, u)
    if decay_after:
        new = alpha * new
    return new.T @ q, new


@checker
def check_delta_rule_step(delta_rule_step: Callable[..., object]) -> Iterator[Case]:
    r"""Check ``delta_rule_step(state, q, k, v, g, beta) -> (output, new_state)``: one
    step of the gated delta rule, state stored as Hugging Face stores it.

    Reference: with ``alpha = exp(g)``, :math:`M' = \alpha M + k\,u^\top`,
    :math:`u = \beta (v - \alpha M^\top k)` (the correction of what the decayed state
    predicts for ``k``), and the output :math:`M'^\top q`, read after the write; equal
    to :func:`companion.linear_attention.gated_delta_rule` on one token. Any float dtype
    and any layout of the two parts (tensors, NumPy arrays, lists) pass. Named
    mistakes: "linear-attention write" (:math:`\alpha M + \beta k v^\top`, no
    correction), "correction from the undecayed state", "decay after the write",
    "output read from the old state" (:math:`M^\top q`), "output read before the
    write" (:math:`\alpha M^\top q`), "g used as the decay" (``alpha = g``).

    Args:
        delta_rule_step: a function of ``state (D, Dv)``, ``q (D,)``, ``k (D,)`` (unit
            norm), ``v (Dv,)``, ``g`` (a float ``<= 0``) and ``beta`` (a float in
            (0, 1)), returning ``(output (Dv,), new_state (D, Dv))``.
    """
    for seed, (d, dv), g in ((0, (4, 3), -0.3), (1, (5, 2), 0.0), (2, (3, 6), -1.2)):
        gen = torch.Generator().manual_seed(seed)
        state = _randn(gen, d, dv)
        q, k = la.l2_normalize(_randn(gen, d)), la.l2_normalize(_randn(gen, d))
        v = _randn(gen, dv)
        beta = float(torch.rand((), generator=gen, dtype=F64) * 0.8 + 0.1)
        alpha = torch.tensor(g, dtype=F64).exp()
        right = _step(state, q, k, v, alpha, beta)
        plain = alpha * state + beta * torch.outer(k, v)
        mistakes = [
            Mistake(
                "linear-attention write",
                "the delta rule writes the correction beta (v - alpha M^T k), not v: "
                "subtract what the decayed state already predicts for k.",
                (plain.T @ q, plain),
            ),
            Mistake(
                "correction from the undecayed state",
                "decay first (alpha M), then correct what that decayed state predicts: "
                "u = beta (v - alpha M^T k).",
                _step(state, q, k, v, alpha, beta, correct_with=state),
            ),
            Mistake(
                "decay after the write",
                "the decay multiplies the old state before the write, not the new "
                "state after it: M' = alpha M + k u^T.",
                _step(state, q, k, v, alpha, beta, decay_after=True),
            ),
            Mistake(
                "output read from the old state",
                "the output reads the state after this token's write: o = M'^T q.",
                (state.T @ q, None),
            ),
            Mistake(
                "output read before the write",
                "decay, correct and write first; the output reads the state after "
                "this token's write: o = M'^T q, not (alpha M)^T q.",
                ((alpha * state).T @ q, None),
            ),
            Mistake(
                "g used as the decay",
                "g is the log of the decay: alpha = exp(g), in (0, 1].",
                _step(state, q, k, v, torch.tensor(g, dtype=F64), beta),
            ),
        ]
        if g == 0.0:  # alpha = 1: the decay's mistakes give the right answer
            mistakes = mistakes[:1] + mistakes[3:4]  # "before the write" = "old state"
        yield Case(
            f"one step with D = {d}, Dv = {dv}, g = {g}",
            {"state": state, "q": q, "k": k, "v": v, "g": g, "beta": beta},
            right,
            mistakes,
            atol=1e-6,  # a float32 computation passes
            rtol=1e-6,
            parts=("output", "new_state"),
        )


# ---- the chunked form ----------------------------------------------------------------


def _rule(q, k, v, g, beta, **kw) -> Tensor:
    """companion's gated delta rule on one head ``(L, D)``: the output ``(L, Dv)``."""
    out, _ = la.gated_delta_rule(
        q[None, None], k[None, None], v[None, None],
        None if g is None else g[None, None], beta[None, None], **kw,
    )  # fmt: skip
    return out[0, 0]


def _chunked(q, k, v, g, beta, chunk, *, diagonal=False, read_entry=True) -> Tensor:
    """The chunked form as the chapter derives it, with two wrong variants: ``A`` that
    keeps its diagonal, and outputs that leave out the entry state's read."""
    m, outs = torch.zeros(q.shape[1], v.shape[1], dtype=F64), []
    for s in range(0, q.shape[0], chunk):
        qc, kc, vc, gc, bc = (x[s : s + chunk] for x in (q, k, v, g, beta))
        big_g = gc.cumsum(0)  # G_t
        ratio = (big_g[:, None] - big_g[None, :]).tril().exp().tril()  # Gamma_ts
        a = (bc[:, None] * (kc @ kc.T) * ratio).tril(0 if diagonal else -1)
        system = torch.eye(len(qc), dtype=F64) + a
        w = torch.linalg.solve_triangular(system, bc[:, None] * vc, upper=False)
        y = torch.linalg.solve_triangular(
            system, (bc * big_g.exp())[:, None] * kc, upper=False
        )
        u = w - y @ m  # the chunk's corrections
        out = ((qc @ kc.T) * ratio) @ u
        outs.append(out + big_g.exp()[:, None] * (qc @ m) if read_entry else out)
        m = big_g[-1].exp() * m + (kc * (big_g[-1] - big_g).exp()[:, None]).T @ u
    return torch.cat(outs)


@checker
def check_chunked_delta_rule(
    chunked_delta_rule: Callable[..., object],
) -> Iterator[Case]:
    r"""Check ``chunked_delta_rule(q, k, v, g, beta, chunk_size) -> (L, Dv)``: the gated
    delta rule on one head computed chunk by chunk.

    Reference: the recurrence (:func:`companion.linear_attention.gated_delta_rule`,
    ``mode="recurrent"``, scale 1, zero initial state); a chunked computation equals it
    to rounding, whatever ``chunk_size`` and whether ``L`` is a multiple of it. Any float
    dtype and layout pass (tolerance 1e-6). Named mistakes: "state not carried across
    chunks" (each chunk starts from zeros), "entry state not read" (the outputs
    leave out :math:`\mathrm{diag}(\gamma) Q M_0`), "A with its diagonal" (``tril()``
    where ``tril(-1)`` is meant), "decay left out" (``g`` ignored),
    "linear-attention write" (:math:`M \leftarrow \alpha M + \beta k v^\top`).

    Args:
        chunked_delta_rule: a function of ``q, k (L, D)`` (unit norm), ``v (L, Dv)``,
            ``g (L,)`` (``<= 0``), ``beta (L,)`` and the int ``chunk_size``, returning
            the outputs ``(L, Dv)``.
    """
    for seed, length, chunk in ((0, 10, 4), (1, 8, 8), (2, 9, 3), (3, 5, 1)):
        gen = torch.Generator().manual_seed(seed)
        d, dv = 4, 3
        q, k = (la.l2_normalize(_randn(gen, length, d)) for _ in range(2))
        v = _randn(gen, length, dv)
        g = -torch.rand(length, generator=gen, dtype=F64)
        beta = torch.rand(length, generator=gen, dtype=F64) * 0.8 + 0.1
        right = _rule(q, k, v, g, beta, mode="recurrent")
        pieces = [
            _rule(q[s : s + chunk], k[s : s + chunk], v[s : s + chunk],
                  g[s : s + chunk], beta[s : s + chunk], mode="recurrent")
            for s in range(0, length, chunk)
        ]  # fmt: skip
        state, plain = torch.zeros(d, dv, dtype=F64), []
        for t in range(length):  # linear attention with the decay: no correction
            state = g[t].exp() * state + beta[t] * torch.outer(k[t], v[t])
            plain.append(state.T @ q[t])
        mistakes = [
            Mistake(
                "A with its diagonal",
                "A_ts = beta_t (gamma_t / gamma_s) k_t . k_s holds only s < t "
                "(tril(-1)): the diagonal of the system I + A is one.",
                _chunked(q, k, v, g, beta, chunk, diagonal=True),
            ),
            Mistake(
                "decay left out",
                "multiply the state by alpha_t = exp(g_t) at every step: inside a chunk "
                "by the ratios gamma_t / gamma_s, across chunks by gamma_C.",
                _rule(q, k, v, None, beta, mode="recurrent"),
            ),
            Mistake(
                "linear-attention write",
                "the delta rule writes corrections u = W - Y M_0 (the unit "
                "lower-triangular solve), not beta v.",
                torch.stack(plain),
            ),
        ]
        if length > chunk:
            mistakes[:0] = [
                Mistake(
                    "state not carried across chunks",
                    "each chunk starts from the state the previous chunks left "
                    "(M_0), read by diag(gamma) Q M_0 and corrected by - Y M_0.",
                    torch.cat(pieces),
                ),
                Mistake(
                    "entry state not read",
                    "a chunk's outputs read its entry state too: add "
                    "diag(gamma) Q M_0 to ((Q K^T) * Gamma) U.",
                    _chunked(q, k, v, g, beta, chunk, read_entry=False),
                ),
            ]
        yield Case(
            f"equals the recurrence: {plural(length, 'token')} in chunks of {chunk}",
            {"q": q, "k": k, "v": v, "g": g, "beta": beta, "chunk_size": chunk},
            right,
            mistakes,
            atol=1e-6,
            rtol=1e-6,
        )


# ---- Qwen3-Next's gates --------------------------------------------------------------


@checker
def check_qwen3_next_gates(gates: Callable[..., object]) -> Iterator[Case]:
    r"""Check ``gates(a, b, a_log, dt_bias) -> (g, beta)``: Qwen3-Next's log decay and
    write strength from the layer's projections.

    Reference (Hugging Face's ``Qwen3NextGatedDeltaNet``, and
    :class:`companion.qwen3_next.Qwen3NextBlock`): :math:`g = -e^{A_{\log}}\,
    \mathrm{softplus}(a + \delta)`, :math:`\beta = \sigma(b)`, with ``a_log`` and
    ``dt_bias`` (:math:`\delta`) one per value head. Any float dtype and layout pass.
    Named mistakes: "decay instead of its log" (``exp(g)``), "g with the wrong sign",
    "A_log used without exp", "dt_bias left out", "softplus left out", "beta not
    squashed".

    Args:
        gates: a function of ``a, b (L, H)`` and ``a_log, dt_bias (H,)`` returning
            ``(g (L, H), beta (L, H))``.
    """
    for seed, (length, heads) in ((0, (5, 4)), (1, (3, 2))):
        gen = torch.Generator().manual_seed(seed)
        a, b = _randn(gen, length, heads) * 2, _randn(gen, length, heads) * 2
        a_log = torch.rand(heads, generator=gen, dtype=F64) * 2 - 1
        dt_bias = _randn(gen, heads)
        g = -a_log.exp() * F.softplus(a + dt_bias)
        beta = torch.sigmoid(b)
        yield Case(
            f"g and beta of {plural(length, 'token')} and {plural(heads, 'head')}",
            {"a": a, "b": b, "a_log": a_log, "dt_bias": dt_bias},
            (g, beta),
            [
                Mistake(
                    "decay instead of its log",
                    "return g, the log of the decay (<= 0); the rule takes alpha = "
                    "exp(g) itself.",
                    (g.exp(), None),
                ),
                Mistake(
                    "g with the wrong sign",
                    "g = -exp(A_log) softplus(a + dt_bias) is <= 0; without the minus "
                    "exp(g) > 1 and the state grows at every step.",
                    (-g, None),
                ),
                Mistake(
                    "A_log used without exp",
                    "A_log stores the log of A: the rate is -exp(A_log), always < 0.",
                    (-a_log * F.softplus(a + dt_bias), None),
                ),
                Mistake(
                    "dt_bias left out",
                    "the step is softplus(a + dt_bias): add the per-head bias first.",
                    (-a_log.exp() * F.softplus(a), None),
                ),
                Mistake(
                    "softplus left out",
                    "softplus(a + dt_bias) keeps the step positive, so g <= 0 and the "
                    "decay stays in (0, 1].",
                    (-a_log.exp() * (a + dt_bias), None),
                ),
                Mistake(
                    "beta not squashed",
                    "beta = sigmoid(b), a write strength in (0, 1).",
                    (None, b),
                ),
            ],
            atol=1e-6,
            rtol=1e-6,
            parts=("g", "beta"),
        )


# ---- the bytes of the state cache ----------------------------------------------------

# (linear layers, full layers, H_k, H_v, d_k, d_v, K, H_kv, D, tokens)
_CACHE_CASES = (
    # first: four value heads per key head and d_k != d_v, so that counting the state
    # per key head (a quarter) and in bfloat16 (a half) give different numbers; with
    # Qwen3-Next's two value heads per key head both halve the state
    (2, 1, 1, 4, 8, 6, 3, 1, 16, 5),
    (36, 12, 16, 32, 128, 128, 4, 2, 256, 1),  # Qwen3-Next-80B-A3B, one token
    (36, 12, 16, 32, 128, 128, 4, 2, 256, 262_144),  # and at 262,144 tokens
    (3, 1, 2, 4, 8, 8, 4, 2, 16, 10),  # the chapter's tiny model
)


def _bytes(n_lin, n_full, hk, hv, dk, dv, kernel, hkv, d, *, state=4, b=2):
    """(conv, recurrent, kv per token) in bytes, written out for the mistakes."""
    conv = n_lin * (kernel - 1) * (2 * hk * dk + hv * dv) * b
    return conv, n_lin * hv * dk * dv * state, n_full * 2 * hkv * d * b


@checker
def check_hybrid_cache_bytes(
    hybrid_cache_bytes: Callable[..., object],
) -> Iterator[Case]:
    r"""Check ``hybrid_cache_bytes(...)``: the bytes a Qwen3-Next-style cache holds for
    one sequence, from ten ints in this order: ``num_linear``, ``num_full``,
    ``linear_key_heads``, ``linear_value_heads``, ``key_head_dim``, ``value_head_dim``,
    ``conv_kernel``, ``num_kv_heads``, ``head_dim``, ``tokens``.

    Reference: :func:`companion.qwen3_next.state_cache_bytes` (bfloat16 model, the
    delta rule's state in float32): per linear layer the convolution's last ``K - 1``
    inputs, :math:`(K - 1)(2 H_k d_k + H_v d_v)` numbers, and the state
    :math:`H_v d_k d_v`, the same at any length; per full layer and token a key and a
    value, :math:`2 H_{kv} D`. Any number type passes. Named mistakes: "state grows
    with the tokens", "state in bfloat16", "state per key head" (:math:`H_k d_k d_v`),
    "every layer caches keys and values",
    "keys only", "convolution state left out", "K convolution columns".

    Args:
        hybrid_cache_bytes: a function of ten ints returning the number of bytes.
    """
    for case in _CACHE_CASES:
        *sizes, tokens = case
        n_lin, n_full, hk, hv, dk, dv, kernel, hkv, d = sizes
        types = ["linear_attention"] * n_lin + ["full_attention"] * n_full
        config = SimpleNamespace(
            layer_types=types, linear_num_key_heads=hk, linear_num_value_heads=hv,
            linear_key_head_dim=dk, linear_value_head_dim=dv,
            linear_conv_kernel_dim=kernel, num_key_value_heads=hkv, head_dim=d,
        )  # fmt: skip
        ref = qwen3_next.state_cache_bytes(config)
        conv, rec, kv = _bytes(*sizes)
        assert (conv + rec, kv) == (ref.state_per_sequence, ref.kv_per_token)
        wide = _bytes(n_lin, n_full, hk, hv, dk, dv, kernel + 1, hkv, d)[0]
        all_kv = (n_lin + n_full) * 2 * hkv * d * 2
        yield Case(
            f"bytes of the cache after {plural(tokens, 'token')}",
            dict(
                zip(
                    (
                        "num_linear",
                        "num_full",
                        "linear_key_heads",
                        "linear_value_heads",
                        "key_head_dim",
                        "value_head_dim",
                        "conv_kernel",
                        "num_kv_heads",
                        "head_dim",
                        "tokens",
                    ),
                    case,
                    strict=True,
                )
            ),
            f64(conv + rec + tokens * kv),
            [
                Mistake(
                    "state grows with the tokens",
                    "a linear layer's state is a fixed matrix per sequence: count it "
                    "once, not once per token.",
                    f64(tokens * (conv + rec + kv)),
                ),
                Mistake(
                    "state in bfloat16",
                    "the delta rule's state is kept in float32 (4 bytes) even in a "
                    "bfloat16 model, as Hugging Face keeps it.",
                    f64(conv + rec // 2 + tokens * kv),
                ),
                Mistake(
                    "state per key head",
                    "each value head keeps its own d_k x d_v state (key heads are "
                    "shared by H_v / H_k value heads): H_v d_k d_v numbers per layer.",
                    f64(conv + rec * hk // hv + tokens * kv),
                ),
                Mistake(
                    "every layer caches keys and values",
                    "only the full-attention layers keep keys and values; the linear "
                    "ones keep a state.",
                    f64(conv + rec + tokens * all_kv),
                ),
                Mistake(
                    "keys only",
                    "a full layer caches a key AND a value per token and key/value "
                    "head: 2 H_kv D numbers.",
                    f64(conv + rec + tokens * kv // 2),
                ),
                Mistake(
                    "convolution state left out",
                    "each linear layer also keeps the last K - 1 inputs of its causal "
                    "convolution (2 H_k d_k + H_v d_v channels).",
                    f64(rec + tokens * kv),
                ),
                Mistake(
                    "K convolution columns",
                    "the convolution reads K - 1 earlier inputs: Hugging Face stores K "
                    "columns, one never read; count the K - 1 it needs.",
                    f64(wide + rec + tokens * kv),
                ),
            ],
            atol=0.5,
            rtol=0.0,
        )
