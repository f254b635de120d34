r"""Real decoders rebuilt from the book's parts (chapter :ref:`ch-real-models`).

:func:`from_hf` takes a Hugging Face causal language model of one of four families and
returns a :class:`Decoder` that computes the same logits with ``companion``'s parts
only:

=========  ============================  =========  ==============  ===========
family     positions                     norm       MLP             residual
=========  ============================  =========  ==============  ===========
Llama      RoPE (half layout), with any  RMSNorm    gated (SwiGLU)  serial
           scaling type of chapter 3
GPT-2      learned absolute table        LayerNorm  GELU (tanh)     serial
GPT-NeoX   RoPE on the first             LayerNorm  GELU            parallel or
           ``rotary_ndims`` of a head                               serial
BLOOM      ALiBi                         LayerNorm  GELU (tanh)     serial
=========  ============================  =========  ==============  ===========

Every block is pre-norm; attention is
:func:`companion.attention.scaled_dot_product_attention`, with grouped-query and
multi-query attention (fewer key/value heads than query heads) done by stacking the
query heads that share a key/value head along the query axis, not by copying keys; RoPE
is :func:`companion.rope.apply_rope` on the table of
:func:`companion.rope.rope_cos_sin` with the frequencies of
:func:`companion.rope.rope_frequencies` or of :mod:`companion.extension` (linear,
dynamic NTK, YaRN, Llama 3); ALiBi is :func:`companion.extension.alibi_bias`; the norms
are :class:`companion.norm.RMSNorm` and :class:`companion.norm.LayerNorm`.

:func:`generate` decodes greedily with a KV cache: each layer keeps its keys *after*
rotation and its values, and each new token is one query at the next position. The cache
is a value (a tuple of per-layer ``(key, value)`` pairs) that :meth:`Decoder.decode`
takes and returns.

What the copy does not implement raises :class:`ValueError` naming it: other
architectures, sliding-window attention, RoPE types other than the five above
(``longrope``, ...), padding (an ``attention_mask`` with zeros), cross-attention.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from companion import _validate
from companion.attention import causal_mask, scaled_dot_product_attention
from companion.extension import (
    alibi_bias,
    dynamic_ntk_frequencies,
    linear_scaling_frequencies,
    llama3_frequencies,
    yarn_frequencies,
)
from companion.norm import LayerNorm, RMSNorm
from companion.rope import apply_rope, rope_cos_sin, rope_frequencies

__all__ = ["Decoder", "DecoderBlock", "DecoderSpec", "from_hf", "generate"]

ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "GPT2LMHeadModel": "gpt2",
    "GPTNeoXForCausalLM": "gpt_neox",
    "BloomForCausalLM": "bloom",
}
"""The Hugging Face classes :func:`from_hf` copies, and the family name each gets."""

ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3")
"""The RoPE scaling types (``rope_parameters["rope_type"]``) a copy follows."""

# Hugging Face activation names -> the same function in torch
_ACTIVATIONS = {
    "silu": F.silu,
    "swish": F.silu,
    "relu": F.relu,
    "gelu": F.gelu,  # the exact (erf) GELU
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),  # GPT-2's tanh approximation
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_fast": lambda x: F.gelu(x, approximate="tanh"),
    "bloom_gelu": lambda x: F.gelu(x, approximate="tanh"),  # BLOOM's BloomGelu
}


# ---- what a copy is made of ----------------------------------------------------------


@dataclass(frozen=True)
class DecoderSpec:
    """Everything that tells the four families apart, read from a Hugging Face config.

    A record: :func:`from_hf` fills it in from ``model.config`` after checking that the
    copy implements every option; the chapter prints the four families' specs side by
    side. ``positions`` is ``"rope"``, ``"alibi"`` or ``"learned"``; ``norm`` is
    ``"rms"`` or ``"layer"``; ``mlp`` is ``"gated"`` (``act(x W_gate) * x W_up``) or
    ``"plain"``; ``rope`` holds Hugging Face's ``rope_parameters`` (``rope_type``,
    ``rope_theta``, ``factor``, ...); ``rotary_dim`` is how many leading coordinates of
    each head RoPE turns; ``scales`` is the score scale of each layer.
    """

    family: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    positions: str  # "rope", "alibi" or "learned"
    norm: str  # "rms" or "layer"
    eps: float
    mlp: str  # "gated" (act(x W_gate) * x W_up) or "plain" (act(x W_in))
    activation: str
    parallel_residual: bool  # x + attn(n1(x)) + mlp(n2(x)) instead of two serial steps
    residual_from_norm: bool = False  # BLOOM's apply_residual_connection_post_layernorm
    embedding_norm: bool = False  # BLOOM's LayerNorm right after the token embedding
    tied_embeddings: bool = False
    qkv_bias: bool = False
    out_bias: bool = False
    mlp_bias: bool = False
    max_positions: int = 0  # rows of the learned table (GPT-2), else the context length
    rotary_dim: int = 0  # leading coordinates of each head that RoPE turns
    rope: dict[str, Any] = field(
        default_factory=dict
    )  # rope_type, rope_theta, factor, ...
    scales: tuple[float, ...] = ()  # score scale per layer (GPT-2 may change it)


# ---- RoPE frequencies of every scaling type ------------------------------------------


def _rope_table(spec: DecoderSpec, positions: Tensor, seq_len: int, dtype: torch.dtype):
    """cos and sin ``(L, rotary_dim/2)`` at ``positions`` for the configured scaling.

    ``seq_len`` is the length the sequence has reached (the last position + 1): dynamic
    NTK recomputes its base from it, as Hugging Face's ``dynamic_rope_update`` does.
    """
    p = spec.rope
    kind, base, dim = p["rope_type"], float(p["rope_theta"]), spec.rotary_dim
    scale = 1.0  # YaRN's attention factor multiplies cos and sin
    if kind == "default":
        freqs = rope_frequencies(dim, base=base)
    elif kind == "linear":
        freqs = linear_scaling_frequencies(dim, base=base, factor=float(p["factor"]))
    elif kind == "dynamic":
        freqs = dynamic_ntk_frequencies(
            dim,
            base=base,
            factor=float(p["factor"]),
            original_max_position_embeddings=spec.max_positions,
            seq_len=seq_len,
        )
    elif kind == "yarn":
        freqs, scale = yarn_frequencies(
            dim,
            base=base,
            factor=float(p["factor"]),
            original_max_position_embeddings=int(p["original_max_position_embeddings"]),
            beta_fast=float(p.get("beta_fast") or 32),
            beta_slow=float(p.get("beta_slow") or 1),
            truncate=bool(p.get("truncate", True)),
            attention_factor=p.get("attention_factor"),
        )
    else:  # "llama3"
        freqs = llama3_frequencies(
            dim,
            base=base,
            factor=float(p["factor"]),
            low_freq_factor=float(p["low_freq_factor"]),
            high_freq_factor=float(p["high_freq_factor"]),
            original_max_position_embeddings=int(p["original_max_position_embeddings"]),
        )
    cos, sin = rope_cos_sin(positions, freqs, dtype=torch.float32)  # (L, rotary_dim/2)
    return (cos * scale).to(dtype), (sin * scale).to(dtype)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor, rotary_dim: int) -> Tensor:
    """RoPE (half layout) on the first ``rotary_dim`` coordinates of each head."""
    if rotary_dim == x.shape[-1]:
        return apply_rope(x, cos, sin)  # (B, H, L, D)
    turned = apply_rope(x[..., :rotary_dim], cos, sin)  # GPT-NeoX: partial rotary
    return torch.cat((turned, x[..., rotary_dim:]), dim=-1)  # (B, H, L, D)


# ---- the model -----------------------------------------------------------------------


class DecoderBlock(nn.Module):
    """One decoder layer: pre-norm attention and MLP, serial or parallel residual.

    Holds the parameters (separate ``q/k/v/o`` projections, the MLP's, two norms);
    :meth:`forward` is the math of the chapter's block in the open, for every family.

    Args:
        spec: the architecture.
        layer: the layer's index, ``0 .. num_layers - 1`` (GPT-2 may scale the scores of
            layer ``i`` by ``1 / (i + 1)``).

    Shape:
        x: ``(B, L, E)``; output: ``(B, L, E)`` and the layer's keys and values, each
        ``(B, Hkv, S, D)`` with ``S`` the cached plus the new tokens.
    """

    def __init__(self, spec: DecoderSpec, layer: int) -> None:
        super().__init__()
        _validate.instance("spec", spec, DecoderSpec, "a DecoderSpec (use from_hf)")
        layer = _validate.integer(
            "layer", layer, minimum=0, maximum=spec.num_layers - 1
        )
        e, h, kv, d = spec.hidden_size, spec.num_heads, spec.num_kv_heads, spec.head_dim
        norm = _norm_factory(spec)
        self.norm1 = norm()
        self.norm2 = norm()
        self.q_proj = nn.Linear(e, h * d, bias=spec.qkv_bias)
        self.k_proj = nn.Linear(e, kv * d, bias=spec.qkv_bias)
        self.v_proj = nn.Linear(e, kv * d, bias=spec.qkv_bias)
        self.o_proj = nn.Linear(h * d, e, bias=spec.out_bias)
        self.up_proj = nn.Linear(e, spec.intermediate_size, bias=spec.mlp_bias)
        self.gate_proj = (
            nn.Linear(e, spec.intermediate_size, bias=spec.mlp_bias)
            if spec.mlp == "gated"
            else None
        )
        self.down_proj = nn.Linear(spec.intermediate_size, e, bias=spec.mlp_bias)
        self.spec = spec
        self.scale = spec.scales[layer]

    def attention(
        self,
        x: Tensor,
        rope: tuple[Tensor, Tensor] | None,
        mask: Tensor | None,
        past: tuple[Tensor, Tensor] | None,
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """Attention of the normalized ``x`` ``(B, L, E)`` over the cache and itself."""
        s = self.spec
        B, L, _ = x.shape
        q = (
            self.q_proj(x).view(B, L, s.num_heads, s.head_dim).transpose(1, 2)
        )  # (B, H, L, D)
        k = self.k_proj(x).view(B, L, s.num_kv_heads, s.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, L, s.num_kv_heads, s.head_dim).transpose(1, 2)
        if rope is not None:  # rotate before caching: a cached key keeps its position
            q = _rotate(q, *rope, s.rotary_dim)
            k = _rotate(k, *rope, s.rotary_dim)  # (B, Hkv, L, D)
        if past is not None:
            k = torch.cat((past[0], k), dim=2)  # (B, Hkv, S, D)
            v = torch.cat((past[1], v), dim=2)
        # GQA/MQA: the G query heads that share a key/value head are stacked along the
        # query axis, so each key head is read once and never copied (HF's repeat_kv
        # copies it G times); heads are ordered so that head h uses key head h // G
        groups = s.num_heads // s.num_kv_heads
        q = q.reshape(B, s.num_kv_heads, groups * L, s.head_dim)  # (B, Hkv, G*L, D)
        if mask is not None and groups > 1:
            if mask.ndim == 3:  # ALiBi's bias per head (H, L, S)
                mask = mask.reshape(s.num_kv_heads, groups * L, -1)  # (Hkv, G*L, S)
            else:  # one causal mask (L, S) for each of the G stacked heads
                mask = mask.repeat(groups, 1)  # (G*L, S)
        out = scaled_dot_product_attention(q, k, v, mask=mask, scale=self.scale)
        out = out.view(B, s.num_heads, L, s.head_dim).transpose(1, 2)  # (B, L, H, D)
        return self.o_proj(out.reshape(B, L, -1)), (k, v)

    def mlp(self, x: Tensor) -> Tensor:
        """The position-wise MLP: gated (Llama) or plain (GPT-2, GPT-NeoX, BLOOM)."""
        act = _ACTIVATIONS[self.spec.activation]
        if self.gate_proj is not None:
            return self.down_proj(act(self.gate_proj(x)) * self.up_proj(x))  # SwiGLU
        return self.down_proj(act(self.up_proj(x)))

    def forward(
        self,
        x: Tensor,
        rope: tuple[Tensor, Tensor] | None,
        mask: Tensor | None,
        past: tuple[Tensor, Tensor] | None = None,
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """``x`` ``(B, L, E)`` -> ``(B, L, E)`` and this layer's keys and values."""
        h = self.norm1(x)
        attn, present = self.attention(h, rope, mask, past)
        if self.spec.parallel_residual:  # GPT-NeoX: both branches read x
            return x + attn + self.mlp(self.norm2(x)), present
        x = (h if self.spec.residual_from_norm else x) + attn
        h = self.norm2(x)
        return (h if self.spec.residual_from_norm else x) + self.mlp(h), present


def _norm_factory(spec: DecoderSpec):
    if spec.norm == "rms":  # Hugging Face's LlamaRMSNorm casts back before the gain
        return lambda: RMSNorm(spec.hidden_size, eps=spec.eps, variant="llama")
    return lambda: LayerNorm(spec.hidden_size, eps=spec.eps)


class Decoder(nn.Module):
    """A decoder-only language model assembled from ``companion``'s parts.

    Build it with :func:`from_hf`. Calling it on ``input_ids`` ``(B, L)`` returns logits
    ``(B, L, vocab)``; :meth:`decode` does the same with a KV cache.

    Args:
        spec: the architecture, as :func:`from_hf` reads it from a Hugging Face config.

    Shape:
        input_ids: ``(B, L)``, integer token ids.
        output: ``(B, L, V)`` logits, ``V`` the vocabulary size.
    """

    def __init__(self, spec: DecoderSpec) -> None:
        super().__init__()
        _validate.instance("spec", spec, DecoderSpec, "a DecoderSpec (use from_hf)")
        self.spec = spec
        self.embed = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.position_embed = (
            nn.Embedding(spec.max_positions, spec.hidden_size)
            if spec.positions == "learned"
            else None
        )
        self.embed_norm = _norm_factory(spec)() if spec.embedding_norm else None
        self.blocks = nn.ModuleList(
            DecoderBlock(spec, i) for i in range(spec.num_layers)
        )
        self.final_norm = _norm_factory(spec)()
        self.lm_head = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)
        if spec.tied_embeddings:
            self.lm_head.weight = self.embed.weight  # one matrix, read twice

    def _check_ids(self, ids: Tensor, past_length: int) -> Tensor:
        """Token ids inside the vocabulary, positions inside a learned table."""
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= self.spec.vocab_size:
            raise ValueError(
                f"input_ids must lie in [0, {self.spec.vocab_size}) (vocab_size), "
                f"got values in [{lo}, {hi}]"
            )
        total = past_length + ids.shape[1]
        if self.spec.positions == "learned" and total > self.spec.max_positions:
            raise ValueError(
                f"input_ids must hold at most {self.spec.max_positions - past_length} "
                f"tokens here: the learned position table has "
                f"{self.spec.max_positions} rows "
                f"(n_positions) and the sequence would reach {total}"
            )
        return ids

    def _check_past(self, past: object, ids: Tensor) -> int:
        if past is None:
            return 0
        n = self.spec.num_layers
        if not isinstance(past, tuple) or len(past) != n:
            raise TypeError(
                f"past must be None or a tuple of {n} (key, value) pairs (a cache from "
                f"decode), got {_validate.describe(past)}"
            )
        key = past[0][0]
        _validate.tensor("past[0][0]", key, ndim=4, meaning="(B, Hkv, S, D)")
        if key.shape[0] != ids.shape[0]:
            raise ValueError(
                f"past must hold the cache of a batch of {ids.shape[0]} "
                "(input_ids' B), "
                f"got keys of shape {tuple(key.shape)}"
            )
        return key.shape[2]

    def decode(
        self, input_ids: Tensor, past: tuple[tuple[Tensor, Tensor], ...] | None = None
    ) -> tuple[Tensor, tuple[tuple[Tensor, Tensor], ...]]:
        """Logits of ``input_ids`` placed after the ``past`` tokens, and the new cache.

        With ``past=None`` this is the prefill (positions ``0 .. L-1``); with a cache of
        ``S`` tokens, the new tokens sit at positions ``S .. S+L-1`` and attend to the
        cached keys and to each other (causally).

        Args:
            input_ids: the new token ids.
            past: ``None`` or the cache returned by the previous call.

        Returns:
            ``(logits, present)``: logits of the new tokens and the cache of all
            ``S + L`` tokens.

        Shape:
            input_ids: ``(B, L)``.
            past: per layer ``(key, value)``, each ``(B, Hkv, S, D)``.
            logits: ``(B, L, V)``.
        """
        ids = _check_input_ids(input_ids)
        past_length = self._check_past(past, ids)
        self._check_ids(ids, past_length)
        s = self.spec
        L = ids.shape[1]
        S = past_length + L  # keys after this call
        positions = torch.arange(past_length, S, device=ids.device)  # (L,)
        x = self.embed(ids)  # (B, L, E)
        if self.position_embed is not None:
            x = x + self.position_embed(positions)  # GPT-2: a learned row per position
        if self.embed_norm is not None:
            x = self.embed_norm(x)  # BLOOM
        rope, mask = None, None
        if s.positions == "rope":
            rope = _rope_table(s, positions, S, x.dtype)
        if s.positions == "alibi":  # -m_h (i - j), -inf after the query: (H, L, S)
            mask = alibi_bias(s.num_heads, L, S, dtype=x.dtype, device=x.device)
        elif L > 1:  # query i at position S - L + i sees keys j <= S - L + i: (L, S)
            mask = causal_mask(L, S, alignment="bottom_right", device=x.device)
        present = []
        for i, block in enumerate(self.blocks):
            x, kv = block(x, rope, mask, None if past is None else past[i])
            present.append(kv)
        logits = self.lm_head(self.final_norm(x))  # (B, L, V)
        return logits, tuple(present)

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor | None = None
    ) -> Tensor:
        """Logits ``(B, L, V)`` of ``input_ids`` ``(B, L)`` (no cache).

        Args:
            input_ids: token ids.
            attention_mask: ``None`` or all ones (Hugging Face's name); padding
                (zeros) is not implemented and raises ``ValueError``.
        """
        _check_attention_mask(attention_mask, _check_input_ids(input_ids))
        return self.decode(input_ids)[0]


def _check_input_ids(input_ids: object) -> Tensor:
    return _validate.tensor(
        "input_ids", input_ids, dtype="integer", ndim=2, nonempty=True, meaning="(B, L)"
    )


def _check_attention_mask(attention_mask: object, input_ids: object) -> None:
    if attention_mask is None:
        return
    mask = _validate.tensor("attention_mask", attention_mask, dtype=None, ndim=2)
    if isinstance(input_ids, Tensor) and mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask must have input_ids' shape {tuple(input_ids.shape)}, "
            f"got shape {tuple(mask.shape)}"
        )
    if not bool((mask == 1).all()):
        raise ValueError(
            "attention_mask with padding (zeros) is not implemented: the copy attends "
            "to every earlier token; pass unpadded sequences of equal length (all-ones "
            "mask or None)"
        )


# ---- copying a Hugging Face model ----------------------------------------------------


def _unsupported(what: str) -> ValueError:
    return ValueError(f"{what} is not supported by companion.decoder.from_hf")


def _rope_parameters(config: Any, rotary_dim: int) -> dict[str, Any]:
    params = dict(getattr(config, "rope_parameters", None) or {})
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
    if rotary_dim < 4 and kind == "dynamic":
        raise _unsupported(f"dynamic NTK with rotary_dim {rotary_dim} (needs >= 4)")
    return params


def _check_common(config: Any) -> None:
    if getattr(config, "sliding_window", None) is not None:
        raise _unsupported(
            f"sliding-window attention (sliding_window={config.sliding_window})"
        )
    layer_types = getattr(config, "layer_types", None)
    if layer_types and any(t != "full_attention" for t in layer_types):
        raise _unsupported(f"layer_types {sorted(set(layer_types))}")
    if getattr(config, "add_cross_attention", False):
        raise _unsupported("cross-attention (add_cross_attention=True)")
    if getattr(config, "is_encoder_decoder", False):
        raise _unsupported("an encoder-decoder model")


def _activation(name: object) -> str:
    if not isinstance(name, str) or name not in _ACTIVATIONS:
        raise _unsupported(
            f"activation {name!r} (supported: {', '.join(_ACTIVATIONS)})"
        )
    return name


def _tied(model: nn.Module) -> bool:
    return model.get_output_embeddings().weight is model.get_input_embeddings().weight


def _spec_llama(model: nn.Module) -> DecoderSpec:
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    params = _rope_parameters(c, head_dim)
    if float(params.get("partial_rotary_factor", 1.0)) != 1.0:
        raise _unsupported(
            f"partial_rotary_factor {params['partial_rotary_factor']} in a Llama model"
        )
    kv = c.num_key_value_heads or c.num_attention_heads
    return DecoderSpec(
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
        qkv_bias=bool(c.attention_bias),
        out_bias=bool(c.attention_bias),
        mlp_bias=bool(getattr(c, "mlp_bias", False)),
        max_positions=c.max_position_embeddings,
        rotary_dim=head_dim,
        rope=params,
        scales=(head_dim**-0.5,) * c.num_hidden_layers,
    )


def _spec_gpt2(model: nn.Module) -> DecoderSpec:
    c = model.config
    head_dim = c.n_embd // c.n_head
    scale = head_dim**-0.5 if c.scale_attn_weights else 1.0
    inverse = bool(c.scale_attn_by_inverse_layer_idx)
    return DecoderSpec(
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


def _spec_gpt_neox(model: nn.Module) -> DecoderSpec:
    c = model.config
    head_dim = c.hidden_size // c.num_attention_heads
    partial = float((c.rope_parameters or {}).get("partial_rotary_factor", 1.0))
    rotary_dim = int(head_dim * partial)  # HF's rotary_ndims
    if rotary_dim < 2 or rotary_dim % 2:
        raise _unsupported(
            f"partial_rotary_factor {partial} (rotary_ndims {rotary_dim} must be "
            "even, >= 2)"
        )
    return DecoderSpec(
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


def _spec_bloom(model: nn.Module) -> DecoderSpec:
    c = model.config
    head_dim = c.hidden_size // c.n_head
    return DecoderSpec(
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


def _copy(
    dst: nn.Linear | nn.Module, weight: Tensor, bias: Tensor | None = None
) -> None:
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


def _load_weights(dst: Decoder, model: nn.Module, family: str) -> None:
    s = dst.spec
    if family == "llama":
        base = model.model
        dst.embed.weight.copy_(base.embed_tokens.weight)
        dst.final_norm.weight.copy_(base.norm.weight)
        for block, layer in zip(dst.blocks, base.layers, strict=True):
            a, m = layer.self_attn, layer.mlp
            block.norm1.weight.copy_(layer.input_layernorm.weight)
            block.norm2.weight.copy_(layer.post_attention_layernorm.weight)
            for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                _copy(
                    getattr(block, name), getattr(a, name).weight, getattr(a, name).bias
                )
            for name in ("gate_proj", "up_proj", "down_proj"):
                _copy(
                    getattr(block, name), getattr(m, name).weight, getattr(m, name).bias
                )
    elif family == "gpt2":
        base = model.transformer
        dst.embed.weight.copy_(base.wte.weight)
        dst.position_embed.weight.copy_(base.wpe.weight)
        _copy(dst.final_norm, base.ln_f.weight, base.ln_f.bias)
        e = s.hidden_size
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
    else:  # gpt_neox and bloom: a fused query_key_value, head by head
        if family == "gpt_neox":
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
            a = layer.attention if family == "gpt_neox" else layer.self_attention
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
                block.up_proj,
                layer.mlp.dense_h_to_4h.weight,
                layer.mlp.dense_h_to_4h.bias,
            )
            _copy(
                block.down_proj,
                layer.mlp.dense_4h_to_h.weight,
                layer.mlp.dense_4h_to_h.bias,
            )
    if not s.tied_embeddings:
        dst.lm_head.weight.copy_(model.get_output_embeddings().weight)


_SPECS = {
    "llama": _spec_llama,
    "gpt2": _spec_gpt2,
    "gpt_neox": _spec_gpt_neox,
    "bloom": _spec_bloom,
}


@torch.no_grad()
def from_hf(model: nn.Module) -> Decoder:
    r"""Copy a Hugging Face causal LM into a :class:`Decoder` of ``companion``'s parts.

    Reads the architecture from ``model.config`` (:class:`DecoderSpec`), builds the copy
    and copies every weight, with the conversions each family needs:

    * GPT-2's ``Conv1D`` stores :math:`W` as ``(in, out)`` (``x @ W + b``): transposed
      into :class:`torch.nn.Linear`'s ``(out, in)``; its ``c_attn`` columns split into
      :math:`W_Q, W_K, W_V`.
    * GPT-NeoX and BLOOM fuse the three projections in ``query_key_value`` *head by
      head*: rows ``(H, 3, D)``, so head ``h``'s query is rows
      ``3hD .. 3hD + D - 1``, not the first third.
    * Llama's projections copy as they are. Hugging Face's checkpoints already hold the
      half layout of RoPE (``rotate_half``); Meta's original weights are interleaved and
      are permuted on conversion
      (:func:`companion.rope.interleaved_to_half_permutation`).
    * Tied input/output embeddings stay one shared parameter.

    The result is in evaluation form (no dropout), on ``model``'s device and in its
    dtype.

    Args:
        model: a ``LlamaForCausalLM``, ``GPT2LMHeadModel``, ``GPTNeoXForCausalLM`` or
            ``BloomForCausalLM``.

    Returns:
        The copy; ``copy(input_ids)`` gives logits ``(B, L, vocab)`` equal to
        ``model(input_ids).logits`` up to float rounding.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.
        ValueError: another architecture, or a configuration this copy does not
            implement (sliding-window attention, a RoPE type other than ``default``,
            ``linear``, ``dynamic``, ``yarn``, ``llama3``; cross-attention; an unknown
            activation).
    """
    _validate.module("model", model)
    names = [cls.__name__ for cls in type(model).__mro__]
    family = next((ARCHITECTURES[n] for n in names if n in ARCHITECTURES), None)
    if family is None:
        raise ValueError(
            f"model must be one of {', '.join(ARCHITECTURES)}, got "
            f"{type(model).__name__} (unsupported architecture)"
        )
    _check_common(model.config)
    spec = _SPECS[family](model)
    weight = model.get_input_embeddings().weight
    copy = Decoder(spec).to(device=weight.device, dtype=weight.dtype)
    _load_weights(copy, model, family)
    return copy.eval()


# ---- greedy decoding -----------------------------------------------------------------


@torch.no_grad()
def generate(
    model: Decoder,
    input_ids: Tensor,
    max_new_tokens: int,
    *,
    use_cache: bool = True,
    attention_mask: Tensor | None = None,
) -> Tensor:
    r"""Greedy decoding: append the most likely next token ``max_new_tokens`` times.

    With ``use_cache=True`` (the default) the prompt is run once (the prefill) and each
    new token is then one query at the next position against the cached keys and values
    of every layer: keys are cached *after* RoPE, so a cached key never changes and the
    new token only has to rotate its own query and key. With ``use_cache=False`` the
    whole sequence is run again for every token (the same tokens for every position
    scheme except dynamic NTK, whose frequencies depend on the length: there the cache
    keeps keys rotated with earlier frequencies, exactly as Hugging Face's cache does).

    Same tokens as Hugging Face's ``model.generate(input_ids, max_new_tokens=n,
    do_sample=False)`` when that does not stop early (``eos_token_id=None``): ties go to
    the lowest token id (``argmax``) in both.

    Args:
        model: a :class:`Decoder` from :func:`from_hf`.
        input_ids: the prompts, all of the same length (no padding).
        max_new_tokens: how many tokens to add; 0 returns the prompt.
        use_cache: keep keys and values between steps (``False``: recompute everything).
        attention_mask: ``None`` or all ones; padding is not implemented
            (``ValueError``).

    Returns:
        The prompt followed by the new tokens, ``int64``.

    Shape:
        input_ids: ``(B, L)``.
        output: ``(B, L + max_new_tokens)``.
    """
    _validate.instance("model", model, Decoder, "a Decoder (from from_hf)")
    n = _validate.nonnegative_int("max_new_tokens", max_new_tokens)
    use_cache = _validate.flag("use_cache", use_cache)
    ids = model._check_ids(_check_input_ids(input_ids), 0)
    _check_attention_mask(attention_mask, ids)
    spec = model.spec
    if spec.positions == "learned" and ids.shape[1] + n > spec.max_positions:
        raise ValueError(
            f"max_new_tokens must be at most {spec.max_positions - ids.shape[1]} here: "
            f"the learned position table has {spec.max_positions} rows (n_positions), "
            f"got {n}"
        )
    out = ids.long()
    if n == 0:
        return out
    if not use_cache:
        for _ in range(n):
            nxt = model.decode(out)[0][:, -1].argmax(dim=-1, keepdim=True)  # (B, 1)
            out = torch.cat((out, nxt), dim=1)
        return out
    logits, past = model.decode(out)  # prefill: the whole prompt once
    for step in range(n):
        nxt = logits[:, -1].argmax(dim=-1, keepdim=True)  # (B, 1)
        out = torch.cat((out, nxt), dim=1)
        if step + 1 < n:
            logits, past = model.decode(nxt, past)  # one query at the next position
    return out
