"""The fused CPU attention kernel (`fused_attention`, compiled `_cpu`) against a float64 per-sequence reference."""

from __future__ import annotations

import os
import random
import threading

import pytest
import torch

from embedcli.models.backbones.layers import varlen_attention
from embedcli.models.kernels import fused_attention, native, packing
from embedcli.models.kernels.packing import PackInfo, grouped_attention

pytestmark = [
    pytest.mark.skipif(
        not native.available(torch.float32), reason="the fused CPU kernels are not built, or this CPU lacks AVX2 / FMA"
    ),
    pytest.mark.usefixtures("kernel_isa"),  # this CPU's own float32 code, and on AVX-512 the AVX2 code too
]
needs_bf16 = pytest.mark.skipif(not native.available(torch.bfloat16), reason="this CPU lacks AVX-512 BF16")

# 300 and 600: longer than a task's 256 query rows; 1: a lone token; the rest: tails of 16-key tiles and 8-row blocks.
LENGTHS = [[1], [5, 3], [17, 40, 1, 33], [300, 7], [600]]
# (heads, kv_heads, head_dim): MiniLM's, grouped queries, Gemma-like one key head, head sizes off the 16-lane tiles.
SHAPES = [(12, 12, 32), (4, 2, 8), (3, 1, 64), (2, 2, 18), (2, 2, 80)]
REACH = [(None, False), ((5, 3), False), (None, True), ((4, 0), False), ((0, 0), False)]


def _reference(q, k, v, lengths, *, causal, window, scale, bias=None):  # type: ignore[no-untyped-def]
    """Each sequence alone in float64: query i attends keys j with i - left <= j <= i + right (and j <= i if causal);
    `bias[0, h, i, j]` is added to the scaled scores (MPNet)."""
    left, right = window
    outs, start = [], 0
    groups = q.shape[1] // k.shape[1]
    for n in lengths:
        qs, ks, vs = (t[start : start + n].double().transpose(0, 1) for t in (q, k, v))
        ks, vs = ks.repeat_interleave(groups, 0), vs.repeat_interleave(groups, 0)
        rel = torch.arange(n)[None, :] - torch.arange(n)[:, None]  # key minus query position
        allowed = (rel >= -left) & (rel <= (0 if causal else right))
        scores = qs @ ks.transpose(1, 2) * scale
        if bias is not None:
            scores = scores + bias[0, :, :n, :n].double()
        scores = scores.masked_fill(~allowed, float("-inf"))
        outs.append((scores.softmax(-1) @ vs).transpose(0, 1))
        start += n
    return torch.cat(outs)


def _fused(total: int, heads: int, kv_heads: int, dim: int, seed: int = 0) -> torch.Tensor:
    """A fused `[total, heads + 2 kv_heads, dim]` projection (q, k, v are views into it, as in the backbones)."""
    return torch.randn(total, heads + 2 * kv_heads, dim, generator=torch.Generator().manual_seed(seed))


def _split(fused: torch.Tensor, heads: int, kv_heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return fused[:, :heads], fused[:, heads : heads + kv_heads], fused[:, heads + kv_heads :]


@pytest.mark.parametrize(("window", "causal"), REACH)
@pytest.mark.parametrize(("heads", "kv_heads", "dim"), SHAPES)
@pytest.mark.parametrize("lengths", LENGTHS)
def test_float32_matches_float64(lengths, heads, kv_heads, dim, window, causal) -> None:  # type: ignore[no-untyped-def]
    q, k, v = _split(_fused(sum(lengths), heads, kv_heads, dim), heads, kv_heads)
    pack = PackInfo.build(lengths)
    assert fused_attention.applies(q, k, v, pack)
    got = fused_attention.attention(q, k, v, pack, scale=0.3, causal=causal, window=window)
    reach = window or (max(lengths), max(lengths))
    want = _reference(q, k, v, lengths, causal=causal, window=reach, scale=0.3)
    assert got.shape == q.shape and got.dtype == torch.float32
    assert (got.double() - want).abs().max().item() <= 1e-5


@needs_bf16
@pytest.mark.parametrize(("window", "causal"), [(None, False), ((5, 3), False), (None, True)])
@pytest.mark.parametrize(("heads", "kv_heads", "dim"), SHAPES)
@pytest.mark.parametrize("lengths", LENGTHS)
def test_bf16_matches_float64_within_bf16_rounding(lengths, heads, kv_heads, dim, window, causal) -> None:  # type: ignore[no-untyped-def]
    q, k, v = _split(_fused(sum(lengths), heads, kv_heads, dim).bfloat16(), heads, kv_heads)
    pack = PackInfo.build(lengths)
    assert fused_attention.applies(q, k, v, pack)
    got = fused_attention.attention(q, k, v, pack, scale=0.3, causal=causal, window=window)
    reach = window or (max(lengths), max(lengths))
    want = _reference(q, k, v, lengths, causal=causal, window=reach, scale=0.3)
    assert got.dtype == torch.bfloat16
    # float32 scores and softmax; the probabilities and the output are rounded to bf16 (2^-9 relative): outputs of
    # size ~1 stay within a couple of bf16 steps.
    err = (got.double() - want).abs()
    assert (err <= 2**-7 * want.abs() + 4e-3).all(), err.max().item()


@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=needs_bf16)])
@pytest.mark.parametrize("lengths", [[1], [17, 40, 1, 33], [300, 7]])
def test_additive_bias_is_added_to_the_scaled_scores(lengths: list[int], dtype: torch.dtype) -> None:
    """MPNet's relative-position bias: one float32 `[1, heads, L, L]` for every sequence, wider than the longest."""
    heads = 4
    q, k, v = _split(_fused(sum(lengths), heads, heads, 16, seed=5).to(dtype), heads, heads)
    pack = PackInfo.build(lengths)
    bias = torch.randn(1, heads, max(lengths) + 3, max(lengths) + 3, generator=torch.Generator().manual_seed(6)) * 2
    assert fused_attention.applies(q, k, v, pack, bias)
    got = fused_attention.attention(q, k, v, pack, scale=0.3, bias=bias)
    want = _reference(q, k, v, lengths, causal=False, window=(max(lengths),) * 2, scale=0.3, bias=bias)
    err = (got.double() - want).abs()
    if dtype == torch.float32:
        assert err.max().item() <= 1e-5
    else:
        assert (err <= 2**-7 * want.abs() + 4e-3).all(), err.max().item()
    # A bias the kernel cannot read as rows of float32, or one narrower than the longest sequence: the torch paths.
    assert not fused_attention.applies(q, k, v, pack, bias.transpose(2, 3))
    assert not fused_attention.applies(q, k, v, pack, bias.double())
    assert not fused_attention.applies(q, k, v, pack, bias[..., :1, :1]) or max(lengths) == 1


@needs_bf16
def test_bf16_is_closer_to_float64_than_the_matmul_path() -> None:
    """What the kernel replaced rounded the scores to bf16 before the softmax: the kernel keeps them in float32."""
    heads, lengths = 12, [256, 256, 100]
    fused = (_fused(sum(lengths), heads, heads, 32, seed=3) * 1.5).bfloat16()
    q, k, v = _split(fused, heads, heads)
    pack = PackInfo.build(lengths)
    got = fused_attention.attention(q, k, v, pack)
    old = grouped_attention([fused], lambda t: t[0].split([heads, heads, heads], dim=1), pack, causal=False)
    want = _reference(q, k, v, lengths, causal=False, window=(256, 256), scale=32**-0.5)
    assert (got.double() - want).abs().max() < (old.double() - want).abs().max()


@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=needs_bf16)])
def test_threads_give_the_same_bits(dtype: torch.dtype) -> None:
    """Every output row is computed by one task, whichever thread takes it: the thread count changes no bit."""
    lengths = [300, 40, 7, 256, 1]
    q, k, v = _split(_fused(sum(lengths), 4, 2, 32).to(dtype), 4, 2)
    pack = PackInfo.build(lengths)
    before = torch.get_num_threads()
    try:
        outs = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            outs.append(fused_attention.attention(q, k, v, pack, window=(9, 4)))
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(outs[0], o) for o in outs[1:])


def test_pool_survives_changing_threads_concurrent_callers_and_fork() -> None:
    """The kernel's worker pool: rounds with 1-8 threads, four Python threads calling at once, a forked child."""
    lengths = [5, 17, 3, 40, 1, 9]
    q, k, v = _split(_fused(sum(lengths), 4, 4, 8), 4, 4)
    pack = PackInfo.build(lengths)
    want = fused_attention.attention(q, k, v, pack)
    before = torch.get_num_threads()
    failures: list[int] = []

    def hammer(rounds: int, seed: int) -> None:
        pick = random.Random(seed)
        for _ in range(rounds):
            torch.set_num_threads(pick.choice([1, 2, 3, 4, 8]))
            if not torch.equal(fused_attention.attention(q, k, v, pack), want):
                failures.append(seed)

    try:
        hammer(400, 0)
        callers = [threading.Thread(target=hammer, args=(200, seed)) for seed in range(1, 5)]
        for t in callers:
            t.start()
        for t in callers:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in callers), "a caller is stuck in the pool"
        pid = os.fork()
        if pid == 0:  # the child has none of the parent's workers: the pool starts afresh
            hammer(50, 9)
            os._exit(1 if failures else 0)
        _, status = os.waitpid(pid, 0)
        assert status == 0
    finally:
        torch.set_num_threads(before)
    assert not failures


def test_backbone_paths_take_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """`varlen_attention` (BERT family, ModernBERT) and `packed_attention` (rope encoders, decoders) route here."""
    calls: list[int] = []
    real = fused_attention.attention
    monkeypatch.setattr(fused_attention, "attention", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    lengths = [9, 3, 12]
    pack = PackInfo.build(lengths)
    fused = _fused(sum(lengths), 4, 4, 8)
    varlen_attention(fused.view(sum(lengths), -1), pack, 4, 8)
    packing.packed_attention(*_split(fused, 4, 4), pack, causal=True)
    assert len(calls) == 2


def test_what_the_kernel_does_not_serve() -> None:
    lengths = [6, 4]
    pack = PackInfo.build(lengths)
    q, k, v = _split(_fused(10, 4, 2, 8), 4, 2)
    assert fused_attention.applies(q, k, v, pack)
    assert not fused_attention.applies(q.double(), k.double(), v.double(), pack)
    assert not fused_attention.applies(q, k.bfloat16(), v, pack)  # mixed dtypes
    odd = _fused(10, 2, 2, 7)
    assert not fused_attention.applies(*_split(odd, 2, 2), pack)  # bf16 pairs need an even head size
    assert not fused_attention.applies(q, k, v, PackInfo.build([4, 4]))  # another pack's token count
    only_queries = PackInfo.build(lengths, keys=torch.tensor([True] * 8 + [False] * 2))
    assert not fused_attention.applies(q, k, v, only_queries)  # key flags: the torch paths' masks carry them
    with torch.enable_grad():
        assert not fused_attention.applies(q.clone().requires_grad_(), k, v, pack)
    transposed = torch.randn(8, 10, 4).transpose(0, 2)  # heads not side by side in a row
    assert not fused_attention.applies(transposed, transposed, transposed, pack)
