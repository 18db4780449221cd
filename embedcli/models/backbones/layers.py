"""What every own backbone shares: the JSON config, checkpoint tensors by name, activations, varlen attention.

The backbones (`bert.py`, `roberta.py`, `distilbert.py`, `mpnet.py`, `llama.py`, `qwen2.py`, `qwen3.py`)
run on the flat `[total_tokens, hidden]` buffer of sequences laid end to end; only attention sees the
sequence boundaries (a `PackInfo`). Nothing here imports transformers.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

# UnsupportedCheckpoint lives in embedcli.errors; the backbones keep importing it from here.
from embedcli.errors import UnsupportedCheckpoint as UnsupportedCheckpoint
from embedcli.models.kernels import fused_attention, fused_norm
from embedcli.models.kernels.gemm import gelu_tanh, linear
from embedcli.models.kernels.packing import (
    PackInfo,
    Window,
    flash_attn_available,
    grouped_attention,
    packed_attention,
)
from embedcli.models.registry import REGISTRY, unimplemented_key

StateDict = dict[str, torch.Tensor]


class JsonConfig(SimpleNamespace):
    """A model's config.json as attributes (missing keys raise AttributeError, so `getattr(c, k, None)` works)."""

    @classmethod
    def read(cls, folder: str | Path) -> JsonConfig:
        """Parse `folder/config.json`, with the defaults transformers' config classes would add."""
        with (Path(folder) / "config.json").open(encoding="utf-8") as f:
            data: dict[str, Any] = json.load(f)
        if "num_labels" not in data:
            # transformers: num_labels is len(id2label), 2 when the config names none.
            data["num_labels"] = len(data.get("id2label") or {}) or 2
        return cls(**data)

    def get(self, key: str, default: Any = None) -> Any:
        """The value of `key`, or `default` when the config lacks it or holds null."""
        value = getattr(self, key, None)
        return default if value is None else value


_INIT_FUNCTIONS = ("uniform_", "normal_", "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_", "ones_", "zeros_")


@contextlib.contextmanager
def skip_init_weights() -> Iterator[None]:
    """Modules built inside keep their freshly allocated (uninitialized) tensors: the checkpoint fills them.

    Random init costs time for nothing, and building on the meta device instead pulls in torch._dynamo
    (~0.8 s at start) through the meta kernels of `normal_`. transformers' `no_init_weights` does the same.
    """
    saved = {name: getattr(nn.init, name) for name in _INIT_FUNCTIONS}
    try:
        for name in _INIT_FUNCTIONS:
            setattr(nn.init, name, lambda tensor, *args, **kwargs: tensor)
        yield
    finally:
        for name, fn in saved.items():
            setattr(nn.init, name, fn)


def load_state_dict(folder: str | Path, files: Iterable[str]) -> StateDict:
    """Every tensor of the model's safetensors files, by the name the checkpoint saved it under."""
    from safetensors.torch import load_file

    state: StateDict = {}
    for name in files:
        path = Path(folder) / name
        if name.endswith(".safetensors"):
            state.update(load_file(str(path)))
        else:
            # Pickle weights come here only under --allow-pickle; weights_only still refuses pickled code.
            state.update(torch.load(path, map_location="cpu", weights_only=True, mmap=True))
    return state


class Weights:
    """Tensors of one checkpoint looked up under the model's prefix (`bert.`, `model.`, or none)."""

    def __init__(self, state: StateDict, prefixes: Iterable[str], probe: str) -> None:
        self.state = state
        found = [p for p in prefixes if p + probe in state]
        if not found:
            raise UnsupportedCheckpoint(f"no tensor {probe!r} under any of the prefixes {list(prefixes)}")
        self.prefix = found[0]

    def has(self, name: str) -> bool:
        """Whether the backbone tensor `name` exists (legacy `gamma`/`beta` layer-norm names included)."""
        return self._key(name) is not None

    def _key(self, name: str) -> str | None:
        key = self.prefix + name
        if key in self.state:
            return key
        # Old TF-converted checkpoints name layer-norm parameters gamma/beta; transformers renames them.
        legacy = self.prefix + name.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta")
        return legacy if legacy in self.state else None

    def __getitem__(self, name: str) -> torch.Tensor:
        key = self._key(name)
        if key is None:
            raise UnsupportedCheckpoint(f"tensor {self.prefix + name!r} is missing from the checkpoint")
        return self.state[key]

    def head(self, name: str) -> torch.Tensor | None:
        """A tensor outside the backbone (a classifier head's), by its full name; None if absent."""
        return self.state.get(name)


def copy_linear(module: nn.Linear, weights: Weights, *names: str) -> None:
    """Fill `module` from the Linear layers `names` (several are concatenated by rows: fused projections)."""
    module.weight.data.copy_(torch.cat([weights[f"{n}.weight"] for n in names]))
    if module.bias is not None:
        module.bias.data.copy_(torch.cat([weights[f"{n}.bias"] for n in names]))


def copy_norm(norm: nn.Module, weights: Weights, name: str) -> None:
    """Fill a LayerNorm / RMSNorm from `name.weight` (and `name.bias` when it has one)."""
    weight = norm.weight
    assert isinstance(weight, torch.Tensor)
    weight.data.copy_(weights[f"{name}.weight"])
    bias = getattr(norm, "bias", None)
    if bias is not None:
        bias.data.copy_(weights[f"{name}.bias"])


def _quick_gelu(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(1.702 * x)


# transformers' ACT2FN names; gelu_new / gelu_fast are the tanh approximation written out (equal to
# float32 rounding), `gelu` is the exact erf form.
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,
    "gelu_new": gelu_tanh,
    "gelu_fast": gelu_tanh,
    "gelu_pytorch_tanh": gelu_tanh,
    "quick_gelu": _quick_gelu,
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
    "tanh": torch.tanh,
}


def activation(name: object) -> Callable[[torch.Tensor], torch.Tensor]:
    """The activation transformers calls `name`."""
    try:
        return ACTIVATIONS[str(name)]
    except KeyError:
        raise UnsupportedCheckpoint(f"activation {name!r} is not implemented by the own backbones") from None


def varlen_attention(
    qkv: torch.Tensor,
    pack: PackInfo,
    heads: int,
    head_dim: int,
    *,
    kv_heads: int | None = None,
    causal: bool = False,
    bias: torch.Tensor | None = None,
    scale: float | None = None,
    window: Window | None = None,
) -> torch.Tensor:
    """Attention confined to each sequence, from a fused `[total, (heads + 2 kv_heads) * dim]` projection.

    Returns `[total, heads * dim]`. On x86-64 CPUs the fused kernel reads each sequence in place
    (`fused_attention`); elsewhere sequences are padded only here, in groups of similar length (see
    `packing.grouped_attention`): the fused rows are gathered once per group. `bias` is an additive
    `[1, heads, max_len, max_len]` bias by relative position (MPNet), without the key padding.
    `window`: each query sees only the keys within (left, right) tokens of it (`packing.Window`).
    """
    kv = kv_heads or heads
    total = qkv.shape[0]
    fused = qkv.view(total, heads + 2 * kv, head_dim)
    q, k, v = fused[:, :heads], fused[:, heads : heads + kv], fused[:, heads + kv :]
    if fused_attention.applies(q, k, v, pack, bias):
        out = fused_attention.attention(q, k, v, pack, scale=scale, causal=causal, window=window, bias=bias)
        return out.view(total, heads * head_dim)
    if bias is None and not pack.query_only and flash_attn_available(qkv.device) and qkv.dtype != torch.float32:
        q, k, v = qkv.split([heads * head_dim, kv * head_dim, kv * head_dim], dim=-1)
        out = packed_attention(
            q.view(total, heads, head_dim), k.view(total, kv, head_dim), v.view(total, kv, head_dim),
            pack, causal=causal, scale=scale, window=window,
        )
        return out.reshape(total, heads * head_dim)
    out = grouped_attention(
        [fused], lambda t: t[0].split([heads, kv, kv], dim=1), pack,
        causal=causal, scale=scale, bias=bias, gqa=kv != heads, window=window,
    )
    return out.reshape(total, heads * head_dim)


class EncoderLayer(nn.Module):
    """A post-norm transformer encoder layer (BERT, RoBERTa, DistilBERT, MPNet) with a fused QKV projection."""

    def __init__(self, hidden: int, heads: int, intermediate: int, eps: float, act: str) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.attn_out = nn.Linear(hidden, hidden)
        self.attn_norm = nn.LayerNorm(hidden, eps=eps)
        self.up = nn.Linear(hidden, intermediate)
        self.down = nn.Linear(intermediate, hidden)
        self.out_norm = nn.LayerNorm(hidden, eps=eps)
        self.act = activation(act)

    def load(self, weights: Weights, names: Mapping[str, str | tuple[str, ...]]) -> None:
        """Copy the layer's tensors; `names` maps qkv (three names), attn_out, attn_norm, up, down, out_norm."""
        qkv = names["qkv"]
        copy_linear(self.qkv, weights, *(qkv if isinstance(qkv, tuple) else (qkv,)))
        for part in ("attn_out", "up", "down"):
            copy_linear(getattr(self, part), weights, str(names[part]))
        copy_norm(self.attn_norm, weights, str(names["attn_norm"]))
        copy_norm(self.out_norm, weights, str(names["out_norm"]))

    def forward(self, x: torch.Tensor, pack: PackInfo, bias: torch.Tensor | None = None) -> torch.Tensor:
        context = varlen_attention(linear(self.qkv, x), pack, self.heads, self.head_dim, bias=bias)
        x, x_in = add_norm(linear(self.attn_out, context), x, self.attn_norm)
        return add_norm(linear(self.down, linear(self.up, x_in, self.act)), x, self.out_norm)[0]


def add_norm(h: torch.Tensor, x: torch.Tensor, norm: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """`norm(h + x)`, and the same rows as the next linear reads them (bf16 under CPU autocast where the fused
    kernel made that copy in its pass, else the result itself)."""
    if fused_norm.applies(h, x, norm):
        return fused_norm.add_layer_norm(h, x, norm)  # type: ignore[arg-type]  # applies() checked it is a LayerNorm
    y = norm(h + x)
    return y, y


def check_registry(config: JsonConfig) -> None:
    """Refuse, at construction, a config whose registry entry says the own backbone does not compute it.

    The registry's plan has already sent such a checkpoint to the fallback; this guards a backbone built any
    other way, from the same declarations (the registry is the one source of which values are implemented).
    """
    model_type = str(config.get("model_type", ""))
    entry = REGISTRY.get(model_type)
    if entry is None or entry.backbone is None:
        raise UnsupportedCheckpoint(f"model_type {model_type!r} has no own backbone in the registry")
    key = unimplemented_key(entry, vars(config))
    if key is not None:
        raise UnsupportedCheckpoint(f"{key} is not implemented by the own backbone")

