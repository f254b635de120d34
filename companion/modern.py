r"""The attention layer of 2024-2025: soft-capping, QK-norm bounds, sliding windows,
attention sinks and padding.

The chapter "The attention layer of 2024-2025" derives each function; this module holds
the math. It never imports :mod:`companion.decoder` or :mod:`companion.mla` at module
level (``decoder`` imports :func:`softcap` from here for Gemma 2).
"""

from __future__ import annotations

import torch

from companion import _validate

__all__ = [
    "softcap",
]


def softcap(x: torch.Tensor, cap: float) -> torch.Tensor:
    r"""Soft-capping, :math:`\mathrm{cap}\cdot\tanh(x/\mathrm{cap})`, elementwise.

    Gemma 2 applies it to the attention logits (``attn_logit_softcapping``, 50.0) before
    the mask and softmax, and to the final logits (``final_logit_softcapping``, 30.0).
    It is odd, increasing, close to the identity for :math:`|x| \ll \mathrm{cap}`
    (:math:`x - x^3/(3\,\mathrm{cap}^2) + \dots`) and bounded:
    :math:`|\mathrm{softcap}(x)| < \mathrm{cap}`. Matches Hugging Face's Gemma 2
    (``logits / cap``, ``tanh``, ``* cap``) to rounding.

    Args:
        x: logits, a floating tensor of any shape; ``-inf`` (a masked logit) maps to
            ``-cap``, so apply the mask after capping, as Gemma 2 does.
        cap: the cap, a finite real number > 0.

    Shape:
        ``x``: ``(...)``; output: ``(...)``, the dtype and device of ``x``.
    """
    _validate.tensor("x", x)
    cap = _validate.positive_real("cap", cap)
    return torch.tanh(x / cap) * cap
