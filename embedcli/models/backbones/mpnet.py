"""MPNet on the packed buffer: BERT-style post-norm layers plus a relative position bias shared by all layers.

The bias depends only on relative positions, so one `[1, heads, max_len, max_len]` table (bucketed as
transformers' `MPNetEncoder.compute_position_bias`, which always uses 32 buckets and distance 128)
serves every sequence of a pack; the key padding is folded into it.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import nn

from embedcli.models.backbones.bert import BertModel
from embedcli.models.backbones.layers import JsonConfig, Weights
from embedcli.models.kernels.packing import PackInfo

NUM_BUCKETS = 32
MAX_DISTANCE = 128


def relative_position_bucket(relative_position: torch.Tensor) -> torch.Tensor:
    """T5-style buckets of `memory - context` positions, as transformers' MPNet computes them."""
    num_buckets = NUM_BUCKETS // 2
    n = -relative_position
    ret = (n < 0).to(torch.long) * num_buckets
    n = torch.abs(n)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    val_if_large = max_exact + (
        torch.log(n.float() / max_exact) / math.log(MAX_DISTANCE / max_exact) * (num_buckets - max_exact)
    ).to(torch.long)
    val_if_large = torch.min(val_if_large, torch.full_like(val_if_large, num_buckets - 1))
    return ret + torch.where(is_small, n, val_if_large)


class MPNetModel(BertModel):
    """The MPNet encoder stack (no pooler)."""

    prefixes: ClassVar[tuple[str, ...]] = ("", "mpnet.")
    token_types: ClassVar[bool] = False

    def __init__(self, config: JsonConfig) -> None:
        super().__init__(config)
        self.relative_attention_bias = nn.Embedding(
            int(config.get("relative_attention_num_buckets", NUM_BUCKETS)), int(config.num_attention_heads)
        )

    def layer_names(self, i: int) -> dict[str, str | tuple[str, ...]]:
        """Checkpoint names of layer `i`'s tensors."""
        p = f"encoder.layer.{i}."
        return {
            "qkv": (f"{p}attention.attn.q", f"{p}attention.attn.k", f"{p}attention.attn.v"),
            "attn_out": f"{p}attention.attn.o",
            "attn_norm": f"{p}attention.LayerNorm",
            "up": f"{p}intermediate.dense",
            "down": f"{p}output.dense",
            "out_norm": f"{p}output.LayerNorm",
        }

    def load(self, state: dict[str, torch.Tensor]) -> Weights:
        """BERT's tensors plus the relative attention bias table."""
        weights = super().load(state)
        self.relative_attention_bias.weight.data.copy_(weights["encoder.relative_attention_bias.weight"])
        return weights

    def position_bias(self, length: int, dtype: torch.dtype) -> torch.Tensor:
        """`[1, heads, length, length]` additive bias of sequences up to `length` tokens."""
        device = self.relative_attention_bias.weight.device
        positions = torch.arange(length, dtype=torch.long, device=device)
        buckets = relative_position_bucket(positions[None, :] - positions[:, None])
        # Contiguous rows: the fused CPU attention reads them in place (SDPA takes either).
        return self.relative_attention_bias(buckets).permute(2, 0, 1).unsqueeze(0).to(dtype).contiguous()

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        pack: PackInfo,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Last hidden states `[total, hidden]` of the packed sequences."""
        x = self.embed(input_ids, positions, None)
        bias = self.position_bias(pack.max_len, x.dtype)  # key padding folded in per group (varlen_attention)
        for layer in self.layers:
            x = layer(x, pack, bias)
        return x
