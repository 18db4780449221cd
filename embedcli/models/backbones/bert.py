"""BERT on the packed buffer (also MiniLM, BGE, E5, GTE-v1 checkpoints, which are BertModel).

Embeddings (word + token type + absolute position, LayerNorm), then post-norm layers with a fused QKV
projection; the numerics follow transformers' `BertModel` (eps, `hidden_act`) in the same op order.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from embedcli.models.backbones.layers import (
    EncoderLayer,
    JsonConfig,
    Weights,
    check_registry,
    copy_norm,
)
from embedcli.models.kernels.packing import PackInfo


class BertModel(nn.Module):
    """The BERT encoder stack (no pooler): token ids of packed sequences in, last hidden states out."""

    prefixes: ClassVar[tuple[str, ...]] = ("", "bert.")
    token_types: ClassVar[bool] = True

    def __init__(self, config: JsonConfig) -> None:
        super().__init__()
        self.check(config)
        self.config = config
        hidden = int(config.hidden_size)
        self.word_embeddings = nn.Embedding(int(config.vocab_size), hidden)
        self.position_embeddings = nn.Embedding(int(config.max_position_embeddings), hidden)
        self.token_type_embeddings = (
            nn.Embedding(int(config.get("type_vocab_size", 2)), hidden) if self.token_types else None
        )
        self.embed_norm = nn.LayerNorm(hidden, eps=float(config.get("layer_norm_eps", 1e-12)))
        self.layers = nn.ModuleList(
            EncoderLayer(
                hidden,
                int(config.num_attention_heads),
                int(config.intermediate_size),
                float(config.get("layer_norm_eps", 1e-12)),
                config.get("hidden_act", "gelu"),
            )
            for _ in range(int(config.num_hidden_layers))
        )

    @classmethod
    def check(cls, config: JsonConfig) -> None:
        """Refuse config values this implementation does not compute exactly (the registry entry's keys)."""
        check_registry(config)

    def layer_names(self, i: int) -> dict[str, str | tuple[str, ...]]:
        """Checkpoint names of layer `i`'s tensors (relative to the model prefix)."""
        p = f"encoder.layer.{i}."
        return {
            "qkv": (f"{p}attention.self.query", f"{p}attention.self.key", f"{p}attention.self.value"),
            "attn_out": f"{p}attention.output.dense",
            "attn_norm": f"{p}attention.output.LayerNorm",
            "up": f"{p}intermediate.dense",
            "down": f"{p}output.dense",
            "out_norm": f"{p}output.LayerNorm",
        }

    def load(self, state: dict[str, torch.Tensor]) -> Weights:
        """Copy the checkpoint's tensors in (fusing Q, K, V); returns the lookup, which also serves heads."""
        weights = Weights(state, self.prefixes, "embeddings.word_embeddings.weight")
        self.word_embeddings.weight.data.copy_(weights["embeddings.word_embeddings.weight"])
        self.position_embeddings.weight.data.copy_(weights["embeddings.position_embeddings.weight"])
        if self.token_type_embeddings is not None:
            self.token_type_embeddings.weight.data.copy_(weights["embeddings.token_type_embeddings.weight"])
        copy_norm(self.embed_norm, weights, "embeddings.LayerNorm")
        for i, layer in enumerate(self.layers):
            layer.load(weights, self.layer_names(i))  # type: ignore[operator]  # a ModuleList item is typed as a plain Module
        return weights

    def embed(
        self, input_ids: torch.Tensor, positions: torch.Tensor, token_type_ids: torch.Tensor | None
    ) -> torch.Tensor:
        """`[total, hidden]` input embeddings (transformers' order of additions)."""
        x = self.word_embeddings(input_ids)
        if self.token_type_embeddings is not None:
            types = torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids
            x = x + self.token_type_embeddings(types)
        x = x + self.position_embeddings(positions)
        return self.embed_norm(x)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        pack: PackInfo,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Last hidden states `[total, hidden]` of the packed sequences."""
        x = self.embed(input_ids, positions, token_type_ids)
        for layer in self.layers:
            x = layer(x, pack)
        return x
