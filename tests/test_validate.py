"""The shared validation layer, companion/_validate.py: what it accepts, what it normalizes
to, and the exact message for each kind of bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from companion import _validate as v

# ---- accepted values, normalized ---------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (lambda: v.integer("n", np.int64(3)), 3),
        (lambda: v.integer("n", torch.tensor(4)), 4),
        (lambda: v.positive_int("dim", 8, even=True), 8),
        (lambda: v.nonnegative_int("L", 0), 0),
        (lambda: v.real("base", np.float32(2.5)), 2.5),
        (lambda: v.real("base", 3), 3.0),
        (lambda: v.positive_real("eps", 1e-6), 1e-6),
        (lambda: v.flag("is_causal", np.bool_(True)), True),
        (lambda: v.choice("layout", "half", ("half", "interleaved")), "half"),
        (lambda: v.dtype("dtype", torch.bfloat16), torch.bfloat16),
        (lambda: v.dtype("dtype", torch.int32, family="integer"), torch.int32),
        (lambda: v.device("device", "cpu"), torch.device("cpu")),
        (lambda: v.device("device", None), None),
        (lambda: v.int_sequence("shape", (2, 3)), (2, 3)),
        (lambda: v.int_sequence("shape", 5), (5,)),
        (lambda: v.optional(v.positive_int, "n", None), None),
    ],
)
def test_accepts_and_normalizes(call, expected) -> None:
    got = call()
    assert got == expected and type(got) is type(expected)


def test_tensor_checks_pass_through_the_same_object() -> None:
    x = torch.zeros(2, 3, 4)
    assert v.tensor("x", x, min_ndim=2, max_ndim=4, nonempty=True) is x
    assert v.tensor("m", torch.ones(2, dtype=torch.bool), dtype="bool") is not None
    assert v.tensor("m", torch.ones(2), dtype=("bool", "floating")) is not None
    v.size("x", x, -1, 4)
    v.same_size("x", x, -1, "y", torch.zeros(4), 0)
    v.broadcasts_to("mask", torch.ones(1, 4), (3, 4), "the scores' shape")
    assert v.broadcastable("leading", [(2, 1), (1, 3)], "batch") == (2, 3)


# ---- bad input: type, value, and the message names argument, expectation and what came ---

BAD = [
    (lambda: v.integer("dim", 2.0), TypeError, r"^dim must be an int, got 2\.0$"),
    (lambda: v.integer("dim", True), TypeError, r"^dim must be an int, got True$"),
    (lambda: v.integer("dim", "4"), TypeError, r"^dim must be an int, got '4'$"),
    (
        lambda: v.positive_int("dim", 0),
        ValueError,
        r"^dim must be a positive int, got 0$",
    ),
    (lambda: v.positive_int("dim", 7, even=True), ValueError, r"an even int, got 7"),
    (
        lambda: v.integer("k", 5, maximum=4),
        ValueError,
        r"^k must be an int <= 4, got 5$",
    ),
    (
        lambda: v.integer("k", -2, minimum=0),
        ValueError,
        r"^k must be an int >= 0, got -2$",
    ),
    (lambda: v.real("base", 1 + 2j), TypeError, r"^base must be a real number"),
    (lambda: v.real("base", float("nan")), ValueError, r"finite real number, got nan"),
    (lambda: v.real("base", 1.0, exclusive_minimum=1.0), ValueError, r"> 1, got 1\.0"),
    (
        lambda: v.positive_real("eps", -1.0),
        ValueError,
        r"^eps must be a real number > 0",
    ),
    (lambda: v.flag("is_causal", 1), TypeError, r"^is_causal must be a bool, got 1$"),
    (lambda: v.flag("is_causal", "yes"), TypeError, r"must be a bool, got 'yes'"),
    (lambda: v.choice("layout", "x", ("half",)), ValueError, r"one of 'half', got 'x'"),
    (lambda: v.choice("layout", 3, ("half",)), TypeError, r"one of 'half', got 3"),
    (lambda: v.callable_("fn", 3), TypeError, r"^fn must be callable, got 3$"),
    (lambda: v.dtype("dtype", "float32"), TypeError, r"torch\.float32, got the string"),
    (
        lambda: v.dtype("dtype", torch.int64),
        TypeError,
        r"floating torch\.dtype, got torch",
    ),
    (
        lambda: v.device("device", "gpu"),
        ValueError,
        r"^device must be a device such as",
    ),
    (lambda: v.device("device", 0.5), TypeError, r"^device must be a torch\.device"),
    (
        lambda: v.tensor("x", [1.0]),
        TypeError,
        r"^x must be a torch\.Tensor, got a list$",
    ),
    (
        lambda: v.tensor("x", torch.ones(2, dtype=torch.complex64)),
        TypeError,
        r"^x must be a floating-point tensor, got a tensor of dtype torch\.complex64$",
    ),
    (
        lambda: v.tensor("ids", torch.ones(2), dtype="integer"),
        TypeError,
        r"^ids must be an integer tensor",
    ),
    (lambda: v.tensor("x", torch.ones(2, device="meta")), ValueError, r"'meta' device"),
    (
        lambda: v.tensor("x", torch.ones(2), ndim=2),
        ValueError,
        r"2 dimensions, got shape",
    ),
    (lambda: v.tensor("x", torch.ones(2), min_ndim=2), ValueError, r"at least 2 dim"),
    (
        lambda: v.tensor("x", torch.ones(0, 3), nonempty=True),
        ValueError,
        r"not be empty",
    ),
    (
        lambda: v.size("x", torch.ones(2, 3), -1, 4),
        ValueError,
        r"size 4 in dimension -1",
    ),
    (lambda: v.even_size("x", torch.ones(2, 3)), ValueError, r"even, positive size"),
    (
        lambda: v.same_size("q", torch.ones(2, 3), -1, "k", torch.ones(2, 4), -1),
        ValueError,
        r"^q and k must have the same size",
    ),
    (
        lambda: v.same_dtype("k", torch.ones(1).double(), "query", torch.ones(1)),
        TypeError,
        r"^k must have query's dtype torch\.float32",
    ),
    (
        lambda: v.broadcastable("q", [(2,), (3,)], "batch"),
        ValueError,
        r"must broadcast",
    ),
    (
        lambda: v.broadcasts_to("mask", torch.ones(5, 4), (3, 4), "scores"),
        ValueError,
        r"^mask must broadcast to scores \(3, 4\)",
    ),
    (lambda: v.module("model", 3), TypeError, r"^model must be a Module, got 3$"),
    (lambda: v.int_sequence("shape", []), TypeError, r"non-empty sequence of ints"),
    (
        lambda: v.int_sequence("shape", (2, 0), minimum=1),
        ValueError,
        r"shape\[1\] must be",
    ),
]


@pytest.mark.parametrize(("call", "exc", "match"), BAD)
def test_bad_input_message(call, exc, match) -> None:
    with pytest.raises(exc, match=match):
        call()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_a_device_this_machine_lacks_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"0 CUDA devices available"):
        v.device("device", "cuda:0")


def test_same_device_message() -> None:
    x = torch.ones(1)
    fake = torch.ones(1, device="meta")
    with pytest.raises(
        ValueError, match=r"^w must be on x's device cpu, got a tensor on meta"
    ):
        v.same_device("w", fake, "x", x)
