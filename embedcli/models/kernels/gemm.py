"""Linear layers of the own backbones through oneDNN on the CPU, with weights prepacked once per dtype.

Why not `F.linear`: on the CPU, torch sends float32 matmuls to MKL's sgemm, which takes its slow code
path on non-Intel CPUs (measured on an AMD EPYC with AVX-512: 205-220 GFLOP/s, where oneDNN's
`mkldnn::_linear_pointwise` on the same shapes gives 470-510, and prepacking the weight adds ~7%).
bf16 matmuls already go through oneDNN in torch; prepacking saves autocast's per-call weight cast.
oneDNN also applies the activation on the accumulator (a fused post-op), saving one pass over the output.

Numerics: the same float32 dot products in another order (max |Δ| vs a float64 reference ~1.6x MKL's,
both far inside the 1e-5 the backbone tests hold); under CPU bf16 autocast the maths is autocast's own:
bf16 inputs, weight and bias, bf16 output. Anything else (CUDA, a quantized module, float16, autograd,
an empty batch, a torch without oneDNN) takes the plain module call.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GELU, tanh approximation (transformers' gelu_new / gelu_fast / gelu_pytorch_tanh)."""
    return F.gelu(x, approximate="tanh")


# Activations oneDNN applies as a post-op: function -> (attr, algorithm) of `mkldnn::_linear_pointwise`.
FUSED_ACTIVATIONS: dict[Callable[[torch.Tensor], torch.Tensor], tuple[str, str]] = {
    F.gelu: ("gelu", "none"),
    gelu_tanh: ("gelu", "tanh"),
    F.relu: ("relu", ""),
}
_PACK_ROWS_HINT = 2048  # the row count oneDNN picks the packed layout for: the CPU token budget


def onednn_available() -> bool:
    """Whether this torch has oneDNN's CPU linear kernels."""
    return bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_linear_pointwise")


_ONEDNN = onednn_available()


class _Packed:
    """A Linear's weight (and bias) laid out for oneDNN, one copy per compute dtype, made on first use."""

    def __init__(self) -> None:
        self.by_dtype: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor | None]] = {}
        self.source: tuple[int, int] | None = None

    def get(self, module: nn.Linear, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
        # The packs copy the weight: a weight replaced or written in place since (a reload) drops them.
        source = (module.weight.data_ptr(), module.weight._version)
        if source != self.source:
            self.by_dtype.clear()
            self.source = source
        packed = self.by_dtype.get(dtype)
        if packed is None:
            weight = module.weight.detach().to(dtype).contiguous()
            bias = None if module.bias is None else module.bias.detach().to(dtype).contiguous()  # type: ignore[redundant-expr]  # torch types Linear.bias as a Tensor; bias=False makes it None
            packed = (torch.ops.mkldnn._reorder_linear_weight(weight, _PACK_ROWS_HINT), bias)
            self.by_dtype[dtype] = packed
        return packed


def _compute_dtype(module: nn.Module, x: torch.Tensor) -> torch.dtype | None:
    """The dtype the oneDNN path computes `module(x)` in, or None when it does not apply."""
    if not _ONEDNN or type(module) is not nn.Linear or x.device.type != "cpu" or x.dim() != 2 or x.shape[0] == 0:
        return None
    weight = module.weight
    if weight.dtype != torch.float32 or weight.device.type != "cpu":
        return None
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        return None
    if torch.is_autocast_enabled("cpu"):
        return torch.bfloat16 if torch.get_autocast_dtype("cpu") == torch.bfloat16 else None
    return torch.float32 if x.dtype == torch.float32 else None


def linear(
    module: nn.Module, x: torch.Tensor, act: Callable[[torch.Tensor], torch.Tensor] | None = None
) -> torch.Tensor:
    """`act(module(x))` for a Linear `module` on `[rows, in]` input (oneDNN on the CPU, see the module doc)."""
    dtype = _compute_dtype(module, x)
    fused = FUSED_ACTIVATIONS.get(act) if act is not None else None
    if dtype is None:
        out = module(x)
        return out if act is None else act(out)
    cache: _Packed | None = module.__dict__.get("_embedcli_packed")
    if cache is None:
        cache = module.__dict__["_embedcli_packed"] = _Packed()
    weight, bias = cache.get(module, dtype)  # type: ignore[arg-type]  # every caller passes a Linear
    attr, algorithm = fused or ("none", "")
    out = torch.ops.mkldnn._linear_pointwise(x.to(dtype).contiguous(), weight, bias, attr, [], algorithm)
    return out if act is None or fused is not None else act(out)
