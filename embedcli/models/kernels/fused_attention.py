"""Fused attention over the packed buffer on x86-64 CPUs (the compiled `_cpu` kernels, `native`): float32 on AVX-512
or AVX2 + FMA, bf16 on AVX-512 BF16.

Each query block of 8 rows scores its keys into a float32 buffer that stays in cache, takes the softmax there
and multiplies by the values; every sequence runs on its own, so there is no padded view, gather, key mask or
scatter. Why compiled (measured on all-MiniLM-L6-v2's shapes, 8 x 256 tokens, 12 heads of 32, one thread of an AMD
EPYC with AVX-512 BF16, see BENCHMARKS.md): torch's CPU SDPA runs MKL's sgemm, its slow path on non-Intel CPUs,
and its bf16 path is no faster than float32; the bf16 alternative, batched matmuls around torch's softmax, rounds
the scores to bf16, then spends ~0.8 ns an element in the softmax plus a gather into the padded view and copies.
On an AVX2-only AMD EPYC (Zen 3, 8 lanes; MKL is at home there), torch's path -> the kernel, 12 heads of 32, one
thread: 60 sequences of 10-40 tokens 0.45x, 16 x 128 0.84x, 8 x 256 0.93x, 4 x 512 0.91x (two threads: 0.26x,
0.65x, 0.87x, 0.86x).

Numerics: float32 in: float32 products, softmax and sums in another order than SDPA's (max |diff| ~1e-7 on
unit-scale data). bf16 in: bf16 products summed in float32, float32 scores and softmax (not bf16-rounded scores),
probabilities rounded to bf16 for the value product, bf16 out; an additive bias (MPNet) is added in float32 to
the scaled scores. Anything it does not cover (another device, query-only tokens, autograd, a CPU without
the instructions above, an odd head size, a build without the extension) is for the caller's other path: `applies` says which.
"""

from __future__ import annotations

import torch

from embedcli.models.kernels import native
from embedcli.models.kernels.pack_info import PackInfo, Window

MAX_HEAD_DIM = 1024  # the kernel's own limit (scratch per thread grows with it)


def _rows(x: torch.Tensor, heads: int, dim: int) -> bool:
    """`x` is `[total, heads, dim]` with each row's heads side by side (any row stride)."""
    return x.dim() == 3 and x.shape[1] == heads and x.shape[2] == dim and x.stride(2) == 1 and x.stride(1) == dim


def _bias_fits(bias: torch.Tensor | None, heads: int, longest: int) -> bool:
    """`bias` is None, or a float32 `[1, heads, >= longest, >= longest]` CPU tensor with contiguous rows."""
    if bias is None:
        return True
    return (
        bias.device.type == "cpu"
        and bias.dtype == torch.float32
        and bias.dim() == 4
        and bias.shape[0] == 1
        and bias.shape[1] == heads
        and min(bias.shape[2], bias.shape[3]) >= longest
        and bias.stride(3) == 1
    )


def applies(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pack: PackInfo, bias: torch.Tensor | None = None
) -> bool:
    """Whether `attention` serves these `[total, heads, dim]` q and `[total, kv_heads, dim]` k/v (and `bias`)."""
    if q.device.type != "cpu" or pack.query_only or not native.available(q.dtype) or k.dtype != q.dtype or v.dtype != q.dtype:
        return False
    if not _bias_fits(bias, q.shape[1], pack.max_len):
        return False
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return False
    heads, dim = q.shape[1], q.shape[2]
    kv_heads = k.shape[1]
    return (
        dim % 2 == 0
        and dim <= MAX_HEAD_DIM
        and heads % kv_heads == 0
        and _rows(q, heads, dim)
        and _rows(k, kv_heads, dim)
        and _rows(v, kv_heads, dim)
        and q.shape[0] == k.shape[0] == v.shape[0] == pack.total
        # bf16 keys are read in pairs: rows must start on a pair.
        and (q.dtype != torch.bfloat16 or k.stride(0) % 2 == 0)
    )


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    pack: PackInfo,
    *,
    scale: float | None = None,
    causal: bool = False,
    window: Window | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of `[total, heads, dim]` q and `[total, kv_heads, dim]` k/v within each sequence of `pack`.

    `window` (left, right): query i sees keys i - left .. i + right (and none after i when `causal`).
    `bias`: an additive float32 `[1, heads, L, L]` bias by (query, key) position within a sequence (MPNet's
    relative positions), added to the scaled scores. Returns `[total, heads, dim]`, contiguous. Call only where
    `applies(q, k, v, pack, bias)`.
    """
    total, heads, dim = q.shape
    out = q.new_empty(total, heads, dim)
    longest = pack.max_len
    left, right = window if window is not None else (longest, longest)
    if causal:
        right = 0
    starts = pack.cpu_starts if pack.cpu_starts is not None else pack.cu_seqlens.to("cpu", torch.int64)
    native.kernels().attention(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
        q.stride(0), k.stride(0), v.stride(0), out.stride(0),
        starts.data_ptr(), pack.batch, heads, k.shape[1], dim, left, right,
        dim**-0.5 if scale is None else scale, q.dtype == torch.bfloat16, torch.get_num_threads(),
        0 if bias is None else bias.data_ptr(), 0 if bias is None else bias.stride(1),
        0 if bias is None else bias.stride(2),
    )
    return out
