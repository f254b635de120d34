"""The checkers' shared core (companion/checks/_core.py): the comparison, the messages,
calling the learner's function, "not attempted yet", and the bad-input contract of every
checker."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from companion import checks
from companion.checks import CheckError, Mistake, describe_inputs, expect_close
from companion.checks._core import Case, as_tensor, checker


def _expect(got: object, expected: torch.Tensor, **kwargs: object) -> None:
    expect_close(
        got,
        expected,
        check="check_demo",
        prop="demo property",
        inputs={"n": 3},
        **kwargs,
    )


# ---- the comparison ------------------------------------------------------------------


def test_a_match_within_tolerance_passes() -> None:
    x = torch.linspace(0, 1, 5)
    _expect(x + 1e-7, x)


def test_message_names_check_property_input_expected_and_got() -> None:
    with pytest.raises(CheckError) as info:
        _expect(torch.tensor([1.0, 2.5, 3.0]), torch.tensor([1.0, 2.0, 3.0]))
    err, text = info.value, str(info.value)
    assert text.startswith("check_demo: 'demo property' failed on n=3")
    assert "expected: [1, 2, 3] shape=(3,)" in text
    assert "got:      [1, 2.5, 3] shape=(3,)" in text
    assert "max |got - expected| = 0.5 at index (1,)" in text
    assert "relative error 0.25" in text
    assert (err.check, err.prop, err.inputs, err.mistake) == (
        "check_demo",
        "demo property",
        "n=3",
        None,
    )


def test_values_that_differ_far_down_are_printed_with_enough_digits() -> None:
    expected = torch.tensor(41829.41723174, dtype=torch.float64)
    got = expected * (1 + 3e-9)
    with pytest.raises(CheckError) as info:
        _expect(got, expected, atol=0.0, rtol=1e-10)
    match = re.search(r"expected ([0-9.e+-]+), got ([0-9.e+-]+);", str(info.value))
    assert match is not None and match[1] != match[2]
    assert float(match[1]) == pytest.approx(41829.41723174, rel=1e-8)
    assert "relative error 3e-09" in str(info.value)
    # a number is stated once, in the detail (no "expected:/got:" lines repeat it)
    assert len(str(info.value).splitlines()) == 2
    assert (info.value.expected, info.value.got) == (match[1], match[2])


@pytest.mark.parametrize(
    "answer",
    [
        np.array([1.0, 2.0, 3.0]),
        [1.0, 2.0, 3.0],
        (1, 2, 3),
        [np.float32(1.0), np.float32(2.0), np.float32(3.0)],
        [torch.tensor(1.0), torch.tensor(2.0), torch.tensor(3.0)],
    ],
    ids=["numpy", "list", "tuple-of-ints", "numpy-scalars", "list-of-0d-tensors"],
)
def test_numpy_arrays_lists_and_numbers_are_accepted(answer: object) -> None:
    _expect(answer, torch.tensor([1.0, 2.0, 3.0]))


def test_python_floats_stay_float64() -> None:
    assert as_tensor(0.1).dtype == torch.float64
    assert as_tensor([0.1, 0.2]).dtype == torch.float64
    _expect(
        41829.41723174, torch.tensor(41829.41723174, dtype=torch.float64), rtol=1e-12
    )


def test_something_that_is_not_numbers_is_reported_as_such() -> None:
    with pytest.raises(CheckError, match=r"got:      'three'"):
        _expect("three", torch.zeros(3))
    with pytest.raises(CheckError, match=r"Return a torch.Tensor"):
        _expect({"a": 1}, torch.zeros(3))


def test_shape_mismatch_is_reported_before_values() -> None:
    with pytest.raises(
        CheckError, match=r"expected: shape \(2, 3\)\n  got:      shape \(3, 2\)"
    ):
        _expect(torch.zeros(3, 2), torch.zeros(2, 3))


def test_dtype_is_checked_only_when_asked() -> None:
    _expect(torch.zeros(2, dtype=torch.float64), torch.zeros(2))
    with pytest.raises(
        CheckError, match=r"expected: torch.float32\n  got:      torch.float64"
    ):
        _expect(torch.zeros(2, dtype=torch.float64), torch.zeros(2), check_dtype=True)


def test_integer_dtype_required_when_asked() -> None:
    _expect(torch.tensor([1, 2]), torch.tensor([1, 2]), integer=True)
    _expect(np.array([1, 2]), torch.tensor([1, 2]), integer=True)
    with pytest.raises(CheckError, match="integer tensor") as info:
        _expect(torch.tensor([1.0, 2.0]), torch.tensor([1, 2]), integer=True)
    assert info.value.mistake == "float targets"


def test_integer_with_a_reason_says_the_reason_and_names_no_mistake() -> None:
    why = "buckets index the bias table"
    _expect(torch.tensor([1, 2]), torch.tensor([1, 2]), integer=why)
    with pytest.raises(
        CheckError, match=f"integer tensor \\(torch.long\\): {why}"
    ) as info:
        _expect(torch.tensor([1.0, 2.0]), torch.tensor([1, 2]), integer=why)
    assert info.value.mistake is None, "no cross-entropy story for a table index"


def test_a_number_answer_is_asked_for_as_a_number() -> None:
    with pytest.raises(CheckError, match=r"Return a number \(int or float"):
        _expect("9", torch.tensor(9.0))
    with pytest.raises(CheckError, match=r"Return a torch.Tensor"):
        _expect("9", torch.zeros(2))


def test_nan_where_the_reference_is_finite_is_explained() -> None:
    with pytest.raises(CheckError, match=r"NaN or inf \(first at index \(1,\)\)"):
        _expect(torch.tensor([0.0, float("nan")]), torch.zeros(2))


def test_a_known_mistake_is_named() -> None:
    expected, wrong = torch.tensor([1.0, 2.0]), torch.tensor([2.0, 1.0])
    mistakes = [
        Mistake("something else", "not this one", torch.tensor([9.0, 9.0])),
        Mistake("swapped entries", "swap them back", wrong),
    ]
    with pytest.raises(
        CheckError, match=r'known mistake "swapped entries": swap them back'
    ) as info:
        _expect(wrong.clone(), expected, mistakes=mistakes)
    assert info.value.mistake == "swapped entries"


def test_a_mistake_with_its_own_tolerance_is_recognized_by_size() -> None:
    expected = torch.tensor([1.0, 2.0])
    near = Mistake("rounded", "keep the digits", expected, atol=0.1, rtol=0.0)
    with pytest.raises(CheckError) as info:
        _expect(expected + 0.05, expected, mistakes=[near])
    assert info.value.mistake == "rounded"
    with pytest.raises(CheckError) as info:
        _expect(expected + 0.5, expected, mistakes=[near])
    assert info.value.mistake is None


def test_describe_inputs_shows_tensors_by_shape_and_dtype() -> None:
    text = describe_inputs({"x": torch.zeros(2, 3, dtype=torch.bfloat16), "dim": -1})
    assert text == "x=(2, 3) bfloat16, dim=-1"
    assert describe_inputs({"f": len}) == "f=len"
    assert describe_inputs({}) == "(no inputs)"


# ---- calling the learner's function --------------------------------------------------


@checker
def check_double(double) -> object:  # a tiny checker built on the core
    for n in (1, 2):
        x = torch.arange(3.0) + n
        yield Case("doubles every entry", {"x": x, "n": n}, 2 * x)


def test_a_checker_returns_true_when_every_case_passes() -> None:
    assert check_double(lambda x, n: 2 * x).passed is True


def test_an_answer_on_another_device_is_compared_on_the_cpu(device) -> None:
    assert check_double(lambda x, n: (2 * x).to(device)).passed is True
    with pytest.raises(CheckError, match="relative error"):
        check_double(lambda x, n: (3 * x).to(device))


def test_an_answer_that_requires_grad_is_compared_by_value() -> None:
    assert check_double(lambda x, n: 2 * x.requires_grad_()).passed is True


def test_the_learners_function_is_called_positionally() -> None:
    def other_names(values, _unused, /):
        return values * 2

    assert check_double(other_names).passed is True


def test_the_learner_gets_copies_so_in_place_answers_pass() -> None:
    def in_place(x, n):
        return x.mul_(2)

    assert check_double(in_place).passed is True

    def scaled_in_place(query, key, value):
        query /= query.shape[-1] ** 0.5  # once called "missing 1/sqrt(d_k)"
        return torch.softmax(query @ key.mT, dim=-1) @ value

    assert checks.check_attention(scaled_in_place)


def stub_raises(x, n):
    raise NotImplementedError


def stub_pass(x, n):
    pass


def stub_ellipsis(x, n):
    """Double x."""
    ...


@pytest.mark.parametrize("stub", [stub_raises, stub_pass, stub_ellipsis])
def test_a_stub_is_not_attempted_yet(stub, capsys) -> None:
    assert check_double(stub).passed is False
    out = capsys.readouterr().out
    assert out == (
        "check_double: not attempted yet - write your function above, then run this "
        "cell again.\n"
    )


def test_every_chapter_checker_reports_a_stub_without_raising(capsys) -> None:
    def stub(*args):
        raise NotImplementedError

    for name in checks.__all__:
        if name.startswith("check_"):
            fns = (stub, stub) if name == "check_residual_blocks" else (stub,)
            assert getattr(checks, name)(*fns).passed is False
            assert f"{name}: not attempted yet" in capsys.readouterr().out


def test_a_body_that_forgets_return_is_a_check_error() -> None:
    def forgot(x, n):
        y = 2 * x  # noqa: F841

    with pytest.raises(
        CheckError, match=r"returned None: end it with a return statement"
    ):
        check_double(forgot)


def test_not_implemented_inside_a_library_is_a_crash_not_a_stub() -> None:
    namespace: dict[str, object] = {}
    code = "def op(x):\n    raise NotImplementedError('no kernel for this dtype')\n"
    exec(compile(code, "/env/lib/site-packages/fakelib/ops.py", "exec"), namespace)
    op = namespace["op"]

    with pytest.raises(
        CheckError, match=r"NotImplementedError inside a library: no kernel"
    ):
        check_double(lambda x, n: op(x))  # type: ignore[operator]


def test_a_crash_shows_the_positional_call() -> None:
    def crashes(x, n):
        raise RuntimeError("boom")

    with pytest.raises(CheckError) as info:
        check_double(crashes)
    assert info.value.prop == "runs without error"
    assert (
        "crashes(x, n) (positional arguments, in this order) raised RuntimeError: boom"
        in (str(info.value))
    )


def test_wrong_arity_is_a_crash_with_the_expected_call() -> None:
    with pytest.raises(CheckError, match=r"<lambda>\(x, n\) .*TypeError"):
        check_double(lambda x: 2 * x)


def test_a_tuple_answer_is_compared_part_by_part() -> None:
    @checker
    def check_pair(fn):
        x = torch.arange(3.0)
        wrong = Mistake("negated second", "no minus", (None, -x))
        yield Case("pair", {"x": x}, (x, x), [wrong], parts=("a", "b"))

    assert check_pair(lambda x: (x, x))
    assert check_pair(lambda x: [x.numpy(), x.tolist()])
    with pytest.raises(CheckError, match=r"Return a pair \(a, b\)"):
        check_pair(lambda x: x)
    with pytest.raises(CheckError) as info:
        check_pair(lambda x: (x, -x))
    assert info.value.mistake == "negated second" and info.value.prop == "pair (b)"


# ---- the bad-input contract ----------------------------------------------------------


def _fn(*args):
    return None


BAD_INPUTS = [
    ("CheckError", lambda: CheckError(), TypeError, r"missing .* required positional"),
    ("check_softmax", lambda: checks.check_softmax(3), TypeError,
     r"softmax must be callable, got 3"),
    ("check_sinusoidal_encoding", lambda: checks.check_sinusoidal_encoding(None),
     TypeError,
     r"fn must be callable, got None"),
    ("check_wavelengths", lambda: checks.check_wavelengths("f"), TypeError,
     r"fn must be callable, got 'f'"),
    ("check_shift_matrix", lambda: checks.check_shift_matrix(torch.eye(2)), TypeError,
     r"fn must be callable, got a tensor"),
    ("check_dot_product_curve", lambda: checks.check_dot_product_curve(1.5), TypeError,
     r"fn must be callable, got 1.5"),
    ("check_shift_recurrence", lambda: checks.check_shift_recurrence([]), TypeError,
     r"fn must be callable, got a list"),
    ("check_normalized_positions", lambda: checks.check_normalized_positions(0),
     TypeError,
     r"fn must be callable, got 0"),
    ("check_rope_frequencies", lambda: checks.check_rope_frequencies(None), TypeError,
     r"rope_frequencies must be callable, got None"),
    ("check_apply_rope", lambda: checks.check_apply_rope(None), TypeError,
     r"apply_rope must be callable, got None"),
    ("check_apply_rope", lambda: checks.check_apply_rope(_fn, layout="neox"),
     ValueError,
     r"layout must be one of 'half', 'interleaved', got 'neox'"),
    ("check_apply_rope", lambda: checks.check_apply_rope(_fn, layout=1), TypeError,
     r"layout must be one of .*, got 1"),
    ("check_rope_attention", lambda: checks.check_rope_attention(2), TypeError,
     r"rope_attention must be callable, got 2"),
    ("check_rope_weight_permutation", lambda: checks.check_rope_weight_permutation(2),
     TypeError, r"convert must be callable, got 2"),
    ("check_rope_cos_sin", lambda: checks.check_rope_cos_sin((1, 2)), TypeError,
     r"rope_cos_sin must be callable, got a tuple"),
    ("check_alibi_slopes", lambda: checks.check_alibi_slopes([0.5]), TypeError,
     r"alibi_slopes must be callable, got a list"),
    ("check_ntk_aware_base", lambda: checks.check_ntk_aware_base(10000.0), TypeError,
     r"ntk_aware_base must be callable, got 10000.0"),
    ("check_yarn_ramp", lambda: checks.check_yarn_ramp(None), TypeError,
     r"yarn_ramp must be callable, got None"),
    ("check_llama3_frequencies", lambda: checks.check_llama3_frequencies(None),
     TypeError,
     r"llama3_frequencies must be callable, got None"),
    ("check_attention", lambda: checks.check_attention(None), TypeError,
     r"attention must be callable, got None"),
    ("check_masked_attention", lambda: checks.check_masked_attention(None), TypeError,
     r"attention must be callable, got None"),
    ("check_causal_mask", lambda: checks.check_causal_mask(None), TypeError,
     r"causal_mask must be callable, got None"),
    ("check_split_heads", lambda: checks.check_split_heads(None), TypeError,
     r"split_heads must be callable, got None"),
    ("check_tiled_attention", lambda: checks.check_tiled_attention(None), TypeError,
     r"tiled_attention must be callable, got None"),
    ("check_layer_norm", lambda: checks.check_layer_norm(None), TypeError,
     r"layer_norm must be callable, got None"),
    ("check_rms_norm", lambda: checks.check_rms_norm(None), TypeError,
     r"rms_norm must be callable, got None"),
    ("check_batch_norm", lambda: checks.check_batch_norm(None), TypeError,
     r"batch_norm must be callable, got None"),
    ("check_variance", lambda: checks.check_variance(None), TypeError,
     r"variance must be callable, got None"),
    ("check_residual_blocks", lambda: checks.check_residual_blocks(None, _fn),
     TypeError,
     r"pre_ln must be callable, got None"),
    ("check_residual_blocks", lambda: checks.check_residual_blocks(_fn, 3), TypeError,
     r"post_ln must be callable, got 3"),
    ("check_residual_blocks", lambda: checks.check_residual_blocks(_fn), TypeError,
     r"missing a required argument: 'post_ln'"),
    ("check_lag_targets", lambda: checks.check_lag_targets(None), TypeError,
     r"lag_targets must be callable, got None"),
    ("check_masked_accuracy", lambda: checks.check_masked_accuracy(None), TypeError,
     r"masked_accuracy must be callable, got None"),
    ("check_absolute_targets", lambda: checks.check_absolute_targets(None), TypeError,
     r"absolute_targets must be callable, got None"),
    # the core, for checker authors
    ("Mistake", lambda: Mistake(3, "why", torch.zeros(1)), TypeError,
     r"name must be a str, got 3"),
    ("Mistake", lambda: Mistake("m", "why", torch.zeros(1), atol=-1.0), ValueError,
     r"atol must be a real number >= 0, got -1.0"),
    ("Case", lambda: Case("p", [1, 2], torch.zeros(1)), TypeError,
     r"inputs must be a dict of argument names to values, got a list"),
    ("checker", lambda: checker(None), TypeError, r"body must be callable, got None"),
    ("describe_inputs", lambda: describe_inputs([1]), TypeError,
     r"inputs must be a mapping of argument names to values, got a list"),
    ("expect_close", lambda: expect_close(1, [1.0], check="c", prop="p", inputs={}),
     TypeError, r"expected must be a torch.Tensor, got a list"),
]  # fmt: skip


def _generated() -> list[tuple[str, object, type[Exception], str]]:
    """A non-callable for each checker that the table above does not list yet (a later
    chapter's): the error names the checker's first parameter."""
    import inspect

    listed = {case[0] for case in BAD_INPUTS}
    cases = []
    for name in checks.__all__:
        if name.startswith("check_") and name not in listed:
            fn = getattr(checks, name)
            first = next(iter(inspect.signature(fn).parameters))
            cases.append(
                (name, lambda fn=fn: fn(None), TypeError, rf"{first} must be callable")
            )
    return cases


BAD_INPUTS += _generated()


@pytest.mark.parametrize(
    ("name", "thunk", "error", "match"),
    BAD_INPUTS,
    ids=[f"{case[0]}-{i}" for i, case in enumerate(BAD_INPUTS)],
)
def test_bad_input_raises_a_named_error(name, thunk, error, match) -> None:
    with pytest.raises(error, match=match):
        thunk()


def test_every_public_name_has_bad_input_cases() -> None:
    covered = {case[0] for case in BAD_INPUTS}
    assert set(checks.__all__) <= covered, set(checks.__all__) - covered
    assert {"Case", "Mistake", "checker", "describe_inputs", "expect_close"} <= covered


def test_every_checker_is_in_a_chapter_module_and_re_exported() -> None:
    import importlib
    import pkgutil

    import companion.checks

    chapters = [
        importlib.import_module(f"companion.checks.{info.name}")
        for info in pkgutil.iter_modules(companion.checks.__path__)
        if not info.name.startswith("_")
    ]
    assert {"environment", "positional", "rope", "extension", "attention", "norm"} <= {
        m.__name__.rsplit(".", 1)[1] for m in chapters
    }
    by_module = [name for module in chapters for name in module.__all__]
    assert sorted(by_module) == sorted(
        n for n in checks.__all__ if n.startswith("check_")
    )
    for module in chapters:
        for name in module.__all__:
            assert getattr(checks, name) is getattr(module, name)


# ---- what a learner sees in Jupyter ------------------------------------------------


def test_a_pass_prints_one_line_and_shows_no_out(capsys) -> None:
    result = check_double(lambda x, n: 2 * x)
    assert capsys.readouterr().out == "✓ check_double: all 2 cases pass\n"
    assert result and result == True  # noqa: E712 - compares equal to the bool
    assert result._ipython_display_() is None  # IPython shows nothing: no Out[]


def test_a_check_error_renders_as_two_lines_in_ipython() -> None:
    with pytest.raises(CheckError) as info:
        check_double(lambda x, n: 3 * x)
    lines = info.value._render_traceback_()
    assert len(lines) == 2
    assert "check_double" in lines[0] and "values differ" in lines[0]
    assert "expected" in lines[1] and "got" in lines[1]
    assert "_core.py" not in "".join(lines)


@checker
def check_matrix(fn) -> object:
    x = torch.arange(12.0).reshape(3, 4)
    yield Case("returns the matrix", {"x": x}, x)


@pytest.mark.parametrize(
    ("answer", "words"),
    [
        (lambda x: x.T, r"another order \(axes \[0, 1\]"),
        (lambda x: x[:, :2], "axis 1 has length 2 where 4 is expected"),
        (lambda x: torch.cat([x, x], 1), r"axis 1 has length 8 .*twice as long"),
        (lambda x: x.sum(0), "1 axis fewer"),
        (lambda x: x[None], "1 axis more"),
    ],
)
def test_a_shape_mismatch_names_the_axis(answer, words) -> None:
    with pytest.raises(CheckError, match=words):
        check_matrix(answer)


def test_the_preview_starts_where_the_values_first_differ() -> None:
    def late(x):
        y = x.clone()
        y[2, 1] += 1.0  # flat index 9
        return y

    with pytest.raises(CheckError) as info:
        check_matrix(late)
    assert "1 of 12 values differ" in str(info.value)
    assert "from flat index 6" in info.value.got  # the last 6 values hold index 9


def test_numpy_and_lists_are_compared_by_value() -> None:
    assert check_matrix(lambda x: x.numpy())
    assert check_matrix(lambda x: x.tolist())


@checker
def check_dtype64(fn) -> object:
    yield Case(
        "float64", {"n": 3}, torch.zeros(3, dtype=torch.float64), check_dtype=True
    )


def test_a_dtype_the_exercise_asks_for_is_named() -> None:
    with pytest.raises(CheckError, match="asks for float64; your answer is float32"):
        check_dtype64(lambda n: torch.zeros(n))


def test_a_batched_transpose_gets_a_named_hint() -> None:
    def k_dot_t(query, key, value):
        return torch.softmax(query @ key.T, dim=-1) @ value

    with pytest.warns(UserWarning), pytest.raises(CheckError, match=r"x\.mT"):
        checks.check_attention(k_dot_t)


def test_previews_print_the_first_difference_apart() -> None:
    """The previews start at the first entry that differs; with digits chosen only for
    the largest difference they printed identical values there (ch01's float32 angles:
    '-0.5842, -0.3976, ...' on both lines)."""
    expected = torch.linspace(0.1234567, 2.0, 20, dtype=torch.float64)
    got = expected.clone()
    got[1] += 2e-6  # first difference: apart only from the 7th significant digit
    got[15] += 1.0  # largest difference, past the preview's 6 values: apart at 4 digits
    with pytest.raises(CheckError) as info:
        expect_close(got, expected, check="c", prop="p", inputs={}, atol=1e-7, rtol=0)
    assert info.value.expected != info.value.got, (info.value.expected, info.value.got)
    with pytest.raises(CheckError) as named:
        expect_close(
            got,
            expected,
            check="c",
            prop="p",
            inputs={},
            atol=1e-7,
            rtol=0,
            mistakes=[Mistake("m", "why", got, atol=1e-9, rtol=0)],
        )
    assert named.value.expected != named.value.got


# ---- issue 37 (D4): booleans as booleans, numbers as numbers ---------------------------


def test_a_boolean_answer_is_compared_exactly_and_drawn_as_a_grid() -> None:
    expected = torch.eye(3, dtype=torch.bool)
    with pytest.raises(CheckError) as info:
        _expect(torch.ones(3, 3, dtype=torch.bool), expected)
    err = info.value
    assert err.detail == (
        "6 of 9 entries differ (6 True where False is expected); the first at index "
        "(0, 1): expected False, got True."
    )
    assert err.grid.splitlines() == [
        "expected   got",
        "1 . .      1 1 1",
        ". 1 .      1 1 1",
        ". . 1      1 1 1",
    ]
    assert err._render_traceback_()[2:] == [f"    {r}" for r in err.grid.splitlines()]
    # no tolerance applies to booleans: an entry that is 1e-9 off is still equal
    _expect(expected.double() * (1 + 1e-9), expected)


def test_a_large_boolean_answer_is_not_drawn() -> None:
    expected = torch.zeros(13, 13, dtype=torch.bool)
    with pytest.raises(CheckError) as info:
        _expect(torch.ones(13, 13, dtype=torch.bool), expected)
    assert info.value.grid == "" and len(info.value._render_traceback_()) == 2


def test_a_number_reads_expected_and_got_without_shapes_or_indices() -> None:
    with pytest.raises(CheckError) as info:
        _expect(11, torch.tensor(9.0, dtype=torch.float64), atol=0.0, rtol=0.0)
    err = info.value
    assert err.detail == "expected 9, got 11."
    assert (err.expected, err.got) == ("9", "11")
    assert "shape" not in str(err) and "index" not in str(err)
    # said once (review B7): no "expected: 9 / got: 11" lines above the same sentence
    assert str(err).splitlines()[1:] == ["  expected 9, got 11."]
    assert err._render_traceback_()[1] == "  'demo property' on n=3"


def test_whole_numbers_compared_exactly_show_no_tolerance() -> None:
    with pytest.raises(CheckError) as info:
        _expect([0, 1, 3], torch.tensor([0, 1, 2]), atol=0.0, rtol=0.0)
    assert "tolerance" not in info.value.detail and "relative" not in info.value.detail
    assert "(expected 2, got 3)" in info.value.detail


# What a property is called is printed on every failure, so it says *what* is checked,
# never *how* the solution computes it (s6-ux D4: "N layers reach sum of (W - 1) tokens
# back", "cumsum(mask) - 1, and 0 at padding" gave the answer away on a first try).
METHOD_WORDS = re.compile(
    r"cumsum|sum of \(|running max|subtract the max|float64\)|block-diagonal|"
    r"sin\(a\+b\)|sum_i cos|2\*pi \* 10000|x layers x|x bytes x"
)


def _properties() -> dict[str, set[str]]:
    """Every checker's property names, collected by running its cases' generator with
    the comparison replaced by a recorder (no learner function is called)."""
    import inspect
    from unittest import mock

    from companion.checks import _core

    seen: dict[str, set[str]] = {}

    def record(check, fn, case) -> None:
        seen.setdefault(check, set()).add(case.prop)

    with mock.patch.object(_core, "run_case", record):
        for name in checks.__all__:
            fn = getattr(checks, name)
            if not name.startswith("check_") or name == "check_stablelm_port":
                continue
            params = inspect.signature(fn).parameters.values()
            n = sum(
                p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params
            )
            with mock.patch("builtins.print"):
                fn(*[lambda *a: None] * n)
    return seen


def test_no_property_name_states_the_method() -> None:
    props = _properties()
    assert len(props) >= 40, sorted(props)
    leaks = [
        f"{c}: {p!r}" for c, ps in props.items() for p in ps if METHOD_WORDS.search(p)
    ]
    assert not leaks, leaks
    # the two the review quoted, now named by what they check
    assert props["check_receptive_field"] == {
        "how many tokens back the top layer reaches"
    }
    assert props["check_padding_position_ids"] == {
        "real tokens numbered 0, 1, ... in each row, 0 at padding"
    }


# ---- issue 37 (D3): a pass from the book's solution cell is the reference's ------------


@pytest.fixture
def shell():
    """An IPython shell in this process, as a Jupyter kernel runs cells (``In`` holds the
    running cell's source); cleared afterwards, so ``get_ipython()`` is ``None`` again."""
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_cell("import torch\nfrom companion import checks")
    yield ip
    InteractiveShell.clear_instance()


def test_a_pass_from_a_solution_cell_says_reference_solution(shell, capsys) -> None:
    capsys.readouterr()
    shell.run_cell(
        "# Reference solution\n"
        "def softmax(x, dim):\n"
        "    return torch.softmax(x, dim=dim)\n\n\n"
        "checks.check_softmax(softmax)",
        store_history=True,  # as a kernel runs a cell
    )
    # (a terminal shell then prints an empty "Out[n]:"; Jupyter shows nothing)
    assert capsys.readouterr().out.splitlines()[0] == (
        "✓ check_softmax (reference solution): all 3 cases pass"
    )


def test_a_pass_from_the_learners_cell_is_the_learners(shell, capsys) -> None:
    capsys.readouterr()
    shell.run_cell(
        "def softmax(x, dim):  # Reference solution, in a comment, is not the mark\n"
        "    return torch.softmax(x, dim=dim)\n\n\n"
        "checks.check_softmax(softmax)",
        store_history=True,
    )
    assert (
        capsys.readouterr().out.splitlines()[0] == "✓ check_softmax: all 3 cases pass"
    )


def test_known_mistake_names_once_and_takes_each_cases_output() -> None:
    make = checks._core.known_mistake("sign flipped", "negate it back.")
    first, second = make(torch.ones(2)), make(torch.zeros(2))
    assert (first.name, first.explanation) == (second.name, second.explanation)
    assert first.name == "sign flipped" and torch.equal(second.output, torch.zeros(2))
    with pytest.raises(TypeError, match="name"):
        checks._core.known_mistake(3, "why")
