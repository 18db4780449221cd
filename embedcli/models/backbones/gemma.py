"""Gemma2 and Gemma3 text on the packed buffer; EmbeddingGemma is Gemma3 with bidirectional attention.

What both share (transformers' `modeling_gemma2.py` / `modeling_gemma3.py`): Gemma's RMSNorm (float32,
`x * (1 + w)`), token embeddings scaled by sqrt(hidden) in the weight dtype, four norms per layer (before and
after attention and the MLP), a gated MLP, scores scaled by `query_pre_attn_scalar ** -0.5`, and a sliding
window on the layers `layer_types` names "sliding_attention". Gemma2 caps the attention scores
(`tanh(s / cap) * cap`, before the mask) and takes one RoPE; Gemma3 normalizes queries and keys per head and
takes RoPE per layer type (transformers' Gemma3 attention takes no cap: a config naming one is refused). The
LM head's final logit cap belongs to the yes/no score head (`lm_heads.py`).

Windows, as transformers builds the masks: causal, key `j` of query `i` is seen when `i - window < j <= i`;
bidirectional (Gemma3's config stores the whole span `W` and attends `|i - j| < W // 2 + 1`), when
`|i - j| <= W // 2`.
"""

from __future__ import annotations

from typing import Any, ClassVar, cast

import torch
import torch.nn.functional as F
from torch import nn

from embedcli.models.backbones.layers import (
    JsonConfig,
    UnsupportedCheckpoint,
    Weights,
    activation,
    check_registry,
)
from embedcli.models.backbones.llama import load_decoder, rope_inv_freq
from embedcli.models.kernels import cpu_attention, fused_attention
from embedcli.models.kernels.gemm import gated_linear, linear
from embedcli.models.kernels.kv_cache import QUERY_BLOCK, PrefixSlice
from embedcli.models.kernels.packing import PackInfo, Window, packed_attention

LAYER_TYPES = ("sliding_attention", "full_attention")
# transformers' defaults where config.json omits a key (Gemma2Config / Gemma3TextConfig).
HEAD_DIM = 256
QUERY_PRE_ATTN_SCALAR = 256
SLIDING_WINDOW = 4096
GEMMA3_THETA = {"full_attention": 1_000_000.0, "sliding_attention": 10_000.0}
GEMMA3_PATTERN = 6
# Query rows per block of the eager (capped) attention: its score matrix stays `block x keys`.
SCORE_BLOCK = 512


class GemmaRMSNorm(nn.Module):
    """Gemma's RMSNorm: normalize and scale by `1 + weight` in float32, then back to the input dtype."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # `x * rsqrt(mean(x^2) + eps) * (1 + w)` bit for bit (torch's rms_norm does those same steps), in one
        # call where the ops written out take ~2.4x the time on `[2048, 768]`.
        return F.rms_norm(x.float(), (x.shape[-1],), 1.0 + self.weight.float(), self.eps).type_as(x)


def rotate_signed(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """`llama.rotate(x, cos, sin)` bit for bit, given `signed_sin` = sin with its first half negated.

    `cat(-x2, x1) * sin` equals `cat(x2, x1) * signed_sin` exactly; in place after one copy, ~3.5x faster
    than the ops `rotate` writes out on `[2048, 4, 256]`.
    """
    half = x.shape[-1] // 2
    out = x * cos
    return out.add_(torch.cat((x[..., half:], x[..., :half]), dim=-1).mul_(signed_sin))


def allowed(queries: torch.Tensor, keys: torch.Tensor, causal: bool, window: Window | None) -> torch.Tensor | None:
    """`[queries, keys]` True where a query position sees a key position; None when every key is seen."""
    if not causal and window is None:
        return None
    offset = keys[None, :] - queries[:, None]  # key minus query position
    mask = offset <= 0 if causal else torch.ones_like(offset, dtype=torch.bool)
    if window is not None:
        mask = mask & (offset >= -window[0]) & (offset <= window[1])
    return mask


def eager_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float, softcap: float | None
) -> torch.Tensor:
    """transformers' eager attention (score cap before the mask): `[b, h, lq, d]` q, `[b, kv_h, lk, d]` k/v."""
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = torch.matmul(q, k.transpose(2, 3)) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs, v)


def _eager_blocks(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor | None,
    causal: bool, window: Window | None, scale: float, softcap: float | None,
) -> torch.Tensor:
    """`eager_attention` over a padded group in query blocks, each against the keys its window can reach."""
    length = q.shape[2]
    positions = torch.arange(length, device=q.device)
    out = []
    for lo in range(0, length, SCORE_BLOCK):
        hi = min(lo + SCORE_BLOCK, length)
        first = 0 if window is None else max(0, lo - window[0])
        last = hi if causal else (length if window is None else min(length, hi - 1 + window[1] + 1))
        mask = allowed(positions[lo:hi], positions[first:last], causal, window)
        if key_mask is not None:
            keys = key_mask[..., first:last]
            mask = keys if mask is None else mask & keys
        out.append(eager_attention(q[:, :, lo:hi], k[:, :, first:last], v[:, :, first:last], mask, scale, softcap))
    return out[0] if len(out) == 1 else torch.cat(out, dim=2)


def packed_eager_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pack: PackInfo,
    *, causal: bool, window: Window | None, scale: float, softcap: float | None,
) -> torch.Tensor:
    """Eager attention (a score cap, a window: both optional) of `[total, heads, dim]` q/k/v confined to each
    sequence, per length group of `pack`."""
    out: torch.Tensor | None = None
    for group in pack.groups:
        qp, kp, vp = (
            t.index_select(0, group.gather_index).view(group.batch, group.max_len, t.shape[1], t.shape[2]).transpose(1, 2)
            for t in (q, k, v)
        )
        res = _eager_blocks(qp, kp, vp, group.key_mask, causal, window, scale, softcap)
        heads, dim = res.shape[1], res.shape[3]
        rows = res.transpose(1, 2).reshape(group.batch * group.max_len, heads, dim).index_select(0, group.scatter_index)
        if group.whole:
            return rows
        if out is None:
            out = rows.new_empty(pack.total, heads, dim)
        out.index_copy_(0, group.rows, rows)
    assert out is not None
    return out


class GemmaAttention(nn.Module):
    """Grouped-query attention with Gemma's scale, optional q/k norms, window and score cap."""

    def __init__(
        self, config: JsonConfig, layer_idx: int, layer_type: str,
        *, qk_norm: bool, causal: bool, scale: float, softcap: float | None,
    ) -> None:
        super().__init__()
        self.layer_idx = layer_idx  # keys the KV cache of chunked prefill
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(config.get("num_key_value_heads", self.heads))
        self.head_dim = int(config.get("head_dim", HEAD_DIM))
        self.scale = scale
        self.causal = causal
        self.window = layer_window(config, causal) if layer_type == "sliding_attention" else None
        self.softcap = softcap
        hidden, bias = int(config.hidden_size), bool(config.get("attention_bias", False))
        self.qkv = nn.Linear(hidden, (self.heads + 2 * self.kv_heads) * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, hidden, bias=bias)
        eps = float(config.get("rms_norm_eps", 1e-6))
        self.q_norm = GemmaRMSNorm(self.head_dim, eps) if qk_norm else None
        self.k_norm = GemmaRMSNorm(self.head_dim, eps) if qk_norm else None

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pack: PackInfo) -> torch.Tensor:
        """Attention of `[total, heads, dim]` q/k/v within each sequence of `pack`."""
        if self.softcap is not None:
            return packed_eager_attention(
                q, k, v, pack, causal=self.causal, window=self.window, scale=self.scale, softcap=self.softcap
            )
        if fused_attention.applies(q, k, v, pack):
            return fused_attention.attention(q, k, v, pack, scale=self.scale, causal=self.causal, window=self.window)
        if cpu_attention.applies(q):
            return cpu_attention.sequence_attention(q, k, v, pack, scale=self.scale, causal=self.causal, window=self.window)
        # No cap: SDPA (flash-attn on CUDA) with the window folded into the mask.
        return packed_attention(q, k, v, pack, causal=self.causal, scale=self.scale, window=self.window)

    def attend_prefix(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pack: PackInfo | None, prefix: PrefixSlice
    ) -> torch.Tensor:
        """Chunked prefill: whole sequences (`pack`), then the last `prefix.length` rows against their KV cache."""
        if not self.causal:
            raise RuntimeError("bidirectional attention cannot run a sequence in chunked-prefill slices")
        split = q.shape[0] - prefix.length
        parts = [self.attend(q[:split], k[:split], v[:split], pack)] if pack is not None else []
        cached = prefix.cache.length
        keys, values = prefix.cache.write(self.layer_idx, k[split:], v[split:])  # [kv_heads, cached + n, dim]
        qs = q[split:].transpose(0, 1)[None]
        positions = torch.arange(cached + prefix.length, device=q.device)
        blocks = []
        for lo in range(0, prefix.length, QUERY_BLOCK):
            hi = min(lo + QUERY_BLOCK, prefix.length)
            first = 0 if self.window is None else max(0, cached + lo - self.window[0])
            seen = cached + hi
            mask = allowed(positions[cached + lo : seen], positions[first:seen], True, self.window)
            ks, vs = keys[None, :, first:seen], values[None, :, first:seen]
            if self.softcap is None:
                blocks.append(F.scaled_dot_product_attention(
                    qs[:, :, lo:hi], ks, vs, attn_mask=mask, scale=self.scale, enable_gqa=self.kv_heads != self.heads
                ))
            else:
                blocks.append(eager_attention(qs[:, :, lo:hi], ks, vs, mask, self.scale, self.softcap))
        parts.append(torch.cat(blocks, dim=2)[0].transpose(0, 1))
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pack: PackInfo | None, prefix: PrefixSlice | None
    ) -> torch.Tensor:
        total, d = x.shape[0], self.head_dim
        qkv = linear(self.qkv, x)
        # Queries and keys are neighbours in each row: normed and rotated as one `[total, heads + kv_heads, d]`.
        qk = qkv[:, : (self.heads + self.kv_heads) * d].view(total, self.heads + self.kv_heads, d)
        v = qkv[:, (self.heads + self.kv_heads) * d :].view(total, self.kv_heads, d)
        if self.q_norm is not None and self.k_norm is not None:
            # Per head, as q_norm(q) and k_norm(k) compute it: rms_norm, then times each head's `1 + w`.
            scale = torch.cat((
                (1.0 + self.q_norm.weight.float()).expand(self.heads, d),
                (1.0 + self.k_norm.weight.float()).expand(self.kv_heads, d),
            ))
            qk = (F.rms_norm(qk.float(), (d,), None, self.q_norm.eps) * scale).type_as(qk)
        qk = rotate_signed(qk, cos, sin)
        q, k = qk[:, : self.heads], qk[:, self.heads :]
        if prefix is None:
            assert pack is not None
            out = self.attend(q, k, v, pack)
        else:
            out = self.attend_prefix(q, k, v, pack, prefix)
        return linear(self.o_proj, out.reshape(total, self.heads * d))


class GemmaLayer(nn.Module):
    """x + post_attn_norm(attn(input_norm(x))), then x + post_ff_norm(mlp(pre_ff_norm(x))); Gemma (v1) has no
    post norms (`sandwich` off)."""

    def __init__(
        self, config: JsonConfig, layer_idx: int, layer_type: str,
        *, qk_norm: bool, causal: bool, scale: float, softcap: float | None, act: str, sandwich: bool,
    ) -> None:
        super().__init__()
        hidden, inter = int(config.hidden_size), int(config.intermediate_size)
        eps = float(config.get("rms_norm_eps", 1e-6))
        self.layer_type = layer_type
        self.input_norm = GemmaRMSNorm(hidden, eps)
        self.attn = GemmaAttention(
            config, layer_idx, layer_type, qk_norm=qk_norm, causal=causal, scale=scale, softcap=softcap
        )
        self.post_attn_norm = GemmaRMSNorm(hidden, eps) if sandwich else None
        self.pre_ff_norm = GemmaRMSNorm(hidden, eps)
        self.gate_up = nn.Linear(hidden, 2 * inter, bias=False)
        self.down = nn.Linear(inter, hidden, bias=False)
        self.post_ff_norm = GemmaRMSNorm(hidden, eps) if sandwich else None
        self.act = activation(act)

    def norm_names(self) -> list[tuple[nn.Module, str]]:
        """The layer's norms and their checkpoint names under `layers.<i>.`."""
        if self.post_attn_norm is None or self.post_ff_norm is None:
            # Gemma (v1): the norm after attention is the MLP's input norm (Llama's layout)
            return [(self.input_norm, "input_layernorm"), (self.pre_ff_norm, "post_attention_layernorm")]
        return [
            (self.input_norm, "input_layernorm"), (self.post_attn_norm, "post_attention_layernorm"),
            (self.pre_ff_norm, "pre_feedforward_layernorm"), (self.post_ff_norm, "post_feedforward_layernorm"),
        ]

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pack: PackInfo | None, prefix: PrefixSlice | None
    ) -> torch.Tensor:
        h = self.attn(self.input_norm(x), cos, sin, pack, prefix)
        x = x + (h if self.post_attn_norm is None else self.post_attn_norm(h))
        h = linear(self.down, gated_linear(self.gate_up, self.pre_ff_norm(x), self.act))
        return x + (h if self.post_ff_norm is None else self.post_ff_norm(h))


def layer_window(config: JsonConfig, causal: bool) -> Window:
    """The reach of a sliding layer, as transformers masks it (see the module docstring)."""
    window = int(getattr(config, "sliding_window", SLIDING_WINDOW))
    if causal:
        return (window - 1, 0)
    return (window // 2, window // 2)


class GemmaModel(nn.Module):
    """The decoder stack with its final norm (no LM head); subclasses say the family's differences."""

    prefixes: ClassVar[tuple[str, ...]] = ("", "model.")
    token_types: ClassVar[bool] = False
    qk_norm: ClassVar[bool] = False
    sandwich: ClassVar[bool] = True  # norms after attention and the MLP too (Gemma2, Gemma3)
    model_type: ClassVar[str] = ""
    # The config class's values where config.json lacks the key (an explicit null is no cap).
    default_caps: ClassVar[dict[str, float | None]] = {}

    def __init__(self, config: JsonConfig) -> None:
        super().__init__()
        self.check(config)
        self.config = config
        hidden = int(config.hidden_size)
        self.causal = self.is_causal(config)
        self.layer_types = self.types_of_layers(config)
        self.embed_tokens = nn.Embedding(int(config.vocab_size), hidden)
        self.embed_scale = hidden**0.5
        self.layers = nn.ModuleList(
            GemmaLayer(
                config, i, kind, qk_norm=self.qk_norm, causal=self.causal, scale=self.attention_scale(config),
                softcap=self.cap(config, "attn_logit_softcapping"), act=self.mlp_activation(config),
                sandwich=self.sandwich,
            )
            for i, kind in enumerate(self.layer_types)
        )
        self.norm = GemmaRMSNorm(hidden, float(config.get("rms_norm_eps", 1e-6)))
        self.head_dim = int(config.get("head_dim", HEAD_DIM))
        self.final_logit_softcap = self.cap(config, "final_logit_softcapping")  # read by the LM-head score
        self._inv_freq: dict[str, torch.Tensor] = {}

    # -- what the config says ------------------------------------------------------------------------
    @classmethod
    def is_causal(cls, config: JsonConfig) -> bool:
        """Whether attention is causal (Gemma3's `use_bidirectional_attention` turns it off)."""
        return not bool(config.get("use_bidirectional_attention", False))

    @classmethod
    def types_of_layers(cls, config: JsonConfig) -> list[str]:
        """Each layer's "sliding_attention" / "full_attention", as the config class fills `layer_types`."""
        raise NotImplementedError

    @classmethod
    def cap(cls, config: JsonConfig, key: str) -> float | None:
        """`attn_logit_softcapping` / `final_logit_softcapping`: the config's value, or the family's default."""
        value = getattr(config, key, cls.default_caps.get(key))
        return None if value is None else float(value)

    @classmethod
    def attention_scale(cls, config: JsonConfig) -> float:
        """The score scale: `query_pre_attn_scalar ** -0.5` (default 256)."""
        return float(config.get("query_pre_attn_scalar", QUERY_PRE_ATTN_SCALAR)) ** -0.5

    @classmethod
    def mlp_activation(cls, config: JsonConfig) -> str:
        """The MLP's activation, by transformers' name (`hidden_activation`, default gelu_pytorch_tanh)."""
        return str(config.get("hidden_activation", "gelu_pytorch_tanh"))

    @classmethod
    def rope_parameters(cls, config: JsonConfig, layer_type: str) -> dict[str, Any]:
        """The RoPE parameters (rope_type, rope_theta, scaling) of a layer type."""
        raise NotImplementedError

    @classmethod
    def check(cls, config: JsonConfig) -> None:
        """Refuse config values this implementation does not compute exactly (the registry entry's keys)."""
        if str(config.get("model_type", cls.model_type)) != cls.model_type:
            raise UnsupportedCheckpoint(f"model_type {config.get('model_type')!r} is not {cls.model_type}")
        check_registry(config)
        types = cls.types_of_layers(config)
        if len(types) != int(config.num_hidden_layers) or any(t not in LAYER_TYPES for t in types):
            raise UnsupportedCheckpoint(f"layer_types {types!r}")
        window = getattr(config, "sliding_window", SLIDING_WINDOW)
        if "sliding_attention" in types and (window is None or int(window) < 1):
            raise UnsupportedCheckpoint(f"sliding layers with sliding_window {window!r}")
        for key in ("attn_logit_softcapping", "final_logit_softcapping"):
            cap = cls.cap(config, key)
            if cap is not None and not cap > 0:
                raise UnsupportedCheckpoint(f"{key} {cap!r}")
        activation(cls.mlp_activation(config))
        head_dim = int(config.get("head_dim", HEAD_DIM))
        for kind in set(types):
            params = cls.rope_parameters(config, kind)
            if params.get("rope_type", "default") not in ("default", "linear"):
                # Other types (yarn, dynamic, ...) scale by position or rescale cos/sin: not implemented here.
                raise UnsupportedCheckpoint(f"RoPE type {params.get('rope_type')!r} on {kind} layers")
            rope_inv_freq(JsonConfig(rope_parameters=params), head_dim)

    # -- weights -------------------------------------------------------------------------------------
    def load(self, state: dict[str, torch.Tensor]) -> Weights:
        """Copy the checkpoint's tensors in (fusing q/k/v and gate/up)."""
        layers = cast("list[GemmaLayer]", self.layers)
        return load_decoder(state, self.prefixes, self.embed_tokens, layers, self.norm)

    def lm_head_weight(self, weights: Weights) -> torch.Tensor:
        """The LM head's `[vocab, hidden]` weight: the embeddings when tied (Gemma's default), else `lm_head`."""
        if bool(getattr(self.config, "tie_word_embeddings", True)):
            return self.embed_tokens.weight.data
        weight = weights.head("lm_head.weight")
        if weight is None:
            raise UnsupportedCheckpoint("an untied LM head without lm_head.weight")
        return weight

    # -- forward -------------------------------------------------------------------------------------
    def rope(self, layer_type: str, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """`[total, 1, head_dim]` cos and signed sin (`rotate_signed`) of a layer type at `positions` (float32
        math, then `dtype`)."""
        inv_freq = self._inv_freq.get(layer_type)
        if inv_freq is None or inv_freq.device != positions.device:
            params = self.rope_parameters(self.config, layer_type)
            inv_freq = rope_inv_freq(JsonConfig(rope_parameters=params), self.head_dim).to(positions.device)
            self._inv_freq[layer_type] = inv_freq
        freqs = positions[:, None].float() * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        sin = emb.sin().to(dtype)
        half = sin.shape[-1] // 2
        signed = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)  # `rotate_signed`'s table
        return emb.cos().to(dtype)[:, None], signed[:, None]

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        pack: PackInfo | None,
        token_type_ids: torch.Tensor | None = None,
        prefix: PrefixSlice | None = None,
    ) -> torch.Tensor:
        """Last hidden states `[total, hidden]`; with `prefix`, the last rows are a slice attending to its cache."""
        weight = self.embed_tokens.weight
        x = self.embed_tokens(input_ids) * torch.tensor(self.embed_scale, dtype=weight.dtype, device=weight.device)
        with torch.autocast(device_type=x.device.type, enabled=False):
            rope = {kind: self.rope(kind, positions, x.dtype) for kind in set(self.layer_types)}
        for layer in cast("list[GemmaLayer]", self.layers):
            cos, sin = rope[layer.layer_type]
            x = layer(x, cos, sin, pack, prefix)
        return self.norm(x)


class GemmaV1Model(GemmaModel):
    """Gemma (v1, bge-reranker-v2-gemma's base): Llama's layer layout with Gemma's norms, embedding scale and
    MLP; scores scaled by `head_dim ** -0.5`, no window, no caps."""

    model_type: ClassVar[str] = "gemma"
    sandwich: ClassVar[bool] = False

    @classmethod
    def types_of_layers(cls, config: JsonConfig) -> list[str]:
        """Every layer attends in full."""
        return ["full_attention"] * int(config.num_hidden_layers)

    @classmethod
    def attention_scale(cls, config: JsonConfig) -> float:
        """`head_dim ** -0.5` (GemmaAttention has no query_pre_attn_scalar)."""
        return float(config.get("head_dim", HEAD_DIM)) ** -0.5

    @classmethod
    def mlp_activation(cls, config: JsonConfig) -> str:
        """`hidden_act`; the official releases' legacy "gelu" means the tanh form (GemmaConfig rewrites it)."""
        act = str(config.get("hidden_act", "gelu_pytorch_tanh"))
        return "gelu_pytorch_tanh" if act == "gelu" else act

    @classmethod
    def rope_parameters(cls, config: JsonConfig, layer_type: str) -> dict[str, Any]:
        """As Gemma2: `rope_parameters`, else `rope_scaling` with `rope_theta` (default 10000)."""
        return Gemma2Model.rope_parameters(config, layer_type)


class Gemma2Model(GemmaModel):
    """Gemma2: scores capped in attention, sliding window on every other layer, one RoPE."""

    model_type: ClassVar[str] = "gemma2"
    default_caps: ClassVar[dict[str, float | None]] = {"attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0}

    @classmethod
    def types_of_layers(cls, config: JsonConfig) -> list[str]:
        """`layer_types`, else sliding on even layers (Gemma2Config)."""
        declared = config.get("layer_types")
        if declared is not None:
            return [str(t) for t in declared]
        return ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(int(config.num_hidden_layers))]

    @classmethod
    def rope_parameters(cls, config: JsonConfig, layer_type: str) -> dict[str, Any]:
        """`rope_parameters`, else `rope_scaling` with `rope_theta` (default 10000)."""
        params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
        params.setdefault("rope_type", params.pop("type", "default"))
        params.setdefault("rope_theta", float(config.get("rope_theta", 10_000.0)))
        return params


class Gemma3TextModel(GemmaModel):
    """Gemma3 text (EmbeddingGemma when bidirectional): q/k norms, RoPE per layer type, 5 sliding : 1 full."""

    model_type: ClassVar[str] = "gemma3_text"
    qk_norm: ClassVar[bool] = True

    @classmethod
    def types_of_layers(cls, config: JsonConfig) -> list[str]:
        """`layer_types`, else every `sliding_window_pattern`-th layer (default 6) full (Gemma3TextConfig)."""
        declared = config.get("layer_types")
        if declared is not None:
            return [str(t) for t in declared]
        pattern = int(config.get("sliding_window_pattern", GEMMA3_PATTERN))
        return [
            "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(int(config.num_hidden_layers))
        ]

    @classmethod
    def rope_parameters(cls, config: JsonConfig, layer_type: str) -> dict[str, Any]:
        """`rope_parameters[layer_type]` (transformers 5), else `rope_theta` + `rope_scaling` for full layers and
        `rope_local_base_freq` for sliding ones (EmbeddingGemma's config, transformers 4)."""
        declared, scaling = config.get("rope_parameters"), config.get("rope_scaling")
        if declared is not None:
            if layer_type not in declared:  # one set for every layer: transformers 5 refuses that for gemma3
                raise UnsupportedCheckpoint(f"rope_parameters without {layer_type!r}")
            if scaling:  # transformers merges it into the full layers' set: not mirrored
                raise UnsupportedCheckpoint("both rope_parameters and rope_scaling")
            params = dict(declared[layer_type] or {})
        elif layer_type == "full_attention":
            params = dict(scaling or {})
            if "type" in params and "rope_type" not in params:
                # transformers updates {"rope_type": "default"} with it, so the old key would not count
                raise UnsupportedCheckpoint("rope_scaling names its type under 'type'")
            params.setdefault("rope_theta", config.get("rope_theta"))
        else:
            params = {"rope_theta": config.get("rope_local_base_freq")}
        params.setdefault("rope_type", params.pop("type", "default"))
        if params.get("rope_theta") is None:
            params["rope_theta"] = GEMMA3_THETA[layer_type]
        return params
