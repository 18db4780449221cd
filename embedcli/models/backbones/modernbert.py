"""ModernBERT on the packed buffer (gte-modernbert, modernbert-embed, granite-embedding-r2, their rerankers).

Embeddings are the token embedding and a LayerNorm (no positions: RoPE). Pre-norm layers (the first
without its attention norm) alternate global and local attention: a local layer's query sees the keys
within `local_attention // 2` tokens each way, and each kind has its own RoPE theta. The MLP is a GeGLU
(`Wi` -> input, gate -> act(input) * gate -> `Wo`). Numerics follow transformers' `ModernBertModel`
(RoPE applied in float32, eps `norm_eps`, biases only where the config says).
"""

from __future__ import annotations

from typing import Any, ClassVar

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
    varlen_attention,
)
from embedcli.models.backbones.llama import rotate
from embedcli.models.kernels.gemm import linear
from embedcli.models.kernels.packing import PackInfo, Window

GLOBAL, LOCAL = "full_attention", "sliding_attention"
# transformers' ModernBertConfig: theta per layer type, and the older flat keys that set them.
DEFAULT_THETA = {GLOBAL: 160_000.0, LOCAL: 10_000.0}
LEGACY_THETA = {GLOBAL: "global_rope_theta", LOCAL: "local_rope_theta"}


def layer_types(config: JsonConfig) -> list[str]:
    """Each layer's attention kind: `layer_types`, else every `global_attn_every_n_layers`-th layer global."""
    n = int(config.num_hidden_layers)
    types = config.get("layer_types")
    if types is None:
        every = int(config.get("global_attn_every_n_layers", 3))
        if every < 1:
            raise UnsupportedCheckpoint(f"global_attn_every_n_layers {every}")
        types = [LOCAL if i % every else GLOBAL for i in range(n)]
    types = [str(t) for t in types]
    if len(types) != n or not set(types) <= {GLOBAL, LOCAL}:
        raise UnsupportedCheckpoint(f"layer_types {types} (ModernBERT runs {n} layers of {GLOBAL} / {LOCAL})")
    return types


def rope_thetas(config: JsonConfig) -> dict[str, float]:
    """The RoPE theta of each layer kind, resolved as transformers' ModernBertConfig does (default RoPE only)."""
    if config.get("rope_scaling"):
        raise UnsupportedCheckpoint(f"rope_scaling {config.rope_scaling!r}")
    params: dict[str, Any] = dict(config.get("rope_parameters") or {})
    if not set(params) <= {GLOBAL, LOCAL}:
        raise UnsupportedCheckpoint(f"rope_parameters {params!r} (expected one entry per layer type)")
    thetas: dict[str, float] = {}
    for kind in (GLOBAL, LOCAL):
        entry = dict(params.get(kind) or {})
        rope_type = entry.get("rope_type", entry.get("type", "default"))
        if rope_type != "default":
            raise UnsupportedCheckpoint(f"RoPE type {rope_type!r} for {kind}")
        # A theta in rope_parameters wins over the legacy key (transformers' setdefault).
        theta = entry["rope_theta"] if "rope_theta" in entry else config.get(LEGACY_THETA[kind], DEFAULT_THETA[kind])
        if theta is None:
            raise UnsupportedCheckpoint(f"rope_theta None for {kind}")
        thetas[kind] = float(theta)
    return thetas


def local_reach(config: JsonConfig) -> int:
    """How many tokens each way a local layer's query reaches: `local_attention // 2` (inclusive)."""
    return int(config.get("local_attention", 128)) // 2


class PredictionHead(nn.Module):
    """ModernBERT's head before every classifier: dense -> `classifier_activation` -> LayerNorm."""

    def __init__(self, config: JsonConfig) -> None:
        super().__init__()
        hidden = int(config.hidden_size)
        self.dense = nn.Linear(hidden, hidden, bias=bool(config.get("classifier_bias", False)))
        self.act = activation(config.get("classifier_activation", "gelu"))
        self.norm = nn.LayerNorm(hidden, eps=float(config.get("norm_eps", 1e-5)), bias=bool(config.get("norm_bias", False)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.act(self.dense(x)))


def classifier_head(config: JsonConfig, weights: Weights) -> nn.Module:
    """`head` then `classifier` of a ModernBertFor{Sequence,Token}Classification checkpoint."""
    head = PredictionHead(config)
    state = {k.removeprefix("head."): v for k, v in weights.state.items() if k.startswith("head.")}
    try:
        head.load_state_dict(state)
    except RuntimeError as e:  # a missing, extra or misshapen head tensor
        raise UnsupportedCheckpoint(f"the classifier's prediction head does not load: {e}") from e
    weight, bias = weights.head("classifier.weight"), weights.head("classifier.bias")
    if weight is None or bias is None:
        raise UnsupportedCheckpoint("classifier tensors classifier.weight / classifier.bias are missing")
    classifier = nn.Linear(weight.shape[1], weight.shape[0])
    classifier.weight.data.copy_(weight)
    classifier.bias.data.copy_(bias)
    return nn.Sequential(head, classifier)


class ModernBertLayer(nn.Module):
    """x + attn(attn_norm(x)) (global or local), then x + GeGLU(mlp_norm(x))."""

    def __init__(self, config: JsonConfig, index: int, kind: str) -> None:
        super().__init__()
        hidden, inter = int(config.hidden_size), int(config.intermediate_size)
        eps, norm_bias = float(config.get("norm_eps", 1e-5)), bool(config.get("norm_bias", False))
        attn_bias, mlp_bias = bool(config.get("attention_bias", False)), bool(config.get("mlp_bias", False))
        self.kind = kind
        self.heads = int(config.num_attention_heads)
        self.head_dim = hidden // self.heads
        reach = local_reach(config)
        self.window: Window | None = (reach, reach) if kind == LOCAL else None
        # transformers makes the first layer's attention norm an Identity (the embeddings end in a norm).
        self.attn_norm = nn.LayerNorm(hidden, eps=eps, bias=norm_bias) if index else None
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=attn_bias)
        self.attn_out = nn.Linear(hidden, hidden, bias=attn_bias)
        self.mlp_norm = nn.LayerNorm(hidden, eps=eps, bias=norm_bias)
        self.wi = nn.Linear(hidden, 2 * inter, bias=mlp_bias)
        self.wo = nn.Linear(inter, hidden, bias=mlp_bias)
        self.act = activation(config.get("hidden_activation", "gelu"))

    def load(self, weights: Weights, prefix: str) -> None:
        """Copy layer `prefix`'s tensors."""
        if self.attn_norm is not None:
            copy_norm(self.attn_norm, weights, f"{prefix}attn_norm")
        copy_linear(self.qkv, weights, f"{prefix}attn.Wqkv")
        copy_linear(self.attn_out, weights, f"{prefix}attn.Wo")
        copy_norm(self.mlp_norm, weights, f"{prefix}mlp_norm")
        copy_linear(self.wi, weights, f"{prefix}mlp.Wi")
        copy_linear(self.wo, weights, f"{prefix}mlp.Wo")

    def attention(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pack: PackInfo) -> torch.Tensor:
        total, heads, d = x.shape[0], self.heads, self.head_dim
        qkv = linear(self.qkv, x).view(total, 3 * heads, d)
        # transformers rotates q and k in float32 and rounds back to the projection's dtype.
        qk = rotate(qkv[:, : 2 * heads].float(), cos, sin).to(qkv.dtype)
        fused = torch.cat((qk, qkv[:, 2 * heads :]), dim=1).view(total, 3 * heads * d)
        context = varlen_attention(fused, pack, heads, d, scale=d**-0.5, window=self.window)
        return linear(self.attn_out, context)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pack: PackInfo) -> torch.Tensor:
        normed = x if self.attn_norm is None else self.attn_norm(x)
        x = x + self.attention(normed, cos, sin, pack)
        inputs, gate = linear(self.wi, self.mlp_norm(x)).chunk(2, dim=-1)
        return x + linear(self.wo, self.act(inputs) * gate)


class ModernBertModel(nn.Module):
    """The ModernBERT encoder with its final norm: token ids of packed sequences in, last hidden states out."""

    prefixes: ClassVar[tuple[str, ...]] = ("", "model.")
    token_types: ClassVar[bool] = False

    def __init__(self, config: JsonConfig) -> None:
        super().__init__()
        self.check(config)
        self.config = config
        hidden = int(config.hidden_size)
        eps, norm_bias = float(config.get("norm_eps", 1e-5)), bool(config.get("norm_bias", False))
        self.tok_embeddings = nn.Embedding(int(config.vocab_size), hidden)
        self.embed_norm = nn.LayerNorm(hidden, eps=eps, bias=norm_bias)
        self.kinds = layer_types(config)
        self.layers = nn.ModuleList(ModernBertLayer(config, i, kind) for i, kind in enumerate(self.kinds))
        self.final_norm = nn.LayerNorm(hidden, eps=eps, bias=norm_bias)
        self.head_dim = hidden // int(config.num_attention_heads)
        self.thetas = rope_thetas(config)

    @classmethod
    def check(cls, config: JsonConfig) -> None:
        """Refuse config values this implementation does not compute exactly (the registry entry's keys)."""
        check_registry(config)
        hidden, heads = int(config.hidden_size), int(config.num_attention_heads)
        if hidden % heads:
            raise UnsupportedCheckpoint(f"hidden_size {hidden} is not a multiple of num_attention_heads {heads}")

    def load(self, state: dict[str, torch.Tensor]) -> Weights:
        """Copy the checkpoint's tensors in; returns the lookup, which also serves heads."""
        weights = Weights(state, self.prefixes, "embeddings.tok_embeddings.weight")
        self.tok_embeddings.weight.data.copy_(weights["embeddings.tok_embeddings.weight"])
        copy_norm(self.embed_norm, weights, "embeddings.norm")
        for i, layer in enumerate(self.layers):
            layer.load(weights, f"layers.{i}.")  # type: ignore[operator]  # a ModuleList item is typed as a plain Module
        copy_norm(self.final_norm, weights, "final_norm")
        return weights

    def rope(self, kind: str, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """`[total, 1, head_dim]` cos and sin of layer kind `kind` (float32 math, then `dtype`, as transformers)."""
        d = self.head_dim
        inv_freq = 1.0 / (self.thetas[kind] ** (torch.arange(0, d, 2, dtype=torch.float) / d))
        freqs = positions[:, None].float() * inv_freq.to(positions.device)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        pack: PackInfo,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Last hidden states `[total, hidden]` of the packed sequences (ModernBERT has no token types)."""
        x = self.embed_norm(self.tok_embeddings(input_ids))
        with torch.autocast(device_type=x.device.type, enabled=False):
            ropes = {kind: self.rope(kind, positions, x.dtype) for kind in set(self.kinds)}
        for kind, layer in zip(self.kinds, self.layers, strict=True):
            x = layer(x, *ropes[kind], pack)
        return self.final_norm(x)
