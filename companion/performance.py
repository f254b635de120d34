r"""Measuring speed and precision (appendix :ref:`ch-performance`).

Small helpers that the appendix *Performance and precision* and the scripts in
``benchmarks/`` share, so that the page and ``make bench`` measure the same thing:

- :func:`keep_freed_memory`: make the C allocator reuse freed memory, so that a timing
  measures the kernel and not the operating system's page faults on fresh memory.
- :func:`compare_timings`: median run times of several implementations measured side by
  side in one run (warm-up, :mod:`torch.utils.benchmark`, interleaved rounds,
  accelerator synchronization).
- :func:`tensor_bytes` and :func:`attention_flops`: the bytes an operation must move and
  the floating-point operations it must do, the two floors a kernel's time is compared
  with.
- :func:`memory_traffic`: the bytes that the torch operators of an implementation read
  and
  write, operator by operator: why one formula of the same arithmetic takes several
  times another's time.
- :func:`ulp` and :func:`max_abs_error`: how large a rounding step is at a given
  magnitude, and an error measure that reports NaN and infinity as an infinite error.
- :func:`rope_table` and :func:`rope_error_by_position`: the RoPE cos/sin tables of
  three recipes found in the wild (float64 angles as in :mod:`companion.rope`, Hugging
  Face's float32 angles, a bfloat16 table) and the output error of each against a
  float64 reference.
- :func:`one_pass_layer_norm` and :func:`naive_softmax_attention`: the two textbook
  shortcuts whose failures the appendix measures (variance as :math:`E[x^2] - E[x]^2`; a
  softmax without subtracting the maximum).

Timings depend on the machine and its load: nothing here or in the tests asserts on
them.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import platform
import statistics
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
import torch.utils.benchmark as tb
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from companion import _validate
from companion.rope import apply_rope, rope_cos_sin, rope_frequencies

__all__ = [
    "ROPE_RECIPES",
    "MemoryTraffic",
    "PositionErrors",
    "attention_flops",
    "compare_timings",
    "keep_freed_memory",
    "max_abs_error",
    "memory_traffic",
    "naive_softmax_attention",
    "one_pass_layer_norm",
    "peak_live_bytes",
    "rope_error_by_position",
    "rope_table",
    "tensor_bytes",
    "ulp",
]

ROPE_RECIPES = ("float64-angles", "float32-angles", "bfloat16-table")
"""The RoPE table recipes :func:`rope_table` builds."""


# ---- timing --------------------------------------------------------------------------

_M_TRIM_THRESHOLD = -1  # mallopt parameters of glibc's <malloc.h>
_M_MMAP_THRESHOLD = -3


def keep_freed_memory(limit_bytes: int = 2**30) -> bool:
    """Ask glibc's ``malloc`` to keep and reuse freed memory up to ``limit_bytes`` per
    block.

    On the CPU torch allocates tensors with the C library's ``malloc``. By default glibc
    serves large blocks with fresh ``mmap`` pages and returns freed memory to the
    operating system, so the next tensor of that size costs a page fault per 4 KiB page
    on first touch; whether that happens depends on the allocation history, and it can
    dominate the time of a memory-bound operation. Raising ``M_MMAP_THRESHOLD`` and
    ``M_TRIM_THRESHOLD`` makes freed blocks stay in the process and be reused, as
    torch's caching allocator does on a GPU, so that a timing measures the kernel. The
    setting is process-wide and lasts until the process ends; the price is that the
    process keeps up to ``limit_bytes`` of freed memory.

    Args:
        limit_bytes: blocks up to this size come from the reusable heap; positive.

    Returns:
        ``True`` if the setting was applied (Linux with glibc), ``False`` elsewhere
        (other C libraries manage memory differently; nothing is changed).
    """
    limit_bytes = _validate.positive_int("limit_bytes", limit_bytes)
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    limit = min(limit_bytes, 2**31 - 1)  # mallopt takes a C int
    return bool(
        libc.mallopt(_M_MMAP_THRESHOLD, limit)
        and libc.mallopt(_M_TRIM_THRESHOLD, limit)
    )


def compare_timings(
    cases: Mapping[str, Callable[[], object]],
    *,
    min_run_time: float = 0.2,
    rounds: int = 3,
    num_threads: int | None = None,
) -> dict[str, float]:
    """Median seconds per call of each case, measured side by side in one run.

    Each case is called once to warm up (allocator, caches, lazy initialization,
    compilation). Then, ``rounds`` times, every case is measured in turn with
    :meth:`torch.utils.benchmark.Timer.blocked_autorange` (at least ``min_run_time``
    seconds of calls, the median of its blocks); interleaving the cases means that a
    change in the machine's load hits all of them alike. The result is the median over
    the rounds. The timer of :mod:`torch.utils.benchmark` synchronizes a CUDA device
    before reading the clock, so asynchronous kernels are counted in full.

    Args:
        cases: name -> a function with no arguments (its result is discarded); measure
            implementations on the *same* tensors so that the ratios compare like with
            like.
        min_run_time: seconds of calls per measurement; positive.
        rounds: number of interleaved rounds; at least 1.
        num_threads: CPU threads torch may use while the cases run; default
            ``torch.get_num_threads()``, the setting of the caller. (``Timer`` on its
            own runs with one thread, whatever the process uses.)

    Returns:
        name -> median seconds per call, in the order of ``cases``.
    """
    _validate.instance("cases", cases, Mapping, "a mapping of name -> callable")
    if not cases:
        raise ValueError(
            "cases must hold at least one name -> callable, got an empty mapping"
        )
    for name, fn in cases.items():
        _validate.instance(f"cases key {name!r}", name, str, "a str")
        _validate.callable_(f"cases[{name!r}]", fn)
    min_run_time = _validate.positive_real("min_run_time", min_run_time)
    rounds = _validate.positive_int("rounds", rounds)
    threads = _validate.optional(_validate.positive_int, "num_threads", num_threads)
    threads = torch.get_num_threads() if threads is None else threads
    timers = {
        name: tb.Timer(
            "fn()", globals={"fn": fn}, description=name, num_threads=threads
        )
        for name, fn in cases.items()
    }
    for timer in timers.values():
        timer.timeit(1)  # warm-up
    per_round: dict[str, list[float]] = {name: [] for name in timers}
    for _ in range(rounds):
        for name, timer in timers.items():
            per_round[name].append(
                timer.blocked_autorange(min_run_time=min_run_time).median
            )
    return {name: statistics.median(ts) for name, ts in per_round.items()}


# ---- what bounds an operation --------------------------------------------------------


def tensor_bytes(*tensors: Tensor) -> int:
    """Bytes held by the elements of the given tensors (``numel * element_size``
    summed).

    An operation that reads tensors ``a, b`` and writes ``c`` moves at least
    ``tensor_bytes(a, b, c)`` bytes through memory; divided by the run time this is the
    bandwidth it achieved. ``x.clone()`` moves ``2 * tensor_bytes(x)``: the floor for
    any out-of-place elementwise operation on ``x``.

    Args:
        tensors: any tensors.

    Returns:
        The total in bytes.
    """
    for i, t in enumerate(tensors):
        _validate.tensor(f"tensors[{i}]", t, dtype=None)
    return sum(t.numel() * t.element_size() for t in tensors)


@dataclass(frozen=True)
class MemoryTraffic:
    """Bytes read and written by each torch operator of a call (from
    :func:`memory_traffic`).

    Attributes:
        ops: one ``(operator name, bytes read, bytes written)`` per operator that moved
            data, in call order.
    """

    ops: list[tuple[str, int, int]] = field(default_factory=list)

    @property
    def read(self) -> int:
        """Bytes read, summed over the operators."""
        return sum(r for _, r, _ in self.ops)

    @property
    def written(self) -> int:
        """Bytes written, summed over the operators."""
        return sum(w for _, _, w in self.ops)

    @property
    def total(self) -> int:
        """Bytes read plus bytes written."""
        return self.read + self.written


_OVERWRITES = {
    "copy_",
    "fill_",
    "zero_",
    "uniform_",
    "normal_",
    "random_",
    "bernoulli_",
}
_FRESH = {"empty", "empty_like", "empty_strided"}


def _distinct_bytes(t: Tensor) -> int:
    """Bytes of the distinct elements of ``t``: a broadcast (stride 0) axis holds one
    element."""
    n = 1
    for size, stride in zip(t.shape, t.stride(), strict=True):
        n *= size if stride != 0 else 1
    return n * t.element_size() if t.numel() else 0


class _TensorWatch(TorchDispatchMode):
    """Watches every torch operator run while active: the one memory meter of the
    package.

    With ``traffic=True`` it adds up, per operator, the distinct bytes of its tensor
    inputs (read) and outputs (written), for :func:`memory_traffic`. With ``live=True``
    it counts the bytes of the storages that operators create as they live and die, and
    their peak, for :func:`companion.attention.measure_peak_memory`: a storage is
    counted once, when an operator first returns it, and released when the last tensor
    seen on it (the first result or any later view or in-place result) is garbage
    collected; storages of tensors made before the watch started are never counted.
    """

    def __init__(self, *, traffic: bool = False, live: bool = False) -> None:
        super().__init__()
        self.traffic, self.live = traffic, live
        self.ops: list[
            tuple[str, int, int]
        ] = []  # (operator, bytes read, bytes written)
        self.live_bytes = 0
        self.peak = 0
        self._sizes: dict[int, int] = {}  # storage address -> bytes
        self._refs: dict[
            int, int
        ] = {}  # storage address -> tensors seen on it still alive

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.traffic:
            self._count_traffic(func, args, kwargs, out)
        if self.live:
            self._count_live(args, kwargs, out)
        return out

    def _count_traffic(self, func, args, kwargs, out) -> None:
        name = func.overloadpacket.__name__
        if func.is_view or name in _FRESH:
            return  # a new view of old data, or memory not yet written: no traffic
        read = 0
        for i, arg in enumerate(func._schema.arguments):
            value = (
                kwargs.get(arg.name) if arg.kwarg_only or i >= len(args) else args[i]
            )
            tensors = [t for t in tree_leaves(value) if isinstance(t, Tensor)]
            if not tensors:
                continue
            mutated = arg.alias_info is not None and arg.alias_info.is_write
            if mutated and (arg.name == "out" or name in _OVERWRITES):
                continue  # written only: counted with the outputs
            read += sum(_distinct_bytes(t) for t in tensors)
        written = sum(
            _distinct_bytes(t) for t in tree_leaves(out) if isinstance(t, Tensor)
        )
        if read or written:
            self.ops.append((name, read, written))

    def _count_live(self, args, kwargs, out) -> None:
        inputs = {
            t.untyped_storage().data_ptr()
            for t in tree_leaves((args, kwargs))
            if isinstance(t, Tensor)
        }
        for t in tree_leaves(out):
            if not isinstance(t, Tensor):
                continue
            storage = t.untyped_storage()
            address = storage.data_ptr()
            if address == 0 or (address in inputs and address not in self._sizes):
                # empty, or a view/in-place result of a tensor made before the watch
                continue
            if address not in self._sizes:  # new memory
                self._sizes[address] = storage.nbytes()
                self._refs[address] = 0
                self.live_bytes += storage.nbytes()
                self.peak = max(self.peak, self.live_bytes)
            self._refs[address] += 1  # one more tensor keeps this storage alive
            weakref.finalize(t, self._release, address)

    def _release(self, address: int) -> None:
        self._refs[address] -= 1
        if self._refs[address] == 0:
            del self._refs[address]
            self.live_bytes -= self._sizes.pop(address)


def memory_traffic(fn: Callable[[], object]) -> MemoryTraffic:
    """The bytes that each torch operator called by ``fn()`` reads and writes.

    A model of memory traffic, not a measurement: every operator is taken to read each
    distinct element of its tensor inputs once and to write each element of its outputs
    once (a broadcast input, such as a cos/sin table shared by all heads, counts its own
    elements, not the broadcast size; views, and the memory an ``out=`` argument only
    receives, move nothing). Caches can make the true traffic smaller, and the count
    cannot see inside one compiled or fused kernel. ``x.clone()`` moves
    ``2 * tensor_bytes(x)``; the appendix compares each formula's count with its
    measured time. Operators are seen through a
    :class:`~torch.utils._python_dispatch.TorchDispatchMode` (call ``fn`` eagerly).

    Args:
        fn: a function with no arguments (its result is discarded).

    Returns:
        The per-operator counts, with their sums.
    """
    fn = _validate.callable_("fn", fn)
    watch = _TensorWatch(traffic=True)
    with watch:
        fn()
    return MemoryTraffic(watch.ops)


def peak_live_bytes(fn: Callable[[], object]) -> int:
    """The most bytes of storage that the torch operators called by ``fn()`` hold at once.

    Counts what operators create while ``fn`` runs, as it lives and dies: a storage is
    counted when an operator first returns it and released when the last tensor seen on
    it is garbage collected; storages made before the call are never counted. The CPU
    path of :func:`companion.attention.measure_peak_memory` (on CUDA that reads the
    allocator's own peak). Operators are seen through a
    :class:`~torch.utils._python_dispatch.TorchDispatchMode` (call ``fn`` eagerly).

    Args:
        fn: a function with no arguments (its result is discarded).

    Returns:
        Peak bytes.
    """
    fn = _validate.callable_("fn", fn)
    watch = _TensorWatch(live=True)
    with watch:
        fn()
    return watch.peak


def attention_flops(
    batch: int, heads: int, length: int, source_length: int, head_dim: int
) -> int:
    r"""Floating-point operations of the two matrix products of attention.

    :math:`QK^\top` and :math:`PV` each take :math:`L \cdot S \cdot D` multiply-adds per
    head,
    two operations each: :math:`4\,B H L S D` in all. The softmax adds :math:`O(BHLS)`,
    which is small next to it when :math:`D` is 64 or more; the score matrix it reads
    and writes is :math:`B H L S` numbers, the memory that tiling avoids.

    Args:
        batch: ``B``.
        heads: ``H``.
        length: ``L``, the number of queries.
        source_length: ``S``, the number of keys and values.
        head_dim: ``D``.

    Returns:
        The operation count.
    """
    values = {
        "batch": batch,
        "heads": heads,
        "length": length,
        "source_length": source_length,
        "head_dim": head_dim,
    }
    b, h, n, s, d = (_validate.positive_int(name, v) for name, v in values.items())
    return 4 * b * h * n * s * d


# ---- precision -----------------------------------------------------------------------


def ulp(x: Tensor | float, *, dtype: torch.dtype = torch.float32) -> Tensor:
    r"""The spacing of ``dtype``'s numbers at magnitude ``|x|``: one unit in the last
    place.

    For :math:`2^k \le |x| < 2^{k+1}` this is :math:`2^{k}\,\varepsilon` with
    :math:`\varepsilon` = ``torch.finfo(dtype).eps`` (:math:`2^{-23}` for float32,
    :math:`2^{-7}` for bfloat16), the distance from a number of that binade to the next
    larger one (``numpy.spacing``'s convention). Below the smallest normal number the
    spacing is the constant of the subnormals. Rounding to nearest errs by at most half
    of it.

    Args:
        x: magnitudes (a tensor or a number); finite.
        dtype: the floating-point format whose spacing is wanted.

    Returns:
        The spacing, float64, with ``x``'s shape (a 0-d tensor for a number).
    """
    dtype = _validate.dtype("dtype", dtype)
    if isinstance(x, Tensor):
        x = _validate.tensor("x", x, dtype=("floating", "integer"))
    else:
        x = _validate.real("x", x, finite=False)
    a = torch.as_tensor(x, dtype=torch.float64).abs()
    if not torch.isfinite(a).all():
        raise ValueError(
            f"x must be finite, got {_validate.describe(x)} with NaN or inf"
        )
    info = torch.finfo(dtype)
    _, exponent = torch.frexp(a.clamp(min=info.tiny))  # |x| = m * 2**e, 0.5 <= m < 1
    return torch.ldexp(torch.full_like(a, info.eps), exponent - 1)  # eps * 2**(e - 1)


def max_abs_error(approx: Tensor, reference: Tensor) -> float:
    """Largest absolute difference, computed in float64; NaN or infinity count as
    ``inf``.

    ``(a - b).abs().max()`` returns NaN when ``a`` holds a NaN, and a NaN compares false
    with every threshold: ``assert error < tol`` fails on it, as it should, but a check
    written as ``assert not (error > tol)`` passes it, and Python's ``max`` over a list
    of errors skips a NaN that does not come first (``max([1e-7, nan])`` is ``1e-7``).
    Returned as ``inf``, a NaN fails every form of the check.

    Args:
        approx: the result under test.
        reference: the reference, broadcastable to ``approx``.

    Returns:
        The error as a Python float (``inf`` if any entry is not finite).
    """
    approx = _validate.tensor("approx", approx, dtype=("floating", "integer", "bool"))
    reference = _validate.tensor(
        "reference", reference, dtype=("floating", "integer", "bool")
    )
    _validate.same_device("reference", reference, "approx", approx)
    _validate.broadcastable(
        "approx and reference", [approx.shape, reference.shape], "shapes"
    )
    diff = (approx.to(torch.float64) - reference.to(torch.float64)).abs()
    if diff.numel() == 0:
        return 0.0
    if not torch.isfinite(diff).all():
        return math.inf
    return diff.max().item()


def rope_table(
    positions: Tensor,
    head_dim: int,
    *,
    base: float = 10000.0,
    recipe: str = "float64-angles",
) -> tuple[Tensor, Tensor]:
    r"""The RoPE ``(cos, sin)`` table as three common recipes build it.

    - ``"float64-angles"``: angles :math:`m\theta_i` in float64, cos and sin cast to
      float32; :func:`companion.rope.rope_cos_sin`.
    - ``"float32-angles"``: Hugging Face ``transformers``' ``LlamaRotaryEmbedding``:
      ``inv_freq = 1 / base ** (arange(0, D, 2).float() / D)`` and the angle
      ``position.float() * inv_freq`` in float32, then cos and sin in float32. At
      position :math:`m` the angle is rounded to float32's spacing there (0.125 rad at
      :math:`2^{20}`).
    - ``"bfloat16-table"``: exact angles, but the table stored in bfloat16 (8
      significant bits), as when a model's buffers are cast with
      ``model.to(torch.bfloat16)``.

    Args:
        positions: position ids, 1-D, integer or real.
        head_dim: the head width ``D``, even.
        base: the frequency base.
        recipe: one of :data:`ROPE_RECIPES`.

    Returns:
        ``(cos, sin)``, float32 (bfloat16 for ``"bfloat16-table"``), on ``positions``'
        device.

    Shape:
        positions: ``(L,)``.
        cos, sin: ``(L, D // 2)``.
    """
    positions = _validate.tensor(
        "positions", positions, dtype=("integer", "floating"), ndim=1
    )
    if positions.is_floating_point() and not torch.isfinite(positions).all():
        raise ValueError("positions must be finite, got NaN or inf")
    head_dim = _validate.positive_int("head_dim", head_dim, even=True)
    base = _validate.real("base", base, exclusive_minimum=1.0)
    recipe = _validate.choice("recipe", recipe, ROPE_RECIPES)
    frequencies = rope_frequencies(head_dim, base=base)  # validates head_dim and base
    if recipe == "float32-angles":
        steps = torch.arange(0, head_dim, 2, dtype=torch.int64, device=positions.device)
        inv_freq = 1.0 / (base ** (steps.float() / head_dim))  # (D/2,) float32, as HF
        angles = (
            positions.float()[:, None] * inv_freq[None, :]
        )  # (L, D/2), rounded to float32
        return angles.cos(), angles.sin()
    dtype = torch.bfloat16 if recipe == "bfloat16-table" else torch.float32
    return rope_cos_sin(positions, frequencies, dtype=dtype)


@dataclass(frozen=True)
class PositionErrors:
    """The output error of a RoPE recipe at each position (from
    :func:`rope_error_by_position`).

    Attributes:
        positions: the positions, float64 ``(P,)``.
        error: the largest absolute error of the rotated vectors at each position,
            ``(P,)``.
        scale: the largest magnitude of the exact rotated vectors at each position,
            ``(P,)``.
    """

    positions: Tensor
    error: Tensor
    scale: Tensor

    def in_ulps(self, dtype: torch.dtype = torch.float32) -> Tensor:
        """The error in units of ``dtype``'s spacing at the output scale, ``(P,)``."""
        return self.error / ulp(self.scale, dtype=dtype)


def rope_error_by_position(
    positions: Tensor,
    head_dim: int,
    *,
    base: float = 10000.0,
    recipe: str = "float64-angles",
    num_vectors: int = 8,
    generator: torch.Generator | None = None,
) -> PositionErrors:
    r"""Error of float32 RoPE built with ``recipe``, against float64 RoPE, at each
    position.

    ``num_vectors`` random float32 vectors (standard normal, the same at every position)
    are rotated by :func:`companion.rope.apply_rope` (half layout, float32 arithmetic)
    with the recipe's table, and exactly: the same float32 inputs in float64 with
    float64 angles. The exact rotation keeps each pair's length, so the output scale is
    that of the input and a float32 result can at best be within half a float32 spacing
    of it.

    Args:
        positions: positions to test, 1-D, non-negative.
        head_dim: the head width ``D``, even.
        base: the frequency base.
        recipe: one of :data:`ROPE_RECIPES` (see :func:`rope_table`).
        num_vectors: how many random vectors to rotate at each position.
        generator: random generator for the vectors (``None``: a fixed seed, 0).

    Returns:
        A :class:`PositionErrors` holding the error and the output scale per position.
    """
    positions = _validate.tensor(
        "positions", positions, dtype=("integer", "floating"), ndim=1, nonempty=True
    )
    if not (positions >= 0).all():
        raise ValueError(
            f"positions must be non-negative and not NaN, got {positions.min()}"
        )
    head_dim = _validate.positive_int("head_dim", head_dim, even=True)
    base = _validate.real("base", base, exclusive_minimum=1.0)
    recipe = _validate.choice("recipe", recipe, ROPE_RECIPES)
    num_vectors = _validate.positive_int("num_vectors", num_vectors)
    _validate.optional(
        _validate.instance,
        "generator",
        generator,
        cls=torch.Generator,
        expected="a Generator",
    )
    gen = torch.Generator().manual_seed(0) if generator is None else generator
    x = torch.randn(num_vectors, 1, head_dim, generator=gen)  # (N, 1, D) float32
    x = x.expand(
        num_vectors, positions.numel(), head_dim
    )  # (N, P, D): same vectors everywhere
    cos, sin = rope_table(positions, head_dim, base=base, recipe=recipe)  # (P, D/2)
    y = apply_rope(x, cos, sin)  # (N, P, D) float32 arithmetic
    c64, s64 = rope_cos_sin(
        positions, rope_frequencies(head_dim, base=base), dtype=torch.float64
    )
    exact = apply_rope(x.double(), c64, s64)  # (N, P, D) float64
    error = (y.double() - exact).abs().amax(dim=(0, 2))  # (P,)
    scale = exact.abs().amax(dim=(0, 2))  # (P,)
    return PositionErrors(positions.to(torch.float64).cpu(), error.cpu(), scale.cpu())


def one_pass_layer_norm(x: Tensor, *, eps: float = 1e-5) -> Tensor:
    r"""LayerNorm with the one-pass variance :math:`E[x^2] - E[x]^2`, in ``x``'s dtype.

    A baseline to measure, not to use: both terms are about :math:`\mu^2`, so when the
    mean :math:`\mu` is large next to the spread :math:`\sigma` their difference loses
    about :math:`2\log_2(|\mu|/\sigma)` bits, and in float32 the variance can come out
    as zero or negative. :func:`companion.norm.layer_norm` and
    :func:`torch.nn.functional.layer_norm` subtract the mean first. No gain or bias;
    normalizes the last dimension.

    Args:
        x: input, floating point.
        eps: added to the variance inside the square root.

    Returns:
        The normalized tensor, ``x``'s shape and dtype (NaN where the variance came out
        below ``-eps``).

    Shape:
        x: ``(..., D)``; output: same.
    """
    x = _validate.tensor("x", x, min_ndim=1, meaning="(..., D)")
    eps = _validate.positive_real("eps", eps)
    mean = x.mean(dim=-1, keepdim=True)
    var = (x * x).mean(dim=-1, keepdim=True) - mean * mean  # cancels when |mean| >> std
    return (x - mean) / torch.sqrt(var + eps)


def naive_softmax_attention(query: Tensor, key: Tensor, value: Tensor) -> Tensor:
    r"""Attention with the softmax written as :math:`e^{s}/\sum e^{s}`, without the max
    shift.

    A baseline to measure, not to use: in float32 :math:`e^{s}` overflows to infinity
    for :math:`s > 88.7`, and infinity over infinity is NaN. Subtracting the row maximum
    first (as :func:`companion.attention.scaled_dot_product_attention` and torch do)
    gives the same value in exact arithmetic and never overflows.

    Args:
        query: ``(..., L, D)``.
        key: ``(..., S, D)``.
        value: ``(..., S, D_v)``.

    Returns:
        ``(..., L, D_v)``, in the inputs' dtype.
    """
    value = _validate.tensor("value", value, min_ndim=2, meaning="(..., S, D_v)")
    _validate.attention_inputs(query, key, value)
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])  # (..., L, S)
    e = torch.exp(scores)  # overflows for scores > 88.7 in float32
    return (e / e.sum(dim=-1, keepdim=True)) @ value  # (..., L, D_v)
