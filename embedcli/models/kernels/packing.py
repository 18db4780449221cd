"""Attention confined to each sequence of a packed `[total_tokens, ...]` buffer (the own backbones').

Every linear layer and norm runs on the flat buffer (no padding). On a CPU with AVX-512 the fused kernel
(`fused_attention`) attends each sequence in place; on CUDA with flash-attn installed the varlen kernel runs on
the flat buffer directly. Elsewhere (and for what those do not cover: an additive bias, query-only tokens) only
attention pads: q/k/v are gathered by one precomputed index (`pack_info`) into `[batch, heads, max_len, dim]` per
group of similar length, SDPA (or bf16 matmuls) runs with a key-padding mask, and the result is gathered back.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from embedcli.models.kernels import fused_attention

# The index maps moved to pack_info (fused_attention needs them without this module); importers keep these names.
from embedcli.models.kernels.pack_info import GROUP_LENGTH_RATIO as GROUP_LENGTH_RATIO
from embedcli.models.kernels.pack_info import PackInfo as PackInfo
from embedcli.models.kernels.pack_info import PaddedGroup as PaddedGroup
from embedcli.models.kernels.pack_info import Window as Window
from embedcli.models.kernels.pack_info import length_groups as length_groups


def mask_padding(bias: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
    """An additive bias with -inf where `key_mask` says a key is padding (`bias` itself when none is)."""
    if key_mask is None:
        return bias
    return torch.where(key_mask, bias, torch.full((), float("-inf"), dtype=bias.dtype, device=bias.device))


def padded_bias(bias: torch.Tensor, pack: PackInfo) -> torch.Tensor:
    """An additive `[1, heads, max_len, max_len]` bias with the key padding of `pack` folded in."""
    return mask_padding(bias, pack.key_mask)


def effective_window(window: Window | None, length: int, *, causal: bool) -> Window | None:
    """The reach that matters among `length` tokens (right 0 under `causal`); None when it excludes no pair."""
    if window is None:
        return None
    left, right = window
    if left < 0 or right < 0:
        raise ValueError(f"an attention window reaches >= 0 tokens each way, not {window}")
    if causal:
        right = 0
    if left >= length - 1 and (causal or right >= length - 1):
        return None
    return left, right


def window_band(window: Window | None, length: int, *, causal: bool, device: torch.device) -> torch.Tensor | None:
    """`[1, 1, length, length]`, True where key j is in query i's window (and j <= i when `causal`).

    None when the window excludes no pair of `length` tokens (then the attention runs unbanded, unchanged).
    """
    reach = effective_window(window, length, causal=causal)
    if reach is None:
        return None
    return _band(reach, length, str(device))


@functools.lru_cache(maxsize=16)
def _band(reach: Window, length: int, device: str) -> torch.Tensor:
    # Every layer of a forward (and the next forwards of similar length) asks for the same band: built once.
    left, right = reach
    pos = torch.arange(length, device=device)
    rel = pos[None, :] - pos[:, None]  # key minus query position
    return ((rel >= -left) & (rel <= right))[None, None]


def banded(mask: torch.Tensor | None, band: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
    """`mask` (None, boolean, or additive) with the keys outside `band` masked too.

    Padded query rows (where `key_mask` — here the real slots, query-only tokens included — says the slot is
    padding) keep every key: far from the real tokens their band would hold none, and a fully masked row would
    be NaN (dropped, but NaN all the same).
    """
    allowed = band if key_mask is None else band | ~key_mask.transpose(-1, -2)
    if mask is None:
        return allowed
    if mask.dtype == torch.bool:
        return mask & allowed
    return mask.masked_fill(~allowed, float("-inf"))


# A window this many times narrower than a group's length runs in query blocks (`local_attention`):
# each block scores only the keys its window can reach, not all `length` of them.
LOCAL_BLOCKS_MIN_RATIO = 2


def local_block(window: Window) -> int:
    """Query block size of `local_attention`: its key span (block + left + right) is twice the window."""
    return max(16, window[0] + window[1])


def local_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_mask: torch.Tensor | None,
    window: Window,
    *,
    scale: float | None,
) -> torch.Tensor:
    """Banded attention of padded `[batch, heads, len, dim]` q/k/v in query blocks; returns q's shape.

    Block b of `block` queries scores the `block + left + right` keys its window can reach (zeros past
    the ends, masked), so the cost grows with len x window, not len^2. The softmax of each query runs
    over exactly the keys of the dense band: the same sums, in another order. `window` is the effective
    (left, right) reach (right 0 for causal, see `effective_window`).
    """
    batch, heads, length, dim = q.shape
    left, right = window
    block = local_block(window)
    blocks = -(-length // block)
    span = block + left + right
    tail = blocks * block - length
    if k.shape[1] != heads:  # grouped-query: the key windows are copies anyway
        k, v = (t.repeat_interleave(heads // t.shape[1], dim=1) for t in (k, v))
    # [batch, heads, blocks, span, dim]: block b's keys are padded positions b*block .. b*block + span.
    kw, vw = (F.pad(t, (0, 0, left, right + tail)).unfold(2, span, block).transpose(-1, -2) for t in (k, v))
    qb = F.pad(q, (0, 0, 0, tail)).view(batch, heads, blocks, block, dim)
    valid = torch.ones(batch, length, dtype=torch.bool, device=q.device) if key_mask is None else key_mask[:, 0, 0, :]
    key_valid = F.pad(valid, (left, right + tail)).unfold(1, span, block)  # [batch, blocks, span]
    qi = torch.arange(block, device=q.device)[:, None]
    kj = torch.arange(span, device=q.device)[None, :]
    # Key kj of block b sits at b*block - left + kj, query qi at b*block + qi: within reach iff 0 <= kj - qi <= left + right.
    in_band = (kj >= qi) & (kj <= qi + left + right)  # [block, span]
    # A padded query row far past its sequence may keep no key; it is dropped (SDPA gives it zeros).
    mask = in_band & key_valid[:, :, None, :]
    # One 4-D call, [batch * blocks, heads, ...], the layout SDPA's fused CPU kernel takes.
    q4, k4, v4 = (t.transpose(1, 2).reshape(batch * blocks, heads, -1, dim) for t in (qb, kw, vw))
    out = F.scaled_dot_product_attention(q4, k4, v4, attn_mask=mask.view(batch * blocks, 1, block, span), scale=scale)
    return out.view(batch, blocks, heads, block, dim).transpose(1, 2).reshape(batch, heads, blocks * block, dim)[:, :, :length]


def _to_padded(x: torch.Tensor, pack: PackInfo) -> torch.Tensor:
    """`[total, heads, dim]` -> `[batch, heads, max_len, dim]`."""
    heads, dim = x.shape[1], x.shape[2]
    return x.index_select(0, pack.gather_index).view(pack.batch, pack.max_len, heads, dim).transpose(1, 2)


@functools.cache
def _flash_varlen():  # type: ignore[no-untyped-def]  # flash-attn ships no types; optional, CUDA only
    try:
        from flash_attn import flash_attn_varlen_func
    except Exception:
        return None
    return flash_attn_varlen_func


def flash_attn_available(device: torch.device) -> bool:
    """Whether the flash-attn varlen kernel can serve this device."""
    return device.type == "cuda" and _flash_varlen() is not None


def packed_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    pack: PackInfo,
    *,
    causal: bool,
    scale: float | None = None,
    attn_bias: torch.Tensor | None = None,
    window: Window | None = None,
) -> torch.Tensor:
    """Attention of `[total, heads, dim]` q/k/v confined to each sequence; returns `[total, heads_q, dim]`.

    `window`: each query sees only the keys within (left, right) tokens of it (see `Window`).
    """
    if attn_bias is None and fused_attention.applies(q, k, v, pack):
        return fused_attention.attention(q, k, v, pack, scale=scale, causal=causal, window=window)
    gqa = q.shape[1] != k.shape[1]
    if pack.query_only:  # only the key masks say which tokens are keys
        if attn_bias is None:
            return grouped_attention([q, k, v], lambda t: (t[0], t[1], t[2]), pack, causal=causal, scale=scale, gqa=gqa,
                                     window=window)
        attn_bias = padded_bias(attn_bias, pack)
    elif attn_bias is None and flash_attn_available(q.device) and q.dtype in (torch.float16, torch.bfloat16):
        fn = _flash_varlen()
        # flash-attn's window_size is the same inclusive (left, right) reach.
        extra = {} if window is None else {"window_size": window}
        return fn(
            q, k, v, pack.cu_seqlens, pack.cu_seqlens, pack.max_len, pack.max_len,
            softmax_scale=scale, causal=causal, **extra,
        )
    if attn_bias is not None:
        band = window_band(window, pack.max_len, causal=causal, device=q.device)
        if band is not None:
            return _banded_attention(q, k, v, pack, band, scale=scale, attn_bias=attn_bias, gqa=gqa)
    elif effective_window(window, pack.max_len, causal=causal) is not None:
        return grouped_attention(
            [q, k, v], lambda t: (t[0], t[1], t[2]), pack, causal=causal, scale=scale, gqa=gqa, window=window
        )
    if pack.batch == 1:
        qp, kp, vp = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
        out = F.scaled_dot_product_attention(
            qp, kp, vp, attn_mask=attn_bias, is_causal=causal and attn_bias is None, scale=scale, enable_gqa=gqa
        )
        return out[0].transpose(0, 1)
    if attn_bias is None:
        return grouped_attention([q, k, v], lambda t: (t[0], t[1], t[2]), pack, causal=causal, scale=scale, gqa=gqa)
    qp, kp, vp = _to_padded(q, pack), _to_padded(k, pack), _to_padded(v, pack)
    mask: torch.Tensor | None = None
    if causal:
        # Right padding: every real query row sees only real keys under the causal mask, so no
        # key-padding mask is needed; pad rows compute garbage that is never gathered back.
        mask = attn_bias
    else:
        # An additive bias from the caller already carries the key padding (see `padded_bias`).
        mask = attn_bias
    out = F.scaled_dot_product_attention(
        qp, kp, vp, attn_mask=mask, is_causal=causal and mask is None, scale=scale, enable_gqa=gqa
    )
    heads, dim = out.shape[1], out.shape[3]
    return out.transpose(1, 2).reshape(pack.batch * pack.max_len, heads, dim).index_select(0, pack.scatter_index)


def _banded_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    pack: PackInfo,
    band: torch.Tensor,
    *,
    scale: float | None,
    attn_bias: torch.Tensor,
    gqa: bool,
) -> torch.Tensor:
    """`packed_attention` with an additive bias under a window band (causality, if any, is in the band)."""
    qp, kp, vp = _to_padded(q, pack), _to_padded(k, pack), _to_padded(v, pack)
    mask = banded(attn_bias, band, pack.key_mask)
    out = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask, scale=scale, enable_gqa=gqa)
    heads, dim = out.shape[1], out.shape[3]
    return out.transpose(1, 2).reshape(pack.batch * pack.max_len, heads, dim).index_select(0, pack.scatter_index)


Split = Callable[[list[torch.Tensor]], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


# The CPU's SDPA kernel runs bf16 no faster than float32 here (its bf16 path converts blocks; measured
# 6.8 vs 6.8 ms on [8, 12, 256, 32]); two oneDNN bf16 batched matmuls around the softmax take ~4 ms.
# They run a few sequences at a time so each step's scores stay near cache size: whole-batch scores
# (tens of MB) are fresh pages on every call and cost more than the matmuls.
BF16_ATTENTION_CHUNK_SCORES = 1 << 20
# Sequences whose scores alone exceed this (long decoder inputs) keep SDPA's blockwise kernel.
BF16_ATTENTION_MAX_SCORES = 1 << 22


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    *,
    causal: bool,
    scale: float | None = None,
    gqa: bool = False,
) -> torch.Tensor:
    """Attention of padded `[batch, heads, len, dim]` q/k/v; `mask` is boolean (True = attend) or additive."""
    batch, heads, length, dim = q.shape
    per_sequence = heads * length * length
    # An additive float bias (MPNet's relative positions) would be rounded to bf16 with the scores: on 100
    # real articles MPNet's min cosine vs float32 fell 0.99994 -> 0.99989; SDPA adds it in float32.
    additive = mask is not None and mask.dtype != torch.bool
    sdpa = q.dtype != torch.bfloat16 or q.device.type != "cpu" or additive or per_sequence > BF16_ATTENTION_MAX_SCORES
    if causal and (mask is not None or not sdpa):
        # Causality folded into the mask: SDPA takes a mask or is_causal, not both; the matmuls take a mask.
        future = torch.ones(length, length, dtype=torch.bool, device=q.device).triu(1)
        if mask is None:
            mask = ~future
        else:
            mask = mask & ~future if mask.dtype == torch.bool else mask.masked_fill(future, float("-inf"))
        causal = False
    if sdpa:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=gqa)
    if k.shape[1] != heads:
        k, v = (t.repeat_interleave(heads // t.shape[1], dim=1) for t in (k, v))
    if mask is not None:  # boolean here: 0 / -inf are exact in bf16; as [batch|1, heads|1, len|1, len]
        mask = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill_(~mask, float("-inf"))
        mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
    alpha = dim**-0.5 if scale is None else scale
    out = q.new_empty(batch, heads, length, dim)
    step = max(1, BF16_ATTENTION_CHUNK_SCORES // per_sequence)
    for b0 in range(0, batch, step):
        b1 = min(batch, b0 + step)
        rows = (b1 - b0) * heads
        q3, k3, v3 = (t[b0:b1].to(q.dtype).reshape(rows, length, dim) for t in (q, k, v))
        # The mask (or nothing, beta=0) is the matmul's input: scale and mask in the one pass that writes scores.
        base, beta = q3.new_zeros(1, 1, 1), 0.0
        if mask is not None:
            part = mask[b0:b1] if mask.shape[0] == batch else mask
            base = part.expand(b1 - b0, heads, part.shape[2], length).reshape(rows, part.shape[2], length)
            beta = 1.0
        scores = torch.baddbmm(base, q3, k3.transpose(1, 2), beta=beta, alpha=alpha)
        # bf16 in, bf16 out: the kernel sums in float32 and rounds the probabilities once.
        torch.bmm(torch.softmax(scores, dim=-1), v3, out=out[b0:b1].view(rows, length, dim))
    return out


def grouped_attention(
    parts: Sequence[torch.Tensor],
    split: Split,
    pack: PackInfo,
    *,
    causal: bool,
    scale: float | None = None,
    bias: torch.Tensor | None = None,
    gqa: bool = False,
    window: Window | None = None,
) -> torch.Tensor:
    """Attention over each length group of `pack` in its own padded view; returns `[total, heads_q, dim]`.

    `parts` are `[total, n, dim]` rows (q, k, v, or one fused projection) gathered together per group;
    `split` turns their padded `[batch, n, max_len, dim]` views into q, k, v. `bias` is an additive
    `[1, heads, max_len, max_len]` bias by relative position (MPNet), cut to each group's length, the
    group's key padding folded in. Right padding needs no mask under `causal` (pad rows are dropped).
    `window` confines each query to the keys within (left, right) tokens of it: a band folded into the
    mask, or query blocks (`local_attention`) where the group is much longer than the window.
    """
    out: torch.Tensor | None = None
    for group in pack.groups:
        padded = [
            t.index_select(0, group.gather_index).view(group.batch, group.max_len, t.shape[1], t.shape[2]).transpose(1, 2)
            for t in parts
        ]
        q, k, v = split(padded)
        reach = effective_window(window, group.max_len, causal=causal)
        if reach is not None and bias is None and group.max_len >= LOCAL_BLOCKS_MIN_RATIO * (local_block(reach) + sum(reach)):
            res = local_attention(q, k, v, group.key_mask, reach, scale=scale)
        else:
            mask = None if causal else group.key_mask
            if bias is not None:
                mask = mask_padding(bias[..., : group.max_len, : group.max_len], group.key_mask)
            band = window_band(reach, group.max_len, causal=False, device=q.device)
            if band is not None:
                mask = banded(mask, band, group.slots)
            res = attend(q, k, v, mask, causal=causal, scale=scale, gqa=gqa)
        heads, dim = res.shape[1], res.shape[3]
        rows = res.transpose(1, 2).reshape(group.batch * group.max_len, heads, dim).index_select(0, group.scatter_index)
        if group.whole:
            return rows
        if out is None:
            out = rows.new_empty(pack.total, heads, dim)
        out.index_copy_(0, group.rows, rows)
    assert out is not None
    return out
