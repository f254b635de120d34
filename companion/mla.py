r"""Multi-head latent attention (MLA) of DeepSeek-V2/V3, built on :mod:`companion.decoder`.

MLA compresses what a layer caches. Each token :math:`x` is projected *down* to a latent
:math:`c = \mathrm{RMSNorm}(x W_{DKV})` of ``kv_lora_rank`` numbers (:math:`r`, 512 in
DeepSeek-V3), and every head's key and value are linear in it: head :math:`h` reads
:math:`k^C_h = c\,W_{UK,h}` (``qk_nope_head_dim`` wide) and :math:`v_h = c\,W_{UV,h}`
(``v_head_dim``), the up-projections stored together as ``kv_b_proj``. Only :math:`c`
needs caching, not :math:`H` keys and values.

**Why RoPE blocks the obvious trick.** Without positions the score of query
:math:`q_h = x_m W_{Q,h}` and key :math:`k_h = c_n W_{UK,h}` (row vectors, as in the
book) is :math:`x_m W_{Q,h} W_{UK,h}^\top c_n^\top`: the product
:math:`W_{Q,h}W_{UK,h}^\top` is one fixed matrix, so the key never has to be formed (the
query is *absorbed* into the latent space, width :math:`r`). With RoPE on queries and
keys the score is :math:`\langle x_m W_{Q,h} R_m,\ c_n W_{UK,h} R_n\rangle =
x_m W_{Q,h}\, R_m R_n^\top\, W_{UK,h}^\top c_n^\top`, and the book's relative identity
:math:`R_m R_n^\top = R_{m-n}` sits *between* :math:`W_{Q,h}` and
:math:`W_{UK,h}^\top`: it depends on the pair of positions, so no single matrix absorbs
it, and every cached latent would have to be up-projected and rotated again at each step.
(In the column convention of most papers the same matrix is
:math:`R(m)^\top R(n) = R(n - m)`.)

**Decoupled RoPE** fixes it by splitting each head's query and key in two: a *nope* part
(``qk_nope_head_dim``) that carries no position, whose score
:math:`q^C_h\,W_{UK,h}^{\top\!}` against :math:`c_n` is absorbable, and a small *rope* part
(``qk_rope_head_dim``, 64) that carries RoPE. The rope key :math:`k^R_n = \mathrm{RoPE}_n(
x_n W_{KR})` is **one head shared by all heads** (as in multi-query attention), rotated
once and cached as it is. The score of head :math:`h` is the sum

.. math::

    s_{h,mn} = \bigl(q^C_{h,m} W_{UK,h}^\top\bigr)\cdot c_n
             + \mathrm{RoPE}_m(q^R_{h,m}) \cdot k^R_n ,

so the cache holds, per token and layer, only :math:`c_n` and :math:`k^R_n`:
``kv_lora_rank + qk_rope_head_dim`` numbers (576 in DeepSeek-V3), against
:math:`2 H D` for multi-head attention (:func:`cache_bytes_per_token`).

Two inference paths compute the same outputs (:class:`MLABlock`):

* **naive** (:meth:`MLABlock.attention_naive`, Hugging Face's order): up-project the whole
  cache to per-head keys ``[k^C_h, k^R]`` and values, then ordinary attention;
* **absorbed** (:meth:`MLABlock.attention_absorbed`, DeepSeek's reference ``absorb``
  mode): :math:`W_{UK,h}` is multiplied into the query (:math:`q^C_h W_{UK,h}^\top`, width
  :math:`r`), the query ``[q^C_h W_{UK,h}^\top, q^R_h]`` attends to the cached
  ``[c, k^R]`` directly, the values are the latents :math:`c` themselves, and
  :math:`W_{UV,h}` is applied to the weighted latent after the softmax (on the way into
  the output projection :math:`W_O`). Attention is then multi-query attention with one
  key head of width :math:`r + d_R` shared by all :math:`H` query heads.

:data:`PORTS` holds the port :func:`companion.decoder.from_hf` finds for
``DeepseekV3ForCausalLM``: :class:`MLASpec` for its config, :class:`MLABlock` for its
layers, and the weight copy. Its MLP layers are built too: the first
``first_k_dense_replace`` dense (the parent's gated MLP), the rest DeepSeekMoE
(:meth:`MLABlock.mlp`): routed experts chosen by :func:`route_tokens` (sigmoid
affinities, group-limited top-k, the load-balancing correction bias) plus shared
experts. Refused by name: ``num_key_value_heads != num_attention_heads``, RoPE types
other than :data:`MLA_ROPE_TYPES`, a partial rotary factor. The multi-token-prediction
module (``num_nextn_predict_layers``) is not part of Hugging Face's forward and not
copied.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from companion import _validate
from companion._architecture import Decoder, DecoderBlock
from companion._spec import ACTIVATIONS, DecoderSpec
from companion.attention import scaled_dot_product_attention
from companion.families import (
    Port,
    base_fields,
    copy_linear,
    copy_norm,
    copy_output,
    copy_tensor,
    rope_parameters,
    routed_experts,
    unsupported,
)
from companion.norm import RMSNorm
from companion.rope import apply_rope, interleaved_to_half_permutation

__all__ = [
    "ATTENTION_KINDS",
    "MLA_ROPE_TYPES",
    "PORTS",
    "MLABlock",
    "MLASpec",
    "cache_bytes_per_token",
    "mla_softmax_scale",
    "route_tokens",
    "use_absorbed",
]

MLA_ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3", "longrope")
"""The RoPE scaling types an MLA copy follows (Hugging Face's ``rope_type``), through
:mod:`companion.decoder`'s shared rope table; ``"longrope"`` with Hugging Face's
semantics there: its set chosen per call from ``max(position_ids) + 1`` against
``original_max_position_embeddings``, its attention factor on cos and sin, cached rope
keys keeping the rotation they were cached with."""


# ---- the spec ------------------------------------------------------------------------


@dataclass(frozen=True)
class MLASpec(DecoderSpec):
    r"""A :class:`~companion.decoder.DecoderSpec` with the sizes of latent attention.

    The inherited fields keep their meaning, with MLA's values: ``head_dim`` is the
    width of a query/key head, ``qk_nope_head_dim + qk_rope_head_dim`` (192 in
    DeepSeek-V3); ``rotary_dim`` is ``qk_rope_head_dim``; ``num_kv_heads`` equals
    ``num_heads`` (every head has its own key and value, up-projected from one latent);
    ``scales`` holds the softmax scale of each layer, :func:`mla_softmax_scale`.

    The fields beyond DecoderSpec's:

    Args:
        q_lora_rank: ``None`` (one projection ``q_proj``) or the rank of the low-rank
            query, ``q_a_proj`` (down) -> RMSNorm -> ``q_b_proj`` (up); 1536 in
            DeepSeek-V3.
        kv_lora_rank: :math:`r`, the width of the cached latent :math:`c` (512).
        qk_rope_head_dim: :math:`d_R`, the width of the RoPE part of a query head and of
            the one rope key shared by all heads (64); even.
        qk_nope_head_dim: the width of the position-free part of a query/key head (128).
        v_head_dim: the width of a value head (128).
        rope_interleave: RoPE's pairs are ``(2i, 2i + 1)`` in the projections' output
            (DeepSeek's layout, Hugging Face's ``rope_interleave=True``) rather than
            ``(i, i + d_R/2)``.
        latent_eps: the epsilon of the two latent RMSNorms (Hugging Face builds them with
            its default ``1e-6``, not ``rms_norm_eps``).
        n_routed_experts: experts of a mixture-of-experts layer (256 in DeepSeek-V3);
            ``0``: every layer has the dense MLP.
        first_k_dense_replace: layers ``0 .. first_k_dense_replace - 1`` are dense, the
            rest mixtures of experts (3 of 61).
        moe_intermediate_size: the hidden width of one expert (2048).
        num_experts_per_tok: experts each token is sent to (8).
        n_group: groups the experts are split into for routing (8).
        topk_group: groups a token may use (4).
        n_shared_experts: experts every token goes through, as one gated MLP of width
            ``moe_intermediate_size * n_shared_experts`` (1).
        norm_topk_prob: the chosen weights are normalized to sum to 1.
        routed_scaling_factor: factor on the chosen weights (2.5).

    Every field is checked when the record is made (``TypeError``/``ValueError`` naming
    the field): positive sizes, an even ``qk_rope_head_dim``, ``head_dim`` and
    ``rotary_dim`` consistent with the two parts, ``num_kv_heads == num_heads``, the
    choices MLA's block fixes (RoPE positions, RMSNorm, a gated MLP, serial residual),
    and for experts: ``n_group`` dividing ``n_routed_experts`` into groups of at least
    two, ``topk_group <= n_group``, ``num_experts_per_tok`` reachable in
    ``topk_group`` groups.
    """

    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    rope_interleave: bool = False
    latent_eps: float = 1e-6
    # DeepSeekMoE: layers first_k_dense_replace .. num_layers - 1 when n_routed_experts
    n_routed_experts: int = 0  # 0: every layer dense
    first_k_dense_replace: int = 0
    moe_intermediate_size: int = 0
    num_experts_per_tok: int = 0
    n_group: int = 1
    topk_group: int = 1
    n_shared_experts: int = 0
    norm_topk_prob: bool = False
    routed_scaling_factor: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_mla(self)

    def is_moe(self, layer: int) -> bool:
        """Whether layer ``layer``'s MLP is a mixture of experts."""
        layer = _validate.integer(
            "layer", layer, minimum=0, maximum=self.num_layers - 1
        )
        return self.n_routed_experts > 0 and layer >= self.first_k_dense_replace


def _check_mla(spec: MLASpec) -> None:
    v = _validate

    def put(name: str, value: object) -> None:  # the record is frozen
        object.__setattr__(spec, name, value)

    put("q_lora_rank", v.optional(v.positive_int, "q_lora_rank", spec.q_lora_rank))
    for name in ("kv_lora_rank", "qk_nope_head_dim", "v_head_dim"):
        put(name, v.positive_int(name, getattr(spec, name)))
    put(
        "qk_rope_head_dim",
        v.positive_int("qk_rope_head_dim", spec.qk_rope_head_dim, even=True),
    )
    put("rope_interleave", v.flag("rope_interleave", spec.rope_interleave))
    put("latent_eps", v.positive_real("latent_eps", spec.latent_eps))
    width = spec.qk_nope_head_dim + spec.qk_rope_head_dim
    fixed = {  # field -> (what MLA needs, why)
        "head_dim": (width, "qk_nope_head_dim + qk_rope_head_dim"),
        "rotary_dim": (spec.qk_rope_head_dim, "qk_rope_head_dim"),
        "num_kv_heads": (spec.num_heads, "num_heads: one key/value per query head"),
        "positions": ("rope", "MLA's decoupled RoPE"),
        "norm": ("rms", "RMSNorm"),
        "mlp": ("gated", "a gated MLP"),
        "parallel_residual": (False, "a serial block"),
        "residual_from_norm": (False, "the residual adds the block's input"),
        "embedding_norm": (False, "no norm after the embedding"),
    }
    _validate.fixed_fields(spec, fixed, "an MLASpec")
    v.choice("rope['rope_type']", spec.rope.get("rope_type"), MLA_ROPE_TYPES)
    _check_moe(spec, put)


def _check_moe(spec: MLASpec, put) -> None:
    v = _validate
    put(
        "n_routed_experts", v.nonnegative_int("n_routed_experts", spec.n_routed_experts)
    )
    put("norm_topk_prob", v.flag("norm_topk_prob", spec.norm_topk_prob))
    if spec.n_routed_experts == 0:
        return
    n = spec.n_routed_experts
    put(
        "first_k_dense_replace",
        v.integer(
            "first_k_dense_replace",
            spec.first_k_dense_replace,
            minimum=0,
            maximum=spec.num_layers,
        ),
    )
    for name in ("moe_intermediate_size", "num_experts_per_tok"):
        put(name, v.positive_int(name, getattr(spec, name)))
    put(
        "n_shared_experts", v.nonnegative_int("n_shared_experts", spec.n_shared_experts)
    )
    put("n_group", v.divisor("n_group", spec.n_group, "n_routed_experts", n))
    if n // spec.n_group < 2:
        raise ValueError(
            f"n_group must leave at least 2 experts per group (a group's score is its "
            f"two best experts), got n_group={spec.n_group} for {n} experts"
        )
    put(
        "topk_group",
        v.integer("topk_group", spec.topk_group, minimum=1, maximum=spec.n_group),
    )
    reachable = spec.topk_group * (n // spec.n_group)
    if spec.num_experts_per_tok > reachable:
        raise ValueError(
            f"num_experts_per_tok must be at most {reachable} (topk_group groups of "
            f"{n // spec.n_group} experts), got {spec.num_experts_per_tok}"
        )
    put(
        "routed_scaling_factor",
        v.positive_real("routed_scaling_factor", spec.routed_scaling_factor),
    )


def mla_softmax_scale(
    qk_head_dim: int, rope_parameters: dict[str, Any] | None = None
) -> float:
    r"""The factor on MLA's scores, :math:`D^{-1/2}` times DeepSeek's YaRN
    :math:`\mathrm{mscale}^2`.

    Hugging Face (``yarn_apply_mscale``) and DeepSeek's reference: for a RoPE type other
    than ``"default"`` whose parameters give a nonzero ``mscale_all_dim``, the scale
    :math:`1/\sqrt{D}` (``D = qk_nope_head_dim + qk_rope_head_dim``) is multiplied by
    :math:`m^2` with :math:`m = 0.1\,\mathrm{mscale\_all\_dim}\ln s + 1` for the factor
    :math:`s > 1` (:math:`m = 1` for :math:`s \le 1`). Separately, YaRN's attention factor
    multiplies cos and sin (so the *rope* part of each score, by its square): with
    ``mscale`` and ``mscale_all_dim`` it is the ratio :math:`m(\mathrm{mscale}) /
    m(\mathrm{mscale\_all\_dim})`, 1 in DeepSeek-V3 (both 1.0), whose whole YaRN
    correction is therefore this scale, :math:`(0.1 \ln 40 + 1)^2 = 1.87`. LongRoPE
    gets the same :math:`m^2` from ``mscale_all_dim`` and ``factor`` (Hugging Face then
    needs ``factor`` in ``rope_parameters``; ``from_hf`` fills an absent one with
    ``max_position_embeddings / original_max_position_embeddings``, the factor of
    LongRoPE's own attention factor on cos and sin).

    Args:
        qk_head_dim: ``D``, the width of a query/key head; a positive int.
        rope_parameters: ``None`` or Hugging Face's ``rope_parameters`` dict
            (``rope_type``, ``factor``, ``mscale_all_dim``, ...).

    Returns:
        The scale, a float.
    """
    d = _validate.positive_int("qk_head_dim", qk_head_dim)
    p = _validate.optional(
        _validate.instance,
        "rope_parameters",
        rope_parameters,
        cls=dict,
        expected="a dict (Hugging Face's rope_parameters) or None",
    )
    scale = d**-0.5
    p = p or {}
    all_dim = p.get("mscale_all_dim") or 0
    if p.get("rope_type", p.get("type", "default")) != "default" and all_dim:
        s = _validate.positive_real("rope_parameters['factor']", p.get("factor"))
        all_dim = _validate.positive_real("rope_parameters['mscale_all_dim']", all_dim)
        m = 1.0 if s <= 1 else 0.1 * all_dim * math.log(s) + 1.0
        scale *= m * m
    return scale


# ---- DeepSeekMoE's router --------------------------------------------------------------


def route_tokens(
    x: Tensor,
    weight: Tensor,
    correction_bias: Tensor,
    *,
    top_k: int,
    n_group: int = 1,
    topk_group: int = 1,
    norm_topk_prob: bool = True,
    routed_scaling_factor: float = 1.0,
) -> tuple[Tensor, Tensor]:
    r"""DeepSeek-V3's expert choice: sigmoid affinities, group-limited top-k, a bias that
    steers the choice but not the weights.

    Each token's affinity to expert :math:`e` is :math:`s_e = \sigma(x \cdot w_e)`
    (float32). The *choice* uses :math:`s_e + b_e`, ``b`` the load-balancing
    ``e_score_correction_bias`` (DeepSeek-V3's auxiliary-loss-free balancing, updated
    outside back-propagation): the experts are split into ``n_group`` groups, a group
    scores the sum of its two best :math:`s_e + b_e`, only the ``topk_group`` best
    groups stay, and the ``top_k`` best experts among them are chosen. Their *weights*
    are the plain :math:`s_e` (without ``b``), divided by their sum if
    ``norm_topk_prob`` (plus ``1e-20``), times ``routed_scaling_factor``. Hugging Face's
    ``DeepseekV3TopkRouter``, step for step.

    Args:
        x: tokens, a floating tensor ``(T, E)``.
        weight: the router ``(N, E)``, ``N`` experts.
        correction_bias: ``b``, ``(N,)``.
        top_k: experts per token (``num_experts_per_tok``).
        n_group: groups of experts; divides ``N``, each group at least 2 experts.
        topk_group: groups kept per token, ``1 .. n_group``.
        norm_topk_prob: normalize the chosen weights to sum to 1.
        routed_scaling_factor: factor on the chosen weights.

    Returns:
        ``(weights, indices)``, each ``(T, top_k)``: float32 weights and the int64
        experts chosen (in no particular order).
    """
    x = _validate.tensor("x", x, ndim=2, meaning="(T, E)")
    weight = _validate.tensor("weight", weight, ndim=2, meaning="(N, E)")
    _validate.same_size("weight", weight, 1, "x", x, 1, "E")
    n = weight.shape[0]
    bias = _validate.tensor("correction_bias", correction_bias, ndim=1)
    _validate.size("correction_bias", bias, 0, n, "N, weight's experts")
    n_group = _validate.divisor("n_group", n_group, "the experts", n)
    if n // n_group < 2:
        raise ValueError(
            f"n_group must leave at least 2 experts per group, got {n_group} for {n}"
        )
    topk_group = _validate.integer("topk_group", topk_group, minimum=1, maximum=n_group)
    top_k = _validate.integer(
        "top_k", top_k, minimum=1, maximum=topk_group * (n // n_group)
    )
    norm_topk_prob = _validate.flag("norm_topk_prob", norm_topk_prob)
    factor = _validate.positive_real("routed_scaling_factor", routed_scaling_factor)
    scores = torch.sigmoid(x.float() @ weight.float().t())  # (T, N)
    choice = scores + bias  # steers the choice only
    per_group = choice.view(-1, n_group, n // n_group)  # (T, groups, N / groups)
    group_scores = per_group.topk(2, dim=-1).values.sum(dim=-1)  # (T, groups)
    kept = group_scores.topk(topk_group, dim=-1, sorted=False).indices
    group_mask = torch.zeros_like(group_scores).scatter_(1, kept, 1.0).bool()
    expert_mask = group_mask[:, :, None].expand_as(per_group).reshape(-1, n)
    choice = choice.masked_fill(~expert_mask, float("-inf"))
    indices = choice.topk(top_k, dim=-1, sorted=False).indices  # (T, top_k)
    weights = scores.gather(1, indices)
    if norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * factor, indices


# ---- the block -----------------------------------------------------------------------


class MLABlock(DecoderBlock):
    r"""One DeepSeek-V3 decoder layer: :class:`~companion.decoder.DecoderBlock` with
    multi-head latent attention.

    Only the attention differs from the parent (its projections, :meth:`attention` and
    the cache); the two RMSNorms, the serial pre-norm residual and the gated MLP are the
    parent's. Projections, as Hugging Face names them: ``q_proj`` (``q_lora_rank``
    ``None``) or ``q_a_proj`` -> ``q_a_layernorm`` -> ``q_b_proj``, each query head
    ``[q^C_h, q^R_h]``; ``kv_a_proj_with_mqa`` gives ``[c, k^R]`` (the latent before its
    norm and the one shared rope key), ``kv_a_layernorm`` normalizes :math:`c`,
    ``kv_b_proj`` holds :math:`W_{UK,h}` and :math:`W_{UV,h}` for every head (rows
    ``(H, qk_nope_head_dim + v_head_dim)``), ``o_proj`` maps ``H * v_head_dim`` back.

    The cache of a layer (``past``/``present``) is a 1-tuple: one tensor
    ``(B, 1, S, kv_lora_rank + qk_rope_head_dim)`` whose first ``kv_lora_rank`` columns
    are :math:`c` and last ``qk_rope_head_dim`` the rotated rope key :math:`k^R` (the
    layout of DeepSeek's FlashMLA: the absorbed path reads it as the key and its first
    part as the value), shaped as the book's ``(B, H_kv, S, D)`` caches with one head,
    which is what it is to the absorbed path. Rope parts are rotated in the half layout; with ``rope_interleave`` the
    pairs ``(2i, 2i+1)`` are first permuted to ``(i, i + d_R/2)``
    (:func:`companion.rope.interleaved_to_half_permutation`), as Hugging Face's
    ``apply_rotary_pos_emb_interleave`` does, so the cache holds what Hugging Face's does.

    ``absorbed`` chooses the path :meth:`attention` takes (``False``: naive, the
    default; :func:`use_absorbed` sets it for a whole model).

    Args:
        spec: an :class:`MLASpec`.
        layer: the layer's index.

    Shape:
        x: ``(B, L, E)``; output ``(B, L, E)`` and the cache ``((B, 1, S, r + d_R),)``.
    """

    def __init__(self, spec: MLASpec, layer: int) -> None:
        _validate.instance("spec", spec, MLASpec, "an MLASpec (use from_hf)")
        super().__init__(spec, layer)
        e, h, r = spec.hidden_size, spec.num_heads, spec.kv_lora_rank
        dn, dr, dv = spec.qk_nope_head_dim, spec.qk_rope_head_dim, spec.v_head_dim
        del self.k_proj, self.v_proj  # the parent's per-head key/value projections
        bias = spec.qkv_bias  # Hugging Face's attention_bias: the down-projections, o
        if spec.q_lora_rank is None:
            self.q_proj = nn.Linear(e, h * (dn + dr), bias=False)
            self.q_a_proj = self.q_a_layernorm = self.q_b_proj = None
        else:
            self.q_proj = None
            self.q_a_proj = nn.Linear(e, spec.q_lora_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(
                spec.q_lora_rank, eps=spec.latent_eps, variant="llama"
            )
            self.q_b_proj = nn.Linear(spec.q_lora_rank, h * (dn + dr), bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(e, r + dr, bias=bias)
        self.kv_a_layernorm = RMSNorm(r, eps=spec.latent_eps, variant="llama")
        self.kv_b_proj = nn.Linear(r, h * (dn + dv), bias=False)
        self.o_proj = nn.Linear(h * dv, e, bias=spec.out_bias)
        self.absorbed = False
        self.moe = spec.is_moe(layer)
        if self.moe:  # routed experts; the shared ones are the parent's gated MLP
            n, inner = spec.n_routed_experts, spec.moe_intermediate_size
            self.router = nn.Parameter(torch.zeros(n, e))
            self.register_buffer("correction_bias", torch.zeros(n))
            self.experts_gate_up = nn.Parameter(torch.zeros(n, 2 * inner, e))
            self.experts_down = nn.Parameter(torch.zeros(n, e, inner))
            shared = inner * spec.n_shared_experts
            if shared:
                self.gate_proj = nn.Linear(e, shared, bias=False)
                self.up_proj = nn.Linear(e, shared, bias=False)
                self.down_proj = nn.Linear(shared, e, bias=False)
            else:
                self.gate_proj = self.up_proj = self.down_proj = None

    # -- the shared first half: queries and the new latents ---------------------------

    def _queries_and_latents(
        self, x: Tensor, rope: tuple[Tensor, Tensor], past: tuple[Tensor] | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """``q^C`` ``(B, H, L, dn)``, rotated ``q^R`` ``(B, H, L, dR)`` and the cache
        ``(B, 1, S, r + dR)`` with this call's tokens appended."""
        s = self.spec
        B, L, _ = x.shape
        H, r = s.num_heads, s.kv_lora_rank
        dn, dr = s.qk_nope_head_dim, s.qk_rope_head_dim
        if self.q_proj is not None:
            q = self.q_proj(x)
        else:  # low-rank query: down, RMSNorm, up
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(B, L, H, dn + dr).transpose(1, 2)  # (B, H, L, dn + dR)
        q_nope, q_rope = q.split((dn, dr), dim=-1)
        c, k_rope = self.kv_a_proj_with_mqa(x).split((r, dr), dim=-1)  # (B, L, r|dR)
        c = self.kv_a_layernorm(c)
        if s.rope_interleave:  # pairs (2i, 2i+1) -> (i, i + dR/2), then half layout
            perm = interleaved_to_half_permutation(dr).to(x.device)
            q_rope, k_rope = q_rope[..., perm], k_rope[..., perm]
        cos, sin = rope  # (B, L, dR/2): each row's positions
        q_rope = apply_rope(q_rope, cos, sin)  # (B, H, L, dR)
        k_rope = apply_rope(k_rope, cos, sin)  # (B, L, dR): one key for all heads
        latent = torch.cat((c, k_rope), dim=-1)[:, None]  # (B, 1, L, r + dR)
        if past is not None:
            latent = torch.cat((past[0], latent), dim=2)  # (B, 1, S, r + dR)
        return q_nope, q_rope, latent

    def _output(self, out: Tensor) -> Tensor:
        B, H, L, dv = out.shape  # (B, H, L, dv) -> (B, L, H * dv) -> (B, L, E)
        return self.o_proj(out.transpose(1, 2).reshape(B, L, H * dv))

    def _up(self) -> tuple[Tensor, Tensor]:
        """``W_UK`` ``(H, dn, r)`` and ``W_UV`` ``(H, dv, r)``: views of kv_b_proj."""
        s = self.spec
        w = self.kv_b_proj.weight.view(
            s.num_heads, s.qk_nope_head_dim + s.v_head_dim, s.kv_lora_rank
        )
        return w[:, : s.qk_nope_head_dim], w[:, s.qk_nope_head_dim :]

    # -- the two paths ---------------------------------------------------------------

    def attention_naive(
        self, q_nope: Tensor, q_rope: Tensor, latent: Tensor, mask: Tensor
    ) -> Tensor:
        r"""MLA by up-projecting the cache: per-head keys ``[c W_UK,h, k^R]`` and values
        ``c W_UV,h`` for all ``S`` tokens, then ordinary attention (Hugging Face's
        order of operations).

        Args:
            q_nope: the queries' content part ``(B, H, L, qk_nope_head_dim)``.
            q_rope: their rotated part ``(B, H, L, d_R)``.
            latent: the cache ``(B, 1, S, r + d_R)``: latents ``c``, then the rotated
                shared key ``k^R``.
            mask: additive float mask ``(B, 1, L, S)`` (see
                :class:`~companion.decoder.DecoderBlock`).

        Returns:
            Each head's output ``(B, H, L, v_head_dim)``, before ``o_proj``.
        """
        s = self.spec
        B, _, S, _ = latent.shape
        H, r, dn = s.num_heads, s.kv_lora_rank, s.qk_nope_head_dim
        kv = self.kv_b_proj(latent[:, 0, :, :r]).view(B, S, H, dn + s.v_head_dim)
        k_nope, v = kv.transpose(1, 2).split((dn, s.v_head_dim), dim=-1)  # (B, H, S, .)
        k_rope = latent[..., r:].expand(B, H, S, s.qk_rope_head_dim)  # shared by all
        q = torch.cat((q_nope, q_rope), dim=-1)  # (B, H, L, dn + dR)
        k = torch.cat((k_nope, k_rope), dim=-1)  # (B, H, S, dn + dR)
        return scaled_dot_product_attention(q, k, v, mask=mask, scale=self.scale)

    def attention_absorbed(
        self, q_nope: Tensor, q_rope: Tensor, latent: Tensor, mask: Tensor
    ) -> Tensor:
        r"""MLA on the latent cache directly: ``W_UK`` absorbed into the query,
        ``W_UV`` applied after the softmax.

        Head :math:`h`'s query becomes ``[q^C_h W_UK,h^T, q^R_h]`` (width
        :math:`r + d_R`); all :math:`H` heads, stacked along the query axis, attend to the
        cache ``[c, k^R]`` as one key head (multi-query attention, no key or value ever
        formed per head) with the latents :math:`c` as values; the weighted latent of
        head :math:`h` is then multiplied by :math:`W_{UV,h}^\top` and goes into
        ``o_proj``. Same arguments and results as :meth:`attention_naive`.
        """
        s = self.spec
        B, H, L, _ = q_nope.shape
        r = s.kv_lora_rank
        w_uk, w_uv = self._up()  # (H, dn, r), (H, dv, r)
        q_latent = torch.einsum("bhld,hdr->bhlr", q_nope, w_uk)  # (B, H, L, r)
        q = torch.cat((q_latent, q_rope), dim=-1)  # (B, H, L, r + dR)
        q = q.reshape(B, 1, H * L, r + s.qk_rope_head_dim)  # heads stacked: row hL + i
        if mask.shape[1] == 1:  # one (B, 1, L, S) mask for the H stacked heads
            mask = mask.repeat(1, 1, H, 1)  # (B, 1, H*L, S)
        else:  # a mask per head (B, H, L, S)
            mask = mask.reshape(B, 1, H * L, -1)
        key = latent  # (B, 1, S, r + dR): the cache itself, one key head
        value = latent[..., :r]  # (B, 1, S, r): the latents c
        o = scaled_dot_product_attention(q, key, value, mask=mask, scale=self.scale)
        o = o.view(B, H, L, r)  # each head's weighted latent
        return torch.einsum("bhlr,hvr->bhlv", o, w_uv)  # (B, H, L, dv)

    def attention(
        self,
        x: Tensor,
        rope: tuple[Tensor, Tensor] | None,
        mask: Tensor | None,
        past: tuple[Tensor] | None,
    ) -> tuple[Tensor, tuple[Tensor]]:
        """The queries and the latent cache, then :meth:`attention_absorbed` if
        ``absorbed``, else :meth:`attention_naive`, then ``o_proj``.

        Args:
            x: the normalized input ``(B, L, E)``.
            rope: ``(cos, sin)``, each ``(B, L, qk_rope_head_dim / 2)``.
            mask: additive float mask ``(B, 1, L, S)`` (see
                :class:`~companion.decoder.DecoderBlock`).
            past: ``None`` or this layer's cache ``((B, 1, S - L, r + d_R),)``.

        Returns:
            ``(out, present)``: ``(B, L, E)`` and the cache ``((B, 1, S, r + d_R),)``.
        """
        q_nope, q_rope, latent = self._queries_and_latents(x, rope, past)
        path = self.attention_absorbed if self.absorbed else self.attention_naive
        out = path(q_nope, q_rope, latent, mask)  # (B, H, L, dv)
        return self._output(out), (latent,)

    def _apply(self, fn, recurse: bool = True):
        """``to(dtype)`` and friends, keeping the router's correction bias in at least
        float32, as Hugging Face keeps ``e_score_correction_bias`` of a half-precision
        checkpoint (``_keep_in_fp32_modules_strict``): in bfloat16 its small
        differences between experts would round away."""
        module = super()._apply(fn, recurse)
        bias = getattr(self, "correction_bias", None)
        if bias is not None and bias.dtype in (torch.float16, torch.bfloat16):
            self.correction_bias = bias.float()
        return module

    def mlp(self, x: Tensor) -> Tensor:
        r"""The dense gated MLP (the parent's), or in a mixture-of-experts layer the
        routed experts plus the shared ones.

        Each token goes to the ``num_experts_per_tok`` experts :func:`route_tokens`
        chooses; expert :math:`e` is a gated MLP (``experts_gate_up[e]`` holds its gate
        rows then its up rows, ``experts_down[e]`` its down projection) and its output is
        weighted by the router's weight; the shared experts (one gated MLP of width
        ``moe_intermediate_size * n_shared_experts``) see every token. As Hugging Face's
        ``DeepseekV3MoE``.
        """
        if not self.moe:
            return super().mlp(x)
        s = self.spec
        act = ACTIVATIONS[s.activation]
        tokens = x.reshape(-1, x.shape[-1])  # (T, E)
        weights, chosen = route_tokens(
            tokens,
            self.router,
            self.correction_bias,
            top_k=s.num_experts_per_tok,
            n_group=s.n_group,
            topk_group=s.topk_group,
            norm_topk_prob=s.norm_topk_prob,
            routed_scaling_factor=s.routed_scaling_factor,
        )
        out = routed_experts(
            tokens, weights, chosen, self.experts_gate_up, self.experts_down, act
        ).view_as(x)
        if self.gate_proj is not None:
            out = out + super().mlp(x)  # the shared experts
        return out

    def check_past(self, past: object, batch: int) -> int:
        """This layer's cache checked; returns its length ``S``.

        A 1-tuple holding one tensor ``(batch, 1, S, kv_lora_rank + qk_rope_head_dim)``
        of the block's dtype and device (``TypeError``/``ValueError`` naming
        ``past[layer]``).
        """
        v, s, i = _validate, self.spec, self.layer
        ref = self.kv_b_proj.weight
        cache = v.sequence(
            f"past[{i}]",
            past,
            length=1,
            what=f"tensor (the latent cache of layer {i}, as decode returns it)",
        )
        name = f"past[{i}][0] (latent cache of layer {i})"
        t = v.tensor(name, cache[0], ndim=4, meaning="(B, 1, S, r + d_R)")
        v.same_dtype(name, t, "the model", ref)
        v.same_device(name, t, "the model", ref)
        v.size(name, t, 0, batch, "B, input_ids' batch")
        v.size(name, t, 1, 1, "one latent head")
        width = s.kv_lora_rank + s.qk_rope_head_dim
        v.size(name, t, 3, width, "kv_lora_rank + qk_rope_head_dim")
        return t.shape[2]


def use_absorbed(model: Decoder, absorbed: bool = True) -> Decoder:
    """Switch every :class:`MLABlock` of ``model`` to the absorbed (or naive) path.

    Args:
        model: a :class:`~companion.decoder.Decoder` whose layers are
            :class:`MLABlock` (``from_hf`` of a ``DeepseekV3ForCausalLM``).
        absorbed: ``True`` for :meth:`MLABlock.attention_absorbed`, ``False`` for
            :meth:`MLABlock.attention_naive`.

    Returns:
        ``model`` itself (changed in place); its cache is the same either way.
    """
    _validate.instance("model", model, Decoder, "a Decoder (from from_hf)")
    absorbed = _validate.flag("absorbed", absorbed)
    blocks = [b for b in model.blocks if isinstance(b, MLABlock)]
    if not blocks:
        raise ValueError(
            "model must have MLABlock layers (a DeepSeek-V3 copy), got "
            f"{type(model.blocks[0]).__name__} layers"
        )
    for block in blocks:
        block.absorbed = absorbed
    return model


# ---- cache size ------------------------------------------------------------------------

ATTENTION_KINDS = ("mha", "gqa", "mqa", "mla")
"""The cache layouts :func:`cache_bytes_per_token` sizes."""


def cache_bytes_per_token(
    config: object,
    attention: str = "mla",
    *,
    num_kv_heads: int | None = None,
    dtype: torch.dtype = torch.bfloat16,
) -> int:
    r"""Bytes a KV cache holds per token, all layers, for MLA and its MHA/GQA/MQA
    equivalents.

    From the sizes of an MLA config (a Hugging Face ``DeepseekV3Config``, or any object
    with its attribute names, or an :class:`MLASpec`), per layer:

    ``"mla"``
        ``kv_lora_rank + qk_rope_head_dim`` numbers: the latent and the shared rope key.
    ``"mha"``
        ``H * (qk_nope_head_dim + qk_rope_head_dim + v_head_dim)``: every head's key
        and value, the widths MLA's heads have (what the naive path up-projects).
    ``"gqa"``
        the same with ``num_kv_heads`` key/value heads (required, dividing ``H``).
    ``"mqa"``
        one key/value head.

    times the number of layers and the bytes of ``dtype``. DeepSeek-V3 (61 layers, 128
    heads, ``r = 512``, ``d_R = 64``, 128 + 64 + 128 wide heads) in bfloat16: 70 272
    bytes per token with MLA against 4 997 120 for MHA.

    Args:
        config: the sizes, as above.
        attention: one of :data:`ATTENTION_KINDS`.
        num_kv_heads: for ``"gqa"`` only: the key/value heads, a positive divisor of
            ``H``.
        dtype: the cache's dtype (bfloat16, as served; float32 doubles it).

    Returns:
        Bytes per token, an int.
    """
    kind = _validate.choice("attention", attention, ATTENTION_KINDS)
    dtype = _validate.dtype("dtype", dtype)
    dims = _sizes(config)
    width = dims["qk_nope_head_dim"] + dims["qk_rope_head_dim"] + dims["v_head_dim"]
    if kind == "gqa":
        groups = _validate.divisor(
            "num_kv_heads", num_kv_heads, "num_heads", dims["num_heads"]
        )
    elif num_kv_heads is not None:
        raise ValueError(
            f"num_kv_heads must be None unless attention='gqa', got {num_kv_heads!r} "
            f"with attention={kind!r}"
        )
    per_layer = {
        "mla": dims["kv_lora_rank"] + dims["qk_rope_head_dim"],
        "mha": dims["num_heads"] * width,
        "gqa": (groups if kind == "gqa" else 0) * width,
        "mqa": width,
    }[kind]
    size = torch.empty((), dtype=dtype).element_size()
    return dims["num_layers"] * per_layer * size


_CONFIG_NAMES = {  # the size -> (Hugging Face's attribute, MLASpec's)
    "num_layers": ("num_hidden_layers", "num_layers"),
    "num_heads": ("num_attention_heads", "num_heads"),
    "kv_lora_rank": ("kv_lora_rank", "kv_lora_rank"),
    "qk_rope_head_dim": ("qk_rope_head_dim", "qk_rope_head_dim"),
    "qk_nope_head_dim": ("qk_nope_head_dim", "qk_nope_head_dim"),
    "v_head_dim": ("v_head_dim", "v_head_dim"),
}


def _sizes(config: object) -> dict[str, int]:
    if isinstance(config, dict):
        raise TypeError(
            "config must be a config object (DeepseekV3Config or MLASpec), got a dict; "
            "pass types.SimpleNamespace(**d)"
        )
    dims = {}
    for size, names in _CONFIG_NAMES.items():
        value = next((getattr(config, n) for n in names if hasattr(config, n)), None)
        if value is None:
            raise ValueError(
                f"config must give {names[0]} (an MLA config such as DeepseekV3Config "
                f"or an MLASpec), got {type(config).__name__} without it"
            )
        dims[size] = _validate.positive_int(f"config.{names[0]}", value)
    return dims


# ---- reading DeepSeek-V3 from Hugging Face -------------------------------------------


def _spec_deepseek_v3(model: nn.Module) -> dict[str, Any]:
    c = model.config
    n = c.num_hidden_layers
    dense = n if c.first_k_dense_replace is None else c.first_k_dense_replace
    moe = {}
    if dense < n:  # layers dense .. n - 1 are mixtures of experts
        moe = dict(
            n_routed_experts=c.n_routed_experts,
            first_k_dense_replace=dense,
            moe_intermediate_size=c.moe_intermediate_size,
            num_experts_per_tok=c.num_experts_per_tok,
            n_group=c.n_group,
            topk_group=c.topk_group,
            n_shared_experts=c.n_shared_experts,
            norm_topk_prob=bool(c.norm_topk_prob),
            routed_scaling_factor=float(c.routed_scaling_factor),
        )
        for key in ("n_group", "topk_group", "num_experts_per_tok"):
            if moe[key] is None:
                raise unsupported(f"{key}=None in a DeepSeek-V3 MoE layer")
    heads = c.num_attention_heads
    if (c.num_key_value_heads or heads) != heads:
        raise unsupported(
            f"num_key_value_heads={c.num_key_value_heads} != num_attention_heads="
            f"{heads} in DeepSeek-V3 (Hugging Face's MLA repeats keys that already "
            "have one head per query head)"
        )
    dr, dn = c.qk_rope_head_dim, c.qk_nope_head_dim
    params = rope_parameters(c, dr)  # factors, L0, attention factors
    if params["rope_type"] not in MLA_ROPE_TYPES:
        raise unsupported(f"rope_type {params['rope_type']!r} in MLA")
    if float(params.get("partial_rotary_factor", 1.0)) != 1.0:
        raise unsupported(
            f"partial_rotary_factor {params['partial_rotary_factor']} in DeepSeek-V3"
        )
    return base_fields(
        model,
        "deepseek_v3",
        num_kv_heads=heads,
        head_dim=dn + dr,
        mlp_bias=False,
        rotary_dim=dr,
        rope=params,
        scales=(mla_softmax_scale(dn + dr, params),) * n,
        q_lora_rank=c.q_lora_rank,
        kv_lora_rank=c.kv_lora_rank,
        qk_rope_head_dim=dr,
        qk_nope_head_dim=dn,
        v_head_dim=c.v_head_dim,
        rope_interleave=bool(c.rope_interleave),
        **moe,
    )


def _load_deepseek_v3(dst: Decoder, model: nn.Module) -> None:
    """DeepSeek-V3's weights: every projection and norm copies as it is."""
    base = model.model
    dst.embed.weight.copy_(base.embed_tokens.weight)
    copy_norm(dst.final_norm, base.norm)
    for block, layer in zip(dst.blocks, base.layers, strict=True):
        a, m = layer.self_attn, layer.mlp
        copy_norm(block.norm1, layer.input_layernorm)
        copy_norm(block.norm2, layer.post_attention_layernorm)
        copy_linear(block, a, ("kv_a_proj_with_mqa", "kv_b_proj", "o_proj"))
        copy_norm(block.kv_a_layernorm, a.kv_a_layernorm)
        if a.q_proj is not None:
            copy_linear(block, a, ("q_proj",))
        else:
            copy_linear(block, a, ("q_a_proj", "q_b_proj"))
            copy_norm(block.q_a_layernorm, a.q_a_layernorm)
        if block.moe:  # routed experts, their router and bias, the shared experts
            copy_tensor(block.router, m.gate.weight)
            copy_tensor(block.correction_bias, m.gate.e_score_correction_bias)
            copy_tensor(block.experts_gate_up, m.experts.gate_up_proj)
            copy_tensor(block.experts_down, m.experts.down_proj)
            m = m.shared_experts
            if block.gate_proj is None:
                continue
        copy_linear(block, m, ("gate_proj", "up_proj", "down_proj"))
    copy_output(dst, model)


PORTS: dict[str, Port] = {
    "DeepseekV3ForCausalLM": Port(
        spec=_spec_deepseek_v3,
        load=_load_deepseek_v3,
        layers="model.layers",
        block=MLABlock,
        spec_type=MLASpec,
    )
}
"""The Hugging Face classes :func:`companion.decoder.from_hf` copies with latent
attention (it looks here when its own :data:`~companion.decoder.PORTS` lacks the class):
``DeepseekV3ForCausalLM``, dense and mixture-of-experts layers."""
