r"""The one validation layer of ``companion``: every public function checks its arguments here.

The contract (README, API page): bad input raises :class:`TypeError` (wrong *type*: a list
where a tensor is meant, a float where an int is meant, a complex tensor where a real one is
meant) or :class:`ValueError` (right type, wrong *value*: an odd width, a negative length,
mismatched shapes, a tensor on another device), *before any computation*, with a message that
names the argument, says what was expected and what came::

    dim must be a positive even int, got 7
    query must be a floating-point tensor, got a tensor of dtype torch.int64

One argument order everywhere: ``(name, value, ...)``. Every helper returns the value in a
normalised form (a Python ``int`` for any :class:`numbers.Integral`, a ``float`` for any
:class:`numbers.Real`, a :class:`torch.dtype`, a :class:`torch.device`), so a caller writes::

    dim = _validate.positive_int("dim", dim, even=True)
    x = _validate.tensor("x", x, dtype="floating", min_ndim=2)

This module is private (its name starts with an underscore) and has no state.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import Tensor

__all__: list[str] = []  # private: nothing here is part of the documented API

# dtype families a function can ask for by name
_FAMILIES: dict[str, Callable[[torch.dtype], bool]] = {
    "floating": lambda d: d.is_floating_point,
    "complex": lambda d: d.is_complex,
    "integer": lambda d: (
        not d.is_floating_point and not d.is_complex and d != torch.bool
    ),
    "bool": lambda d: d == torch.bool,
}
_ARTICLE = {
    "floating": "a floating-point",
    "complex": "a complex",
    "integer": "an integer",
}


# ---- describing what came ------------------------------------------------------------------


def describe(value: object) -> str:
    """A short description of ``value`` for an error message: the value itself for scalars,
    type, dtype, shape and device for a tensor, the type name otherwise."""
    if isinstance(value, Tensor):
        where = "" if value.device.type == "cpu" else f" on {value.device}"
        return f"a tensor of dtype {value.dtype} and shape {tuple(value.shape)}{where}"
    if value is None or isinstance(value, (bool, numbers.Number, str, torch.dtype)):
        return repr(value)
    if isinstance(value, torch.device):
        return f"device {str(value)!r}"
    return f"a {type(value).__name__}"


def fail(exc: type[Exception], name: str, expected: str, value: object) -> Exception:
    """The package's one error message: ``exc("<name> must be <expected>, got <value>")``,
    returned for the caller to raise (so the traceback points at the check)."""
    return exc(f"{name} must be {expected}, got {describe(value)}")


# ---- Python scalars ----------------------------------------------------------------------------


def integer(
    name: str,
    value: object,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    even: bool = False,
) -> int:
    """An integer (any :class:`numbers.Integral`, NumPy's included; not ``bool``, not a float
    with an integral value), optionally within ``[minimum, maximum]`` and even."""
    expected = "an int" if not even else "an even int"
    if (
        isinstance(value, Tensor)
        and value.ndim == 0
        and _FAMILIES["integer"](value.dtype)
    ):
        value = int(value.item())  # a 0-d integer tensor is an integer
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise fail(TypeError, name, expected, value)
    value = int(value)
    if not -(2**63) <= value < 2**63:  # beyond int64, torch's sizes and indices
        raise fail(ValueError, name, f"{expected} that fits in 64 bits", value)
    if minimum is not None and value < minimum:
        if minimum == 1:
            raise fail(
                ValueError, name, "a positive " + expected.split(" ", 1)[1], value
            )
        raise fail(ValueError, name, f"{expected} >= {minimum}", value)
    if maximum is not None and value > maximum:
        raise fail(ValueError, name, f"{expected} <= {maximum}", value)
    if even and value % 2:
        raise fail(ValueError, name, expected, value)
    return value


def positive_int(name: str, value: object, *, even: bool = False) -> int:
    """An integer >= 1 (even if ``even``)."""
    return integer(name, value, minimum=1, even=even)


def nonnegative_int(name: str, value: object) -> int:
    """An integer >= 0."""
    return integer(name, value, minimum=0)


def real(
    name: str,
    value: object,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    exclusive_minimum: float | None = None,
    finite: bool = True,
) -> float:
    """A real number (any :class:`numbers.Real`, not ``bool``, not complex), finite unless
    ``finite=False``, within the given bounds."""
    if isinstance(value, Tensor) and value.ndim == 0 and value.dtype.is_floating_point:
        value = float(value.item())
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise fail(TypeError, name, "a real number", value)
    value = float(value)
    if math.isnan(value) or (finite and math.isinf(value)):
        raise fail(ValueError, name, "a finite real number", value)
    if minimum is not None and value < minimum:
        raise fail(ValueError, name, f"a real number >= {minimum:g}", value)
    if exclusive_minimum is not None and value <= exclusive_minimum:
        raise fail(ValueError, name, f"a real number > {exclusive_minimum:g}", value)
    if maximum is not None and value > maximum:
        raise fail(ValueError, name, f"a real number <= {maximum:g}", value)
    return value


def positive_real(name: str, value: object) -> float:
    """A finite real number > 0."""
    return real(name, value, exclusive_minimum=0.0)


def optional(check: Callable[..., Any], name: str, value: object, **kwargs: Any) -> Any:
    """``None`` passes through; anything else goes through ``check(name, value, **kwargs)``."""
    return None if value is None else check(name, value, **kwargs)


def flag(name: str, value: object) -> bool:
    """A real ``bool`` (``True``/``False``, NumPy's ``bool_`` too); not 0/1, not a string."""
    if isinstance(value, bool):
        return value
    if type(value).__module__ == "numpy" and type(value).__name__ in ("bool_", "bool"):
        return bool(value)
    raise fail(TypeError, name, "a bool", value)


def choice(name: str, value: object, options: Iterable[str]) -> str:
    """One of the strings in ``options``."""
    options = tuple(options)
    if isinstance(value, str) and value in options:
        return value
    listed = ", ".join(
        repr(o) for o in options
    )  # only on failure: this runs on every call
    exc = TypeError if not isinstance(value, str) else ValueError
    raise fail(exc, name, f"one of {listed}", value)


def choices(name: str, value: object, options: Iterable[str]) -> tuple[str, ...]:
    """A non-empty tuple or list of distinct strings from ``options``, as a tuple."""
    if isinstance(value, str) or not isinstance(value, Sequence) or not value:
        raise fail(TypeError, name, "a non-empty sequence of names", value)
    options = tuple(options)
    picked = tuple(choice(f"{name}[{i}]", v, options) for i, v in enumerate(value))
    if len(set(picked)) != len(picked):
        raise ValueError(f"{name} must not repeat a name, got {picked}")
    return picked


def callable_(name: str, value: object) -> Callable[..., Any]:
    """Anything callable (a function, a module, a class)."""
    if not callable(value):
        raise fail(TypeError, name, "callable", value)
    return value  # type: ignore[return-value]


def instance(
    name: str, value: object, cls: type | tuple[type, ...], expected: str
) -> Any:
    """An instance of ``cls``, described to the user as ``expected``."""
    if not isinstance(value, cls):
        raise fail(TypeError, name, expected, value)
    return value


def int_sequence(
    name: str, value: object, *, minimum: int | None = None
) -> tuple[int, ...]:
    """An int or a non-empty sequence of ints (a shape), returned as a tuple."""
    if isinstance(value, (numbers.Integral, Tensor)) and not isinstance(value, bool):
        return (integer(name, value, minimum=minimum),)
    if (
        not isinstance(value, (Sequence, torch.Size))
        or isinstance(value, str)
        or not value
    ):
        raise fail(TypeError, name, "an int or a non-empty sequence of ints", value)
    return tuple(
        integer(f"{name}[{i}]", v, minimum=minimum) for i, v in enumerate(value)
    )


# ---- torch arguments ---------------------------------------------------------------------------


def dtype(
    name: str, value: object, *, family: str | Sequence[str] = "floating"
) -> torch.dtype:
    """A :class:`torch.dtype` of the given family ("floating", "complex", "integer", "bool").

    A string such as ``"float32"`` is a ``TypeError`` that names ``torch.float32``."""
    families = (family,) if isinstance(family, str) else tuple(family)
    if isinstance(value, str):
        raise TypeError(
            f"{name} must be a torch.dtype such as torch.{value.split('.')[-1]}, "
            f"got the string {value!r}"
        )
    if not isinstance(value, torch.dtype):
        raise fail(TypeError, name, "a torch.dtype", value)
    if not any(_FAMILIES[f](value) for f in families):
        kinds = " or ".join(f for f in families)
        raise fail(TypeError, name, f"a {kinds} torch.dtype", value)
    return value


def device(name: str, value: object) -> torch.device | None:
    """``None``, a :class:`torch.device`, or a device string that torch knows and this machine
    has (``"cpu"``, ``"cuda"``, ``"cuda:0"``, ``"mps"``)."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = torch.device(value)
        except RuntimeError:
            raise fail(
                ValueError, name, "a device such as 'cpu' or 'cuda'", value
            ) from None
    if not isinstance(value, torch.device):
        raise fail(TypeError, name, "a torch.device, a device string or None", value)
    if value.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (value.index or 0) >= count:
            raise ValueError(
                f"{name} must be a device this machine has, got {str(value)!r} "
                f"({count} CUDA device{'s' if count != 1 else ''} available)"
            )
    elif value.type == "mps" and not (
        hasattr(torch.backends, "mps") and torch.backends.mps.is_available()
    ):
        raise ValueError(
            f"{name} must be a device this machine has, got 'mps' (not available)"
        )
    elif value.type not in ("cpu", "cuda", "mps"):
        raise fail(ValueError, name, "a 'cpu', 'cuda' or 'mps' device", value)
    return value


def tensor(
    name: str,
    value: object,
    *,
    dtype: str | Sequence[str] | None = "floating",
    ndim: int | None = None,
    min_ndim: int | None = None,
    max_ndim: int | None = None,
    nonempty: bool = False,
    meaning: str = "",
) -> Tensor:
    """A :class:`torch.Tensor` of a dtype family (``None``: any), rank and non-emptiness.

    Tensors on the ``meta`` device carry no values and are refused: every function here
    computes numbers. ``meaning`` (e.g. ``"(..., L, D)"``) is added to a rank message."""
    if not isinstance(value, Tensor):
        raise fail(TypeError, name, "a torch.Tensor", value)
    if dtype is not None:
        families = (dtype,) if isinstance(dtype, str) else tuple(dtype)
        ok = (  # one family (the common case) without a generator: this runs on every call
            _FAMILIES[dtype](value.dtype)
            if isinstance(dtype, str)
            else any(_FAMILIES[f](value.dtype) for f in families)
        )
        if not ok:
            kinds = " or ".join(families)
            article = _ARTICLE.get(families[0], "a") if len(families) == 1 else "a"
            first = _ARTICLE.get(families[0], "a").split()[0]  # "an integer or ..."
            what = (
                f"{article} tensor" if len(families) == 1 else f"{first} {kinds} tensor"
            )
            if len(families) == 1 and families[0] == "bool":
                what = "a bool tensor"
            raise TypeError(
                f"{name} must be {what}, got a tensor of dtype {value.dtype}"
            )
    if value.is_meta:
        raise ValueError(f"{name} must hold values, got a tensor on the 'meta' device")
    rank = f" {meaning}" if meaning else ""
    if ndim is not None and value.ndim != ndim:
        raise ValueError(
            f"{name} must have {ndim} dimensions{rank}, got shape {tuple(value.shape)}"
        )
    if min_ndim is not None and value.ndim < min_ndim:
        raise ValueError(
            f"{name} must have at least {min_ndim} dimensions{rank}, got shape {tuple(value.shape)}"
        )
    if max_ndim is not None and value.ndim > max_ndim:
        raise ValueError(
            f"{name} must have at most {max_ndim} dimensions{rank}, got shape {tuple(value.shape)}"
        )
    if nonempty and value.numel() == 0:
        raise ValueError(f"{name} must not be empty, got shape {tuple(value.shape)}")
    return value


def size(name: str, value: Tensor, dim: int, expected: int, what: str = "") -> None:
    """``value.shape[dim] == expected``; ``what`` names the expected size (e.g. "head_dim")."""
    if value.shape[dim] != expected:
        label = f" ({what})" if what else ""
        raise ValueError(
            f"{name} must have size {expected}{label} in dimension {dim}, "
            f"got shape {tuple(value.shape)}"
        )


def per_seed(record: object, seeds_from: str, max_ndim: int) -> None:
    """Every field of the dataclass ``record`` is a tensor of 1 to ``max_ndim`` axes
    whose first axis counts the seeds, as many as the field ``seeds_from`` has (the
    per-seed records of the trained chapters' measures)."""
    fields = record.__dataclass_fields__  # type: ignore[attr-defined]
    for name in fields:
        tensor(name, getattr(record, name), min_ndim=1, max_ndim=max_ndim)
    seeds = getattr(record, seeds_from).shape[0]
    for name in fields:
        size(name, getattr(record, name), 0, seeds, "one per seed")


def even_size(name: str, value: Tensor, dim: int = -1, why: str = "") -> int:
    """``value.shape[dim]`` is even and positive; returns it."""
    n = value.shape[dim]
    if n <= 0 or n % 2:
        reason = f" ({why})" if why else ""
        raise ValueError(
            f"{name} must have an even, positive size in dimension {dim}{reason}, "
            f"got shape {tuple(value.shape)}"
        )
    return n


def same_size(
    name_a: str,
    a: Tensor,
    dim_a: int,
    name_b: str,
    b: Tensor,
    dim_b: int,
    what: str = "",
) -> None:
    """``a.shape[dim_a] == b.shape[dim_b]``."""
    if a.shape[dim_a] != b.shape[dim_b]:
        label = f" {what}" if what else ""
        raise ValueError(
            f"{name_a} and {name_b} must have the same{label} size, got {name_a} "
            f"{tuple(a.shape)} and {name_b} {tuple(b.shape)}"
        )


def axis(
    name: str, value: object, ndim: int, *, exclude: int | None = None, why: str = ""
) -> int:
    """An axis of a tensor with ``ndim`` dimensions (negative counts from the end), returned
    in ``[0, ndim)``; the axis ``exclude`` (e.g. ``-1``) may not be named."""
    value = integer(name, value)
    excluded = exclude is not None and ndim > 0 and value % ndim == exclude % ndim
    if not -ndim <= value < ndim or excluded:
        reason = f" ({why})" if why else ""
        raise ValueError(
            f"{name} must be an axis of a {ndim}-dimensional tensor{reason}, got {value}"
        )
    return value % ndim


def same_dtype(name: str, value: Tensor, ref_name: str, ref: Tensor) -> None:
    """``value`` has ``ref``'s dtype."""
    if value.dtype != ref.dtype:
        raise TypeError(
            f"{name} must have {ref_name}'s dtype {ref.dtype}, got a tensor of dtype {value.dtype}"
        )


def same_device(name: str, value: Tensor, ref_name: str, ref: Tensor) -> None:
    """``value`` lives on ``ref``'s device."""
    if value.device != ref.device:
        raise ValueError(
            f"{name} must be on {ref_name}'s device {ref.device}, got a tensor on {value.device}"
        )


def broadcastable(
    name: str, shapes: Sequence[Sequence[int]], what: str
) -> tuple[int, ...]:
    """The broadcast of ``shapes``; a ValueError naming ``name`` and ``what`` if none."""
    try:
        return tuple(torch.broadcast_shapes(*[torch.Size(s) for s in shapes]))
    except RuntimeError:
        raise ValueError(
            f"{name} must broadcast ({what}), got shapes {[tuple(s) for s in shapes]}"
        ) from None


def broadcasts_to(name: str, value: Tensor, shape: Sequence[int], what: str) -> None:
    """``value`` broadcasts to exactly ``shape`` (it may not enlarge it)."""
    try:
        ok = tuple(torch.broadcast_shapes(value.shape, torch.Size(shape))) == tuple(
            shape
        )
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(
            f"{name} must broadcast to {what} {tuple(shape)}, got shape {tuple(value.shape)}"
        )


def module(
    name: str, value: object, cls: type | tuple[type, ...] = torch.nn.Module
) -> Any:
    """An ``nn.Module`` (or a given subclass)."""
    names = (
        cls.__name__ if isinstance(cls, type) else " or ".join(c.__name__ for c in cls)
    )
    return instance(name, value, cls, f"a {names}")


def shape(name: str, value: Tensor, expected: Sequence[int], what: str = "") -> None:
    """``value.shape == expected``; ``what`` names the expected shape (e.g. "(D,)")."""
    if tuple(value.shape) != tuple(expected):
        label = f" {what}" if what else ""
        raise ValueError(
            f"{name} must have shape{label} {tuple(expected)}, got shape {tuple(value.shape)}"
        )


def tensor_like(
    name: str, value: object, ref_name: str, ref: Tensor, **kwargs: Any
) -> Tensor:
    """A tensor as :func:`tensor` checks it (``kwargs``), with ``ref``'s dtype and device."""
    value = tensor(name, value, **kwargs)
    same_dtype(name, value, ref_name, ref)
    same_device(name, value, ref_name, ref)
    return value


# ---- attention inputs --------------------------------------------------------------------------


def attention_inputs(
    query: object, key: object, value: object = None, *, positive_width: bool = True
) -> tuple[int, ...]:
    """``query (..., L, D)``, ``key (..., S, D)`` and, unless ``None``, ``value (..., S, Dv)``:
    floating tensors of one dtype on one device, whose leading dimensions broadcast; ``D > 0``
    if ``positive_width`` (the default scale is ``1/sqrt(D)``). Returns the broadcast leading
    (batch, head) shape."""
    query = tensor("query", query, min_ndim=2, meaning="(..., L, D)")
    key = tensor_like("key", key, "query", query, min_ndim=2, meaning="(..., S, D)")
    same_size("query", query, -1, "key", key, -1, "feature-width (D)")
    if positive_width and query.shape[-1] == 0:
        raise ValueError(
            f"query must have a positive feature width D, got shape {tuple(query.shape)}"
        )
    shapes = [query.shape[:-2], key.shape[:-2]]
    if value is not None:
        value = tensor_like(
            "value", value, "query", query, min_ndim=2, meaning="(..., S, Dv)"
        )
        same_size("key", key, -2, "value", value, -2, "length (S)")
        shapes.append(value.shape[:-2])
    names = "query, key and value" if value is not None else "query and key"
    return broadcastable(names, shapes, "their leading (batch, head) dimensions")


def mask(
    name: str, value: object, shape: Sequence[int], ref_name: str, ref: Tensor
) -> Tensor:
    """An attention mask: a bool (``True`` = may attend) or floating (added) tensor on
    ``ref``'s device that broadcasts to the scores' ``shape``. Integer masks are refused:
    neither reading (keep or add) is safe to guess."""
    value = tensor(name, value, dtype=("bool", "floating"))
    same_device(name, value, ref_name, ref)
    broadcasts_to(name, value, shape, "the scores' shape (..., L, S)")
    return value


def factory_kwargs(device_arg: object, dtype_arg: object) -> dict[str, Any]:
    """A module's ``device`` and ``dtype`` arguments (``None``: torch's defaults),
    validated, as keyword arguments for torch's factories and ``nn.Linear``."""
    return {
        "device": device("device", device_arg),
        "dtype": optional(dtype, "dtype", dtype_arg),
    }


# ---- containers and divisibility -------------------------------------------------------


def sequence(
    name: str, value: object, *, length: int | None = None, what: str = "values"
) -> tuple:
    """A tuple or list (not a string, not a tensor), of exactly ``length`` items if
    given, returned as a tuple; ``what`` names the items in a message."""
    if not isinstance(value, (tuple, list)):
        count = "" if length is None else f"{length} "
        raise fail(TypeError, name, f"a tuple or list of {count}{what}", value)
    if length is not None and len(value) != length:
        raise ValueError(f"{name} must hold {length} {what}, got {len(value)}")
    return tuple(value)


def layer_indices(name: str, value: object, num_layers: int) -> tuple[int, ...]:
    """Layer indices in ``[0, num_layers)``, increasing, each once (a tuple or list)."""
    items = sequence(name, value, what="layer indices")
    layers = tuple(
        integer(f"{name}[{j}]", i, minimum=0, maximum=num_layers - 1)
        for j, i in enumerate(items)
    )
    if layers != tuple(sorted(set(layers))):
        raise ValueError(
            f"{name} must be increasing layer indices (each once), got {layers}"
        )
    return layers


def divisor(name: str, value: object, of_name: str, of: int) -> int:
    """A positive int that divides ``of`` (the value of ``of_name``)."""
    value = positive_int(name, value)
    if of % value:
        raise ValueError(f"{name} must divide {of_name} ({of}), got {value}")
    return value


# ---- padding masks -----------------------------------------------------------------------


def padding_mask(name: str, value: object) -> Tensor:
    """Hugging Face's 2-D ``attention_mask``: a ``(B, S)`` bool or integer tensor of 0/1
    (1 = a token, 0 = padding), returned as a bool tensor."""
    value = tensor(name, value, dtype=("integer", "bool"), ndim=2, meaning="(B, S)")
    if value.dtype != torch.bool and ((value != 0) & (value != 1)).any():
        raise ValueError(
            f"{name} must hold only 0 and 1, got values in "
            f"[{int(value.min())}, {int(value.max())}]"
        )
    return value.bool()


def fixed_fields(spec: object, fixed: dict[str, tuple[Any, str]], owner: str) -> None:
    """A family's spec fields that must hold one value: ``fixed`` maps a field to
    ``(expected, why)``; the first that differs raises ``"<field> must be <expected>
    in <owner> (<why>), got <value>"`` (``owner``, e.g. ``"an MLASpec"``)."""
    for name, (expected, why) in fixed.items():
        got = getattr(spec, name)
        if got != expected:
            raise ValueError(
                f"{name} must be {expected!r} in {owner} ({why}), got {got!r}"
            )
