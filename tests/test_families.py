"""companion.families: the registry of model families, and what a new family costs.

A new family is a registry entry: a spec reader on :func:`companion.families.base_fields`
and, where the weights are stored as Llama's, no loader. StableLM (chapter 9's porting
exercise) is added here as such an entry and compared with Hugging Face transformers'
``StableLmForCausalLM`` on a small random config (no download): logits of a left-padded
batch within 1e-4 (float32), greedy tokens identical; the entry's spec equals the
chapter's hand-written reference port's; and a copy that reads the rotary width wrongly
moves the logits, so the comparison can fail.
"""

from __future__ import annotations

import inspect
import types

import pytest
import torch

pytest.importorskip("transformers")

import transformers
from test_decoder import IDS, NEW, PROMPT, TOL, VOCAB, randomize
from test_decoder_modern import hf_generate, hf_logits, left_padded

from companion import decoder, families
from companion.checks.modern import _stablelm_port
from companion.decoder import from_hf, generate

transformers.logging.set_verbosity_error()

T = transformers


# ---- the entry a new family needs (the lines counted below) --------------------------


def spec_stablelm(model: torch.nn.Module) -> dict:
    c = model.config
    for option in ("qk_layernorm", "use_parallel_residual"):
        if getattr(c, option):
            raise families.unsupported(f"{option}=True in a StableLM model")
    return families.base_fields(
        model, "stablelm", partial_rotary=True, norm="layer", eps=c.layer_norm_eps,
        qkv_bias=c.use_qkv_bias, out_bias=False,
    )  # fmt: skip


STABLELM = {"StableLmForCausalLM": families.Port(spec=spec_stablelm)}

# ---- end of the entry ----------------------------------------------------------------


def _entry_lines() -> int:
    """Lines of code of the entry above: the spec reader and the registry line."""
    source = inspect.getsource(inspect.getmodule(spec_stablelm))
    start = source.index("def spec_stablelm")
    end = source.index("# ---- end of the entry")
    return sum(1 for line in source[start:end].splitlines() if line.strip())


def _stablelm(**kw: object) -> torch.nn.Module:
    sizes = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        use_qkv_bias=True,
    )
    cfg = T.StableLmConfig(**{**sizes, **IDS, **kw})
    torch.manual_seed(0)
    return randomize(T.StableLmForCausalLM(cfg), 0)


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    """StableLM's entry in the registry, for one test."""
    for name, port in STABLELM.items():
        monkeypatch.setitem(families.PORTS, name, port)


def test_the_stablelm_entry_is_a_few_lines() -> None:
    # the measure the issue asks for: a spec reader and one registry line, no loader
    assert _entry_lines() <= 12
    assert STABLELM["StableLmForCausalLM"].load is families.load_llama


def test_a_registered_entry_is_found_by_from_hf(registered) -> None:
    hf = _stablelm()
    ours = from_hf(hf)  # no port=: the registry has it
    assert decoder.PORTS is families.PORTS
    assert ours.spec.rotary_dim == 2  # partial_rotary_factor 0.25 of head_dim 8
    assert ours.spec.norm == "layer" and ours.blocks[0].o_proj.bias is None


def test_without_the_entry_stablelm_is_refused() -> None:
    with pytest.raises(ValueError, match=r"got StableLmForCausalLM \(unsupported"):
        from_hf(_stablelm())


def test_the_entry_reads_what_the_chapters_reference_port_reads() -> None:
    hf = _stablelm()
    entry = spec_stablelm(hf)
    reference = _stablelm_port().spec(hf)
    # the reference pops partial_rotary_factor from the RoPE parameters (read into
    # rotary_dim); the shared reader keeps Hugging Face's dict as it is
    assert entry["rope"].pop("partial_rotary_factor") == 0.25
    assert decoder.DecoderSpec(**entry) == decoder.DecoderSpec(**reference)


@pytest.mark.parametrize("bias", [True, False])
def test_the_stablelm_entry_matches_hugging_face(registered, bias: bool) -> None:
    hf = _stablelm(use_qkv_bias=bias)
    ours = from_hf(hf)
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


def test_a_wrong_entry_moves_the_logits(registered) -> None:
    # RoPE over the whole head instead of its first quarter: the comparison fails
    hf = _stablelm()

    def whole_head(model: torch.nn.Module) -> dict:
        fields = spec_stablelm(model)
        fields["rotary_dim"] = fields["head_dim"]
        return fields

    wrong = from_hf(hf, port=families.Port(spec=whole_head))
    ids = left_padded([14], 14)[0]
    assert (wrong(ids) - hf_logits(hf, ids)).abs().max() > 100 * TOL


@pytest.mark.parametrize(
    ("option", "match"),
    [
        ("qk_layernorm", r"qk_layernorm=True in a StableLM model is not supported"),
        ("use_parallel_residual", r"use_parallel_residual=True in a StableLM model"),
    ],
)
def test_the_entry_refuses_what_it_does_not_implement(option, match) -> None:
    with pytest.raises(ValueError, match=match):
        from_hf(_stablelm(**{option: True}), port=STABLELM["StableLmForCausalLM"])


def test_every_built_in_family_is_an_entry() -> None:
    # every entry's spec reader is a function of the model alone, and the eleven
    # Hugging Face classes are in the one registry the real-models chapter lists
    assert len(families.PORTS) == 11
    for name, port in families.PORTS.items():
        assert isinstance(port, families.Port), name
        assert getattr(transformers, name, None) is not None, name


def test_base_fields_reads_llamas_block() -> None:
    cfg = T.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, **IDS,
    )  # fmt: skip
    fields = families.base_fields(T.LlamaForCausalLM(cfg), "x", eps=1e-3)
    assert fields["family"] == "x" and fields["eps"] == 1e-3  # given: not read
    assert (fields["norm"], fields["mlp"], fields["positions"]) == (
        "rms",
        "gated",
        "rope",
    )
    assert (fields["num_kv_heads"], fields["head_dim"], fields["rotary_dim"]) == (
        2,
        8,
        8,
    )
    assert fields["scales"] == (8**-0.5,) * 2


# ---- bad input -----------------------------------------------------------------------

_MODEL = types.SimpleNamespace(config=None)

BAD_INPUTS = [
    ("Port", lambda: families.Port(spec=1), TypeError, r"^spec must be callable"),
    (
        "Port",
        lambda: families.Port(spec=spec_stablelm, layers=3),
        TypeError,
        r"^layers must be the path of a layer list",
    ),
    (
        "Port",
        lambda: families.Port(spec=spec_stablelm, block=torch.nn.Linear),
        TypeError,
        r"^block must be DecoderBlock or a subclass",
    ),
    (
        "Port",
        lambda: families.Port(spec=spec_stablelm, spec_type=dict),
        TypeError,
        r"^spec_type must be DecoderSpec or a subclass",
    ),
    (
        "Port",
        lambda: families.Port(spec=spec_stablelm, decoder=decoder.DecoderBlock),
        TypeError,
        r"^decoder must be Decoder or a subclass of it \(the class\), got",
    ),
    (
        "base_fields",
        lambda: families.base_fields(_MODEL, "x"),
        TypeError,
        r"^model must be a Module",
    ),
    (
        "base_fields",
        lambda: families.base_fields(_stablelm(), 3),
        TypeError,
        r"^family must be a str",
    ),
    (
        "base_fields",
        lambda: families.base_fields(_stablelm(), "x", sliding="some"),
        ValueError,
        r"^sliding must be one of",
    ),
    (
        "base_fields",
        lambda: families.base_fields(_stablelm(), "x", partial_rotary=1),
        TypeError,
        r"^partial_rotary must be a bool",
    ),
]


@pytest.mark.parametrize(
    ("name", "thunk", "error", "match"), BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS]
)
def test_bad_input_raises_a_clear_error(name: str, thunk, error, match: str) -> None:
    with pytest.raises(error, match=match):
        thunk()


NO_BAD_INPUTS = {
    "PORTS": "the registry, a mapping read, not called",
    "HYBRID_PORTS": "the RoPE/NoPE hybrids' registry, a mapping read",
}


def test_validation_table_covers_the_public_api() -> None:
    covered = {b[0] for b in BAD_INPUTS} | set(NO_BAD_INPUTS)
    assert covered == set(families.__all__)
