"""The post-norm RoPE encoder layer NomicBERT and GTE ("NewModel") share, on the packed buffer.

x = norm1(x + out(attention(rope(q), rope(k), v))), then x = norm2(x + down(act(gate) * up)): a fused
QKV projection, rotary q/k, bidirectional attention confined to each sequence, a gated MLP whose fused
projection holds the up half first and the gate half second (both checkpoints' order).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from embedcli.models.backbones.layers import add_norm
from embedcli.models.backbones.rope import apply_rope
from embedcli.models.kernels.gemm import linear
from embedcli.models.kernels.packing import PackInfo, packed_attention


class RopeEncoderLayer(nn.Module):
    """One post-norm layer: rotary self-attention, then a gated MLP, each followed by residual + norm."""

    def __init__(
        self,
        hidden: int,
        heads: int,
        intermediate: int,
        *,
        qkv_bias: bool,
        out_bias: bool,
        up_bias: bool,
        down_bias: bool,
        act: Callable[[torch.Tensor], torch.Tensor],
        norm: Callable[[int], nn.Module],
        interleaved: bool = False,
    ) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.scale = self.head_dim**-0.5
        self.interleaved = interleaved
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=qkv_bias)
        self.attn_out = nn.Linear(hidden, hidden, bias=out_bias)
        self.attn_norm = norm(hidden)
        self.gate_up = nn.Linear(hidden, 2 * intermediate, bias=up_bias)
        self.down = nn.Linear(intermediate, hidden, bias=down_bias)
        self.mlp_norm = norm(hidden)
        self.act = act

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        pack: PackInfo,
        q_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """`q_scale`: a per-token `[total, 1, 1]` factor on the rotated queries (GTE's log-n scaling)."""
        total = x.shape[0]
        q, k, v = linear(self.qkv, x).view(total, 3 * self.heads, self.head_dim).split(self.heads, dim=1)
        q = apply_rope(q, cos, sin, interleaved=self.interleaved)
        k = apply_rope(k, cos, sin, interleaved=self.interleaved)
        if q_scale is not None:
            q = q * q_scale
        context = packed_attention(q, k, v, pack, causal=False, scale=self.scale)
        x, x_in = add_norm(linear(self.attn_out, context.reshape(total, self.heads * self.head_dim)), x, self.attn_norm)
        up, gate = linear(self.gate_up, x_in).chunk(2, dim=-1)
        return add_norm(linear(self.down, self.act(gate) * up), x, self.mlp_norm)[0]
