"""Llama and Mistral on the packed buffer (the base of `qwen2.py` and `qwen3.py`).

Pre-norm decoder layers (RMSNorm), fused QKV and gate/up projections, RoPE (default, linear and llama3
scaling, as transformers' `modeling_rope_utils` computes them), grouped-query causal attention confined
to each sequence. A forward may end with one slice of a long sequence attending to its KV cache
(chunked prefill, `embedcli.models.kernels.kv_cache.PrefixSlice`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar, Protocol, cast

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
from embedcli.models.kernels.gemm import linear
from embedcli.models.kernels.kv_cache import PrefixSlice
from embedcli.models.kernels.packing import PackInfo, packed_attention


class RMSNorm(nn.Module):
    """transformers' RMSNorm: normalize in float32, scale in the input dtype."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_inv_freq(config: JsonConfig, head_dim: int) -> torch.Tensor:
    """RoPE inverse frequencies of `config` (rope_parameters, or the older rope_theta + rope_scaling)."""
    params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    kind = params.get("rope_type", params.get("type", "default"))
    base = float(params.get("rope_theta") or config.get("rope_theta", 10000.0))
    if float(params.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))) != 1.0:
        raise UnsupportedCheckpoint("partial rotary embeddings")
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).to(dtype=torch.float) / head_dim))
    if kind == "default":
        return inv_freq
    if kind == "linear":
        return inv_freq / float(params["factor"])
    if kind == "llama3":
        factor = float(params["factor"])
        low, high = float(params["low_freq_factor"]), float(params["high_freq_factor"])
        old_context = float(params.get("original_max_position_embeddings") or config.max_position_embeddings)
        low_wavelen, high_wavelen = old_context / low, old_context / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_context / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, scaled)
    raise UnsupportedCheckpoint(f"RoPE type {kind!r} (position-dependent scaling is not implemented)")


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Apply RoPE to `[total, heads, dim]` (transformers' rotate_half layout)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class DecoderAttention(nn.Module):
    """Causal grouped-query attention with a fused QKV projection (optional per-head q/k RMSNorm: Qwen3)."""

    def __init__(self, config: JsonConfig, layer_idx: int, *, qkv_bias: bool, o_bias: bool, qk_norm: bool) -> None:
        super().__init__()
        self.layer_idx = layer_idx  # keys the KV cache of chunked prefill
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(config.get("num_key_value_heads", self.heads))
        self.head_dim = int(config.get("head_dim") or int(config.hidden_size) // self.heads)
        self.scale = self.head_dim**-0.5
        hidden = int(config.hidden_size)
        self.qkv = nn.Linear(hidden, (self.heads + 2 * self.kv_heads) * self.head_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, hidden, bias=o_bias)
        eps = float(config.get("rms_norm_eps", 1e-6))
        self.q_norm = RMSNorm(self.head_dim, eps) if qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, eps) if qk_norm else None

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        pack: PackInfo | None,
        prefix: PrefixSlice | None,
    ) -> torch.Tensor:
        total, d = x.shape[0], self.head_dim
        q, k, v = linear(self.qkv, x).split([self.heads * d, self.kv_heads * d, self.kv_heads * d], dim=-1)
        q, k, v = q.view(total, self.heads, d), k.view(total, self.kv_heads, d), v.view(total, self.kv_heads, d)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        if prefix is None:
            assert pack is not None
            out = packed_attention(q, k, v, pack, causal=True, scale=self.scale)
        else:
            qh, kh, vh = (t.transpose(0, 1)[None] for t in (q, k, v))
            out = prefix.attention(self, qh, kh, vh, pack, self.scale)[0][0]
        return linear(self.o_proj, out.reshape(total, self.heads * d))


class DecoderLayer(nn.Module):
    """Pre-norm decoder layer: x + attn(norm(x)), then x + mlp(norm(x)) with a fused gate/up projection."""

    def __init__(self, config: JsonConfig, layer_idx: int, *, qkv_bias: bool, o_bias: bool, qk_norm: bool) -> None:
        super().__init__()
        hidden, inter = int(config.hidden_size), int(config.intermediate_size)
        eps = float(config.get("rms_norm_eps", 1e-6))
        mlp_bias = bool(config.get("mlp_bias", False))
        self.input_norm = RMSNorm(hidden, eps)
        self.attn = DecoderAttention(config, layer_idx, qkv_bias=qkv_bias, o_bias=o_bias, qk_norm=qk_norm)
        self.post_attn_norm = RMSNorm(hidden, eps)
        self.gate_up = nn.Linear(hidden, 2 * inter, bias=mlp_bias)
        self.down = nn.Linear(inter, hidden, bias=mlp_bias)
        self.act = activation(config.get("hidden_act", "silu"))

    def norm_names(self) -> list[tuple[nn.Module, str]]:
        """The layer's norms and their checkpoint names under `layers.<i>.`."""
        return [(self.input_norm, "input_layernorm"), (self.post_attn_norm, "post_attention_layernorm")]

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pack: PackInfo | None, prefix: PrefixSlice | None
    ) -> torch.Tensor:
        x = x + self.attn(self.input_norm(x), cos, sin, pack, prefix)
        gate, up = linear(self.gate_up, self.post_attn_norm(x)).chunk(2, dim=-1)
        return x + linear(self.down, self.act(gate) * up)


class _AttentionWeights(Protocol):
    @property
    def qkv(self) -> nn.Linear: ...
    @property
    def o_proj(self) -> nn.Linear: ...
    @property
    def q_norm(self) -> nn.Module | None: ...
    @property
    def k_norm(self) -> nn.Module | None: ...


class DecoderLayerWeights(Protocol):
    """A decoder layer as `load_decoder` fills it (Llama's, Qwen's and Gemma's layers)."""

    @property
    def attn(self) -> _AttentionWeights: ...
    @property
    def gate_up(self) -> nn.Linear: ...
    @property
    def down(self) -> nn.Linear: ...
    def norm_names(self) -> list[tuple[nn.Module, str]]: ...


def load_decoder(
    state: dict[str, torch.Tensor], prefixes: Sequence[str], embed: nn.Embedding,
    layers: Sequence[DecoderLayerWeights], norm: nn.Module,
) -> Weights:
    """Copy a decoder checkpoint (transformers' Llama layout of names) in, fusing q/k/v and gate/up."""
    weights = Weights(state, prefixes, "embed_tokens.weight")
    embed.weight.data.copy_(weights["embed_tokens.weight"])
    for i, layer in enumerate(layers):
        p = f"layers.{i}."
        attn = layer.attn
        copy_linear(attn.qkv, weights, f"{p}self_attn.q_proj", f"{p}self_attn.k_proj", f"{p}self_attn.v_proj")
        copy_linear(attn.o_proj, weights, f"{p}self_attn.o_proj")
        if attn.q_norm is not None and attn.k_norm is not None:
            copy_norm(attn.q_norm, weights, f"{p}self_attn.q_norm")
            copy_norm(attn.k_norm, weights, f"{p}self_attn.k_norm")
        for module, name in layer.norm_names():
            copy_norm(module, weights, p + name)
        copy_linear(layer.gate_up, weights, f"{p}mlp.gate_proj", f"{p}mlp.up_proj")
        copy_linear(layer.down, weights, f"{p}mlp.down_proj")
    copy_norm(norm, weights, "norm")
    return weights


class LlamaModel(nn.Module):
    """The Llama decoder stack with its final norm (no LM head): last hidden states of packed sequences."""

    prefixes: ClassVar[tuple[str, ...]] = ("", "model.")
    qk_norm: ClassVar[bool] = False

    def __init__(self, config: JsonConfig) -> None:
        super().__init__()
        self.check(config)
        self.config = config
        hidden = int(config.hidden_size)
        qkv_bias, o_bias = self.attention_biases(config)
        self.embed_tokens = nn.Embedding(int(config.vocab_size), hidden)
        self.layers = nn.ModuleList(
            DecoderLayer(config, i, qkv_bias=qkv_bias, o_bias=o_bias, qk_norm=self.qk_norm)
            for i in range(int(config.num_hidden_layers))
        )
        self.norm = RMSNorm(hidden, float(config.get("rms_norm_eps", 1e-6)))
        self.head_dim = (
            cast("DecoderLayer", self.layers[0]).attn.head_dim if len(self.layers) else hidden // int(config.num_attention_heads)
        )
        self._inv_freq: torch.Tensor | None = None

    @classmethod
    def check(cls, config: JsonConfig) -> None:
        """Refuse config values this implementation does not compute exactly (the registry entry's keys)."""
        check_registry(config)
        if "sliding_attention" in (config.get("layer_types") or []):
            raise UnsupportedCheckpoint("sliding-window attention layers")

    @classmethod
    def attention_biases(cls, config: JsonConfig) -> tuple[bool, bool]:
        """Whether the q/k/v and the output projections carry biases."""
        bias = bool(config.get("attention_bias", False))
        return bias, bias

    def load(self, state: dict[str, torch.Tensor]) -> Weights:
        """Copy the checkpoint's tensors in (fusing q/k/v and gate/up)."""
        layers = cast("list[DecoderLayer]", self.layers)
        return load_decoder(state, self.prefixes, self.embed_tokens, layers, self.norm)

    def rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """`[total, 1, head_dim]` cos and sin at `positions` (float32 math, then `dtype`, as transformers)."""
        if self._inv_freq is None or self._inv_freq.device != positions.device:
            self._inv_freq = rope_inv_freq(self.config, self.head_dim).to(positions.device)
        freqs = positions[:, None].float() * self._inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        pack: PackInfo | None,
        token_type_ids: torch.Tensor | None = None,
        prefix: PrefixSlice | None = None,
    ) -> torch.Tensor:
        """Last hidden states `[total, hidden]`; with `prefix`, the last rows are a slice attending to its cache."""
        x = self.embed_tokens(input_ids)
        with torch.autocast(device_type=x.device.type, enabled=False):
            cos, sin = self.rope(positions, x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin, pack, prefix)
        return self.norm(x)
