"""Tests of the checker machinery in companion.checks (each chapter's checkers are tested in
that chapter's test file)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from companion import checks
from companion.checks import CheckError, Mistake, expect_close


def _expect(got: object, expected: torch.Tensor, **kwargs: object) -> None:
    expect_close(got, expected, check="check_demo", prop="demo property", inputs={"n": 3}, **kwargs)


def test_expect_close_accepts_a_match_within_tolerance() -> None:
    x = torch.linspace(0, 1, 5)
    _expect(x + 1e-7, x)


def test_message_names_check_property_input_expected_and_got() -> None:
    expected = torch.tensor([1.0, 2.0, 3.0])
    with pytest.raises(CheckError) as info:
        _expect(torch.tensor([1.0, 2.5, 3.0]), expected)
    err = info.value
    text = str(err)
    assert text.startswith("check_demo: 'demo property' failed on n=3")
    assert "expected: [1, 2, 3] shape=(3,)" in text
    assert "got:      [1, 2.5, 3] shape=(3,)" in text
    assert "max |got - expected| = 0.5 at index (1,)" in text
    assert (err.check, err.prop, err.inputs, err.mistake) == (
        "check_demo",
        "demo property",
        "n=3",
        None,
    )


def test_non_tensor_is_reported_as_such() -> None:
    with pytest.raises(CheckError, match=r"got:      a ndarray"):
        _expect(np.zeros(3), torch.zeros(3))


def test_shape_mismatch_is_reported_before_values() -> None:
    with pytest.raises(CheckError, match=r"expected: shape \(2, 3\)\n  got:      shape \(3, 2\)"):
        _expect(torch.zeros(3, 2), torch.zeros(2, 3))


def test_dtype_is_checked_only_when_asked() -> None:
    _expect(torch.zeros(2, dtype=torch.float64), torch.zeros(2))
    with pytest.raises(CheckError, match=r"expected: torch.float32\n  got:      torch.float64"):
        _expect(torch.zeros(2, dtype=torch.float64), torch.zeros(2), check_dtype=True)


def test_nan_where_the_reference_is_finite_is_explained() -> None:
    with pytest.raises(CheckError, match=r"NaN or inf \(first at index \(1,\)\)"):
        _expect(torch.tensor([0.0, float("nan")]), torch.zeros(2))


def test_a_known_mistake_is_named() -> None:
    expected = torch.tensor([1.0, 2.0])
    wrong = torch.tensor([2.0, 1.0])
    mistakes = [
        Mistake("something else", "not this one", torch.tensor([9.0, 9.0])),
        Mistake("swapped entries", "swap them back", wrong),
    ]
    with pytest.raises(
        CheckError, match=r'known mistake "swapped entries": swap them back'
    ) as info:
        _expect(wrong.clone(), expected, mistakes=mistakes)
    assert info.value.mistake == "swapped entries"


def test_describe_inputs_shows_tensors_by_shape_and_dtype() -> None:
    text = checks.describe_inputs({"x": torch.zeros(2, 3, dtype=torch.bfloat16), "dim": -1})
    assert text == "x=(2, 3) bfloat16, dim=-1"
    assert checks.describe_inputs({}) == "(no inputs)"


# --- check_softmax: accepts the reference, rejects named wrong variants ---------------------


def _stable_softmax(x: torch.Tensor, dim: int) -> torch.Tensor:
    e = torch.exp(x - x.amax(dim=dim, keepdim=True))
    return e / e.sum(dim=dim, keepdim=True)


def test_check_softmax_accepts_correct_implementations() -> None:
    assert checks.check_softmax(_stable_softmax) is True
    assert checks.check_softmax(lambda x, dim: torch.softmax(x, dim=dim)) is True


def test_check_softmax_names_the_wrong_axis() -> None:
    def wrong_axis(x: torch.Tensor, dim: int) -> torch.Tensor:
        return _stable_softmax(x, 0 if dim == -1 else -1)

    with pytest.raises(CheckError) as info:
        checks.check_softmax(wrong_axis)
    assert info.value.mistake == "softmax over the wrong axis"
    assert "along dim=-1" in str(info.value)


def test_check_softmax_explains_the_overflow() -> None:
    def overflowing(x: torch.Tensor, dim: int) -> torch.Tensor:
        e = torch.exp(x)
        return e / e.sum(dim=dim, keepdim=True)

    with pytest.raises(CheckError) as info:
        checks.check_softmax(overflowing)
    assert info.value.prop == "stays finite for large logits (subtract the max first)"
    assert "NaN or inf" in str(info.value)


def test_check_softmax_names_normalising_by_the_sum_of_x() -> None:
    with pytest.raises(CheckError) as info:
        checks.check_softmax(lambda x, dim: torch.exp(x) / x.sum(dim=dim, keepdim=True))
    assert info.value.mistake == "normalised by the sum of x instead of the sum of exp(x)"


def test_check_softmax_reports_a_stub_as_not_attempted(capsys) -> None:
    def stub(x: torch.Tensor, dim: int) -> torch.Tensor:
        raise NotImplementedError

    assert checks.check_softmax(stub) is False
    assert "check_softmax: not attempted yet" in capsys.readouterr().out


def test_check_softmax_rejects_a_non_function() -> None:
    with pytest.raises(TypeError, match=r"check_softmax expects a function, got int"):
        checks.check_softmax(3)  # type: ignore[arg-type]
