r"""Normalization layers: BatchNorm, LayerNorm, RMSNorm, and where the norm sits.

The chapter "Normalization" derives each function; this module holds the math, and the
modules :class:`BatchNorm`, :class:`LayerNorm`, :class:`RMSNorm` are thin wrappers whose
``forward`` is one call to the function.

Conventions shared by every function here:

* Statistics are computed in float32 at least (float64 stays float64), with
  a two-pass, cancellation-free variance (the mean first, then the mean of squared deviations;
  see ``_centered_stats``), never as
  :math:`E[x^2] - E[x]^2`. The variance used to normalize is the *biased* one (divide by
  :math:`n`), and :math:`\epsilon` sits *inside* the square root, as in torch.
* The output has the input's dtype and device.

The residual builders (:class:`PreLNBlock`, :class:`PostLNBlock`, :func:`residual_stack`)
assemble the two placements compared by Xiong et al. (2020).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

import torch
from torch import nn

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


# ---- statistics -----------------------------------------------------------------------------


def _centered_stats(
    x: torch.Tensor, dims: tuple[int, ...]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mean, centred input and biased variance over ``dims`` (kept as size-1 axes), by the
    two-pass algorithm: the mean first, then the mean of the squared deviations. No
    cancellation (unlike E[x^2] - E[x]^2). The sum of squares is taken as a vector norm of the
    centred input, which the caller reuses, so the only full-size temporary is that centred
    copy; on the CPU this is several times faster than :func:`torch.var_mean`, whose
    single-pass Welford update is just as stable but slow (``make bench`` measures both)."""
    mean = x.mean(dim=dims, keepdim=True)
    centered = x - mean
    n = x.numel() // mean.numel()
    var = torch.linalg.vector_norm(centered, ord=2, dim=dims, keepdim=True).square() / n
    return mean, centered, var


# ---- validation helpers ----------------------------------------------------------------------


def _check_float(x: object, name: str = "x") -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must have a floating dtype, got {x.dtype}")
    return x


def _check_eps(eps: object) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"eps must be a float, got {type(eps).__name__}")
    if not eps > 0:
        raise ValueError(f"eps must be positive, got {eps}")
    return float(eps)


def _normalized_shape(normalized_shape: int | Sequence[int]) -> tuple[int, ...]:
    if isinstance(normalized_shape, bool):
        raise TypeError("normalized_shape must be an int or a sequence of ints, got bool")
    if isinstance(normalized_shape, int):
        shape: tuple[int, ...] = (normalized_shape,)
    elif isinstance(normalized_shape, (Sequence, torch.Size)) and all(
        isinstance(s, int) and not isinstance(s, bool) for s in normalized_shape
    ):
        shape = tuple(normalized_shape)
    else:
        raise TypeError(
            f"normalized_shape must be an int or a sequence of ints, got {normalized_shape!r}"
        )
    if len(shape) == 0 or any(s <= 0 for s in shape):
        raise ValueError(f"normalized_shape must be non-empty and positive, got {shape}")
    return shape


def _check_trailing(x: torch.Tensor, shape: tuple[int, ...]) -> tuple[int, ...]:
    if x.ndim < len(shape) or tuple(x.shape[x.ndim - len(shape) :]) != shape:
        raise ValueError(
            f"normalized_shape {shape} must match the last dims of x, got x of shape "
            f"{tuple(x.shape)}"
        )
    return tuple(range(x.ndim - len(shape), x.ndim))


def _check_param(p: torch.Tensor | None, name: str, shape: tuple[int, ...]) -> None:
    if p is None:
        return
    _check_float(p, name)
    if tuple(p.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(p.shape)}")


def _stat_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for half/bfloat16/float32 inputs, float64 for float64."""
    return torch.promote_types(dtype, torch.float32)


# ---- BatchNorm -------------------------------------------------------------------------------


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

    With :math:`\mathcal{S}` the set of all entries of feature :math:`j` (every sample and,
    for 3-D input, every position),

    .. math::
        \mu_j = \frac{1}{n}\sum_{\mathcal{S}} x, \qquad
        \sigma_j^2 = \frac{1}{n}\sum_{\mathcal{S}} (x - \mu_j)^2, \qquad
        y = \gamma_j \frac{x - \mu_j}{\sqrt{\sigma_j^2 + \epsilon}} + \beta_j .

    In training mode the batch statistics normalize, and when ``running_mean`` /
    ``running_var`` are given they are updated **in place**:
    :math:`r \leftarrow (1 - m)\, r + m\, s`, with the *unbiased* variance
    :math:`\frac{n}{n-1}\sigma_j^2` entering ``running_var`` (the biased one normalizes).
    In evaluation mode (``training=False``) the running statistics normalize instead.
    Matches :func:`torch.nn.functional.batch_norm` and :class:`torch.nn.BatchNorm1d`.

    Layout: torch's, features on axis 1: ``(B, D)`` or ``(B, D, L)``. A Transformer's
    ``(B, L, D)`` activations must be transposed first (``x.transpose(1, 2)``).

    Args:
        x: input, float dtype.
        running_mean: running mean buffer, updated in place in training mode; required in
            evaluation mode.
        running_var: running variance buffer, likewise.
        weight: the gain :math:`\gamma`, or ``None`` for ones.
        bias: the shift :math:`\beta`, or ``None`` for zeros.
        training: use (and update) batch statistics; else use the running ones.
        momentum: weight :math:`m` of the new batch in the running average, in ``[0, 1]``.
        eps: added to the variance inside the square root; positive.

    Returns:
        The normalized tensor, with ``x``'s shape, dtype and device.

    Shape:
        - x: ``(B, D)`` or ``(B, D, L)``
        - running_mean, running_var, weight, bias: ``(D,)``
        - output: same as ``x``
    """
    _check_float(x)
    if x.ndim not in (2, 3):
        raise ValueError(f"x must be (B, D) or (B, D, L), got shape {tuple(x.shape)}")
    eps = _check_eps(eps)
    if isinstance(momentum, bool) or not isinstance(momentum, (int, float)):
        raise TypeError(f"momentum must be a float, got {type(momentum).__name__}")
    if not 0.0 <= momentum <= 1.0:
        raise ValueError(f"momentum must be in [0, 1], got {momentum}")
    d = x.shape[1]
    for name, p in (
        ("running_mean", running_mean),
        ("running_var", running_var),
        ("weight", weight),
        ("bias", bias),
    ):
        _check_param(p, name, (d,))
    if (running_mean is None) != (running_var is None):
        raise ValueError("running_mean and running_var must be given together")
    dims = (0,) if x.ndim == 2 else (0, 2)
    n = x.numel() // d
    bcast = (1, d) if x.ndim == 2 else (1, d, 1)  # statistics broadcast back over B (and L)
    xf = x.to(_stat_dtype(x.dtype))
    if training:
        if n < 2:
            raise ValueError(
                f"batch_norm needs more than 1 value per feature in training mode, got x of "
                f"shape {tuple(x.shape)}"
            )
        mean_k, centered, var_k = _centered_stats(xf, dims)  # biased, two-pass
        mean, var = mean_k.reshape(d), var_k.reshape(d)  # (D,)
        if running_mean is not None and running_var is not None:
            with torch.no_grad():
                unbiased = var * (n / (n - 1))
                running_mean.mul_(1 - momentum).add_(momentum * mean.to(running_mean.dtype))
                running_var.mul_(1 - momentum).add_(momentum * unbiased.to(running_var.dtype))
        y = centered * torch.rsqrt(var_k + eps)
    else:
        if running_mean is None or running_var is None:
            raise ValueError("running_mean and running_var are required when training=False")
        mean = running_mean.to(xf.dtype)
        var = running_var.to(xf.dtype)
        y = (xf - mean.reshape(bcast)) * torch.rsqrt(var.reshape(bcast) + eps)
    if weight is not None:
        y = y * weight.to(xf.dtype).reshape(bcast)
    if bias is not None:
        y = y + bias.to(xf.dtype).reshape(bcast)
    return y.to(x.dtype)


# ---- LayerNorm -------------------------------------------------------------------------------


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
        normalized_shape: the trailing shape to normalize over (an int for the last dim).
        weight: the gain :math:`\gamma` of shape ``normalized_shape``, or ``None``.
        bias: the shift :math:`\beta` of shape ``normalized_shape``, or ``None``.
        eps: added to the variance inside the square root; positive.

    Returns:
        The normalized tensor, with ``x``'s shape, dtype and device.

    Shape:
        - x: ``(..., *normalized_shape)``, e.g. ``(B, L, D)`` with ``normalized_shape=D``
        - output: same as ``x``
    """
    _check_float(x)
    shape = _normalized_shape(normalized_shape)
    eps = _check_eps(eps)
    dims = _check_trailing(x, shape)
    _check_param(weight, "weight", shape)
    _check_param(bias, "bias", shape)
    xf = x.to(_stat_dtype(x.dtype))
    _, centered, var = _centered_stats(xf, dims)  # biased, two-pass
    y = centered * torch.rsqrt(var + eps)
    if weight is not None:
        y = y * weight.to(xf.dtype)
    if bias is not None:
        y = y + bias.to(xf.dtype)
    return y.to(x.dtype)


# ---- RMSNorm ---------------------------------------------------------------------------------


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

    The mean square is computed in float32 (float64 for float64 input). The variants differ
    only in where the result is cast back to ``x``'s dtype and in how the gain is stored:

    * ``"torch"``: ``(x_hat * weight).to(dtype)``, the gain applied in float32, as
      :class:`torch.nn.RMSNorm`.
    * ``"llama"``: ``weight * x_hat.to(dtype)``, cast back *before* the gain, as Hugging Face
      ``LlamaRMSNorm`` and Meta's reference (two roundings in half precision).
    * ``"gemma"``: ``(x_hat * (1 + weight)).to(dtype)``, the stored weight is an offset from
      one (initialised to zero), as Hugging Face ``GemmaRMSNorm``.

    The default ``eps=1e-6`` is Hugging Face ``LlamaConfig.rms_norm_eps`` and LLaMA-1's
    value; Llama 2 and 3 checkpoints use ``1e-5``; :class:`torch.nn.RMSNorm` defaults to the
    machine epsilon of the type it computes in: ``torch.finfo(torch.float32).eps`` (about
    ``1.19e-7``) for float32, float16 and bfloat16 inputs, float64's for float64. Pass ``eps``
    explicitly when matching a model.

    Args:
        x: input, float dtype.
        normalized_shape: the trailing shape to normalize over (an int for the last dim).
        weight: the gain (or, for ``"gemma"``, the offset from one), or ``None``.
        eps: added to the mean square inside the square root; positive.
        variant: ``"torch"``, ``"llama"`` or ``"gemma"``, see above.

    Returns:
        The normalized tensor, with ``x``'s shape and device; its dtype is ``x``'s, except
        for ``"llama"`` where torch's type promotion of ``weight * x_hat`` decides (as in
        Hugging Face).

    Shape:
        - x: ``(..., *normalized_shape)``
        - output: same as ``x``
    """
    _check_float(x)
    shape = _normalized_shape(normalized_shape)
    eps = _check_eps(eps)
    if variant not in _RMS_VARIANTS:
        raise ValueError(f"variant must be one of {_RMS_VARIANTS}, got {variant!r}")
    dims = _check_trailing(x, shape)
    _check_param(weight, "weight", shape)
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


# ---- Modules ---------------------------------------------------------------------------------


class BatchNorm(nn.Module):
    r"""Thin module around :func:`batch_norm`, like :class:`torch.nn.BatchNorm1d`.

    Holds the gain and shift (``affine=True``) and the running statistics as buffers
    (``running_mean`` zeros, ``running_var`` ones). The buffers are persistent (saved in the
    ``state_dict``, as torch's): evaluation mode needs them after loading a checkpoint.
    ``self.training`` picks the mode. Unlike torch, ``momentum=None`` (a cumulative average)
    is not supported.

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
        super().__init__()
        if isinstance(num_features, bool) or not isinstance(num_features, int):
            raise TypeError(f"num_features must be an int, got {type(num_features).__name__}")
        if num_features <= 0:
            raise ValueError(f"num_features must be positive, got {num_features}")
        self.num_features = num_features
        self.eps = _check_eps(eps)
        self.momentum = momentum
        kw = {"device": device, "dtype": dtype}
        if affine:
            self.weight: torch.nn.Parameter | None = nn.Parameter(torch.ones(num_features, **kw))
            self.bias: torch.nn.Parameter | None = nn.Parameter(torch.zeros(num_features, **kw))
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


class LayerNorm(nn.Module):
    r"""Thin module around :func:`layer_norm`, like :class:`torch.nn.LayerNorm`.

    Args:
        normalized_shape: trailing shape to normalize over.
        eps: see :func:`layer_norm`.
        bias: learn a shift :math:`\beta` (the gain is always learned).
        device: where to create the parameters.
        dtype: dtype of the parameters.

    Shape:
        - input: ``(..., *normalized_shape)``
        - output: same as input
    """

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        *,
        eps: float = 1e-5,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.normalized_shape = _normalized_shape(normalized_shape)
        self.eps = _check_eps(eps)
        kw = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.ones(self.normalized_shape, **kw))
        self.bias = nn.Parameter(torch.zeros(self.normalized_shape, **kw)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalize each token of ``x`` over its trailing dims."""
        return layer_norm(x, self.normalized_shape, self.weight, self.bias, eps=self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}"


class RMSNorm(nn.Module):
    r"""Thin module around :func:`rms_norm`.

    The weight starts at ones, or at zeros for ``variant="gemma"`` (which multiplies by
    ``1 + weight``), so every variant starts as the plain normalization.

    Args:
        normalized_shape: trailing shape to normalize over.
        eps: see :func:`rms_norm` (default ``1e-6``, as Hugging Face LLaMA; not torch's).
        variant: ``"torch"``, ``"llama"`` or ``"gemma"``, see :func:`rms_norm`.
        device: where to create the parameter.
        dtype: dtype of the parameter.

    Shape:
        - input: ``(..., *normalized_shape)``
        - output: same as input
    """

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        *,
        eps: float = 1e-6,
        variant: Literal["torch", "llama", "gemma"] = "torch",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if variant not in _RMS_VARIANTS:
            raise ValueError(f"variant must be one of {_RMS_VARIANTS}, got {variant!r}")
        self.normalized_shape = _normalized_shape(normalized_shape)
        self.eps = _check_eps(eps)
        self.variant = variant
        init = torch.zeros if variant == "gemma" else torch.ones
        self.weight = nn.Parameter(init(self.normalized_shape, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Divide each token of ``x`` by its root mean square, then apply the gain."""
        return rms_norm(x, self.normalized_shape, self.weight, eps=self.eps, variant=self.variant)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, variant={self.variant!r}"


# ---- Where the norm sits ---------------------------------------------------------------------


def _make_norm(norm: Literal["layer", "rms"], dim: int, eps: float | None) -> torch.nn.Module:
    if norm == "layer":
        return LayerNorm(dim, eps=1e-5 if eps is None else eps)
    if norm == "rms":
        return RMSNorm(dim, eps=1e-6 if eps is None else eps)
    raise ValueError(f"norm must be 'layer' or 'rms', got {norm!r}")


def mlp(dim: int, hidden: int | None = None) -> torch.nn.Sequential:
    """The position-wise feed-forward sublayer: ``Linear(dim, hidden)``, GELU, ``Linear``.

    Args:
        dim: model width ``D``.
        hidden: inner width; ``4 * dim`` when ``None``, as in Vaswani et al. (2017).

    Returns:
        An :class:`torch.nn.Sequential` with torch's default initialisation.
    """
    if isinstance(dim, bool) or not isinstance(dim, int) or dim <= 0:
        raise ValueError(f"dim must be a positive int, got {dim!r}")
    hidden = 4 * dim if hidden is None else hidden
    if isinstance(hidden, bool) or not isinstance(hidden, int) or hidden <= 0:
        raise ValueError(f"hidden must be a positive int, got {hidden!r}")
    return nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))


class _ResidualBlock(nn.Module):
    """What Pre-LN and Post-LN blocks share: a sublayer, a norm and the model width."""

    def __init__(self, dim: int, sublayer: torch.nn.Module, norm: torch.nn.Module) -> None:
        super().__init__()
        self.dim = dim
        self.sublayer = sublayer
        self.norm = norm

    def _check_width(self, x: torch.Tensor) -> None:
        if x.shape[-1] != self.dim:
            raise ValueError(f"x must have last dim {self.dim}, got shape {tuple(x.shape)}")


class PreLNBlock(_ResidualBlock):
    r"""Pre-LN residual block: :math:`x + F(\mathrm{Norm}(x))`.

    The residual path is an identity, so the gradient reaches every layer undiminished
    (Xiong et al., 2020). GPT-2, LLaMA and most recent models use this placement (with
    one more norm after the last block, see :func:`residual_stack`).

    Args:
        dim: model width ``D`` (checked against the input's last dim).
        sublayer: the module :math:`F`, ``(..., D) -> (..., D)``.
        norm: the normalization module.

    Shape:
        - input: ``(..., D)``
        - output: same as input
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return ``x + sublayer(norm(x))``."""
        self._check_width(x)
        return x + self.sublayer(self.norm(x))


class PostLNBlock(_ResidualBlock):
    r"""Post-LN residual block: :math:`\mathrm{Norm}(x + F(x))`, as in the original Transformer.

    The norm sits on the residual path, so every block rescales the gradient flowing through
    it; at initialisation the gradients of the last layers are large, which is why this
    placement needs a learning-rate warm-up (Xiong et al., 2020).

    Args:
        dim: model width ``D`` (checked against the input's last dim).
        sublayer: the module :math:`F`, ``(..., D) -> (..., D)``.
        norm: the normalization module.

    Shape:
        - input: ``(..., D)``
        - output: same as input
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return ``norm(x + sublayer(x))``."""
        self._check_width(x)
        return self.norm(x + self.sublayer(x))


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
            ``"pre"`` (whose output is otherwise unnormalized) and ``False`` for ``"post"``.
        eps: the norms' eps; their own defaults when ``None``.

    Returns:
        An :class:`torch.nn.Sequential` of the blocks (and the final norm); ``stack[i]`` is
        block ``i``, and ``stack[i].sublayer`` its sublayer.

    Shape:
        - input: ``(..., D)``
        - output: same as input
    """
    if isinstance(depth, bool) or not isinstance(depth, int) or depth <= 0:
        raise ValueError(f"depth must be a positive int, got {depth!r}")
    if isinstance(dim, bool) or not isinstance(dim, int) or dim <= 0:
        raise ValueError(f"dim must be a positive int, got {dim!r}")
    if placement not in ("pre", "post"):
        raise ValueError(f"placement must be 'pre' or 'post', got {placement!r}")
    _make_norm(norm, dim, eps)  # validates norm and eps before building anything
    make_sublayer = mlp if sublayer is None else sublayer
    block = PreLNBlock if placement == "pre" else PostLNBlock
    layers: list[nn.Module] = [
        block(dim, make_sublayer(dim), _make_norm(norm, dim, eps)) for _ in range(depth)
    ]
    if final_norm is None:
        final_norm = placement == "pre"
    if final_norm:
        layers.append(_make_norm(norm, dim, eps))
    return nn.Sequential(*layers)
