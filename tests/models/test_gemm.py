"""The own backbones' CPU linear (oneDNN, prepacked), against float64 references and its fallbacks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from embedcli.models.kernels import gemm
from embedcli.models.kernels.gemm import gated_linear, gelu_tanh, linear

pytestmark = pytest.mark.skipif(not gemm.onednn_available(), reason="torch built without oneDNN")


def _layer(rows_in: int, rows_out: int, bias: bool = True, seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    layer = nn.Linear(rows_in, rows_out, bias=bias).requires_grad_(False)
    return layer


def _ref(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """x @ W^T + b in float64, written out."""
    out = x.double() @ layer.weight.double().T
    return out if layer.bias is None else out + layer.bias.double()


def _erf_gelu64(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1 + torch.erf(x / 2**0.5))


def _tanh_gelu64(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (x + 0.044715 * x**3)))


@pytest.mark.parametrize("rows", [1, 7, 300])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(
    "act, ref_act",
    [(None, lambda x: x), (F.gelu, _erf_gelu64), (gelu_tanh, _tanh_gelu64), (F.relu, lambda x: x.clamp_min(0)),
     (torch.tanh, torch.tanh)],
)
def test_float32_linear_matches_float64(rows: int, bias: bool, act, ref_act) -> None:  # type: ignore[no-untyped-def]
    layer = _layer(64, 96, bias)
    x = torch.randn(rows, 64)
    got = linear(layer, x, act)
    assert got.dtype == torch.float32 and got.shape == (rows, 96)
    torch.testing.assert_close(got.double(), ref_act(_ref(layer, x)), atol=2e-5, rtol=1e-5)


def test_bf16_autocast_is_autocasts_own_linear() -> None:
    layer = _layer(64, 96)
    x = torch.randn(50, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, want = linear(layer, x), layer(x)
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_packs_follow_the_weight() -> None:
    """A weight written in place after the first call (a reload) is repacked, not served stale."""
    layer = _layer(16, 8)
    x = torch.randn(5, 16)
    linear(layer, x)
    layer.weight.mul_(2)
    torch.testing.assert_close(linear(layer, x).double(), _ref(layer, x), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "case",
    ["empty", "grad", "quantized", "float64", "3d"],
)
def test_other_inputs_take_the_module_call(case: str) -> None:
    layer = _layer(16, 8)
    x = torch.randn(4, 16)
    module: nn.Module = layer
    if case == "empty":
        x = x[:0]
    elif case == "grad":
        layer.requires_grad_(True)
    elif case == "quantized":
        module = torch.ao.quantization.quantize_dynamic(nn.Sequential(layer), {nn.Linear}, dtype=torch.qint8)[0]
    elif case == "float64":
        module, x = layer.double(), x.double()
    elif case == "3d":
        x = x[None]
    got = linear(module, x, F.gelu)
    assert "_embedcli_packed" not in module.__dict__
    torch.testing.assert_close(got, F.gelu(module(x)))


@pytest.mark.parametrize("rows", [1, 7, 300])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(
    "act, ref_act",
    [(gelu_tanh, _tanh_gelu64), (F.gelu, _erf_gelu64), (F.relu, lambda x: x.clamp_min(0)), (F.silu, F.silu)],
)
def test_gated_linear_matches_float64(rows: int, bias: bool, act, ref_act) -> None:  # type: ignore[no-untyped-def]
    """`act(gate) * up` of a fused `[gate; up]` Linear: oneDNN post-ops where it fuses `act`, the plain call else."""
    layer = _layer(64, 2 * 48, bias)
    x = torch.randn(rows, 64)
    gate, up = _ref(layer, x).chunk(2, dim=-1)
    got = gated_linear(layer, x, act)
    assert got.dtype == torch.float32 and got.shape == (rows, 48)
    torch.testing.assert_close(got.double(), ref_act(gate) * up, atol=2e-5, rtol=1e-5)


def test_gated_linear_under_autocast_and_grad_is_the_chunked_product() -> None:
    layer = _layer(64, 96)
    x = torch.randn(20, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        gate, up = linear(layer, x).chunk(2, dim=-1)
        torch.testing.assert_close(gated_linear(layer, x, gelu_tanh), gelu_tanh(gate) * up, atol=0, rtol=0)
    layer.requires_grad_(True)
    gate, up = layer(x).chunk(2, dim=-1)
    torch.testing.assert_close(gated_linear(layer, x, gelu_tanh), gelu_tanh(gate) * up, atol=0, rtol=0)


def test_bf16_without_onednn_bf16_kernels_takes_the_module_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a CPU whose oneDNN has no bf16 kernels (AVX2 only) autocast's own linear runs, never oneDNN's raise."""
    monkeypatch.setattr(gemm, "_ONEDNN_BF16", False)
    layer = _layer(64, 48)
    x = torch.randn(9, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert gemm._compute_dtype(layer, x) is None
        got = linear(layer, x, F.gelu)
        want = F.gelu(layer(x))
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, want, rtol=0, atol=0)
