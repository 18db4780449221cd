"""Qwen2 on the packed buffer: Llama's layers with biases on the q/k/v projections (none on the output)."""

from __future__ import annotations

from embedcli.models.backbones.layers import JsonConfig
from embedcli.models.backbones.llama import LlamaModel


class Qwen2Model(LlamaModel):
    """The Qwen2 decoder stack."""

    @classmethod
    def attention_biases(cls, config: JsonConfig) -> tuple[bool, bool]:
        """Qwen2 always has q/k/v biases and an unbiased output projection."""
        return True, False
