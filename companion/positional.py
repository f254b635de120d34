r"""Sinusoidal positional encoding (chapter :ref:`ch-sinusoidal`).

The encoding of Vaswani et al. (2017), in its original *interleaved* layout: for
position :math:`\text{pos}` and pair index :math:`i = 0, \ldots, D/2 - 1`,

.. math::

    \omega_i = \text{base}^{-2i/D}, \qquad
    \mathrm{PE}(\text{pos}, 2i) = \sin(\text{pos}\,\omega_i), \qquad
    \mathrm{PE}(\text{pos}, 2i+1) = \cos(\text{pos}\,\omega_i).

This is the layout of the paper, of the Annotated Transformer and of ``transformers``'
``create_sinusoidal_embeddings`` (used by DistilBERT when its config sets
``sinusoidal_pos_embds=True``; by default DistilBERT learns its table). Hugging Face's
``MarianSinusoidalPositionalEmbedding`` keeps these frequencies in the *halves* layout
(all sines, then all cosines): a fixed permutation of the columns. tensor2tensor's
``get_timing_signal_1d`` and fairseq's ``SinusoidalPositionalEmbedding`` (ported to
``transformers`` as FSMT's, M2M100's, NLLB's ...) are a different encoding, not a
permutation: they concatenate sines and cosines *and* use the frequencies
:math:`10000^{-i/(D/2 - 1)}`, so their slowest pair turns at exactly ``1/10000``. The
chapter measures how far apart the tables are.

Angles are computed in float64 and cast at the end, so float32 (and lower-precision)
values are accurate to the output dtype's rounding for positions up to at least
:math:`10^6`; float64 values carry the float64 angle's own rounding, about
``pos * omega_i * 2**-53`` radians (1.1e-10 at a million with ``omega_0 = 1``;
measured at ``pos = 10**6``, ``D = 128``: 6.4e-11 on the angles, 5.2e-11 on the
table). A float32 angle ``pos * omega_i`` carries a relative error of about
``2**-23`` (more with the ``exp`` recipe of the frequencies), i.e.
``pos * omega_i * 2**-23`` radians: up to ``1.1e-7 * pos`` when ``omega_1`` is close to
1, 0.06 rad near a million at ``D = 128`` (chapter :ref:`ch-rope` measures it).

Derivations (the shift theorem, the dot product as a function of the offset) are in the
chapter; the functions here only implement them.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from companion import _validate

__all__ = [
    "SinusoidalPositionalEncoding",
    "inverse_frequencies",
    "shift_matrix",
    "sinusoidal_dot_products",
    "sinusoidal_encoding",
    "sinusoidal_frequencies",
    "sinusoidal_wavelengths",
]


def inverse_frequencies(
    dim: int, *, base: float = 10000.0, name: str = "dim"
) -> Tensor:
    r"""The geometric progression :math:`\text{base}^{-2i/D}`, :math:`i = 0, \dots,
    D/2 - 1`: float64 on the CPU (Hugging Face's ``inv_freq``).

    The one implementation of the progression, shared by
    :func:`sinusoidal_frequencies`, :func:`companion.rope.rope_frequencies`, the scaled
    frequencies of :mod:`companion.extension` and the RoPE variants of
    :mod:`companion.rope_variants`; each of those validates ``dim`` under its own
    argument name, which ``name`` carries into the error message.

    Args:
        dim: the width ``D``; a positive even integer.
        base: the base of the progression, a real number > 1.
        name: the argument name a bad ``dim`` is reported under (``"head_dim"`` for
            RoPE's callers).

    Returns:
        The frequencies, float64.

    Shape:
        output: ``(D // 2,)``.
    """
    name = _validate.instance("name", name, str, "a str")
    dim = _validate.positive_int(name, dim, even=True)
    base = _validate.real("base", base, exclusive_minimum=1.0)
    i = torch.arange(dim // 2, dtype=torch.float64)  # pair index, 0 .. D/2 - 1
    return base ** (-2.0 * i / dim)


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
    return inverse_frequencies(dim, base=base)


def sinusoidal_wavelengths(dim: int, *, base: float = 10000.0) -> Tensor:
    r"""Wavelengths :math:`\lambda_i = 2\pi / \omega_i` of the ``D/2`` pairs, in tokens.

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
    :func:`sinusoidal_frequencies`. Angles are formed in float64 and only the result is
    cast to ``dtype``, so in float32 (and lower-precision dtypes) every entry is within
    the rounding of ``dtype`` of the exact value for positions up to at least
    :math:`10^6` (measured against 50-digit arithmetic: :math:`2.9 \times 10^{-8}` at
    :math:`\text{pos} = 10^6`, ``D = 128``); in float64 the angle's own rounding, about
    :math:`\text{pos}\,\omega_i 2^{-53}` radians (:math:`1.1 \times 10^{-10}` there for
    :math:`\omega_0 = 1`), dominates: the table's error there is
    :math:`5.2 \times 10^{-11}`.

    Args:
        num_positions: number of positions ``L`` (positions ``0 .. L - 1``); ``0`` gives
            an empty ``(0, D)`` table.
        dim: the encoding width ``D``; a positive even integer.
        base: the base of the frequency progression.
        dtype: floating-point dtype of the result.
        device: device of the result.

    Returns:
        The table ``PE``, with ``PE[pos]`` the encoding of position ``pos``.

    Shape:
        output: ``(L, D)``.
    """
    num_positions = _validate.nonnegative_int("num_positions", num_positions)
    dtype = _validate.dtype("dtype", dtype)
    device = _validate.device("device", device)
    omega = inverse_frequencies(dim, base=base).to(device)  # (D/2,) float64
    pos = torch.arange(num_positions, dtype=torch.float64, device=device)  # (L,)
    angles = pos[:, None] * omega[None, :]  # (L, D/2) float64: 6.4e-11 rad off at 1e6
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
    r"""The block-diagonal rotation :math:`T(k)` that shifts the encoding by ``k``.

    :math:`\mathrm{PE}(\text{pos}+k) = \mathrm{PE}(\text{pos})\,T(k)` (every ``pos``).

    Row-vector convention (``PE`` rows times ``T`` on the right), matching
    :func:`sinusoidal_encoding`'s ``[sin, cos]`` pairs. Block ``i`` sits at rows and
    columns ``2i, 2i + 1`` and is

    .. math::

        \Phi_i(k) = \begin{bmatrix} \cos k\omega_i & -\sin k\omega_i \\
                                    \sin k\omega_i & \cos k\omega_i \end{bmatrix},

    since
    :math:`[\sin a, \cos a]\,\Phi_i(k) = [\sin(a + k\omega_i), \cos(a + k\omega_i)]`.
    :math:`T(k)` does not depend on ``pos``; it is orthogonal,
    :math:`T(k)^\top = T(-k)`, and :math:`T(j)\,T(k) = T(j + k)`.

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
    k = _validate.real("k", k)
    dtype = _validate.dtype("dtype", dtype)
    device = _validate.device("device", device)
    angle = k * inverse_frequencies(dim, base=base)  # (D/2,) float64
    c, s = torch.cos(angle), torch.sin(angle)
    rows = (torch.stack((c, -s), -1), torch.stack((s, c), -1))  # (D/2, 2) each
    blocks = torch.stack(rows, -2)  # (D/2, 2, 2)
    return torch.block_diag(*blocks).to(dtype=dtype, device=device)  # (D, D)


def sinusoidal_dot_products(
    offsets: Tensor, dim: int, *, base: float = 10000.0
) -> Tensor:
    r"""The dot product :math:`\mathrm{PE}(m) \cdot \mathrm{PE}(n)` as a function of
    :math:`k = m - n`.

    Each pair contributes :math:`\sin m\omega_i \sin n\omega_i +
    \cos m\omega_i \cos n\omega_i = \cos(k\omega_i)`, so the dot product is
    :math:`\psi(k) = \sum_{i} \cos(k\,\omega_i)` (the chapter's :math:`\psi`): a function
    of the offset alone, even in ``k``, with :math:`\psi(0) = D/2`.

    Args:
        offsets: offsets ``k``, an integer or floating-point tensor of any shape.
        dim: the encoding width ``D``; a positive even integer.
        base: the base of the frequency progression.

    Returns:
        :math:`\psi(k)` for each offset, float64, on ``offsets``' device.

    Shape:
        offsets: ``(...)``; output: ``(...)``.
    """
    offsets = _validate.tensor("offsets", offsets, dtype=("integer", "floating"))
    omega = inverse_frequencies(dim, base=base).to(offsets.device)  # (D/2,)
    k = offsets.to(torch.float64)
    return torch.cos(k[..., None] * omega).sum(-1)  # (...)


class SinusoidalPositionalEncoding(nn.Module):
    r"""Adds the sinusoidal encoding of :func:`sinusoidal_encoding` to its input.

    The table is a non-persistent buffer (it moves with ``.to(device)`` but is not saved
    in the ``state_dict``: it is a function of ``dim`` and ``base``, nothing is
    learned). An input longer than ``max_len`` positions raises ``ValueError`` (never a
    silently truncated sum): build the module with a larger ``max_len``, or call
    :func:`sinusoidal_encoding`, which computes any length. Dropout, which the paper
    applies after the sum, is left to the caller.

    Args:
        dim: the model width ``D``; a positive even integer.
        max_len: number of positions in the table (the longest input it accepts).
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
        self.dim = _validate.positive_int("dim", dim, even=True)
        self.max_len = _validate.positive_int("max_len", max_len)
        self.base = _validate.real("base", base, exclusive_minimum=1.0)
        dtype = _validate.dtype("dtype", dtype)
        self.register_buffer(
            "pe",
            sinusoidal_encoding(self.max_len, self.dim, base=self.base, dtype=dtype),
            persistent=False,
        )

    def forward(self, x: Tensor) -> Tensor:
        """Return ``x + PE[:L]``, with ``L = x.shape[-2]`` at most ``max_len``."""
        x = _validate.tensor(
            "x", x, min_ndim=2, max_ndim=3, meaning="(B, L, D) or (L, D)"
        )
        _validate.size("x", x, -1, self.dim, "dim")
        _validate.same_device("x", x, "the table pe", self.pe)
        length = x.shape[-2]
        if length > self.max_len:
            raise ValueError(
                f"x must have at most max_len={self.max_len} positions, got length "
                f"{length} "
                f"(shape {tuple(x.shape)}): build SinusoidalPositionalEncoding with "
                f"max_len >= {length}, or use sinusoidal_encoding({length}, {self.dim})"
            )
        return x + self.pe[:length].to(x.dtype)  # (L, D) broadcasts over B

    def extra_repr(self) -> str:
        return f"dim={self.dim}, max_len={self.max_len}, base={self.base:g}"
