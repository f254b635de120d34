r"""The record every family of :mod:`companion.decoder` fills: :class:`DecoderSpec`,
checked field by field before a model is built, with the names it may hold
(``ROPE_TYPES``, ``ACTIVATIONS``, the norms, MLPs and layer types). Private:
:mod:`companion.decoder` documents and re-exports the names; ``companion._architecture``
builds the model from the record.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch.nn import functional as F

from companion import _validate
from companion.rope import LAYOUTS

__all__: list[str] = []  # private: companion.decoder documents and re-exports the names

ROPE_TYPES = (
    "default",
    "linear",
    "dynamic",
    "yarn",
    "llama3",
    "longrope",
    "proportional",
)
"""The RoPE scaling types (``rope_parameters["rope_type"]``) a copy follows, in every
family with RoPE (``longrope`` too, with the training length where Hugging Face reads
it; ``proportional``, Gemma 4's, is p-RoPE over the whole head with
``partial_rotary_factor`` as :math:`p`, frequencies divided by ``factor``)."""

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
"""Hugging Face's activation names (``hidden_act``) -> the same function in torch."""


# ---- what a copy is made of ----------------------------------------------------------


@dataclass(frozen=True)
class DecoderSpec:
    r"""Everything that tells the families apart, read from a Hugging Face config.

    A record: :func:`from_hf` fills it in from ``model.config`` after checking that the
    copy implements every option; the chapters print the families' specs side by
    side. ``positions`` is ``"rope"``, ``"alibi"`` or ``"learned"``; ``norm`` is
    ``"rms"`` or ``"layer"``; ``mlp`` is ``"gated"`` (``act(x W_gate) * x W_up``) or
    ``"plain"``; ``activation`` a key of ``ACTIVATIONS``; ``rope`` holds Hugging
    Face's ``rope_parameters`` (``rope_type``, ``rope_theta``, ``factor``, ...);
    ``rotary_dim`` is how many leading coordinates of each head RoPE turns; ``scales``
    is the score scale of each layer.

    The newer families add: ``rms_variant`` (``"llama"``, ``"torch"`` as OLMo 2,
    ``"gemma"``'s ``1 + w`` in float32, see :func:`companion.norm.rms_norm`);
    ``block_norms``: ``"pre"`` (``x + f(norm(x))``), ``"post"`` (OLMo 2:
    ``x + norm(f(x))``) or ``"sandwich"`` (Gemma 2/3: ``x + norm(f(norm(x)))``);
    ``qk_norm``: RMSNorm on queries and keys before RoPE, over each head's ``head_dim``
    (``"head"``: Qwen3, Gemma 3) or over the whole projection ``H * head_dim`` before
    the heads are split (``"projection"``: OLMo 2); ``embedding_scale`` multiplies the
    token embeddings (Gemma: :math:`\sqrt{E}` rounded to the model's dtype);
    ``sliding_window`` and ``layer_types`` (one per layer, ``"full_attention"`` or
    ``"sliding_attention"``; empty means all full): a sliding layer's query at slot
    ``i`` sees key slots ``j`` with ``0 <= i - j < sliding_window`` (Hugging Face's
    ``sliding_window_overlay``, slots counting padding) and caches only the last
    ``sliding_window - 1`` keys; ``local_rope`` the RoPE parameters of sliding layers
    (Gemma 3's local base), empty for ``rope``; ``attn_softcap`` and ``final_softcap``
    (Gemma 2's soft-capping :func:`companion.modern.softcap` of the scores before the
    mask and of the output logits; 0 for none).

    The RoPE/NoPE hybrids add: ``nope_layers``, the layers that do not rotate (NoPE:
    SmolLM3's ``no_rope_layers`` zeros, Cohere2's global layers), increasing indices;
    ``rope_layout``, which coordinates form a pair (:func:`companion.rope.apply_rope`'s
    ``"half"``, or ``"interleaved"`` as Cohere); ``shared_norm``: a parallel block's
    MLP reads the attention's normalized input (one norm per block, Cohere);
    ``layer_norm_bias``: LayerNorm's shift (Cohere's has none); ``logit_scale``
    multiplies the output logits (Cohere), before ``final_softcap``.

    Every field is checked when the record is made, before a model is built
    (``TypeError``/``ValueError`` naming the field): positive sizes, ``num_kv_heads``
    dividing ``num_heads``, the choices above, a positive ``eps``, bools for the
    switches, one positive scale per layer, a positive ``max_positions`` for a learned
    table; for RoPE an even ``2 <= rotary_dim <= head_dim``, a ``rope_type`` of
    ``ROPE_TYPES`` and the parameters that type reads.
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
    # Hugging Face's rope_parameters: rope_type, rope_theta, factor, ...
    rope: dict[str, Any] = field(default_factory=dict)
    scales: tuple[float, ...] = ()  # score scale per layer (GPT-2 may change it)
    rms_variant: str = "llama"  # companion.norm.rms_norm's variant for every RMSNorm
    block_norms: str = "pre"  # "pre", "post" (OLMo 2) or "sandwich" (Gemma 2/3)
    qk_norm: str = "none"  # "none", "head" (Qwen3, Gemma 3) or "projection" (OLMo 2)
    embedding_scale: float = 1.0  # Gemma: token embeddings times sqrt(hidden_size)
    sliding_window: int = 0  # keys a sliding layer sees, itself included (0: none)
    layer_types: tuple[str, ...] = ()  # per layer: "full_attention" (default) or
    # "sliding_attention"
    local_rope: dict[str, Any] = field(default_factory=dict)  # sliding layers' RoPE
    # parameters where they differ (Gemma 3's local base); empty: ``rope``
    attn_softcap: float = 0.0  # Gemma 2: cap * tanh(score / cap) before the mask
    final_softcap: float = 0.0  # Gemma 2: the same on the output logits
    nope_layers: tuple[int, ...] = ()  # layers that skip RoPE (SmolLM3, Cohere2)
    rope_layout: str = "half"  # RoPE's pairs: (i, i + R/2) or "interleaved" (Cohere)
    shared_norm: bool = False  # parallel block, one norm for both branches (Cohere)
    layer_norm_bias: bool = True  # LayerNorm's shift beta (Cohere's has none)
    logit_scale: float = 1.0  # Cohere: the output logits times this

    def __post_init__(self) -> None:
        _check_spec(self)


POSITIONS = ("rope", "alibi", "learned")
"""The position schemes a :class:`DecoderSpec` names (``positions``)."""
NORMS = ("rms", "layer")
"""The norms a :class:`DecoderSpec` names (``norm``)."""
MLPS = ("gated", "plain")
"""The MLP forms a :class:`DecoderSpec` names (``mlp``)."""
RMS_VARIANTS = ("llama", "torch", "gemma")
"""The RMSNorm variants a :class:`DecoderSpec` names (``rms_variant``)."""
BLOCK_NORMS = ("pre", "post", "sandwich")
"""Where a block's norms sit (``block_norms``)."""
QK_NORMS = ("none", "head", "projection")
"""The QK-norm forms (``qk_norm``)."""
LAYER_TYPES = ("full_attention", "sliding_attention")
"""The attention kinds of a layer (``layer_types``), Hugging Face's names."""


def _check_spec(spec: DecoderSpec) -> None:
    """Every field of ``spec`` checked (and normalised) before a model is built."""
    v = _validate

    def put(name: str, value: object) -> None:  # the record is frozen
        object.__setattr__(spec, name, value)

    v.instance("family", spec.family, str, "a str (the family's name)")
    if not spec.family:
        raise ValueError("family must be a non-empty str, got ''")
    for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "head_dim"):
        put(name, v.positive_int(name, getattr(spec, name)))
    put(
        "intermediate_size", v.positive_int("intermediate_size", spec.intermediate_size)
    )
    put(
        "num_kv_heads",
        v.divisor("num_kv_heads", spec.num_kv_heads, "num_heads", spec.num_heads),
    )
    v.choice("positions", spec.positions, POSITIONS)
    v.choice("norm", spec.norm, NORMS)
    put("eps", v.positive_real("eps", spec.eps))
    v.choice("mlp", spec.mlp, MLPS)
    v.choice("activation", spec.activation, ACTIVATIONS)
    for name in (
        "parallel_residual",
        "residual_from_norm",
        "embedding_norm",
        "tied_embeddings",
        "qkv_bias",
        "out_bias",
        "mlp_bias",
    ):
        put(name, v.flag(name, getattr(spec, name)))
    if spec.parallel_residual and spec.residual_from_norm:
        raise ValueError(
            "residual_from_norm must be False when parallel_residual is True (a "
            "parallel block adds both branches to its input x), got True"
        )
    put("max_positions", v.nonnegative_int("max_positions", spec.max_positions))
    put("rotary_dim", v.nonnegative_int("rotary_dim", spec.rotary_dim))
    v.instance("rope", spec.rope, dict, "a dict (Hugging Face's rope_parameters)")
    scales = v.sequence(
        "scales",
        spec.scales,
        length=spec.num_layers,
        what="score scales (one per layer, num_layers)",
    )
    put(
        "scales",
        tuple(v.positive_real(f"scales[{i}]", x) for i, x in enumerate(scales)),
    )
    if spec.positions == "learned":
        v.positive_int("max_positions", spec.max_positions)  # rows of the table
    v.choice("rms_variant", spec.rms_variant, RMS_VARIANTS)
    v.choice("block_norms", spec.block_norms, BLOCK_NORMS)
    if spec.block_norms != "pre" and (
        spec.parallel_residual or spec.residual_from_norm
    ):
        raise ValueError(
            f"block_norms must be 'pre' with parallel_residual or residual_from_norm "
            f"(GPT-NeoX's and BLOOM's pre-norm blocks), got {spec.block_norms!r}"
        )
    v.choice("qk_norm", spec.qk_norm, QK_NORMS)
    if spec.qk_norm != "none" and spec.norm != "rms":
        raise ValueError(
            f"qk_norm must be 'none' with norm {spec.norm!r} (QK-norm is an RMSNorm "
            f"of the model's rms_variant), got {spec.qk_norm!r}"
        )
    put("embedding_scale", v.positive_real("embedding_scale", spec.embedding_scale))
    for name in ("attn_softcap", "final_softcap"):
        put(name, v.real(name, getattr(spec, name), minimum=0.0))
    put("sliding_window", v.nonnegative_int("sliding_window", spec.sliding_window))
    types = v.sequence(
        "layer_types",
        spec.layer_types,
        what="layer types (one per layer, num_layers, or none for all full)",
    )
    if not types:
        types = ("full_attention",) * spec.num_layers
    v.sequence(
        "layer_types",
        types,
        length=spec.num_layers,
        what="layer types (one per layer, num_layers, or none for all full)",
    )
    put(
        "layer_types",
        tuple(
            v.choice(f"layer_types[{i}]", t, LAYER_TYPES) for i, t in enumerate(types)
        ),
    )
    sliding = "sliding_attention" in spec.layer_types
    if sliding != (spec.sliding_window > 0):
        raise ValueError(
            "sliding_window must be positive when a layer is 'sliding_attention' and 0 "
            f"when none is, got {spec.sliding_window} with layer_types "
            f"{sorted(set(spec.layer_types))}"
        )
    v.instance("local_rope", spec.local_rope, dict, "a dict (RoPE parameters)")
    if spec.local_rope and spec.positions != "rope":
        raise ValueError(
            f"local_rope must be empty with positions {spec.positions!r}, got "
            f"{spec.local_rope}"
        )
    if spec.positions == "rope":
        _check_rope(spec, "rope", spec.rope)
        if spec.local_rope:
            _check_rope(spec, "local_rope", spec.local_rope)
    _check_hybrid(spec, put)


def _check_hybrid(spec: DecoderSpec, put) -> None:
    """The fields of the RoPE/NoPE hybrids and of Cohere's block."""
    v, n = _validate, spec.num_layers
    nope = v.layer_indices("nope_layers", spec.nope_layers, n)
    if nope and spec.positions != "rope":
        raise ValueError(
            f"nope_layers must be empty with positions {spec.positions!r} (only RoPE "
            f"layers can skip RoPE), got {nope}"
        )
    put("nope_layers", nope)
    v.choice("rope_layout", spec.rope_layout, LAYOUTS)
    for name in ("shared_norm", "layer_norm_bias"):
        put(name, v.flag(name, getattr(spec, name)))
    if spec.shared_norm and not spec.parallel_residual:
        raise ValueError(
            "shared_norm must be False when parallel_residual is False (one norm "
            "feeds both branches of a parallel block), got True"
        )
    if not spec.layer_norm_bias and spec.norm != "layer":
        raise ValueError(
            f"layer_norm_bias must be True with norm {spec.norm!r} (only LayerNorm "
            "has a shift to drop), got False"
        )
    put("logit_scale", v.positive_real("logit_scale", spec.logit_scale))


def _check_rope(spec: DecoderSpec, field_name: str, p: dict[str, Any]) -> None:
    """The RoPE fields: ``rotary_dim`` and the parameters ``p`` of their type."""
    v = _validate
    v.integer(
        "rotary_dim", spec.rotary_dim, minimum=2, maximum=spec.head_dim, even=True
    )
    kind = v.choice(f"{field_name}['rope_type']", p.get("rope_type"), ROPE_TYPES)
    v.positive_real(f"{field_name}['rope_theta']", p.get("rope_theta"))
    if kind == "proportional":  # p-RoPE: p in [0, 1], factor optional (1)
        v.real(
            f"{field_name}['partial_rotary_factor']",
            p.get("partial_rotary_factor", 1.0),
            minimum=0.0,
            maximum=1.0,
        )
        v.optional(v.positive_real, f"{field_name}['factor']", p.get("factor"))
    elif kind != "default":
        v.positive_real(f"{field_name}['factor']", p.get("factor"))
    if kind in ("yarn", "llama3", "longrope"):
        v.positive_int(
            f"{field_name}['original_max_position_embeddings']",
            p.get("original_max_position_embeddings"),
        )
    if kind == "yarn":  # optional: Hugging Face's defaults when absent or None
        for key in ("beta_fast", "beta_slow", "attention_factor"):
            v.optional(v.positive_real, f"{field_name}['{key}']", p.get(key))
        v.optional(v.flag, f"{field_name}['truncate']", p.get("truncate"))
    if kind == "llama3":
        for key in ("low_freq_factor", "high_freq_factor"):
            v.positive_real(f"{field_name}['{key}']", p.get(key))
    if kind == "longrope":
        v.optional(
            v.positive_real,
            f"{field_name}['attention_factor']",
            p.get("attention_factor"),
        )
        for key in ("short_factor", "long_factor"):
            items = v.sequence(
                f"{field_name}['{key}']",
                p.get(key),
                length=spec.rotary_dim // 2,
                what="positive reals (one per pair, rotary_dim / 2)",
            )
            for i, x in enumerate(items):
                v.positive_real(f"{field_name}['{key}'][{i}]", x)
    if kind == "dynamic":
        v.positive_int("max_positions", spec.max_positions)  # the original context
        v.integer("rotary_dim", spec.rotary_dim, minimum=4)
