r"""Sinusoidal positional encoding (chapter :ref:`ch-sinusoidal`).

The encoding of Vaswani et al. (2017), in its original *interleaved* layout: for
position :math:`\text{pos}` and pair index :math:`i = 0, \ldots, D/2 - 1`,

.. math::

    \omega_i = \text{base}^{-2i/D}, \qquad
    \mathrm{PE}(\text{pos}, 2i) = \sin(\text{pos}\,\omega_i), \qquad
    \mathrm{PE}(\text{pos}, 2i+1) = \cos(\text{pos}\,\omega_i).

This is the layout of the paper, of the Annotated Transformer and of
``transformers``' ``create_sinusoidal_embeddings`` (used by DistilBERT). Other code bases use
the *halves* layout (all sines, then all cosines: tensor2tensor, fairseq, Hugging Face's
``SinusoidalPositionalEmbedding``); the two differ by a fixed permutation of the columns.

Angles are computed in float64 and cast at the end, so the values are accurate to the
output dtype's rounding for positions up to at least :math:`10^6` (a float32 angle
``pos * omega`` is off by up to ``pos * 6e-8`` radians, 0.06 at a million).

Derivations (the shift theorem, the dot product as a function of the offset) are in the
chapter; the functions here only implement them.
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor, nn

__all__ = [
    "SinusoidalPositionalEncoding",
    "shift_matrix",
    "sinusoidal_dot_products",
    "sinusoidal_encoding",
    "sinusoidal_frequencies",
    "sinusoidal_wavelengths",
]


def _check_dim(dim: object) -> int:
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral):
        raise TypeError(f"dim must be an int, got {type(dim).__name__}")
    dim = int(dim)
    if dim <= 0 or dim % 2:
        raise ValueError(f"dim must be a positive even integer, got {dim}")
    return dim


def _check_base(base: object) -> float:
    if isinstance(base, bool) or not isinstance(base, numbers.Real):
        raise TypeError(f"base must be a real number, got {type(base).__name__}")
    base = float(base)
    if not math.isfinite(base) or base <= 1.0:
        raise ValueError(f"base must be a finite number > 1, got {base}")
    return base


def _check_length(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    value = int(value)
    if value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value}")
    return value


def _check_float_dtype(dtype: object) -> torch.dtype:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype}")
    return dtype


def sinusoidal_frequencies(dim: int, *, base: float = 10000.0) -> Tensor:
    r"""Angular frequencies :math:`\omega_i = \text{base}^{-2i/D}` of the ``D/2`` pairs.

    A geometric progression from :math:`\omega_0 = 1` down to
    :math:`\omega_{D/2-1} = \text{base}^{-(D-2)/D}` (just above ``1/base``), computed in
    float64 on the CPU.

    Args:
        dim: the encoding width ``D``; a positive even integer.
        base: the base of the progression (10000 in the paper).

    Returns:
        The frequencies, float64.

    Shape:
        output: ``(D // 2,)``.
    """
    dim = _check_dim(dim)
    base = _check_base(base)
    i = torch.arange(dim // 2, dtype=torch.float64)  # pair index, 0 .. D/2 - 1
    return base ** (-2.0 * i / dim)


def sinusoidal_wavelengths(dim: int, *, base: float = 10000.0) -> Tensor:
    r"""Wavelengths :math:`\lambda_i = 2\pi / \omega_i` of the ``D/2`` pairs, in positions.

    From :math:`2\pi` (pair 0) up to just below :math:`2\pi \cdot \text{base}`.

    Args:
        dim: the encoding width ``D``; a positive even integer.
        base: the base of the progression.

    Returns:
        The wavelengths, float64.

    Shape:
        output: ``(D // 2,)``.
    """
    return 2.0 * math.pi / sinusoidal_frequencies(dim, base=base)


def sinusoidal_encoding(
    num_positions: int,
    dim: int,
    *,
    base: float = 10000.0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> Tensor:
    r"""The sinusoidal position table of Vaswani et al. (2017), interleaved layout.

    Row ``pos`` is :math:`\mathrm{PE}(\text{pos})`: column ``2i`` holds
    :math:`\sin(\text{pos}\,\omega_i)` and column ``2i + 1`` holds
    :math:`\cos(\text{pos}\,\omega_i)`, with :math:`\omega_i` from
    :func:`sinusoidal_frequencies`. Angles are formed in float64 and only the result is cast to
    ``dtype``, so every entry is within the rounding of ``dtype`` of the exact value for
    positions up to at least :math:`10^6`.

    Args:
        num_positions: number of positions ``L`` (positions ``0 .. L - 1``); at least 1.
        dim: the encoding width ``D``; a positive even integer.
        base: the base of the frequency progression.
        dtype: floating-point dtype of the result.
        device: device of the result.

    Returns:
        The table ``PE``, with ``PE[pos]`` the encoding of position ``pos``.

    Shape:
        output: ``(L, D)``.
    """
    num_positions = _check_length("num_positions", num_positions)
    dtype = _check_float_dtype(dtype)
    omega = sinusoidal_frequencies(dim, base=base).to(device)  # (D/2,) float64
    pos = torch.arange(num_positions, dtype=torch.float64, device=device)  # (L,)
    angles = pos[:, None] * omega[None, :]  # (L, D/2), float64: exact enough at pos = 1e6
    pe = torch.stack((torch.sin(angles), torch.cos(angles)), dim=-1)  # (L, D/2, 2)
    return pe.flatten(-2).to(dtype)  # (L, D): sin, cos, sin, cos, ...


def shift_matrix(
    k: int | float,
    dim: int,
    *,
    base: float = 10000.0,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
) -> Tensor:
    r"""The block-diagonal rotation :math:`T(k)` with :math:`\mathrm{PE}(\text{pos}+k) = \mathrm{PE}(\text{pos})\,T(k)`.

    Row-vector convention (``PE`` rows times ``T`` on the right), matching
    :func:`sinusoidal_encoding`'s ``[sin, cos]`` pairs. Block ``i`` sits at rows and columns
    ``2i, 2i + 1`` and is

    .. math::

        \Phi_i(k) = \begin{bmatrix} \cos k\omega_i & -\sin k\omega_i \\
                                    \sin k\omega_i & \cos k\omega_i \end{bmatrix},

    since :math:`[\sin a, \cos a]\,\Phi_i(k) = [\sin(a + k\omega_i), \cos(a + k\omega_i)]`.
    :math:`T(k)` does not depend on ``pos``; it is orthogonal, :math:`T(k)^\top = T(-k)`, and
    :math:`T(j)\,T(k) = T(j + k)`.

    Args:
        k: the offset; any real number (negative shifts backwards).
        dim: the encoding width ``D``; a positive even integer.
        base: the base of the frequency progression.
        dtype: floating-point dtype of the result.
        device: device of the result.

    Returns:
        The matrix :math:`T(k)`.

    Shape:
        output: ``(D, D)``.
    """
    if isinstance(k, bool) or not isinstance(k, numbers.Real):
        raise TypeError(f"k must be a real number, got {type(k).__name__}")
    if not math.isfinite(float(k)):
        raise ValueError(f"k must be finite, got {k}")
    dtype = _check_float_dtype(dtype)
    angle = float(k) * sinusoidal_frequencies(dim, base=base)  # (D/2,) float64
    c, s = torch.cos(angle), torch.sin(angle)
    blocks = torch.stack((torch.stack((c, -s), -1), torch.stack((s, c), -1)), -2)  # (D/2, 2, 2)
    return torch.block_diag(*blocks).to(dtype=dtype, device=device)  # (D, D)


def sinusoidal_dot_products(offsets: Tensor, dim: int, *, base: float = 10000.0) -> Tensor:
    r"""The dot product :math:`\mathrm{PE}(m) \cdot \mathrm{PE}(n)` as a function of :math:`k = m - n`.

    Each pair contributes :math:`\sin m\omega_i \sin n\omega_i + \cos m\omega_i \cos n\omega_i
    = \cos(k\omega_i)`, so the dot product is :math:`g(k) = \sum_{i} \cos(k\,\omega_i)`: a
    function of the offset alone, even in ``k``, with :math:`g(0) = D/2`.

    Args:
        offsets: offsets ``k`` (any real values, any shape).
        dim: the encoding width ``D``; a positive even integer.
        base: the base of the frequency progression.

    Returns:
        :math:`g(k)` for each offset, float64, on ``offsets``' device.

    Shape:
        offsets: ``(...)``; output: ``(...)``.
    """
    if not isinstance(offsets, Tensor):
        raise TypeError(f"offsets must be a torch.Tensor, got {type(offsets).__name__}")
    omega = sinusoidal_frequencies(dim, base=base).to(offsets.device)  # (D/2,)
    k = offsets.to(torch.float64)
    return torch.cos(k[..., None] * omega).sum(-1)  # (...)


class SinusoidalPositionalEncoding(nn.Module):
    r"""Adds the sinusoidal encoding of :func:`sinusoidal_encoding` to its input.

    The table is a non-persistent buffer (it moves with ``.to(device)`` but is not saved in
    the ``state_dict``: it is a function of ``dim`` and ``base``, nothing is learned). When an
    input is longer than the table, the table **grows**: it is recomputed for
    ``max(L, 2 * max_len)`` positions, which gives the same values as a table built that large
    from the start. Dropout, which the paper applies after the sum, is left to the caller.

    Args:
        dim: the model width ``D``; a positive even integer.
        max_len: initial number of positions in the table.
        base: the base of the frequency progression.
        dtype: dtype the table is stored in; the sum is computed in the input's dtype.

    Shape:
        x: ``(B, L, D)`` or ``(L, D)``; output: same as ``x``.
    """

    pe: Tensor

    def __init__(
        self,
        dim: int,
        max_len: int = 4096,
        *,
        base: float = 10000.0,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.dim = _check_dim(dim)
        self.base = _check_base(base)
        self.register_buffer(
            "pe",
            sinusoidal_encoding(max_len, self.dim, base=self.base, dtype=dtype),
            persistent=False,
        )

    @property
    def max_len(self) -> int:
        """Number of positions the table holds now."""
        return self.pe.shape[0]

    def forward(self, x: Tensor) -> Tensor:
        """Return ``x + PE[:L]``, with ``L = x.shape[-2]``."""
        if x.ndim not in (2, 3):
            raise ValueError(f"x must have shape (B, L, D) or (L, D), got {tuple(x.shape)}")
        length, width = x.shape[-2], x.shape[-1]
        if width != self.dim:
            raise ValueError(f"x's last dimension must be dim={self.dim}, got {width}")
        if length > self.max_len:  # grow: the encoding is a function, any length works
            self.pe = sinusoidal_encoding(
                max(length, 2 * self.max_len),
                self.dim,
                base=self.base,
                dtype=self.pe.dtype,
                device=self.pe.device,
            )
        return x + self.pe[:length].to(x.dtype)  # (L, D) broadcasts over B

    def extra_repr(self) -> str:
        return f"dim={self.dim}, max_len={self.max_len}, base={self.base:g}"
