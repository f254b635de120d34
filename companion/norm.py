r"""Normalization layers: BatchNorm, LayerNorm, RMSNorm, and where the norm sits.

The chapter "Normalization" derives each function; this module holds the math, and the
modules :class:`BatchNorm`, :class:`LayerNorm`, :class:`RMSNorm` are thin wrappers whose
``forward`` is one call to the function.

Conventions shared by every function here:

* Statistics are computed in float32 at least (float64 stays float64), with
  a two-pass, cancellation-free variance (the mean first, then the mean of squared
  deviations; see ``_centered_stats``), never as
  :math:`E[x^2] - E[x]^2`. The variance used to normalize is the *biased* one (divide by
  :math:`n`), and :math:`\epsilon` sits *inside* the square root, as in torch.
* The output has the input's dtype and device.

The residual builders (:class:`PreLNBlock`, :class:`PostLNBlock`,
:func:`residual_stack`) assemble the two placements compared by Xiong et al. (2020).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Literal

import torch
from torch import nn

from companion import _validate

__all__ = [
    "BatchNorm",
    "LayerNorm",
    "PostLNBlock",
    "PreLNBlock",
    "RMSNorm",
    "batch_norm",
    "layer_norm",
    "mlp",
    "residual_stack",
    "rms_norm",
]

_RMS_VARIANTS = ("torch", "llama", "gemma")


# ---- statistics ----------------------------------------------------------------------


def _centered_stats(
    x: torch.Tensor, dims: tuple[int, ...]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mean, centered input and biased variance over ``dims`` (kept as size-1 axes), by
    the two-pass algorithm: the mean first, then the mean of the squared deviations. No
    cancellation (unlike E[x^2] - E[x]^2). The sum of squares is taken as a vector norm
    of the centered input, which the caller reuses, so the only full-size temporary is
    that centered copy. :func:`torch.var_mean` (a single-pass Welford update) is just as
    stable; the appendix and ``make bench`` time both."""
    mean = x.mean(dim=dims, keepdim=True)
    centered = x - mean
    n = math.prod(x.shape[d] for d in dims)  # > 0: the callers refuse empty statistics
    var = torch.linalg.vector_norm(centered, ord=2, dim=dims, keepdim=True).square() / n
    return mean, centered, var


# ---- arguments shared by the functions -----------------------------------------------


def _parameters(
    x: torch.Tensor, shape: tuple[int, ...], **params: torch.Tensor | None
) -> None:
    """Each given parameter (a weight, a bias, a running statistic) is a floating tensor
    of ``shape`` on ``x``'s device (its dtype may differ: it is cast)."""
    for name, p in params.items():
        if p is not None:
            p = _validate.tensor(name, p)
            _validate.shape(name, p, shape)
            _validate.same_device(name, p, "x", x)


def _trailing(
    x: object, normalized_shape: object, eps: object, **params: torch.Tensor | None
) -> tuple[tuple[int, ...], tuple[int, ...], float]:
    """:func:`layer_norm`'s and :func:`rms_norm`'s arguments, validated: the normalized
    shape, the dims it covers in ``x`` and ``eps``."""
    x = _validate.tensor("x", x, min_ndim=1, meaning="(..., *normalized_shape)")
    shape = _validate.int_sequence("normalized_shape", normalized_shape, minimum=1)
    eps = _validate.positive_real("eps", eps)
    if x.ndim < len(shape) or tuple(x.shape[x.ndim - len(shape) :]) != shape:
        raise ValueError(
            f"x must end with normalized_shape {shape}, got x of shape {tuple(x.shape)}"
        )
    _parameters(x, shape, **params)
    return shape, tuple(range(x.ndim - len(shape), x.ndim)), eps


def _stat_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for half/bfloat16/float32 inputs, float64 for float64."""
    return torch.promote_types(dtype, torch.float32)


# ---- BatchNorm -----------------------------------------------------------------------


def batch_norm(
    x: torch.Tensor,
    running_mean: torch.Tensor | None = None,
    running_var: torch.Tensor | None = None,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    *,
    training: bool = True,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> torch.Tensor:
    r"""Batch normalization: per feature, statistics over the batch (and length) axes.

    With :math:`\mathcal{S}` the set of all entries of feature :math:`j` (every sample
    and, for 3-D input, every position),

    .. math::
        \mu_j = \frac{1}{n}\sum_{\mathcal{S}} x, \qquad
        \sigma_j^2 = \frac{1}{n}\sum_{\mathcal{S}} (x - \mu_j)^2, \qquad
        y = \gamma_j \frac{x - \mu_j}{\sqrt{\sigma_j^2 + \epsilon}} + \beta_j .

    In training mode the batch statistics normalize, and when ``running_mean`` /
    ``running_var`` are given they are updated **in place**:
    :math:`r \leftarrow (1 - \alpha)\, r + \alpha\, s`, with the *unbiased* variance
    :math:`\frac{n}{n-1}\sigma_j^2` entering ``running_var`` (the biased one
    normalizes). In evaluation mode (``training=False``) the running statistics
    normalize instead. Matches :func:`torch.nn.functional.batch_norm` and
    :class:`torch.nn.BatchNorm1d`.

    Layout: torch's, features on axis 1: ``(B, D)`` or ``(B, D, L)``. A Transformer's
    ``(B, L, D)`` activations must be transposed first (``x.transpose(1, 2)``).

    Args:
        x: input, float dtype.
        running_mean: running mean buffer, updated in place in training mode; required
            in evaluation mode.
        running_var: running variance buffer, likewise.
        weight: the gain :math:`\gamma`, or ``None`` for ones.
        bias: the shift :math:`\beta`, or ``None`` for zeros.
        training: use (and update) batch statistics; else use the running ones.
        momentum: weight :math:`\alpha` of the new batch in the running average, in
            ``[0, 1]``.
        eps: added to the variance inside the square root; positive.

    Returns:
        The normalized tensor, with ``x``'s shape, dtype and device.

    Shape:
        - x: ``(B, D)`` or ``(B, D, L)``
        - running_mean, running_var, weight, bias: ``(D,)``
        - output: same as ``x``
    """
    x = _validate.tensor("x", x, min_ndim=2, max_ndim=3, meaning="(B, D) or (B, D, L)")
    training = _validate.flag("training", training)
    momentum = _validate.real("momentum", momentum, minimum=0.0, maximum=1.0)
    eps = _validate.positive_real("eps", eps)
    d = x.shape[1]
    stats = {"running_mean": running_mean, "running_var": running_var}
    _parameters(x, (d,), **stats, weight=weight, bias=bias)
    if (running_mean is None) != (running_var is None):
        given, missing = ("running_mean", "running_var")[
            :: 1 if running_var is None else -1
        ]
        raise ValueError(f"{missing} must be given with {given}, got None")
    if not training and running_mean is None:
        raise ValueError(
            "running_mean and running_var are required when training=False"
        )
    dims = (0,) if x.ndim == 2 else (0, 2)
    n = math.prod(x.shape[i] for i in dims)  # values per feature
    if training and n < 2:
        raise ValueError(
            f"x must have more than 1 value per feature in training mode, got x of "
            f"shape {tuple(x.shape)}"
        )
    bcast = (
        (1, d) if x.ndim == 2 else (1, d, 1)
    )  # statistics broadcast back over B (and L)
    xf = x.to(_stat_dtype(x.dtype))
    if training:
        mean_k, centered, var_k = _centered_stats(xf, dims)  # biased, two-pass
        mean, var = mean_k.reshape(d), var_k.reshape(d)  # (D,)
        if running_mean is not None and running_var is not None:
            with torch.no_grad():
                unbiased = var * (n / (n - 1))
                running_mean.mul_(1 - momentum).add_(
                    momentum * mean.to(running_mean.dtype)
                )
                running_var.mul_(1 - momentum).add_(
                    momentum * unbiased.to(running_var.dtype)
                )
        y = centered * torch.rsqrt(var_k + eps)
    else:
        mean = running_mean.to(xf.dtype)
        var = running_var.to(xf.dtype)
        y = (xf - mean.reshape(bcast)) * torch.rsqrt(var.reshape(bcast) + eps)
    if weight is not None:
        y = y * weight.to(xf.dtype).reshape(bcast)
    if bias is not None:
        y = y + bias.to(xf.dtype).reshape(bcast)
    return y.to(x.dtype)


# ---- LayerNorm -----------------------------------------------------------------------


def layer_norm(
    x: torch.Tensor,
    normalized_shape: int | Sequence[int],
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    *,
    eps: float = 1e-5,
) -> torch.Tensor:
    r"""Layer normalization: per token, statistics over its trailing feature dims.

    .. math::
        \mu = \frac{1}{D}\sum_{j} x_j, \qquad
        \sigma^2 = \frac{1}{D}\sum_{j} (x_j - \mu)^2, \qquad
        y_j = \gamma_j \frac{x_j - \mu}{\sqrt{\sigma^2 + \epsilon}} + \beta_j .

    Biased variance, :math:`\epsilon` inside the root: matches
    :func:`torch.nn.functional.layer_norm` and :class:`torch.nn.LayerNorm` (default
    ``eps=1e-5``), not the Annotated Transformer's ``(x - mean) / (std + eps)``.

    Args:
        x: input, float dtype.
        normalized_shape: the trailing shape to normalize over (an int for the last
            dim).
        weight: the gain :math:`\gamma` of shape ``normalized_shape``, or ``None``.
        bias: the shift :math:`\beta` of shape ``normalized_shape``, or ``None``.
        eps: added to the variance inside the square root; positive.

    Returns:
        The normalized tensor, with ``x``'s shape, dtype and device.

    Shape:
        - x: ``(..., *normalized_shape)``, e.g. ``(B, L, D)`` with
          ``normalized_shape=D``
        - output: same as ``x``
    """
    _, dims, eps = _trailing(x, normalized_shape, eps, weight=weight, bias=bias)
    xf = x.to(_stat_dtype(x.dtype))
    _, centered, var = _centered_stats(xf, dims)  # biased, two-pass
    y = centered * torch.rsqrt(var + eps)
    if weight is not None:
        y = y * weight.to(xf.dtype)
    if bias is not None:
        y = y + bias.to(xf.dtype)
    return y.to(x.dtype)


# ---- RMSNorm -------------------------------------------------------------------------


def rms_norm(
    x: torch.Tensor,
    normalized_shape: int | Sequence[int],
    weight: torch.Tensor | None = None,
    *,
    eps: float = 1e-6,
    variant: Literal["torch", "llama", "gemma"] = "torch",
) -> torch.Tensor:
    r"""Root-mean-square normalization (Zhang and Sennrich, 2019): no mean, no bias.

    .. math::
        y_j = \gamma_j \frac{x_j}{\sqrt{\frac{1}{D}\sum_k x_k^2 + \epsilon}} .

    The mean square is computed in float32 (float64 for float64 input). The variants
    differ only in where the result is cast back to ``x``'s dtype and in how the gain is
    stored:

    * ``"torch"``: ``(x_hat * weight).to(dtype)``, the gain applied in float32, as
      :class:`torch.nn.RMSNorm`.
    * ``"llama"``: ``weight * x_hat.to(dtype)``, cast back *before* the gain, as Hugging
      Face ``LlamaRMSNorm`` and Meta's reference (two roundings in half precision).
    * ``"gemma"``: ``(x_hat * (1 + weight)).to(dtype)``, the stored weight is an offset
      from one (initialized to zero), as Hugging Face ``GemmaRMSNorm``.

    :math:`\epsilon` sits inside the root, as in :class:`torch.nn.RMSNorm`, Meta's LLaMA
    and Hugging Face. The paper's formula has none; the authors' PyTorch code adds it
    outside, ``x / (rms + eps)``, and their TensorFlow code inside.

    The default ``eps=1e-6`` is Hugging Face ``LlamaConfig.rms_norm_eps`` and LLaMA-1's
    value; Llama 2 and 3 checkpoints use ``1e-5``; :class:`torch.nn.RMSNorm` defaults to
    the machine epsilon of the type it computes in: ``torch.finfo(torch.float32).eps``
    (about ``1.19e-7``) for float32, float16 and bfloat16 inputs, float64's for float64.
    Pass ``eps`` explicitly when matching a model.

    Args:
        x: input, float dtype.
        normalized_shape: the trailing shape to normalize over (an int for the last
            dim).
        weight: the gain (or, for ``"gemma"``, the offset from one), or ``None``.
        eps: added to the mean square inside the square root; positive.
        variant: ``"torch"``, ``"llama"`` or ``"gemma"``, see above.

    Returns:
        The normalized tensor, with ``x``'s shape and device; its dtype is ``x``'s,
        except for ``"llama"`` where torch's type promotion of ``weight * x_hat``
        decides (as in Hugging Face).

    Shape:
        - x: ``(..., *normalized_shape)``
        - output: same as ``x``
    """
    _, dims, eps = _trailing(x, normalized_shape, eps, weight=weight)
    variant = _validate.choice("variant", variant, _RMS_VARIANTS)
    xf = x.to(_stat_dtype(x.dtype))
    x_hat = xf * torch.rsqrt(xf.square().mean(dim=dims, keepdim=True) + eps)
    if weight is None:
        return x_hat.to(x.dtype)
    if variant == "llama":
        return weight * x_hat.to(x.dtype)
    gain = weight.to(xf.dtype)
    if variant == "gemma":
        gain = 1.0 + gain
    return (x_hat * gain).to(x.dtype)


# ---- Modules -------------------------------------------------------------------------


class BatchNorm(nn.Module):
    r"""Thin module around :func:`batch_norm`, like :class:`torch.nn.BatchNorm1d`.

    Holds the gain and shift (``affine=True``) and the running statistics as buffers
    (``running_mean`` zeros, ``running_var`` ones). The buffers are persistent (saved in
    the ``state_dict``, as torch's): evaluation mode needs them after loading a
    checkpoint. ``self.training`` picks the mode. Unlike torch, ``momentum=None`` (a
    cumulative average) is not supported.

    Args:
        num_features: ``D``, the size of axis 1.
        eps: see :func:`batch_norm`.
        momentum: see :func:`batch_norm`.
        affine: learnable gain and shift.
        device: where to create the parameters.
        dtype: dtype of the parameters and buffers.

    Shape:
        - input: ``(B, D)`` or ``(B, D, L)``
        - output: same as input
    """

    def __init__(
        self,
        num_features: int,
        *,
        eps: float = 1e-5,
        momentum: float = 0.1,
        affine: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        num_features = _validate.positive_int("num_features", num_features)
        eps = _validate.positive_real("eps", eps)
        momentum = _validate.real("momentum", momentum, minimum=0.0, maximum=1.0)
        affine = _validate.flag("affine", affine)
        kw = _validate.factory_kwargs(device, dtype)
        super().__init__()
        self.num_features = num_features
        self.eps = eps
        self.momentum = momentum
        if affine:
            self.weight: torch.nn.Parameter | None = nn.Parameter(
                torch.ones(num_features, **kw)
            )
            self.bias: torch.nn.Parameter | None = nn.Parameter(
                torch.zeros(num_features, **kw)
            )
        else:
            self.weight = self.bias = None
        self.register_buffer("running_mean", torch.zeros(num_features, **kw))
        self.register_buffer("running_var", torch.ones(num_features, **kw))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalize ``x`` with batch statistics (training) or running ones (eval)."""
        return batch_norm(
            x,
            self.running_mean,
            self.running_var,
            self.weight,
            self.bias,
            training=self.training,
            momentum=self.momentum,
            eps=self.eps,
        )

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum}"


_NORM_MODULE_DOC = """
        device: where to create the parameters.
        dtype: dtype of the parameters.

    Shape:
        - input: ``(..., *normalized_shape)``
        - output: same as input
"""  # the end of LayerNorm's and RMSNorm's docstrings: one interface, one text


class LayerNorm(nn.Module):
    r"""Thin module around :func:`layer_norm`, like :class:`torch.nn.LayerNorm`.

    Args:
        normalized_shape: trailing shape to normalize over.
        eps: see :func:`layer_norm`.
        bias: learn a shift :math:`\beta` (the gain is always learned)."""

    __doc__ = (__doc__ or "") + _NORM_MODULE_DOC  # device, dtype, shapes: as RMSNorm

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        *,
        eps: float = 1e-5,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        shape = _validate.int_sequence("normalized_shape", normalized_shape, minimum=1)
        eps = _validate.positive_real("eps", eps)
        bias = _validate.flag("bias", bias)
        kw = _validate.factory_kwargs(device, dtype)
        super().__init__()
        self.normalized_shape = shape
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(self.normalized_shape, **kw))
        self.bias = (
            nn.Parameter(torch.zeros(self.normalized_shape, **kw)) if bias else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalize each token of ``x`` over its trailing dims."""
        return layer_norm(
            x, self.normalized_shape, self.weight, self.bias, eps=self.eps
        )

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}"


class RMSNorm(nn.Module):
    r"""Thin module around :func:`rms_norm`.

    The weight starts at ones, or at zeros for ``variant="gemma"`` (which multiplies by
    ``1 + weight``), so every variant starts as the plain normalization.

    Args:
        normalized_shape: trailing shape to normalize over.
        eps: see :func:`rms_norm` (default ``1e-6``, as Hugging Face LLaMA; not
            torch's).
        variant: ``"torch"``, ``"llama"`` or ``"gemma"``, see :func:`rms_norm`."""

    __doc__ = (__doc__ or "") + _NORM_MODULE_DOC  # device, dtype, shapes: as LayerNorm

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        *,
        eps: float = 1e-6,
        variant: Literal["torch", "llama", "gemma"] = "torch",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        shape = _validate.int_sequence("normalized_shape", normalized_shape, minimum=1)
        eps = _validate.positive_real("eps", eps)
        variant = _validate.choice("variant", variant, _RMS_VARIANTS)
        kw = _validate.factory_kwargs(device, dtype)
        super().__init__()
        self.normalized_shape = shape
        self.eps = eps
        self.variant = variant
        init = torch.zeros if variant == "gemma" else torch.ones
        self.weight = nn.Parameter(init(self.normalized_shape, **kw))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Divide each token of ``x`` by its root mean square, then apply the gain."""
        return rms_norm(
            x, self.normalized_shape, self.weight, eps=self.eps, variant=self.variant
        )

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, variant={self.variant!r}"


# ---- Where the norm sits -------------------------------------------------------------


def _make_norm(
    norm: Literal["layer", "rms"], dim: int, eps: float | None
) -> torch.nn.Module:
    if norm == "layer":
        return LayerNorm(dim, eps=1e-5 if eps is None else eps)
    return RMSNorm(dim, eps=1e-6 if eps is None else eps)


def mlp(dim: int, hidden: int | None = None) -> torch.nn.Sequential:
    """The position-wise feed-forward sublayer: ``Linear(dim, hidden)``, GELU,
    ``Linear``.

    Args:
        dim: model width ``D``.
        hidden: inner width; ``4 * dim`` when ``None``, as in Vaswani et al. (2017).

    Returns:
        An :class:`torch.nn.Sequential` with torch's default initialization.
    """
    dim = _validate.positive_int("dim", dim)
    hidden = _validate.optional(_validate.positive_int, "hidden", hidden)
    hidden = 4 * dim if hidden is None else hidden
    return nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))


_BLOCK_DOC = """

    Args:
        dim: model width ``D`` (checked against the input's last dim).
        sublayer: the module :math:`F`, ``(..., D) -> (..., D)``.
        norm: the normalization module.

    Shape:
        - input: ``(..., D)``
        - output: same as input
"""  # the end of both blocks' docstrings: one interface, one text


class _ResidualBlock(nn.Module):
    """What Pre-LN and Post-LN blocks share: a sublayer, a norm and the model width."""

    def __init__(
        self, dim: int, sublayer: torch.nn.Module, norm: torch.nn.Module
    ) -> None:
        dim = _validate.positive_int("dim", dim)
        sublayer = _validate.module("sublayer", sublayer)
        norm = _validate.module("norm", norm)
        super().__init__()
        self.dim = dim
        self.sublayer = sublayer
        self.norm = norm

    def _input(self, x: object) -> torch.Tensor:
        """``x`` validated: a floating ``(..., dim)`` tensor with the dtype and device
        of the block's first parameter (if it has any)."""
        x = _validate.tensor("x", x, min_ndim=1, meaning="(..., D)")
        _validate.size("x", x, -1, self.dim, "dim")
        for name, p in self.named_parameters():
            _validate.same_dtype("x", x, name, p)
            _validate.same_device("x", x, name, p)
            break
        return x

    def _branch(self, x: torch.Tensor) -> torch.Tensor:
        """The sublayer's output on ``x``, checked: a residual needs ``x``'s shape back."""
        y = self.sublayer(x)
        if not isinstance(y, torch.Tensor) or y.shape != x.shape:
            got = _validate.describe(y)
            raise ValueError(
                f"sublayer must return a tensor of its input's shape {tuple(x.shape)} "
                f"(the residual adds it to x), got {got}"
            )
        return y


class PreLNBlock(_ResidualBlock):
    r"""Pre-LN residual block: :math:`x + F(\mathrm{Norm}(x))`.

    The residual path is an identity: the gradient reaches every block through it
    without passing a norm. It is not undiminished: at initialization the final norm
    divides by a residual stream that grows with depth, so the last blocks' gradients
    shrink as the stack deepens (Xiong et al., 2020; the chapter on normalization
    measures it). GPT-2, LLaMA and most recent models use this placement (with one more
    norm after the last block, see :func:`residual_stack`)."""

    __doc__ = (__doc__ or "") + _BLOCK_DOC  # dim, sublayer, norm, shapes: one text

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return ``x + sublayer(norm(x))``."""
        x = self._input(x)
        return x + self._branch(self.norm(x))


class PostLNBlock(_ResidualBlock):
    r"""Post-LN residual block: :math:`\mathrm{Norm}(x + F(x))`, as in the original
    Transformer.

    The norm sits on the residual path, so every block rescales the gradient flowing
    through it; at initialization the last layers' gradients keep their size as the
    stack deepens (they shrink in Pre-LN). Xiong et al. (2020) see in this why the
    placement needs a learning-rate warm-up; Liu et al. (2020) find the cause in an
    amplification instead: each block depends heavily on its own branch, so small
    parameter changes add up to a large change of the output (an Adam step has the
    same size whatever the gradient's; the chapter on normalization measures both, the
    capstone trains with and without warm-up)."""

    __doc__ = (__doc__ or "") + _BLOCK_DOC  # dim, sublayer, norm, shapes: one text

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return ``norm(x + sublayer(x))``."""
        x = self._input(x)
        return self.norm(x + self._branch(x))


def residual_stack(
    depth: int,
    dim: int,
    *,
    placement: Literal["pre", "post"] = "pre",
    norm: Literal["layer", "rms"] = "layer",
    sublayer: Callable[[int], torch.nn.Module] | None = None,
    final_norm: bool | None = None,
    eps: float | None = None,
) -> torch.nn.Sequential:
    """A stack of ``depth`` residual blocks with the norm before or after the sublayer.

    Args:
        depth: number of blocks, positive.
        dim: model width ``D``.
        placement: ``"pre"`` (:class:`PreLNBlock`) or ``"post"`` (:class:`PostLNBlock`).
        norm: ``"layer"`` (:class:`LayerNorm`) or ``"rms"`` (:class:`RMSNorm`).
        sublayer: a factory ``dim -> Module`` called once per block; :func:`mlp` when
            ``None``.
        final_norm: append one more norm after the last block; defaults to ``True`` for
            ``"pre"`` (whose output is otherwise unnormalized) and ``False`` for
            ``"post"``.
        eps: the norms' eps; their own defaults when ``None``.

    Returns:
        An :class:`torch.nn.Sequential` of the blocks (and the final norm); ``stack[i]``
        is block ``i``, and ``stack[i].sublayer`` its sublayer.

    Shape:
        - input: ``(..., D)``
        - output: same as input
    """
    depth = _validate.positive_int("depth", depth)
    dim = _validate.positive_int("dim", dim)
    placement = _validate.choice("placement", placement, ("pre", "post"))
    norm = _validate.choice("norm", norm, ("layer", "rms"))
    make_sublayer = _validate.optional(_validate.callable_, "sublayer", sublayer) or mlp
    final_norm = _validate.optional(_validate.flag, "final_norm", final_norm)
    eps = _validate.optional(_validate.positive_real, "eps", eps)
    block = PreLNBlock if placement == "pre" else PostLNBlock
    layers: list[nn.Module] = []
    for _ in range(depth):
        made = _validate.module("sublayer(dim)", make_sublayer(dim))
        layers.append(block(dim, made, _make_norm(norm, dim, eps)))
    if final_norm is None:
        final_norm = placement == "pre"
    if final_norm:
        layers.append(_make_norm(norm, dim, eps))
    return nn.Sequential(*layers)
