"""BGE-M3's three outputs over the packed buffer, as FlagEmbedding's `BGEM3FlagModel.encode` computes them.

- **dense**: the `[CLS]` row, L2-normalized (the sentence-transformers Pooling(cls) + Normalize it ships).
- **sparse** (lexical weights): `relu(sparse_linear(h))` per token, the max over each token id's occurrences,
  the tokenizer's cls / eos / pad / unk ids left out, and weights of 0 dropped; as `(indices, values)` sorted
  by index (the SPLADE output's shape), where FlagEmbedding returns `{str(token_id): weight}`.
- **colbert**: `normalize(colbert_linear(h))` of every token after the first (the `[CLS]` row is dropped; the
  final `</s>` stays, as in FlagEmbedding's `colbert_vecs[:tokens_num - 1]` of `h[:, 1:]`).

`M3HybridPooler` serves any subset of the three from the hidden states of one forward.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from embedcli.pooling.metadata import PoolingMetadata
from embedcli.pooling.params import PoolingConfigError
from embedcli.pooling.poolers import Pooler

M3_OUTPUTS: tuple[str, ...] = ("dense", "sparse", "colbert")
SparseRow = tuple[torch.Tensor, torch.Tensor]  # (indices int64 [nnz] sorted, values float32 [nnz])


def _bounds(metadata: PoolingMetadata) -> list[int]:
    cursor = metadata.cursor
    if cursor.is_partial_prefill():
        raise PoolingConfigError("BGE-M3 pooling needs whole sequences in one forward (no sliced prefill)")
    cu = [int(b) for b in cursor.cu_seqlens().tolist()]
    return [b - cu[0] for b in cu]


def _head_input(hidden: torch.Tensor, head: nn.Module) -> torch.Tensor:
    # `--dtype auto` may settle on a bf16 backbone while the heads keep their float32 weights.
    return hidden.to(next(head.parameters()).dtype)


def lexical_weights(weights: torch.Tensor, ids: torch.Tensor, skip: torch.Tensor) -> SparseRow:
    """One sequence's lexical weights: the max weight per token id, `skip` ids and zero weights left out."""
    keep = (weights > 0) & ~torch.isin(ids, skip)
    kept_ids, kept = ids[keep], weights[keep].float()
    indices, inverse = torch.unique(kept_ids, sorted=True, return_inverse=True)
    values = torch.zeros(len(indices), dtype=torch.float32, device=weights.device)
    values = values.scatter_reduce(0, inverse, kept, reduce="amax", include_self=False)
    return indices.to(torch.int64), values


class M3SparsePooler(Pooler):
    """BGE-M3's lexical weights of each sequence (see the module docstring)."""

    def __init__(self, sparse_linear: nn.Module, skip_ids: tuple[int, ...]) -> None:
        super().__init__()
        self.sparse_linear = sparse_linear
        self.skip_ids = torch.tensor(sorted(set(skip_ids)), dtype=torch.int64)  # moved to the buffer's device per call

    def get_supported_tasks(self) -> set[str]:
        return {"sparse_embed"}

    def requires_token_ids(self) -> bool:
        return True

    def pool(self, hidden: torch.Tensor, token_ids: torch.Tensor, bounds: list[int]) -> list[SparseRow]:
        """Lexical weights of each sequence of a packed `[total, hidden]` buffer."""
        weights = torch.relu(self.sparse_linear(_head_input(hidden, self.sparse_linear))).squeeze(-1)
        ids = token_ids.to(weights.device)
        skip = self.skip_ids.to(weights.device)
        return [lexical_weights(weights[lo:hi], ids[lo:hi], skip) for lo, hi in itertools.pairwise(bounds)]

    def forward(self, hidden_states: torch.Tensor, metadata: PoolingMetadata) -> list[SparseRow]:  # type: ignore[override]  # sparse (indices, values) pairs, not dense rows
        if metadata.token_ids is None:
            raise PoolingConfigError("BGE-M3 lexical weights need the token ids of the buffer")
        return self.pool(hidden_states, metadata.token_ids, _bounds(metadata))


class M3ColbertPooler(Pooler):
    """BGE-M3's colbert vectors of each sequence: `normalize(colbert_linear(h))` of every token but the first."""

    def __init__(self, colbert_linear: nn.Module) -> None:
        super().__init__()
        self.colbert_linear = colbert_linear

    def get_supported_tasks(self) -> set[str]:
        return {"token_embed"}

    def drops_first_token(self) -> bool:
        return True

    def pool(self, hidden: torch.Tensor, bounds: list[int]) -> list[torch.Tensor]:
        """Colbert vectors (`[n - 1, dim]`) of each sequence of a packed buffer."""
        vectors = F.normalize(self.colbert_linear(_head_input(hidden, self.colbert_linear)).float(), dim=-1)
        return [vectors[min(lo + 1, hi):hi] for lo, hi in itertools.pairwise(bounds)]

    def forward(self, hidden_states: torch.Tensor, metadata: PoolingMetadata) -> list[torch.Tensor]:  # type: ignore[override]  # one matrix per sequence
        return self.pool(hidden_states, _bounds(metadata))


class M3HybridPooler(Pooler):
    """Several of BGE-M3's outputs from the hidden states of one forward: one `{output: value}` per sequence."""

    def __init__(self, dense: Pooler, sparse: M3SparsePooler, colbert: M3ColbertPooler, outputs: tuple[str, ...]) -> None:
        super().__init__()
        unknown = [o for o in outputs if o not in M3_OUTPUTS]
        if unknown or not outputs:
            raise PoolingConfigError(f"BGE-M3 outputs {list(outputs)}: choose from {', '.join(M3_OUTPUTS)}")
        self.dense = dense
        self.sparse = sparse
        self.colbert = colbert
        self.outputs = outputs

    def get_supported_tasks(self) -> set[str]:
        return {"hybrid_embed"}

    def requires_token_ids(self) -> bool:
        return "sparse" in self.outputs

    def forward(self, hidden_states: torch.Tensor, metadata: PoolingMetadata) -> list[dict[str, Any]]:  # type: ignore[override]  # one dict of outputs per sequence
        bounds = _bounds(metadata)
        rows: list[dict[str, Any]] = [{} for _ in range(len(bounds) - 1)]
        if "dense" in self.outputs:
            for row, vector in zip(rows, self.dense(hidden_states, metadata), strict=True):
                row["dense"] = vector
        if "sparse" in self.outputs:
            if metadata.token_ids is None:
                raise PoolingConfigError("BGE-M3 lexical weights need the token ids of the buffer")
            for row, pair in zip(rows, self.sparse.pool(hidden_states, metadata.token_ids, bounds), strict=True):
                row["sparse"] = pair
        if "colbert" in self.outputs:
            for row, matrix in zip(rows, self.colbert.pool(hidden_states, bounds), strict=True):
                row["colbert"] = matrix
        return rows
