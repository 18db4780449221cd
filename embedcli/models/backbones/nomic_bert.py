"""NomicBERT (nomic-embed-text-v1 / v1.5, model_type `nomic_bert`) on the packed buffer, without remote code.

The checkpoint's config.json uses GPT-2 style keys (n_embd, n_head, ...) read by its remote code
(nomic-ai/nomic-bert-2048 `modeling_hf_nomic_bert.py`): word (+ token type) embeddings and LayerNorm,
then post-norm layers with rotary attention (`Wqkv`, `out_proj`) and a gated MLP (`fc11` up, `fc12`
gate, `fc2`). A folder without `auto_map` is loaded by transformers' own `nomic_bert` model instead,
which reads the BERT style keys and has no biases; such a folder is served only where both readings
compute the same numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, cast

import torch
import torch.nn.functional as F
from torch import nn

from embedcli.models.backbones.layers import (
    JsonConfig,
    UnsupportedCheckpoint,
    Weights,
    check_registry,
    copy_linear,
    copy_norm,
)
from embedcli.models.backbones.rope import default_inv_freq, rope_tables
from embedcli.models.backbones.rope_encoder import RopeEncoderLayer
from embedcli.models.kernels.packing import PackInfo
from embedcli.models.registry import nomic_intermediate

# The remote code's gated activations: `glu` is F.glu (up * sigmoid(gate)), `geglu` the exact erf GELU.
GATED_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "swiglu": F.silu,
    "geglu": F.gelu,
    "glu": torch.sigmoid,
}
def _intermediate(config: JsonConfig) -> int:
    """The gated MLP's width (see `registry.nomic_intermediate`)."""
    return nomic_intermediate(vars(config))


class NomicBertModel(nn.Module):
    """The NomicBERT encoder (no pooler): token ids of packed sequences in, last hidden states out."""

    prefixes: ClassVar[tuple[str, ...]] = ("",)
    token_types: ClassVar[bool] = True

    def __init__(self, config: JsonConfig) -> None:
        super().__init__()
        self.check(config)
        self.config = config
        hidden, heads = int(config.n_embd), int(config.n_head)
        head_dim = hidden // heads
        multiple = int(config.get("pad_vocab_size_multiple", 1))
        vocab = int(config.vocab_size)
        vocab += (multiple - vocab % multiple) % multiple
        self.word_embeddings = nn.Embedding(vocab, hidden)
        types = int(config.get("type_vocab_size", 2))
        self.token_type_embeddings = nn.Embedding(types, hidden) if types > 0 else None
        eps = float(config.get("layer_norm_epsilon", 1e-5))
        self.embed_norm = nn.LayerNorm(hidden, eps=eps)
        self.interleaved = bool(config.get("rotary_emb_interleaved", False))
        qkv_bias = bool(config.get("qkv_proj_bias", True))
        self.layers = nn.ModuleList(
            RopeEncoderLayer(
                hidden, heads, _intermediate(config),
                qkv_bias=qkv_bias, out_bias=qkv_bias,
                up_bias=bool(config.get("mlp_fc1_bias", True)), down_bias=bool(config.get("mlp_fc2_bias", True)),
                act=GATED_ACTIVATIONS[str(config.activation_function)],
                norm=lambda n: nn.LayerNorm(n, eps=eps),
                interleaved=self.interleaved,
            )
            for _ in range(int(config.n_layer))
        )
        self.rot_dim = int(head_dim * float(config.rotary_emb_fraction))
        self.base = float(config.get("rotary_emb_base", 10000))
        # Dynamic NTK (remote code only; transformers' nomic_bert ignores the key): the base grows for
        # sequences longer than max_trained_positions.
        factor = config.get("rotary_scaling_factor") if config.get("auto_map") else None
        self.ntk_factor = float(factor) if factor else None
        self.trained_positions = int(config.get("max_trained_positions", 2048))
        self._inv_freq: torch.Tensor | None = None

    @classmethod
    def check(cls, config: JsonConfig) -> None:
        """Refuse config values this implementation does not compute exactly (the registry entry's keys)."""
        check_registry(config)
        if config.get("vocab_size") is None or int(config.n_embd) % int(config.n_head):
            raise UnsupportedCheckpoint("nomic_bert head layout (n_embd % n_head) or no vocab_size")

    def load(self, state: dict[str, torch.Tensor]) -> Weights:
        """Copy the checkpoint's tensors in (fusing the MLP's up and gate halves)."""
        weights = Weights(state, self.prefixes, "embeddings.word_embeddings.weight")
        word = weights["embeddings.word_embeddings.weight"]
        if word.shape != self.word_embeddings.weight.shape:
            raise UnsupportedCheckpoint(f"word embeddings {tuple(word.shape)} for a padded vocabulary of {self.word_embeddings.num_embeddings}")
        self.word_embeddings.weight.data.copy_(word)
        if self.token_type_embeddings is not None:
            self.token_type_embeddings.weight.data.copy_(weights["embeddings.token_type_embeddings.weight"])
        copy_norm(self.embed_norm, weights, "emb_ln")
        for i, layer in enumerate(cast("list[RopeEncoderLayer]", self.layers)):
            p = f"encoder.layers.{i}."
            copy_linear(layer.qkv, weights, f"{p}attn.Wqkv")
            copy_linear(layer.attn_out, weights, f"{p}attn.out_proj")
            copy_linear(layer.gate_up, weights, f"{p}mlp.fc11", f"{p}mlp.fc12")
            copy_linear(layer.down, weights, f"{p}mlp.fc2")
            copy_norm(layer.attn_norm, weights, f"{p}norm1")
            copy_norm(layer.mlp_norm, weights, f"{p}norm2")
        return weights

    def inv_freq(self, pack: PackInfo, device: torch.device) -> torch.Tensor:
        """`[rot_dim / 2]` inverse frequencies, or per token `[total, rot_dim / 2]` when a sequence is NTK-scaled."""
        if self._inv_freq is None or self._inv_freq.device != device:
            self._inv_freq = default_inv_freq(self.base, self.rot_dim).to(device)
        factor, trained = self.ntk_factor, self.trained_positions
        if factor is None or pack.max_len <= trained:
            return self._inv_freq
        # The remote code rescales the base by the (padded) length of the forward; here each sequence by
        # its own length, which is what it computes for that text encoded alone.
        rows = []
        for n in pack.lengths:
            if n > trained:
                base = self.base * ((factor * n / trained) - (factor - 1)) ** (self.rot_dim / (self.rot_dim - 2))
                rows.append(default_inv_freq(base, self.rot_dim).to(device).expand(n, -1))
            else:
                rows.append(self._inv_freq.expand(n, -1))
        return torch.cat(rows)

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
        with torch.autocast(device_type=x.device.type, enabled=False):
            cos, sin = rope_tables(positions, self.inv_freq(pack, x.device), x.dtype, interleaved=self.interleaved)
        for layer in self.layers:
            x = layer(x, cos, sin, pack)
        return x

