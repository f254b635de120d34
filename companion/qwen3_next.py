r"""Qwen3-Next's text model, a hybrid of Gated DeltaNet and gated attention (issue 35).

Qwen3-Next (Qwen team, 2025) keeps a pre-norm decoder and changes what mixes the tokens,
read from Hugging Face's ``Qwen3NextConfig``:

* **Most layers are linear attention** (``layer_types`` entry ``"linear_attention"``,
  three of every four in the published configs): a **Gated DeltaNet** whose state is
  a fixed ``(H_v, d_k, d_v)`` matrix per sequence instead of a growing KV cache. From
  the normalized input ``x`` the in-projections give, per key head, ``q, k`` (``d_k``
  each), and for its ``H_v / H_k`` value heads ``v`` and the output gate ``z``
  (``in_proj_qkvz``, grouped by key head as Hugging Face's
  ``fix_query_key_value_ordering`` lays it out), and ``b, a`` per value head
  (``in_proj_ba``, grouped the same way). Then

  .. math::

      [q; k; v] \leftarrow \mathrm{SiLU}(\mathrm{conv}_K([q; k; v])),\quad
      \hat q, \hat k = \frac{q}{\|q\|}, \frac{k}{\|k\|},\quad
      \beta = \sigma(b),\quad g = -e^{A_{\log}}\,\mathrm{softplus}(a + \delta),

  the gated delta rule on :math:`(d_k^{-1/2}\hat q, \hat k, v, g, \beta)`, each value
  head's output normalized and gated, :math:`\mathrm{RMSNorm}(o) \odot
  \mathrm{SiLU}(z)`, and the out-projection. The math is
  :mod:`companion.linear_attention`'s (:func:`~companion.linear_attention.causal_conv1d`,
  :func:`~companion.linear_attention.l2_normalize`,
  :func:`~companion.linear_attention.gated_delta_rule`,
  :func:`~companion.linear_attention.gated_rms_norm`), called here, not copied.
* **The other layers are gated full attention**: the query projection is doubled,
  each head's rows ``[query | gate]``, and the attention output is multiplied by
  :math:`\sigma(\text{gate})` before ``o_proj``; QK-norm per head; RoPE on the first
  ``partial_rotary_factor`` of each head (0.25 published); grouped key heads.
* **RMSNorm with** :math:`1 + w` (the weight stored zero-centred, in float32 as
  Gemma's: ``rms_variant="gemma"``) in every norm but the gated one, which uses
  :math:`w` as it is.
* **A mixture of experts** where ``(i + 1) % decoder_sparse_step == 0`` and ``i`` is not
  in ``mlp_only_layers`` (a dense SwiGLU MLP there): a softmax over all ``N``
  experts' router logits, the ``num_experts_per_tok`` largest kept and, with
  ``norm_topk_prob``, renormalized; each chosen expert a SwiGLU (``gate_up_proj``
  ``(N, 2I, E)``, gate rows then up rows); plus a **shared expert** (a SwiGLU of width
  ``shared_expert_intermediate_size``) scaled by :math:`\sigma(x w_s)`.

**The cache.** A full layer caches ``(key, value)`` as every family does. A linear layer
caches ``(conv_state, recurrent_state, seen)``: the last ``K - 1`` inputs of the
convolution ``(B, K - 1, C)``, ``C = 2 H_k d_k + H_v d_v`` (Hugging Face keeps ``K``
columns, the oldest never read), the delta rule's state ``(B, H_v, d_k, d_v)`` in
float32 at least (as Hugging Face's), and the tokens seen. :func:`state_cache_bytes`
gives what that costs per sequence, against the KV cache of a model whose every layer
were full attention.

**Padding.** As Hugging Face's ``apply_mask_to_padding_states``, a linear layer zeros
the normalized input at padding tokens before its projections (so a left-padded row's
convolution and state see zeros there); the copy reads the padding from the additive
mask every block receives (a token is padding where it cannot see itself).

:data:`PORTS` holds the port :func:`companion.decoder.from_hf` finds for
``Qwen3NextForCausalLM``: :class:`Qwen3NextSpec` (the parent's ``layer_types`` are all
``"full_attention"``, the masks every layer gets; ``linear_layers`` names the Gated
DeltaNet layers) and :class:`Qwen3NextBlock`, which overrides the attention step, the
MLP step and the cache check. Refused by name: layer types other than
``linear_attention`` and ``full_attention``, an activation other than SiLU (the
convolution's and the experts'), a quantized checkpoint, a RoPE type outside
``companion.decoder.ROPE_TYPES``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from companion import _validate
from companion._architecture import (
    Decoder,
    DecoderBlock,
    grouped_attention,
    rotate_head,
)
from companion._spec import ACTIVATIONS, DecoderSpec
from companion.families import (
    Port,
    base_fields,
    copy_linear,
    copy_norm,
    copy_output,
    copy_tensor,
    copy_weight,
    routed_experts,
    unsupported,
)
from companion.linear_attention import (
    causal_conv1d,
    gated_delta_rule,
    gated_rms_norm,
    l2_normalize,
)

__all__ = [
    "PORTS",
    "Qwen3NextBlock",
    "Qwen3NextSpec",
    "StateCacheBytes",
    "state_cache_bytes",
]

_LAYER_TYPES = ("linear_attention", "full_attention")


# ---- the spec ------------------------------------------------------------------------


@dataclass(frozen=True)
class Qwen3NextSpec(DecoderSpec):
    r"""A :class:`~companion.decoder.DecoderSpec` with Qwen3-Next's fields.

    The inherited fields describe the full-attention layers (``num_heads``,
    ``num_kv_heads``, ``head_dim``, ``rotary_dim`` = ``head_dim`` times
    ``partial_rotary_factor``) and the dense MLP (``intermediate_size``);
    ``layer_types`` stays all ``"full_attention"`` (the mask every layer receives: a
    linear layer reads only the padding from it).

    The fields beyond DecoderSpec's:

    Args:
        linear_layers: the Gated DeltaNet layers, increasing indices.
        linear_num_key_heads: :math:`H_k`, query/key heads of a linear layer.
        linear_num_value_heads: :math:`H_v`, a multiple of :math:`H_k`.
        linear_key_head_dim: :math:`d_k`.
        linear_value_head_dim: :math:`d_v`.
        linear_conv_kernel: :math:`K`, the causal convolution's width.
        chunk_size: the chunk of the delta rule's chunked form on prompts (Hugging
            Face's 64; one new token runs the recurrence).
        moe_layers: the layers whose MLP is the mixture of experts.
        num_experts: :math:`N`, experts per MoE layer (0 when there is none).
        num_experts_per_tok: experts each token goes to, ``1 .. num_experts``.
        moe_intermediate_size: :math:`I`, one expert's width.
        shared_expert_intermediate_size: the shared expert's width.
        norm_topk_prob: renormalize the chosen experts' probabilities to sum to one.

    Every field is checked when the record is made (``TypeError``/``ValueError``
    naming it).
    """

    linear_layers: tuple[int, ...] = ()
    linear_num_key_heads: int = 1
    linear_num_value_heads: int = 1
    linear_key_head_dim: int = 1
    linear_value_head_dim: int = 1
    linear_conv_kernel: int = 4
    chunk_size: int = 64
    moe_layers: tuple[int, ...] = ()
    num_experts: int = 0
    num_experts_per_tok: int = 1
    moe_intermediate_size: int = 1
    shared_expert_intermediate_size: int = 1
    norm_topk_prob: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_qwen3_next(self)


def _check_qwen3_next(spec: Qwen3NextSpec) -> None:
    v, n = _validate, spec.num_layers

    def put(name: str, value: object) -> None:  # the record is frozen
        object.__setattr__(spec, name, value)

    put("linear_layers", v.layer_indices("linear_layers", spec.linear_layers, n))
    put("moe_layers", v.layer_indices("moe_layers", spec.moe_layers, n))
    for name in (
        "linear_num_key_heads",
        "linear_key_head_dim",
        "linear_value_head_dim",
        "linear_conv_kernel",
        "chunk_size",
        "moe_intermediate_size",
        "shared_expert_intermediate_size",
    ):
        put(name, v.positive_int(name, getattr(spec, name)))
    hv = v.positive_int("linear_num_value_heads", spec.linear_num_value_heads)
    if hv % spec.linear_num_key_heads:
        raise ValueError(
            f"linear_num_value_heads must be a multiple of linear_num_key_heads "
            f"({spec.linear_num_key_heads}), got {hv}"
        )
    put("linear_num_value_heads", hv)
    put("num_experts", v.nonnegative_int("num_experts", spec.num_experts))
    if spec.moe_layers and not spec.num_experts:
        raise ValueError(
            f"num_experts must be positive when moe_layers is not empty, got 0 with "
            f"moe_layers {spec.moe_layers}"
        )
    put(
        "num_experts_per_tok",
        v.integer(
            "num_experts_per_tok",
            spec.num_experts_per_tok,
            minimum=1,
            maximum=max(spec.num_experts, 1),
        ),
    )
    put("norm_topk_prob", v.flag("norm_topk_prob", spec.norm_topk_prob))
    fixed = {  # field -> (what Qwen3-Next's block needs, why)
        "positions": ("rope", "partial RoPE"),
        "norm": ("rms", "RMSNorm"),
        "rms_variant": ("gemma", "RMSNorm with 1 + w in float32"),
        "qk_norm": ("head", "QK-norm per head"),
        "mlp": ("gated", "SwiGLU MLPs"),
        "activation": ("silu", "SiLU in the convolution and the MLPs"),
        "parallel_residual": (False, "a serial block"),
        "block_norms": ("pre", "pre-norm"),
        "attn_softcap": (0.0, "no soft cap"),
        "sliding_window": (0, "no sliding layers"),
        "layer_types": (("full_attention",) * n, "linear_layers names the others"),
        "nope_layers": ((), "RoPE in every full layer"),
        "local_rope": ({}, "one RoPE table"),
        "rope_layout": ("half", "Hugging Face's rotate_half"),
        "mlp_bias": (False, "MLPs without biases"),
    }
    _validate.fixed_fields(spec, fixed, "a Qwen3NextSpec")


# ---- the cache's bytes ---------------------------------------------------------------


class StateCacheBytes(NamedTuple):
    """What :func:`state_cache_bytes` computes for one sequence."""

    conv_per_sequence: int
    """Bytes of every linear layer's convolution state, ``(K - 1) C`` each."""
    recurrent_per_sequence: int
    """Bytes of every linear layer's delta-rule state, ``H_v d_k d_v`` each (float32
    at least)."""
    state_per_sequence: int
    """The linear layers' whole cache, the sum of the two above, the same at any
    length."""
    kv_per_token: int
    """Bytes per token of the full layers' keys and values, ``2 H_kv D`` each."""
    all_full_kv_per_token: int
    """Bytes per token of the KV cache were every layer full attention."""


def state_cache_bytes(
    config: Any, dtype: torch.dtype = torch.bfloat16
) -> StateCacheBytes:
    r"""Bytes of Qwen3-Next's cache per sequence, from the formula, against a full one.

    With :math:`n_\ell` linear layers, :math:`n_f` full ones, :math:`b` bytes per
    element of ``dtype`` and :math:`b_s` of the state's dtype (float32 at least, as
    Hugging Face and :func:`~companion.linear_attention.gated_delta_rule` keep it):

    .. math::

        \text{state} = n_\ell\,\big((K - 1)(2 H_k d_k + H_v d_v)\,b
        + H_v d_k d_v\,b_s\big),\qquad
        \text{KV per token} = n_f \cdot 2 H_{kv} D\,b,

    against :math:`(n_\ell + n_f) \cdot 2 H_{kv} D\,b` per token with every layer
    full. A sequence of :math:`L` tokens holds ``state + L * kv_per_token``. Hugging
    Face's cache keeps :math:`K` convolution columns (one more than is read): its
    tensors hold ``n_l * C * b`` bytes more (``tests/test_qwen3_next.py`` counts them).

    Example, the installed ``Qwen3NextConfig()``'s defaults (its docstring: "a
    Qwen3-Next-80B-A3B style configuration"; 36 linear and 12 full layers, bfloat16)::

        >>> state_cache_bytes(transformers.Qwen3NextConfig())
        StateCacheBytes(conv_per_sequence=1769472, recurrent_per_sequence=75497472,
        state_per_sequence=77266944, kv_per_token=24576, all_full_kv_per_token=98304)

    so the state (about 74 MiB) weighs what the saved 73,728 bytes per token do after
    1,048 tokens.

    Args:
        config: a Hugging Face ``Qwen3NextConfig`` (its ``layer_types``,
            ``linear_*`` sizes, ``num_key_value_heads``, ``head_dim``) or a
            :class:`Qwen3NextSpec`.
        dtype: the model's dtype (keys, values and the convolution state).

    Returns:
        A :class:`StateCacheBytes`.
    """
    dtype = _validate.dtype("dtype", dtype)
    if isinstance(config, Qwen3NextSpec):
        s = config
        n_linear = len(s.linear_layers)
        n_full = s.num_layers - n_linear
        hk, hv = s.linear_num_key_heads, s.linear_num_value_heads
        dk, dv, k = s.linear_key_head_dim, s.linear_value_head_dim, s.linear_conv_kernel
        kv_heads, head_dim = s.num_kv_heads, s.head_dim
    else:
        types = getattr(config, "layer_types", None)
        if not isinstance(types, (list, tuple)) or not hasattr(
            config, "linear_num_value_heads"
        ):
            raise TypeError(
                "config must be a Qwen3NextConfig (with layer_types and the linear_* "
                f"sizes) or a Qwen3NextSpec, got {_validate.describe(config)}"
            )
        bad = sorted({t for t in types if t not in _LAYER_TYPES})
        if bad:
            raise ValueError(
                f"config.layer_types must hold only {', '.join(_LAYER_TYPES)}, got {bad}"
            )
        n_linear = sum(t == "linear_attention" for t in types)
        n_full = len(types) - n_linear
        c = config
        if not getattr(c, "head_dim", None):  # Hugging Face's default
            hidden = _validate.positive_int("config.hidden_size", c.hidden_size)
            heads = _validate.positive_int(
                "config.num_attention_heads", c.num_attention_heads
            )
            c = copy.copy(c)
            c.head_dim = hidden // heads
        sizes = [  # each a positive integer, named before any arithmetic
            _validate.positive_int(f"config.{name}", getattr(c, name, None))
            for name in (
                "linear_num_key_heads",
                "linear_num_value_heads",
                "linear_key_head_dim",
                "linear_value_head_dim",
                "linear_conv_kernel_dim",
                "num_key_value_heads",
                "head_dim",
            )
        ]
        hk, hv, dk, dv, k, kv_heads, head_dim = sizes
    b = torch.empty((), dtype=dtype).element_size()
    b_state = torch.empty((), dtype=torch.promote_types(dtype, torch.float32))
    b_state = b_state.element_size()
    conv = n_linear * (k - 1) * (2 * hk * dk + hv * dv) * b
    recurrent = n_linear * hv * dk * dv * b_state
    per_layer = 2 * kv_heads * head_dim * b
    return StateCacheBytes(
        conv,
        recurrent,
        conv + recurrent,
        n_full * per_layer,
        (n_linear + n_full) * per_layer,
    )


# ---- the router ----------------------------------------------------------------------


def _route(logits: Tensor, top_k: int, normalize: bool) -> tuple[Tensor, Tensor]:
    """Qwen3-Next's router: softmax over all experts (float32), the ``top_k`` largest,
    renormalized when ``normalize``; ``(weights, chosen)``, each ``(T, top_k)``."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)  # (T, N)
    top, chosen = torch.topk(probs, top_k, dim=-1)  # (T, k)
    if normalize:
        top = top / top.sum(dim=-1, keepdim=True)
    return top.to(logits.dtype), chosen


# ---- the layer -----------------------------------------------------------------------


class Qwen3NextBlock(DecoderBlock):
    r"""One Qwen3-Next layer: :class:`~companion.decoder.DecoderBlock` with a Gated
    DeltaNet or a gated attention, and a dense MLP or the mixture of experts.

    A full layer (not in ``linear_layers``) keeps the parent's ``k_proj``, ``v_proj``,
    ``o_proj``, ``q_norm`` and ``k_norm``; its ``q_proj`` has ``2 H D`` rows, head
    ``h``'s query at rows ``2hD .. 2hD + D - 1`` and its output gate after them, as
    Hugging Face stores it. A linear layer holds instead ``in_proj_qkvz``
    ``(2 H_k d_k + 2 H_v d_v, E)`` and ``in_proj_ba`` ``(2 H_v, E)`` in Hugging Face's
    row order (per key head: ``q, k``, its value heads' ``v``, their ``z``; and ``b``,
    ``a`` likewise), ``conv_weight`` ``(C, K)`` over the channels ``[q | k | v]``,
    ``dt_bias`` and ``a_log`` ``(H_v,)``, the gated norm's ``linear_norm`` ``(d_v,)`` and
    ``out_proj``. An MoE layer holds ``router`` (``nn.Linear`` to ``N`` logits),
    ``experts_gate_up`` ``(N, 2I, E)``, ``experts_down`` ``(N, E, I)`` (Hugging Face's
    layouts, applied as ``x @ W[e].T``), the shared expert's ``shared_gate_proj``,
    ``shared_up_proj``, ``shared_down_proj`` and its gate ``shared_expert_gate``
    (``E -> 1``); a dense layer the parent's ``gate_proj``, ``up_proj``, ``down_proj``.

    Args:
        spec: a :class:`Qwen3NextSpec`.
        layer: the layer's index.

    Shape:
        x: ``(B, L, E)``; output ``(B, L, E)`` and the cache: a full layer's keys and
        values, each ``(B, H_kv, S, D)``; a linear layer's ``conv_state``,
        ``recurrent_state`` and ``seen``: ``(B, K - 1, C)``, ``(B, H_v, d_k, d_v)`` and
        a 0-d int64.
    """

    def __init__(self, spec: Qwen3NextSpec, layer: int) -> None:
        _validate.instance("spec", spec, Qwen3NextSpec, "a Qwen3NextSpec (use from_hf)")
        super().__init__(spec, layer)
        s, e = spec, spec.hidden_size
        self.linear = self.layer in s.linear_layers
        self.moe = self.layer in s.moe_layers
        if self.linear:
            self.q_proj = self.k_proj = self.v_proj = self.o_proj = None
            self.q_norm = self.k_norm = None
            hk, hv = s.linear_num_key_heads, s.linear_num_value_heads
            dk, dv = s.linear_key_head_dim, s.linear_value_head_dim
            channels = 2 * hk * dk + hv * dv  # C: [q | k | v]
            self.in_proj_qkvz = nn.Linear(e, 2 * hk * dk + 2 * hv * dv, bias=False)
            self.in_proj_ba = nn.Linear(e, 2 * hv, bias=False)
            self.conv_weight = nn.Parameter(torch.zeros(channels, s.linear_conv_kernel))
            self.dt_bias = nn.Parameter(torch.ones(hv))
            self.a_log = nn.Parameter(torch.zeros(hv))
            self.linear_norm = nn.Parameter(torch.ones(dv))
            self.out_proj = nn.Linear(hv * dv, e, bias=False)
        else:  # the doubled query projection: [query | gate] per head
            rows = 2 * s.num_heads * s.head_dim
            self.q_proj = nn.Linear(e, rows, bias=s.qkv_bias)
        if self.moe:
            n, inner = s.num_experts, s.moe_intermediate_size
            shared = s.shared_expert_intermediate_size
            self.gate_proj = self.up_proj = self.down_proj = None  # no dense MLP
            self.router = nn.Linear(e, n, bias=False)
            self.experts_gate_up = nn.Parameter(torch.zeros(n, 2 * inner, e))
            self.experts_down = nn.Parameter(torch.zeros(n, e, inner))
            self.shared_gate_proj = nn.Linear(e, shared, bias=False)
            self.shared_up_proj = nn.Linear(e, shared, bias=False)
            self.shared_down_proj = nn.Linear(shared, e, bias=False)
            self.shared_expert_gate = nn.Linear(e, 1, bias=False)

    def attention(
        self,
        x: Tensor,
        rope: tuple[Tensor, Tensor] | None,
        mask: Tensor,
        past: tuple[Tensor, ...] | None,
    ) -> tuple[Tensor, tuple[Tensor, ...]]:
        """The token mixer of the normalized ``x`` ``(B, L, E)``: the Gated DeltaNet in
        a linear layer, the gated attention in a full one; the output ``(B, L, E)``
        and the layer's cache."""
        if self.linear:
            return self.gated_delta_net(x, mask, past)
        s = self.spec
        B, L, _ = x.shape
        H, Hkv, D = s.num_heads, s.num_kv_heads, s.head_dim
        qg = self.q_proj(x).view(B, L, H, 2 * D)  # per head [query | gate]
        q, gate = qg[..., :D], qg[..., D:].reshape(B, L, H * D)
        q = self.q_norm(q).transpose(1, 2)  # (B, H, L, D)
        k = self.k_norm(self.k_proj(x).view(B, L, Hkv, D)).transpose(1, 2)
        v = self.v_proj(x).view(B, L, Hkv, D).transpose(1, 2)  # (B, Hkv, L, D)
        q = rotate_head(q, *rope, s.rotary_dim, s.rope_layout)  # the first rotary_dim
        k = rotate_head(k, *rope, s.rotary_dim, s.rope_layout)  # coordinates of a head
        if past is not None:
            k = torch.cat((past[0], k), dim=2)  # (B, Hkv, S, D)
            v = torch.cat((past[1], v), dim=2)
        # key head h // G serves query head h, read in place (not repeated)
        out = grouped_attention(q, k, v, mask, self.scale)  # (B, L, H, D)
        out = out.reshape(B, L, H * D)
        out = out * torch.sigmoid(gate)  # the output gate
        return self.o_proj(out), (k, v)

    def gated_delta_net(
        self, x: Tensor, mask: Tensor, past: tuple[Tensor, ...] | None
    ) -> tuple[Tensor, tuple[Tensor, ...]]:
        r"""The Gated DeltaNet of the normalized ``x`` ``(B, L, E)``, continuing from
        ``past`` (``(conv_state, recurrent_state, seen)`` or ``None``)."""
        s = self.spec
        B, L, _ = x.shape
        hk, hv = s.linear_num_key_heads, s.linear_num_value_heads
        dk, dv, r = s.linear_key_head_dim, s.linear_value_head_dim, hv // hk
        # padding: a token that cannot see itself; zeroed as Hugging Face does
        keep = mask[:, 0, :, -L:].diagonal(dim1=1, dim2=2) == 0  # (B, L)
        x = x * keep[..., None].to(x.dtype)
        qkvz = self.in_proj_qkvz(x).view(B, L, hk, 2 * dk + 2 * r * dv)  # per key head
        q, k, v, z = qkvz.split([dk, dk, r * dv, r * dv], dim=-1)
        b, a = self.in_proj_ba(x).view(B, L, hk, 2 * r).split([r, r], dim=-1)
        mixed = torch.cat(
            (q.reshape(B, L, -1), k.reshape(B, L, -1), v.reshape(B, L, -1)), dim=-1
        )  # (B, L, C)
        conv_state = None if past is None else past[0]
        mixed, conv_state = causal_conv1d(mixed, self.conv_weight, conv_state)
        q, k, v = mixed.split([hk * dk, hk * dk, hv * dv], dim=-1)
        q = l2_normalize(q.reshape(B, L, hk, dk)).transpose(1, 2)  # (B, Hk, L, dk)
        k = l2_normalize(k.reshape(B, L, hk, dk)).transpose(1, 2)
        v = v.reshape(B, L, hv, dv).transpose(1, 2)  # (B, Hv, L, dv)
        beta = torch.sigmoid(b.reshape(B, L, hv)).transpose(1, 2)  # (B, Hv, L)
        a = a.reshape(B, L, hv).float()  # g = -exp(A_log) softplus(a + dt_bias)
        g = (-self.a_log.float().exp() * F.softplus(a + self.dt_bias)).transpose(1, 2)
        state = None if past is None else past[1]
        out, state = gated_delta_rule(
            q,
            k,
            v,
            g,
            beta,
            mode="recurrent" if L == 1 and past is not None else "chunked",
            chunk_size=s.chunk_size,
            initial_state=state,
            scale=dk**-0.5,
        )  # (B, Hv, L, dv)
        out = gated_rms_norm(
            out.transpose(1, 2), z.reshape(B, L, hv, dv), self.linear_norm, s.eps
        )  # RMSNorm(o) * SiLU(z), (B, L, Hv, dv)
        seen = L + (0 if past is None else int(past[2]))
        seen = torch.tensor(seen, device=x.device)
        return self.out_proj(out.reshape(B, L, hv * dv)), (conv_state, state, seen)

    def mlp(self, x: Tensor) -> Tensor:
        r"""The dense SwiGLU MLP, or the mixture of experts plus the gated shared
        expert: :math:`\sum_{e \in \text{top-}k} w_e\,\mathrm{MLP}_e(x) +
        \sigma(x w_s)\,\mathrm{MLP}_s(x)` (as Hugging Face's
        ``Qwen3NextSparseMoeBlock``)."""
        if not self.moe:
            return super().mlp(x)
        s, act = self.spec, ACTIVATIONS[self.spec.activation]
        tokens = x.reshape(-1, x.shape[-1])  # (T, E)
        weights, chosen = _route(
            self.router(tokens), s.num_experts_per_tok, s.norm_topk_prob
        )  # (T, k) each
        out = routed_experts(
            tokens, weights, chosen, self.experts_gate_up, self.experts_down, act
        )  # (T, E)
        shared = self.shared_down_proj(
            act(self.shared_gate_proj(tokens)) * self.shared_up_proj(tokens)
        )
        out = out + torch.sigmoid(self.shared_expert_gate(tokens)) * shared
        return out.view_as(x)

    def check_past(self, past: object, batch: int) -> int:
        """This layer's cache checked; returns the tokens it has seen. A full layer's
        as the parent's; a linear layer's ``(conv_state, recurrent_state, seen)``:
        ``(batch, K - 1, C)`` of the model's dtype, ``(batch, H_v, d_k, d_v)`` of
        float32 at least, a 0-d integer (``TypeError``/``ValueError`` naming
        ``past[layer][j]``)."""
        if not self.linear:
            return super().check_past(past, batch)
        v, s, i = _validate, self.spec, self.layer
        ref = self.in_proj_qkvz.weight  # the model's dtype and device
        items = v.sequence(
            f"past[{i}]",
            past,
            length=3,
            what=f"tensors (conv_state, recurrent_state and seen of layer {i})",
        )
        channels = self.conv_weight.shape[0]
        name = f"past[{i}][0] (conv_state of layer {i}, a linear layer)"
        t = v.tensor(name, items[0], ndim=3, meaning="(B, K - 1, C)")
        v.same_dtype(name, t, "the model", ref)
        v.same_device(name, t, "the model", ref)
        v.shape(name, t, (batch, s.linear_conv_kernel - 1, channels), "(B, K - 1, C)")
        name = f"past[{i}][1] (recurrent_state of layer {i}, a linear layer)"
        t = v.tensor(name, items[1], ndim=4, meaning="(B, H_v, d_k, d_v)")
        v.same_device(name, t, "the model", ref)
        state_dtype = torch.promote_types(ref.dtype, torch.float32)
        if t.dtype != state_dtype:
            raise TypeError(
                f"{name} must have dtype {state_dtype} (the state is kept in float32 at "
                f"least), got {t.dtype}"
            )
        shape = (
            batch,
            s.linear_num_value_heads,
            s.linear_key_head_dim,
            s.linear_value_head_dim,
        )
        v.shape(name, t, shape, "(B, H_v, d_k, d_v)")
        name = f"past[{i}][2] (seen of layer {i}, a linear layer)"
        return int(v.tensor(name, items[2], dtype="integer", ndim=0, meaning="()"))


# ---- reading Qwen3-Next from Hugging Face --------------------------------------------


class _FullView(nn.Module):
    """``model`` seen with every layer full attention: what ``base_fields`` reads (it
    refuses layer types it does not know; the linear ones are read here)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.config = copy.copy(model.config)
        self.config.layer_types = ["full_attention"] * model.config.num_hidden_layers
        self.get_input_embeddings = model.get_input_embeddings
        self.get_output_embeddings = model.get_output_embeddings


def _spec_qwen3_next(model: nn.Module) -> dict[str, Any]:
    c = model.config
    quantized = getattr(c, "quantization_config", None)
    if quantized:
        raise unsupported(
            f"quantization_config {quantized!r} in a Qwen3-Next model (the copy reads "
            "float weights: load the checkpoint dequantized)"
        )
    n = c.num_hidden_layers
    types = list(c.layer_types or ())
    bad = sorted({t for t in types if t not in _LAYER_TYPES})
    if bad or len(types) != n:
        raise unsupported(
            f"layer_types {sorted(set(types))} of {len(types)} layers (a Qwen3-Next "
            f"copy reads {', '.join(_LAYER_TYPES)}, one per layer, {n})"
        )
    experts = int(c.num_experts or 0)
    moe = tuple(
        i
        for i in range(n)
        if i not in c.mlp_only_layers
        and experts > 0
        and (i + 1) % c.decoder_sparse_step == 0
    )
    return base_fields(
        _FullView(model),
        "qwen3_next",
        partial_rotary=True,
        rms_variant="gemma",
        qk_norm="head",
        linear_layers=tuple(i for i, t in enumerate(types) if t == "linear_attention"),
        linear_num_key_heads=c.linear_num_key_heads,
        linear_num_value_heads=c.linear_num_value_heads,
        linear_key_head_dim=c.linear_key_head_dim,
        linear_value_head_dim=c.linear_value_head_dim,
        linear_conv_kernel=c.linear_conv_kernel_dim,
        moe_layers=moe,
        num_experts=experts,
        num_experts_per_tok=c.num_experts_per_tok,
        moe_intermediate_size=c.moe_intermediate_size,
        shared_expert_intermediate_size=c.shared_expert_intermediate_size,
        norm_topk_prob=bool(c.norm_topk_prob),
    )


def _load_qwen3_next(dst: Decoder, model: nn.Module) -> None:
    """Qwen3-Next's weights, each layer's mixer and MLP in Hugging Face's layout."""
    base = model.model
    copy_weight(dst.embed, base.embed_tokens.weight)
    copy_norm(dst.final_norm, base.norm)
    for block, layer in zip(dst.blocks, base.layers, strict=True):
        copy_norm(block.norm1, layer.input_layernorm)
        copy_norm(block.norm2, layer.post_attention_layernorm)
        if block.linear:
            la = layer.linear_attn
            copy_linear(block, la, ("in_proj_qkvz", "in_proj_ba", "out_proj"))
            if la.conv1d.bias is not None:
                raise unsupported("a bias in the linear layers' convolution")
            copy_tensor(block.conv_weight, la.conv1d.weight[:, 0])
            copy_tensor(block.dt_bias, la.dt_bias)
            copy_tensor(block.a_log, la.A_log)
            copy_tensor(block.linear_norm, la.norm.weight)
        else:
            attn = layer.self_attn
            copy_linear(block, attn, ("q_proj", "k_proj", "v_proj", "o_proj"))
            copy_norm(block.q_norm, attn.q_norm)
            copy_norm(block.k_norm, attn.k_norm)
        m = layer.mlp
        if block.moe:
            copy_weight(block.router, m.gate.weight)
            copy_tensor(block.experts_gate_up, m.experts.gate_up_proj)
            copy_tensor(block.experts_down, m.experts.down_proj)
            shared = m.shared_expert
            copy_weight(block.shared_gate_proj, shared.gate_proj.weight)
            copy_weight(block.shared_up_proj, shared.up_proj.weight)
            copy_weight(block.shared_down_proj, shared.down_proj.weight)
            copy_weight(block.shared_expert_gate, m.shared_expert_gate.weight)
        else:
            copy_linear(block, m, ("gate_proj", "up_proj", "down_proj"))
    copy_output(dst, model)


PORTS: dict[str, Port] = {
    "Qwen3NextForCausalLM": Port(
        spec=_spec_qwen3_next,
        load=_load_qwen3_next,
        block=Qwen3NextBlock,
        spec_type=Qwen3NextSpec,
    )
}
"""Qwen3-Next's entry, looked up by :func:`companion.decoder.from_hf` after the other
registries. It holds ``Qwen3NextForCausalLM``: Gated DeltaNet and gated attention
layers, partial RoPE, the mixture of experts with a shared expert."""
