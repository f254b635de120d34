r"""Gemma 4's text model, built on :mod:`companion.decoder` (the chapter on the attention
layer of 2025-2026).

Gemma 4 keeps Gemma 3's block (:mod:`companion.families`' ``spec_gemma3``: sandwich
norms, QK-norm per head, embeddings times :math:`\sqrt{E}`, five sliding layers per full
one, a RoPE set per layer type) and changes it in five places, each read from Hugging
Face's ``Gemma4TextConfig``:

* **Proportional RoPE** in the full layers (``rope_type="proportional"``): p-RoPE over
  the whole head, :func:`companion.rope_variants.p_rope_frequencies`, the number of
  turning pairs :math:`\lfloor pD/2 \rfloor` as Hugging Face floors it.
* **Values normed per head** by an RMSNorm without gain (``HeadNormedValues``,
  Hugging Face's ``v_norm``), the gain-only RMSNorm elsewhere (``rms_variant="torch"``)
  and a score scale of 1 (the QK-norm sets the scores' size).
* **Keys as values** (``attention_k_eq_v``): in the full layers the value is the key
  projection's output, before the key norm and RoPE; those layers have no ``v_proj``.
  The full layers may be wider, with fewer key/value heads (``global_head_dim``,
  ``num_global_key_value_heads``): each block is built from its layer's spec
  (:meth:`Gemma4Spec.layer_spec`).
* **Shared keys and values** (``num_kv_shared_layers``): the last :math:`N` layers have
  no key or value projection and keep no cache; each attends with the keys and values
  that the last earlier layer of its kind (sliding or full, Hugging Face's ``store``
  layer) attended to in the same call, its cache's and the new tokens'
  (:meth:`Gemma4Block.attention`; :class:`Gemma4Decoder` hands them on as Hugging Face's
  ``shared_kv_states``). Where ``use_double_wide_mlp``, those layers' MLP is twice as
  wide.
* **A scalar per layer** multiplies the block's output (Hugging Face's
  ``layer_scalar`` buffer).

Refused by name (``spec_gemma4``): per-layer inputs
(``hidden_size_per_layer_input``), a mixture of experts, bidirectional attention.
Tested against Hugging Face in ``tests/test_gemma4.py``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from companion import _validate
from companion._architecture import Decoder, DecoderBlock
from companion._spec import DecoderSpec
from companion.families import (
    Port,
    base_fields,
    copy_linear,
    copy_norm,
    copy_output,
    copy_weight,
    rope_parameters,
    unsupported,
)

__all__ = ["PORTS", "Gemma4Block", "Gemma4Decoder", "Gemma4Spec"]


@dataclass(frozen=True)
class Gemma4Spec(DecoderSpec):
    r"""A :class:`~companion.decoder.DecoderSpec` with Gemma 4's new fields.

    Every layer's values pass an RMSNorm with no gain over each head (Hugging Face's
    ``v_norm``); ``rms_variant`` is ``"torch"`` (the gain itself, not Gemma 2/3's
    ``1 + w``) and the score scale is 1 (the QK-norm sets the scores' size).

    Args:
        kv_from_keys: the layers whose values are their key projection (Hugging Face's
            ``attention_k_eq_v``: the full layers), taken before the key norm and RoPE,
            so the layer has no ``v_proj``; increasing layer indices.
        global_head_dim: the head width of the full layers (Hugging Face's
            ``global_head_dim``, RoPE over all of it); 0: ``head_dim``.
        global_kv_heads: the key/value heads of the full layers (Hugging Face's
            ``num_global_key_value_heads``); 0: ``num_kv_heads``.
        kv_shared_layers: how many of the last layers compute no keys and values of
            their own (Hugging Face's ``num_kv_shared_layers``): each reuses, in the
            same call, the keys and values of the last earlier layer of its type
            (sliding or full) that computes its own, the cache included, and keeps no
            cache. Every layer type must occur before them. 0: none.
        double_wide_mlp: the reusing layers' MLP is twice as wide (Hugging Face's
            ``use_double_wide_mlp``).
    """

    kv_from_keys: tuple[int, ...] = ()
    global_head_dim: int = 0
    global_kv_heads: int = 0
    kv_shared_layers: int = 0
    double_wide_mlp: bool = False

    def layer_spec(self, layer: int) -> Gemma4Spec:
        """The spec layer ``layer`` is built from: a full layer's with its own head
        width and key/value heads (RoPE over the whole head), a reusing layer's MLP
        twice as wide where ``double_wide_mlp``, otherwise the spec as is."""
        changes: dict[str, object] = {}
        if self.double_wide_mlp and self.kv_sharing(layer) == "reuse":
            changes["intermediate_size"] = 2 * self.intermediate_size
        if self.layer_types[layer] == "full_attention":
            d = self.global_head_dim or self.head_dim
            changes.update(
                head_dim=d,
                rotary_dim=d if self.rotary_dim == self.head_dim else self.rotary_dim,
                num_kv_heads=self.global_kv_heads or self.num_kv_heads,
            )
        return dataclasses.replace(self, **changes) if changes else self

    def kv_sharing(self, layer: int) -> str | None:
        """``"reuse"`` for the last ``kv_shared_layers`` layers; ``"store"`` for the
        last layer of each type before them (the one whose keys and values they
        reuse); ``None`` for the others (Hugging Face's ``kv_sharing_modes``)."""
        first = self.num_layers - self.kv_shared_layers
        if layer >= first:
            return "reuse"
        kind = self.layer_types[layer]
        if self.kv_shared_layers and kind not in self.layer_types[layer + 1 : first]:
            return "store"
        return None

    def __post_init__(self) -> None:
        super().__post_init__()
        v, n = _validate, self.num_layers
        for key in ("global_head_dim", "global_kv_heads"):
            object.__setattr__(self, key, v.nonnegative_int(key, getattr(self, key)))
        if self.global_head_dim % 2:
            raise ValueError(
                f"global_head_dim must be even (RoPE's pairs), got {self.global_head_dim}"
            )
        if self.global_kv_heads:
            v.divisor(
                "global_kv_heads", self.global_kv_heads, "num_heads", self.num_heads
            )
        layers = v.layer_indices("kv_from_keys", self.kv_from_keys, n)
        object.__setattr__(self, "kv_from_keys", layers)
        shared = v.integer(
            "kv_shared_layers", self.kv_shared_layers, minimum=0, maximum=n - 1
        )
        object.__setattr__(self, "kv_shared_layers", shared)
        object.__setattr__(
            self, "double_wide_mlp", v.flag("double_wide_mlp", self.double_wide_mlp)
        )
        before = set(self.layer_types[: n - shared])
        if shared and before != set(self.layer_types):
            missing = sorted(set(self.layer_types) - before)
            raise ValueError(
                f"kv_shared_layers must leave a layer of every type before the shared "
                f"ones (each reuses the last earlier layer of its type), got "
                f"{shared} of {n} layers: no {', '.join(missing)} layer before them"
            )


class HeadNormedValues(nn.Module):
    """Gemma 4's values: a projection, then an RMSNorm without gain over each head's
    ``D`` coordinates. ``source`` is the layer's own ``nn.Linear`` or, where keys
    are values, its ``k_proj`` (held, not copied: one weight).

    Shape: input ``(B, L, E)``; output ``(B, L, H_kv * D)``.
    """

    def __init__(self, source: nn.Linear, head_dim: int, eps: float) -> None:
        super().__init__()
        self.source, self.head_dim, self.eps = source, head_dim, eps

    def forward(self, x: Tensor) -> Tensor:
        from companion.norm import rms_norm  # the chapter's function

        v = self.source(x)
        heads = v.unflatten(-1, (-1, self.head_dim))  # (B, L, H_kv, D)
        return rms_norm(heads, self.head_dim, eps=self.eps).flatten(-2)


class Gemma4Block(DecoderBlock):
    """Gemma 3's block (:class:`~companion.decoder.DecoderBlock`, sandwich norms,
    QK-norm per head) with Gemma 4's values (``HeadNormedValues``; in the layers of
    ``kv_from_keys`` the key projection's output) and its output times the layer's
    scalar (Hugging Face's ``layer_scalar`` buffer, copied); built from its layer's
    spec (:meth:`Gemma4Spec.layer_spec`: a full layer's head width and key/value
    heads), whose ``rotary_dim`` the decoder's RoPE table of that layer type reads.

    Where the spec shares keys and values (``kv_shared_layers``), a reusing layer has
    no ``k_proj``, ``v_proj`` or ``k_norm`` (``None``): its :meth:`attention` reads
    the keys and values a storing layer of its type left in ``shared`` in the same
    call (:class:`Gemma4Decoder` passes the call's dict) and returns ``()`` as its
    cache; a storing layer attends as any layer does and leaves its keys and values,
    its cache's ones and this call's, in ``shared``."""

    def __init__(self, spec: DecoderSpec, layer: int) -> None:
        _validate.instance("spec", spec, Gemma4Spec, "a Gemma4Spec")
        _validate.integer("layer", layer, minimum=0, maximum=spec.num_layers - 1)
        super().__init__(spec.layer_spec(layer), layer)  # type: ignore[attr-defined]
        spec = self.spec  # the layer's
        self.sharing = spec.kv_sharing(layer)  # "reuse", "store" or None
        own = None if layer in spec.kv_from_keys else self.v_proj
        del self.v_proj
        if self.sharing == "reuse":  # no keys or values of its own
            del self.k_proj, self.k_norm
            self.k_proj = self.v_proj = self.k_norm = None
        else:
            self.v_proj = HeadNormedValues(own or self.k_proj, spec.head_dim, spec.eps)
        self.register_buffer("layer_scalar", torch.ones(1))

    def attention(self, x, rope, mask, past, shared=None):
        """The base's attention; a reusing layer attends with ``shared``'s keys and
        values of its type (no cache: ``()``), a storing layer leaves its own there."""
        if self.sharing is None:
            return super().attention(x, rope, mask, past)
        kind = self.spec.layer_types[self.layer]
        if not isinstance(shared, dict):
            raise TypeError(
                f"shared must be a dict, the call's keys and values of layers that "
                f"share them (layer {self.layer} {self.sharing}s them; build the model "
                f"with Gemma4Decoder, as from_hf does), got {_validate.describe(shared)}"
            )
        B, L, _ = x.shape
        if self.sharing == "reuse":
            k, v = shared[kind]  # (B, Hkv, K + L, D): the storing layer's
            present: tuple[Tensor, ...] = ()
        else:
            k, v, seen = self.extend(*self.keys_values(x, rope), past)
            shared[kind] = k, v
            present = self.present(k, v, seen)
        out = self.attend(self.queries(x, rope), k, v, mask)  # (B, L, H, D)
        return self.o_proj(out.reshape(B, L, -1)), present

    def check_past(self, past: object, batch: int) -> int | None:
        """The base's check; a reusing layer's cache must be ``()`` (``None``: it has
        seen no tokens of its own)."""
        if self.sharing != "reuse":
            return super().check_past(past, batch)
        if not (isinstance(past, tuple | list) and len(past) == 0):
            raise ValueError(
                f"past[{self.layer}] must be () (layer {self.layer} reuses an earlier "
                f"layer's keys and values and keeps no cache), got "
                f"{_validate.describe(past)}"
            )
        return None

    def forward(self, x, rope, mask, past=None, shared=None):
        """The base's, ``shared`` passed to :meth:`attention`, times the scalar."""
        if self.sharing is None:
            out, present = super().forward(x, rope, mask, past)
        else:
            out, present = super().forward(x, rope, mask, past, shared=shared)
        return out * self.layer_scalar.to(out.dtype), present


class Gemma4Decoder(Decoder):
    """Gemma 4's decoder: :class:`~companion.decoder.Decoder` whose one override,
    :meth:`layer`, hands each block the call's ``scratch`` dict, where the storing
    layers leave their keys and values for the reusing ones (Hugging Face's
    ``shared_kv_states``). A spec without ``kv_shared_layers`` runs as the base."""

    def __init__(
        self, spec: DecoderSpec, block: type[DecoderBlock] = Gemma4Block
    ) -> None:
        if not (isinstance(block, type) and issubclass(block, Gemma4Block)):
            raise TypeError(
                "block must be Gemma4Block or a subclass of it (the class), got "
                f"{_validate.describe(block)}"
            )
        super().__init__(spec, block)

    def layer(self, i, x, rope, mask, past, scratch):
        """Layer ``i`` with the call's shared keys and values."""
        return self.blocks[i](x, rope, mask, past, shared=scratch)


def spec_gemma4(model: nn.Module) -> dict[str, Any]:
    """Gemma 4 (text): Gemma 3's block (sandwich norms, QK-norm per head, scaled
    embeddings, a RoPE set per layer type: proportional, i.e. p-RoPE, in the full
    layers of the published configs) with the gain-only RMSNorm (``"torch"``), score
    scale 1, values normed per head and ``kv_from_keys`` from ``attention_k_eq_v``.
    The full layers' head width and key/value heads are read per layer
    (``global_head_dim``, ``num_global_key_value_heads``), and the layers that share
    another's keys and values (``kv_shared_layers``, ``double_wide_mlp``). Refused by
    name: per-layer inputs, a mixture of experts, bidirectional attention."""
    c = model.config
    refuse = {
        "hidden_size_per_layer_input": getattr(c, "hidden_size_per_layer_input", 0),
        "enable_moe_block": getattr(c, "enable_moe_block", False),
        "use_bidirectional_attention": getattr(c, "use_bidirectional_attention", None),
    }
    for key, value in refuse.items():
        if value:
            raise unsupported(f"{key}={value!r} in a Gemma 4 model")
    per_layer = {  # read per layer: Hugging Face refuses the global value if they differ
        kind: (
            c.per_layer_config[i].head_dim,
            c.per_layer_config[i].num_key_value_heads,
        )
        for i, kind in reversed(list(enumerate(c.layer_types)))
    }
    local_dims = per_layer.get("sliding_attention", per_layer["full_attention"])
    global_dims = per_layer.get("full_attention", local_dims)
    rope = getattr(c, "rope_parameters", None) or {}
    full, local = rope.get("full_attention"), rope.get("sliding_attention")
    fields = base_fields(
        model,
        "gemma4",
        sliding="layer_types",
        activation=c.hidden_activation,
        scales=(1.0,) * c.num_hidden_layers,
        rms_variant="torch",
        block_norms="sandwich",
        qk_norm="head",
        embedding_scale=c.hidden_size**0.5,
        final_softcap=float(getattr(c, "final_logit_softcapping", None) or 0.0),
        rope_params=full,
        nested=True,
        head_dim=local_dims[0],
        num_kv_heads=local_dims[1],
    )
    fields["global_head_dim"], fields["global_kv_heads"] = global_dims
    if local:
        fields["local_rope"] = rope_parameters(c, fields["rotary_dim"], local, True)
    full_layers = tuple(
        i for i, t in enumerate(fields["layer_types"]) if t == "full_attention"
    )
    fields["kv_from_keys"] = full_layers if c.attention_k_eq_v else ()
    fields["kv_shared_layers"] = getattr(c, "num_kv_shared_layers", 0) or 0
    fields["double_wide_mlp"] = bool(getattr(c, "use_double_wide_mlp", False))
    return fields


def load_gemma4(dst: Decoder, model: nn.Module) -> None:
    """Gemma 4's weights: Llama's names with the sandwich norms of Gemma 2/3, the
    QK-norms, no ``v_proj`` where keys are values, and each layer's ``layer_scalar``."""
    base = model.model
    copy_weight(dst.embed, base.embed_tokens.weight)
    copy_norm(dst.final_norm, base.norm)
    norms = {
        "norm1": "input_layernorm",
        "post_norm1": "post_attention_layernorm",
        "norm2": "pre_feedforward_layernorm",
        "post_norm2": "post_feedforward_layernorm",
    }
    for block, layer in zip(dst.blocks, base.layers, strict=True):
        a = layer.self_attn
        for ours, theirs in norms.items():
            copy_norm(getattr(block, ours), getattr(layer, theirs))
        copy_norm(block.q_norm, a.q_norm)
        copy_linear(block, a, ("q_proj", "o_proj"))
        if (block.k_proj is None) != bool(getattr(a, "is_kv_shared_layer", False)):
            raise ValueError(
                "model's weights must fit the spec: kv_shared_layers must name exactly "
                "the layers without keys and values of their own"
            )
        if block.k_proj is None:  # a reusing layer: queries only
            copy_linear(block, layer.mlp, ("gate_proj", "up_proj", "down_proj"))
            block.layer_scalar.copy_(layer.layer_scalar)
            continue
        copy_norm(block.k_norm, a.k_norm)
        copy_linear(block, a, ("k_proj",))
        if (a.v_proj is None) != (block.v_proj.source is block.k_proj):
            raise ValueError(
                "model's weights must fit the spec: kv_from_keys must name exactly "
                "the layers without v_proj (attention_k_eq_v's full layers)"
            )
        if a.v_proj is not None:
            copy_weight(block.v_proj.source, a.v_proj.weight, a.v_proj.bias)
        copy_linear(block, layer.mlp, ("gate_proj", "up_proj", "down_proj"))
        block.layer_scalar.copy_(layer.layer_scalar)
    copy_output(dst, model)


# ---- the registry --------------------------------------------------------------------


PORTS: dict[str, Port] = {
    "Gemma4ForCausalLM": Port(
        spec=spec_gemma4,
        load=load_gemma4,
        block=Gemma4Block,
        spec_type=Gemma4Spec,
        decoder=Gemma4Decoder,
    ),
}
"""The port :func:`~companion.decoder.from_hf` finds for ``Gemma4ForCausalLM`` (after
``companion.families.HYBRID_PORTS``): :class:`Gemma4Spec`, :class:`Gemma4Block` and
:class:`Gemma4Decoder`; what it refuses is listed in ``spec_gemma4``."""
