"""SPLADE pooling: a masked-LM head over the packed buffer, `log1p(relu(logits))`, max or sum over each sequence.

The `[tokens, vocab]` logits are never built for the whole buffer: the head runs on slices of at most
`chunk_tokens` tokens (the vocabulary is 30k-250k wide, so 2048 tokens x 250k float32 would be 2 GB), and
each slice is reduced into its sequences' running vectors at once. Sequences straddling a slice boundary carry
one partial row into the next slice. Each sequence comes out as `(indices, values)`: the non-zero entries
sorted by index (optionally only its `top_k` largest, as sentence-transformers' `max_active_dims`).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from embedcli.errors import PoolingConfigError
from embedcli.pooling.metadata import PoolingMetadata
from embedcli.pooling.poolers import Pooler

SpladeReduce = Literal["max", "sum"]
SpladeActivation = Literal["relu", "log1p_relu"]
SparseVector = tuple[torch.Tensor, torch.Tensor]  # (indices int64 [nnz], values float32 [nnz]), sorted by index

# Rows of the MLM head per call: 256 tokens x 250k vocab x 4 bytes = 256 MB at most, 31 MB for BERT's 30k.
DEFAULT_CHUNK_TOKENS = 128


def splade_activation(logits: torch.Tensor, activation: SpladeActivation = "relu") -> torch.Tensor:
    """`log1p(relu(x))` in float32 (`log1p(log1p(relu(x)))` for OpenSearch's `log1p_relu`), in place where it can."""
    x = logits.float().relu_().log1p_()
    if activation == "log1p_relu":
        x = x.log1p_()
    return x


def to_sparse(vector: torch.Tensor, top_k: int | None = None) -> SparseVector:
    """The non-zero entries of a `[vocab]` vector, sorted by index; only the `top_k` largest when given."""
    if top_k is not None and top_k < int((vector != 0).sum()):
        # sentence-transformers' max_active_dims: keep the top-k values (torch.topk), zero the rest.
        values, indices = torch.topk(vector, top_k)
        keep = values != 0
        indices, values = indices[keep], values[keep]
        order = torch.argsort(indices)
        return indices[order], values[order]
    indices = torch.nonzero(vector, as_tuple=True)[0]
    return indices, vector[indices]


class SpladePooler(Pooler):
    """Masked-LM head → `log1p(relu)` → max/sum over each sequence's tokens → sparse `(indices, values)`."""

    supported_tasks = frozenset({"sparse_embed"})

    def __init__(
        self,
        mlm_head: nn.Module,
        reduce: SpladeReduce = "max",
        activation: SpladeActivation = "relu",
        top_k: int | None = None,
        chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    ) -> None:
        super().__init__()
        if reduce not in ("max", "sum"):
            raise PoolingConfigError(f"SPLADE pooling {reduce!r}: choose max or sum")
        if activation not in ("relu", "log1p_relu"):
            raise PoolingConfigError(f"SPLADE activation {activation!r}: choose relu or log1p_relu")
        if top_k is not None and top_k < 1:
            raise PoolingConfigError(f"--sparse-top-k {top_k}: must be at least 1")
        if chunk_tokens < 1:
            raise PoolingConfigError(f"SPLADE chunk size {chunk_tokens}: must be at least 1")
        self.mlm_head = mlm_head
        self.reduce = reduce
        self.activation = activation
        self.top_k = top_k
        self.chunk_tokens = chunk_tokens

    def get_supported_tasks(self) -> set[str]:
        return set(self.supported_tasks)

    def forward(self, hidden_states: torch.Tensor, metadata: PoolingMetadata) -> list[SparseVector]:  # type: ignore[override]  # sparse (indices, values) pairs, not dense rows
        cursor = metadata.cursor
        if cursor.is_partial_prefill():
            # Sliced prefill is for decoders; a masked LM's sequences are always whole in one forward.
            raise PoolingConfigError("SPLADE pooling needs whole sequences in one forward (no sliced prefill)")
        return self.pool_packed(hidden_states, cursor.cu_seqlens().tolist())

    def pool_packed(self, hidden_states: torch.Tensor, cu_seqlens: list[int]) -> list[SparseVector]:
        """One sparse vector per sequence of a packed `[total, hidden]` buffer with boundaries `cu_seqlens`."""
        bounds = [int(b) - int(cu_seqlens[0]) for b in cu_seqlens]
        num_seqs, total = len(bounds) - 1, bounds[-1]
        reduce = _amax if self.reduce == "max" else _sum
        out: list[SparseVector] = []
        carry: torch.Tensor | None = None  # running vector of the sequence still open at the last slice's end
        seq = 0
        # `--dtype auto` may settle on a bf16 backbone while the head keeps the float32 weights it was loaded with.
        head_dtype = next(self.mlm_head.parameters()).dtype
        for start in range(0, total, self.chunk_tokens):
            end = min(start + self.chunk_tokens, total)
            act = splade_activation(self.mlm_head(hidden_states[start:end].to(head_dtype)), self.activation)
            while seq < num_seqs and bounds[seq] < end:
                lo, hi = max(bounds[seq], start), min(bounds[seq + 1], end)
                part = reduce(act[lo - start : hi - start]) if hi > lo else None
                if carry is not None:
                    part = carry if part is None else (torch.maximum(carry, part) if self.reduce == "max" else carry + part)
                    carry = None
                if bounds[seq + 1] > end:
                    carry = part
                    break
                out.append(_empty(act) if part is None else to_sparse(part, self.top_k))
                seq += 1
            del act
        # Whatever is left has no tokens (a zero-length sequence pools to the zero vector).
        out.extend(_empty(hidden_states) for _ in range(num_seqs - seq))
        return out


def _amax(x: torch.Tensor) -> torch.Tensor:
    return x.amax(dim=0)


def _sum(x: torch.Tensor) -> torch.Tensor:
    return x.sum(dim=0)


def _empty(like: torch.Tensor) -> SparseVector:
    return (
        torch.zeros(0, dtype=torch.int64, device=like.device),
        torch.zeros(0, dtype=torch.float32, device=like.device),
    )

