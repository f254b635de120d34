r"""The decoder every family of :mod:`companion.decoder` builds: its spec, its layer, the
model (chapter :ref:`ch-real-models`).

:class:`DecoderSpec` (in ``companion._spec``) is the record of what tells the families
apart, checked field by field; :class:`DecoderBlock` one layer, the chapter's block in
the open for every family; :class:`Decoder` the model, with its cache and masks. Nothing here knows Hugging Face:
:mod:`companion.families` reads its models into these classes and
:func:`companion.decoder.from_hf` is the entry point. Private: the documented names are
:mod:`companion.decoder`'s, which re-exports them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from companion import _validate
from companion._spec import ACTIVATIONS, DecoderSpec
from companion.attention import causal_mask, scaled_dot_product_attention
from companion.extension import (
    alibi_bias,
    alibi_slopes,
    dynamic_ntk_frequencies,
    linear_scaling_frequencies,
    llama3_frequencies,
    yarn_frequencies,
)
from companion.norm import LayerNorm, RMSNorm
from companion.rope import apply_rope, rope_cos_sin, rope_frequencies

__all__: list[str] = []  # private: companion.decoder documents and re-exports the names

# ---- RoPE frequencies of every scaling type ------------------------------------------


def _rope_table(
    spec: DecoderSpec,
    p: dict[str, Any],
    positions: Tensor,
    seq_len: int,
    dtype: torch.dtype,
):
    """cos and sin ``(..., rotary_dim/2)`` at ``positions`` for the RoPE parameters
    ``p`` (``spec.rope`` or ``spec.local_rope``).

    ``seq_len`` is the largest position + 1 (Hugging Face's ``max(position_ids) + 1``):
    dynamic NTK recomputes its base from it and LongRoPE takes its long factors once it
    passes ``original_max_position_embeddings``, as ``dynamic_rope_update`` does.
    """
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
    elif kind == "longrope":
        from companion.rope_variants import longrope_frequencies  # imports nothing here

        freqs, scale = longrope_frequencies(
            dim,
            base=base,
            short_factor=p["short_factor"],
            long_factor=p["long_factor"],
            factor=float(p["factor"]),
            original_max_position_embeddings=int(p["original_max_position_embeddings"]),
            seq_len=seq_len,
            attention_factor=p.get("attention_factor"),
        )
    elif kind == "proportional":  # Gemma 4: p-RoPE, floored pair count, / factor
        from companion.rope_variants import p_rope_frequencies  # imports nothing here

        p_keep = float(p.get("partial_rotary_factor", 1.0))
        freqs = p_rope_frequencies(dim, p_keep, base=base) / float(
            p.get("factor") or 1.0
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


def rotate_head(
    x: Tensor, cos: Tensor, sin: Tensor, rotary_dim: int, layout: str = "half"
) -> Tensor:
    """RoPE (``layout``'s pairs) on the first ``rotary_dim`` coordinates of a head."""
    if rotary_dim == x.shape[-1]:
        return apply_rope(x, cos, sin, layout=layout)  # (B, H, L, D)
    turned = apply_rope(x[..., :rotary_dim], cos, sin, layout=layout)  # GPT-NeoX
    return torch.cat((turned, x[..., rotary_dim:]), dim=-1)  # (B, H, L, D)


# ---- the model -----------------------------------------------------------------------


class DecoderBlock(nn.Module):
    """One decoder layer: attention and MLP with their norms and residuals.

    The norms sit before each sublayer (``block_norms="pre"``, with a serial or a
    parallel residual), after it (``"post"``, OLMo 2) or on both sides
    (``"sandwich"``, Gemma 2/3). Holds the parameters (separate ``q/k/v/o``
    projections, the MLP's, two or four norms, QK-norm gains where the spec has them);
    :meth:`forward` is the math of the chapter's block in the open, for every family.

    The interface :class:`Decoder` relies on (a subclass passed as
    ``Decoder(spec, block=...)`` or ``Port(block=...)`` keeps it, e.g. the multi-head
    latent attention of :mod:`companion.mla`):

    * ``block(spec, layer)`` builds layer ``layer`` of ``spec``;
    * ``forward(x, rope, mask, past) -> (y, present)`` and
      ``attention(x, rope, mask, past) -> (out, present)``: ``x`` ``(B, L, E)``
      (``attention`` gets it normalized), ``y``/``out`` ``(B, L, E)``;
    * ``mlp(x) -> y``, position-wise, ``(B, L, E)`` both;
    * ``check_past(past, batch) -> int``: validates this layer's cache as
      :meth:`Decoder.decode` receives it (``TypeError``/``ValueError`` naming
      ``past[layer]``) and returns how many tokens it has seen (``None``: a layer
      that keeps no cache, as Gemma 4's layers that reuse another's keys).

    ``rope`` is ``None`` (no RoPE) or ``(cos, sin)``, each ``(B, L, R/2)`` in ``x``'s
    dtype, ``R`` the spec's ``rotary_dim``: the table at each row's positions (rows of
    a left-padded batch have their own positions), as
    :func:`companion.rope.apply_rope` takes it.

    ``mask`` is always a tensor: an *additive* float mask of ``x``'s dtype, shape
    ``(B, 1, L, S)`` (one for all heads) or ``(B, H, L, S)`` (BLOOM: ALiBi's
    :math:`-a_h (m - n)` added per head, :math:`a_h` the head's slope, :math:`m` and
    :math:`n` the query's and the key's positions), where ``S`` is the number of keys this layer
    attends to, its cached keys followed by the ``L`` new ones. Entry ``[b, :, i, j]``
    is ``0`` (or the ALiBi bias) where query ``i`` of row ``b`` may see key ``j`` and
    ``-inf`` where it may not: a later key, a padding key (``attention_mask`` 0), or a
    key outside a sliding window. A query whose keys are all hidden (a padding query)
    gets zeros from the softmax, not NaN.

    ``past`` is ``None`` (nothing cached) or the tuple of tensors this block returned
    as ``present`` on the previous call; :class:`DecoderBlock` caches ``(key, value)``,
    each ``(B, H_kv, S, D)``, keys after RoPE, and in a sliding layer
    ``(key, value, seen)`` with only the last ``sliding_window - 1`` tokens.

    Args:
        spec: the architecture.
        layer: the layer's index, ``0 .. num_layers - 1`` (GPT-2 may scale the scores of
            layer ``i`` by ``1 / (i + 1)``).

    Shape:
        x: ``(B, L, E)``; output: ``(B, L, E)`` and the layer's cache: keys and values,
        each ``(B, Hkv, S, D)`` with ``S`` the cached plus the new tokens (a sliding
        layer: the last ``min(S, sliding_window - 1)`` of them, and ``seen``).
    """

    def __init__(self, spec: DecoderSpec, layer: int) -> None:
        super().__init__()
        _validate.instance("spec", spec, DecoderSpec, "a DecoderSpec (use from_hf)")
        layer = _validate.integer(
            "layer", layer, minimum=0, maximum=spec.num_layers - 1
        )
        e, h, kv, d = spec.hidden_size, spec.num_heads, spec.num_kv_heads, spec.head_dim
        norm = _norm_factory(spec)
        pre, post = spec.block_norms != "post", spec.block_norms != "pre"
        self.norm1 = norm() if pre else None  # before attention
        self.norm2 = norm() if pre and not spec.shared_norm else None  # before MLP
        self.post_norm1 = norm() if post else None  # after attention (OLMo 2, Gemma)
        self.post_norm2 = norm() if post else None  # after the MLP
        self.q_proj = nn.Linear(e, h * d, bias=spec.qkv_bias)
        self.k_proj = nn.Linear(e, kv * d, bias=spec.qkv_bias)
        self.v_proj = nn.Linear(e, kv * d, bias=spec.qkv_bias)
        self.o_proj = nn.Linear(h * d, e, bias=spec.out_bias)
        # QK-norm: over each head's D (Qwen3, Gemma 3) or the whole projection (OLMo 2)
        self.q_norm = self.k_norm = None
        if spec.qk_norm == "head":
            self.q_norm, self.k_norm = (
                _norm_factory(spec, d)(),
                _norm_factory(spec, d)(),
            )
        elif spec.qk_norm == "projection":
            self.q_norm = _norm_factory(spec, h * d)()
            self.k_norm = _norm_factory(spec, kv * d)()
        self.up_proj = nn.Linear(e, spec.intermediate_size, bias=spec.mlp_bias)
        self.gate_proj = (
            nn.Linear(e, spec.intermediate_size, bias=spec.mlp_bias)
            if spec.mlp == "gated"
            else None
        )
        self.down_proj = nn.Linear(spec.intermediate_size, e, bias=spec.mlp_bias)
        self.spec = spec
        self.layer = layer
        self.scale = spec.scales[layer]
        sliding = spec.layer_types[layer] == "sliding_attention"
        self.window = spec.sliding_window if sliding else 0  # 0: full attention
        self.rotates = layer not in spec.nope_layers  # False: a NoPE layer

    def attention(
        self,
        x: Tensor,
        rope: tuple[Tensor, Tensor] | None,
        mask: Tensor,
        past: tuple[Tensor, ...] | None,
    ) -> tuple[Tensor, tuple[Tensor, ...]]:
        """Attention of the normalized ``x`` ``(B, L, E)`` over the cache and itself.

        Returns the output ``(B, L, E)`` and the layer's new cache: ``(key, value)``
        for a full layer; ``(key, value, seen)`` for a sliding one, holding only the
        last ``sliding_window - 1`` keys and values and, in the 0-d int64 ``seen``, how
        many tokens the layer has seen. Five steps a subclass may override one by one:
        :meth:`queries`, :meth:`keys_values`, :meth:`extend` (the cache and the new
        keys), :meth:`attend` (the softmax) and :meth:`present` (what the cache keeps).
        """
        B, L, _ = x.shape
        k, v = self.keys_values(x, rope)
        k, v, seen = self.extend(k, v, past)
        out = self.attend(self.queries(x, rope), k, v, mask)  # (B, L, H, D)
        return self.o_proj(out.reshape(B, L, -1)), self.present(k, v, seen)

    def queries(self, x: Tensor, rope: tuple[Tensor, Tensor] | None) -> Tensor:
        """The new tokens' queries ``(B, H, L, D)``: projected, QK-normed, rotated."""
        s = self.spec
        B, L, _ = x.shape
        q = self.q_proj(x)
        if s.qk_norm == "projection":  # OLMo 2: over H*D, before the heads are split
            q = self.q_norm(q)
        q = q.view(B, L, s.num_heads, s.head_dim)
        if s.qk_norm == "head":  # Qwen3, Gemma 3: over each head's D
            q = self.q_norm(q)
        q = q.transpose(1, 2)  # (B, H, L, D)
        if rope is not None and self.rotates:
            q = rotate_head(q, *rope, s.rotary_dim, s.rope_layout)
        return q

    def keys_values(
        self, x: Tensor, rope: tuple[Tensor, Tensor] | None
    ) -> tuple[Tensor, Tensor]:
        """The new tokens' keys and values, each ``(B, H_kv, L, D)``: keys projected,
        QK-normed and rotated (before caching: a cached key keeps its position)."""
        s = self.spec
        B, L, _ = x.shape
        k, v = self.k_proj(x), self.v_proj(x)
        if s.qk_norm == "projection":  # OLMo 2
            k = self.k_norm(k)
        k = k.view(B, L, s.num_kv_heads, s.head_dim)
        if s.qk_norm == "head":
            k = self.k_norm(k)
        k = k.transpose(1, 2)  # (B, Hkv, L, D)
        v = v.view(B, L, s.num_kv_heads, s.head_dim).transpose(1, 2)
        if rope is not None and self.rotates:
            k = rotate_head(k, *rope, s.rotary_dim, s.rope_layout)
        return k, v

    def extend(
        self, k: Tensor, v: Tensor, past: tuple[Tensor, ...] | None
    ) -> tuple[Tensor, Tensor, int]:
        """The keys and values this call attends to, ``(B, H_kv, K + L, D)`` each: the
        ``K`` cached ones followed by the ``L`` new ones; and the tokens seen after
        this call."""
        seen = k.shape[2]
        if past is not None:
            seen += int(past[2]) if self.window else past[0].shape[2]
            k = torch.cat((past[0], k), dim=2)  # (B, Hkv, S, D)
            v = torch.cat((past[1], v), dim=2)
        return k, v, seen

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
        """Queries ``(B, H, L, D)`` on keys and values ``(B, H_kv, S, D)`` under the
        additive ``mask``: ``grouped_attention``, soft-capped where the spec says;
        ``(B, L, H, D)``."""
        return grouped_attention(q, k, v, mask, self.scale, self.spec.attn_softcap)

    def present(self, k: Tensor, v: Tensor, seen: int) -> tuple[Tensor, ...]:
        """The layer's new cache from the keys and values it attended to:
        ``(key, value)``, or in a sliding layer a rolling cache of the last
        ``sliding_window - 1`` (the keys the next query can still see) and ``seen``."""
        if not self.window:
            return k, v
        keep = min(self.window - 1, k.shape[2])
        k, v = k[:, :, k.shape[2] - keep :], v[:, :, v.shape[2] - keep :]
        return k, v, torch.tensor(seen, device=k.device)

    def check_past(self, past: object, batch: int) -> int:
        """This layer's cache checked; returns the tokens it has seen.

        A full layer's ``(key, value)``: each ``(batch, H_kv, S, D)`` with the spec's
        ``num_kv_heads`` and ``head_dim``, one ``S`` (the tokens seen), the block's
        dtype and device. A sliding layer's ``(key, value, seen)``: the same with
        ``S = min(seen, sliding_window - 1)`` and ``seen`` a 0-d integer tensor
        (``TypeError`` or ``ValueError`` naming ``past[layer][j]``).
        """
        v, s, i = _validate, self.spec, self.layer
        ref = self.q_proj.weight  # the model's dtype and device
        parts = ("key", "value", "seen") if self.window else ("key", "value")
        what = (
            ", ".join(parts[:-1]) + " and " + parts[-1]
            if self.window
            else ("key, value")
        )
        items = v.sequence(
            f"past[{i}]",
            past,
            length=len(parts),
            what=f"tensors ({what} of layer {i})",
        )
        for j, t in enumerate(items[:2]):
            name = f"past[{i}][{j}] ({parts[j]} of layer {i})"
            v.tensor(name, t, ndim=4, meaning="(B, H_kv, S, D)")
            v.same_dtype(name, t, "the model", ref)
            v.same_device(name, t, "the model", ref)
            v.size(name, t, 0, batch, "B, input_ids' batch")
            v.size(name, t, 1, s.num_kv_heads, "H_kv, num_kv_heads")
            v.size(name, t, 3, s.head_dim, "D, head_dim")
            v.size(name, t, 2, items[0].shape[2], f"S, past[{i}][0]'s length")
        if not self.window:
            return items[0].shape[2]
        name = f"past[{i}][2] (seen of layer {i}, a sliding layer)"
        seen = v.tensor(name, items[2], dtype="integer", ndim=0, meaning="()")
        seen = int(seen)
        kept = min(seen, self.window - 1)
        if items[0].shape[2] != kept:
            raise ValueError(
                f"past[{i}][0] (key of layer {i}, a sliding layer of window "
                f"{self.window}) must hold min(seen, window - 1) = {kept} keys for "
                f"seen = {seen}, got {items[0].shape[2]}"
            )
        return seen

    def mlp(self, x: Tensor) -> Tensor:
        """The position-wise MLP: gated (Llama) or plain (GPT-2, GPT-NeoX, BLOOM)."""
        act = ACTIVATIONS[self.spec.activation]
        if self.gate_proj is not None:
            return self.down_proj(act(self.gate_proj(x)) * self.up_proj(x))  # SwiGLU
        return self.down_proj(act(self.up_proj(x)))

    def forward(
        self,
        x: Tensor,
        rope: tuple[Tensor, Tensor] | None,
        mask: Tensor,
        past: tuple[Tensor, ...] | None = None,
        **attention_args: object,
    ) -> tuple[Tensor, tuple[Tensor, ...]]:
        """``x`` ``(B, L, E)`` -> ``(B, L, E)`` and this layer's cache.
        ``attention_args`` go to :meth:`attention` (Gemma 4: the keys and values its
        layers share in one call)."""
        if self.spec.block_norms != "pre":  # OLMo 2 (post), Gemma 2/3 (sandwich)
            h = x if self.norm1 is None else self.norm1(x)
            attn, present = self.attention(h, rope, mask, past, **attention_args)
            x = x + self.post_norm1(attn)
            h = x if self.norm2 is None else self.norm2(x)
            return x + self.post_norm2(self.mlp(h)), present
        h = self.norm1(x)
        attn, present = self.attention(h, rope, mask, past, **attention_args)
        if self.spec.parallel_residual:  # GPT-NeoX: both branches read x
            h = h if self.norm2 is None else self.norm2(x)  # Cohere: one norm for both
            return x + attn + self.mlp(h), present
        x = (h if self.spec.residual_from_norm else x) + attn
        h = self.norm2(x)
        return (h if self.spec.residual_from_norm else x) + self.mlp(h), present


def grouped_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float, cap: float = 0.0
) -> Tensor:
    """Attention of queries ``(B, H, L, D)`` on keys and values ``(B, H_kv, S, D)``
    under the additive ``mask`` ``(B, 1 or H, L, S)``, soft-capped when ``cap``;
    returns ``(B, L, H, D)``.

    GQA/MQA: the G query heads that share a key/value head are stacked along the query
    axis, so each key head is read once and never copied (HF 5.23's eager path copies
    it G times with repeat_kv; its SDPA path passes enable_gqa=True, or stacks one
    query the same way, pack_gqa, or copies when a mask is given to a longer query);
    heads are ordered so that head h uses key head h // G.
    """
    B, H, L, D = q.shape
    kv_heads = k.shape[1]
    groups = H // kv_heads
    q = q.reshape(B, kv_heads, groups * L, D)  # (B, Hkv, G*L, D)
    if groups > 1:
        if mask.shape[1] == 1:  # one mask (B, 1, L, S) for the G stacked heads
            mask = mask.repeat(1, 1, groups, 1)  # (B, 1, G*L, S)
        else:  # ALiBi's bias per head (B, H, L, S)
            mask = mask.reshape(B, kv_heads, groups * L, -1)  # (B, Hkv, G*L, S)
    if cap:  # Gemma 2: cap the scores, then mask
        out = _softcapped_attention(q, k, v, mask, scale, cap)
    else:
        out = scaled_dot_product_attention(q, k, v, mask=mask, scale=scale)
    return out.view(B, H, L, D).transpose(1, 2)  # (B, L, H, D)


def _softcapped_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float, cap: float
) -> Tensor:
    """Gemma 2's attention: ``softmax(softcap(q k^T * scale) + mask) v``."""
    from companion.modern import softcap  # the chapter's function; imported late

    scores = softcap((q @ k.transpose(-2, -1)) * scale, cap) + mask  # (..., L, S)
    weights = scores.float().softmax(dim=-1).nan_to_num(0.0)  # masked row: zeros
    return (weights @ v.float()).to(q.dtype)


def _norm_factory(spec: DecoderSpec, size: int | None = None):
    size = spec.hidden_size if size is None else size
    if spec.norm == "rms":  # Hugging Face's LlamaRMSNorm casts back before the gain
        return lambda: RMSNorm(size, eps=spec.eps, variant=spec.rms_variant)
    return lambda: LayerNorm(size, eps=spec.eps, bias=spec.layer_norm_bias)


class Decoder(nn.Module):
    """A decoder-only language model assembled from ``companion``'s parts.

    Build it with :func:`from_hf`. Calling it on ``input_ids`` ``(B, L)`` returns logits
    ``(B, L, vocab)``; :meth:`decode` does the same with a KV cache.

    Args:
        spec: the architecture, as :func:`from_hf` reads it from a Hugging Face config.
        block: the class of every layer, :class:`DecoderBlock` or a subclass keeping
            its interface (see there); layer ``i`` is ``block(spec, i)``.

    Shape:
        input_ids: ``(B, L)``, token ids of any integer dtype (``uint8`` to ``int64``;
        read as ``int64``, the index type of :class:`torch.nn.Embedding`).
        output: ``(B, L, V)`` logits, ``V`` the vocabulary size.
    """

    def __init__(
        self, spec: DecoderSpec, block: type[DecoderBlock] = DecoderBlock
    ) -> None:
        super().__init__()
        _validate.instance("spec", spec, DecoderSpec, "a DecoderSpec (use from_hf)")
        check_block_type("block", block)
        self.spec = spec
        self.embed = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.position_embed = (
            nn.Embedding(spec.max_positions, spec.hidden_size)
            if spec.positions == "learned"
            else None
        )
        self.embed_norm = _norm_factory(spec)() if spec.embedding_norm else None
        self.blocks = nn.ModuleList(block(spec, i) for i in range(spec.num_layers))
        self.final_norm = _norm_factory(spec)()
        self.lm_head = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)
        if spec.tied_embeddings:
            self.lm_head.weight = self.embed.weight  # one matrix, read twice

    def check_ids(self, ids: Tensor, past_length: int) -> Tensor:
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
        return ids.long()  # any integer dtype (nn.Embedding takes int32 and int64)

    def check_past(self, past: object, ids: Tensor) -> int:
        """Every layer's cache, before any computation, each checked by its block
        (:meth:`DecoderBlock.check_past`); returns the tokens seen, one for all."""
        if past is None:
            return 0
        caches = _validate.sequence(
            "past",
            past,
            length=self.spec.num_layers,
            what="layer caches, one per layer (num_layers), as decode returns them",
        )
        batch = ids.shape[0]
        seen = [
            blk.check_past(c, batch) for blk, c in zip(self.blocks, caches, strict=True)
        ]  # None: a layer that keeps no cache (Gemma 4's layers reusing keys)
        for i, n in enumerate(seen):
            if n is not None and n != seen[0]:
                raise ValueError(
                    f"past[{i}] must have seen as many tokens as past[0] ({seen[0]}), "
                    f"got {n}"
                )
        return seen[0]

    def decode(
        self,
        input_ids: Tensor,
        past: tuple[tuple[Tensor, ...], ...] | None = None,
        attention_mask: Tensor | None = None,
    ) -> tuple[Tensor, tuple[tuple[Tensor, ...], ...]]:
        """Logits of ``input_ids`` placed after the ``past`` tokens, and the new cache.

        With ``past=None`` this is the prefill (positions ``0 .. L-1``); with a cache of
        ``S`` tokens, the new tokens sit at positions ``S .. S+L-1`` and attend to the
        cached keys and to each other (causally).

        With an ``attention_mask`` ``(B, S + L)`` (1 = token, 0 = padding, for the
        cached *and* the new tokens, as Hugging Face's ``generate`` passes it), padding
        keys are hidden from every query and each row's positions count only its own
        tokens, as Hugging Face's ``generate`` derives them:
        ``position_ids = cumsum(attention_mask) - 1``, 0 at padding (GPT-2's learned
        table and RoPE read them; BLOOM's ALiBi uses the same positions, as its
        ``build_alibi_tensor`` does). Left padding (a row's padding first) and right
        padding both work here; :func:`generate` needs left padding. A padding query
        sees no key and gets zeros from attention, not NaN; its logits mean nothing.

        Args:
            input_ids: the new token ids, of any integer dtype.
            past: ``None`` or the cache returned by the previous call, checked whole
                before any computation, each layer's by its block
                (:meth:`DecoderBlock.check_past`): a full layer's ``(key, value)``,
                each ``(B, H_kv, S, D)`` with ``input_ids``' ``B``, the spec's
                ``num_kv_heads`` and ``head_dim``, the model's dtype and device; a
                sliding layer's ``(key, value, seen)`` with only the last
                ``sliding_window - 1`` keys; one ``S`` (tokens seen) for all layers
                (``TypeError``/``ValueError`` naming ``past[i][j]``).
            attention_mask: ``None`` (no padding) or ``(B, S + L)`` of 0/1 (bool or
                integer), every row with at least one token.

        Returns:
            ``(logits, present)``: logits of the new tokens and the cache after them.

        Shape:
            input_ids: ``(B, L)``.
            past: per layer ``(key, value)``, each ``(B, Hkv, S, D)`` (a sliding layer:
            at most ``sliding_window - 1`` keys, and ``seen``).
            attention_mask: ``(B, S + L)``.
            logits: ``(B, L, V)``.
        """
        ids = check_input_ids(input_ids)
        past_length = self.check_past(past, ids)
        ids = self.check_ids(ids, past_length)
        B, L = ids.shape
        S = past_length + L  # tokens after this call
        pad = check_attention_mask(attention_mask, B, S)  # (B, S) bool or None
        if pad is None:
            positions = torch.arange(past_length, S, device=ids.device).expand(B, L)
        else:  # Hugging Face's generate: cumsum - 1, padding at 0
            positions = _padding_positions(pad)[:, past_length:]  # (B, L)
        s = self.spec
        x = self.embed(ids)  # (B, L, E)
        if s.embedding_scale != 1.0:  # Gemma: sqrt(E) rounded to the dtype first
            x = x * torch.tensor(s.embedding_scale, dtype=x.dtype)
        if self.position_embed is not None:
            x = x + self.position_embed(positions)  # GPT-2: a learned row per position
        if self.embed_norm is not None:
            x = self.embed_norm(x)  # BLOOM
        seq_len = int(positions.max()) + 1  # Hugging Face's max(position_ids) + 1
        ropes, masks = {}, {}
        present = []
        scratch: dict = {}  # lives for this call (Gemma 4: keys and values shared)
        for i, block in enumerate(self.blocks):
            kind = s.layer_types[i]
            if kind not in masks:
                window = s.sliding_window if kind == "sliding_attention" else 0
                masks[kind] = self._mask(B, L, past_length, window, pad, x)
                if s.positions == "rope":  # (B, L, R/2) each
                    params = s.local_rope if window and s.local_rope else s.rope
                    rs = block.spec  # its head width (Gemma 4: wider globals)
                    ropes[kind] = _rope_table(rs, params, positions, seq_len, x.dtype)
            cache = None if past is None else past[i]
            x, layer_cache = self.layer(
                i, x, ropes.get(kind), masks[kind], cache, scratch
            )
            present.append(layer_cache)
        logits = self.lm_head(self.final_norm(x))  # (B, L, V)
        if s.logit_scale != 1.0:  # Cohere
            logits = logits * s.logit_scale
        if s.final_softcap:  # Gemma 2
            from companion.modern import softcap  # the chapter's function

            logits = softcap(logits, s.final_softcap)
        return logits, tuple(present)

    def layer(
        self,
        i: int,
        x: Tensor,
        rope: tuple[Tensor, Tensor] | None,
        mask: Tensor,
        past: tuple[Tensor, ...] | None,
        scratch: dict,
    ) -> tuple[Tensor, tuple[Tensor, ...]]:
        """Layer ``i`` in one call of :meth:`decode`: ``self.blocks[i](x, rope, mask,
        past)``. ``scratch`` is a dict that lives for that one call, for a subclass
        whose layers hand tensors on to later ones
        (:class:`companion.gemma4.Gemma4Decoder`: the keys and values its last layers
        reuse)."""
        return self.blocks[i](x, rope, mask, past)

    def _mask(
        self,
        B: int,
        L: int,
        past_length: int,
        window: int,
        pad: Tensor | None,
        x: Tensor,
    ) -> Tensor:
        """The additive mask ``(B, 1 or H, L, K + L)`` of a layer that keeps ``K`` keys
        (all ``past_length``, or the last ``window - 1`` in a sliding layer).

        Query ``i`` sits at slot ``q = past_length + i`` and sees key slot ``k`` when
        ``k <= q``, ``q - k < window`` (sliding layers) and ``k`` is not padding;
        BLOOM adds ALiBi's :math:`-a_h (m - n)`, :math:`m` and :math:`n` the query's and
        the key's positions in its row.
        """
        s, device = self.spec, x.device
        kept = min(past_length, window - 1) if window else past_length
        S = past_length + L
        q_slot = torch.arange(past_length, S, device=device)  # (L,)
        k_slot = torch.arange(S - L - kept, S, device=device)  # (K + L,)
        seen = causal_mask(L, kept + L, alignment="bottom_right", device=device)
        if window:  # Hugging Face's sliding_window_overlay: k > q - window
            seen = seen & (k_slot[None, :] > q_slot[:, None] - window)
        seen = seen.expand(B, L, kept + L)
        if pad is not None:
            seen = seen & pad[:, None, S - L - kept :]  # padding keys hidden
        zeros = torch.zeros((), dtype=x.dtype, device=device)
        mask = zeros.masked_fill(~seen, float("-inf"))[:, None]  # (B, 1, L, K+L)
        if s.positions != "alibi":
            return mask
        # ALiBi on the K + L keys this layer attends to, plus the mask (a window too)
        if pad is None:  # -a_h (m - n), -inf after the query: (H, L, S)
            bias = alibi_bias(s.num_heads, L, S, dtype=x.dtype, device=device)
            return bias[:, :, S - L - kept :] + mask  # (B, H, L, K+L)
        pos = _padding_positions(pad)  # (B, S)
        slopes = alibi_slopes(s.num_heads, dtype=torch.float32, device=device)
        distance = pos[:, S - L :, None] - pos[:, None, S - L - kept :]  # (B, L, K+L)
        bias = -slopes[None, :, None, None] * distance[:, None].float()  # (B,H,L,K+L)
        return bias.to(x.dtype) + mask

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor | None = None
    ) -> Tensor:
        """Logits ``(B, L, V)`` of ``input_ids`` ``(B, L)`` (no cache).

        With an ``attention_mask`` this equals Hugging Face's forward called with
        ``position_ids = cumsum(attention_mask) - 1`` as well (what its ``generate``
        passes), not Hugging Face's forward with the mask alone, which numbers every
        row's columns ``0 .. L-1``, padding included. The two differ where the positions
        themselves enter: GPT-2's learned table (chapter :ref:`ch-real-models` measures
        the gap in its "Common mistakes"). With RoPE a row's shift by its padding count
        cancels in the distances :math:`m - n` (up to rounding; dynamic NTK and LongRoPE
        aside, whose frequencies follow the largest position), and BLOOM derives its
        ALiBi positions from the mask.

        Args:
            input_ids: token ids.
            attention_mask: ``None`` or ``(B, L)`` of 0/1 (Hugging Face's name): padding
                positions (0) are hidden and each row's positions count its own tokens
                (see :meth:`decode`).
        """
        return self.decode(input_ids, attention_mask=attention_mask)[0]


def _padding_positions(pad: Tensor) -> Tensor:
    """Each row's positions ``(B, S)``: ``cumsum(mask) - 1``, 0 at padding
    (:func:`companion.modern.padding_position_ids`, Hugging Face's ``generate``)."""
    from companion.modern import padding_position_ids  # the chapter's function

    return padding_position_ids(pad)


def check_input_ids(input_ids: object) -> Tensor:
    return _validate.tensor(
        "input_ids", input_ids, dtype="integer", ndim=2, nonempty=True, meaning="(B, L)"
    )


def check_attention_mask(attention_mask: object, batch: int, total: int):
    """``None``, or the mask as a bool tensor ``(batch, total)``."""
    if attention_mask is None:
        return None
    mask = _validate.tensor(
        "attention_mask",
        attention_mask,
        dtype=("integer", "bool"),
        ndim=2,
        meaning="(B, S + L)",
    )
    if tuple(mask.shape) != (batch, total):
        raise ValueError(
            f"attention_mask must have shape ({batch}, {total}) (B, the cached plus "
            f"the new tokens), got shape {tuple(mask.shape)}"
        )
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError(
            "attention_mask must hold only 0 (padding) and 1 (token), got values "
            f"{sorted({int(x) for x in mask.unique().tolist()})}"
        )
    mask = mask.bool()
    if not bool(mask.any(dim=1).all()):
        rows = (~mask.any(dim=1)).nonzero().flatten().tolist()
        raise ValueError(
            f"attention_mask must give every row at least one token, got rows {rows} "
            "all padding"
        )
    return mask


def check_block_type(name: str, block: object) -> None:
    """``block`` must be :class:`DecoderBlock` or a subclass (the class itself)."""
    if not (isinstance(block, type) and issubclass(block, DecoderBlock)):
        raise TypeError(
            f"{name} must be DecoderBlock or a subclass of it (the class, not an "
            f"instance), got {_validate.describe(block)}"
        )
