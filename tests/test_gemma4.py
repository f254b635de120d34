"""Gemma 4's ``proportional`` RoPE (issue 34) in companion.decoder's copies, against
Hugging Face transformers (the oracle), on small random configs (no download).

``proportional`` is p-RoPE over the whole head: the fastest ``int(p * D // 2)`` pairs
turn with RoPE's frequencies ``b^(-2i/D)``, the others not at all, every frequency
divided by ``factor`` (``partial_rotary_factor`` is ``p``, not a rotary width). The
reader maps it to :func:`companion.rope_variants.p_rope_frequencies`, whose pair count
is Hugging Face's (tests/test_rope_variants.py checks it on a grid). Here: the inverse
frequencies equal Hugging Face's (float32 rounding), a tiny Llama with the issue's
head (D = 24, p = 0.3: 3 pairs turn) and a Gemma 3 with proportional RoPE in its full
layers (Gemma 4's RoPE sets) give Hugging Face's logits within 1e-4 on 30 tokens (six
windows of 5) and its 20 greedy KV-cache tokens, for one prompt and a left-padded
batch; the same weights read with the rounded count (4 pairs) or without the factor
move the logits, so the comparison can fail; bad parameters raise naming the key.

Gemma 4's text model (``Gemma4ForCausalLM``, companion.gemma4.PORTS) on tiny configs
(4 layers, window 5, proportional RoPE p = 0.25 in the full layers, layer scalars set
away from 1): the same logits, greedy tokens, left-padded batch and EOS checks, with
``attention_k_eq_v`` on and off, and in bfloat16 within twice Hugging Face's own
bfloat16-float32 distance; a copy without the value norm, with its own values
in the keys-as-values layers or without the layer scalars moves the logits; what the
copy does not implement (per-layer inputs, experts) is refused by name. The
full layers may be wider, with fewer key/value heads (``global_head_dim``,
``num_global_key_value_heads``, as the published configs): each block is built from its
layer's spec and the RoPE table of each layer type from its head width.

Shared keys and values (``num_kv_shared_layers``) on six layers, the last three reusing
(sliding layers 3 and 5 read layer 2's keys, full layer 4 layer 1's), with and without
the double-wide MLP, keys as values and wider full layers: the same logits, greedy
tokens, left-padded batch, EOS and bfloat16 checks; the reusing layers have no key or
value weights (as many parameters as Hugging Face's) and keep no cache; a copy whose
sliding layers read layer 0's keys moves the logits; bad caches and specs are refused.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

pytest.importorskip("transformers")

import transformers
from test_decoder import (
    NEW,
    PROMPT,
    TOL,
    assert_bfloat16_within_rounding,
    randomize,
    tokens,
)
from test_decoder_modern import (
    BASE,
    WINDOW,
    assert_padded_batch_with_eos_matches,
    hf_generate,
    hf_logits,
    left_padded,
)

from companion import families, gemma4
from companion.decoder import (
    PORTS,
    Decoder,
    DecoderBlock,
    DecoderSpec,
    cache_bytes,
    from_hf,
    generate,
)
from companion.rope_variants import p_rope_frequencies

transformers.logging.set_verbosity_error()

T = transformers
LENGTH = 30  # six windows of 5


def _proportional(p: float, factor: float = 1.0, base: float = 100.0) -> dict:
    return {
        "rope_type": "proportional",
        "rope_theta": base,
        "partial_rotary_factor": p,
        "factor": factor,
    }


_LLAMA = dict(BASE, hidden_size=48, num_attention_heads=2, num_key_value_heads=1)
CONFIGS = {
    "llama-p0.3": (  # the head: D = 24, p = 0.3 -> 3 pairs (rounding: 4)
        T.LlamaForCausalLM,
        T.LlamaConfig(**_LLAMA, head_dim=24, rope_parameters=_proportional(0.3)),
    ),
    "llama-p0.3-factor2": (
        T.LlamaForCausalLM,
        T.LlamaConfig(**_LLAMA, head_dim=24, rope_parameters=_proportional(0.3, 2.0)),
    ),
    "gemma3-proportional-global": (  # Gemma 4's RoPE sets: p-RoPE in the full layers
        T.Gemma3ForCausalLM,
        T.Gemma3TextConfig(
            **BASE,
            head_dim=24,
            sliding_window=WINDOW,
            query_pre_attn_scalar=16,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                "full_attention": _proportional(0.3, base=1000.0),
            },
            tie_word_embeddings=False,
        ),
    ),
}


def _gemma4(**kw) -> tuple:
    cfg = dict(
        BASE,
        num_hidden_layers=4,
        head_dim=16,
        global_head_dim=16,  # Hugging Face's default 512 (copied, but slow here)
        sliding_window=WINDOW,
        layer_types=["sliding_attention", "full_attention"] * 2,
        hidden_size_per_layer_input=0,  # Hugging Face's default 256: refused
        final_logit_softcapping=30.0,
        tie_word_embeddings=False,  # tied: greedy repeats the input token
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
            "full_attention": _proportional(0.25, base=1000.0),
        },
    )
    return T.Gemma4ForCausalLM, T.Gemma4TextConfig(**{**cfg, **kw})


_SHARED_TYPES = [  # the last 3 reuse: layer 3 and 5 read layer 2's, layer 4 layer 1's
    "sliding_attention",
    "full_attention",
    "sliding_attention",
    "sliding_attention",
    "full_attention",
    "sliding_attention",
]
GEMMA4 = {
    "gemma4": _gemma4(),
    "gemma4-k-eq-v": _gemma4(attention_k_eq_v=True),
    "gemma4-wide-global": _gemma4(  # the published shape: wider full layers, 1 KV head
        global_head_dim=32, attention_k_eq_v=True, num_global_key_value_heads=1
    ),
    "gemma4-kv-shared": _gemma4(
        num_hidden_layers=6, layer_types=_SHARED_TYPES, num_kv_shared_layers=3
    ),
    "gemma4-kv-shared-wide": _gemma4(  # with every other Gemma 4 difference
        num_hidden_layers=6,
        layer_types=_SHARED_TYPES,
        num_kv_shared_layers=3,
        use_double_wide_mlp=True,
        global_head_dim=32,
        attention_k_eq_v=True,
        num_global_key_value_heads=1,
    ),
}
SHARED = [name for name in GEMMA4 if "kv-shared" in name]
CONFIGS.update(GEMMA4)


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


def build(name: str, seed: int = 0) -> torch.nn.Module:
    cls, cfg = CONFIGS[name]
    torch.manual_seed(seed)
    model = randomize(cls(copy.deepcopy(cfg)), seed).eval()
    if name in GEMMA4:  # a buffer randomize leaves at 1: each layer its own scalar
        with torch.no_grad():
            for i, layer in enumerate(model.model.layers):
                layer.layer_scalar.fill_(0.5 + 0.25 * i)
    if name in SHARED:
        _stand_in_per_layer_inputs(model)
    return model


def _stand_in_per_layer_inputs(model: torch.nn.Module) -> None:
    """transformers 5.23's shortcut before the reusing layers (run only the positions
    whose logits are kept: every one in a forward, the last in generate) slices
    ``per_layer_inputs``, which is ``None`` in a model without per-layer inputs, and
    raises ``TypeError``. Given an empty stand-in ``(B, L, layers, 0)``, which such a
    model never reads, Hugging Face's own shortcut runs unchanged."""
    inner = model.model._maybe_slice_kv_shared_inputs
    layers = model.config.num_hidden_layers

    def shortcut(hidden, per_layer, *args, **kwargs):
        if per_layer is None:
            per_layer = hidden.new_zeros(*hidden.shape[:2], layers, 0)
        return inner(hidden, per_layer, *args, **kwargs)

    model.model._maybe_slice_kv_shared_inputs = shortcut


def hf_inv_freq(hf: torch.nn.Module, layer_type: str | None = None) -> torch.Tensor:
    rotary = hf.model.rotary_emb
    if layer_type is None:
        return rotary.inv_freq
    return getattr(rotary, f"{layer_type}_inv_freq")


# ---- the reader: rope_type proportional is p-RoPE -------------------------------------


@pytest.mark.parametrize("name", [n for n in CONFIGS if n not in GEMMA4])
def test_proportional_is_read_as_p_rope_with_hugging_faces_frequencies(name) -> None:
    hf = build(name)
    spec = from_hf(hf).spec
    assert spec.rotary_dim == spec.head_dim == 24  # over the whole head, not 0.3 of it
    p = spec.rope
    assert p["rope_type"] == "proportional" and p["partial_rotary_factor"] == 0.3
    ours = p_rope_frequencies(24, 0.3, base=p["rope_theta"]) / p["factor"]
    hf_freq = hf_inv_freq(hf, "full_attention" if "gemma3" in name else None)
    assert int((hf_freq > 0).sum()) == int((ours > 0).sum()) == 3
    torch.testing.assert_close(ours.float(), hf_freq, rtol=1e-6, atol=0.0)
    if "gemma3" in name:  # the sliding layers keep plain RoPE
        assert spec.local_rope["rope_type"] == "default"


# ---- the oracle: logits and greedy tokens --------------------------------------------


@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_match_hugging_face(name: str) -> None:
    hf = build(name)
    ours = from_hf(hf)
    ids = tokens(2, LENGTH)
    ref = hf_logits(hf, ids)
    with torch.no_grad():
        gap = (ours(ids) - ref).abs().max().item()
    assert gap < TOL, gap
    assert ref.abs().max().item() > 1.0  # logits far from zero: the gap is relative


@pytest.mark.parametrize("name", list(CONFIGS))
def test_left_padded_logits_match_hugging_face(name: str) -> None:
    hf = build(name)
    ours = from_hf(hf)
    ids, mask = left_padded([LENGTH, 17, 6], LENGTH)
    ref = hf_logits(hf, ids, mask)
    with torch.no_grad():
        out = ours(ids, attention_mask=mask)
    keep = mask.bool()
    gap = (out[keep] - ref[keep]).abs().max().item()
    assert gap < TOL, gap


@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_tokens_match_hugging_face_generate(name: str) -> None:
    hf = build(name)
    ours = from_hf(hf)
    ids = tokens(1, PROMPT)
    expected = hf_generate(hf, ids, torch.ones_like(ids))
    got = generate(ours, ids, max_new_tokens=NEW)
    assert torch.equal(got, expected)
    assert len(set(got[0, PROMPT:].tolist())) > 2  # not one repeated token
    ids, mask = left_padded([PROMPT, 7, 3], PROMPT)
    expected = hf_generate(hf, ids, mask)
    got = generate(ours, ids, max_new_tokens=NEW, attention_mask=mask)
    assert torch.equal(got, expected)


# ---- the comparison can fail ---------------------------------------------------------


def _with_rope(model: Decoder, rope: dict) -> Decoder:
    spec = dataclasses.replace(model.spec, rope=rope)
    other = Decoder(spec)
    other.load_state_dict(model.state_dict())
    return other.eval()


def test_the_rounded_count_or_a_dropped_factor_moves_the_logits() -> None:
    for name, wrong in (
        ("llama-p0.3", {"partial_rotary_factor": 4 / 12}),  # 4 pairs, the old count
        ("llama-p0.3-factor2", {"factor": 1.0}),
    ):
        hf = build(name)
        ours = from_hf(hf)
        other = _with_rope(ours, {**ours.spec.rope, **wrong})
        ids = tokens(2, LENGTH)
        ref = hf_logits(hf, ids)
        with torch.no_grad():
            assert (ours(ids) - ref).abs().max().item() < TOL
            assert (other(ids) - ref).abs().max().item() > 1e-2, name


# ---- bad parameters ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (
            {"partial_rotary_factor": 1.5},
            r"rope\['partial_rotary_factor'\] must be .*1.*got 1\.5",
        ),
        ({"partial_rotary_factor": "half"}, r"rope\['partial_rotary_factor'\]"),
        ({"factor": -1.0}, r"rope\['factor'\] must be a real number > 0, got -1\.0"),
        ({"rope_theta": 0.0}, r"rope\['rope_theta'\]"),
    ],
)
def test_bad_proportional_parameters_are_refused_by_name(change, match) -> None:
    spec = from_hf(build("llama-p0.3")).spec
    with pytest.raises((ValueError, TypeError), match=match):
        DecoderSpec(**{**dataclasses.asdict(spec), "rope": {**spec.rope, **change}})


# ---- Gemma 4 (text) ------------------------------------------------------------------


def test_gemma4_is_found_and_reads_its_block() -> None:
    assert set(gemma4.PORTS) == {"Gemma4ForCausalLM"}
    assert not set(gemma4.PORTS) & (set(PORTS) | set(families.HYBRID_PORTS))
    for name, kv_from_keys in (
        ("gemma4", ()),
        ("gemma4-k-eq-v", (1, 3)),
        ("gemma4-wide-global", (1, 3)),
    ):
        hf = build(name)
        ours = from_hf(hf)
        spec = ours.spec
        assert isinstance(spec, gemma4.Gemma4Spec)
        assert spec.kv_from_keys == kv_from_keys
        assert spec.scales == (1.0,) * 4 and spec.rms_variant == "torch"
        assert spec.rope["rope_type"] == "proportional"
        assert spec.local_rope["rope_type"] == "default"
        assert spec.layer_types == tuple(hf.config.layer_types)
        assert spec.final_softcap == 30.0 and spec.embedding_scale == 32**0.5
        for i, (block, layer) in enumerate(
            zip(ours.blocks, hf.model.layers, strict=True)
        ):
            shared = block.v_proj.source is block.k_proj
            assert shared == (layer.self_attn.v_proj is None) == (i in kv_from_keys)
            assert block.layer_scalar.item() == 0.5 + 0.25 * i
        # HF's proportional frequencies in the full layers: p = 0.25 of the pairs
        freq = hf.model.rotary_emb.full_attention_inv_freq
        d = 2 * freq.numel()
        assert int((freq > 0).sum()) == d // 8
        ours_freq = p_rope_frequencies(d, 0.25, base=1000.0)
        torch.testing.assert_close(ours_freq.float(), freq, rtol=1e-6, atol=0.0)


@pytest.mark.parametrize("name", list(GEMMA4))
def test_gemma4_a_padded_batch_with_eos_matches_up_to_each_rows_eos(name) -> None:
    assert_padded_batch_with_eos_matches(build, name)


def _without(model: Decoder, what: str) -> Decoder:
    other = copy.deepcopy(model)
    for i, block in enumerate(other.blocks):
        if what == "value norm":
            block.v_proj.forward = block.v_proj.source.forward
        elif what == "layer scalars":
            block.layer_scalar.fill_(1.0)
        elif what == "own values" and i in other.spec.kv_from_keys:
            torch.manual_seed(i)
            own = torch.nn.Linear(block.k_proj.in_features, block.k_proj.out_features)
            block.v_proj.source = own.to(block.k_proj.weight.dtype)
    return other


@pytest.mark.parametrize(
    ("name", "what"),
    [
        ("gemma4", "value norm"),
        ("gemma4", "layer scalars"),
        ("gemma4-k-eq-v", "own values"),
    ],
)
def test_gemma4_each_difference_moves_the_logits(name: str, what: str) -> None:
    hf = build(name)
    ours = from_hf(hf)
    other = _without(ours, what)
    ids = tokens(2, LENGTH)
    ref = hf_logits(hf, ids)
    with torch.no_grad():
        assert (ours(ids) - ref).abs().max().item() < TOL
        assert (other(ids) - ref).abs().max().item() > 1e-2, what


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"hidden_size_per_layer_input": 8}, r"hidden_size_per_layer_input=8"),
        (
            {
                "enable_moe_block": True,
                "num_experts": 2,
                "top_k_experts": 1,
                "moe_intermediate_size": 8,
            },
            r"enable_moe_block=True",
        ),
    ],
)
def test_gemma4_refuses_what_it_does_not_copy(change, match) -> None:
    cls, cfg = _gemma4(**change)
    torch.manual_seed(0)
    hf = cls(cfg).eval()
    with pytest.raises(ValueError, match=match + r".* not supported by companion"):
        from_hf(hf)


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        ((3, 1), ValueError, r"kv_from_keys must be increasing layer indices"),
        ((4,), ValueError, r"kv_from_keys\[0\] must be an int <= 3, got 4"),
        ("1", TypeError, r"kv_from_keys must be a tuple or list"),
    ],
)
def test_gemma4_spec_checks_kv_from_keys(value, error, match) -> None:
    spec = from_hf(build("gemma4")).spec
    fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
    with pytest.raises(error, match=match):
        gemma4.Gemma4Spec(**{**fields, "kv_from_keys": value})


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        ({"global_head_dim": 33}, ValueError, r"global_head_dim must be even .*got 33"),
        ({"global_head_dim": -2}, ValueError, r"global_head_dim must be"),
        ({"global_kv_heads": 3}, ValueError, r"global_kv_heads"),
        ({"global_kv_heads": 1.5}, TypeError, r"global_kv_heads"),
    ],
)
def test_gemma4_spec_checks_the_global_sizes(change, error, match) -> None:
    spec = from_hf(build("gemma4")).spec
    fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
    with pytest.raises(error, match=match):
        gemma4.Gemma4Spec(**{**fields, **change})


def test_gemma4_full_layers_have_their_own_head_width() -> None:
    hf = build("gemma4-wide-global")
    ours = from_hf(hf)
    spec = ours.spec
    assert (spec.head_dim, spec.num_kv_heads) == (16, 2)
    assert (spec.global_head_dim, spec.global_kv_heads) == (32, 1)
    for i, block in enumerate(ours.blocks):
        full = hf.config.layer_types[i] == "full_attention"
        assert block.spec.head_dim == (32 if full else 16) == block.spec.rotary_dim
        assert block.spec.num_kv_heads == (1 if full else 2)
        assert (
            block.q_proj.weight.shape
            == hf.model.layers[i].self_attn.q_proj.weight.shape
        )
    # HF's full-layer RoPE: p = 0.25 of 16 pairs over D = 32 turn (4), ours the same
    freq = hf.model.rotary_emb.full_attention_inv_freq
    ours_freq = p_rope_frequencies(32, 0.25, base=1000.0)
    assert int((freq > 0).sum()) == int((ours_freq > 0).sum()) == 4
    torch.testing.assert_close(ours_freq.float(), freq, rtol=1e-6, atol=0.0)


@pytest.mark.parametrize("name", list(GEMMA4))
def test_gemma4_bfloat16_copy_is_as_close_to_hugging_face_as_its_rounding(name) -> None:
    assert_bfloat16_within_rounding(build, name, LENGTH)


# ---- Gemma 4's shared keys and values (num_kv_shared_layers) --------------------------


def test_hugging_face_without_the_stand_in_fails_as_the_helper_says() -> None:
    # the reason for _stand_in_per_layer_inputs: without it transformers 5.23 raises
    cls, cfg = CONFIGS["gemma4-kv-shared"]
    torch.manual_seed(0)
    hf = cls(copy.deepcopy(cfg)).eval()
    with torch.no_grad(), pytest.raises(TypeError, match="not subscriptable"):
        hf(tokens(1, 8))
    _stand_in_per_layer_inputs(hf)
    with torch.no_grad():
        assert hf(tokens(1, 8)).logits.shape == (1, 8, cfg.vocab_size)


@pytest.mark.parametrize("name", SHARED)
def test_gemma4_reusing_layers_have_no_keys_or_values_of_their_own(name) -> None:
    hf = build(name)
    ours = from_hf(hf)
    spec = ours.spec
    modes = [spec.kv_sharing(i) for i in range(spec.num_layers)]
    assert modes == list(hf.config.kv_sharing_modes)
    assert modes == [None, "store", "store", "reuse", "reuse", "reuse"]
    assert spec.kv_shared_layers == 3
    double = hf.config.use_double_wide_mlp
    for i, (block, layer) in enumerate(zip(ours.blocks, hf.model.layers, strict=True)):
        reuses = modes[i] == "reuse"
        assert block.sharing == modes[i]
        assert (block.k_proj is None) == (block.v_proj is None) == reuses
        assert (block.k_norm is None) == reuses
        assert hasattr(layer.self_attn, "k_proj") != reuses  # Hugging Face's too
        width = hf.config.intermediate_size * (2 if double and reuses else 1)
        assert block.up_proj.out_features == width == layer.mlp.up_proj.out_features
    count = sum(p.numel() for p in ours.parameters())
    assert count == sum(p.numel() for p in hf.parameters())


@pytest.mark.parametrize("name", SHARED)
def test_gemma4_reusing_layers_keep_no_cache(name) -> None:
    hf = build(name)
    ours = from_hf(hf)
    ids, new = tokens(1, 12), tokens(1, 1, seed=5)
    with torch.no_grad():
        _, past = ours.decode(ids)
        step, after = ours.decode(new, past)
        whole = ours(torch.cat((ids, new), dim=1))[:, -1]
    assert [len(c) for c in past] == [3, 2, 3, 0, 0, 0]  # sliding, full, sliding, ()
    assert [len(c) for c in after] == [3, 2, 3, 0, 0, 0]
    torch.testing.assert_close(step[:, -1], whole, atol=TOL, rtol=0)
    used = cache_bytes(ours, past)
    assert used.layers[3:] == (0, 0, 0) and used.tokens == 12
    # the same weights of layers 0-2 without sharing: their caches as large, the last
    # three layers' no longer empty
    unshared = copy.deepcopy(hf.config)
    unshared.num_kv_shared_layers = 0
    own = from_hf(randomize(type(hf)(unshared), 0).eval())
    with torch.no_grad():
        own_bytes = cache_bytes(own, own.decode(ids)[1])
    assert own_bytes.layers[:3] == used.layers[:3]
    assert min(own_bytes.layers[3:]) > 0
    assert used.per_token < own_bytes.per_token


def _reading_from(model: Decoder, layer: int) -> Decoder:
    """The copy with the sliding layers' keys and values stored by ``layer`` instead
    of the last sliding layer before the reusing ones."""
    other = copy.deepcopy(model)
    for block in other.blocks:
        if block.sharing == "store" and block.window:
            block.sharing = None
    other.blocks[layer].sharing = "store"
    return other


def test_gemma4_reading_another_layers_keys_moves_the_logits() -> None:
    hf = build("gemma4-kv-shared")
    ours = from_hf(hf)
    other = _reading_from(ours, 0)  # the first sliding layer, not the last
    ids = tokens(2, LENGTH)
    ref = hf_logits(hf, ids)
    with torch.no_grad():
        assert (ours(ids) - ref).abs().max().item() < TOL
        assert (other(ids) - ref).abs().max().item() > 1e-2


def test_gemma4_a_reusing_layers_cache_must_be_empty() -> None:
    ours = from_hf(build("gemma4-kv-shared"))
    with torch.no_grad():
        _, past = ours.decode(tokens(1, 6))
    bad = list(past)
    bad[4] = past[1]  # a full layer's (key, value) where () belongs
    with pytest.raises(ValueError, match=r"past\[4\] must be \(\) \(layer 4 reuses"):
        ours.decode(tokens(1, 1), tuple(bad))


def test_gemma4_reusing_blocks_need_the_calls_shared_keys() -> None:
    ours = from_hf(build("gemma4-kv-shared"))
    plain = Decoder(ours.spec, block=gemma4.Gemma4Block)  # not Gemma4Decoder
    plain.load_state_dict(ours.state_dict())
    with torch.no_grad(), pytest.raises(TypeError, match=r"shared must be a dict"):
        plain(tokens(1, 4))
    assert isinstance(ours, gemma4.Gemma4Decoder)


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        ({"kv_shared_layers": 6}, ValueError, r"kv_shared_layers must be an int <= 5"),
        ({"kv_shared_layers": -1}, ValueError, r"kv_shared_layers must be"),
        ({"kv_shared_layers": 1.5}, TypeError, r"kv_shared_layers must be"),
        (
            {"kv_shared_layers": 5},
            ValueError,
            r"kv_shared_layers must leave a layer of every type .* no full_attention",
        ),
        ({"double_wide_mlp": "yes"}, TypeError, r"double_wide_mlp must be a bool"),
    ],
)
def test_gemma4_spec_checks_the_sharing(change, error, match) -> None:
    spec = from_hf(build("gemma4-kv-shared")).spec
    fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
    with pytest.raises(error, match=match):
        gemma4.Gemma4Spec(**{**fields, **change})


# ---- bad input -----------------------------------------------------------------------


def _spec_fields(**change) -> dict:
    spec = from_hf(build("gemma4-kv-shared")).spec
    fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
    return {**fields, **change}


BAD_INPUTS = [
    (
        "Gemma4Spec",
        lambda: gemma4.Gemma4Spec(**_spec_fields(kv_shared_layers=6)),
        ValueError,
        r"^kv_shared_layers must be an int <= 5, got 6",
    ),
    (
        "Gemma4Spec",
        lambda: gemma4.Gemma4Spec(**_spec_fields(kv_shared_layers=5)),
        ValueError,
        r"^kv_shared_layers must leave a layer of every type",
    ),
    (
        "Gemma4Spec",
        lambda: gemma4.Gemma4Spec(**_spec_fields(double_wide_mlp=1)),
        TypeError,
        r"^double_wide_mlp must be a bool",
    ),
    (
        "Gemma4Spec",
        lambda: gemma4.Gemma4Spec(**_spec_fields(kv_from_keys=(7,))),
        ValueError,
        r"^kv_from_keys\[0\] must be an int <= 5",
    ),
    (
        "Gemma4Spec",
        lambda: gemma4.Gemma4Spec(**_spec_fields(global_head_dim=33)),
        ValueError,
        r"^global_head_dim must be even",
    ),
    (
        "Gemma4Block",
        lambda: gemma4.Gemma4Block(DecoderSpec(**_plain_fields()), 0),
        TypeError,
        r"^spec must be a Gemma4Spec",
    ),
    (
        "Gemma4Block",
        lambda: gemma4.Gemma4Block(gemma4.Gemma4Spec(**_spec_fields()), 6),
        ValueError,
        r"^layer must be an int <= 5, got 6",
    ),
    (
        "Gemma4Decoder",
        lambda: gemma4.Gemma4Decoder({"num_layers": 6}, block=gemma4.Gemma4Block),
        TypeError,
        r"^spec must be a DecoderSpec",
    ),
    (
        "Gemma4Decoder",
        lambda: gemma4.Gemma4Decoder(
            gemma4.Gemma4Spec(**_spec_fields()), block=torch.nn.Linear
        ),
        TypeError,
        r"^block must be Gemma4Block or a subclass",
    ),
    (
        "Gemma4Decoder",
        lambda: gemma4.Gemma4Decoder(
            gemma4.Gemma4Spec(**_spec_fields()), block=DecoderBlock
        ),
        TypeError,
        r"^block must be Gemma4Block or a subclass of it \(the class\), got",
    ),
]
NO_BAD_INPUTS = {"PORTS": "the registry, a mapping read, not called"}


def _plain_fields() -> dict:
    plain = {f.name for f in dataclasses.fields(DecoderSpec)}
    return {k: v for k, v in _spec_fields().items() if k in plain}


@pytest.mark.parametrize(
    ("name", "thunk", "error", "match"), BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS]
)
def test_bad_input_raises_a_clear_error(name: str, thunk, error, match: str) -> None:
    with pytest.raises(error, match=match):
        thunk()


def test_validation_table_covers_the_public_api() -> None:
    covered = {b[0] for b in BAD_INPUTS} | set(NO_BAD_INPUTS)
    assert covered == set(gemma4.__all__)


def test_gemma4_reusing_layers_read_the_keys_attended_to_not_the_rolling_cache() -> (
    None
):
    # one token past a full window: the storing sliding layer keeps W - 1 keys after the
    # call but attended to W (its W - 1 cached ones and the new one); the reusing layers
    # get those W, as Hugging Face's shared_kv_states holds them
    ours = from_hf(build("gemma4-kv-shared"))
    handed = {}
    store = ours.blocks[2]  # the last sliding layer before the reusing ones
    assert store.sharing == "store" and store.window == WINDOW
    real_attention = store.attention

    def attention(x, rope, mask, past, shared=None):
        out, present = real_attention(x, rope, mask, past, shared=shared)
        handed["keys"], handed["cache"] = shared["sliding_attention"][0], present[0]
        return out, present

    store.attention = attention
    with torch.no_grad():
        _, past = ours.decode(tokens(1, 12))
        ours.decode(tokens(1, 1, seed=5), past)
    assert handed["keys"].shape[2] == WINDOW  # W - 1 cached + 1 new
    assert handed["cache"].shape[2] == WINDOW - 1
    torch.testing.assert_close(handed["keys"][:, :, 1:], handed["cache"])
