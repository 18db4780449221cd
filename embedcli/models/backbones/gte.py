"""GTE v1.5 / multilingual ("NewModel", model_type `new`) on the packed buffer, without remote code.

Numerics of Alibaba-NLP/new-impl `modeling.py`: word (+ token type) embeddings and LayerNorm, then
post-norm layers with rotary attention (`qkv_proj` or q/k/v, `o_proj`, biased), a gated MLP
(`up_gate_proj`: up half then gate half, no bias; `down_proj` biased) and LayerNorm or RMSNorm.
RoPE is plain or NTK-scaled (`rope_scaling` type `ntk`, fixed or mixed), and the queries may carry
the log-n attention scale, which depends only on each sequence's own length.
"""

from __future__ import annotations

from typing import ClassVar, cast

import torch
from torch import nn

from embedcli.models.backbones.layers import (
    JsonConfig,
    UnsupportedCheckpoint,
    Weights,
    activation,
    check_registry,
    copy_linear,
    copy_norm,
)
from embedcli.models.backbones.llama import RMSNorm
from embedcli.models.backbones.rope import default_inv_freq, rope_tables
from embedcli.models.backbones.rope_encoder import RopeEncoderLayer
from embedcli.models.kernels.packing import PackInfo


def ntk_inv_freq(config: JsonConfig, head_dim: int) -> torch.Tensor:
    """RoPE inverse frequencies of `config` as new-impl's (NTKScaling)RotaryEmbedding leaves them (float32)."""
    base = float(config.get("rope_theta", 10000.0))
    scaling = config.get("rope_scaling")
    if scaling is None:
        return default_inv_freq(base, head_dim)
    factor, mixed_b = float(scaling["factor"]), scaling.get("mixed_b")
    # Its cache is built for factor x max_position_embeddings positions at load, so the scaled
    # frequencies hold for every length (the check refuses factor <= 1, where they would not).
    inv_freq = default_inv_freq(base * (factor if mixed_b is None else 1.0), head_dim)
    if mixed_b is None:
        return inv_freq / factor ** (2 / head_dim)
    a = torch.tensor(factor).log() / (head_dim / 2) ** float(mixed_b)
    lambda_1_m = (a * torch.arange(1, head_dim // 2 + 1).float() ** float(mixed_b)).exp()
    return inv_freq / lambda_1_m


class GteModel(nn.Module):
    """The GTE "NewModel" encoder (no pooler): token ids of packed sequences in, last hidden states out."""

    prefixes: ClassVar[tuple[str, ...]] = ("", "new.")
    token_types: ClassVar[bool] = True

    def __init__(self, config: JsonConfig) -> None:
        super().__init__()
        self.check(config)
        self.config = config
        hidden, heads = int(config.get("hidden_size", 768)), int(config.get("num_attention_heads", 12))
        self.head_dim = hidden // heads
        eps = float(config.get("layer_norm_eps", 1e-12))
        self.word_embeddings = nn.Embedding(int(config.get("vocab_size", 30528)), hidden)
        types = int(config.get("type_vocab_size", 1))
        self.token_type_embeddings = nn.Embedding(types, hidden) if types > 0 else None
        self.embed_norm = nn.LayerNorm(hidden, eps=eps)
        rms = config.get("layer_norm_type", "layer_norm") == "rms_norm"
        self.layers = nn.ModuleList(
            RopeEncoderLayer(
                hidden, heads, int(config.get("intermediate_size", 3072)),
                qkv_bias=True, out_bias=True, up_bias=False, down_bias=True,
                act=activation(config.get("hidden_act", "gelu")),
                norm=(lambda n: RMSNorm(n, eps)) if rms else (lambda n: nn.LayerNorm(n, eps=eps)),
            )
            for _ in range(int(config.get("num_hidden_layers", 12)))
        )
        self.max_positions = int(config.get("max_position_embeddings", 2048))
        self.logn = bool(config.get("logn_attention_scale", False))
        self.logn_clip1 = bool(config.get("logn_attention_clip1", False))
        self._inv_freq: torch.Tensor | None = None

    @classmethod
    def check(cls, config: JsonConfig) -> None:
        """Refuse config values this implementation does not compute exactly (the registry entry's keys)."""
        check_registry(config)
        hidden, heads = int(config.get("hidden_size", 768)), int(config.get("num_attention_heads", 12))
        if hidden % heads or (hidden // heads) % 2:
            raise UnsupportedCheckpoint(f"GTE head size {hidden} / {heads}")

    def load(self, state: dict[str, torch.Tensor]) -> Weights:
        """Copy the checkpoint's tensors in (fusing q/k/v when the checkpoint keeps them apart)."""
        weights = Weights(state, self.prefixes, "embeddings.word_embeddings.weight")
        self.word_embeddings.weight.data.copy_(weights["embeddings.word_embeddings.weight"])
        if self.token_type_embeddings is not None:
            self.token_type_embeddings.weight.data.copy_(weights["embeddings.token_type_embeddings.weight"])
        copy_norm(self.embed_norm, weights, "embeddings.LayerNorm")
        for i, layer in enumerate(cast("list[RopeEncoderLayer]", self.layers)):
            p = f"encoder.layer.{i}."
            a = f"{p}attention."
            if weights.has(f"{a}qkv_proj.weight"):
                copy_linear(layer.qkv, weights, f"{a}qkv_proj")
            else:
                copy_linear(layer.qkv, weights, f"{a}q_proj", f"{a}k_proj", f"{a}v_proj")
            copy_linear(layer.attn_out, weights, f"{a}o_proj")
            copy_linear(layer.gate_up, weights, f"{p}mlp.up_gate_proj")
            copy_linear(layer.down, weights, f"{p}mlp.down_proj")
            copy_norm(layer.attn_norm, weights, f"{p}attn_ln")
            copy_norm(layer.mlp_norm, weights, f"{p}mlp_ln")
        return weights

    def query_scale(self, pack: PackInfo, device: torch.device, dtype: torch.dtype) -> torch.Tensor | None:
        """Per token `[total, 1, 1]` log-n query scale (log len / log max_position_embeddings), None when off."""
        if not self.logn:
            return None
        lengths = torch.tensor(pack.lengths)
        scale = lengths.log() / torch.tensor(self.max_positions).log()
        if self.logn_clip1:
            scale = scale.clip(1)
        return scale.repeat_interleave(lengths).to(device=device, dtype=dtype)[:, None, None]

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        pack: PackInfo,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Last hidden states `[total, hidden]` of the packed sequences."""
        x = self.word_embeddings(input_ids)
        if self.token_type_embeddings is not None:
            types = torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids
            x = x + self.token_type_embeddings(types)
        x = self.embed_norm(x)
        if self._inv_freq is None or self._inv_freq.device != x.device:
            self._inv_freq = ntk_inv_freq(self.config, self.head_dim).to(x.device)
        with torch.autocast(device_type=x.device.type, enabled=False):
            cos, sin = rope_tables(positions, self._inv_freq, x.dtype, interleaved=False)
            q_scale = self.query_scale(pack, x.device, x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin, pack, q_scale)
        return x
