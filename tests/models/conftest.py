"""Model tests run single-threaded (see `torch_single_thread`); the real-model module picks its own count."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _single_thread(torch_single_thread) -> None:  # type: ignore[no-untyped-def]
    """Every test here runs with one torch thread unless it sets its own."""


@pytest.fixture(params=["fused", "torch"])
def attention_kernel(request, monkeypatch) -> str:  # type: ignore[no-untyped-def]
    """Runs an attention test on the fused CPU kernel (skipped where this build or CPU lacks it), then on the torch
    paths (padded groups, SDPA, bf16 matmuls) with the kernel off."""
    import torch

    from embedcli.models.kernels import fused_attention, native

    if request.param == "fused":
        if not native.available(torch.float32):
            pytest.skip("the fused CPU kernels are not built, or this CPU lacks AVX2 / FMA")
    else:
        monkeypatch.setattr(fused_attention, "applies", lambda *args, **kwargs: False)
    return str(request.param)


@pytest.fixture
def torch_attention(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The torch attention paths only (a test of their own routing)."""
    from embedcli.models.kernels import fused_attention

    monkeypatch.setattr(fused_attention, "applies", lambda *args, **kwargs: False)


def _kernel_isas() -> list[str]:
    """The float32 kernels' code paths this CPU can run: its own, and on an AVX-512 CPU the AVX2 code as well."""
    import torch

    from embedcli.models.kernels import native

    own = native.float32_isa() if native.available(torch.float32) else "none"
    return ["native", "avx2"] if own == "avx512" else ["native"]


@pytest.fixture(params=_kernel_isas())
def kernel_isa(request):  # type: ignore[no-untyped-def]
    """Runs a fused-kernel test on this CPU's own float32 code, and on an AVX-512 CPU again on the AVX2 code."""
    from embedcli.models.kernels import native

    used = native.use_avx2(request.param == "avx2")
    try:
        yield used
    finally:
        native.use_avx2(False)
