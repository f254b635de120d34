r"""GPT-OSS, built on :mod:`companion.decoder`.

GPT-OSS (OpenAI, 2025) keeps Llama's pre-norm block (RMSNorm, grouped query heads,
RoPE in the ``"half"`` layout) and changes three things, read from Hugging Face's
``GptOssConfig``:

* **Sliding and full layers alternate** (``layer_types``, ``sliding_window`` keys:
  query slot :math:`i` sees key slots :math:`j` with :math:`0 \le i - j < W`, Hugging
  Face's convention as :mod:`companion.masks` states it; the parent's rolling cache).
  RoPE is the published YaRN (``rope_type="yarn"``, factor 32 over 4096 positions,
  ``truncate=False``, attention factor :math:`0.1 \ln 32 + 1` on the cosines and
  sines), the book's ``yarn`` path; any other type of ``companion.decoder.ROPE_TYPES``
  is copied as in every family; q, k, v and o have biases (``attention_bias``).
* **A learned sink logit per head**: the softmax of each row gets one more column,
  :math:`\sigma_h`, dropped after it, so a query may attend to "nothing"
  (:func:`companion.masks.attention_with_sinks`, the one home of that math):

  .. math::

      p_{ij} = \frac{e^{s_{ij}}}{e^{\sigma_h} + \sum_k e^{s_{ik}}}.

* **Every MLP is a mixture of experts**: the router's logits
  :math:`r = x W_r^\top + b_r` choose the ``num_experts_per_tok`` largest, a softmax
  over those :math:`k` gives their weights (:func:`route_softmax_top_k`), and each
  chosen expert's output is weighted:

  .. math::

      y = \sum_{e \in \text{top-}k} w_e\,\bigl(g(x W_e + b_e)\,V_e + c_e\bigr),

  with the fused ``gate_up_proj`` :math:`W_e` ``(E, 2I)`` whose *interleaved* columns
  are the gate (even) and the up projection (odd), and the clamped SwiGLU
  :math:`g` of :func:`clamped_swiglu` (:math:`\alpha = 1.702`, limit 7).

:data:`PORTS` holds the port :func:`companion.decoder.from_hf` finds for
``GptOssForCausalLM``: :class:`GptOssSpec` and :class:`GptOssBlock`, which overrides
the softmax step, ``attend`` (the sink column), and the MLP step (the experts); the
norms, residuals, masks, embeddings, projections, RoPE table and cache are the
parent's. The config's
``hidden_act`` is not read (Hugging Face's experts use the clamped SwiGLU whatever it
says). Refused by name: a quantized checkpoint (``quantization_config``), a RoPE type
not in ``companion.decoder.ROPE_TYPES``, layer types other than ``full_attention`` and
``sliding_attention``, sliding layers without a window, cross-attention.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from companion import _validate, masks
from companion._architecture import Decoder, DecoderBlock
from companion._spec import DecoderSpec
from companion.families import (
    Port,
    base_fields,
    copy_linear,
    copy_norm,
    copy_output,
    copy_tensor,
    copy_weight,
    unsupported,
)

__all__ = [
    "PORTS",
    "GptOssBlock",
    "GptOssSpec",
    "clamped_swiglu",
    "route_softmax_top_k",
]


# ---- the two new functions -----------------------------------------------------------


def route_softmax_top_k(logits: Tensor, top_k: int) -> tuple[Tensor, Tensor]:
    r"""GPT-OSS's router: the ``top_k`` largest logits of each token and a softmax over
    them, :math:`w_e = e^{r_e} / \sum_{e' \in \text{top-}k} e^{r_{e'}}`.

    As Hugging Face's ``GptOssTopKRouter``: ``topk``, then ``softmax`` over the
    :math:`k` chosen (in the logits' dtype); the weights of a token sum to one.

    Args:
        logits: the router's logits :math:`x W_r^\top + b_r`, one per expert.
        top_k: experts per token, ``1 <= top_k <= N``.

    Returns:
        ``(weights, chosen)``: the softmax weights and the chosen experts' indices,
        largest logit first.

    Shape:
        logits: ``(T, N)``; weights and chosen: ``(T, top_k)``.
    """
    logits = _validate.tensor(
        "logits", logits, dtype="floating", ndim=2, meaning="(T, N)"
    )
    top_k = _validate.integer("top_k", top_k, minimum=1, maximum=logits.shape[1])
    top, chosen = torch.topk(logits, top_k, dim=1)  # (T, k) each
    return torch.softmax(top, dim=1), chosen


def clamped_swiglu(gate_up: Tensor, alpha: float = 1.702, limit: float = 7.0) -> Tensor:
    r"""GPT-OSS's gated activation of the fused, interleaved projection:
    :math:`(\mathrm{clip}(u, -\ell, \ell) + 1)\cdot \bar g\,\sigma(\alpha \bar g)` with
    :math:`\bar g = \min(g, \ell)`.

    The gate :math:`g` is ``gate_up[..., 0::2]`` and the up projection :math:`u`
    ``gate_up[..., 1::2]`` (interleaved columns, not two halves); the gate is clamped
    above only, the up projection on both sides, and one is added to it. As Hugging
    Face's ``GptOssExperts._apply_gate``.

    Args:
        gate_up: :math:`x W_e + b_e`, gate and up columns interleaved.
        alpha: :math:`\alpha` (``swiglu_alpha``), > 0.
        limit: :math:`\ell` (``swiglu_limit``), > 0.

    Returns:
        The gated activations, ``gate_up``'s dtype.

    Shape:
        gate_up: ``(..., 2I)``; output: ``(..., I)``.
    """
    gate_up = _validate.tensor(
        "gate_up", gate_up, dtype="floating", meaning="(..., 2I)"
    )
    if gate_up.ndim == 0:
        raise ValueError("gate_up must have at least one dimension, got a 0-d tensor")
    _validate.even_size("gate_up", gate_up, -1, "gate and up columns interleaved")
    alpha = _validate.positive_real("alpha", alpha)
    limit = _validate.positive_real("limit", limit)
    gate = gate_up[..., 0::2].clamp(max=limit)  # (..., I)
    up = gate_up[..., 1::2].clamp(min=-limit, max=limit)  # (..., I)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


# ---- the spec ------------------------------------------------------------------------


@dataclass(frozen=True)
class GptOssSpec(DecoderSpec):
    r"""A :class:`~companion.decoder.DecoderSpec` with GPT-OSS's fields.

    The inherited fields keep their meaning (``layer_types`` and ``sliding_window``
    alternate the sliding and full layers, ``rope`` is the YaRN table's parameters);
    ``intermediate_size`` is the width :math:`I` of one expert. The parent's dense MLP
    is not built: every layer's MLP is the mixture of experts.

    The fields beyond DecoderSpec's:

    Args:
        num_experts: experts per layer (``num_local_experts``).
        num_experts_per_tok: the experts each token goes to, ``1 .. num_experts``.
        swiglu_alpha: :math:`\alpha` of :func:`clamped_swiglu`.
        swiglu_limit: its clamp :math:`\ell`.

    Every field is checked when the record is made (``TypeError``/``ValueError``
    naming it).
    """

    num_experts: int = 1
    num_experts_per_tok: int = 1
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_gpt_oss(self)


def _check_gpt_oss(spec: GptOssSpec) -> None:
    v = _validate

    def put(name: str, value: object) -> None:  # the record is frozen
        object.__setattr__(spec, name, value)

    put("num_experts", v.positive_int("num_experts", spec.num_experts))
    put(
        "num_experts_per_tok",
        v.integer(
            "num_experts_per_tok",
            spec.num_experts_per_tok,
            minimum=1,
            maximum=spec.num_experts,
        ),
    )
    put("swiglu_alpha", v.positive_real("swiglu_alpha", spec.swiglu_alpha))
    put("swiglu_limit", v.positive_real("swiglu_limit", spec.swiglu_limit))
    fixed = {  # field -> (what GPT-OSS's block needs, why)
        "positions": ("rope", "RoPE (YaRN)"),
        "norm": ("rms", "RMSNorm"),
        "qk_norm": ("none", "no QK-norm"),
        "rotary_dim": (spec.head_dim, "RoPE over the whole head"),
        "parallel_residual": (False, "a serial block"),
        "block_norms": ("pre", "pre-norm"),
        "attn_softcap": (0.0, "the sink column, no soft cap"),
        "nope_layers": ((), "RoPE in every layer"),
        "local_rope": ({}, "one RoPE table"),
    }
    _validate.fixed_fields(spec, fixed, "a GptOssSpec")


# ---- the layer -----------------------------------------------------------------------


class GptOssBlock(DecoderBlock):
    r"""One GPT-OSS layer: :class:`~companion.decoder.DecoderBlock` with GPT-OSS's
    attention and MLP steps.

    :meth:`attend`, the one step of the parent's attention it overrides (the
    projections with biases, RoPE, the cache, ``(key, value)`` or in a sliding layer
    the rolling ``(key, value, seen)``, are the parent's): the softmax with the head's
    sink column ``sinks`` ``(H,)``
    (:func:`companion.masks.attention_with_sinks`, grouped key heads shared as
    ``repeat_kv``). A query whose keys are all masked (a padding query) puts all its
    mass on the sink: output zero.

    :meth:`mlp`: the router (``router``, an ``nn.Linear`` to ``N`` logits, with bias),
    :func:`route_softmax_top_k`, and the chosen experts, stored in Hugging Face's
    layouts: ``experts_gate_up`` ``(N, E, 2I)`` (columns gate, up, gate, up, ...),
    ``experts_gate_up_bias`` ``(N, 2I)``, ``experts_down`` ``(N, I, E)`` and
    ``experts_down_bias`` ``(N, E)``, applied as ``x @ experts_gate_up[e]``.

    Args:
        spec: a :class:`GptOssSpec`.
        layer: the layer's index.

    Shape:
        x: ``(B, L, E)``; output ``(B, L, E)`` and the cache, keys and values each
        ``(B, H_kv, S, D)`` (a sliding layer: the last ``min(S, sliding_window - 1)``,
        and ``seen``).
    """

    def __init__(self, spec: GptOssSpec, layer: int) -> None:
        _validate.instance("spec", spec, GptOssSpec, "a GptOssSpec (use from_hf)")
        super().__init__(spec, layer)
        n, e, inner = spec.num_experts, spec.hidden_size, spec.intermediate_size
        self.gate_proj = self.up_proj = self.down_proj = None  # no dense MLP
        self.sinks = nn.Parameter(torch.zeros(spec.num_heads))
        self.router = nn.Linear(e, n, bias=True)
        self.experts_gate_up = nn.Parameter(torch.zeros(n, e, 2 * inner))
        self.experts_gate_up_bias = nn.Parameter(torch.zeros(n, 2 * inner))
        self.experts_down = nn.Parameter(torch.zeros(n, inner, e))
        self.experts_down_bias = nn.Parameter(torch.zeros(n, e))

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
        """The parent's attention step with the head's sink column: queries
        ``(B, H, L, D)`` on keys and values ``(B, H_kv, S, D)``; ``(B, L, H, D)``."""
        out = masks.attention_with_sinks(
            q, k, v, self.sinks, mask=mask, scale=self.scale
        )
        return out.transpose(1, 2)  # (B, L, H, D)

    def mlp(self, x: Tensor) -> Tensor:
        r"""The mixture of experts: :math:`\sum_{e \in \text{top-}k} w_e\,
        \mathrm{MLP}_e(x)`, each expert run on the tokens that chose it (as Hugging
        Face's ``GptOssExperts``)."""
        s = self.spec
        tokens = x.reshape(-1, x.shape[-1])  # (T, E)
        weights, chosen = route_softmax_top_k(
            self.router(tokens), s.num_experts_per_tok
        )  # (T, k) each
        out = torch.zeros_like(tokens)  # (T, E)
        for e in chosen.unique().tolist():
            rows, slot = torch.where(chosen == e)  # the tokens that chose e
            h = tokens[rows] @ self.experts_gate_up[e] + self.experts_gate_up_bias[e]
            h = clamped_swiglu(h, s.swiglu_alpha, s.swiglu_limit)  # (t, I)
            y = h @ self.experts_down[e] + self.experts_down_bias[e]  # (t, E)
            out.index_add_(0, rows, (y * weights[rows, slot, None]).to(out.dtype))
        return out.view_as(x)


# ---- reading GPT-OSS from Hugging Face -----------------------------------------------


def _spec_gpt_oss(model: nn.Module) -> dict[str, Any]:
    c = model.config
    quantized = getattr(c, "quantization_config", None)
    if quantized:
        raise unsupported(
            f"quantization_config {quantized!r} in a GPT-OSS model (the copy reads "
            "float weights: load the checkpoint dequantized)"
        )
    fields = base_fields(
        model,
        "gpt_oss",
        sliding="layer_types",
        activation="silu",  # not read: the experts' clamped SwiGLU
        mlp_bias=False,
        num_experts=c.num_local_experts,
        num_experts_per_tok=c.num_experts_per_tok,
        swiglu_alpha=c.swiglu_alpha,
        swiglu_limit=c.swiglu_limit,
    )
    return fields


def _load_gpt_oss(dst: Decoder, model: nn.Module) -> None:
    """GPT-OSS's weights: Llama's names, each attention's ``sinks``, and each layer's
    router and fused experts (with biases), copied in Hugging Face's layout."""
    base = model.model
    copy_weight(dst.embed, base.embed_tokens.weight)
    copy_norm(dst.final_norm, base.norm)
    for block, layer in zip(dst.blocks, base.layers, strict=True):
        copy_norm(block.norm1, layer.input_layernorm)
        copy_norm(block.norm2, layer.post_attention_layernorm)
        copy_linear(block, layer.self_attn, ("q_proj", "k_proj", "v_proj", "o_proj"))
        copy_tensor(block.sinks, layer.self_attn.sinks)
        router, experts = layer.mlp.router, layer.mlp.experts
        copy_weight(block.router, router.weight, router.bias)
        copy_tensor(block.experts_gate_up, experts.gate_up_proj)
        copy_tensor(block.experts_gate_up_bias, experts.gate_up_proj_bias)
        copy_tensor(block.experts_down, experts.down_proj)
        copy_tensor(block.experts_down_bias, experts.down_proj_bias)
    copy_output(dst, model)


PORTS: dict[str, Port] = {
    "GptOssForCausalLM": Port(
        spec=_spec_gpt_oss,
        load=_load_gpt_oss,
        block=GptOssBlock,
        spec_type=GptOssSpec,
    )
}
"""GPT-OSS's entry, looked up by :func:`companion.decoder.from_hf` after the families'
registries, ``companion.mla.PORTS`` and ``companion.llama4.PORTS``. It holds ``GptOssForCausalLM``: alternating
sliding and full layers, YaRN, the sinks and the mixture of experts."""
