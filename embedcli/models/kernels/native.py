"""The compiled CPU kernels (`_cpu`, built from `_cpu.cpp` by setup.py), and whether this CPU runs them.

The extension is optional: without it (no compiler at install, another architecture) or on a CPU without the
instructions a dtype needs (float32: AVX-512, else AVX2 + FMA; bfloat16: AVX-512 BF16), `available` says no and every
caller takes its torch path, which computes the same thing more slowly.
"""

from __future__ import annotations

from types import ModuleType

import torch

_cpu: ModuleType | None
try:
    from embedcli.models.kernels import _cpu
except ImportError:  # built without a compiler, or on another architecture
    _cpu = None

# (float32, bfloat16): AVX-512 F/BW/VL/DQ or AVX2 + FMA, and AVX-512 BF16 for bf16 inputs.
_SUPPORTED: tuple[bool, bool] = _cpu.supported() if _cpu is not None else (False, False)


def available(dtype: torch.dtype) -> bool:
    """Whether the kernels are built and this CPU runs them on `dtype` (float32, or bfloat16 with AVX-512 BF16)."""
    if dtype == torch.float32:
        return _SUPPORTED[0]
    return dtype == torch.bfloat16 and _SUPPORTED[1]


def kernels() -> ModuleType:
    """The extension module (call only where `available`)."""
    assert _cpu is not None
    return _cpu


_isa = _cpu.float32_isa() if _cpu is not None else "none"


def float32_isa() -> str:
    """The instruction set the float32 kernels run here: "avx512", "avx2", or "none" (not built, or neither)."""
    return _isa


def use_avx2(on: bool) -> str:
    """Run the float32 kernels' AVX2 code even on an AVX-512 CPU (to test or compare it); returns `float32_isa()`."""
    global _isa
    if _cpu is not None:
        _cpu.use_avx2(on)
        _isa = _cpu.float32_isa()
    return _isa
