r"""Llama 4's text model (iRoPE), built on :mod:`companion.decoder`.

Llama 4 interleaves two kinds of layer (Meta's *iRoPE*), read from Hugging Face's
``no_rope_layers`` (1 = RoPE, 0 = none; every 4th layer is NoPE in the published
configs) and ``layer_types``:

* **RoPE layers** see only their own chunk: query :math:`i` attends key :math:`j` when
  :math:`j \le i` and :math:`\lfloor (j - p_b)/C \rfloor = \lfloor (i - p_b)/C \rfloor`,
  :math:`C` = ``attention_chunk_size`` (8192), :math:`p_b` the row's left padding
  (:func:`companion.masks.chunked_causal`, the one home of that predicate). RoPE turns
  adjacent pairs :math:`(2i, 2i + 1)` (Meta's complex form, the book's
  ``rope_layout="interleaved"``) with the published ``llama3`` scaling; then, where
  ``use_qk_norm``, queries and keys pass an RMSNorm *without gain* over each head
  (Hugging Face's ``Llama4TextL2Norm``), after RoPE.
* **NoPE layers** attend causally to everything, with no RoPE and, where
  ``attn_temperature_tuning``, the query of cache slot :math:`m` multiplied by
  (:func:`attention_temperature`)

  .. math::

      \tau_m = 1 + s \,\log\!\bigl(1 + \lfloor (m + 1)/F \rfloor\bigr),

  :math:`F` = ``floor_scale`` (8192), :math:`s` = ``attn_scale`` (0.1): one below
  :math:`F` tokens, then slowly growing, so that the softmax over ever more keys stays
  sharp. :math:`m` counts *slots* (Hugging Face 5.23 takes it from the cache length,
  ``past_seen_tokens + arange(L)``), so a left-padded row's padding counts, unlike its
  RoPE positions and its chunks; the copy does the same.

The MLP is dense (``intermediate_size_mlp`` wide) except in ``moe_layers`` (every
``interleave_moe_layer_step``-th layer), where it is a mixture of experts: the router's
logits :math:`r = x W_r^\top` choose the ``num_experts_per_tok`` best experts, each
chosen expert :math:`e` gets the *input* scaled by :math:`\sigma(r_e)`
(:func:`route_sigmoid_top_k`; the others get zeros and give zeros), and a shared
expert sees every token:

.. math::

    y = \mathrm{MLP}_{\text{shared}}(x) + \sum_{e \in \text{top-}k}
        \mathrm{MLP}_e\bigl(\sigma(r_e)\,x\bigr).

Each expert is a gated MLP whose gate and up projections are stored fused as Hugging
Face stores them, ``gate_up_proj`` of shape ``(N, E, 2 I)``: columns ``[gate | up]``,
applied as ``x @ gate_up_proj[e]``.

:data:`PORTS` holds the port :func:`companion.decoder.from_hf` finds for
``Llama4ForCausalLM`` (the text-only causal LM): :class:`Llama4Spec` and
:class:`Llama4Block`, which overrides the attention step (chunks, QK-norm after RoPE,
temperature) and the MLP step (experts); the norms, residuals, embeddings and the RoPE
table are the parent's. A chunked layer's cache keeps the last :math:`C - 1` keys, all
a query of the next token can see (as a sliding layer of window :math:`C`, Hugging
Face's cache for these layers), the other layers' every key. Refused by name: layer types
other than ``full_attention`` and ``chunked_attention``, chunked layers without
``attention_chunk_size``, a ``no_rope_layers`` entry other than 0 or 1, a partial
rotary factor, RoPE types outside ``ROPE_TYPES``, cross-attention.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from companion import _validate, masks
from companion._architecture import Decoder, DecoderBlock
from companion._spec import ACTIVATIONS, DecoderSpec
from companion.attention import scaled_dot_product_attention
from companion.families import (
    Port,
    activation,
    copy_linear,
    copy_norm,
    copy_output,
    copy_tensor,
    copy_weight,
    rope_parameters,
    rotary_dim,
    tied,
    unsupported,
)
from companion.norm import rms_norm
from companion.rope import apply_rope

__all__ = [
    "PORTS",
    "Llama4Block",
    "Llama4Spec",
    "attention_temperature",
    "route_sigmoid_top_k",
]


# ---- the two new functions -----------------------------------------------------------


def attention_temperature(
    positions: Tensor, *, floor_scale: float, attn_scale: float
) -> Tensor:
    r"""Llama 4's query temperature in its NoPE layers:
    :math:`\tau_m = 1 + s\,\log(1 + \lfloor (m + 1)/F \rfloor)`, in float32.

    As Hugging Face's ``Llama4TextAttention`` (``attn_temperature_tuning``):
    ``log1p(floor((m + 1) / floor_scale)) * attn_scale + 1``; the query of slot
    :math:`m` is multiplied by it before the scores.

    Args:
        positions: the slots :math:`m`, integers >= 0.
        floor_scale: :math:`F` (``floor_scale``, 8192 in the published config), > 0.
        attn_scale: :math:`s` (``attn_scale``, 0.1).

    Returns:
        :math:`\tau_m`, float32.

    Shape:
        positions: any; output: the same.
    """
    positions = _validate.tensor(
        "positions", positions, dtype="integer", meaning="slots m"
    )
    if positions.numel() and int(positions.min()) < 0:
        raise ValueError(
            f"positions must be >= 0, got a minimum of {int(positions.min())}"
        )
    floor_scale = _validate.positive_real("floor_scale", floor_scale)
    attn_scale = _validate.real("attn_scale", attn_scale)
    m = positions.float()
    return torch.log1p(torch.floor((m + 1.0) / floor_scale)) * attn_scale + 1.0


def route_sigmoid_top_k(logits: Tensor, top_k: int) -> Tensor:
    r"""Llama 4's router: the ``top_k`` largest logits of each token through a sigmoid,
    the others 0 (:math:`\sigma(-\infty)`).

    As Hugging Face's ``Llama4Router``: ``topk``, a ``-inf`` row with the chosen logits
    scattered back, ``sigmoid`` in float32, cast to the logits' dtype. The scores do
    not sum to one (no softmax, no renormalization); each scales its expert's *input*.

    Args:
        logits: the router's logits :math:`x W_r^\top`, one per expert.
        top_k: experts per token, ``1 <= top_k <= N``.

    Returns:
        The scores, :math:`\sigma(r_e)` for the chosen experts and 0 elsewhere.

    Shape:
        logits: ``(T, N)``; output: ``(T, N)``.
    """
    logits = _validate.tensor(
        "logits", logits, dtype="floating", ndim=2, meaning="(T, N)"
    )
    top_k = _validate.integer("top_k", top_k, minimum=1, maximum=logits.shape[1])
    top, chosen = torch.topk(logits, top_k, dim=1)  # (T, k) each
    scores = torch.full_like(logits, float("-inf")).scatter_(1, chosen, top)
    return torch.sigmoid(scores.float()).to(logits.dtype)  # (T, N), zeros unchosen


# ---- the spec ------------------------------------------------------------------------


@dataclass(frozen=True)
class Llama4Spec(DecoderSpec):
    r"""A :class:`~companion.decoder.DecoderSpec` with Llama 4's fields.

    The inherited fields keep their meaning: ``nope_layers`` are the layers without RoPE
    (``no_rope_layers`` zeros), ``rope_layout`` is ``"interleaved"``, every layer is
    ``"full_attention"`` to the parent (the chunks are this spec's), and
    ``intermediate_size`` is the width of an expert and of the shared expert.

    The fields beyond DecoderSpec's:

    Args:
        chunk_size: :math:`C`, Hugging Face's ``attention_chunk_size`` (0: none).
        chunked_layers: the layers that attend inside their chunk (``layer_types``
            ``"chunked_attention"``; the RoPE layers by default); increasing indices.
        qk_l2_norm: queries and keys of the RoPE layers pass an RMSNorm without gain
            over each head after RoPE (``use_qk_norm``).
        temperature_tuning: the NoPE layers' queries are multiplied by
            :func:`attention_temperature` (``attn_temperature_tuning``).
        floor_scale: :math:`F` of the temperature.
        attn_scale: :math:`s` of the temperature.
        moe_layers: the layers whose MLP is a mixture of experts; increasing indices.
        num_experts: experts of such a layer (``num_local_experts``).
        num_experts_per_tok: experts each token goes to.
        dense_intermediate_size: the width of the other layers' dense MLP
            (``intermediate_size_mlp``); 0: ``intermediate_size``.

    Every field is checked when the record is made (``TypeError``/``ValueError``
    naming it).
    """

    chunk_size: int = 0
    chunked_layers: tuple[int, ...] = ()
    qk_l2_norm: bool = False
    temperature_tuning: bool = False
    floor_scale: float = 8192.0
    attn_scale: float = 0.1
    moe_layers: tuple[int, ...] = ()
    num_experts: int = 0
    num_experts_per_tok: int = 1
    dense_intermediate_size: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_llama4(self)

    def layer_spec(self, layer: int) -> Llama4Spec:
        """The spec layer ``layer`` is built from: a dense layer's MLP is
        ``dense_intermediate_size`` wide, an expert layer's shared expert
        ``intermediate_size``."""
        if layer in self.moe_layers or not self.dense_intermediate_size:
            return self
        return dataclasses.replace(self, intermediate_size=self.dense_intermediate_size)


def _check_llama4(spec: Llama4Spec) -> None:
    v, n = _validate, spec.num_layers

    def put(name: str, value: object) -> None:  # the record is frozen
        object.__setattr__(spec, name, value)

    put("chunk_size", v.nonnegative_int("chunk_size", spec.chunk_size))
    put("chunked_layers", v.layer_indices("chunked_layers", spec.chunked_layers, n))
    if spec.chunked_layers and not spec.chunk_size:
        raise ValueError(
            f"chunk_size must be positive when chunked_layers is not empty, got 0 "
            f"with chunked_layers {spec.chunked_layers}"
        )
    for name in ("qk_l2_norm", "temperature_tuning"):
        put(name, v.flag(name, getattr(spec, name)))
    put("floor_scale", v.positive_real("floor_scale", spec.floor_scale))
    put("attn_scale", v.real("attn_scale", spec.attn_scale))
    put("moe_layers", v.layer_indices("moe_layers", spec.moe_layers, n))
    put("num_experts", v.nonnegative_int("num_experts", spec.num_experts))
    if spec.moe_layers:
        v.positive_int("num_experts", spec.num_experts)
        put(
            "num_experts_per_tok",
            v.integer(
                "num_experts_per_tok",
                spec.num_experts_per_tok,
                minimum=1,
                maximum=spec.num_experts,
            ),
        )
    put(
        "dense_intermediate_size",
        v.nonnegative_int("dense_intermediate_size", spec.dense_intermediate_size),
    )
    fixed = {  # field -> (what Llama 4's block needs, why)
        "positions": ("rope", "iRoPE"),
        "norm": ("rms", "RMSNorm"),
        "qk_norm": ("none", "the QK-norm is qk_l2_norm, after RoPE, without gain"),
        "rotary_dim": (spec.head_dim, "RoPE over the whole head"),
        "parallel_residual": (False, "a serial block"),
        "block_norms": ("pre", "pre-norm"),
        "sliding_window": (0, "chunks, not sliding windows"),
    }
    _validate.fixed_fields(spec, fixed, "a Llama4Spec")


# ---- the layer -----------------------------------------------------------------------


class Llama4Block(DecoderBlock):
    r"""One Llama 4 layer: :class:`~companion.decoder.DecoderBlock` with Llama 4's
    attention and MLP steps.

    :meth:`attention`: the projections, then in a RoPE layer RoPE (interleaved pairs)
    and the gain-free QK-norm (``qk_l2_norm``), in a NoPE layer the query times
    :func:`attention_temperature` of its slot (``temperature_tuning``); a chunked layer
    narrows the decoder's causal mask to the query's chunk
    (:func:`companion.masks.chunked_causal`, the row's left padding :math:`p_b` read off
    the mask: the keys its last query cannot see before its first token). Grouped
    query heads share key heads as in the parent. The cache is the parent's:
    ``(key, value)`` of every token, or in a chunked layer the sliding layer's
    ``(key, value, seen)`` of the last ``chunk_size - 1`` (``window`` is
    ``chunk_size``).

    :meth:`mlp`: the parent's gated MLP in a dense layer; in a layer of ``moe_layers``
    the router (``router``, an ``nn.Linear`` to ``N`` logits), the experts
    (``experts_gate_up`` ``(N, E, 2I)``, columns ``[gate | up]``, and ``experts_down``
    ``(N, I, E)``, Hugging Face's layouts) and the parent's gated MLP as the shared
    expert.

    Args:
        spec: a :class:`Llama4Spec`.
        layer: the layer's index.

    Shape:
        x: ``(B, L, E)``; output ``(B, L, E)`` and the cache ``(key, value)``, each
        ``(B, H_kv, S, D)`` (a chunked layer: ``S <= chunk_size - 1``, and ``seen``).
    """

    def __init__(self, spec: Llama4Spec, layer: int) -> None:
        _validate.instance("spec", spec, Llama4Spec, "a Llama4Spec (use from_hf)")
        layer = _validate.integer(
            "layer", layer, minimum=0, maximum=spec.num_layers - 1
        )
        super().__init__(spec.layer_spec(layer), layer)
        s = self.spec
        self.chunked = layer in s.chunked_layers
        if self.chunked:  # cached as a sliding layer: the parent's check_past reads it
            self.window = s.chunk_size
        self.moe = layer in s.moe_layers
        if self.moe:
            n, e, inner = s.num_experts, s.hidden_size, s.intermediate_size
            self.router = nn.Linear(e, n, bias=False)
            self.experts_gate_up = nn.Parameter(torch.zeros(n, e, 2 * inner))
            self.experts_down = nn.Parameter(torch.zeros(n, inner, e))

    def attention(
        self,
        x: Tensor,
        rope: tuple[Tensor, Tensor] | None,
        mask: Tensor,
        past: tuple[Tensor, ...] | None,
    ) -> tuple[Tensor, tuple[Tensor, ...]]:
        """Attention of the normalized ``x`` ``(B, L, E)`` over the cache and itself;
        the output ``(B, L, E)`` and the cache (``(key, value)``, or
        ``(key, value, seen)`` in a chunked layer)."""
        s = self.spec
        B, L, _ = x.shape
        H, Hkv, D = s.num_heads, s.num_kv_heads, s.head_dim
        seen = 0  # slots before this call (a chunked layer holds fewer keys)
        if past is not None:
            seen = int(past[2]) if self.window else past[0].shape[2]
        q = self.q_proj(x).view(B, L, H, D).transpose(1, 2)  # (B, H, L, D)
        k = self.k_proj(x).view(B, L, Hkv, D).transpose(1, 2)  # (B, Hkv, L, D)
        v = self.v_proj(x).view(B, L, Hkv, D).transpose(1, 2)  # (B, Hkv, L, D)
        if self.rotates:  # RoPE, then the QK-norm (Hugging Face's order)
            q = apply_rope(q, *rope, layout=s.rope_layout)
            k = apply_rope(k, *rope, layout=s.rope_layout)
            if s.qk_l2_norm:  # RMSNorm without gain over each head
                q, k = rms_norm(q, D, eps=s.eps), rms_norm(k, D, eps=s.eps)
        elif s.temperature_tuning:  # NoPE: the query times tau of its slot
            slots = torch.arange(seen, seen + L, device=x.device)  # (L,)
            tau = attention_temperature(
                slots, floor_scale=s.floor_scale, attn_scale=s.attn_scale
            )
            q = (q * tau[:, None]).to(q.dtype)  # (B, H, L, D)
        if past is not None:
            k = torch.cat((past[0], k), dim=2)  # (B, Hkv, S, D)
            v = torch.cat((past[1], v), dim=2)
        if self.chunked:  # the decoder's mask covers all seen + L slots
            mask = self._chunked(mask, seen)[..., -k.shape[2] :]  # (B, 1, L, K + L)
        groups = H // Hkv  # the G query heads of a key head, stacked (the parent's way)
        q = q.reshape(B, Hkv, groups * L, D)  # (B, Hkv, G*L, D)
        if groups > 1:
            mask = mask.repeat(1, 1, groups, 1)  # (B, 1, G*L, S)
        out = scaled_dot_product_attention(q, k, v, mask=mask, scale=self.scale)
        out = out.view(B, H, L, D).transpose(1, 2)  # (B, L, H, D)
        present = (k, v)
        if self.window:  # the keys the next queries of this chunk may still see
            keep = min(self.window - 1, k.shape[2])
            k, v = k[:, :, k.shape[2] - keep :], v[:, :, v.shape[2] - keep :]
            present = (k, v, torch.tensor(seen + L, device=k.device))
        return self.o_proj(out.reshape(B, L, H * D)), present

    def _chunked(self, mask: Tensor, seen: int) -> Tensor:
        """The decoder's causal mask ``(B, 1, L, S)`` narrowed to each query's chunk.

        The last query sees every token of its row (it is the newest slot), so the
        row's left padding :math:`p_b` is the run of keys hidden from it before its
        first visible one, Hugging Face's ``(attention_mask.cumsum(-1) == 0).sum(-1)``.
        """
        B, _, L, S = mask.shape
        hidden = torch.isneginf(mask[:, 0, -1])  # (B, S)
        left = hidden.long().cumprod(dim=-1).sum(dim=-1)  # (B,) leading hidden keys
        same_chunk = masks.materialize_mask(
            masks.chunked_causal(self.spec.chunk_size, left_padding=left),
            B,
            L,
            S,
            cache_length=seen,
            device=mask.device,
        )  # (B, 1, L, S) bool
        return mask.masked_fill(~same_chunk, float("-inf"))

    def mlp(self, x: Tensor) -> Tensor:
        r"""The dense gated MLP (the parent's), or in an expert layer the shared expert
        plus :math:`\sum_e \mathrm{MLP}_e(\sigma(r_e)\,x)` over the chosen experts
        (:func:`route_sigmoid_top_k`), computed for every expert as Hugging Face's
        ``Llama4TextMoe`` does (an unchosen expert's input and output are zeros)."""
        if not self.moe:
            return super().mlp(x)
        act = ACTIVATIONS[self.spec.activation]
        tokens = x.reshape(-1, x.shape[-1])  # (T, E)
        scores = route_sigmoid_top_k(self.router(tokens), self.spec.num_experts_per_tok)
        routed_in = tokens[None] * scores.t()[:, :, None]  # (N, T, E)
        gate, up = torch.bmm(routed_in, self.experts_gate_up).chunk(2, dim=-1)
        routed = torch.bmm(up * act(gate), self.experts_down)  # (N, T, E)
        return (super().mlp(tokens) + routed.sum(dim=0)).view_as(x)


# ---- reading Llama 4 from Hugging Face ----------------------------------------------

_LAYER_TYPES = ("full_attention", "chunked_attention")


def _spec_llama4(model: nn.Module) -> dict[str, Any]:
    c = model.config
    n = c.num_hidden_layers
    for key in ("add_cross_attention", "is_encoder_decoder"):
        if getattr(c, key, False):
            raise unsupported(f"{key}=True in a Llama 4 model")
    flags = getattr(c, "no_rope_layers", None)
    if (
        not isinstance(flags, (list, tuple))
        or len(flags) < n
        or any(f not in (0, 1) for f in flags[:n])
    ):
        raise unsupported(
            f"no_rope_layers {flags!r} (Llama 4 reads one 0 or 1 per layer, {n} layers)"
        )
    types = tuple(getattr(c, "layer_types", None) or ("full_attention",) * n)
    if len(types) < n or any(t not in _LAYER_TYPES for t in types[:n]):
        raise unsupported(
            f"layer_types {sorted(set(types))} in a Llama 4 model (supported: "
            f"{', '.join(_LAYER_TYPES)}, one per layer)"
        )
    chunked = tuple(i for i in range(n) if types[i] == "chunked_attention")
    chunk = getattr(c, "attention_chunk_size", None)
    if chunked and not chunk:
        raise unsupported(
            f"chunked_attention layers with attention_chunk_size={chunk!r} in a "
            "Llama 4 model"
        )
    heads = c.num_attention_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
    params = getattr(c, "rope_parameters", None)
    rdim = rotary_dim(head_dim, params, "llama4", False)
    bias = bool(getattr(c, "attention_bias", False))
    return dict(
        family="llama4",
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        num_layers=n,
        num_heads=heads,
        num_kv_heads=getattr(c, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        intermediate_size=c.intermediate_size,
        positions="rope",
        norm="rms",
        eps=c.rms_norm_eps,
        mlp="gated",
        activation=activation(c.hidden_act),
        parallel_residual=False,
        tied_embeddings=tied(model),
        qkv_bias=bias,
        out_bias=bias,
        max_positions=c.max_position_embeddings,
        rotary_dim=rdim,
        rope=rope_parameters(c, rdim, params),
        scales=(head_dim**-0.5,) * n,
        nope_layers=tuple(i for i in range(n) if not flags[i]),
        rope_layout="interleaved",  # Meta's complex pairs (2i, 2i + 1)
        chunk_size=chunk if chunked else 0,
        chunked_layers=chunked,
        qk_l2_norm=bool(c.use_qk_norm),
        temperature_tuning=bool(c.attn_temperature_tuning),
        floor_scale=float(c.floor_scale),
        attn_scale=float(c.attn_scale),
        moe_layers=tuple(sorted(set(c.moe_layers))),
        num_experts=c.num_local_experts,
        num_experts_per_tok=c.num_experts_per_tok,
        dense_intermediate_size=c.intermediate_size_mlp,
    )


def _load_llama4(dst: Decoder, model: nn.Module) -> None:
    """Llama 4's weights: Llama's names, the MLP under ``feed_forward``; an expert
    layer's router, fused experts (copied in Hugging Face's layout) and shared expert."""
    base = model.model
    copy_weight(dst.embed, base.embed_tokens.weight)
    copy_norm(dst.final_norm, base.norm)
    for block, layer in zip(dst.blocks, base.layers, strict=True):
        copy_norm(block.norm1, layer.input_layernorm)
        copy_norm(block.norm2, layer.post_attention_layernorm)
        copy_linear(block, layer.self_attn, ("q_proj", "k_proj", "v_proj", "o_proj"))
        ff = layer.feed_forward
        if block.moe != bool(layer.is_moe_layer):
            raise ValueError(
                f"model's weights must fit the spec: layer {block.layer} is "
                f"{'an expert' if layer.is_moe_layer else 'a dense'} layer in the "
                f"model and {'an expert' if block.moe else 'a dense'} layer in the "
                "copy (moe_layers)"
            )
        if block.moe:
            copy_weight(block.router, ff.router.weight)
            copy_tensor(block.experts_gate_up, ff.experts.gate_up_proj)
            copy_tensor(block.experts_down, ff.experts.down_proj)
            ff = ff.shared_expert
        copy_linear(block, ff, ("gate_proj", "up_proj", "down_proj"))
    copy_output(dst, model)


PORTS: dict[str, Port] = {
    "Llama4ForCausalLM": Port(
        spec=_spec_llama4,
        load=_load_llama4,
        block=Llama4Block,
        spec_type=Llama4Spec,
    )
}
"""Llama 4's entry, looked up by :func:`companion.decoder.from_hf` after the families'
registries and ``companion.mla.PORTS``. It holds ``Llama4ForCausalLM``, the text model
with its RoPE and NoPE layers, chunks, temperature and mixture of experts."""
