"""Qwen3 on the packed buffer: Llama's layers plus a per-head RMSNorm on queries and keys before RoPE."""

from __future__ import annotations

from typing import ClassVar

from embedcli.models.backbones.llama import LlamaModel


class Qwen3Model(LlamaModel):
    """The Qwen3 decoder stack (q/k norm; biases per `attention_bias`)."""

    qk_norm: ClassVar[bool] = True
