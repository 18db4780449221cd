"""The fused residual add + LayerNorm (`fused_norm`, compiled `_cpu`) against float64 and torch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from embedcli.models.backbones.layers import add_norm
from embedcli.models.kernels import fused_norm, native

pytestmark = [
    pytest.mark.skipif(
        not native.available(torch.float32), reason="the fused CPU kernels are not built, or this CPU lacks AVX2 / FMA"
    ),
    pytest.mark.usefixtures("kernel_isa"),  # this CPU's own float32 code, and on AVX-512 the AVX2 code too
]
needs_bf16 = pytest.mark.skipif(not native.available(torch.bfloat16), reason="this CPU lacks AVX-512 BF16")


def _case(rows: int, hidden: int, bias: bool = True, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, nn.LayerNorm]:
    gen = torch.Generator().manual_seed(seed)
    norm = nn.LayerNorm(hidden, eps=1e-12, bias=bias).requires_grad_(False)
    norm.weight.copy_(torch.rand(hidden, generator=gen) + 0.5)
    if bias:
        norm.bias.copy_(torch.rand(hidden, generator=gen) - 0.5)
    return torch.randn(rows, hidden, generator=gen), torch.randn(rows, hidden, generator=gen) * 3, norm


def _want(h: torch.Tensor, x: torch.Tensor, norm: nn.LayerNorm) -> torch.Tensor:
    bias = None if norm.bias is None else norm.bias.double()
    return F.layer_norm(h.double() + x.double(), norm.normalized_shape, norm.weight.double(), bias, norm.eps)


# 384: MiniLM; 50 and 17: rows that end inside a 16-lane step; 100 rows: several blocks of rows per thread.
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(("rows", "hidden"), [(100, 384), (7, 50), (3, 17), (0, 384)])
def test_float32_matches_float64_like_torch(rows: int, hidden: int, bias: bool) -> None:
    h, x, norm = _case(rows, hidden, bias)
    assert fused_norm.applies(h, x, norm)
    out, low = fused_norm.add_layer_norm(h, x, norm)
    assert low is out and out.dtype == torch.float32 and out.shape == x.shape
    want = _want(h, x, norm)
    worst = lambda t: float((t.double() - want).abs().max()) if rows else 0.0  # noqa: E731
    assert worst(out) <= max(2e-6, 2 * worst(norm(h + x)))


@needs_bf16
def test_bf16_autocast_adds_bf16_to_float32_and_returns_the_linear_input() -> None:
    h, x, norm = _case(64, 384)
    hb = h.bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert fused_norm.applies(hb, x, norm)
        out, low = fused_norm.add_layer_norm(hb, x, norm)
        reference = norm(hb + x)  # what the unfused layer computes: float32 sum and norm
    assert out.dtype == torch.float32 and low.dtype == torch.bfloat16
    assert torch.equal(low, out.to(torch.bfloat16))  # round to nearest even, as .to() does
    assert (out.double() - _want(hb.float(), x, norm)).abs().max().item() <= 2e-6
    assert (out - reference).abs().max().item() <= 2e-6


def test_add_norm_falls_back_to_torch_where_the_kernel_does_not_serve() -> None:
    h, x, norm = _case(5, 32)
    rms = nn.RMSNorm(32, eps=1e-6)
    assert not fused_norm.applies(h, x, rms)
    out, low = add_norm(h, x, rms)
    assert low is out and torch.equal(out, rms(h + x))
    with torch.enable_grad():
        assert not fused_norm.applies(h.clone().requires_grad_(), x, norm)
    assert not fused_norm.applies(h.double(), x, norm)
    assert not fused_norm.applies(h[:4], x, norm)  # shapes differ
    assert not fused_norm.applies(h[None], x[None], norm)  # rows only, as the packed buffer is
    assert not fused_norm.applies(h.t(), x.t(), nn.LayerNorm(5))  # columns not contiguous


def test_threads_give_the_same_bits() -> None:
    h, x, norm = _case(300, 384)
    before = torch.get_num_threads()
    try:
        outs = []
        for threads in (1, 2, 4):
            torch.set_num_threads(threads)
            outs.append(fused_norm.add_layer_norm(h, x, norm)[0])
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(outs[0], o) for o in outs[1:])
