"""float32 attention on the CPU, one sequence of the packed buffer at a time, through oneDNN matmuls.

Why not SDPA: its CPU kernel runs its blocks through MKL's sgemm, the slow path on non-Intel CPUs (see
`gemm.py`); on EmbeddingGemma's shapes (3 query heads on 1 key head, head_dim 256, 300-1,100 tokens) two
oneDNN matmuls around a plain softmax take ~40% less time. Running each sequence in its own buffer also
drops the padded views (gather, key mask, scatter), and a sliding window scores only the keys its query
block can reach instead of the whole `length x length` band.

The grouped query heads of one key head are stacked as rows (`[tokens * group, dim]`, token-major, the
layout of the projection's output), so both matmuls run once per key head and the output rows land in
the layout `o_proj` reads. Numerics: the same float32 dot products and softmax in another order than
SDPA's (max |Δ| ~1e-6 on unit-scale inputs).
"""

from __future__ import annotations

import functools

import torch

from embedcli.models.kernels.gemm import onednn_available
from embedcli.models.kernels.packing import PackInfo, Window

_ONEDNN = onednn_available()
# Query rows per block: scores stay `block * group x keys` (~2.4 MB at 3 heads, 768 keys: near L2 size).
QUERY_BLOCK = 256


def applies(q: torch.Tensor) -> bool:
    """Whether `sequence_attention` serves these queries (float32 CPU inference with oneDNN)."""
    return (
        _ONEDNN
        and q.device.type == "cpu"
        and q.dtype == torch.float32
        and not torch.is_autocast_enabled("cpu")
        and not (torch.is_grad_enabled() and q.requires_grad)
    )


@functools.lru_cache(maxsize=64)
def _mask_bias(rows: int, first_query: int, keys: int, left: int, right: int) -> torch.Tensor | None:
    """`[rows, 1, keys]` float32, -inf where key `j` (0-based in the block's key range) is out of query `i`'s
    reach, query `i` sitting at key position `first_query + i`, else 0; None when every key is in reach.

    Added to the scores (0 and -inf are exact): ~3x cheaper than a broadcast `masked_fill_` here."""
    rel = torch.arange(keys)[None, :] - (first_query + torch.arange(rows))[:, None]  # key minus query position
    outside = (rel < -left) | (rel > right)
    if not bool(outside.any()):
        return None
    return torch.zeros(rows, 1, keys).masked_fill_(outside[:, None, :], float("-inf"))


def _matmul(a: torch.Tensor, b_t: torch.Tensor) -> torch.Tensor:
    """`a @ b_t.T` through oneDNN (`b_t` is `[n, k]`, the Linear weight layout)."""
    return torch.ops.mkldnn._linear_pointwise(a, b_t, None, "none", [], "")


def sequence_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    pack: PackInfo,
    *,
    scale: float,
    causal: bool,
    window: Window | None,
) -> torch.Tensor:
    """Attention of `[total, heads, dim]` q and `[total, kv_heads, dim]` k/v within each sequence of `pack`.

    `window` (left, right): query i sees keys i - left .. i + right (and none after i when `causal`).
    Returns `[total, heads, dim]`. Call only where `applies(q)`.
    """
    total, heads, dim = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    out = q.new_empty(total, heads, dim)
    # The queries head-grouped per key head: [total, kv_heads, group, dim].
    qs = q.view(total, kv_heads, group, dim)
    bounds = pack.cu_seqlens.tolist()
    for s in range(pack.batch):
        r0, r1 = int(bounds[s]), int(bounds[s + 1])
        length = r1 - r0
        left = length if window is None else window[0]
        right = 0 if causal else (length if window is None else window[1])
        # One block when the window hides little of the sequence (blocks would score as many keys).
        block = length if length <= QUERY_BLOCK + left + right else QUERY_BLOCK
        for h in range(kv_heads):
            keys = k[r0:r1, h].contiguous()  # [length, dim]
            values_t = v[r0:r1, h].t().contiguous()  # [dim, length]
            rows = qs[r0:r1, h].reshape(length * group, dim).contiguous()  # a view when q is
            dest = out[r0:r1, h * group : (h + 1) * group]
            for lo in range(0, length, block):
                hi = min(length, lo + block)
                first, last = max(0, lo - left), min(length, hi + right)
                scores = _matmul(rows[lo * group : hi * group], keys[first:last]).view(hi - lo, group, last - first)
                bias = _mask_bias(hi - lo, lo - first, last - first, left, right)
                # Scaled after the product, as transformers' eager attention does.
                scores.mul_(scale)
                if bias is not None:
                    scores.add_(bias)
                probs = torch.softmax(scores, dim=-1).view((hi - lo) * group, last - first)
                # oneDNN takes a strided weight through a slow reorder (~100x): a slice of the values is copied.
                part = values_t[:, first:last].contiguous() if first > 0 or last < length else values_t
                dest[lo:hi] = _matmul(probs, part).view(hi - lo, group, dim)
    return out
