"""The token projection of late-interaction heads: one Linear applied to every token's hidden state.

ColBERT (Stanford's root `linear.weight`, PyLate's Dense) projects each token `[n, hidden] -> [n, dim]` without
a bias; BGE-M3's `colbert_linear` has one. The token embedding head then L2-normalizes each row
(`TokenEmbeddingPoolerHead`: projector -> normalize), so `--no-normalize` / `--raw-scores` still reach it.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from embedcli.errors import ModelConfigError


class TokenProjection(nn.Module):
    """`Linear(hidden, dim)` over token rows, float32; bias only where the checkpoint has one."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        out_features, in_features = weight.shape
        self.linear = nn.Linear(int(in_features), int(out_features), bias=bias is not None)
        with torch.no_grad():
            self.linear.weight.copy_(weight.to(torch.float32))
            if bias is not None:
                self.linear.bias.copy_(bias.to(torch.float32))
        self.linear.requires_grad_(False)

    @property
    def dim(self) -> int:
        """Width of each projected token vector."""
        return int(self.linear.out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.to(self.linear.weight.dtype))


def load_token_projection(path: Path, weight: str, bias: str | None = None, shape: tuple[int, int] | None = None) -> TokenProjection:
    """A `TokenProjection` from tensors `weight` (and `bias`) of a safetensors file, read alone (not the whole
    file: Stanford ColBERT keeps its projection beside the encoder's tensors)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        names = set(f.keys())
        if weight not in names:
            raise ModelConfigError(f"{path}: no {weight!r} tensor; the token projection cannot be loaded")
        w = f.get_tensor(weight)
        b = f.get_tensor(bias) if bias is not None and bias in names else None
    if w.dim() != 2 or (shape is not None and tuple(w.shape) != shape):
        raise ModelConfigError(f"{path}: {weight} has shape {list(w.shape)}, expected {list(shape or ('dim', 'hidden'))}")
    return TokenProjection(w, b)
