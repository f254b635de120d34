"""Chapter 9's checkers (sliding windows, padding, sinks, porting StableLM): correct
answers in several styles pass (lists, NumPy, tensors; Hugging Face's own position
formula); each named mistake is named; a stub is "not attempted yet"."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from companion import modern
from companion.checks import CheckError
from companion.checks import modern as checks

pytest.importorskip("transformers")


def _stub(*args):
    raise NotImplementedError


# ---- check_receptive_field -----------------------------------------------------------


@pytest.mark.parametrize(
    "answer",
    [
        lambda windows: sum(w - 1 for w in windows),
        lambda windows: float(np.sum(np.asarray(windows) - 1)),
        lambda windows: torch.tensor(windows).sub(1).sum(),
        modern.receptive_field,
    ],
    ids=["python", "numpy", "torch", "companion"],
)
def test_receptive_field_accepts(answer) -> None:
    assert checks.check_receptive_field(answer)


def test_receptive_field_names(named) -> None:
    named(lambda: checks.check_receptive_field(sum), "window counted as W back")
    named(
        lambda: checks.check_receptive_field(lambda w: max(w) - 1),
        "largest window only",
    )
    named(
        lambda: checks.check_receptive_field(lambda w: int(np.prod(w))),
        "windows multiplied",
    )


# ---- check_sink_cache_keep -----------------------------------------------------------


def keep_list(length, sinks, window):
    return [t for t in range(length) if t < sinks or t >= length - window]


def keep_torch(length, sinks, window):
    idx = torch.arange(length)
    return idx[(idx < sinks) | (idx >= length - window)]


@pytest.mark.parametrize("answer", [keep_list, keep_torch], ids=["list", "torch"])
def test_sink_cache_keep_accepts(answer) -> None:
    assert checks.check_sink_cache_keep(answer)


def test_sink_cache_keep_names(named) -> None:
    named(
        lambda: checks.check_sink_cache_keep(
            lambda n, s, w: list(range(max(0, n - w), n))
        ),
        "sinks dropped",
    )
    named(
        lambda: checks.check_sink_cache_keep(
            lambda n, s, w: [t for t in range(n) if t < s or t >= n - w - 1]
        ),
        "one token too many",
    )
    named(
        lambda: checks.check_sink_cache_keep(
            lambda n, s, w: list(range(min(s, n))) + list(range(max(0, n - w), n))
        ),
        "sinks repeated",
    )


# ---- check_padding_position_ids ------------------------------------------------------


def positions_hf(attention_mask):
    """Hugging Face's generate (transformers 5.23), verbatim."""
    position_ids = attention_mask.long().cumsum(-1) - 1
    return position_ids.masked_fill(attention_mask == 0, 0)


def positions_loop(attention_mask):
    rows = []
    for row in attention_mask.tolist():
        count, out = 0, []
        for m in row:
            out.append(count if m else 0)
            count += m
        rows.append(out)
    return rows


@pytest.mark.parametrize(
    "answer",
    [positions_hf, positions_loop, modern.padding_position_ids],
    ids=["hf", "loop", "companion"],
)
def test_padding_position_ids_accepts(answer) -> None:
    assert checks.check_padding_position_ids(answer)


def test_padding_position_ids_names(named) -> None:
    named(
        lambda: checks.check_padding_position_ids(
            lambda m: torch.arange(m.shape[1]).expand_as(m)
        ),
        "padding ignored",
    )
    named(
        lambda: checks.check_padding_position_ids(
            lambda m: m.cumsum(-1).masked_fill(m == 0, 0)
        ),
        "cumsum without the - 1",
    )
    named(
        lambda: checks.check_padding_position_ids(lambda m: m.cumsum(-1) - 1),
        "padding not set to 0",
    )
    named(
        lambda: checks.check_padding_position_ids(
            lambda m: (m.cumsum(-1) - 1).clamp(min=0)
        ),
        "padding clamped at 0",
    )
    named(
        lambda: checks.check_padding_position_ids(
            lambda m: (m.cumsum(-1) - 1).masked_fill(m == 0, 1)
        ),
        "padding set to 1",
    )


def test_padding_position_ids_float_and_numpy_answers_pass() -> None:
    # the right positions as float64 or NumPy: the values are what is asked
    assert checks.check_padding_position_ids(lambda m: positions_hf(m).double())
    assert checks.check_padding_position_ids(lambda m: positions_hf(m).numpy())


def test_sink_cache_keep_names_a_reversed_order(named) -> None:
    named(
        lambda: checks.check_sink_cache_keep(
            lambda n, s, w: modern.sink_cache_keep(n, sinks=s, window=w).flip(0)
        ),
        "order reversed",
    )


# ---- check_stablelm_port -------------------------------------------------------------


def test_stablelm_port_accepts_the_reference() -> None:
    assert checks.check_stablelm_port(lambda: checks._stablelm_port())


@pytest.mark.parametrize(
    ("mistake", "name"),
    [
        ("full", "RoPE on the whole head"),
        ("rms", "RMSNorm instead of LayerNorm"),
        ("bias", "LayerNorm biases not copied"),
        ("scale", "score scale 1/D"),
        ("eps", "norm eps not layer_norm_eps"),
        ("eps fixed", "norm eps hard-coded"),
        ("theta", "RoPE base hard-coded"),
        ("gelu", "GELU instead of hidden_act"),
    ],
)
def test_stablelm_port_names(named, mistake: str, name: str) -> None:
    named(
        lambda: checks.check_stablelm_port(lambda: checks._stablelm_port(mistake)), name
    )


def test_stablelm_port_not_a_port_and_a_failing_spec() -> None:
    with pytest.raises(CheckError, match="returns a Port"):
        checks.check_stablelm_port(lambda: {"spec": None})

    def broken():
        port = checks._stablelm_port()

        def spec(model):
            raise KeyError("num_layers")

        return type(port)(spec=spec, load=port.load, layers=port.layers)

    with pytest.raises(CheckError, match="from_hf builds the copy"):
        checks.check_stablelm_port(broken)
    with pytest.raises(TypeError, match="stablelm_port must be callable"):
        checks.check_stablelm_port(None)


@pytest.mark.parametrize(
    "check",
    [
        checks.check_receptive_field,
        checks.check_sink_cache_keep,
        checks.check_padding_position_ids,
        checks.check_stablelm_port,
    ],
)
def test_stub_is_not_attempted(check, capsys) -> None:
    result = check(_stub)
    assert result == False  # noqa: E712 - a CheckResult compares equal to False
    assert "not attempted yet" in capsys.readouterr().out


def test_stablelm_port_without_qkv_bias_is_pointed_at_the_spec() -> None:
    def no_bias():
        port = checks._stablelm_port()

        def spec(model):
            return {**port.spec(model), "qkv_bias": False}

        return type(port)(spec=spec, load=port.load, layers=port.layers)

    with pytest.raises(CheckError, match=r"qkv_bias from use_qkv_bias"):
        checks.check_stablelm_port(no_bias)


def test_stablelm_port_without_a_gated_mlp_is_told_gate_proj_not_qkv_bias() -> None:
    with pytest.raises(CheckError) as info:
        checks.check_stablelm_port(lambda: checks._stablelm_port("plain"))
    message = str(info.value)
    assert "no blocks.0.gate_proj.weight" in message and "mlp='gated'" in message
    assert "qkv_bias" not in message


@pytest.mark.parametrize("option", ["qk_layernorm", "use_parallel_residual"])
def test_stablelm_port_that_ignores_an_option_it_cannot_copy_fails(option) -> None:
    # the reference refuses each by name (the check passes above); a port that ignores
    # the option is caught, whether from_hf then builds a copy or crashes in load
    with pytest.raises(CheckError, match=f"refuses {option} by name") as info:
        checks.check_stablelm_port(lambda: checks._stablelm_port("ignores " + option))
    assert f"ValueError naming {option}" in str(info.value)


def test_stablelm_port_that_refuses_without_naming_the_option_fails() -> None:
    def vague():
        port = checks._stablelm_port()

        def spec(model):
            if model.config.qk_layernorm or model.config.use_parallel_residual:
                raise ValueError("unsupported model")
            return port.spec(model)

        return type(port)(spec=spec, load=port.load, layers=port.layers)

    with pytest.raises(CheckError, match="the ValueError must name qk_layernorm"):
        checks.check_stablelm_port(vague)


def test_stablelm_refusal_cases_would_not_copy_silently() -> None:
    # the refusal cases can fail: a port ignoring qk_layernorm builds a copy that runs
    # and differs from Hugging Face (its q/k norms are dropped), so refusing is the one
    # right answer; ignoring use_parallel_residual crashes in load
    from companion.decoder import from_hf

    model = checks._stablelm_model(0, qk_layernorm=True)
    ids = torch.randint(50, (1, 9), generator=torch.Generator().manual_seed(7))
    copy = from_hf(model, port=checks._stablelm_port("ignores qk_layernorm"))
    with torch.no_grad():
        assert (copy(ids) - model(ids).logits).abs().max() > 1e-2
    with pytest.raises(ValueError, match="qk_layernorm"):
        from_hf(model, port=checks._stablelm_port())


def test_stablelm_third_case_catches_values_hard_coded_from_the_defaults() -> None:
    # layer_norm_eps 1e-2 and base 100 move the logits far past the tolerance 1e-4
    from companion.decoder import from_hf

    overrides = checks._STABLELM_CASES[list(checks._STABLELM_CASES)[2]]
    model = checks._stablelm_model(2, **overrides)
    ids = torch.randint(50, (2, 9), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        want = model(ids).logits
        assert (
            from_hf(model, port=checks._stablelm_port())(ids) - want
        ).abs().max() < 1e-4
        for mistake in ("eps fixed", "theta"):
            got = from_hf(model, port=checks._stablelm_port(mistake))(ids)
            assert (got - want).abs().max() > 1e-3, mistake


# ---- issue 37 (D4): natural mistakes in words ------------------------------------------


def test_receptive_field_scalar_answer_reads_expected_9_got_11() -> None:
    with pytest.raises(checks.CheckError) as info:
        checks.check_receptive_field(lambda w: max(w) * len(w) - 1)
    first = info.value._render_traceback_()[0]
    # windows [4, 4, 4] reach 3 + 3 + 3 = 9 back; 4 * 3 - 1 = 11
    assert first.endswith(": expected 9, got 11."), first
    assert "shape" not in str(info.value) and "index" not in str(info.value)


def unguarded_keep(length, sinks, window):
    """The long-stream rule with no case for a short stream."""
    return list(range(sinks)) + list(range(length - window, length))


def test_sink_cache_keep_names_the_short_stream(named) -> None:
    err = named(
        lambda: checks.check_sink_cache_keep(unguarded_keep), "short stream not handled"
    )
    # (12, 4, 8) is exactly sinks + window, where the rule happens to be right; the
    # first case it fails is (5, 4, 8): 4 sinks plus indices -3 .. 4
    assert err.inputs == "length=5, sinks=4, window=8", err.inputs
    assert err.prop == "every token, while the stream is no longer than sinks + window"
    assert "The shapes differ" not in str(err)


def test_the_long_stream_cases_do_not_name_the_short_stream() -> None:
    def too_many(length, sinks, window):  # right on short streams, wrong on long ones
        if length <= sinks + window:
            return list(range(length))
        return list(range(sinks)) + list(range(length - window - 2, length))

    with pytest.raises(checks.CheckError) as info:
        checks.check_sink_cache_keep(too_many)
    assert info.value.mistake != "short stream not handled", str(info.value)
