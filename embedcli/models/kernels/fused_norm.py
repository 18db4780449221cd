"""A post-norm layer's `LayerNorm(h + x)` in one pass on x86-64 CPUs (the compiled `_cpu` kernels, `native`): float32
on AVX-512 or AVX2 + FMA, bf16 (h, or the copy for the next linear) on AVX-512 BF16.

torch spends three passes over the hidden states here: the residual add (under bf16 autocast a bf16 + float32 add
that promotes), the layer norm, and the next linear's cast of its input to bf16. The kernel reads h and x once per
row and writes the float32 result, plus, under CPU bf16 autocast, the bf16 copy the next linear reads (returned
beside it, so the linear skips its cast).

Numerics: the float32 sum is torch's; mean and variance are two-pass float32 sums over the row (torch: a Welford
pass), then (y - mean) * rstd * weight + bias with torch's rounding steps: max |diff| vs torch ~1e-6 on unit-scale
rows. The bf16 copy rounds to nearest even, as `.to(torch.bfloat16)` does.
"""

from __future__ import annotations

import torch
from torch import nn

from embedcli.models.kernels import native


def _low_dtype(x: torch.Tensor) -> torch.dtype | None:
    """The dtype the next linear computes in when it is not x's own (CPU bf16 autocast), else None."""
    if torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16:
        return torch.bfloat16
    return None


def applies(h: torch.Tensor, x: torch.Tensor, norm: nn.Module) -> bool:
    """Whether `add_layer_norm` serves `norm(h + x)` for `[rows, hidden]` h and x."""
    if type(norm) is not nn.LayerNorm or x.device.type != "cpu" or x.dtype != torch.float32:
        return False
    # Either may be None (elementwise_affine=False, bias=False), whatever torch's annotations say.
    weight: torch.Tensor | None = getattr(norm, "weight", None)
    bias: torch.Tensor | None = getattr(norm, "bias", None)
    if weight is None or weight.dtype != torch.float32 or (bias is not None and bias.dtype != torch.float32):
        return False
    if torch.is_grad_enabled() and (h.requires_grad or x.requires_grad or weight.requires_grad):
        return False
    if h.dtype not in (torch.float32, torch.bfloat16) or not native.available(h.dtype):
        return False
    low = _low_dtype(x)
    if low is not None and not native.available(low):
        return False
    hidden = x.shape[-1]
    return (
        x.dim() == 2
        and h.shape == x.shape
        and tuple(norm.normalized_shape) == (hidden,)
        and h.stride(1) == 1
        and x.stride(1) == 1
        and weight.is_contiguous()
        and (bias is None or bias.is_contiguous())
    )


def add_layer_norm(h: torch.Tensor, x: torch.Tensor, norm: nn.LayerNorm) -> tuple[torch.Tensor, torch.Tensor]:
    """(`norm(h + x)` in float32, the same rows in the dtype the next linear computes in: bf16 under CPU autocast,
    else the float32 result itself). Call only where `applies(h, x, norm)`."""
    rows, hidden = x.shape
    out = torch.empty((rows, hidden), dtype=torch.float32)
    low = _low_dtype(x)
    low_rows = torch.empty((rows, hidden), dtype=low) if low is not None else out
    bias: torch.Tensor | None = getattr(norm, "bias", None)
    native.kernels().add_layer_norm(
        h.data_ptr(), h.dtype == torch.bfloat16, h.stride(0), x.data_ptr(), x.stride(0), out.data_ptr(),
        low_rows.data_ptr() if low is not None else 0, norm.weight.data_ptr(), 0 if bias is None else bias.data_ptr(),
        rows, hidden, float(norm.eps), torch.get_num_threads(),
    )
    return out, low_rows
