"""Linear layers of the own backbones through oneDNN on the CPU, with weights prepacked once per dtype.

Why not `F.linear`: on the CPU, torch sends float32 matmuls to MKL's sgemm, which takes its slow code
path on non-Intel CPUs (measured on an AMD EPYC with AVX-512: 205-220 GFLOP/s, where oneDNN's
`mkldnn::_linear_pointwise` on the same shapes gives 470-510, and prepacking the weight adds ~7%).
bf16 matmuls already go through oneDNN in torch; prepacking saves autocast's per-call weight cast.
oneDNN also applies the activation on the accumulator (a fused post-op), saving one pass over the output.

Numerics: the same float32 dot products in another order (max |Δ| vs a float64 reference ~1.6x MKL's,
both far inside the 1e-5 the backbone tests hold); under CPU bf16 autocast the maths is autocast's own:
bf16 inputs, weight and bias, bf16 output. Anything else (CUDA, a quantized module, float16, autograd,
an empty batch, a torch without oneDNN, bf16 on a CPU whose oneDNN has no bf16 kernels) takes the plain module call.
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


def onednn_bf16_available() -> bool:
    """Whether oneDNN's linear kernels take bfloat16 on this CPU (AVX-512 BW/VL/DQ or AVX-NE-CONVERT and up)."""
    # Without those instructions oneDNN has no bf16 inner product: the weight reorder and the matmul raise
    # (seen on an AVX2-only AMD EPYC), where torch's own bf16 linear still runs.
    return onednn_available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


_ONEDNN = onednn_available()
_ONEDNN_BF16 = onednn_bf16_available()


class _Packed:
    """A Linear's weight (and bias) laid out for oneDNN, one copy per compute dtype, made on first use."""

    def __init__(self) -> None:
        self.by_dtype: dict[tuple[torch.dtype, int], tuple[torch.Tensor, torch.Tensor | None]] = {}
        self.source: tuple[int, int] | None = None

    def get(self, module: nn.Linear, dtype: torch.dtype, half: int = -1) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The packed weight and bias: all output rows (`half` -1), or the first (0) or second (1) half of them."""
        # The packs copy the weight: a weight replaced or written in place since (a reload) drops them.
        source = (module.weight.data_ptr(), module.weight._version)
        if source != self.source:
            self.by_dtype.clear()
            self.source = source
        packed = self.by_dtype.get((dtype, half))
        if packed is None:
            weight: torch.Tensor = module.weight.detach()
            # torch types Linear.bias as a Tensor; bias=False makes it None
            bias: torch.Tensor | None = None if module.bias is None else module.bias.detach()  # type: ignore[redundant-expr]  # see above
            if half >= 0:
                rows = weight.shape[0] // 2
                weight = weight[half * rows : (half + 1) * rows]
                bias = None if bias is None else bias[half * rows : (half + 1) * rows]
            weight = weight.to(dtype).contiguous()
            bias = None if bias is None else bias.to(dtype).contiguous()
            packed = (torch.ops.mkldnn._reorder_linear_weight(weight, _PACK_ROWS_HINT), bias)
            self.by_dtype[(dtype, half)] = packed
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
        return torch.bfloat16 if _ONEDNN_BF16 and torch.get_autocast_dtype("cpu") == torch.bfloat16 else None
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
    weight, bias = _packs(module).get(module, dtype)  # type: ignore[arg-type]  # every caller passes a Linear
    attr, algorithm = fused or ("none", "")
    out = torch.ops.mkldnn._linear_pointwise(x.to(dtype).contiguous(), weight, bias, attr, [], algorithm)
    return out if act is None or fused is not None else act(out)


def _packs(module: nn.Module) -> _Packed:
    cache: _Packed | None = module.__dict__.get("_embedcli_packed")
    if cache is None:
        cache = module.__dict__["_embedcli_packed"] = _Packed()
    return cache


def gated_linear(module: nn.Module, x: torch.Tensor, act: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """`act(gate) * up` of a fused gate/up Linear (`[gate; up]` output rows: GeGLU, SwiGLU) on `[rows, in]`.

    On the oneDNN float32 path with an activation it fuses, each half is its own matmul, the gate's with the
    activation as a post-op, and the product is taken in place: no `[rows, 2 * inter]` output, chunk views or
    activation pass (measured on EmbeddingGemma's MLP, 2048 x 768 -> 2 x 1152: ~6% less than one fused matmul
    and the passes; oneDNN's binary `mul` post-op instead saved ~3%). The same float32 values, the
    activation's own rounding aside (~1 ulp).
    """
    fused = FUSED_ACTIVATIONS.get(act)
    if fused is None or _compute_dtype(module, x) != torch.float32:
        gate, up = linear(module, x).chunk(2, dim=-1)
        return act(gate) * up
    cache = _packs(module)
    rows = x.contiguous()
    weight, bias = cache.get(module, torch.float32, 0)  # type: ignore[arg-type]  # every caller passes a Linear
    gate = torch.ops.mkldnn._linear_pointwise(rows, weight, bias, fused[0], [], fused[1])
    weight, bias = cache.get(module, torch.float32, 1)  # type: ignore[arg-type]  # every caller passes a Linear
    return gate.mul_(torch.ops.mkldnn._linear_pointwise(rows, weight, bias, "none", [], ""))
