"""DistilBERT on the packed buffer: word + position embeddings (no token types), BERT-style post-norm layers."""

from __future__ import annotations

from typing import ClassVar

from embedcli.models.backbones.bert import BertModel
from embedcli.models.backbones.layers import JsonConfig, UnsupportedCheckpoint, check_registry

# transformers' DistilBERT hard-codes its LayerNorm eps instead of reading the config.
LAYER_NORM_EPS = 1e-12


def _as_bert(config: JsonConfig) -> JsonConfig:
    """DistilBERT's config keys under BERT's names."""
    return JsonConfig(
        **{
            **vars(config),
            "hidden_size": config.dim,
            "num_attention_heads": config.n_heads,
            "num_hidden_layers": config.n_layers,
            "intermediate_size": config.hidden_dim,
            "hidden_act": config.get("activation", "gelu"),
            "layer_norm_eps": LAYER_NORM_EPS,
        }
    )


class DistilBertModel(BertModel):
    """The DistilBERT encoder stack."""

    prefixes: ClassVar[tuple[str, ...]] = ("", "distilbert.")
    token_types: ClassVar[bool] = False

    def __init__(self, config: JsonConfig) -> None:
        # The config keeps DistilBERT's keys and gains BERT's names (hidden_size, ...), as transformers' attribute_map.
        super().__init__(_as_bert(config))

    @classmethod
    def check(cls, config: JsonConfig) -> None:
        """Refuse config values this implementation does not compute exactly (the registry entry's keys)."""
        check_registry(config)
        if config.get("dim") is None and config.get("hidden_size") is None:
            raise UnsupportedCheckpoint("no dim in config.json")

    def layer_names(self, i: int) -> dict[str, str | tuple[str, ...]]:
        """Checkpoint names of layer `i`'s tensors."""
        p = f"transformer.layer.{i}."
        return {
            "qkv": (f"{p}attention.q_lin", f"{p}attention.k_lin", f"{p}attention.v_lin"),
            "attn_out": f"{p}attention.out_lin",
            "attn_norm": f"{p}sa_layer_norm",
            "up": f"{p}ffn.lin1",
            "down": f"{p}ffn.lin2",
            "out_norm": f"{p}output_layer_norm",
        }
