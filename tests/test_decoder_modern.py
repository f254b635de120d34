"""companion.decoder's newer families, padded batches and sliding windows against
Hugging Face transformers (the oracle), on small random configs (no download).

Every family (the four of tests/test_decoder.py and Mistral, Qwen2, Qwen3, OLMo 2,
Gemma 2, Gemma 3 text, Phi-3) is compared on a single prompt and on a left-padded
batch of prompts of different lengths: logits within 1e-4 (float32) on the real tokens,
and 20 greedy KV-cache tokens identical to Hugging Face's ``generate``. Sliding-window
models run on sequences several windows long (window 5, prompts of 12, 32 tokens in
all); Phi-3's LongRoPE on sequences past its original context (16), where the long
factors start and the cache is recomputed. LongRoPE in the other RoPE families (Llama,
Mistral, Qwen2, Qwen3, OLMo 2, Gemma 2, Gemma 3 per layer type, GPT-NeoX): logits below
and past the original context, and greedy tokens across it, where Hugging Face keeps the
keys cached with the short factors.
"""

from __future__ import annotations

import copy
import inspect

import pytest
import torch
from torch import nn

pytest.importorskip("transformers")

import transformers
from test_decoder import (
    IDS,
    NEW,
    PROMPT,
    TOL,
    VOCAB,
    assert_bfloat16_within_rounding,
    randomize,
    tokens,
)
from test_decoder import VARIANTS as OLD

from companion import decoder
from companion.checks.modern import _stablelm_port
from companion.decoder import cache_bytes, from_hf, generate

transformers.logging.set_verbosity_error()

T = transformers
WINDOW = 5
L0 = 16  # Phi-3's original_max_position_embeddings here
BASE = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    **IDS,
)
_GEMMA3_ROPE = {
    "full_attention": {"rope_type": "default", "rope_theta": 10000.0},
    "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
}
_LONGROPE = {
    "rope_type": "longrope",
    "rope_theta": 10000.0,
    "short_factor": [1.0, 1.1, 1.3, 1.5],
    "long_factor": [1.0, 2.0, 4.0, 8.0],
}


def _cfg(cls, config, **kw):
    return cls, config(**{**BASE, **kw})


NEW_FAMILIES = {
    "mistral": _cfg(T.MistralForCausalLM, T.MistralConfig, sliding_window=WINDOW),
    "mistral-full": _cfg(T.MistralForCausalLM, T.MistralConfig, sliding_window=None),
    "qwen2": _cfg(
        T.Qwen2ForCausalLM,
        T.Qwen2Config,
        use_sliding_window=True,
        sliding_window=WINDOW,
        max_window_layers=1,  # layers 1 and 2 slide
    ),
    "qwen2-tied": _cfg(T.Qwen2ForCausalLM, T.Qwen2Config, tie_word_embeddings=True),
    "qwen3": _cfg(
        T.Qwen3ForCausalLM,
        T.Qwen3Config,
        head_dim=16,
        use_sliding_window=True,
        sliding_window=WINDOW,
        max_window_layers=2,
    ),
    "qwen3-bias-mqa": _cfg(
        T.Qwen3ForCausalLM,
        T.Qwen3Config,
        head_dim=8,
        attention_bias=True,
        num_key_value_heads=1,
    ),
    "olmo2": _cfg(T.Olmo2ForCausalLM, T.Olmo2Config),
    "olmo2-bias": _cfg(T.Olmo2ForCausalLM, T.Olmo2Config, attention_bias=True),
    "gemma2": _cfg(
        T.Gemma2ForCausalLM,
        T.Gemma2Config,
        head_dim=16,
        sliding_window=WINDOW,
        query_pre_attn_scalar=12,
        attn_logit_softcapping=5.0,  # small caps, so that both bite
        final_logit_softcapping=4.0,
        tie_word_embeddings=False,  # tied, greedy decoding repeats one token
    ),
    "gemma2-no-softcap": _cfg(
        T.Gemma2ForCausalLM,
        T.Gemma2Config,
        head_dim=16,
        sliding_window=WINDOW,
        query_pre_attn_scalar=16,
        attn_logit_softcapping=None,
        final_logit_softcapping=None,  # tied (Gemma's default): its logits are
        # compared; its greedy tokens repeat one token, the untied variants' do not
    ),
    "gemma3": _cfg(
        T.Gemma3ForCausalLM,
        T.Gemma3TextConfig,
        head_dim=16,
        sliding_window=WINDOW,
        query_pre_attn_scalar=12,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters=copy.deepcopy(_GEMMA3_ROPE),
        tie_word_embeddings=False,  # tied, greedy decoding repeats one token
    ),
    "gemma3-linear-final-softcap": _cfg(
        T.Gemma3ForCausalLM,
        T.Gemma3TextConfig,
        head_dim=16,
        sliding_window=WINDOW,
        query_pre_attn_scalar=12,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        rope_parameters={
            "full_attention": {
                "rope_type": "linear",
                "rope_theta": 10000.0,
                "factor": 4.0,
            },
            "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
        },
        final_logit_softcapping=4.0,
        tie_word_embeddings=False,
    ),
    "gemma3-hub-style": _cfg(  # the keys of a published config.json: legacy RoPE
        T.Gemma3ForCausalLM,
        T.Gemma3TextConfig,
        head_dim=16,
        sliding_window=WINDOW,
        query_pre_attn_scalar=12,
        sliding_window_pattern=3,  # layers 0, 1 slide, 2 is global
        rope_theta=1e4,
        rope_local_base_freq=100.0,
        rope_scaling={"rope_type": "linear", "factor": 8.0},  # global layers only
        tie_word_embeddings=False,  # tied, greedy decoding repeats one token
    ),
    "qwen2-gqa4": _cfg(
        T.Qwen2ForCausalLM,
        T.Qwen2Config,
        num_attention_heads=8,  # 4 query heads per key/value head
        use_sliding_window=True,
        sliding_window=WINDOW,
        max_window_layers=2,  # layer 2 slides
    ),
    "phi3": _cfg(
        T.Phi3ForCausalLM,
        T.Phi3Config,
        original_max_position_embeddings=L0,
        rope_parameters=copy.deepcopy(_LONGROPE),
    ),
    "phi3-partial-window": _cfg(
        T.Phi3ForCausalLM,
        T.Phi3Config,
        num_key_value_heads=4,
        sliding_window=WINDOW,
        partial_rotary_factor=0.5,
    ),
}
# the four families of chapter "Real models", padded: one or two variants each
OLD_FAMILIES = {
    name: OLD[name]
    for name in (
        "llama-gqa",
        "llama-dynamic",
        "gpt2",
        "gpt2-untied",
        "neox",
        "neox-no-bias",
        "bloom",
        "bloom-6-heads",
        "bloom-untied",
    )
}
# greedy decoding of these repeats one to three tokens per row (tied embeddings echo
# the input token): their logits are compared, and a variant of each family that
# decodes varied tokens carries the greedy comparison
REPEATING = ("neox", "bloom", "bloom-6-heads", "gemma2-no-softcap")
FAMILIES = {**OLD_FAMILIES, **NEW_FAMILIES}
SLIDING = [
    n
    for n in NEW_FAMILIES
    if "window" in n
    or (
        n.split("-")[0] in ("mistral", "qwen2", "qwen3", "gemma2", "gemma3")
        and n not in ("mistral-full", "qwen2-tied", "qwen3-bias-mqa")
    )
]


def _longrope(pairs: int, **kw) -> dict:
    """LongRoPE with L0 = 16 and no factor (Hugging Face's default: 64 / 16 = 4)."""
    return {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "short_factor": [1.0 + 0.1 * i for i in range(pairs)],
        "long_factor": [1.0 + 2.0 * i for i in range(pairs)],
        "original_max_position_embeddings": L0,
        **kw,
    }


# LongRoPE outside Phi-3: every other family with RoPE (Gemma 3: a length per layer
# type, 16 for the global layers and 20 for the local ones)
LONGROPE = {
    "llama-longrope": _cfg(
        T.LlamaForCausalLM, T.LlamaConfig, rope_parameters=_longrope(4)
    ),
    "mistral-longrope": _cfg(
        T.MistralForCausalLM,
        T.MistralConfig,
        sliding_window=WINDOW,
        rope_parameters=_longrope(4),
    ),
    "qwen2-longrope": _cfg(
        T.Qwen2ForCausalLM,
        T.Qwen2Config,
        use_sliding_window=True,
        sliding_window=WINDOW,
        max_window_layers=1,
        rope_parameters=_longrope(4),
    ),
    "qwen3-longrope": _cfg(
        T.Qwen3ForCausalLM, T.Qwen3Config, head_dim=16, rope_parameters=_longrope(8)
    ),
    "olmo2-longrope": _cfg(
        T.Olmo2ForCausalLM, T.Olmo2Config, rope_parameters=_longrope(4)
    ),
    "gemma2-longrope": _cfg(
        T.Gemma2ForCausalLM,
        T.Gemma2Config,
        head_dim=16,
        sliding_window=WINDOW,
        query_pre_attn_scalar=12,
        tie_word_embeddings=False,
        rope_parameters=_longrope(8),
    ),
    "gemma3-longrope": _cfg(
        T.Gemma3ForCausalLM,
        T.Gemma3TextConfig,
        head_dim=16,
        sliding_window=WINDOW,
        query_pre_attn_scalar=12,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={
            "full_attention": _longrope(8),
            "sliding_attention": _longrope(
                8, rope_theta=100.0, original_max_position_embeddings=20
            ),
        },
        tie_word_embeddings=False,
    ),
    "gemma3-hub-longrope": _cfg(  # a config.json's keys: global layers only
        T.Gemma3ForCausalLM,
        T.Gemma3TextConfig,
        head_dim=16,
        sliding_window=WINDOW,
        query_pre_attn_scalar=12,
        sliding_window_pattern=3,
        rope_theta=1e4,
        rope_local_base_freq=100.0,
        rope_scaling=_longrope(8),
        tie_word_embeddings=False,
    ),
    "neox-longrope": (
        T.GPTNeoXForCausalLM,
        T.GPTNeoXConfig(
            **{k: v for k, v in BASE.items() if k != "num_key_value_heads"},
            # base 100: with 10^4 the second pair turns < 0.2 rad in 16 positions
            # and a Phi-3 recompute gave Hugging Face's tokens too
            rope_parameters=_longrope(2, partial_rotary_factor=0.5, rope_theta=100.0),
        ),
    ),
}


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


def build(name: str, seed: int = 0) -> nn.Module:
    cls, cfg = {**FAMILIES, **LONGROPE}[name]
    torch.manual_seed(seed)
    return randomize(cls(copy.deepcopy(cfg)), seed)


def left_padded(batch_lengths: list[int], n: int, seed: int = 1):
    """Prompts of the given lengths, left-padded to ``n``: ids and the 0/1 mask."""
    ids = tokens(len(batch_lengths), n, seed=seed)
    mask = torch.zeros(len(batch_lengths), n, dtype=torch.long)
    for row, length in enumerate(batch_lengths):
        mask[row, n - length :] = 1
        ids[row, : n - length] = IDS["pad_token_id"]
    return ids, mask


def hf_positions(mask: torch.Tensor) -> torch.Tensor:
    """Hugging Face generate's position_ids: cumsum - 1, 0 at padding."""
    return (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)


def hf_logits(hf: nn.Module, ids, mask=None) -> torch.Tensor:
    kw = {}
    if mask is not None:
        kw["attention_mask"] = mask
        if "position_ids" in inspect.signature(hf.forward).parameters:  # not BLOOM
            kw["position_ids"] = hf_positions(mask)
    with torch.no_grad():
        return hf(ids, **kw).logits


def hf_generate(hf: nn.Module, ids, mask, new: int = NEW) -> torch.Tensor:
    return hf.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=new,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=IDS["pad_token_id"],
    )


# ---- logits: one prompt and a left-padded batch --------------------------------------


@pytest.mark.parametrize("name", list(NEW_FAMILIES))
def test_logits_match_hugging_face(name: str) -> None:
    hf = build(name)
    ids = tokens(2, 24)  # 24 > L0 (Phi-3's long factors), almost 5 windows
    expected = hf_logits(hf, ids)
    got = from_hf(hf)(ids)
    assert expected.abs().max() > 1.0
    torch.testing.assert_close(got, expected, atol=TOL, rtol=0)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_left_padded_batch_logits_match_on_the_real_tokens(name: str) -> None:
    hf = build(name)
    ids, mask = left_padded([14, 9, 3], 14)
    expected = hf_logits(hf, ids, mask)
    got = from_hf(hf)(ids, attention_mask=mask)
    real = mask.bool()
    assert torch.isfinite(got).all()  # padding queries see no key: zeros, not NaN
    torch.testing.assert_close(got[real], expected[real], atol=TOL, rtol=0)
    # each row equals that prompt alone, unpadded (positions count its own tokens)
    alone = from_hf(hf)(ids[1:2, -9:])
    torch.testing.assert_close(got[1, -9:], alone[0], atol=TOL, rtol=0)


@pytest.mark.parametrize("name", ["gpt2", "llama-gqa"])
def test_a_padded_forward_is_hugging_faces_with_position_ids(name: str) -> None:
    """Decoder.forward's docstring: with a mask it equals Hugging Face's forward given
    position_ids = cumsum(mask) - 1, not its forward with the mask alone, which numbers
    the columns 0 .. L-1; that moves GPT-2's logits (a learned table) and not a RoPE
    model's (a shift per row cancels in m - n)."""
    hf = build(name)
    ids, mask = left_padded([14, 9, 3], 14)
    real = mask.bool()
    got = from_hf(hf)(ids, attention_mask=mask)[real]
    with torch.no_grad():
        mask_only = hf(ids, attention_mask=mask).logits[real]
    torch.testing.assert_close(got, hf_logits(hf, ids, mask)[real], atol=TOL, rtol=0)
    gap = (got - mask_only).abs().max().item()
    if name == "gpt2":
        assert gap > 100 * TOL
    else:
        assert gap < TOL


def test_right_padding_gives_the_same_logits_on_the_real_tokens() -> None:
    hf = build("qwen3")
    ids, mask = left_padded([12, 7], 12)
    right_ids, right_mask = ids.clone(), mask.clone()
    right_ids[1] = torch.cat((ids[1, -7:], ids[1, :-7]))
    right_mask[1] = torch.cat((mask[1, -7:], mask[1, :-7]))
    ours = from_hf(hf)
    left = ours(ids, attention_mask=mask)
    right = ours(right_ids, attention_mask=right_mask)
    torch.testing.assert_close(right[1, :7], left[1, -7:], atol=TOL, rtol=0)
    expected = hf_logits(hf, right_ids, right_mask)
    torch.testing.assert_close(
        right[right_mask.bool()], expected[right_mask.bool()], atol=TOL, rtol=0
    )


# ---- greedy decoding with the cache ------------------------------------------------


@pytest.mark.parametrize("name", list(NEW_FAMILIES))
def test_greedy_tokens_of_one_prompt_match_hugging_face(name: str) -> None:
    ids = tokens(1, PROMPT, seed=2)
    expected = hf_generate(build(name), ids, torch.ones_like(ids))
    got = generate(from_hf(build(name)), ids, NEW)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_greedy_tokens_of_a_left_padded_batch_match_hugging_face(name: str) -> None:
    ids, mask = left_padded([PROMPT, 7, 3], PROMPT, seed=3)
    expected = hf_generate(build(name), ids, mask)
    got = generate(from_hf(build(name)), ids, NEW, attention_mask=mask)
    assert got.shape == (3, PROMPT + NEW)
    assert torch.equal(got, expected)
    if name not in REPEATING:  # tokens varied enough for a wrong cache to show
        assert max(len(set(row.tolist())) for row in got[:, PROMPT:]) >= 4
    # bool and int masks are the same mask
    again = generate(from_hf(build(name)), ids, 3, attention_mask=mask.bool())
    assert torch.equal(again, got[:, : PROMPT + 3])


# ---- sliding windows: the convention and the rolling cache ---------------------------


def test_sliding_layers_see_exactly_window_keys() -> None:
    """Hugging Face: key j visible from query i iff 0 <= i - j < window."""
    ours = from_hf(build("mistral"))
    spec = ours.spec
    mask = ours._mask(1, 9, 0, spec.sliding_window, None, torch.zeros(1))
    seen = torch.isfinite(mask[0, 0])
    i, j = torch.meshgrid(torch.arange(9), torch.arange(9), indexing="ij")
    assert torch.equal(seen, (i - j >= 0) & (i - j < WINDOW))
    assert int(seen.sum(1).max()) == WINDOW  # the query itself and WINDOW - 1 earlier


@pytest.mark.parametrize("name", SLIDING)
def test_rolling_cache_decodes_past_the_window_as_the_full_forward(name: str) -> None:
    ours = from_hf(build(name))
    ids = tokens(2, 23, seed=4)
    full = ours(ids)
    with torch.no_grad():
        logits, past = ours.decode(ids[:, :11])  # prefill longer than the window
        parts = [logits]
        for start, stop in ((11, 12), (12, 15), (15, 23)):  # 1, 3, 8 tokens at once
            logits, past = ours.decode(ids[:, start:stop], past)
            parts.append(logits)
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=TOL, rtol=0)
    for block, cache in zip(ours.blocks, past, strict=True):
        if block.window:  # only the keys the next query can see
            assert cache[0].shape[2] == WINDOW - 1 and int(cache[2]) == 23
        else:
            assert cache[0].shape[2] == 23


def test_a_window_of_one_decodes_as_hugging_face_s_forward() -> None:
    """Window 1 (each token sees itself alone): the copy's cached tokens are its
    uncached ones and Hugging Face's forward's. transformers 5.23's cached generate
    differs there: its sliding cache keeps ``[-window + 1:]`` = ``[-0:]``, every key."""
    torch.manual_seed(0)
    hf = randomize(T.MistralForCausalLM(T.MistralConfig(**BASE, sliding_window=1)))
    ours = from_hf(hf)
    ids = tokens(1, PROMPT, seed=2)
    torch.testing.assert_close(ours(ids), hf_logits(hf, ids), atol=TOL, rtol=0)
    expected = ids
    for _ in range(NEW):  # Hugging Face's greedy tokens, without a cache
        nxt = hf_logits(hf, expected)[:, -1:].argmax(-1)
        expected = torch.cat((expected, nxt), dim=1)
    got = generate(ours, ids, NEW)
    assert torch.equal(got, expected)
    assert torch.equal(got, generate(ours, ids, NEW, use_cache=False))
    with torch.no_grad():
        assert all(c[0].shape[2] == 0 for c in ours.decode(ids)[1])  # no key kept


def test_sliding_window_changes_the_logits_past_the_window() -> None:
    hf = build("mistral")
    wide = build("mistral-full")
    wide.load_state_dict(hf.state_dict())
    ids = tokens(1, 20)
    gap = (from_hf(hf)(ids) - from_hf(wide)(ids)).abs()
    assert gap[:, :WINDOW].max() < TOL  # the same while the window holds everything
    assert gap[:, WINDOW:].max() > 100 * TOL


def test_alibi_with_a_sliding_window_in_a_spec_of_one_s_own() -> None:
    """A Port may combine ALiBi with a window (no built-in family does): the window is
    kept with and without a mask and with a rolling cache. One layer, so that the
    windowed output at t is the windowless one on the last W tokens (ALiBi reads only
    i - j)."""
    import dataclasses

    bloom = from_hf(build("bloom"))
    one = dict(num_layers=1, scales=bloom.spec.scales[:1])
    full = decoder.Decoder(
        dataclasses.replace(bloom.spec, **one, layer_types=("full_attention",))
    )
    windowed = decoder.Decoder(
        dataclasses.replace(
            bloom.spec,
            **one,
            sliding_window=WINDOW,
            layer_types=("sliding_attention",),
        )
    )
    for model in (full, windowed):
        model.load_state_dict(bloom.state_dict(), strict=False)
        model.eval()
    ids = tokens(2, 16)
    with torch.no_grad():
        got = windowed(ids)
        for t in range(WINDOW, 16):
            alone = full(ids[:, t - WINDOW + 1 : t + 1])[:, -1]
            torch.testing.assert_close(got[:, t], alone, atol=TOL, rtol=0)
        assert (got - full(ids)).abs().max() > 100 * TOL  # the window bites
        ones = torch.ones_like(ids)
        masked = windowed(ids, attention_mask=ones)
        torch.testing.assert_close(masked, got, atol=TOL, rtol=0)
        logits, past = windowed.decode(ids[:, :9])  # past the window, then 1 and 6
        parts = [logits]
        for start, stop in ((9, 10), (10, 16)):
            logits, past = windowed.decode(ids[:, start:stop], past)
            parts.append(logits)
        torch.testing.assert_close(torch.cat(parts, dim=1), got, atol=TOL, rtol=0)
        padded, mask = left_padded([16, 7], 16)
        row = windowed(padded, attention_mask=mask)[1, -7:]
        torch.testing.assert_close(row, windowed(padded[1:, -7:])[0], atol=TOL, rtol=0)


def test_cache_bytes_per_token_sliding_against_full() -> None:
    ours = from_hf(build("gemma3"))  # layers: sliding, full, sliding
    spec = ours.spec
    with torch.no_grad():
        _, past = ours.decode(tokens(2, 40))
    measured = cache_bytes(ours, past)
    per_layer_token = 2 * spec.num_kv_heads * spec.head_dim * 4  # float32 K and V
    assert measured.tokens == 40
    assert measured.layers == (
        2 * (WINDOW - 1) * per_layer_token,
        2 * 40 * per_layer_token,
        2 * (WINDOW - 1) * per_layer_token,
    )
    assert measured.full_per_token == 3 * per_layer_token
    assert measured.per_token == pytest.approx(
        (40 + 2 * (WINDOW - 1)) * per_layer_token / 40
    )
    # an all-sliding model: the full figure from the formula, the cache stops growing
    mistral = from_hf(build("mistral"))
    with torch.no_grad():
        _, short = mistral.decode(tokens(1, 8))
        _, long = mistral.decode(tokens(1, 30))
    a, b = cache_bytes(mistral, short), cache_bytes(mistral, long)
    assert a.layers == b.layers and a.full_per_token == b.full_per_token
    assert b.per_token < a.per_token < a.full_per_token


# ---- Phi-3's LongRoPE past the original context --------------------------------------


def test_longrope_switches_to_the_long_factors_past_the_original_context() -> None:
    hf = build("phi3")
    ours = from_hf(hf)
    short, long = tokens(1, L0), tokens(1, L0 + 1)
    torch.testing.assert_close(ours(short), hf_logits(hf, short), atol=TOL, rtol=0)
    torch.testing.assert_close(ours(long), hf_logits(hf, long), atol=TOL, rtol=0)
    # one more token changes every earlier logit: the whole sequence uses one set
    assert (ours(long)[:, :L0] - ours(long[:, :L0])).abs().max() > 100 * TOL


def test_generate_recomputes_the_cache_when_longrope_switches() -> None:
    ours = from_hf(build("phi3"))
    ids = tokens(1, PROMPT, seed=2)
    got = generate(ours, ids, NEW)  # 12 + 20 tokens: the switch at 17
    with torch.no_grad():  # the cache of the first 16 tokens is rotated short ...
        _, past = ours.decode(got[:, :L0])
        stale, _ = ours.decode(got[:, L0 : L0 + 1], past)
        fresh = ours(got[:, : L0 + 1])[:, -1:]  # ... generate reruns all 17 long
    assert (stale - fresh).abs().max() > 100 * TOL
    assert torch.equal(got, generate(ours, ids, NEW, use_cache=False))


# ---- LongRoPE in every other family with RoPE ---------------------------------------


@pytest.mark.parametrize("name", list(LONGROPE))
def test_longrope_logits_match_hugging_face_below_and_past_the_context(
    name: str,
) -> None:
    hf = build(name)
    ours = from_hf(hf)
    for n in (12, 18, 24):  # below L0 = 16, between (Gemma 3's local 20), past both
        ids = tokens(2, n)
        torch.testing.assert_close(ours(ids), hf_logits(hf, ids), atol=TOL, rtol=0)
    # a left-padded batch whose longest row passes L0: every row takes the long set
    ids, mask = left_padded([20, 13, 5], 20)
    real = mask.bool()
    got = ours(ids, attention_mask=mask)[real]
    torch.testing.assert_close(got, hf_logits(hf, ids, mask)[real], atol=TOL, rtol=0)
    # past L0 the whole sequence takes the long factors: earlier logits move
    long = tokens(1, 24)
    with torch.no_grad():
        assert (ours(long)[:, :12] - ours(long[:, :12])).abs().max() > 100 * TOL


@pytest.mark.parametrize("name", list(LONGROPE))
def test_longrope_greedy_tokens_across_the_context_match_hugging_face(
    name: str,
) -> None:
    """12 + 20 tokens: the long factors start at the 17th, the cached keys keep the
    short ones (Hugging Face recomputes the cache in Phi-3 alone)."""
    ids = tokens(1, PROMPT, seed=2)
    expected = hf_generate(build(name), ids, torch.ones_like(ids))
    assert torch.equal(generate(from_hf(build(name)), ids, NEW), expected)
    ids, mask = left_padded([PROMPT, 7, 3], PROMPT, seed=3)
    expected = hf_generate(build(name), ids, mask)
    got = generate(from_hf(build(name)), ids, NEW, attention_mask=mask)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("name", list(LONGROPE))
def test_outside_phi3_the_cache_keeps_the_short_rotation(name: str) -> None:
    """Hugging Face's tokens need the stale keys, in every family of LONGROPE: Phi-3's
    recompute (or no cache) gives others on the greedy test's prompt or its left-padded
    batch, so that test can tell the two rules apart."""
    import dataclasses

    hf = build(name)
    ours = from_hf(hf)
    as_phi3 = decoder.Decoder(dataclasses.replace(ours.spec, family="phi3")).eval()
    as_phi3.load_state_dict(ours.state_dict())
    single = tokens(1, PROMPT, seed=2)
    batch, mask = left_padded([PROMPT, 7, 3], PROMPT, seed=3)
    recomputed, uncached = [], []
    for ids, pad in ((single, torch.ones_like(single)), (batch, mask)):
        expected = hf_generate(hf, ids, pad)
        assert torch.equal(generate(ours, ids, NEW, attention_mask=pad), expected)
        got = generate(as_phi3, ids, NEW, attention_mask=pad)
        recomputed.append(torch.equal(got, expected))
        got = generate(ours, ids, NEW, use_cache=False, attention_mask=pad)
        uncached.append(torch.equal(got, expected))
    assert not all(recomputed) and not all(uncached)


def test_longrope_reads_the_training_length_where_hugging_face_does() -> None:
    # one set: the config attribute (Phi-3's field), written into rope_parameters
    params = _longrope(4)
    del params["original_max_position_embeddings"]
    torch.manual_seed(0)
    config = T.LlamaConfig(
        **BASE, original_max_position_embeddings=L0, rope_parameters=params
    )
    hf = randomize(T.LlamaForCausalLM(config))
    ours = from_hf(hf)
    assert ours.spec.rope["original_max_position_embeddings"] == L0
    assert ours.spec.rope["factor"] == 64 / L0
    ids = tokens(1, 24)
    torch.testing.assert_close(ours(ids), hf_logits(hf, ids), atol=TOL, rtol=0)
    # one set per layer type (Gemma 3): each set's key; the attribute is ignored
    cls, config = LONGROPE["gemma3-longrope"]
    config = copy.deepcopy(config)
    config.original_max_position_embeddings = 40
    torch.manual_seed(0)
    hf = randomize(cls(config))
    ours = from_hf(hf)
    assert ours.spec.rope["original_max_position_embeddings"] == L0
    assert ours.spec.local_rope["original_max_position_embeddings"] == 20
    torch.testing.assert_close(ours(ids), hf_logits(hf, ids), atol=TOL, rtol=0)
    # one set whose key and attribute disagree (changed after loading): refused
    hf = build("llama-longrope")
    hf.config.original_max_position_embeddings = 24
    with pytest.raises(
        ValueError,
        match=r"'longrope' with rope_parameters\['original_max_position_embeddings'"
        r"\]=16 and config.original_max_position_embeddings=24",
    ):
        from_hf(hf)


# ---- what each new option changes ---------------------------------------------------


_ALL_FULL = dict(sliding_window=0, layer_types=())


@pytest.mark.parametrize(
    ("name", "changes"),
    [
        ("gemma2", dict(attn_softcap=0.0)),
        ("gemma2", dict(final_softcap=0.0)),
        ("gemma2", dict(embedding_scale=1.0)),
        ("gemma2", dict(scales=(16**-0.5,) * 3)),  # head_dim, not query_pre_attn_scalar
        ("gemma3", dict(local_rope={})),
        ("qwen3", dict(qk_norm="none")),
        ("olmo2", dict(rms_variant="gemma")),
        ("qwen2", _ALL_FULL),  # max_window_layers: layers 1 and 2 slide
        ("phi3-partial-window", _ALL_FULL),
        ("phi3-partial-window", dict(rotary_dim=8)),  # the whole head turned
    ],
    ids=lambda v: v if isinstance(v, str) else "-".join(v),
)
def test_each_option_moves_the_logits(name: str, changes: dict) -> None:
    """Each option read from the config matters: dropped, the logits move far, so
    the comparisons with Hugging Face above could fail on it."""
    import dataclasses

    ours = from_hf(build(name))
    other = decoder.Decoder(dataclasses.replace(ours.spec, **changes))
    missing = other.load_state_dict(ours.state_dict(), strict=False)
    assert not missing.unexpected_keys or "qk_norm" in changes
    ids = tokens(1, 20)
    with torch.no_grad():
        assert (ours(ids) - other(ids)).abs().max() > 100 * TOL


def test_unsupported_options_of_the_new_families_are_refused_by_name() -> None:
    gemma = build("gemma2")
    gemma.config.use_bidirectional_attention = True
    with pytest.raises(ValueError, match=r"bidirectional attention"):
        from_hf(gemma)
    qwen = build("qwen2")
    qwen.config.layer_types = ["chunked_attention"] * 3
    with pytest.raises(ValueError, match=r"layer_types \['chunked_attention'\]"):
        from_hf(qwen)
    gemma3 = build("gemma3")
    gemma3.config.attn_logit_softcapping = 50.0
    with pytest.raises(ValueError, match=r"attn_logit_softcapping=50.0 in a Gemma 3"):
        from_hf(gemma3)
    olmo = build("olmo2")
    olmo.config.rope_parameters = {
        "rope_type": "default",
        "rope_theta": 1e4,
        "partial_rotary_factor": 0.5,
    }
    with pytest.raises(ValueError, match=r"partial_rotary_factor 0.5 in a olmo2"):
        from_hf(olmo)


@pytest.mark.parametrize("name", ["gemma2", "olmo2", "qwen3", "phi3"])
def test_bfloat16_copy_is_as_close_to_hugging_face_as_its_rounding(name: str) -> None:
    assert_bfloat16_within_rounding(build, name)


# ---- a family that is not built in, one Port away: StableLM --------------------------


# the reference port of chapter 9's exercise is its one home (companion.checks.modern)
STABLELM = _stablelm_port()


def test_a_port_copies_stablelm_with_padding_and_generation() -> None:
    """The porting recipe on a family from_hf does not know (a recipe for the
    chapter's "Porting a family" section): a spec reader, a loader, the layer list."""
    cfg = T.StableLmConfig(**{**BASE, "use_qkv_bias": True})
    torch.manual_seed(0)
    hf = randomize(T.StableLmForCausalLM(cfg), 0)
    with pytest.raises(ValueError, match=r"got StableLmForCausalLM \(unsupported"):
        from_hf(hf)
    ours = from_hf(hf, port=STABLELM)
    assert ours.spec.rotary_dim == 2  # partial_rotary_factor 0.25 of head_dim 8
    ids, mask = left_padded([14, 9, 3], 14)
    expected = hf_logits(hf, ids, mask)
    got = ours(ids, attention_mask=mask)
    torch.testing.assert_close(
        got[mask.bool()], expected[mask.bool()], atol=TOL, rtol=0
    )
    ids, mask = left_padded([PROMPT, 7, 3], PROMPT, seed=3)
    assert torch.equal(
        generate(ours, ids, NEW, attention_mask=mask), hf_generate(hf, ids, mask)
    )


def assert_padded_batch_with_eos_matches(build, name: str) -> None:
    """A left-padded batch of three prompts (PROMPT, 7 and 3 tokens) generated greedily
    with an EOS that row 0 reaches: each row equals Hugging Face's generate up to its own
    EOS, and Hugging Face pads a finished row (used by the newer families' tests)."""
    from companion.decoder import from_hf, generate

    ids, mask = left_padded([PROMPT, 7, 3], PROMPT, seed=3)
    got = generate(from_hf(build(name)), ids, NEW, attention_mask=mask)
    eos = int(got[0, PROMPT + 5])  # row 0 stops at its 6th new token
    expected = build(name).generate(
        ids,
        attention_mask=mask,
        max_new_tokens=NEW,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=IDS["pad_token_id"],
    )
    stopped = 0
    for row in range(3):
        new = got[row, PROMPT:].tolist()
        stop = PROMPT + (new.index(eos) + 1 if eos in new else NEW)
        stopped += stop < PROMPT + NEW
        assert torch.equal(expected[row, :stop], got[row, :stop]), row
        after = expected[row, stop:]  # Hugging Face pads a finished row
        assert bool((after == IDS["pad_token_id"]).all()), row
    assert stopped >= 1
