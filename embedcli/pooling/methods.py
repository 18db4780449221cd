"""Pooling methods over a packed `[num_tokens, hidden]` buffer: CLS, LAST, MEAN (sequence) and ALL, STEP (token)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Literal, Protocol, Self

import torch
from torch import nn

from embedcli.pooling.metadata import PoolingCursor, PoolingMetadata, PoolingState
from embedcli.pooling.params import POOLING_TASKS

# vLLM `_MEAN_POOL_ACCUMULATION_CHUNK_BYTES`: the float32 upcast of at most this many bytes of
# hidden states exists at once, so MEAN's temporary memory does not grow with the batch.
MEAN_POOL_CHUNK_BYTES = 16 * 1024 * 1024

TokenPoolerOutput = list[torch.Tensor | None]


class PoolingMethod(nn.Module, ABC):
    """Turns the hidden states of a packed forward into per-sequence results."""

    def get_supported_tasks(self) -> set[str]:
        """Tasks this method can serve."""
        return set(POOLING_TASKS)

    def requires_token_ids(self) -> bool:
        """Whether the metadata must carry the token ids of the buffer."""
        return False

    def carries_slices(self) -> bool:
        """Whether a sequence split over the slices of a chunked prefill pools to its whole-sequence result."""
        return False


class Partial(Protocol):
    """Per-sequence partial pooling results of the tokens seen so far, one row per sequence."""

    def row(self, i: int) -> Self:
        """The partial results of sequence `i` alone (a copy)."""
        ...

    def put(self, i: int, other: Self) -> None:
        """Overwrite sequence `i` with the one-row `other`."""
        ...

    def merge(self, later: Self) -> Self:
        """Combine with the partial results of the tokens that follow (same sequences, in order)."""
        ...


@dataclass
class RowPartial:
    """One carried row per sequence: summed (MEAN), the earliest kept (CLS) or the latest kept (LAST)."""

    values: torch.Tensor  # [n, h]
    keep: Literal["sum", "first", "last"]

    def row(self, i: int) -> RowPartial:
        return RowPartial(self.values[i : i + 1].clone(), self.keep)

    def put(self, i: int, other: RowPartial) -> None:
        self.values[i] = other.values[0]

    def merge(self, later: RowPartial) -> RowPartial:
        if self.keep == "sum":
            return RowPartial(self.values + later.values, "sum")
        return self if self.keep == "first" else later


class SequencePoolingMethod(PoolingMethod):
    """One vector per sequence; a sliced sequence carries its `Partial` results from slice to slice.

    Chunked prefill pools each forward with `accumulate`, merges a sliced sequence's rows into the ones it
    carries (`Partial.merge`), and `finish`es them; on whole sequences that is `forward` itself.
    """

    def carries_slices(self) -> bool:
        return True

    @abstractmethod
    def accumulate(self, hidden_states: torch.Tensor, metadata: PoolingMetadata | PoolingCursor) -> Partial:
        """Partial results of this forward's tokens, one row per sequence."""

    @abstractmethod
    def finish(self, partial: Partial, cursor: PoolingCursor) -> torch.Tensor:
        """The pooled `[num_seqs, hidden]` vectors from partial results that cover whole sequences."""

    @abstractmethod
    def forward(self, hidden_states: torch.Tensor, metadata: PoolingMetadata | PoolingCursor) -> torch.Tensor:
        """Pool `[num_tokens, hidden]` into `[num_seqs, hidden]`."""


def _cursor(metadata: PoolingMetadata | PoolingCursor) -> PoolingCursor:
    return metadata.cursor if isinstance(metadata, PoolingMetadata) else metadata


def _reject_partial_prefill(cursor: PoolingCursor, name: str) -> None:
    if cursor.is_partial_prefill():
        raise RuntimeError(f"{name} pooling does not support partial prefill")


class CLSPool(SequencePoolingMethod):
    """The hidden state of each sequence's first token."""

    def accumulate(self, hidden_states: torch.Tensor, metadata: PoolingMetadata | PoolingCursor) -> RowPartial:
        # In a later slice this row is not the sequence's first token; merging keeps the first slice's.
        cursor = _cursor(metadata)
        return RowPartial(hidden_states[cursor.first_token_indices.to(hidden_states.device)], "first")

    def finish(self, partial: Partial, cursor: PoolingCursor) -> torch.Tensor:
        assert isinstance(partial, RowPartial)
        return partial.values

    def forward(self, hidden_states: torch.Tensor, metadata: PoolingMetadata | PoolingCursor) -> torch.Tensor:
        cursor = _cursor(metadata)
        _reject_partial_prefill(cursor, "CLS")
        return self.finish(self.accumulate(hidden_states, cursor), cursor)


class LastPool(SequencePoolingMethod):
    """The hidden state of each sequence's last scheduled token (partial prefill allowed)."""

    def accumulate(self, hidden_states: torch.Tensor, metadata: PoolingMetadata | PoolingCursor) -> RowPartial:
        cursor = _cursor(metadata)
        return RowPartial(hidden_states[cursor.last_token_indices.to(hidden_states.device)], "last")

    def finish(self, partial: Partial, cursor: PoolingCursor) -> torch.Tensor:
        assert isinstance(partial, RowPartial)
        return partial.values

    def forward(self, hidden_states: torch.Tensor, metadata: PoolingMetadata | PoolingCursor) -> torch.Tensor:
        cursor = _cursor(metadata)
        return self.finish(self.accumulate(hidden_states, cursor), cursor)


def segment_sum_float32(
    hidden_states: torch.Tensor,
    num_tokens_per_seq: torch.Tensor,
    chunk_bytes: int = MEAN_POOL_CHUNK_BYTES,
) -> torch.Tensor:
    """Per-sequence float32 sums of consecutive row segments, upcasting at most `chunk_bytes` at a time."""
    num_seqs = int(num_tokens_per_seq.numel())
    hidden = hidden_states.shape[-1]
    device = hidden_states.device
    sums = torch.zeros(num_seqs, hidden, dtype=torch.float32, device=device)
    total = int(num_tokens_per_seq.sum()) if num_seqs else 0
    if total == 0:
        return sums
    segment_ids = torch.repeat_interleave(
        torch.arange(num_seqs, device=device), num_tokens_per_seq.to(device)
    )
    chunk_tokens = max(1, chunk_bytes // (hidden * 4))
    for start in range(0, total, chunk_tokens):
        end = min(start + chunk_tokens, total)
        sums.index_add_(0, segment_ids[start:end], hidden_states[start:end].to(torch.float32))
    return sums


class MeanPool(SequencePoolingMethod):
    """The float32 mean of each sequence's token states, accumulated in bounded chunks."""

    def __init__(self, chunk_bytes: int = MEAN_POOL_CHUNK_BYTES) -> None:
        super().__init__()
        if chunk_bytes < 1:
            raise ValueError("chunk_bytes must be positive")
        self.chunk_bytes = chunk_bytes

    def accumulate(self, hidden_states: torch.Tensor, metadata: PoolingMetadata | PoolingCursor) -> RowPartial:
        cursor = _cursor(metadata)
        return RowPartial(segment_sum_float32(hidden_states, cursor.num_scheduled_tokens, self.chunk_bytes), "sum")

    def finish(self, partial: Partial, cursor: PoolingCursor) -> torch.Tensor:
        assert isinstance(partial, RowPartial)
        sums = partial.values
        if len(cursor) == 0:
            return sums
        # Divide by the whole prompt length: the flat buffer has no padding to mask. (vLLM rejects MEAN on
        # a partial prefill; the sums carried across slices make it exact here.)
        return sums / cursor.prompt_lens.to(sums.device, torch.float32).unsqueeze(1)

    def forward(self, hidden_states: torch.Tensor, metadata: PoolingMetadata | PoolingCursor) -> torch.Tensor:
        cursor = _cursor(metadata)
        _reject_partial_prefill(cursor, "MEAN")
        return self.finish(self.accumulate(hidden_states, cursor), cursor)


SEQ_METHODS: dict[str, type[SequencePoolingMethod]] = {"CLS": CLSPool, "LAST": LastPool, "MEAN": MeanPool}


class TokenPoolingMethod(PoolingMethod):
    """One matrix of rows per sequence; `None` while a sliced sequence is unfinished."""

    @abstractmethod
    def forward(self, hidden_states: torch.Tensor, metadata: PoolingMetadata) -> TokenPoolerOutput:
        """Pool `[num_tokens, hidden]` into per-sequence matrices."""


class AllPool(TokenPoolingMethod):
    """Every token state of each sequence; slices of a chunked prefill are concatenated at the end."""

    def get_supported_tasks(self) -> set[str]:
        return {"token_embed", "token_classify"}

    def carries_slices(self) -> bool:
        return True  # through `PoolingMetadata.pooling_states`

    def _gather(self, hidden_states: torch.Tensor, metadata: PoolingMetadata) -> TokenPoolerOutput:
        cursor = metadata.cursor
        pieces = list(torch.split(hidden_states[: cursor.num_tokens], cursor.num_scheduled_tokens.tolist()))
        if not cursor.is_partial_prefill() and metadata.pooling_states is None:
            return pieces  # type: ignore[return-value]  # whole sequences: a list of tensors is the token output
        states = metadata.pooling_states
        if states is None:
            raise RuntimeError("Chunked prefill with ALL pooling needs per-sequence pooling_states")
        finished = cursor.is_finished().tolist()
        out: TokenPoolerOutput = []
        for piece, state, done in zip(pieces, states, finished, strict=True):
            state.hidden_states_cache.append(piece)
            if not done:
                out.append(None)
                continue
            cache = state.hidden_states_cache
            out.append(cache[0] if len(cache) == 1 else torch.cat(cache))
            state.hidden_states_cache = []
        return out

    def forward(self, hidden_states: torch.Tensor, metadata: PoolingMetadata) -> TokenPoolerOutput:
        return self._gather(hidden_states, metadata)


class StepPool(AllPool):
    """ALL pooling kept only at rows whose input token is `step_tag_id`, columns in `returned_token_ids`."""

    def requires_token_ids(self) -> bool:
        return True

    def _token_ids(self, metadata: PoolingMetadata) -> list[torch.Tensor | None]:
        pieces = metadata.split_token_ids()
        states = metadata.pooling_states
        if states is None:
            return list(pieces)
        finished = metadata.cursor.is_finished().tolist()
        out: list[torch.Tensor | None] = []
        for piece, state, done in zip(pieces, states, finished, strict=True):
            state.token_ids_cache.append(piece)
            if not done:
                out.append(None)
                continue
            cache = state.token_ids_cache
            out.append(cache[0] if len(cache) == 1 else torch.cat(cache))
            state.token_ids_cache = []
        return out

    def forward(self, hidden_states: torch.Tensor, metadata: PoolingMetadata) -> TokenPoolerOutput:
        token_ids = self._token_ids(metadata)
        pooled = self._gather(hidden_states, metadata)
        out: TokenPoolerOutput = []
        for data, ids, params in zip(pooled, token_ids, metadata.pooling_params, strict=True):
            if data is None:
                out.append(None)
                continue
            if params.returned_token_ids:
                data = data[:, torch.as_tensor(params.returned_token_ids, device=data.device)]
            if params.step_tag_id is not None:
                assert ids is not None
                data = data[ids.to(data.device) == params.step_tag_id]
            out.append(data)
        return out


_TOK_METHODS: dict[str, type[TokenPoolingMethod]] = {"ALL": AllPool, "STEP": StepPool}


def get_tok_pooling_method(pooling_type: str) -> TokenPoolingMethod:
    """The token pooling method named `ALL` or `STEP`."""
    try:
        return _TOK_METHODS[pooling_type]()
    except KeyError:
        raise NotImplementedError(f"Unsupported token pooling type: {pooling_type!r}") from None


__all__ = [
    "AllPool",
    "CLSPool",
    "LastPool",
    "MeanPool",
    "Partial",
    "PoolingState",
    "RowPartial",
    "StepPool",
    "get_tok_pooling_method",
    "segment_sum_float32",
]
