r"""Checkers for chapter 9 (:ref:`ch-modern`): sliding windows, padding, sinks and
porting a family (StableLM) through :class:`companion.decoder.Port`."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from companion import _validate, modern
from companion.checks._core import (
    Case,
    CheckError,
    CheckResult,
    Mistake,
    call,
    checker,
    expect_close,
    f64,
    tally,
)
from companion.decoder import DecoderSpec, Port, from_hf

__all__ = [
    "check_padding_position_ids",
    "check_receptive_field",
    "check_sink_cache_keep",
    "check_stablelm_port",
]


@checker
def check_receptive_field(receptive_field: Callable[..., object]) -> Iterator[Case]:
    r"""Check ``receptive_field(windows) -> int``: how far back a stack of sliding
    windows reaches.

    Reference: :func:`companion.modern.receptive_field`, :math:`\sum_l (W_l - 1)` for a
    list of windows (no global layers here); a window ``W`` lets query ``i`` see keys
    ``i - W + 1 .. i``. Any number type passes. Named mistakes: "window counted as W
    back" (:math:`\sum_l W_l`), "largest window only" (:math:`\max_l (W_l - 1)`), "windows
    multiplied" (:math:`\prod_l W_l`).

    Args:
        receptive_field: a function ``receptive_field(windows)``, ``windows`` a list of
            ints, one per layer.
    """
    for windows in ([4, 4, 4], [2, 5, 3], [4096] * 32, [1, 1], [7]):
        product = 1
        for w in windows:
            product *= w
        mistakes = [
            Mistake(
                "window counted as W back",
                "a window of W holds the query itself and W - 1 earlier tokens, so "
                "each layer reaches W - 1 further back: sum W - 1 over the layers.",
                f64(sum(windows)),
            ),
            Mistake(
                "largest window only",
                "each layer reads the previous layer's outputs, which already reach "
                "back: the reaches add up over the layers.",
                f64(max(w - 1 for w in windows)),
            ),
            Mistake(
                "windows multiplied",
                "the reaches add (a path moves back at most W - 1 per layer); they do "
                "not multiply.",
                f64(product),
            ),
        ]
        yield Case(
            "how many tokens back the top layer reaches",
            {"windows": windows},
            f64(modern.receptive_field(windows)),
            mistakes,
            atol=0.0,
            rtol=0.0,
        )


@checker
def check_sink_cache_keep(sink_cache_keep: Callable[..., object]) -> Iterator[Case]:
    r"""Check ``sink_cache_keep(length, sinks, window)``: the token indices a
    StreamingLLM cache keeps.

    Reference: :func:`companion.modern.sink_cache_keep`: the first ``sinks`` and the
    last ``window`` indices in increasing order, every index while
    ``length <= sinks + window``; a tensor, a NumPy array or a list of the indices
    passes (any number type). Named mistakes: "short stream not handled" (the
    first ``sinks`` and the last ``window`` taken from a stream no longer than
    ``sinks + window``), "sinks dropped" (only the last ``window``), "one token too many" (the last ``window + 1``), "sinks repeated" (the
    first tokens counted twice while the stream is short), "order reversed" (the
    indices in decreasing order).

    Args:
        sink_cache_keep: a function ``sink_cache_keep(length, sinks, window)``.
    """
    for length, sinks, window in (
        (20, 4, 8),
        (12, 4, 8),
        (5, 4, 8),
        (9, 2, 3),
        (30, 0, 5),
    ):
        right = modern.sink_cache_keep(length, sinks=sinks, window=window)
        recent = torch.arange(max(0, length - window), length)
        longer = torch.cat(
            [torch.arange(sinks), torch.arange(max(sinks, length - window - 1), length)]
        )
        repeated = torch.cat([torch.arange(min(sinks, length)), recent])
        short = length <= sinks + window
        # the long-stream rule applied to a short stream (no `if length <= ...`)
        unguarded = torch.cat(
            [torch.arange(sinks), torch.arange(length - window, length)]
        )
        mistakes = [
            Mistake(
                "short stream not handled",
                f"a stream of {length} tokens is no longer than sinks + window = "
                f"{sinks + window}: the cache keeps every token, 0 .. length - 1, each "
                "once; the first sinks and the last window apply only to longer "
                "streams.",
                unguarded,
            ),
            Mistake(
                "sinks dropped",
                f"keep the first {sinks} tokens (the attention sinks) as well as the "
                f"last {window}.",
                recent,
            ),
            Mistake(
                "one token too many",
                f"the window keeps the last {window} tokens: indices length - window .. "
                "length - 1.",
                longer,
            ),
            Mistake(
                "sinks repeated",
                "while the stream is shorter than sinks + window a token is both a sink "
                "and recent: keep it once (all the indices, in order).",
                repeated,
            ),
            Mistake(
                "order reversed",
                "return the indices in increasing order, the order of the tokens in the "
                "text (and in the cache).",
                right.flip(0),
            ),
        ]
        if not short or torch.equal(unguarded, right):
            mistakes = mistakes[1:]
        yield Case(
            "every token, while the stream is no longer than sinks + window"
            if short
            else "the first sinks and the last window tokens, in order",
            {"length": length, "sinks": sinks, "window": window},
            right,
            mistakes,
            atol=0.0,
            rtol=0.0,
        )


@checker
def check_padding_position_ids(
    padding_position_ids: Callable[..., object],
) -> Iterator[Case]:
    r"""Check ``padding_position_ids(attention_mask) -> (B, L)``: positions of a padded
    batch as Hugging Face's ``generate`` makes them.

    Reference: :func:`companion.modern.padding_position_ids`:
    ``cumsum(attention_mask) - 1`` along each row, 0 at padding. A tensor, a NumPy array
    or nested lists of the positions pass (any number type). Named mistakes: "padding
    ignored" (``0 .. L - 1`` in every row), "cumsum without the - 1" (the first real
    token at position 1), "padding not set to 0" (no fill: -1 before the first real
    token, the last position repeated after the last), "padding clamped at 0" (right
    padding keeps the last position), "padding set to 1".

    Args:
        padding_position_ids: a function ``(attention_mask (B, L) of 0/1) -> (B, L)``.
    """
    masks = (
        [[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1]],  # left padding
        [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]],  # right padding
        [[0, 1, 1, 1]],
    )
    for rows in masks:
        mask = torch.tensor(rows)
        cumsum = mask.cumsum(-1)
        mistakes = [
            Mistake(
                "padding ignored",
                "a row's first real token is at position 0 however much padding "
                "precedes it: count only the real tokens (a cumulative sum of the mask).",
                torch.arange(mask.shape[1]).expand_as(mask),
            ),
            Mistake(
                "cumsum without the - 1",
                "cumsum counts the first real token as 1; positions start at 0.",
                cumsum.masked_fill(mask == 0, 0),
            ),
            Mistake(
                "padding clamped at 0",
                "clamping cumsum - 1 at 0 fixes left padding only: padding after the "
                "last real token (right padding) must be 0 as well.",
                (cumsum - 1).clamp(min=0),
            ),
            Mistake(
                "padding not set to 0",
                "cumsum - 1 gives -1 at padding before the first real token and repeats "
                "the last position at padding after the last one; set every padding "
                "slot to 0, as Hugging Face does (their keys are masked anyway).",
                cumsum - 1,
            ),
            Mistake(
                "padding set to 1",
                "padding slots are 0 in Hugging Face's generate (transformers 5.23), "
                "not 1.",
                (cumsum - 1).masked_fill(mask == 0, 1),
            ),
        ]
        yield Case(
            "real tokens numbered 0, 1, ... in each row, 0 at padding",
            {"attention_mask": mask},
            modern.padding_position_ids(mask),
            mistakes,
            atol=0.0,
            rtol=0.0,
        )


# ---- porting StableLM ------------------------------------------------------------------


def _stablelm_port(mistake: str = "") -> Port:
    """The reference port of ``StableLmForCausalLM`` (``mistake`` names a wrong variant
    the checker recognizes)."""

    def spec(model: torch.nn.Module) -> dict:
        c = model.config
        for option in ("qk_layernorm", "use_parallel_residual"):
            if getattr(c, option) and mistake != "ignores " + option:
                raise ValueError(
                    f"model must not use {option}: this port does not implement it"
                )
        head_dim = c.hidden_size // c.num_attention_heads
        rope = dict(c.rope_parameters)
        partial = float(rope.pop("partial_rotary_factor", 1.0))
        if mistake == "theta":
            rope = {"rope_type": "default", "rope_theta": 10000.0}
        return dict(
            family="stablelm",
            vocab_size=c.vocab_size,
            hidden_size=c.hidden_size,
            num_layers=c.num_hidden_layers,
            num_heads=c.num_attention_heads,
            num_kv_heads=c.num_key_value_heads,
            head_dim=head_dim,
            intermediate_size=c.intermediate_size,
            positions="rope",
            norm="rms" if mistake == "rms" else "layer",
            eps={"eps": 1e-6, "eps fixed": 1e-5}.get(mistake, float(c.layer_norm_eps)),
            mlp="plain" if mistake == "plain" else "gated",
            activation="gelu" if mistake == "gelu" else c.hidden_act,
            parallel_residual=False,
            tied_embeddings=bool(c.tie_word_embeddings),
            qkv_bias=bool(c.use_qkv_bias),
            max_positions=c.max_position_embeddings,
            rotary_dim=head_dim if mistake == "full" else int(head_dim * partial),
            rope=rope,
            scales=(head_dim ** (-1.0 if mistake == "scale" else -0.5),)
            * c.num_hidden_layers,
        )

    def norm(dst: torch.nn.Module, src: torch.nn.Module) -> None:
        dst.weight.copy_(src.weight)
        if mistake not in ("rms", "bias"):
            dst.bias.copy_(src.bias)

    def load(copy: torch.nn.Module, model: torch.nn.Module) -> None:
        base = model.model
        copy.embed.weight.copy_(base.embed_tokens.weight)
        norm(copy.final_norm, base.norm)
        for block, layer in zip(copy.blocks, base.layers, strict=True):
            norm(block.norm1, layer.input_layernorm)
            norm(block.norm2, layer.post_attention_layernorm)
            for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                src, dst = getattr(layer.self_attn, name), getattr(block, name)
                dst.weight.copy_(src.weight)
                if src.bias is not None:
                    dst.bias.copy_(src.bias)
            for name in ("gate_proj", "up_proj", "down_proj"):
                getattr(block, name).weight.copy_(getattr(layer.mlp, name).weight)
        if not copy.spec.tied_embeddings:
            copy.lm_head.weight.copy_(model.lm_head.weight)

    return Port(spec=spec, load=load, layers="model.layers")


# A weight the model has and the learner's copy lacks -> the spec field that makes it.
_MISSING_HINTS = (
    (
        "gate_proj",
        "StableLM's MLP is gated (mlp='gated'), so the copy needs a gate_proj",
    ),
    (
        "_proj.bias",
        "the copy's q/k/v projections need biases: qkv_bias from use_qkv_bias",
    ),
    ("norm", "StableLM's norms are LayerNorms with a bias (norm='layer')"),
    ("lm_head", "an untied lm_head: tied_embeddings from tie_word_embeddings"),
)


def _missing_hint(port: Port, model: torch.nn.Module) -> str:
    """Which weights of the reference copy the learner's copy lacks, in words ('' when
    none is missing or the learner's spec itself fails)."""
    from companion.decoder import Decoder

    try:
        theirs = Decoder(port.spec_type(**port.spec(model)), block=port.block)
    except Exception:  # the learner's spec may raise anything; the caller reports it
        return ""
    ours = Decoder(DecoderSpec(**_stablelm_port().spec(model)))
    missing = sorted(set(ours.state_dict()) - set(theirs.state_dict()))
    if not missing:
        return ""
    for pattern, why in _MISSING_HINTS:
        if any(pattern in name for name in missing):
            return f" - the copy has no {missing[0]}, which the model has: {why}"
    return f" - the copy has no {missing[0]}, which the model has: check the spec"


_STABLELM_CASES = {
    "StableLM defaults (a quarter of each head rotated), 2 layers, GQA": {},
    "q/k/v biases, half of each head rotated, tied embeddings": dict(
        use_qkv_bias=True, partial_rotary_factor=0.5, tie_word_embeddings=True
    ),
    "layer_norm_eps 1e-2, RoPE base 100, half of each head rotated": dict(
        layer_norm_eps=1e-2,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 100.0,
            "partial_rotary_factor": 0.5,
        },
    ),
}

_STABLELM_REFUSED = ("qk_layernorm", "use_parallel_residual")
"""Options the exercise's port refuses by name: a model with one of them set must make
``from_hf`` raise a ``ValueError`` that names it."""

_STABLELM_MISTAKES = {
    "full": (
        "RoPE on the whole head",
        "StableLM rotates only the first partial_rotary_factor * head_dim coordinates "
        "of each head (rope_parameters['partial_rotary_factor']): set rotary_dim.",
    ),
    "rms": (
        "RMSNorm instead of LayerNorm",
        "StableLM's norms are LayerNorms with a bias (norm='layer'), not RMSNorm.",
    ),
    "bias": (
        "LayerNorm biases not copied",
        "copy each LayerNorm's bias as well as its weight (input_layernorm, "
        "post_attention_layernorm and the final norm).",
    ),
    "scale": (
        "score scale 1/D",
        "the scores are scaled by 1/sqrt(head_dim), not 1/head_dim: "
        "scales=(head_dim ** -0.5,) * num_layers.",
    ),
    "eps": (
        "norm eps not layer_norm_eps",
        "the LayerNorms use config.layer_norm_eps (1e-5 by default), not 1e-6.",
    ),
    "eps fixed": (
        "norm eps hard-coded",
        "read eps from config.layer_norm_eps: it is 1e-5 by default, but a config may "
        "set another value.",
    ),
    "theta": (
        "RoPE base hard-coded",
        "read the RoPE base from config.rope_parameters['rope_theta'] (10000 by "
        "default, but a config may set another): pass the other entries as rope.",
    ),
    "gelu": (
        "GELU instead of hidden_act",
        "the gated MLP's activation is config.hidden_act (SiLU by default).",
    ),
}


def _stablelm_model(seed: int, **overrides: object) -> torch.nn.Module:
    """A small random StableLM whose every weight (norm biases included) is nonzero."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore")
        from transformers import StableLmConfig, StableLmForCausalLM

        config = StableLmConfig(
            vocab_size=50,
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            **overrides,
        )
        gen = torch.Generator().manual_seed(seed)
        model = StableLmForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return model


def check_stablelm_port(stablelm_port: object) -> CheckResult:
    r"""Check ``stablelm_port() -> Port``: a :class:`companion.decoder.Port` for
    Hugging Face's ``StableLmForCausalLM``.

    On three small random StableLM models (transformers' defaults: a quarter of each
    head rotated, LayerNorm with biases, a gated SiLU MLP, grouped-query attention; then
    with q/k/v biases, half of each head rotated and tied embeddings; then with
    ``layer_norm_eps = 1e-2`` and a RoPE base of 100, so that values hard-coded from the
    defaults fail), every weight perturbed so that each one matters,
    ``from_hf(model, port=stablelm_port())`` must give Hugging Face's logits within
    ``1e-4``; and on a model with ``qk_layernorm`` and one with
    ``use_parallel_residual``, ``from_hf`` must raise a ``ValueError`` naming the
    option. Named mistakes: "RoPE on the whole head", "RMSNorm instead of LayerNorm",
    "LayerNorm biases not copied", "score scale 1/D", "norm eps not layer_norm_eps",
    "norm eps hard-coded", "RoPE base hard-coded", "GELU instead of hidden_act"; a load
    that copies into a weight the copy lacks (a bias, ``gate_proj``) is told which one
    and which spec field makes it.

    Args:
        stablelm_port: a function of no arguments returning the port.

    Returns:
        A ``CheckResult``, true after printing "✓ ..." when all five cases pass; false, after
        printing "not attempted yet", for the exercise's stub.

    Raises:
        CheckError: naming what differs from Hugging Face's logits.
    """
    check = "check_stablelm_port"
    _validate.callable_("stablelm_port", stablelm_port)

    def passed() -> Iterator[None]:
        for seed, (prop, overrides) in enumerate(_STABLELM_CASES.items()):
            model = _stablelm_model(seed, **overrides)
            shown = {"model": f"StableLmForCausalLM({prop})"}
            port = call(stablelm_port, check, {})
            if not isinstance(port, Port):
                raise CheckError(
                    check,
                    "returns a Port",
                    "stablelm_port()",
                    "Return companion.decoder.Port(spec=..., load=..., "
                    "layers='model.layers').",
                    expected="a Port",
                    got=_validate.describe(port),
                )
            ids = torch.randint(50, (2, 9), generator=torch.Generator().manual_seed(7))
            try:
                copy = from_hf(model, port=port)
            except Exception as exc:  # the learner's spec or load may raise anything
                hint = (
                    _missing_hint(port, model)
                    if isinstance(exc, AttributeError) and "NoneType" in str(exc)
                    else ""
                )
                raise CheckError(
                    check,
                    "from_hf builds the copy",
                    shown["model"],
                    f"from_hf(model, port=stablelm_port()) raised "
                    f"{type(exc).__name__}: {exc}{hint}",
                ) from exc
            with torch.no_grad():
                got, want = copy(ids), model(ids).logits
                mistakes = [
                    Mistake(name, why, from_hf(model, port=_stablelm_port(key))(ids))
                    for key, (name, why) in _STABLELM_MISTAKES.items()
                ]
            expect_close(
                got,
                want,
                check=check,
                prop=f"logits equal to Hugging Face's: {prop}",
                inputs=shown,
                atol=1e-4,
                rtol=1e-4,
                mistakes=mistakes,
            )
            yield None
        for seed, option in enumerate(_STABLELM_REFUSED, start=len(_STABLELM_CASES)):
            model = _stablelm_model(seed, **{option: True})
            shown = f"StableLmForCausalLM({option}=True)"
            port = call(stablelm_port, check, {})
            prop = f"refuses {option} by name"
            try:
                from_hf(model, port=port)
            except ValueError as exc:
                if option not in str(exc):
                    raise CheckError(
                        check,
                        prop,
                        shown,
                        f"the ValueError must name {option}, so that the user knows "
                        f"which option the copy lacks; it says: {exc}",
                    ) from exc
            except Exception as exc:  # the learner's spec or load may raise anything
                raise CheckError(
                    check,
                    prop,
                    shown,
                    f"spec must raise a ValueError naming {option} before anything is "
                    f"copied; from_hf raised {type(exc).__name__}: {exc}",
                ) from exc
            else:
                raise CheckError(
                    check,
                    prop,
                    shown,
                    f"the port copied a model with {option}=True, which the copy does "
                    f"not implement: spec must raise a ValueError naming {option}.",
                )
            yield None

    return tally(check, passed())
