r"""Real decoders rebuilt from the book's parts (chapter :ref:`ch-real-models` and the
chapter on the attention layer of 2024-2025).

:func:`from_hf` takes a Hugging Face causal language model of one of thirteen families and
returns a :class:`Decoder` that computes the same logits with ``companion``'s parts
only:

=========  ============================  ==============  ==============  ===========
family     positions                     norm            MLP             attention
=========  ============================  ==============  ==============  ===========
Llama      RoPE (half layout), plain or  RMSNorm, pre    gated (SwiGLU)  full
           scaled (linear, dynamic,
           YaRN, Llama 3, LongRoPE)
GPT-2      learned absolute table        LayerNorm, pre  GELU (tanh)     full
GPT-NeoX   RoPE on the first             LayerNorm, pre  GELU            full;
           ``rotary_ndims`` of a head                                    parallel
                                                                         residual
BLOOM      ALiBi                         LayerNorm, pre  GELU (tanh)     full
Mistral    RoPE                          RMSNorm, pre    gated           sliding
                                                                         window
Qwen2      RoPE                          RMSNorm, pre    gated           q/k/v bias;
                                                                         sliding
                                                                         layers
Qwen3      RoPE                          RMSNorm, pre;   gated           sliding
                                         QK-norm per                     layers
                                         head
OLMo 2     RoPE                          RMSNorm after   gated           full
                                         each sublayer;
                                         QK-norm over
                                         the projection
Gemma 2    RoPE; embeddings              Gemma RMSNorm   gated (GELU     local/global;
           times sqrt(E)                 (1 + w),        tanh)           score and
                                         sandwich                        logit
                                                                         soft-capping
Gemma 3    RoPE, a local base in         as Gemma 2;     gated (GELU     local/global
           sliding layers                QK-norm         tanh)
Phi-3      RoPE, full or partial         RMSNorm, pre    gated (fused)   full or
                                                                         sliding
SmolLM3    RoPE; none in the layers      RMSNorm, pre    gated           full or
           whose ``no_rope_layers``                                      sliding
           entry is 0 (every 4th)
Cohere2    interleaved RoPE in sliding   LayerNorm (no   gated           sliding
           layers, none in full ones     bias), one per                  (RoPE) and
                                         parallel block                  full (NoPE)
=========  ============================  ==============  ==============  ===========

The last two (the RoPE/NoPE hybrids) are in ``companion.families.HYBRID_PORTS``;
Cohere2's logits are multiplied by its ``logit_scale``.

Every family of the table with RoPE reads every scaling type of ``ROPE_TYPES``
(Gemma 3 one per layer type): linear, dynamic NTK, YaRN, Llama 3 and LongRoPE, whose
frequencies are chosen in each call from the largest position + 1, as Hugging Face's
``dynamic_rope_update`` does, and Gemma 4's ``proportional``
(:func:`companion.rope_variants.p_rope_frequencies` over the whole head; tested in a
Llama and in a Gemma 3's full layers, ``tests/test_gemma4.py``).

Attention is :func:`companion.attention.scaled_dot_product_attention` (Gemma 2's
soft-capped scores: :func:`companion.modern.softcap`, then the mask and the softmax),
with grouped-query and multi-query attention (fewer key/value heads than query heads)
done by stacking the query heads that share a key/value head along the query axis, not
by copying keys; RoPE is :func:`companion.rope.apply_rope` on the table of
:func:`companion.rope.rope_cos_sin` with the frequencies of
:func:`companion.rope.rope_frequencies`, of :mod:`companion.extension` (linear, dynamic
NTK, YaRN, Llama 3) or of :func:`companion.rope_variants.longrope_frequencies`; ALiBi is
:func:`companion.extension.alibi_bias`; the norms are
:class:`companion.norm.RMSNorm` (its ``llama``, ``torch`` and ``gemma`` variants) and
:class:`companion.norm.LayerNorm`.

:func:`generate` decodes greedily with a KV cache: each layer keeps its keys *after*
rotation and its values, and each new token is one query at the next position. The cache
is a value (a tuple of per-layer caches: ``(key, value)``, or ``(key, value, seen)`` for
a sliding layer, which keeps only the last ``sliding_window - 1`` tokens) that
:meth:`Decoder.decode` takes and returns; :func:`cache_bytes` measures it. A batch of
prompts of different lengths is left-padded with an ``attention_mask``: padding is never
attended to and each row's positions count its own tokens, as Hugging Face's
``generate`` derives them.

Another family is ported by passing a :class:`Port` (how to read its config and copy
its weights, optionally a :class:`DecoderBlock` subclass and a :class:`DecoderSpec`
subclass) to :func:`from_hf`; :data:`PORTS` holds the first eleven above (the registry
of :mod:`companion.families`, where each is an entry), ``HYBRID_PORTS`` there the two
hybrids, ``companion.gemma4.PORTS`` Gemma 4's text model (its own block, spec and
decoder: keys shared across layers), and ``companion.mla.PORTS``
(DeepSeek-V3's multi-head latent attention) is looked up after it, then
``companion.llama4.PORTS`` (Llama 4's text model) and ``companion.gpt_oss.PORTS``
(GPT-OSS: sliding and full layers, YaRN, sinks, experts), then
``companion.qwen3_next.PORTS`` (Qwen3-Next: Gated DeltaNet and gated attention layers,
experts, a state cache). What the copy does
not implement raises :class:`ValueError` naming it: other architectures without a port,
sliding windows outside the families above, RoPE types other than the six of
``ROPE_TYPES``, a LongRoPE config whose two training lengths (``rope_parameters`` key
and config attribute) differ, bidirectional attention, Gemma 3's
``attn_logit_softcapping`` (which Hugging Face stores and never applies),
cross-attention.

The model itself (:class:`DecoderSpec`, :class:`DecoderBlock`, :class:`Decoder`) is
built in ``companion._architecture`` and the families are read in
:mod:`companion.families`; this module is the entry point: :func:`from_hf`,
:func:`generate`, :func:`cache_bytes`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from companion import _validate, families, gemma4, gpt_oss, llama4, mla, qwen3_next
from companion._architecture import (
    Decoder,
    DecoderBlock,
    check_attention_mask,
    check_input_ids,
)
from companion._spec import ACTIVATIONS as ACTIVATIONS  # re-exported
from companion._spec import ROPE_TYPES as ROPE_TYPES  # (chapters read them)
from companion._spec import DecoderSpec
from companion.families import Port

__all__ = [
    "PORTS",
    "CacheBytes",
    "Decoder",
    "DecoderBlock",
    "DecoderSpec",
    "Port",
    "cache_bytes",
    "from_hf",
    "generate",
]

PORTS: dict[str, Port] = families.PORTS
"""The Hugging Face classes :func:`from_hf` copies without being told how, each with
its :class:`Port` (``LlamaForCausalLM``, ``GPT2LMHeadModel``, ``GPTNeoXForCausalLM``,
``BloomForCausalLM``, ``MistralForCausalLM``, ``Qwen2ForCausalLM``,
``Qwen3ForCausalLM``, ``Olmo2ForCausalLM``, ``Gemma2ForCausalLM``,
``Gemma3ForCausalLM``, ``Phi3ForCausalLM``); a subclass of one of them is read as that
class. The registry of :mod:`companion.families` itself (one dict): an entry added
there is found here."""


def _find_port(model: nn.Module) -> Port:
    """``model``'s port: its class (or a base class) in :data:`PORTS`, else in
    ``companion.families.HYBRID_PORTS``, ``companion.gemma4.PORTS``, else in
    ``companion.mla.PORTS``, then in ``companion.llama4.PORTS``, then in
    ``companion.gpt_oss.PORTS``, then in ``companion.qwen3_next.PORTS``."""
    names = [cls.__name__ for cls in type(model).__mro__]
    registries = (
        PORTS,
        families.HYBRID_PORTS,
        gemma4.PORTS,
        mla.PORTS,
        llama4.PORTS,
        gpt_oss.PORTS,
        qwen3_next.PORTS,
    )
    for registry in registries:
        port = next((registry[n] for n in names if n in registry), None)
        if port is not None:
            return port
    known = [*PORTS, *families.HYBRID_PORTS, *gemma4.PORTS]
    known += [n for n in mla.PORTS if n not in known]
    known += [n for n in llama4.PORTS if n not in known]
    known += [n for n in gpt_oss.PORTS if n not in known]
    known += [n for n in qwen3_next.PORTS if n not in known]
    raise ValueError(
        f"model must be one of {', '.join(known)} (or come with a port), got "
        f"{type(model).__name__} (unsupported architecture)"
    )


@torch.no_grad()
def from_hf(model: nn.Module, port: Port | None = None) -> Decoder:
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
    * Mistral, Qwen2/3, OLMo 2 and Gemma 2/3 copy as Llama does, with their extra
      norms (QK-norm, OLMo 2's post-norms, Gemma's four norms per block); Phi-3's fused
      ``qkv_proj`` splits by rows ``[q | k | v]`` and its ``gate_up_proj`` into
      ``[gate | up]``.
    * Tied input/output embeddings stay one shared parameter.

    The result is in evaluation form (no dropout), on ``model``'s device and in its
    dtype.

    Args:
        model: one of the classes of :data:`PORTS` (``LlamaForCausalLM``,
            ``GPT2LMHeadModel``, ``GPTNeoXForCausalLM``, ``BloomForCausalLM``,
            ``MistralForCausalLM``, ``Qwen2ForCausalLM``, ``Qwen3ForCausalLM``,
            ``Olmo2ForCausalLM``, ``Gemma2ForCausalLM``, ``Gemma3ForCausalLM``,
            ``Phi3ForCausalLM``), of ``companion.families.HYBRID_PORTS``
            (``SmolLM3ForCausalLM``, ``Cohere2ForCausalLM``), of
            ``companion.gemma4.PORTS`` (``Gemma4ForCausalLM``) or of
            ``companion.mla.PORTS`` or of ``companion.llama4.PORTS``
            (``Llama4ForCausalLM``) or of ``companion.gpt_oss.PORTS``
            (``GptOssForCausalLM``) or of ``companion.qwen3_next.PORTS``
            (``Qwen3NextForCausalLM``), or any model ``port`` reads.
        port: ``None`` (look ``model``'s class up in :data:`PORTS`, then in
            ``companion.families.HYBRID_PORTS``, ``companion.gemma4.PORTS``,
            ``companion.mla.PORTS``, ``companion.llama4.PORTS``,
            ``companion.gpt_oss.PORTS`` and ``companion.qwen3_next.PORTS``) or a
            :class:`Port` for another family.

    Returns:
        The copy; ``copy(input_ids)`` gives logits ``(B, L, vocab)`` equal to
        ``model(input_ids).logits`` up to float rounding.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``; ``port`` is not a :class:`Port`.
        ValueError: another architecture and no ``port``; a configuration this copy
            does not implement (sliding-window attention in Llama, GPT-2, GPT-NeoX or
            BLOOM, or layer types other than ``full_attention`` and
            ``sliding_attention``; a RoPE type other than ``default``, ``linear``,
            ``dynamic``, ``yarn``, ``llama3`` and ``longrope``; ``longrope`` with
            ``rope_parameters["original_max_position_embeddings"]`` and the config's
            ``original_max_position_embeddings`` set to different lengths; a
            ``partial_rotary_factor`` outside GPT-NeoX and Phi-3; bidirectional
            attention; Gemma 3's ``attn_logit_softcapping``; cross-attention; an
            unknown activation; BLOOM's ``slow_but_exact`` with
            ``pretraining_tp > 1``); a layer list of another length than the config
            says.
    """
    _validate.module("model", model)
    if port is None:
        port = _find_port(model)
    _validate.instance("port", port, Port, "a Port or None")
    fields = port.spec(model)
    _validate.instance("port.spec(model)", fields, dict, "a dict of DecoderSpec fields")
    spec = port.spec_type(**fields)
    try:
        layers = model.get_submodule(port.layers)
    except AttributeError:
        layers = None
    if not isinstance(layers, nn.ModuleList):
        raise ValueError(
            f"port.layers must name model's list of layers (an nn.ModuleList), got "
            f"{port.layers!r}, which in a {type(model).__name__} is "
            f"{'nothing' if layers is None else 'a ' + type(layers).__name__}"
        )
    if len(layers) != spec.num_layers:
        raise ValueError(
            f"model must hold as many layers as its config says: {port.layers} has "
            f"{len(layers)}, the config gives num_layers = {spec.num_layers} (a layer "
            "list cut or grown after loading; set the config's count to copy those)"
        )
    weight = model.get_input_embeddings().weight
    copy = port.decoder(spec, block=port.block)
    copy = copy.to(device=weight.device, dtype=weight.dtype)
    port.load(copy, model)
    return copy.eval()


# ---- what a cache holds --------------------------------------------------------------


class CacheBytes(NamedTuple):
    """What :func:`cache_bytes` measures on a cache."""

    layers: tuple[int, ...]
    """Bytes each layer's cache holds (its tensors with at least one axis)."""
    tokens: int
    """Tokens the cache has seen (in each sequence of the batch)."""
    per_token: float
    """``sum(layers) / (B * tokens)``: bytes per token of one sequence."""
    full_per_token: float
    """Bytes per token of the same model's cache with every layer full (no sliding
    window, no fixed-size state): ``2 * num_layers * num_kv_heads * head_dim``
    elements, measured on the tensors of a full layer where the model has one."""


def cache_bytes(model: Decoder, past: tuple[tuple[Tensor, ...], ...]) -> CacheBytes:
    r"""Bytes a KV cache holds, measured on its tensors, against a full cache.

    A sliding layer keeps at most ``sliding_window - 1`` keys and values, so its bytes
    stop growing; a full layer's grow with every token; a Qwen3-Next linear layer
    keeps a state of fixed size (``(conv_state, recurrent_state, seen)``), whatever the
    length. ``per_token`` is the cache's bytes over the tokens seen, ``full_per_token``
    what the model would hold per token with every layer full (Mistral's, Gemma's,
    Qwen3-Next's savings are their ratio). The bytes from the config, without a model
    or a cache, are :func:`companion.qwen3_next.state_cache_bytes`'s formula (tested
    equal to this count).

    Args:
        model: the :class:`Decoder` that made ``past``.
        past: a cache as :meth:`Decoder.decode` returns it (checked as there).

    Returns:
        A :class:`CacheBytes`.
    """
    _validate.instance("model", model, Decoder, "a Decoder (from from_hf)")
    caches = _validate.sequence(
        "past", past, length=model.spec.num_layers, what="layer caches (num_layers)"
    )
    head = _validate.sequence("past[0]", caches[0], what="tensors")
    first = _validate.tensor(  # a key (B, H_kv, S, D) or a state (B, ...): its batch
        "past[0][0]", head[0] if head else None, min_ndim=1, meaning="(B, ...)"
    )
    batch = first.shape[0]
    tokens = model.check_past(past, first.new_zeros(batch, 1, dtype=torch.long))
    layers = tuple(
        sum(t.numel() * t.element_size() for t in cache if t.ndim > 0)
        for cache in caches
    )
    n = batch * max(tokens, 1)  # tokens of all sequences
    full = [  # layers that keep every token: not sliding, not a linear layer's state
        cache
        for cache, blk in zip(caches, model.blocks, strict=True)
        if not getattr(blk, "window", 0) and not getattr(blk, "linear", False)
    ]
    if full:  # measured: a full layer holds every token
        per_layer = sum(t.numel() * t.element_size() for t in full[0] if t.ndim > 0) / n
    else:  # every layer slides: a key and a value of every token, the cache's dtype
        s = model.spec
        per_layer = 2 * s.num_kv_heads * s.head_dim * first.element_size()
    return CacheBytes(layers, tokens, sum(layers) / n, per_layer * len(layers))


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
    LongRoPE too: once the sequence grows past ``original_max_position_embeddings`` new
    tokens are rotated with the long factors while the cached keys keep the short
    ones, as in Hugging Face's cache, in every family but Phi-3, where the cache is
    dropped at that length and the whole sequence run again with the long factors, as
    Phi-3's ``prepare_inputs_for_generation`` does.

    A batch of prompts of different lengths is *left*-padded with an
    ``attention_mask`` (1 = token, 0 = padding, each row's zeros first): padding is
    never attended to, each row's positions count its own tokens, and every new token
    extends the mask with a 1, as Hugging Face's ``generate`` does.

    Same tokens as Hugging Face's ``model.generate(input_ids, attention_mask=...,
    max_new_tokens=n, do_sample=False)`` when that does not stop early
    (``eos_token_id=None``): ties go to the lowest token id (``argmax``) in both. One
    exception, Hugging Face's: a ``sliding_window`` of 1, where transformers 5.23's
    sliding cache keeps ``[-window + 1:]``, i.e. every key, and its cached tokens
    leave those of its own forward; this function's equal that forward's.

    Args:
        model: a :class:`Decoder` from :func:`from_hf`.
        input_ids: the prompts, left-padded to one length.
        max_new_tokens: how many tokens to add; 0 returns the prompt.
        use_cache: keep keys and values between steps (``False``: recompute everything).
        attention_mask: ``None`` (no padding) or ``(B, L)`` of 0/1, bool or integer,
            each row some zeros then ones (left padding; ``ValueError`` otherwise).

    Returns:
        The prompt followed by the new tokens, ``int64``.

    Shape:
        input_ids: ``(B, L)``.
        attention_mask: ``(B, L)``.
        output: ``(B, L + max_new_tokens)``.
    """
    _validate.instance("model", model, Decoder, "a Decoder (from from_hf)")
    n = _validate.nonnegative_int("max_new_tokens", max_new_tokens)
    use_cache = _validate.flag("use_cache", use_cache)
    ids = model.check_ids(check_input_ids(input_ids), 0)
    pad = check_attention_mask(attention_mask, *ids.shape)
    if pad is not None and bool((pad[:, 1:] < pad[:, :-1]).any()):
        rows = (pad[:, 1:] < pad[:, :-1]).any(dim=1).nonzero().flatten().tolist()
        raise ValueError(
            "attention_mask must be left padding for generate (each row's zeros "
            f"before its ones; new tokens follow the last column), got rows {rows} "
            "with a zero after a one"
        )
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
    ones = torch.ones(out.shape[0], 1, dtype=torch.bool, device=out.device)
    if not use_cache:
        for _ in range(n):
            logits = model.decode(out, attention_mask=pad)[0]
            nxt = logits[:, -1].argmax(dim=-1, keepdim=True)  # (B, 1)
            out = torch.cat((out, nxt), dim=1)
            pad = None if pad is None else torch.cat((pad, ones), dim=1)
        return out
    switch = 0  # LongRoPE: the length at which Phi-3 (only) recomputes the cache
    if spec.family == "phi3" and spec.rope.get("rope_type") == "longrope":
        switch = int(spec.rope["original_max_position_embeddings"]) + 1
    logits, past = model.decode(out, attention_mask=pad)  # prefill: the whole prompt
    for step in range(n):
        nxt = logits[:, -1].argmax(dim=-1, keepdim=True)  # (B, 1)
        out = torch.cat((out, nxt), dim=1)
        pad = None if pad is None else torch.cat((pad, ones), dim=1)
        if step + 1 == n:
            break
        if out.shape[1] == switch:  # cached keys rotated with the short factors
            logits, past = model.decode(out, attention_mask=pad)
        else:  # one query at the next position
            logits, past = model.decode(nxt, past, attention_mask=pad)
    return out
