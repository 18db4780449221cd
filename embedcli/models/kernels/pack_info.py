"""How sequences sit in the packed `[total_tokens, ...]` buffer: boundaries, and padded views of length groups.

The own backbones run every linear layer and norm on the flat buffer; attention needs the sequence boundaries
(`cu_seqlens`), and the torch attention paths a padded `[batch, max_len]` view of each group of similar length
(the index maps below). Built once per forward (`PackInfo.build`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Sequences whose length is under this fraction of their group's longest start a new group: attention
# on a padded view costs batch x max_len^2, so one 256-token article padding 60 titles to 256 would cost
# ~9x the real work (a file's mixed lengths meet in every batch). Measured on MiniLM, 2,000 mixed texts.
GROUP_LENGTH_RATIO = 0.8


@dataclass
class PaddedGroup:
    """Sequences of similar length attended together in one padded `[batch, max_len]` view."""

    batch: int
    max_len: int
    gather_index: torch.Tensor  # [batch * max_len] flat-buffer row for each padded slot (pads -> a real row)
    scatter_index: torch.Tensor  # [tokens] padded slot of each of the group's tokens, in `rows` order
    rows: torch.Tensor  # [tokens] flat-buffer rows of the group's tokens
    key_mask: torch.Tensor | None  # [batch, 1, 1, max_len] True where a key is real; None if no pads
    whole: bool  # the group is the whole buffer in its own order (its output needs no scatter back)
    # [batch, 1, 1, max_len] True where the slot holds a real token, where that differs from `key_mask`
    # (query-only tokens); None: `key_mask` says it.
    real_mask: torch.Tensor | None = None

    @property
    def slots(self) -> torch.Tensor | None:
        """True where the padded slot holds a real token (query-only ones included); None if no pads."""
        return self.key_mask if self.real_mask is None else self.real_mask


@dataclass
class PackInfo:
    """Index maps between a packed buffer of `total` tokens and its padded `[batch, max_len]` view(s).

    `gather_index`/`scatter_index`/`key_mask` describe one view of every sequence (chunked prefill, the
    transformers fallback); `groups` split the sequences by length so attention pads little (own backbones).
    """

    cu_seqlens: torch.Tensor  # int32 [batch + 1], on the compute device
    lengths: list[int]
    max_len: int
    gather_index: torch.Tensor  # [batch * max_len] flat-buffer row for each padded slot (pads -> a real row)
    scatter_index: torch.Tensor  # [total] padded slot of each flat-buffer row
    key_mask: torch.Tensor | None  # [batch, 1, 1, max_len] True where a key is real; None if no pads
    groups: list[PaddedGroup]
    # Some real tokens are queries only, never keys (ColBERT's unattended [MASK] expansion): their rows attend
    # to the others but no row attends to them; the key masks carry it, so kernels without one must not run.
    query_only: bool = False
    keys: torch.Tensor | None = None  # [total] bool on the CPU: the key flags (None: every token is a key)
    cpu_starts: torch.Tensor | None = None  # int64 [batch + 1] on the CPU: `cu_seqlens` for the CPU kernels

    @property
    def batch(self) -> int:
        """Number of sequences in the buffer."""
        return len(self.lengths)

    @property
    def total(self) -> int:
        """Number of tokens in the buffer."""
        return int(self.cu_seqlens[-1])

    @classmethod
    def build(
        cls, lengths: list[int], device: torch.device | str = "cpu", keys: torch.Tensor | None = None
    ) -> PackInfo:
        """Index maps for sequences of `lengths` laid end to end; `keys` (bool per token, on the CPU): False for
        a token no other token attends to (None: every token is a key)."""
        if not lengths or min(lengths) < 1:
            raise ValueError("a packed batch needs at least one sequence, each of at least one token")
        if keys is not None and bool(keys.all()):
            keys = None
        lens = torch.tensor(lengths, dtype=torch.long)
        cu = torch.zeros(len(lengths) + 1, dtype=torch.long)
        torch.cumsum(lens, 0, out=cu[1:])
        gather, scatter, key_mask = _padded_view(lens, cu[:-1], keys)
        return cls(
            cu_seqlens=cu.to(device=device, dtype=torch.int32),
            lengths=list(lengths),
            max_len=int(lens.max()),
            gather_index=gather.to(device),
            scatter_index=scatter.to(device),
            key_mask=None if key_mask is None else key_mask.to(device),
            groups=[_group(lens, cu, members, device, keys) for members in length_groups(lengths)],
            query_only=keys is not None,
            keys=keys,
            cpu_starts=cu,
        )


def length_groups(lengths: list[int], ratio: float = GROUP_LENGTH_RATIO) -> list[list[int]]:
    """Sequence indices, longest first, cut into groups whose shortest is at least `ratio` of their longest."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups: list[list[int]] = []
    for i in order:
        if groups and lengths[i] >= ratio * lengths[groups[-1][0]]:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def _padded_view(
    lens: torch.Tensor, starts: torch.Tensor, keys: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Gather index, scatter index and key mask of sequences `lens` starting at flat rows `starts` (`keys`: the
    flat buffer's key flags, folded into the mask)."""
    batch, max_len = len(lens), int(lens.max())
    pos = torch.arange(max_len)
    valid = pos[None, :] < lens[:, None]  # [batch, max_len]
    gather = torch.where(valid, starts[:, None] + pos[None, :], starts[:, None])
    scatter = (torch.arange(batch)[:, None] * max_len + pos[None, :])[valid]
    attended = valid if keys is None else valid & keys[gather]
    key_mask = None if bool(attended.all()) else attended[:, None, None, :]
    return gather.reshape(-1), scatter, key_mask


def _group(
    lens: torch.Tensor, cu: torch.Tensor, members: list[int], device: torch.device | str, keys: torch.Tensor | None = None
) -> PaddedGroup:
    idx = torch.tensor(members, dtype=torch.long)
    glens, starts = lens[idx], cu[idx]
    gather, scatter, key_mask = _padded_view(glens, starts, keys)
    real_mask = None
    if keys is not None:
        _, _, real_mask = _padded_view(glens, starts)
        real_mask = torch.ones_like(key_mask) if real_mask is None and key_mask is not None else real_mask
    rows = torch.cat([torch.arange(int(s), int(s) + int(n)) for s, n in zip(starts.tolist(), glens.tolist(), strict=True)])
    return PaddedGroup(
        batch=len(members),
        max_len=int(glens.max()),
        gather_index=gather.to(device),
        scatter_index=scatter.to(device),
        rows=rows.to(device),
        key_mask=None if key_mask is None else key_mask.to(device),
        whole=members == list(range(len(lens))),
        real_mask=None if real_mask is None else real_mask.to(device),
    )


Window = tuple[int, int]
"""How far a query reaches (left, right) in tokens, both inclusive: query i sees keys i - left .. i + right."""
