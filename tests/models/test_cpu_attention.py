"""Per-sequence oneDNN attention (`cpu_attention`, Gemma3's float32 CPU path) against a float64 reference."""

from __future__ import annotations

import pytest
import torch

from embedcli.models.kernels import cpu_attention
from embedcli.models.kernels.packing import PackInfo
from tests.models.test_window_mask import _reference

pytestmark = pytest.mark.skipif(not cpu_attention.applies(torch.zeros(1)), reason="torch without oneDNN")

LENGTHS = [[11], [1, 13, 4], [20, 2, 17, 9], [70, 3, 66, 45]]
# None: every key (a full layer); the rest (left, right) reaches.
WINDOWS = [None, (0, 0), (2, 3), (4, 0), (5, 5)]


def _qkv(total: int, heads: int, kv_heads: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(total, h, 8, generator=gen) for h in (heads, kv_heads, kv_heads))
    return q, k, v


# 4: sequences longer than the block and its reach run in query blocks, each scoring only the keys in reach.
@pytest.mark.parametrize("block", [4, cpu_attention.QUERY_BLOCK])
@pytest.mark.parametrize(("heads", "kv_heads"), [(3, 1), (4, 2), (2, 2)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("lengths", LENGTHS)
def test_sequence_attention_matches_float64(
    lengths: list[int], window: tuple[int, int] | None, causal: bool, heads: int, kv_heads: int, block: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cpu_attention, "QUERY_BLOCK", block)
    q, k, v = _qkv(sum(lengths), heads, kv_heads)
    with torch.inference_mode():
        got = cpu_attention.sequence_attention(q, k, v, PackInfo.build(lengths), scale=0.3, causal=causal, window=window)
    reach = window or (max(lengths), max(lengths))
    want = _reference(q, k, v, lengths, causal=causal, window=reach, scale=0.3)
    assert got.shape == q.shape
    assert (got.double() - want).abs().max().item() <= 1e-5


def test_sequence_attention_serves_float32_cpu_inference_only() -> None:
    x = torch.zeros(4, 2, 8)
    assert cpu_attention.applies(x)
    assert not cpu_attention.applies(x.bfloat16())
    assert not cpu_attention.applies(x.requires_grad_())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not cpu_attention.applies(torch.zeros(4, 2, 8))
