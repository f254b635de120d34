"""Triton, imported once for the kernels of :mod:`companion.kernels`: compiled on a CUDA
device, interpreted on the CPU otherwise (private; ``companion.kernels`` is the entry point).

Triton decides when it is imported whether kernels are compiled or interpreted
(``TRITON_INTERPRET``), so every module that holds a kernel imports Triton through this one.
"""

from __future__ import annotations

import os
import sys

import torch
from torch import Tensor

# Triton decides when it is imported whether kernels are compiled or interpreted
# (TRITON_INTERPRET). Without a GPU, the interpreter is the only way to run them.
if "triton" not in sys.modules and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

try:
    import triton
    import triton.language as tl
    from triton.runtime.errors import OutOfResources
except ImportError as exc:  # pragma: no cover - exercised only without Triton
    raise ImportError(
        "companion.kernels needs Triton: pip install triton (or, from the repository, "
        'pip install -e ".[kernels]"); Triton has wheels for Linux only'
    ) from exc

__all__ = ["LOG2E", "OutOfResources", "check_device", "interpreted", "tl", "triton"]

if not torch.cuda.is_available() and not triton.knobs.runtime.interpret:
    raise ImportError(
        "this machine has no CUDA device, so companion.kernels runs its kernels through "
        "Triton's interpreter, but Triton was imported before companion.kernels without "
        "TRITON_INTERPRET=1: import companion.kernels first, or set TRITON_INTERPRET=1"
    )

LOG2E = 1.4426950408889634  # log2(e): the kernels exponentiate with exp2


def interpreted() -> bool:
    """Whether the kernels run through Triton's interpreter (on CPU tensors) rather than
    compiled for a CUDA GPU. Fixed when Triton is first imported: interpreted when this
    machine has no CUDA device or ``TRITON_INTERPRET=1`` was set."""
    return bool(triton.knobs.runtime.interpret)


def check_device(name: str, x: Tensor) -> None:
    want = "cpu" if interpreted() else "cuda"
    if x.device.type != want:
        mode = (
            "run through Triton's interpreter, on CPU tensors"
            if want == "cpu"
            else "are compiled for the GPU here, and need CUDA tensors"
        )
        raise ValueError(
            f"{name} must be on a {want!r} device (the kernels {mode}), got a tensor "
            f"on {x.device}"
        )
