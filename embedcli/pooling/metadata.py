"""Where each sequence sits in the packed token buffer (`PoolingCursor`) and what it asks for (`PoolingMetadata`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from embedcli.pooling.params import PoolingParams


@dataclass(frozen=True)
class PoolingCursor:
    """Per-sequence offsets into a flat `[num_tokens, hidden]` buffer, and prefill progress.

    `first_token_indices`/`last_token_indices` are positions in the flat buffer of *this* forward;
    `prompt_lens` are whole-sequence lengths; `seq_lens` count tokens computed so far including this
    forward; `num_scheduled_tokens` count the tokens of each sequence in this forward.
    """

    first_token_indices: torch.Tensor
    last_token_indices: torch.Tensor
    prompt_lens: torch.Tensor
    seq_lens: torch.Tensor
    num_scheduled_tokens: torch.Tensor

    @classmethod
    def from_cu_seqlens(
        cls,
        cu_seqlens: torch.Tensor | Sequence[int],
        prompt_lens: torch.Tensor | Sequence[int] | None = None,
        seq_lens: torch.Tensor | Sequence[int] | None = None,
    ) -> PoolingCursor:
        """Build a cursor from cumulative scheduled lengths `[0, n0, n0+n1, ...]`.

        Without `prompt_lens` every sequence is whole in this forward (no partial prefill).
        """
        cu = torch.as_tensor(cu_seqlens, dtype=torch.long)
        if cu.ndim != 1 or cu.numel() == 0 or int(cu[0]) != 0:
            raise ValueError("cu_seqlens must be a 1-D sequence starting at 0")
        scheduled = cu[1:] - cu[:-1]
        if bool((scheduled < 0).any()):
            raise ValueError("cu_seqlens must be non-decreasing")
        prompts = scheduled.clone() if prompt_lens is None else torch.as_tensor(prompt_lens, dtype=torch.long)
        done = prompts.clone() if seq_lens is None else torch.as_tensor(seq_lens, dtype=torch.long)
        if prompts.shape != scheduled.shape or done.shape != scheduled.shape:
            raise ValueError("prompt_lens and seq_lens need one entry per sequence")
        return cls(
            first_token_indices=cu[:-1],
            last_token_indices=cu[1:] - 1,
            prompt_lens=prompts,
            seq_lens=done,
            num_scheduled_tokens=scheduled,
        )

    def __len__(self) -> int:
        return int(self.prompt_lens.numel())

    @property
    def num_tokens(self) -> int:
        """Tokens of this forward covered by the cursor."""
        return int(self.num_scheduled_tokens.sum())

    def is_partial_prefill(self) -> bool:
        """True when any sequence has only part of its prompt in this forward."""
        return bool((self.num_scheduled_tokens != self.prompt_lens).any())

    def is_finished(self) -> torch.Tensor:
        """Per sequence: the whole prompt has been computed once this forward ends."""
        return self.seq_lens == self.prompt_lens

    def cu_seqlens(self) -> torch.Tensor:
        """Cumulative scheduled lengths, relative to the first sequence's first token."""
        out = torch.zeros(len(self) + 1, dtype=torch.long)
        torch.cumsum(self.num_scheduled_tokens, 0, out=out[1:])
        return out

    def slice(self, start: int, end: int) -> PoolingCursor:
        """Sequences `[start, end)`, with token indices re-based to the first of them."""
        if start == end:
            empty = torch.zeros(0, dtype=torch.long)
            return PoolingCursor(empty, empty, empty, empty, empty)
        base = self.first_token_indices[start]
        return PoolingCursor(
            first_token_indices=self.first_token_indices[start:end] - base,
            last_token_indices=self.last_token_indices[start:end] - base,
            prompt_lens=self.prompt_lens[start:end],
            seq_lens=self.seq_lens[start:end],
            num_scheduled_tokens=self.num_scheduled_tokens[start:end],
        )

    def token_range(self, start: int, end: int) -> tuple[int, int]:
        """The flat-buffer token range `[lo, hi)` that sequences `[start, end)` occupy."""
        if start == end:
            return 0, 0
        return int(self.first_token_indices[start]), int(self.last_token_indices[end - 1]) + 1


@dataclass
class PoolingState:
    """Per-sequence state carried across forwards of a sliced (chunked-prefill) sequence."""

    hidden_states_cache: list[torch.Tensor] = field(default_factory=list)
    token_ids_cache: list[torch.Tensor] = field(default_factory=list)

    def clear(self) -> None:
        """Drop the cached slices once the sequence has been pooled."""
        self.hidden_states_cache.clear()
        self.token_ids_cache.clear()


@dataclass
class PoolingMetadata:
    """Everything a pooler needs beside the hidden states: the cursor, per-sequence params and token ids."""

    cursor: PoolingCursor
    pooling_params: list[PoolingParams]
    # Flat token ids aligned with the hidden-state rows; only STEP pooling reads them.
    token_ids: torch.Tensor | None = None
    pooling_states: list[PoolingState] | None = None
    # Leading prompt tokens of each sequence, for pooling that excludes the prompt (include_prompt=false).
    prompt_token_lens: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if len(self.pooling_params) != len(self.cursor):
            raise ValueError(
                f"{len(self.pooling_params)} pooling params for {len(self.cursor)} sequences"
            )
        if self.pooling_states is not None and len(self.pooling_states) != len(self.cursor):
            raise ValueError("pooling_states needs one entry per sequence")

    @classmethod
    def from_cu_seqlens(
        cls,
        cu_seqlens: torch.Tensor | Sequence[int],
        pooling_params: list[PoolingParams],
        token_ids: torch.Tensor | None = None,
        prompt_lens: torch.Tensor | Sequence[int] | None = None,
        seq_lens: torch.Tensor | Sequence[int] | None = None,
        pooling_states: list[PoolingState] | None = None,
        prompt_token_lens: torch.Tensor | Sequence[int] | None = None,
    ) -> PoolingMetadata:
        """Metadata for one packed forward."""
        cursor = PoolingCursor.from_cu_seqlens(cu_seqlens, prompt_lens, seq_lens)
        skip = None if prompt_token_lens is None else torch.as_tensor(prompt_token_lens, dtype=torch.long)
        return cls(cursor, pooling_params, token_ids, pooling_states, skip)

    def __len__(self) -> int:
        return len(self.cursor)

    @property
    def tasks(self) -> list[str | None]:
        """The task of each sequence, in batch order."""
        return [p.task for p in self.pooling_params]

    def slice(self, start: int, end: int) -> PoolingMetadata:
        """Sequences `[start, end)`, re-based so their first token is row 0."""
        lo, hi = self.cursor.token_range(start, end)
        return PoolingMetadata(
            cursor=self.cursor.slice(start, end),
            pooling_params=self.pooling_params[start:end],
            token_ids=None if self.token_ids is None else self.token_ids[lo:hi],
            pooling_states=None if self.pooling_states is None else self.pooling_states[start:end],
            prompt_token_lens=None if self.prompt_token_lens is None else self.prompt_token_lens[start:end],
        )

    def split_token_ids(self) -> list[torch.Tensor]:
        """The token ids of each sequence's scheduled tokens."""
        if self.token_ids is None:
            raise ValueError("This pooler needs token ids, but the metadata carries none")
        return list(torch.split(self.token_ids, self.cursor.num_scheduled_tokens.tolist()))
