r"""Linear attention and the gated delta rule: attention as a fixed-size state (issue 35).

**Linear attention** (Katharopoulos et al., 2020) replaces the softmax kernel
``exp(q.k)`` by a product of feature maps ``phi(q).phi(k)``; the causal output is then
a read of a running ``(D, Dv)`` state::

    S_t = sum_{s <= t} phi(k_s) v_s^T,   z_t = sum_{s <= t} phi(k_s),
    o_t = phi(q_t)^T S_t / (phi(q_t)^T z_t)

(:func:`linear_attention`: the quadratic masked form and the recurrence on the state,
equal to float64 rounding).

**The gated delta rule** (DeltaNet, Schlag et al. 2021, Yang et al. 2024; Gated DeltaNet,
Yang et al. 2025) writes to the state by correcting what it already predicts for the key
instead of adding to it. In the papers' notation, with a state ``S_t`` of shape
``(Dv, D)``::

    S_t = S_{t-1} (alpha_t (I - beta_t k_t k_t^T)) + beta_t v_t k_t^T,   o_t = S_t q_t,

``alpha_t = exp(g_t)`` in (0, 1] the decay (``g_t = 0``: DeltaNet), ``beta_t`` the write
strength. With ``alpha_t = 1`` this is one step of gradient descent with rate
``beta_t`` on ``1/2 ||S k_t - v_t||^2`` (online regression of values on keys).
**Storage convention** (Hugging Face's and FLA's): the state is kept transposed,
``M = S^T`` of shape ``(D, Dv)`` (keys along rows, as the linear-attention state), so the
step reads ``M_t = alpha_t (I - beta_t k_t k_t^T) M_{t-1} + beta_t k_t v_t^T`` and
``o_t = M_t^T q_t``. :func:`gated_delta_rule` computes it by the loop (``"recurrent"``)
or by chunks (``"chunked"``, the WY/UT form derived in its docstring); both equal
``transformers.models.qwen3_next``'s ``torch_recurrent_gated_delta_rule`` and
``torch_chunk_gated_delta_rule`` (tested).

Qwen3-Next's Gated DeltaNet layer also has a short depthwise **causal convolution** over
the q/k/v channels with a state for decoding (:func:`causal_conv1d`), the L2
normalisation of q and k (:func:`l2_normalize`) and an output **RMSNorm gated by
SiLU(z)** (:func:`gated_rms_norm`), each equal to its Hugging Face counterpart.

**What it loses** (chapter 11's trained comparison): :class:`LinearSelfAttention` is the
book's causal attention layer with :func:`linear_attention` (``phi = elu + 1``) in place
of the softmax, :class:`LinearTinyTransformer` the tiny model built with it, and
:func:`linear_vs_softmax_runs` trains it against the same model with softmax attention
on the lag task (through :mod:`companion.experiments`, so ``make claims``' variants act);
:func:`lag_weight` reads how much weight each head puts on the key the task asks for;
``labels=["linear (elu + 1)"]`` with :data:`LINEAR_LONG_STEPS` trains linear
attention alone for six times the budget, until it solves the task.

Shapes follow the book's legend, batch-first with heads before length: ``(B, H, L, D)``
(Hugging Face's kernels take ``(B, L, H, D)``: transpose dims 1 and 2; a transposed view
is a normal input). Every function computes in float32 at least (float64 stays float64)
and returns its output in the input's dtype.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from companion import _validate, experiments
from companion.attention import attention_weights
from companion.experiments import SeedRuns
from companion.model import (
    CausalSelfAttention,
    ModelConfig,
    TinyTransformer,
    attention_inputs,
    lag_task,
)

__all__ = [
    "FEATURE_MAPS",
    "LINEAR_LONG_SEEDS",
    "LINEAR_LONG_STEPS",
    "LINEAR_VS_SOFTMAX",
    "LINEAR_VS_SOFTMAX_LR",
    "LINEAR_VS_SOFTMAX_SEEDS",
    "LINEAR_VS_SOFTMAX_SIZES",
    "LINEAR_VS_SOFTMAX_STEPS",
    "LINEAR_VS_SOFTMAX_TASK",
    "LINEAR_VS_SOFTMAX_WARMUP_STEPS",
    "LinearSelfAttention",
    "LinearTinyTransformer",
    "causal_conv1d",
    "gated_delta_rule",
    "gated_rms_norm",
    "l2_normalize",
    "lag_probe",
    "lag_weight",
    "linear_attention",
    "linear_attention_weights",
    "linear_vs_softmax_runs",
]


def _elu1(x: Tensor) -> Tensor:
    return F.elu(x) + 1.0


#: the named feature maps of :func:`linear_attention`: ``"elu1"`` is ``elu(x) + 1``
#: (Katharopoulos et al., 2020), positive, so the normaliser never vanishes
FEATURE_MAPS: dict[str, Callable[[Tensor], Tensor]] = {"elu1": _elu1}

_LA_MODES = ("parallel", "recurrent")
_GDR_MODES = ("recurrent", "chunked")


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 at least: bfloat16/float16 inputs are computed in float32."""
    return torch.promote_types(dtype, torch.float32)


# ---- linear attention ----------------------------------------------------------------------


def _feature_map_and_causal(
    feature_map: object, causal: object, query: Tensor, key: Tensor
) -> tuple[Callable[[Tensor], Tensor], bool]:
    """The feature map (a name of FEATURE_MAPS or a callable) and the causal flag, checked;
    causal needs as many keys as queries."""
    if isinstance(feature_map, str):
        phi = FEATURE_MAPS[
            _validate.choice("feature_map", feature_map, tuple(FEATURE_MAPS))
        ]
    else:
        phi = _validate.callable_("feature_map", feature_map)
    causal = _validate.flag("causal", causal)
    if causal and query.shape[-2] != key.shape[-2]:
        raise ValueError(
            f"query and key must have the same length when causal=True, got query "
            f"{tuple(query.shape)} and key {tuple(key.shape)}"
        )
    return phi, causal


def linear_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    feature_map: str | Callable[[Tensor], Tensor] = "elu1",
    causal: bool = True,
    *,
    mode: str = "parallel",
) -> Tensor:
    r"""Linear attention (Katharopoulos et al., 2020) with a feature map ``phi``.

    .. math::

        o_t = \frac{\phi(q_t)^\top S_t}{\phi(q_t)^\top z_t},\quad
        S_t = \sum_{s \le t} \phi(k_s) v_s^\top,\quad z_t = \sum_{s \le t} \phi(k_s)

    (``s`` over all keys when ``causal=False``). ``mode="parallel"`` computes the
    quadratic form ``A = phi(Q) phi(K)^T`` (masked below the diagonal when causal),
    ``O = A V / (A 1)``, in ``O(L S D)``; ``mode="recurrent"`` runs the loop on the
    ``(D, Dv)`` state ``S_t`` and the ``(D,)`` normaliser ``z_t``, ``O(L D Dv)``: the two
    are equal up to rounding (float64: ~1e-15 relative, tested). Equivalent to the
    following (causal)::

        A = (phi(q) @ phi(k).transpose(-2, -1)).tril()
        out = (A @ v) / A.sum(-1, keepdim=True)

    Args:
        query: ``(B, H, L, D)``.
        key: ``(B, H, S, D)``; ``S == L`` when ``causal``.
        value: ``(B, H, S, Dv)``.
        feature_map: ``"elu1"`` (``elu(x) + 1``) or a callable applied elementwise to
            query and key; it must keep ``phi(q).phi(k)`` positive (the normaliser).
        causal: whether query ``t`` sees keys ``s <= t`` only.
        mode: ``"parallel"`` or ``"recurrent"``.

    Shape:
        Output ``(B, H, L, Dv)``, in query's dtype.
    """
    batch = _validate.attention_inputs(query, key, value)
    phi, causal = _feature_map_and_causal(feature_map, causal, query, key)
    mode = _validate.choice("mode", mode, _LA_MODES)
    dtype = _compute_dtype(query.dtype)
    fq = phi(query.to(dtype))  # (..., L, D)
    fk = phi(key.to(dtype))  # (..., S, D)
    v = value.to(dtype)  # (..., S, Dv)
    if mode == "parallel":
        a = fq @ fk.transpose(-2, -1)  # (..., L, S)
        if causal:
            a = a.tril()
        out = (a @ v) / a.sum(-1, keepdim=True)
        return out.to(query.dtype)
    fq, fk, v = (x.expand(*batch, *x.shape[-2:]) for x in (fq, fk, v))
    if not causal:  # one state over all keys, read by every query
        state = fk.transpose(-2, -1) @ v  # (..., D, Dv)
        z = fk.sum(-2)  # (..., D)
        out = (fq @ state) / (fq @ z.unsqueeze(-1))
        return out.to(query.dtype)
    state = fk.new_zeros(*batch, fk.shape[-1], v.shape[-1])  # S_0 = 0, (..., D, Dv)
    z = fk.new_zeros(*batch, fk.shape[-1])  # z_0 = 0, (..., D)
    outs = []
    for t in range(fq.shape[-2]):
        state = state + fk[..., t, :, None] * v[..., t, None, :]  # + phi(k_t) v_t^T
        z = z + fk[..., t, :]
        num = (fq[..., t, :, None] * state).sum(-2)  # phi(q_t)^T S_t, (..., Dv)
        den = (fq[..., t, :] * z).sum(-1, keepdim=True)  # phi(q_t)^T z_t, (..., 1)
        outs.append(num / den)
    return torch.stack(outs, dim=-2).to(query.dtype)  # (..., L, Dv)


# ---- the gated delta rule ------------------------------------------------------------------


def _gdr_inputs(query, key, value, g, beta, initial_state):
    """Checks of :func:`gated_delta_rule`'s tensors; returns ``(B, H, Hk, L, D, Dv)``."""
    query = _validate.tensor("query", query, ndim=4, meaning="(B, Hk, L, D)")
    key = _validate.tensor_like(
        "key", key, "query", query, ndim=4, meaning="(B, Hk, L, D)"
    )
    _validate.shape("key", key, query.shape, "(query's shape)")
    value = _validate.tensor_like(
        "value", value, "query", query, ndim=4, meaning="(B, H, L, Dv)"
    )
    b, hk, length, d = query.shape
    h, dv = value.shape[1], value.shape[3]
    _validate.same_size("query", query, 0, "value", value, 0, "batch (B)")
    _validate.same_size("query", query, 2, "value", value, 2, "length (L)")
    if h == 0 or h % hk:
        raise ValueError(
            f"value's heads must be a positive multiple of query's heads (Hk = {hk}), "
            f"got value {tuple(value.shape)}"
        )
    if d == 0:
        raise ValueError(
            f"query must have a positive feature width D, got shape {tuple(query.shape)}"
        )
    for name, x in (("g", g), ("beta", beta)):
        if name == "g" and x is None:
            continue
        x = _validate.tensor(name, x, ndim=3, meaning="(B, H, L)")
        _validate.same_device(name, x, "query", query)
        _validate.shape(name, x, (b, h, length), "(B, H, L)")
    if g is not None and bool((g > 0).any()):
        raise ValueError(
            f"g must be <= 0 everywhere (the log of a decay in (0, 1]), got a maximum "
            f"of {float(g.max()):g}"
        )
    if initial_state is not None:
        s = _validate.tensor(
            "initial_state", initial_state, ndim=4, meaning="(B, H, D, Dv)"
        )
        _validate.same_device("initial_state", s, "query", query)
        _validate.shape("initial_state", s, (b, h, d, dv), "(B, H, D, Dv)")
    return b, h, hk, length, d, dv


def gated_delta_rule(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    g: Tensor | None,
    beta: Tensor,
    *,
    mode: str = "chunked",
    chunk_size: int = 64,
    initial_state: Tensor | None = None,
    scale: float = 1.0,
) -> tuple[Tensor, Tensor]:
    r"""The gated delta rule (Gated DeltaNet; ``g=None`` is DeltaNet), by loop or chunks.

    With the state stored as ``M = S^T`` of shape ``(D, Dv)`` (Hugging Face's layout; the
    papers' ``S`` is ``(Dv, D)``), for ``t = 1..L``:

    .. math::

        M_t = \alpha_t (I - \beta_t k_t k_t^\top) M_{t-1} + \beta_t k_t v_t^\top,
        \quad o_t = M_t^\top (\text{scale}\cdot q_t),\quad \alpha_t = e^{g_t},

    i.e. the papers' ``S_t = S_{t-1} alpha_t (I - beta_t k_t k_t^T) + beta_t v_t k_t^T``,
    ``o_t = S_t q_t``. ``mode="recurrent"`` is this loop (the definition). Equivalent to
    the following per head::

        for t in range(L):
            M = alpha[t] * M
            u = beta[t] * (v[t] - M.T @ k[t])   # the correction ("new value")
            M = M + outer(k[t], u)
            o[t] = M.T @ (scale * q[t])

    ``mode="chunked"`` (the WY / UT-transform form of Yang et al.) cuts the sequence into
    chunks of ``C`` steps (the last one padded with ``beta = 0, g = 0``, which leave the
    state unchanged). Inside a chunk with entry state ``M_0``, write
    ``gamma_t = exp(G_t)``, ``G_t = g_1 + ... + g_t`` and ``u_t = beta_t (v_t - alpha_t
    M_{t-1}^T k_t)``, so that ``M_t = alpha_t M_{t-1} + k_t u_t^T``. Unrolling,

    ``M_t = gamma_t M_0 + sum_{s<=t} (gamma_t / gamma_s) k_s u_s^T``,

    and putting ``alpha_t M_{t-1}`` (the same sum over ``s < t``) into ``u_t``:

    ``u_t + beta_t sum_{s<t} (gamma_t/gamma_s) (k_t.k_s) u_s = beta_t v_t - beta_t gamma_t M_0^T k_t``,

    a unit lower-triangular system ``(I + A) U = diag(beta) V - diag(beta gamma) K M_0``
    with ``A_ts = beta_t (gamma_t/gamma_s) k_t.k_s`` for ``s < t``. With ``T = (I + A)^-1``
    (forward substitution, once per chunk and independent of ``M_0``),
    ``W = T diag(beta) V`` and ``Y = T diag(beta gamma) K``: ``U = W - Y M_0``. Then

    ``O = diag(gamma) Q M_0 + ((Q K^T) * Gamma) U``  with ``Gamma_ts = gamma_t/gamma_s`` (``s <= t``, else 0),
    ``M_C = gamma_C M_0 + (diag(gamma_C / gamma) K)^T U``:

    matrix products within a chunk, and a loop of ``L / C`` steps across chunks.

    Where Hugging Face's ``torch_*_gated_delta_rule`` (and FLA's kernels) differ: they take
    ``(B, L, H, D)``, always scale the query by ``D^-1/2`` (here ``scale``, default 1: the
    rule as written), L2-normalise q and k inside when ``use_qk_l2norm_in_kernel`` (here
    the caller applies :func:`l2_normalize`), and compute in float32 whatever the input
    (here float64 stays float64). Grouped heads are the same: key head ``j`` serves value
    heads ``j * H/Hk ... (j+1) * H/Hk - 1``.

    Args:
        query: ``(B, Hk, L, D)``.
        key: ``(B, Hk, L, D)``; unit-norm keys make ``beta`` in (0, 2) a contraction.
        value: ``(B, H, L, Dv)``, ``H`` a multiple of ``Hk``.
        g: ``(B, H, L)``, the log decay, ``<= 0``; ``None`` means 0 (DeltaNet).
        beta: ``(B, H, L)``, the write strength (Qwen3-Next: a sigmoid, in (0, 1)).
        mode: ``"chunked"`` or ``"recurrent"``.
        chunk_size: ``C >= 1`` (``"chunked"`` only; ``L`` need not be a multiple).
        initial_state: ``(B, H, D, Dv)``, ``M_0``; ``None`` means zeros.
        scale: multiplies the query (Hugging Face: ``D ** -0.5``).

    Returns:
        ``(output, final_state)``: output ``(B, H, L, Dv)`` in query's dtype, the state
        ``M_L`` ``(B, H, D, Dv)`` in the compute dtype (float32 at least).
    """
    b, h, hk, length, d, dv = _gdr_inputs(query, key, value, g, beta, initial_state)
    mode = _validate.choice("mode", mode, _GDR_MODES)
    chunk_size = _validate.positive_int("chunk_size", chunk_size)
    scale = _validate.real("scale", scale)
    dtype = _compute_dtype(query.dtype)
    q = query.to(dtype).repeat_interleave(h // hk, dim=1) * scale  # (B, H, L, D)
    k = key.to(dtype).repeat_interleave(h // hk, dim=1)  # (B, H, L, D)
    v = value.to(dtype)  # (B, H, L, Dv)
    g = torch.zeros_like(v[..., 0]) if g is None else g.to(dtype)  # (B, H, L)
    beta = beta.to(dtype)
    if initial_state is None:
        state = v.new_zeros(b, h, d, dv)
    else:
        state = initial_state.to(dtype).clone()
    if mode == "recurrent":
        out = v.new_empty(b, h, length, dv)
        for t in range(length):
            state = state * g[..., t, None, None].exp()  # alpha_t M_{t-1}
            kv = (state * k[..., t, :, None]).sum(-2)  # M^T k_t, (B, H, Dv)
            u = beta[..., t, None] * (v[..., t, :] - kv)  # (B, H, Dv)
            state = state + k[..., t, :, None] * u[..., None, :]  # + k_t u_t^T
            out[..., t, :] = (state * q[..., t, :, None]).sum(-2)  # M_t^T q_t
        return out.to(query.dtype), state
    c = chunk_size
    pad = -length % c
    q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    g, beta = (F.pad(x, (0, pad)) for x in (g, beta))  # g = 0, beta = 0: no change
    n = (length + pad) // c
    q, k, v = (x.reshape(b, h, n, c, x.shape[-1]) for x in (q, k, v))  # (B, H, N, C, .)
    g, beta = (x.reshape(b, h, n, c) for x in (g, beta))  # (B, H, N, C)
    big_g = g.cumsum(-1)  # G_t within each chunk
    upper = torch.ones(c, c, dtype=torch.bool, device=q.device).triu(1)
    # Gamma_ts = gamma_t / gamma_s for s <= t, 0 above the diagonal (masked before exp)
    gamma_ts = (big_g[..., :, None] - big_g[..., None, :]).masked_fill(
        upper, -torch.inf
    )
    gamma_ts = gamma_ts.exp()  # (B, H, N, C, C)
    eye = torch.eye(c, dtype=dtype, device=q.device)
    a = (beta[..., None] * (k @ k.transpose(-2, -1)) * gamma_ts).tril(-1)  # A, s < t
    w = torch.linalg.solve_triangular(  # W = (I + A)^-1 diag(beta) V
        eye + a, beta[..., None] * v, upper=False, unitriangular=True
    )
    y = torch.linalg.solve_triangular(  # Y = (I + A)^-1 diag(beta gamma) K
        eye + a, (beta * big_g.exp())[..., None] * k, upper=False, unitriangular=True
    )
    qk = (q @ k.transpose(-2, -1)) * gamma_ts  # (Q K^T) * Gamma, (B, H, N, C, C)
    q_read = q * big_g.exp()[..., None]  # diag(gamma) Q
    k_write = k * (big_g[..., -1:] - big_g).exp()[..., None]  # diag(gamma_C/gamma) K
    chunk_decay = big_g[..., -1].exp()[..., None, None]  # gamma_C, (B, H, N, 1, 1)
    out = v.new_empty(b, h, n, c, dv)
    for i in range(n):
        u = w[:, :, i] - y[:, :, i] @ state  # U = W - Y M_0, (B, H, C, Dv)
        out[:, :, i] = q_read[:, :, i] @ state + qk[:, :, i] @ u
        state = chunk_decay[:, :, i] * state + k_write[:, :, i].transpose(-2, -1) @ u
    out = out.reshape(b, h, n * c, dv)[:, :, :length]
    return out.to(query.dtype), state


# ---- Qwen3-Next's convolution, normalisation and output gate ----------------------------


def l2_normalize(x: Tensor, eps: float = 1e-6) -> Tensor:
    r"""``x / sqrt(sum(x^2) + eps)`` over the last dimension (FLA's and Hugging Face's
    ``l2norm``, applied to Qwen3-Next's q and k before the delta rule).

    The epsilon sits inside the root (not ``max(||x||, eps)`` as in
    :func:`torch.nn.functional.normalize`), computed in float32 at least.

    Args:
        x: ``(..., D)``.
        eps: added to the squared norm, ``>= 0``.

    Shape:
        Output: as ``x``, in its dtype.
    """
    x = _validate.tensor("x", x, min_ndim=1, meaning="(..., D)")
    eps = _validate.real("eps", eps, minimum=0.0)
    xf = x.to(_compute_dtype(x.dtype))
    return (xf * torch.rsqrt((xf * xf).sum(-1, keepdim=True) + eps)).to(x.dtype)


def causal_conv1d(
    x: Tensor,
    weight: Tensor,
    state: Tensor | None = None,
    *,
    activation: str | None = "silu",
) -> tuple[Tensor, Tensor]:
    r"""A depthwise causal convolution along the sequence, with a state for decoding.

    .. math::

        y_{t,c} = \mathrm{act}\Big(\sum_{j=0}^{K-1} w_{c,j}\, x_{t-K+1+j,\,c}\Big)

    where the ``K - 1`` inputs before ``t = 0`` come from ``state`` (zeros when
    ``None``). The new state is the last ``K - 1`` inputs (state included), so calling
    it one step at a time equals calling it on the whole sequence (tested). Qwen3-Next
    runs it with ``K = 4`` and SiLU over the concatenated q, k, v channels; it equals
    Hugging Face's ``causal_conv1d_fn`` (full) and ``causal_conv1d_update`` (a step),
    whose layout is channels-first ``(B, C, L)`` and whose cached state holds ``K``
    columns (``K - 1`` are read). Equivalent to the following::

        xp = torch.cat([state, x], dim=1)  # (B, K-1+L, C)
        y = F.conv1d(xp.transpose(1, 2), weight[:, None], groups=C).transpose(1, 2)
        y, new_state = F.silu(y), xp[:, L:]

    Args:
        x: ``(B, L, C)``.
        weight: ``(C, K)`` (``nn.Conv1d(C, C, K, groups=C).weight[:, 0]``).
        state: ``(B, K - 1, C)``, the inputs before this call; ``None`` means zeros.
        activation: ``"silu"`` or ``None``.

    Returns:
        ``(y, new_state)``: ``(B, L, C)`` in x's dtype, and ``(B, K - 1, C)``.
    """
    x = _validate.tensor("x", x, ndim=3, meaning="(B, L, C)")
    weight = _validate.tensor_like("weight", weight, "x", x, ndim=2, meaning="(C, K)")
    _validate.same_size("x", x, 2, "weight", weight, 0, "channel (C)")
    if weight.shape[1] == 0:
        raise ValueError(
            f"weight must have a positive kernel size K, got shape {tuple(weight.shape)}"
        )
    if activation is not None:
        activation = _validate.choice("activation", activation, ("silu",))
    bsz, _, ch = x.shape
    width = weight.shape[1] - 1
    if state is None:
        state = x.new_zeros(bsz, width, ch)
    else:
        state = _validate.tensor_like(
            "state", state, "x", x, ndim=3, meaning="(B, K - 1, C)"
        )
        _validate.shape("state", state, (bsz, width, ch), "(B, K - 1, C)")
    xp = torch.cat([state, x], dim=1)  # (B, K-1+L, C)
    dtype = _compute_dtype(x.dtype)
    y = F.conv1d(xp.transpose(1, 2).to(dtype), weight.to(dtype)[:, None], groups=ch)
    y = y.transpose(1, 2)  # (B, L, C)
    if activation == "silu":
        y = F.silu(y)
    return y.to(x.dtype), xp[:, xp.shape[1] - width :].clone()


def gated_rms_norm(
    x: Tensor, gate: Tensor, weight: Tensor, eps: float = 1e-6
) -> Tensor:
    r"""RMSNorm of ``x`` times ``SiLU(gate)``: Qwen3-Next's output gate of the delta rule.

    .. math::

        y = w \odot \frac{x}{\sqrt{\overline{x^2} + \epsilon}} \odot \mathrm{SiLU}(z)

    (norm before gate; the weight is used as is, not ``1 + w``). Equal to Hugging Face's
    ``Qwen3NextRMSNormGated`` (its statistics in float32, the normalised ``x`` cast back
    to x's dtype before the weight, as there). Equivalent to the following::

        xf = x.float()
        y = weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
        y = (y * F.silu(gate.float())).to(x.dtype)

    Args:
        x: ``(..., D)``, the delta rule's output per head.
        gate: ``(..., D)``, the projection ``z`` of the layer's input.
        weight: ``(D,)``.
        eps: inside the root, ``>= 0``.

    Shape:
        Output: as ``x``, in its dtype.
    """
    x = _validate.tensor("x", x, min_ndim=1, meaning="(..., D)")
    gate = _validate.tensor("gate", gate)
    _validate.same_device("gate", gate, "x", x)
    _validate.shape("gate", gate, x.shape, "(x's shape)")
    weight = _validate.tensor("weight", weight, ndim=1, meaning="(D,)")
    _validate.same_device("weight", weight, "x", x)
    _validate.same_size("x", x, -1, "weight", weight, 0, "feature (D)")
    eps = _validate.real("eps", eps, minimum=0.0)
    dtype = _compute_dtype(x.dtype)
    xf = x.to(dtype)
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    y = weight * normed.to(x.dtype)
    return (y * F.silu(gate.to(dtype))).to(x.dtype)


# ---- what it loses: linear against softmax attention on the lag task (chapter 11) -------


def linear_attention_weights(
    query: Tensor,
    key: Tensor,
    feature_map: str | Callable[[Tensor], Tensor] = "elu1",
    causal: bool = True,
) -> Tensor:
    r"""The weight linear attention puts on each key: a row of :func:`linear_attention`.

    .. math::

        a_{ts} = \frac{\phi(q_t)^\top \phi(k_s)}{\sum_{s'} \phi(q_t)^\top \phi(k_{s'})},

    the sum running over the keys ``s' <= t`` when ``causal`` (and ``a_{ts} = 0`` for
    ``s > t``), over every key otherwise; so that ``linear_attention(q, k, v) == linear_attention_weights(q, k) @ v`` up to
    rounding (tested): each row is a probability distribution over the keys, as a
    softmax row (:func:`companion.attention.attention_weights`) is, with the positive
    kernel ``phi(q).phi(k)`` in place of ``exp(q.k / sqrt(D))``.

    Args:
        query: ``(..., L, D)``.
        key: ``(..., S, D)``; ``S == L`` when ``causal``.
        feature_map: as :func:`linear_attention`.
        causal: as :func:`linear_attention`.

    Shape:
        Output ``(..., L, S)``, in query's dtype.
    """
    _validate.attention_inputs(query, key)
    phi, causal = _feature_map_and_causal(feature_map, causal, query, key)
    dtype = _compute_dtype(query.dtype)
    a = phi(query.to(dtype)) @ phi(key.to(dtype)).transpose(-2, -1)  # (..., L, S)
    if causal:
        a = a.tril()
    return (a / a.sum(-1, keepdim=True)).to(query.dtype)


class LinearSelfAttention(CausalSelfAttention):
    r"""The book's causal self-attention with linear attention in place of the softmax.

    :class:`companion.model.CausalSelfAttention` (the projections, the head split, the
    merge) with one hook overridden,
    :meth:`~companion.attention.MultiHeadAttention.attention`: each head's output is
    :func:`linear_attention` with ``phi = elu + 1`` (Katharopoulos et al., 2020), causal,
    in its quadratic (``"parallel"``) form. As in the paper there is no ``1/sqrt(D)``
    (``phi`` is applied to the raw ``q`` and ``k``) and no position step inside the
    layer: positions come from the embedding (``"sinusoidal"`` or ``"learned"``). The
    layer builds its own causal pattern, so ``mask`` is refused
    (``accepts_mask = False``).

    Args:
        dim: model width ``D``.
        num_heads: heads ``H``; must divide ``dim``.

    Shape:
        - input: ``(B, L, D)``
        - output: ``(B, L, D)``
    """

    accepts_mask = False

    def attention(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        is_causal: bool,
    ) -> Tensor:
        """Hook of :meth:`~companion.attention.MultiHeadAttention.attend`:
        :func:`linear_attention` (``"elu1"``) of each head; ``mask`` is always ``None``
        here (refused before).

        Shape:
            q, k, v: ``(B, H, L, D/H)``; output: like q.
        """
        return linear_attention(q, k, v, "elu1", causal=is_causal)


_OUTSIDE_ATTENTION = ("none", "sinusoidal", "learned")


class LinearTinyTransformer(TinyTransformer):
    """:class:`~companion.model.TinyTransformer` whose attention layers are
    :class:`LinearSelfAttention`.

    Only ``_attention`` is overridden, so everything else (embedding, position table or
    encoding, blocks, norms, head) is the base class's, and it trains with
    :func:`companion.experiments.train_batched` like the base class.

    Args:
        config: the sizes; ``config.position`` must add positions to the embedding
            (``"none"``, ``"sinusoidal"`` or ``"learned"``): RoPE and ALiBi act on
            softmax attention's scores, which linear attention does not form.

    Shape:
        - input: token ids ``(B, L)``
        - output: logits ``(B, L, vocab_size)``
    """

    def __init__(self, config: ModelConfig) -> None:
        _validate.instance("config", config, ModelConfig, "a ModelConfig")
        if config.position not in _OUTSIDE_ATTENTION:
            raise ValueError(
                f"config.position must be one of {', '.join(map(repr, _OUTSIDE_ATTENTION))}"
                f" (positions added to the embedding), got {config.position!r}"
            )
        super().__init__(config)

    def _attention(self) -> LinearSelfAttention:
        return LinearSelfAttention(self.config.dim, self.config.num_heads)


LINEAR_VS_SOFTMAX_SIZES = ModelConfig(
    vocab_size=16, dim=32, num_heads=4, num_layers=1, position="sinusoidal"
)
"""Chapter 11's comparison — width 32, four heads of width 8, one layer, 16 tokens,
sinusoidal positions added to the embedding (the same in both models)."""

LINEAR_VS_SOFTMAX_TASK: dict[str, int] = {"batch_size": 32, "length": 24, "lag": 8}
"""Chapter 11's lag task — 32 sequences of 24 tokens a step, output the token eight
places back."""

LINEAR_VS_SOFTMAX_STEPS = 160
"""Chapter 11's comparison — AdamW steps of every run (the budget)."""

LINEAR_VS_SOFTMAX_LR = 2e-2
"""Chapter 11's comparison — AdamW's peak learning rate, the same for both models."""

LINEAR_VS_SOFTMAX_WARMUP_STEPS = 20
"""Chapter 11's comparison — linear warm-up steps, then half a cosine to zero."""

LINEAR_VS_SOFTMAX_SEEDS = 6
"""Chapter 11's comparison trains :func:`~companion.experiments.seeds`
``(LINEAR_VS_SOFTMAX_SEEDS)`` per model."""

LINEAR_LONG_STEPS = 960
"""Chapter 11's longer runs — six times :data:`LINEAR_VS_SOFTMAX_STEPS`, the same
warm-up, then half a cosine to zero over the longer budget: linear attention trained until
it solves the task (in every seed and variant of ``make claims``; its loss still falls,
slowly, when the schedule ends)."""

LINEAR_LONG_SEEDS = 3
"""Chapter 11's longer runs train :func:`~companion.experiments.seeds`
``(LINEAR_LONG_SEEDS)`` linear-attention models."""

LINEAR_VS_SOFTMAX: dict[str, type[TinyTransformer]] = {
    "softmax": TinyTransformer,
    "linear (elu + 1)": LinearTinyTransformer,
}
"""Chapter 11's comparison — label -> the model class, built on
:data:`LINEAR_VS_SOFTMAX_SIZES` (they differ in the attention op only)."""


def linear_vs_softmax_runs(
    seed_list: Sequence[int],
    *,
    steps: int = LINEAR_VS_SOFTMAX_STEPS,
    lr: float = LINEAR_VS_SOFTMAX_LR,
    warmup_steps: int = LINEAR_VS_SOFTMAX_WARMUP_STEPS,
    device: torch.device | str | None = None,
    labels: Sequence[str] | None = None,
) -> dict[str, SeedRuns]:
    """Chapter 11's comparison: each model of :data:`LINEAR_VS_SOFTMAX` over
    ``seed_list``, at the same budget and learning rate.

    Equivalent to the following, for each label::

        experiments.run_seeds(
            lambda: LINEAR_VS_SOFTMAX[label](LINEAR_VS_SOFTMAX_SIZES), seed_list,
            steps=steps, lr=lr, warmup_steps=warmup_steps, schedule="cosine",
            **LINEAR_VS_SOFTMAX_TASK,
        )

    AdamW without weight decay (:func:`~companion.experiments.train_batched`), a linear
    warm-up, then half a cosine to zero at the last step. A seed sets both a model's
    initial weights and its batches, so the two models of one seed see the same data.

    Args:
        seed_list: the seeds (e.g. ``experiments.seeds(6)``).
        steps: optimization steps of every run.
        lr: peak learning rate.
        warmup_steps: linear warm-up steps, fewer than ``steps``.
        device: where to train.
        labels: which of :data:`LINEAR_VS_SOFTMAX` to train (``None``: both), e.g.
            ``["linear (elu + 1)"]`` for the longer runs of
            :data:`LINEAR_LONG_STEPS`.

    Returns:
        label -> :class:`~companion.experiments.SeedRuns`.
    """
    seed_list = experiments.distinct_seeds("seed_list", seed_list)
    steps = _validate.positive_int("steps", steps)
    lr = _validate.positive_real("lr", lr)
    warmup_steps = _validate.nonnegative_int("warmup_steps", warmup_steps)
    if warmup_steps >= steps:
        raise ValueError(
            f"warmup_steps must be fewer than steps ({steps}), got {warmup_steps}"
        )
    device = _validate.device("device", device)
    labels = _validate.choices(
        "labels", tuple(LINEAR_VS_SOFTMAX) if labels is None else labels,
        tuple(LINEAR_VS_SOFTMAX),
    )  # fmt: skip
    return {
        label: experiments.run_seeds(
            lambda cls=LINEAR_VS_SOFTMAX[label]: cls(LINEAR_VS_SOFTMAX_SIZES),
            seed_list,
            device=device,
            steps=steps,
            lr=lr,
            warmup_steps=warmup_steps,
            schedule="cosine",
            **LINEAR_VS_SOFTMAX_TASK,
        )
        for label in labels
    }


def lag_probe(num_sequences: int = 64) -> Tensor:
    """The batch on which chapter 11 reads trained models' attention:
    ``num_sequences`` sequences of :data:`LINEAR_VS_SOFTMAX_TASK`'s length from
    :func:`~companion.model.lag_task`, generator seed 1234 (no training seed), the same
    under every variant.

    Shape:
        output: ``(num_sequences, 24)`` token ids.
    """
    num_sequences = _validate.positive_int("num_sequences", num_sequences)
    return lag_task(
        num_sequences,
        LINEAR_VS_SOFTMAX_TASK["length"],
        lag=LINEAR_VS_SOFTMAX_TASK["lag"],
        vocab_size=LINEAR_VS_SOFTMAX_SIZES.vocab_size,
        generator=torch.Generator().manual_seed(1234),
    )[0]


@torch.no_grad()
def lag_weight(
    models: Sequence[nn.Module],
    probe: Tensor | None = None,
    *,
    lag: int = LINEAR_VS_SOFTMAX_TASK["lag"],
) -> Tensor:
    r"""The attention weight trained tiny models put on the key ``lag`` places back (the
    lag task's answer): :math:`\bar a_{t, t - k}` for each model, layer and head,
    averaged over the probe's sequences and its queries ``t >= lag``.

    A :class:`LinearSelfAttention` layer's weights are
    :func:`linear_attention_weights` (``elu + 1``), a plain
    :class:`~companion.model.CausalSelfAttention` layer's the causal softmax
    (:func:`companion.attention.attention_weights`), each recomputed from the layer's own
    projections on the input it sees. A weight near 1 is a sharp lookup; ``1 / (t + 1)``
    is an even spread over the keys query ``t`` sees.

    Args:
        models: trained :class:`~companion.model.TinyTransformer` s with plain or linear
            attention (e.g. a :class:`~companion.experiments.SeedRuns`' ``models``).
        probe: token ids (``None``: :func:`lag_probe`).
        lag: how far back the key sits, less than the probe's length.

    Returns:
        float64 ``(models, layers, heads)``.
    """
    if isinstance(models, nn.Module) or not isinstance(models, Sequence) or not models:
        raise _validate.fail(
            TypeError, "models", "a non-empty sequence of trained models", models
        )
    probe = lag_probe() if probe is None else probe
    _validate.tensor("probe", probe, dtype="integer", ndim=2, meaning="(B, L)")
    lag = _validate.positive_int("lag", lag)
    if lag >= probe.shape[1]:
        raise ValueError(
            f"lag must be less than the probe's length ({probe.shape[1]}), got {lag}"
        )
    out = []
    for i, net in enumerate(models):
        _validate.module(f"models[{i}]", net, TinyTransformer)
        layers = [m for m in net.modules() if isinstance(m, CausalSelfAttention)]
        for m in layers:
            if type(m) not in (CausalSelfAttention, LinearSelfAttention):
                raise ValueError(
                    f"models[{i}] must use plain or linear attention, got a "
                    f"{type(m).__name__}"
                )
        per_layer = []
        for m, x in attention_inputs(net, probe.to(net.embed.weight.device)):
            q, k = m._split(m.q_proj(x)), m._split(m.k_proj(x))  # (B, H, L, D/H)
            if isinstance(m, LinearSelfAttention):
                w = linear_attention_weights(q, k)  # (B, H, L, L)
            else:
                w = attention_weights(q, k, is_causal=True)  # (B, H, L, L)
            on_lag = w[..., lag:, :].diagonal(dim1=-2, dim2=-1)  # (B, H, L - lag)
            per_layer.append(on_lag.mean(dim=(0, 2)).double())  # (H,)
        out.append(torch.stack(per_layer))  # (layers, H)
    return torch.stack(out)
