"""RoPE's arguments, checked in one place for its two entry points (private).

:func:`companion.rope.apply_rope` and :func:`companion.kernels.rope` take the same
``x``, ``cos``, ``sin``, ``layout``, ``seq_dim`` and ``positions``; both check them with
:func:`rope_arguments`, so that neither module imports the other
(``apply_rope(backend="triton")`` calls :mod:`companion.kernels`, which must not call
back into :mod:`companion.rope`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from companion import _validate

__all__: list[str] = []  # private: apply_rope and kernels.rope are the entry points

LAYOUTS = ("half", "interleaved")
"""The pairings :func:`companion.rope.apply_rope` understands."""


def rope_arguments(
    x: object,
    cos: object,
    sin: object,
    layout: object,
    seq_dim: object,
    positions: object,
) -> tuple[Tensor, tuple[Tensor, Tensor], tuple[Tensor, Tensor], str, int]:
    """Every argument of a RoPE call checked, before any computation.

    Returns ``(x, table, aligned, layout, s)``: ``table`` the cos/sin rows of ``x``'s
    positions, ``(L, D/2)`` or ``(B, L, D/2)`` (``positions`` taken); ``aligned`` the
    same viewed to broadcast against ``x``; ``s`` the non-negative axis of the
    positions.
    """
    x = _validate.tensor("x", x, min_ndim=2, meaning="(..., L, D)")
    _validate.even_size("x", x, -1, "head_dim: RoPE rotates pairs")
    s = _validate.axis(
        "seq_dim", seq_dim, x.ndim, exclude=-1, why="not the last, head_dim"
    )
    layout = _validate.choice("layout", layout, LAYOUTS)
    table_ndim = 2 if positions is not None else 3  # (T, D/2); (L, D/2) or (B, L, D/2)
    cos = _validate.tensor("cos", cos, min_ndim=2, max_ndim=table_ndim)
    sin = _validate.tensor("sin", sin)
    _validate.shape("sin", sin, cos.shape, "of cos")
    _validate.same_dtype("sin", sin, "cos", cos)
    _validate.same_device("cos", cos, "x", x)
    _validate.same_device("sin", sin, "x", x)
    if positions is not None:  # rows of a precomputed (T, D/2) table
        positions = _validate.tensor(
            "positions", positions, dtype="integer", min_ndim=1, max_ndim=2
        )
        _validate.same_device("positions", positions, "cos", cos)
        if positions.numel() and not torch.compiler.is_compiling():
            low, high = int(positions.min()), int(positions.max())
            if low < 0 or high >= cos.shape[0]:
                raise ValueError(
                    f"positions must lie in [0, {cos.shape[0]}) for a table of "
                    f"{cos.shape[0]} rows, got values in [{low}, {high}]: recompute "
                    "the table with rope_cos_sin for the positions you need"
                )
        _validate.size(
            "positions", positions, -1, x.shape[s], "L, x's size along seq_dim"
        )
        cos, sin = cos[positions], sin[positions]  # (L, D/2) or (B, L, D/2)
    aligned = align_table("cos", cos, x, s), align_table("sin", sin, x, s)
    return x, (cos, sin), aligned, layout, s


def align_table(name: str, t: Tensor, x: Tensor, s: int) -> Tensor:
    """Check that the table ``t``, ``(L, D/2)`` or ``(B, L, D/2)``, matches ``x`` (L on
    axis ``s``) and return the view of it that broadcasts against ``x``."""
    pairs, length, after = x.shape[-1] // 2, x.shape[s], x.ndim - 2 - s  # after: heads
    _validate.size(name, t, -1, pairs, "D/2, half of x's last dimension")
    _validate.size(name, t, -2, length, "L, x's size along seq_dim")
    if t.ndim == 2:  # (L, D/2), shared by every sequence
        return t.reshape(length, *([1] * after), pairs) if after else t
    if s == 0 or t.shape[0] not in (1, x.shape[0]):
        raise ValueError(
            f"{name} of shape (B, L, D/2) must have B = 1 or B = x.shape[0] = "
            f"{x.shape[0]} "
            f"with a batch axis before L in x, got {name} {tuple(t.shape)} and x "
            f"{tuple(x.shape)} with L on axis {s}"
        )
    return t.reshape(t.shape[0], *([1] * (s - 1)), length, *([1] * after), pairs)
