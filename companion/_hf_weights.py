r"""Reading a Hugging Face causal LM for :func:`companion.decoder.from_hf`.

Its config becomes the fields of a :class:`companion.decoder.DecoderSpec` (after
checking that the copy implements every option), its weights are copied into a
:class:`companion.decoder.Decoder`, with each family's conversions (see
:func:`~companion.decoder.from_hf`). For each family it holds a reading
(:func:`spec_fields`), a loader (``LOADERS``) and the path of the layer list
(``LAYERS``), from which :mod:`companion.decoder` builds its public
:class:`~companion.decoder.Port` objects (``PORTS``). Private: it is tested through
``from_hf``; it imports nothing from :mod:`companion.decoder`, which imports it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from torch import Tensor, nn
from torch.nn import functional as F

if TYPE_CHECKING:
    from companion.decoder import Decoder

__all__: list[str] = []  # private: nothing here is part of the documented API

ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "GPT2LMHeadModel": "gpt2",
    "GPTNeoXForCausalLM": "gpt_neox",
    "BloomForCausalLM": "bloom",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Olmo2ForCausalLM": "olmo2",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3",
    "Phi3ForCausalLM": "phi3",
}
"""The Hugging Face classes :func:`companion.decoder.from_hf` copies, and the family
name each gets."""

ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3", "longrope")
"""The RoPE scaling types (``rope_parameters["rope_type"]``) a copy follows, in every
family with RoPE (``longrope`` too, with the training length where Hugging Face reads
it)."""

# Hugging Face activation names -> the same function in torch
ACTIVATIONS = {
    "silu": F.silu,
    "swish": F.silu,
    "relu": F.relu,
    "gelu": F.gelu,  # the exact (erf) GELU
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),  # GPT-2's tanh approximation
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_fast": lambda x: F.gelu(x, approximate="tanh"),
    "bloom_gelu": lambda x: F.gelu(x, approximate="tanh"),  # BLOOM's BloomGelu
}


# ---- reading the config --------------------------------------------------------------


def _unsupported(what: str) -> ValueError:
    return ValueError(f"{what} is not supported by companion.decoder.from_hf")


def _rope_parameters(
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
        raise _unsupported(f"rope_type {kind!r} (supported: {', '.join(ROPE_TYPES)})")
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
        raise _unsupported(f"dynamic NTK with rotary_dim {rotary_dim} (needs >= 4)")
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
        raise _unsupported(
            f"rope_type 'longrope' with rope_parameters['original_max_position_"
            f"embeddings']={key} and config.original_max_position_embeddings="
            f"{attribute} (Hugging Face's rotary embedding reads one, then the other)"
        )
    return attribute


def _check_common(config: Any, sliding: bool = False) -> None:
    """What no family's copy follows; ``sliding``: the family reads sliding windows
    (:func:`_layer_types`), the others refuse them."""
    if not sliding and getattr(config, "sliding_window", None) is not None:
        raise _unsupported(
            f"sliding-window attention (sliding_window={config.sliding_window})"
        )
    layer_types = getattr(config, "layer_types", None)
    known = ("full_attention", "sliding_attention") if sliding else ("full_attention",)
    if layer_types and any(t not in known for t in layer_types):
        raise _unsupported(f"layer_types {sorted(set(layer_types))}")
    if getattr(config, "use_bidirectional_attention", False):
        raise _unsupported("bidirectional attention (use_bidirectional_attention=True)")
    if getattr(config, "add_cross_attention", False):
        raise _unsupported("cross-attention (add_cross_attention=True)")
    if getattr(config, "is_encoder_decoder", False):
        raise _unsupported("an encoder-decoder model")


def _activation(name: object) -> str:
    if not isinstance(name, str) or name not in ACTIVATIONS:
        raise _unsupported(f"activation {name!r} (supported: {', '.join(ACTIVATIONS)})")
    return name


def _tied(model: nn.Module) -> bool:
    return model.get_output_embeddings().weight is model.get_input_embeddings().weight


def _spec_llama(model: nn.Module) -> dict[str, Any]:
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    params = _rope_parameters(c, head_dim)
    if float(params.get("partial_rotary_factor", 1.0)) != 1.0:
        raise _unsupported(
            f"partial_rotary_factor {params['partial_rotary_factor']} in a Llama model"
        )
    kv = c.num_key_value_heads or c.num_attention_heads
    return dict(
        family="llama",
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        num_layers=c.num_hidden_layers,
        num_heads=c.num_attention_heads,
        num_kv_heads=kv,
        head_dim=head_dim,
        intermediate_size=c.intermediate_size,
        positions="rope",
        norm="rms",
        eps=float(c.rms_norm_eps),
        mlp="gated",
        activation=_activation(c.hidden_act),
        parallel_residual=False,
        tied_embeddings=_tied(model),
        qkv_bias=bool(getattr(c, "attention_bias", False)),
        out_bias=bool(getattr(c, "attention_bias", False)),
        mlp_bias=bool(getattr(c, "mlp_bias", False)),
        max_positions=c.max_position_embeddings,
        rotary_dim=head_dim,
        rope=params,
        scales=(head_dim**-0.5,) * c.num_hidden_layers,
    )


def _spec_gpt2(model: nn.Module) -> dict[str, Any]:
    c = model.config
    head_dim = c.n_embd // c.n_head
    scale = head_dim**-0.5 if c.scale_attn_weights else 1.0
    inverse = bool(c.scale_attn_by_inverse_layer_idx)
    return dict(
        family="gpt2",
        vocab_size=c.vocab_size,
        hidden_size=c.n_embd,
        num_layers=c.n_layer,
        num_heads=c.n_head,
        num_kv_heads=c.n_head,
        head_dim=head_dim,
        intermediate_size=c.n_inner or 4 * c.n_embd,
        positions="learned",
        norm="layer",
        eps=float(c.layer_norm_epsilon),
        mlp="plain",
        activation=_activation(c.activation_function),
        parallel_residual=False,
        tied_embeddings=_tied(model),
        qkv_bias=True,
        out_bias=True,
        mlp_bias=True,
        max_positions=c.n_positions,
        scales=tuple(scale / (i + 1) if inverse else scale for i in range(c.n_layer)),
    )


def _spec_gpt_neox(model: nn.Module) -> dict[str, Any]:
    c = model.config
    head_dim = c.hidden_size // c.num_attention_heads
    partial = float((c.rope_parameters or {}).get("partial_rotary_factor", 1.0))
    rotary_dim = int(head_dim * partial)  # HF's rotary_ndims
    if rotary_dim < 2 or rotary_dim % 2:
        raise _unsupported(
            f"partial_rotary_factor {partial} (rotary_ndims {rotary_dim} must be "
            "even, >= 2)"
        )
    return dict(
        family="gpt_neox",
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        num_layers=c.num_hidden_layers,
        num_heads=c.num_attention_heads,
        num_kv_heads=c.num_attention_heads,
        head_dim=head_dim,
        intermediate_size=c.intermediate_size,
        positions="rope",
        norm="layer",
        eps=float(c.layer_norm_eps),
        mlp="plain",
        activation=_activation(c.hidden_act),
        parallel_residual=bool(c.use_parallel_residual),
        tied_embeddings=_tied(model),
        qkv_bias=bool(c.attention_bias),
        out_bias=bool(c.attention_bias),
        mlp_bias=True,
        max_positions=c.max_position_embeddings,
        rotary_dim=rotary_dim,
        rope=_rope_parameters(c, rotary_dim),
        scales=(head_dim**-0.5,) * c.num_hidden_layers,
    )


def _spec_bloom(model: nn.Module) -> dict[str, Any]:
    c = model.config
    tp = getattr(c, "pretraining_tp", 1)
    if getattr(c, "slow_but_exact", False) and tp > 1:
        # Hugging Face's slow_but_exact path sums pretraining_tp slices of dense and
        # dense_4h_to_h with F.linear and no bias: another function than the model's
        raise _unsupported(
            f"model with BLOOM's slow_but_exact=True and pretraining_tp={tp} (Hugging "
            "Face's path then drops the biases of dense and dense_4h_to_h)"
        )
    head_dim = c.hidden_size // c.n_head
    return dict(
        family="bloom",
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        num_layers=c.n_layer,
        num_heads=c.n_head,
        num_kv_heads=c.n_head,
        head_dim=head_dim,
        intermediate_size=4 * c.hidden_size,
        positions="alibi",
        norm="layer",
        eps=float(c.layer_norm_epsilon),
        mlp="plain",
        activation="bloom_gelu",
        parallel_residual=False,
        residual_from_norm=bool(c.apply_residual_connection_post_layernorm),
        embedding_norm=True,
        tied_embeddings=_tied(model),
        qkv_bias=True,
        out_bias=True,
        mlp_bias=True,
        scales=(head_dim**-0.5,) * c.n_layer,
    )


def _layer_types(config: Any, every_layer: bool) -> tuple[int, tuple[str, ...]]:
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
        raise _unsupported(f"sliding_window {window!r} with sliding layers")
    return window, types


def _spec_modern(model: nn.Module, family: str) -> dict[str, Any]:
    """The families of 2024-2025: Llama's block with their differences."""
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    window, types = _layer_types(c, every_layer=family in ("mistral", "phi3"))
    gemma = family in ("gemma2", "gemma3")
    act = c.hidden_activation if gemma else c.hidden_act
    bias = bool(getattr(c, "attention_bias", False))
    rope, local = getattr(c, "rope_parameters", None) or {}, {}
    if family == "gemma3":  # one set per layer type: the local base for sliding layers
        rope, local = rope.get("full_attention"), rope.get("sliding_attention")
    partial = float((rope or {}).get("partial_rotary_factor", 1.0) or 1.0)
    rotary_dim = int(head_dim * partial)
    if partial != 1.0 and family != "phi3":
        raise _unsupported(f"partial_rotary_factor {partial} in a {family} model")
    if rotary_dim < 2 or rotary_dim % 2:
        raise _unsupported(
            f"partial_rotary_factor {partial} (rotary dimension {rotary_dim} must be "
            "even, >= 2)"
        )
    scale = head_dim**-0.5
    if gemma:
        scale = float(c.query_pre_attn_scalar) ** -0.5
    fields = dict(
        family=family,
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        num_layers=c.num_hidden_layers,
        num_heads=c.num_attention_heads,
        num_kv_heads=c.num_key_value_heads or c.num_attention_heads,
        head_dim=head_dim,
        intermediate_size=c.intermediate_size,
        positions="rope",
        norm="rms",
        eps=float(c.rms_norm_eps),
        mlp="gated",
        activation=_activation(act),
        parallel_residual=False,
        tied_embeddings=_tied(model),
        qkv_bias=bias or family == "qwen2",  # Qwen2: q, k, v biases always
        out_bias=bias and family != "qwen2",  # ... and never one on o_proj
        mlp_bias=False,
        max_positions=c.max_position_embeddings,
        rotary_dim=rotary_dim,
        rope=_rope_parameters(c, rotary_dim, rope, nested=family == "gemma3"),
        scales=(scale,) * c.num_hidden_layers,
        sliding_window=window,
        layer_types=types,
    )
    if local:
        fields["local_rope"] = _rope_parameters(c, rotary_dim, local, nested=True)
    if family == "qwen3":
        fields["qk_norm"] = "head"
    if family == "olmo2":
        fields.update(qk_norm="projection", block_norms="post", rms_variant="torch")
    if gemma:
        fields.update(
            rms_variant="gemma",
            block_norms="sandwich",
            embedding_scale=c.hidden_size**0.5,
            attn_softcap=float(getattr(c, "attn_logit_softcapping", None) or 0.0),
            final_softcap=float(getattr(c, "final_logit_softcapping", None) or 0.0),
        )
    if family == "gemma3":
        fields["qk_norm"] = "head"
        if getattr(c, "attn_logit_softcapping", None) is not None:
            # Hugging Face 5.23's Gemma3Attention stores it and never applies it
            raise _unsupported(
                f"attn_logit_softcapping={c.attn_logit_softcapping} in a Gemma 3 model "
                "(Hugging Face's Gemma3Attention does not apply it)"
            )
    return fields


_SPECS = {
    "llama": _spec_llama,
    "gpt2": _spec_gpt2,
    "gpt_neox": _spec_gpt_neox,
    "bloom": _spec_bloom,
}
SLIDING = ("mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3")
"""The families whose sliding windows a copy follows (the others refuse them)."""


LAYERS = {  # family -> where its list of decoder layers is
    "llama": "model.layers",
    "gpt2": "transformer.h",
    "gpt_neox": "gpt_neox.layers",
    "bloom": "transformer.h",
    **{f: "model.layers" for f in ARCHITECTURES.values() if f not in _SPECS},
}


def spec_fields(model: nn.Module, family: str) -> dict[str, Any]:
    """The :class:`~companion.decoder.DecoderSpec` fields of ``model`` (one of
    :data:`ARCHITECTURES`' families), after checking what every family shares."""
    _check_common(model.config, sliding=family in SLIDING)
    if family in _SPECS:
        return _SPECS[family](model)
    return _spec_modern(model, family)


# ---- copying the weights -------------------------------------------------------------


def _copy(
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


def _split_fused(weight: Tensor, bias: Tensor | None, heads: int) -> list:
    """GPT-NeoX's and BLOOM's fused ``query_key_value``: rows ``(H, 3, D)`` per head."""
    e = weight.shape[1]
    w = weight.view(heads, 3, -1, e)  # (H, q/k/v, D, E)
    b = None if bias is None else bias.view(heads, 3, -1)
    return [
        (w[:, j].reshape(-1, e), None if b is None else b[:, j].reshape(-1))
        for j in range(3)
    ]


def _output(dst: Decoder, model: nn.Module) -> None:
    """The output matrix, unless it is the (already copied) input embedding."""
    if not dst.spec.tied_embeddings:
        dst.lm_head.weight.copy_(model.get_output_embeddings().weight)


def load_llama(dst: Decoder, model: nn.Module) -> None:
    """Llama's weights and those of the families built like it (Mistral, Qwen2/3,
    OLMo 2, Gemma 2/3, Phi-3): every projection copies as it is (``nn.Linear`` both
    sides), Phi-3's fused ``qkv_proj`` and ``gate_up_proj`` split by rows."""
    base, s = model.model, dst.spec
    _copy(dst.embed, base.embed_tokens.weight)
    _copy(dst.final_norm, base.norm.weight)
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
    q_rows, kv_rows = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
    for block, layer in zip(dst.blocks, base.layers, strict=True):
        a, m = layer.self_attn, layer.mlp
        for ours, theirs in norms.items():
            _copy(getattr(block, ours), getattr(layer, theirs).weight)
        if block.q_norm is not None:
            _copy(block.q_norm, a.q_norm.weight)
            _copy(block.k_norm, a.k_norm.weight)
        if hasattr(a, "qkv_proj"):  # Phi-3: rows [q | k | v]
            w, b = a.qkv_proj.weight, a.qkv_proj.bias
            cuts = (0, q_rows, q_rows + kv_rows, q_rows + 2 * kv_rows)
            for j, name in enumerate(("q_proj", "k_proj", "v_proj")):
                sl = slice(cuts[j], cuts[j + 1])
                _copy(getattr(block, name), w[sl], None if b is None else b[sl])
            _copy(block.o_proj, a.o_proj.weight, a.o_proj.bias)
        else:
            for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                proj = getattr(a, name)
                _copy(getattr(block, name), proj.weight, proj.bias)
        if hasattr(m, "gate_up_proj"):  # Phi-3: rows [gate | up]
            gate, up = m.gate_up_proj.weight.chunk(2, dim=0)
            _copy(block.gate_proj, gate)
            _copy(block.up_proj, up)
            _copy(block.down_proj, m.down_proj.weight, m.down_proj.bias)
        else:
            for name in ("gate_proj", "up_proj", "down_proj"):
                proj = getattr(m, name)
                _copy(getattr(block, name), proj.weight, proj.bias)
    _output(dst, model)


def load_gpt2(dst: Decoder, model: nn.Module) -> None:
    """GPT-2's weights: every ``Conv1D`` transposed, ``c_attn`` split by columns."""
    base = model.transformer
    dst.embed.weight.copy_(base.wte.weight)
    dst.position_embed.weight.copy_(base.wpe.weight)
    _copy(dst.final_norm, base.ln_f.weight, base.ln_f.bias)
    e = dst.spec.hidden_size
    for block, layer in zip(dst.blocks, base.h, strict=True):
        _copy(block.norm1, layer.ln_1.weight, layer.ln_1.bias)
        _copy(block.norm2, layer.ln_2.weight, layer.ln_2.bias)
        # Conv1D stores W as (in, out), x @ W + b: the transpose of Linear's weight
        w, b = layer.attn.c_attn.weight, layer.attn.c_attn.bias  # (E, 3E), (3E,)
        for j, name in enumerate(("q_proj", "k_proj", "v_proj")):
            sl = slice(j * e, (j + 1) * e)
            _copy(getattr(block, name), w[:, sl].t(), b[sl])
        _copy(block.o_proj, layer.attn.c_proj.weight.t(), layer.attn.c_proj.bias)
        _copy(block.up_proj, layer.mlp.c_fc.weight.t(), layer.mlp.c_fc.bias)
        _copy(block.down_proj, layer.mlp.c_proj.weight.t(), layer.mlp.c_proj.bias)
    _output(dst, model)


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
        _copy(
            dst.embed_norm,
            base.word_embeddings_layernorm.weight,
            base.word_embeddings_layernorm.bias,
        )
        final, layers = base.ln_f, base.h
    _copy(dst.final_norm, final.weight, final.bias)
    for block, layer in zip(dst.blocks, layers, strict=True):
        a = layer.attention if s.family == "gpt_neox" else layer.self_attention
        _copy(block.norm1, layer.input_layernorm.weight, layer.input_layernorm.bias)
        _copy(
            block.norm2,
            layer.post_attention_layernorm.weight,
            layer.post_attention_layernorm.bias,
        )
        fused = _split_fused(
            a.query_key_value.weight, a.query_key_value.bias, s.num_heads
        )
        for (w, b), name in zip(fused, ("q_proj", "k_proj", "v_proj"), strict=True):
            _copy(getattr(block, name), w, b)
        _copy(block.o_proj, a.dense.weight, a.dense.bias)
        _copy(
            block.up_proj, layer.mlp.dense_h_to_4h.weight, layer.mlp.dense_h_to_4h.bias
        )
        _copy(
            block.down_proj,
            layer.mlp.dense_4h_to_h.weight,
            layer.mlp.dense_4h_to_h.bias,
        )
    _output(dst, model)


LOADERS = {
    "llama": load_llama,
    "gpt2": load_gpt2,
    "gpt_neox": load_fused,
    "bloom": load_fused,
    **{f: load_llama for f in ARCHITECTURES.values() if f not in _SPECS},
}
