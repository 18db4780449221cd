"""Pooling methods over a packed `[num_tokens, hidden]` buffer: CLS, LAST, MEAN (sequence) and ALL, STEP (token)."""

from __future__ import annotations

from abc import ABC, abstractmethod

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


class SequencePoolingMethod(PoolingMethod):
    """One vector per sequence."""

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

    def forward(self, hidden_states: torch.Tensor, metadata: PoolingMetadata | PoolingCursor) -> torch.Tensor:
        cursor = _cursor(metadata)
        _reject_partial_prefill(cursor, "CLS")
        return hidden_states[cursor.first_token_indices.to(hidden_states.device)]


class LastPool(SequencePoolingMethod):
    """The hidden state of each sequence's last scheduled token (partial prefill allowed)."""

    def forward(self, hidden_states: torch.Tensor, metadata: PoolingMetadata | PoolingCursor) -> torch.Tensor:
        cursor = _cursor(metadata)
        return hidden_states[cursor.last_token_indices.to(hidden_states.device)]


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

    def forward(self, hidden_states: torch.Tensor, metadata: PoolingMetadata | PoolingCursor) -> torch.Tensor:
        cursor = _cursor(metadata)
        _reject_partial_prefill(cursor, "MEAN")
        sums = segment_sum_float32(hidden_states, cursor.num_scheduled_tokens, self.chunk_bytes)
        if len(cursor) == 0:
            return sums
        # Divide by the whole prompt length: the flat buffer has no padding to mask.
        return sums / cursor.prompt_lens.to(sums.device, torch.float32).unsqueeze(1)


_SEQ_METHODS: dict[str, type[SequencePoolingMethod]] = {"CLS": CLSPool, "LAST": LastPool, "MEAN": MeanPool}


def get_seq_pooling_method(pooling_type: str, include_prompt: bool = True) -> SequencePoolingMethod:
    """The sequence pooling method named `CLS`, `LAST`, `MEAN` (vLLM's), or any sentence-transformers mode.

    `MAX`, `MEAN_SQRT_LEN`, `WEIGHTEDMEAN`, several joined by "+" (`CLS+MEAN`, concatenated in that order),
    and any mode with `include_prompt=False` run as sentence-transformers' `Pooling` does.
    """
    if include_prompt and pooling_type in _SEQ_METHODS:
        return _SEQ_METHODS[pooling_type]()
    from embedcli.pooling.st_pooling import SentenceTransformerPool, parse_pooling_type

    return SentenceTransformerPool(parse_pooling_type(pooling_type), include_prompt)


class TokenPoolingMethod(PoolingMethod):
    """One matrix of rows per sequence; `None` while a sliced sequence is unfinished."""

    @abstractmethod
    def forward(self, hidden_states: torch.Tensor, metadata: PoolingMetadata) -> TokenPoolerOutput:
        """Pool `[num_tokens, hidden]` into per-sequence matrices."""


class AllPool(TokenPoolingMethod):
    """Every token state of each sequence; slices of a chunked prefill are concatenated at the end."""

    def get_supported_tasks(self) -> set[str]:
        return {"token_embed", "token_classify"}

    def _gather(self, hidden_states: torch.Tensor, metadata: PoolingMetadata) -> TokenPoolerOutput:
        cursor = metadata.cursor
        pieces = list(torch.split(hidden_states[: cursor.num_tokens], cursor.num_scheduled_tokens.tolist()))
        if not cursor.is_partial_prefill() and metadata.pooling_states is None:
            return pieces  # type: ignore[return-value]
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
    "PoolingState",
    "StepPool",
    "get_seq_pooling_method",
    "get_tok_pooling_method",
    "segment_sum_float32",
]
