r"""Model families as data: the registry :func:`companion.decoder.from_hf` reads.

A family is an entry of :data:`PORTS`, keyed by its Hugging Face class (the name in
``config.architectures``): a :class:`Port` that holds a *spec reader* (the model's config
-> the fields of a :class:`~companion.decoder.DecoderSpec`) and, only where the weights
are stored in another layout than Llama's, a *loader*. Most readers are a few lines on
:func:`base_fields`, which reads what every family reads alike (Llama's block under
Hugging Face's standard config names) and takes the family's differences as keywords::

    def spec_qwen3(model):
        return base_fields(model, "qwen3", sliding="layer_types", qk_norm="head")

    PORTS["Qwen3ForCausalLM"] = Port(spec=spec_qwen3)  # Llama's weight layout

A family that computes something new gives ``block`` (a
:class:`~companion.decoder.DecoderBlock` subclass) and ``spec_type`` too, as
:mod:`companion.mla` does for DeepSeek-V3. The shared readers and copy helpers here
(``rope_parameters``, ``activation``, ``copy_weight``, ...) are what such
an entry builds on; each refuses what the copy does not implement with a
``ValueError`` naming it (``unsupported``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from companion import _validate
from companion._architecture import Decoder, DecoderBlock, check_block_type
from companion._spec import ACTIVATIONS, ROPE_TYPES, DecoderSpec

__all__ = ["HYBRID_PORTS", "PORTS", "Port", "base_fields"]


# ---- the entry -----------------------------------------------------------------------


def load_llama(dst: Decoder, model: nn.Module) -> None:
    """Llama's weight layout, shared by the families built like it (Mistral, Qwen2/3,
    OLMo 2, Gemma 2/3, Phi-3, SmolLM3, Cohere2): every projection and norm copies as
    it is (a norm's bias too where it has one), Phi-3's fused ``qkv_proj`` and
    ``gate_up_proj`` split by rows; a block with one norm (``shared_norm``, Cohere)
    copies ``input_layernorm`` alone."""
    base, s = model.model, dst.spec
    copy_weight(dst.embed, base.embed_tokens.weight)
    copy_norm(dst.final_norm, base.norm)
    norms = {  # the copy's norm -> Hugging Face's, by where it sits in the block
        "pre": {"norm1": "input_layernorm", "norm2": "post_attention_layernorm"},
        "post": {
            "post_norm1": "post_attention_layernorm",
            "post_norm2": "post_feedforward_layernorm",
        },
        "sandwich": {
            "norm1": "input_layernorm",
            "post_norm1": "post_attention_layernorm",
            "norm2": "pre_feedforward_layernorm",
            "post_norm2": "post_feedforward_layernorm",
        },
    }[s.block_norms]
    if s.shared_norm:  # Cohere: no post_attention_layernorm
        norms = {"norm1": "input_layernorm"}
    q_rows, kv_rows = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
    for block, layer in zip(dst.blocks, base.layers, strict=True):
        a, m = layer.self_attn, layer.mlp
        for ours, theirs in norms.items():
            copy_norm(getattr(block, ours), getattr(layer, theirs))
        if block.q_norm is not None:
            copy_norm(block.q_norm, a.q_norm)
            copy_norm(block.k_norm, a.k_norm)
        if hasattr(a, "qkv_proj"):  # Phi-3: rows [q | k | v]
            cuts = (0, q_rows, q_rows + kv_rows, q_rows + 2 * kv_rows)
            parts = [slice(cuts[j], cuts[j + 1]) for j in range(3)]
            copy_rows(block, ("q_proj", "k_proj", "v_proj"), a.qkv_proj, parts)
            copy_linear(block, a, ("o_proj",))
        else:
            copy_linear(block, a, ("q_proj", "k_proj", "v_proj", "o_proj"))
        if hasattr(m, "gate_up_proj"):  # Phi-3: rows [gate | up]
            half = m.gate_up_proj.weight.shape[0] // 2
            parts = [slice(0, half), slice(half, 2 * half)]
            copy_rows(block, ("gate_proj", "up_proj"), m.gate_up_proj, parts)
            copy_linear(block, m, ("down_proj",))
        else:
            copy_linear(block, m, ("gate_proj", "up_proj", "down_proj"))
    copy_output(dst, model)


@dataclass(frozen=True)
class Port:
    r"""How :func:`~companion.decoder.from_hf` reads one family of Hugging Face causal
    LMs: an entry of :data:`PORTS`.

    The extension point: a family the copy does not know becomes a :class:`Port` passed
    as ``from_hf(model, port=...)`` (or added to :data:`PORTS`), with no change to the
    package. Chapter :ref:`ch-real-models` walks through porting one more.

    Args:
        spec: ``spec(model) -> dict``, the :class:`~companion.decoder.DecoderSpec`
            fields read from ``model.config`` (most build on
            :func:`~companion.families.base_fields`). It
            refuses (``ValueError``) every option the copy does not implement, so
            nothing is silently dropped.
        load: ``load(copy, model) -> None``, copies every weight of ``model`` into
            ``copy`` (a :class:`~companion.decoder.Decoder` of that spec, on ``model``'s
            device and dtype; ``from_hf`` runs it under ``torch.no_grad``), with the
            family's conversions (transposes, fused projections split, tied embeddings
            kept). The default, ``load_llama``, copies Llama's layout (the modules
            ``model.embed_tokens``, ``model.layers[i].self_attn.q_proj``, ...,
            ``model.norm``, ``lm_head``), norm biases included.
        layers: where ``model`` keeps its list of decoder layers (default
            ``"model.layers"``): ``from_hf`` refuses a model whose list is not
            ``num_layers`` long.
        block: the class of every layer, :class:`~companion.decoder.DecoderBlock` or a
            subclass keeping its interface (``from_hf`` builds
            ``Decoder(spec, block=block)``).
        spec_type: :class:`~companion.decoder.DecoderSpec` or a subclass with more
            fields (``from_hf`` builds ``spec_type(**spec(model))``).
        decoder: :class:`~companion.decoder.Decoder` or a subclass (``from_hf``
            builds ``decoder(spec, block=block)``; Gemma 4's overrides one step,
            :meth:`~companion.decoder.Decoder.layer`).
    """

    spec: Callable[[nn.Module], dict[str, Any]]
    load: Callable[[Decoder, nn.Module], None] = load_llama
    layers: str = "model.layers"
    block: type[DecoderBlock] = DecoderBlock
    spec_type: type[DecoderSpec] = DecoderSpec
    decoder: type[Decoder] = Decoder

    def __post_init__(self) -> None:
        _validate.callable_("spec", self.spec)
        _validate.callable_("load", self.load)
        _validate.instance(
            "layers", self.layers, str, "the path of a layer list, e.g. 'model.layers'"
        )
        check_block_type("block", self.block)
        if not (
            isinstance(self.spec_type, type) and issubclass(self.spec_type, DecoderSpec)
        ):
            raise TypeError(
                "spec_type must be DecoderSpec or a subclass of it, got "
                f"{_validate.describe(self.spec_type)}"
            )
        if not (isinstance(self.decoder, type) and issubclass(self.decoder, Decoder)):
            raise TypeError(
                "decoder must be Decoder or a subclass of it (the class), got "
                f"{_validate.describe(self.decoder)}"
            )


# ---- reading the config --------------------------------------------------------------


SLIDING = ("every_layer", "layer_types")
"""How a family reads sliding windows (:func:`base_fields`' ``sliding``)."""


def unsupported(what: str) -> ValueError:
    """The error a reader raises for an option the copy does not implement."""
    return ValueError(f"{what} is not supported by companion.decoder.from_hf")


def base_fields(
    model: nn.Module,
    family: str,
    *,
    sliding: str | None = None,
    partial_rotary: bool = False,
    rope_params: dict[str, Any] | None = None,
    nested: bool = False,
    **fields: Any,
) -> dict[str, Any]:
    r"""The :class:`~companion.decoder.DecoderSpec` fields every family reads alike.

    Llama's block read from ``model.config`` under Hugging Face's standard names (its
    ``attribute_map`` gives GPT-2's ``n_embd`` as ``hidden_size``): RMSNorm before each
    sublayer, a gated MLP, RoPE over each head (``rope_parameters`` read by
    ``rope_parameters``), biases from ``attention_bias`` and ``mlp_bias``, score
    scale :math:`1/\sqrt{D}`. ``fields`` replace what the family changes (a field given
    is not read); after checking what no family's copy follows (``check_common``).

    Args:
        model: a Hugging Face causal LM.
        family: the family's name (the spec's ``family``).
        sliding: ``None`` (sliding windows refused), ``"every_layer"`` (Mistral, Phi-3:
            ``sliding_window`` in every layer) or ``"layer_types"`` (Qwen2/3, Gemma:
            the config's ``layer_types``), read by ``layer_types``.
        partial_rotary: accept a ``partial_rotary_factor`` below 1 (RoPE on the first
            ``head_dim * factor`` coordinates: GPT-NeoX, Phi-3).
        rope_params: the RoPE parameters to read (default ``config.rope_parameters``).
        nested: ``rope_params`` is one set of a per-layer-type dict (Gemma 3).
        **fields: the family's own fields.

    Returns:
        A dict of ``DecoderSpec`` fields.
    """
    _validate.module("model", model)
    _validate.instance("family", family, str, "a str (the family's name)")
    _validate.optional(_validate.choice, "sliding", sliding, options=SLIDING)
    partial_rotary = _validate.flag("partial_rotary", partial_rotary)
    c = model.config
    check_common(c, sliding=sliding is not None)
    heads, n = c.num_attention_heads, c.num_hidden_layers
    head_dim = fields.get("head_dim") or getattr(c, "head_dim", None)
    head_dim = head_dim or c.hidden_size // heads
    bias = bool(getattr(c, "attention_bias", False))
    out = dict(
        family=family,
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        num_layers=n,
        num_heads=heads,
        num_kv_heads=fields.get("num_kv_heads")
        or getattr(c, "num_key_value_heads", None)
        or heads,
        head_dim=head_dim,
        intermediate_size=getattr(c, "intermediate_size", None),
        positions="rope",
        norm="rms",
        eps=getattr(c, "rms_norm_eps", None),
        mlp="gated",
        activation=getattr(c, "hidden_act", None),
        parallel_residual=False,
        tied_embeddings=tied(model),
        qkv_bias=bias,
        out_bias=bias,
        mlp_bias=bool(getattr(c, "mlp_bias", False)),
        max_positions=getattr(c, "max_position_embeddings", None) or 0,
        scales=(head_dim**-0.5,) * n,
    )
    if sliding is not None:
        window, types = layer_types(c, every_layer=sliding == "every_layer")
        out.update(sliding_window=window, layer_types=types)
    out.update(fields)
    out["activation"] = activation(out["activation"])
    if out["positions"] == "rope":
        params = (
            getattr(c, "rope_parameters", None) if rope_params is None else rope_params
        )
        if "rotary_dim" not in fields:
            out["rotary_dim"] = rotary_dim(head_dim, params, family, partial_rotary)
        if "rope" not in fields:
            out["rope"] = rope_parameters(c, out["rotary_dim"], params, nested)
    return out


def rotary_dim(
    head_dim: int, params: dict[str, Any] | None, family: str, partial: bool
) -> int:
    """How many leading coordinates of a head RoPE turns: ``head_dim`` times the
    ``partial_rotary_factor`` of ``params`` (Hugging Face's ``rotary_ndims``), a factor
    below 1 refused unless ``partial``."""
    if (params or {}).get("rope_type") == "proportional":
        return head_dim  # p-RoPE's p: the pairs that turn, over the whole head
    factor = float((params or {}).get("partial_rotary_factor", 1.0) or 1.0)
    if factor != 1.0 and not partial:
        raise unsupported(f"partial_rotary_factor {factor} in a {family} model")
    dim = int(head_dim * factor)
    if dim < 2 or dim % 2:
        raise unsupported(
            f"partial_rotary_factor {factor} (rotary dimension {dim} must be even, "
            ">= 2)"
        )
    return dim


def rope_parameters(
    config: Any,
    rotary_dim: int,
    params: dict[str, Any] | None = None,
    nested: bool = False,
) -> dict[str, Any]:
    """``params`` (default ``config.rope_parameters``) with the keys Hugging Face
    derives filled in; ``nested``: one set of a per-layer-type dict (Gemma 3)."""
    if params is None:
        params = getattr(config, "rope_parameters", None)
    params = dict(params or {})
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise unsupported(f"rope_type {kind!r} (supported: {', '.join(ROPE_TYPES)})")
    params["rope_type"] = kind
    if kind == "yarn":
        if params.get("factor") is None:  # DeepSeek's convention
            params["factor"] = (
                config.max_position_embeddings
                / params["original_max_position_embeddings"]
            )
        if params.get("attention_factor") is None and params.get("mscale"):
            mscale, all_dim = params.get("mscale"), params.get("mscale_all_dim")
            if all_dim:  # DeepSeek's ratio of two YaRN factors

                def get(s: float, m: float) -> float:
                    return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0

                params["attention_factor"] = get(params["factor"], mscale) / get(
                    params["factor"], all_dim
                )
    if kind == "longrope":
        params["original_max_position_embeddings"] = _longrope_original(
            config, params, nested
        )
        if params.get("factor") is None:  # Hugging Face's default
            params["factor"] = (
                config.max_position_embeddings
                / params["original_max_position_embeddings"]
            )
    if rotary_dim < 4 and kind == "dynamic":
        raise unsupported(f"dynamic NTK with rotary_dim {rotary_dim} (needs >= 4)")
    return params


def _longrope_original(config: Any, params: dict[str, Any], nested: bool) -> Any:
    """LongRoPE's training length :math:`L_0` where Hugging Face 5.23 reads it.

    ``standardize_rope_params`` (run again by ``_compute_longrope_parameters``) sets
    a single set's key from the config attribute ``original_max_position_embeddings``
    when the config has one (Phi-3's always does), else keeps the key, else
    ``max_position_embeddings``; a per-layer-type set (Gemma 3) keeps its key, else
    ``max_position_embeddings``, and ignores the attribute. A single set whose key and
    attribute differ (a config changed after loading) is refused: Hugging Face's
    rotary embedding then reads one or the other depending on its calls so far
    (``longrope_frequency_update`` reads the key; its first call re-standardizes).
    """
    key = params.get("original_max_position_embeddings")
    attribute = getattr(config, "original_max_position_embeddings", None)
    if nested or attribute is None:
        return config.max_position_embeddings if key is None else key
    if key is not None and key != attribute:
        raise unsupported(
            f"rope_type 'longrope' with rope_parameters['original_max_position_"
            f"embeddings']={key} and config.original_max_position_embeddings="
            f"{attribute} (Hugging Face's rotary embedding reads one, then the other)"
        )
    return attribute


def check_common(config: Any, sliding: bool = False) -> None:
    """What no family's copy follows; ``sliding``: the family reads sliding windows
    (``layer_types``), the others refuse them."""
    if not sliding and getattr(config, "sliding_window", None) is not None:
        raise unsupported(
            f"sliding-window attention (sliding_window={config.sliding_window})"
        )
    layer_types = getattr(config, "layer_types", None)
    known = ("full_attention", "sliding_attention") if sliding else ("full_attention",)
    if layer_types and any(t not in known for t in layer_types):
        raise unsupported(f"layer_types {sorted(set(layer_types))}")
    if getattr(config, "use_bidirectional_attention", False):
        raise unsupported("bidirectional attention (use_bidirectional_attention=True)")
    if getattr(config, "add_cross_attention", False):
        raise unsupported("cross-attention (add_cross_attention=True)")
    if getattr(config, "is_encoder_decoder", False):
        raise unsupported("an encoder-decoder model")


def activation(name: object) -> str:
    """``name`` if it is a key of ``ACTIVATIONS``, else refused."""
    if not isinstance(name, str) or name not in ACTIVATIONS:
        raise unsupported(f"activation {name!r} (supported: {', '.join(ACTIVATIONS)})")
    return name


def tied(model: nn.Module) -> bool:
    """Whether ``model``'s output matrix is its input embedding (one parameter)."""
    return model.get_output_embeddings().weight is model.get_input_embeddings().weight


def layer_types(config: Any, every_layer: bool) -> tuple[int, tuple[str, ...]]:
    """``(sliding_window, layer_types)``: Mistral and Phi-3 slide in every layer when
    ``sliding_window`` is set (``every_layer``); Qwen2/3 and Gemma 2/3 name each
    layer's kind in ``layer_types``."""
    n, window = config.num_hidden_layers, getattr(config, "sliding_window", None)
    if every_layer:
        kind = "full_attention" if window is None else "sliding_attention"
        types = (kind,) * n
    else:
        types = tuple(getattr(config, "layer_types", None) or ("full_attention",) * n)
    if "sliding_attention" not in types:
        return 0, types
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise unsupported(f"sliding_window {window!r} with sliding layers")
    return window, types


# ---- the families' readers -----------------------------------------------------------


def spec_llama(model: nn.Module) -> dict[str, Any]:
    """Llama: the block every other reader starts from."""
    return base_fields(model, "llama")


def spec_gpt2(model: nn.Module) -> dict[str, Any]:
    """GPT-2: a learned position table, LayerNorm, a plain MLP, biases everywhere, the
    score scale optionally divided by the layer's number."""
    c = model.config
    head_dim = c.n_embd // c.n_head
    scale = head_dim**-0.5 if c.scale_attn_weights else 1.0
    inverse = bool(c.scale_attn_by_inverse_layer_idx)
    return base_fields(
        model,
        "gpt2",
        intermediate_size=c.n_inner or 4 * c.n_embd,
        positions="learned",
        norm="layer",
        eps=c.layer_norm_epsilon,
        mlp="plain",
        activation=c.activation_function,
        qkv_bias=True,
        out_bias=True,
        mlp_bias=True,
        scales=tuple(scale / (i + 1) if inverse else scale for i in range(c.n_layer)),
    )


def spec_gpt_neox(model: nn.Module) -> dict[str, Any]:
    """GPT-NeoX: LayerNorm, a plain MLP, partial RoPE, a parallel residual."""
    c = model.config
    return base_fields(
        model,
        "gpt_neox",
        partial_rotary=True,
        num_kv_heads=c.num_attention_heads,
        norm="layer",
        eps=c.layer_norm_eps,
        mlp="plain",
        parallel_residual=bool(c.use_parallel_residual),
        mlp_bias=True,
    )


def spec_bloom(model: nn.Module) -> dict[str, Any]:
    """BLOOM: ALiBi, LayerNorm (also after the embedding), biases everywhere."""
    c = model.config
    tp = getattr(c, "pretraining_tp", 1)
    if getattr(c, "slow_but_exact", False) and tp > 1:
        # Hugging Face's slow_but_exact path sums pretraining_tp slices of dense and
        # dense_4h_to_h with F.linear and no bias: another function than the model's
        raise unsupported(
            f"model with BLOOM's slow_but_exact=True and pretraining_tp={tp} (Hugging "
            "Face's path then drops the biases of dense and dense_4h_to_h)"
        )
    return base_fields(
        model,
        "bloom",
        intermediate_size=4 * c.hidden_size,
        positions="alibi",
        norm="layer",
        eps=c.layer_norm_epsilon,
        mlp="plain",
        activation="bloom_gelu",
        residual_from_norm=bool(c.apply_residual_connection_post_layernorm),
        embedding_norm=True,
        qkv_bias=True,
        out_bias=True,
        mlp_bias=True,
    )


def spec_mistral(model: nn.Module) -> dict[str, Any]:
    """Mistral: Llama's block, a sliding window in every layer when one is set."""
    return base_fields(model, "mistral", sliding="every_layer")


def spec_qwen2(model: nn.Module) -> dict[str, Any]:
    """Qwen2: q, k, v biases always and none on ``o_proj``; sliding layers."""
    return base_fields(
        model, "qwen2", sliding="layer_types", qkv_bias=True, out_bias=False
    )


def spec_qwen3(model: nn.Module) -> dict[str, Any]:
    """Qwen3: QK-norm over each head; sliding layers."""
    return base_fields(model, "qwen3", sliding="layer_types", qk_norm="head")


def spec_olmo2(model: nn.Module) -> dict[str, Any]:
    """OLMo 2: RMSNorm after each sublayer, QK-norm over the whole projection."""
    return base_fields(
        model, "olmo2", qk_norm="projection", block_norms="post", rms_variant="torch"
    )


def spec_gemma2(model: nn.Module, family: str = "gemma2", **fields: Any) -> dict:
    """Gemma 2: Gemma's RMSNorm on both sides of each sublayer, scaled embeddings,
    soft-capped scores and logits, its own score scale; sliding layers."""
    c = model.config
    return base_fields(
        model,
        family,
        sliding="layer_types",
        activation=c.hidden_activation,
        scales=(float(c.query_pre_attn_scalar) ** -0.5,) * c.num_hidden_layers,
        rms_variant="gemma",
        block_norms="sandwich",
        embedding_scale=c.hidden_size**0.5,
        attn_softcap=float(getattr(c, "attn_logit_softcapping", None) or 0.0),
        final_softcap=float(getattr(c, "final_logit_softcapping", None) or 0.0),
        **fields,
    )


def spec_gemma3(model: nn.Module) -> dict[str, Any]:
    """Gemma 3: Gemma 2's block with QK-norm and one RoPE set per layer type (a local
    base in sliding layers)."""
    c = model.config
    if getattr(c, "attn_logit_softcapping", None) is not None:
        # Hugging Face 5.23's Gemma3Attention stores it and never applies it
        raise unsupported(
            f"attn_logit_softcapping={c.attn_logit_softcapping} in a Gemma 3 model "
            "(Hugging Face's Gemma3Attention does not apply it)"
        )
    rope = getattr(c, "rope_parameters", None) or {}
    full, local = rope.get("full_attention"), rope.get("sliding_attention")
    fields = spec_gemma2(model, "gemma3", qk_norm="head", rope_params=full, nested=True)
    if local:
        fields["local_rope"] = rope_parameters(c, fields["rotary_dim"], local, True)
    return fields


def spec_smollm3(model: nn.Module) -> dict[str, Any]:
    """SmolLM3: Llama's block; the layers whose ``no_rope_layers`` entry is 0 skip
    RoPE (1 means "use RoPE"; Hugging Face's default zeroes every 4th layer)."""
    c = model.config
    n, flags = c.num_hidden_layers, getattr(c, "no_rope_layers", None)
    if (
        not isinstance(flags, (list, tuple))
        or len(flags) < n
        or any(f not in (0, 1) for f in flags[:n])
    ):
        raise unsupported(
            f"no_rope_layers {flags!r} (SmolLM3 reads one 0 or 1 per layer, {n} layers)"
        )
    types = getattr(c, "layer_types", None) or ()
    if "sliding_attention" in types and not getattr(c, "use_sliding_window", False):
        # Hugging Face's eager and SDPA masks slide there, its flash path does not
        raise unsupported("sliding layers with use_sliding_window=False in SmolLM3")
    nope = tuple(i for i in range(n) if not flags[i])
    return base_fields(model, "smollm3", sliding="layer_types", nope_layers=nope)


def spec_cohere2(model: nn.Module) -> dict[str, Any]:
    """Cohere2 (Command R7B, Command A): a parallel block from one bias-free LayerNorm,
    interleaved RoPE in the sliding layers and none in the full ones, scaled logits."""
    c = model.config
    fields = base_fields(
        model,
        "cohere2",
        sliding="layer_types",
        norm="layer",
        eps=c.layer_norm_eps,
        parallel_residual=True,
        shared_norm=True,
        layer_norm_bias=False,
        rope_layout="interleaved",  # Cohere's rotate_half pairs (2i, 2i + 1)
        logit_scale=c.logit_scale,
    )
    types = fields["layer_types"]
    fields["nope_layers"] = tuple(
        i for i, t in enumerate(types) if t != "sliding_attention"
    )
    return fields


def spec_phi3(model: nn.Module) -> dict[str, Any]:
    """Phi-3: Llama's block with fused projections (``load_llama`` splits them),
    full or partial RoPE, a sliding window in every layer when one is set."""
    return base_fields(model, "phi3", sliding="every_layer", partial_rotary=True)


# ---- the routed experts of a mixture -------------------------------------------------


def routed_experts(
    tokens: Tensor,
    weights: Tensor,
    chosen: Tensor,
    gate_up: Tensor,
    down: Tensor,
    act: Callable[[Tensor], Tensor],
) -> Tensor:
    r""":math:`\sum_{j} w_{tj}\,\mathrm{MLP}_{c_{tj}}(x_t)` for each token, each expert
    a gated MLP run once on the tokens that chose it: ``gate_up[e]`` ``(2I, E)`` holds
    its gate rows then its up rows, ``down[e]`` ``(E, I)`` (Hugging Face's layouts,
    applied as ``x @ W[e].T``). ``tokens`` ``(T, E)``; ``weights`` and ``chosen``
    ``(T, k)``, a router's output (checked by the routers); returns ``(T, E)`` in
    ``tokens``' dtype. The one home of DeepSeek-V3's and Qwen3-Next's routed experts."""
    out = torch.zeros_like(tokens)  # (T, E)
    for e in chosen.unique().tolist():  # each expert on the tokens that chose it
        rows, slot = torch.where(chosen == e)
        gate, up = (tokens[rows] @ gate_up[e].T).chunk(2, dim=-1)
        y = (act(gate) * up) @ down[e].T  # (T_e, E)
        out.index_add_(0, rows, (y * weights[rows, slot, None]).to(out.dtype))
    return out


# ---- copying the weights -------------------------------------------------------------


def copy_tensor(dst: Tensor, src: Tensor) -> None:
    """A parameter or buffer copied, refusing a shape ``copy_`` would broadcast."""
    if dst.shape != src.shape:
        raise ValueError(
            f"model's weights must fit the spec: a tensor of shape {tuple(src.shape)} "
            f"goes where the copy holds {tuple(dst.shape)}"
        )
    dst.copy_(src)


def copy_weight(
    dst: nn.Linear | nn.Module, weight: Tensor, bias: Tensor | None = None
) -> None:
    """One layer's weight (and bias), refusing anything that does not fit exactly:
    ``copy_`` would broadcast a wrong shape, and a bias on one side only would leave
    the copy's at its random initial value or drop Hugging Face's."""
    if tuple(weight.shape) != tuple(dst.weight.shape):
        raise ValueError(
            f"model's weights must fit the spec: a weight of shape "
            f"{tuple(weight.shape)} goes where the copy holds {tuple(dst.weight.shape)}"
        )
    if (bias is None) != (getattr(dst, "bias", None) is None):
        sides = ("Hugging Face's model", "the copy")
        have, lack = sides if bias is not None else sides[::-1]
        hint = (
            "the spec's qkv_bias, out_bias or mlp_bias"
            if isinstance(dst, nn.Linear)
            else f"a norm: the spec's norm, here {type(dst).__name__}"
        )
        raise ValueError(
            f"model's weights must fit the spec: a layer of shape "
            f"{tuple(weight.shape)} has a bias in {have} and none in {lack} ({hint})"
        )
    dst.weight.copy_(weight)
    if bias is not None:
        dst.bias.copy_(bias)


def copy_norm(dst: nn.Module, src: nn.Module) -> None:
    """A norm's gain, and its bias where it has one (LayerNorm; RMSNorm has none)."""
    copy_weight(dst, src.weight, getattr(src, "bias", None))


def copy_linear(block: nn.Module, src: nn.Module, names: tuple[str, ...]) -> None:
    """The ``nn.Linear`` layers ``names`` of ``src`` into the same names of ``block``."""
    for name in names:
        theirs = getattr(src, name)
        copy_weight(getattr(block, name), theirs.weight, theirs.bias)


def copy_rows(
    block: nn.Module, names: tuple[str, ...], fused: nn.Linear, parts: list[slice]
) -> None:
    """A fused ``nn.Linear`` split by rows: rows ``parts[j]`` into ``names[j]``."""
    w, b = fused.weight, fused.bias
    for name, rows in zip(names, parts, strict=True):
        copy_weight(getattr(block, name), w[rows], None if b is None else b[rows])


def copy_output(dst: Decoder, model: nn.Module) -> None:
    """The output matrix, unless it is the (already copied) input embedding."""
    if not dst.spec.tied_embeddings:
        dst.lm_head.weight.copy_(model.get_output_embeddings().weight)


def split_fused(weight: Tensor, bias: Tensor | None, heads: int) -> list:
    """GPT-NeoX's and BLOOM's fused ``query_key_value``: rows ``(H, 3, D)`` per head."""
    e = weight.shape[1]
    w = weight.view(heads, 3, -1, e)  # (H, q/k/v, D, E)
    b = None if bias is None else bias.view(heads, 3, -1)
    return [
        (w[:, j].reshape(-1, e), None if b is None else b[:, j].reshape(-1))
        for j in range(3)
    ]


def load_gpt2(dst: Decoder, model: nn.Module) -> None:
    """GPT-2's weights: every ``Conv1D`` transposed, ``c_attn`` split by columns."""
    base = model.transformer
    dst.embed.weight.copy_(base.wte.weight)
    dst.position_embed.weight.copy_(base.wpe.weight)
    copy_norm(dst.final_norm, base.ln_f)
    e = dst.spec.hidden_size
    for block, layer in zip(dst.blocks, base.h, strict=True):
        copy_norm(block.norm1, layer.ln_1)
        copy_norm(block.norm2, layer.ln_2)
        # Conv1D stores W as (in, out), x @ W + b: the transpose of Linear's weight
        w, b = layer.attn.c_attn.weight, layer.attn.c_attn.bias  # (E, 3E), (3E,)
        for j, name in enumerate(("q_proj", "k_proj", "v_proj")):
            sl = slice(j * e, (j + 1) * e)
            copy_weight(getattr(block, name), w[:, sl].t(), b[sl])
        for ours, theirs in (
            (block.o_proj, layer.attn.c_proj),
            (block.up_proj, layer.mlp.c_fc),
            (block.down_proj, layer.mlp.c_proj),
        ):
            copy_weight(ours, theirs.weight.t(), theirs.bias)
    copy_output(dst, model)


def load_fused(dst: Decoder, model: nn.Module) -> None:
    """GPT-NeoX's and BLOOM's weights: a fused ``query_key_value``, head by head."""
    s = dst.spec
    if s.family == "gpt_neox":
        base = model.gpt_neox
        dst.embed.weight.copy_(base.embed_in.weight)
        final, layers = base.final_layer_norm, base.layers
    else:
        base = model.transformer
        dst.embed.weight.copy_(base.word_embeddings.weight)
        copy_norm(dst.embed_norm, base.word_embeddings_layernorm)
        final, layers = base.ln_f, base.h
    copy_norm(dst.final_norm, final)
    for block, layer in zip(dst.blocks, layers, strict=True):
        a = layer.attention if s.family == "gpt_neox" else layer.self_attention
        copy_norm(block.norm1, layer.input_layernorm)
        copy_norm(block.norm2, layer.post_attention_layernorm)
        fused = split_fused(
            a.query_key_value.weight, a.query_key_value.bias, s.num_heads
        )
        for (w, b), name in zip(fused, ("q_proj", "k_proj", "v_proj"), strict=True):
            copy_weight(getattr(block, name), w, b)
        for ours, theirs in (
            (block.o_proj, a.dense),
            (block.up_proj, layer.mlp.dense_h_to_4h),
            (block.down_proj, layer.mlp.dense_4h_to_h),
        ):
            copy_weight(ours, theirs.weight, theirs.bias)
    copy_output(dst, model)


# ---- the registry --------------------------------------------------------------------


PORTS: dict[str, Port] = {
    "LlamaForCausalLM": Port(spec=spec_llama),
    "GPT2LMHeadModel": Port(spec=spec_gpt2, load=load_gpt2, layers="transformer.h"),
    "GPTNeoXForCausalLM": Port(
        spec=spec_gpt_neox, load=load_fused, layers="gpt_neox.layers"
    ),
    "BloomForCausalLM": Port(spec=spec_bloom, load=load_fused, layers="transformer.h"),
    "MistralForCausalLM": Port(spec=spec_mistral),
    "Qwen2ForCausalLM": Port(spec=spec_qwen2),
    "Qwen3ForCausalLM": Port(spec=spec_qwen3),
    "Olmo2ForCausalLM": Port(spec=spec_olmo2),
    "Gemma2ForCausalLM": Port(spec=spec_gemma2),
    "Gemma3ForCausalLM": Port(spec=spec_gemma3),
    "Phi3ForCausalLM": Port(spec=spec_phi3),
}
"""The registry, each Hugging Face class :func:`~companion.decoder.from_hf` copies
without being told how, with its :class:`Port` (a class derived from one of them is
read as that class). The eleven families of :mod:`companion.decoder`'s table;
``companion.mla.PORTS`` adds DeepSeek-V3, whose layer is its own, and
:data:`HYBRID_PORTS` the RoPE/NoPE hybrids."""

HYBRID_PORTS: dict[str, Port] = {
    "SmolLM3ForCausalLM": Port(spec=spec_smollm3),
    "Cohere2ForCausalLM": Port(spec=spec_cohere2),
}
"""The RoPE/NoPE hybrids (issue 34's attention layer of 2025-2026):
:func:`~companion.decoder.from_hf` looks here after :data:`PORTS`. SmolLM3 (Llama's
block, NoPE every 4th layer by default) and Cohere2 (sliding RoPE layers, global NoPE
layers); both in Llama's weight layout."""
