r"""The colour scheme of :mod:`companion.plotting`: one colour per scheme, the same in
every chapter, and the other spellings each scheme answers to.

Private: :mod:`companion.plotting` re-exports :data:`~companion.plotting.SCHEME_COLORS`
and :func:`~companion.plotting.scheme_color` and is where they are documented and
tested.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType

from matplotlib import colormaps
from matplotlib.colors import to_hex

from companion import _validate

__all__: list[str] = []  # private: nothing here is part of the documented API

# ---- Colours: one per scheme, the same in every chapter ------------------------------

#: One colour per position scheme, context-extension method, normalization,
#: implementation and dtype the chapters compare. Read-only. Groups that appear together
#: in a figure have distinct colours; tab10 hues for schemes, PyTorch/Hugging Face/Meta
#: brand hues for implementations.
SCHEME_COLORS: Mapping[str, str] = MappingProxyType(
    {
        # position schemes
        "none": "#7f7f7f",
        "sinusoidal": "#1f77b4",
        "learned": "#8c564b",
        "rope": "#d62728",
        "alibi": "#2ca02c",
        # context-extension methods
        "pi": "#ff7f0e",
        "ntk": "#9467bd",
        "dynamic-ntk": "#e377c2",
        "yarn": "#17becf",
        "llama3": "#bcbd22",
        # normalization and where it sits
        "batch": "#7570b3",
        "layer": "#1b9e77",
        "rms": "#d95f02",
        "pre-ln": "#66a61e",
        "post-ln": "#e7298a",
        # implementations compared
        "companion": "#222222",
        "torch": "#ee4c2c",
        "hf": "#e6a100",
        "meta": "#0668e1",
        # dtypes
        "float64": "#56b4e9",
        "float32": "#0072b2",
        "bfloat16": "#cc79a7",
        "float16": "#009e73",
    }
)

# Other spellings of each scheme (compared after lower-casing, dropping a trailing
# parenthetical and turning spaces and underscores into hyphens).
_OTHER_NAMES = {
    "none": "no-scaling nope no-positions",
    "sinusoidal": "sin sinusoidal-encoding",
    "learned": "absolute learned-absolute",
    "rope": "rotary",
    "pi": "linear position-interpolation",
    "ntk": "ntk-aware",
    "dynamic-ntk": "dynamic dynamic-ntk-aware",
    "llama3": "llama-3",
    "batch": "batchnorm batch-norm",
    "layer": "layernorm layer-norm",
    "rms": "rmsnorm rms-norm",
    "pre-ln": "pre-layernorm",
    "post-ln": "post-layernorm",
    "companion": "ours",
    "torch": "pytorch",
    "hf": "huggingface hugging-face transformers",
    "float64": "fp64",
    "float32": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16",
}
_ALIASES = {
    alias: key for key, names in _OTHER_NAMES.items() for alias in names.split()
}
# matplotlib's default colour cycle, for series that name no scheme
TAB10 = tuple(to_hex(c) for c in colormaps["tab10"].colors)


def scheme_key(label: str) -> str | None:
    key = re.sub(r"\s*\([^()]*\)\s*$", "", label.strip().lower())
    key = re.sub(r"[\s_]+", "-", key)
    key = _ALIASES.get(key, key)
    return key if key in SCHEME_COLORS else None


def scheme_color(name: str) -> str:
    """The colour of a scheme, as a hex string.

    ``scheme_color("RoPE") == SCHEME_COLORS["rope"]``. Case, spaces, underscores and a
    trailing parenthetical do not matter, and common other names are understood
    (``"position interpolation"`` is ``"pi"``, ``"RMSNorm"`` is ``"rms"``,
    ``"Hugging Face"`` is ``"hf"``).

    Args:
        name: a key of :data:`SCHEME_COLORS` or one of its other spellings.

    Returns:
        The colour, e.g. ``"#d62728"`` for RoPE.
    """
    _validate.instance("name", name, str, "a str")
    key = scheme_key(name)
    if key is None:
        listed = ", ".join(repr(k) for k in SCHEME_COLORS)
        raise ValueError(f"name must name a scheme ({listed}), got {name!r}")
    return SCHEME_COLORS[key]


# ---- Colours of the diagrams' roles, apart from the schemes' ---------------------------

#: One colour per role a conceptual diagram draws (companion.diagrams): none of them is a
#: scheme's colour, so that red stays RoPE, green ALiBi and orange PI in every chapter
#: (tests/test_diagrams.py checks the two palettes are disjoint).
ROLE_COLORS: Mapping[str, str] = MappingProxyType(
    {
        "query": "#4b0082",  # indigo: queries, a block of scores being read
        "key": "#a6761d",  # ochre: keys
        "cached": "#b8c7d9",  # pale slate: what a cache holds
        "sink": "#6b3e26",  # dark umber: the sink tokens
        "exact": "#d9d9d9",  # light grey: a bucket of one distance
        "range": "#9e9e9e",  # mid grey: a bucket of several distances
        "full": "#c6d7c0",  # pale sage: a tile computed in full
        "masked": "#e8d5b0",  # pale sand: a tile computed with the mask
    }
)
