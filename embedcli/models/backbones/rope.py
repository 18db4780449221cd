"""Rotary position embeddings for the RoPE encoders (`nomic_bert.py`, `gte.py`): tables and rotation.

Tables are computed in float32 (as the reference implementations build their caches) and cast to the
activations' dtype; only the first `rot_dim` channels of each head rotate (partial rotary), either as
two halves (GPT-NeoX layout) or as even/odd pairs (GPT-J, "interleaved").
"""

from __future__ import annotations

import torch


def default_inv_freq(base: float, rot_dim: int) -> torch.Tensor:
    """`1 / base^(2i / rot_dim)` in float32, as every reference computes it."""
    return 1.0 / (base ** (torch.arange(0, rot_dim, 2, dtype=torch.float32) / rot_dim))


def rope_tables(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype, *, interleaved: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """`[total, 1, rot_dim]` cos and sin at `positions`; `inv_freq` is `[rot_dim / 2]` or per token `[total, rot_dim / 2]`."""
    freqs = positions[:, None].to(torch.float32) * inv_freq.to(positions.device)
    emb = freqs.repeat_interleave(2, dim=-1) if interleaved else torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, interleaved: bool) -> torch.Tensor:
    """Rotate the first `cos.shape[-1]` channels of `[total, heads, head_dim]`; the rest pass through."""
    rot = cos.shape[-1]
    part = x[..., :rot]
    if interleaved:
        even, odd = part[..., ::2], part[..., 1::2]
        rotated = torch.stack((-odd, even), dim=-1).flatten(-2)
    else:
        half = rot // 2
        rotated = torch.cat((-part[..., half:], part[..., :half]), dim=-1)
    out = part * cos + rotated * sin
    return out if rot == x.shape[-1] else torch.cat((out, x[..., rot:]), dim=-1)
