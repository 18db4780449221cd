"""Chunked prefill: decoder sequences longer than the token budget run in slices over successive forwards.

Scheduling (`plan_forwards`), for one tokenized batch with budget `B`:

- sequences of at most `B` tokens are "short" and pack greedily, longest first, as before;
- a "long" decoder sequence of `n > B` tokens is cut into slices: first `n mod B` tokens (if not 0),
  then full slices of `B`. Its first slice is the only one with room left in its forward, and that room
  is filled with short sequences (largest that fit first); every full slice is a forward of its own.
  Each forward carries at most one slice, placed after the short sequences in the flat buffer; the
  slices of a sequence run in order, so the KV cache of the earlier ones is always there.
- a long sequence on an encoder (bidirectional attention: a slice would need the tokens after it)
  is never sliced: it runs alone in a forward of its own ("solo"), as the greedy packer always did.

Peak memory for a long document is thus bounded by the activations of `B` tokens plus its KV cache
(2 x layers x kv_heads x head_dim x (n - B) values, model dtype) instead of the activations of all `n`
tokens. Whether that is less depends on the model: transformers frees each layer's activations and
causal SDPA never builds the score matrix, so for a small GQA model the cache can outweigh what it
saves (SmolLM2-135M, 8,192 tokens, float32, CPU: +446 MiB peak sliced at 2,048 vs +377 MiB unsliced;
`benchmarks/bench_long_doc.py`). What slicing always bounds is the per-forward working set, which is
what keeps the other sequences' batches at the budget.

Pooling (`pool_forward`): the cursor of a forward with a slice marks it as a partial prefill as vLLM
does (prompt_lens = whole length, num_scheduled_tokens = the slice, seq_lens = tokens computed so far,
finished when seq_lens == prompt_lens), and the pooler's one entry for it, `Pooler.pool_slices`, gets each
sliced sequence's `PoolingState`. Only finished sequences get a result. How a sequence carries is declared
by its pooling method (`carries_slices`; a pooler that cannot carry is refused when the runner is built):

- sequence methods (`SequencePoolingMethod`: CLS, LAST, MEAN and every sentence-transformers mode) pool
  each forward into a `Partial` (`accumulate`), merge a sliced sequence's row into the one it carries, and
  `finish` it: MEAN carries a float32 running sum divided by the whole prompt length on the final slice
  (vLLM rejects MEAN on a partial prefill; embedcli does not), CLS keeps the first slice's first token, LAST
  takes the final slice's last token (vLLM's behaviour), the sentence-transformers modes carry a
  `SegmentAccumulator` (sums, counts, position weights, max, first/last token) with global positions, so
  the prompt's tokens and weightedmean's weights are those of the whole sequence;
- token methods (ALL/STEP) concatenate the slices in the per-sequence hidden-state cache (vLLM's pooling_states).

The head (projector, Matryoshka slice, normalize / classifier) runs once, on the finished vector.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from embedcli.models.kernels.kv_cache import PrefixSlice, SequenceKVCache
from embedcli.models.kernels.packing import PackInfo
from embedcli.pooling.metadata import PoolingMetadata, PoolingState
from embedcli.pooling.params import PoolingParams
from embedcli.pooling.poolers import Pooler


@dataclass(frozen=True)
class SliceRef:
    """Tokens `[start, end)` of sequence `seq` (whose whole length is `total`)."""

    seq: int
    start: int
    end: int
    total: int

    @property
    def length(self) -> int:
        return self.end - self.start

    @property
    def is_last(self) -> bool:
        return self.end == self.total


@dataclass
class PlannedForward:
    """One packed forward: whole short sequences, then at most one slice of a long one."""

    members: list[int] = field(default_factory=list)
    slice: SliceRef | None = None

    def tokens(self, lengths: np.ndarray) -> int:
        return int(sum(int(lengths[i]) for i in self.members)) + (self.slice.length if self.slice else 0)


def slice_bounds(n: int, budget: int) -> list[tuple[int, int]]:
    """Slices of a sequence of `n > budget` tokens: the remainder `n mod budget` first, then full slices."""
    first = n % budget
    bounds = [(0, first)] if first else []
    bounds += [(s, s + budget) for s in range(first, n, budget)]
    return bounds


def plan_forwards(lengths: np.ndarray, budget: int, sliceable: bool) -> tuple[list[PlannedForward], int, int]:
    """Forwards for sequences of `lengths` under `budget`; also (sliced, solo) sequence counts."""
    order = np.argsort(-lengths, kind="stable").tolist()
    long_seqs = [i for i in order if int(lengths[i]) > budget]
    # A sequence of no tokens is pooled without a forward (Runner.run_encoded).
    short = [i for i in order if 0 < int(lengths[i]) <= budget]
    forwards: list[PlannedForward] = []
    if not sliceable:
        for i in long_seqs:
            forwards.append(PlannedForward(members=[i]))
    else:
        for i in long_seqs:
            n = int(lengths[i])
            for start, end in slice_bounds(n, budget):
                fwd = PlannedForward(slice=SliceRef(i, start, end, n))
                room = budget - (end - start)
                if room > 0:
                    # Fill the room with the largest short sequences that fit (shorts are longest first).
                    kept = []
                    for j in short:
                        m = int(lengths[j])
                        if m <= room:
                            fwd.members.append(j)
                            room -= m
                        else:
                            kept.append(j)
                    short = kept
                forwards.append(fwd)
    current: list[int] = []
    used = 0
    for i in short:
        n = int(lengths[i])
        if current and used + n > budget:
            forwards.append(PlannedForward(members=current))
            current, used = [], 0
        current.append(i)
        used += n
    if current:
        forwards.append(PlannedForward(members=current))
    sliced = len(long_seqs) if sliceable else 0
    solo = 0 if sliceable else len(long_seqs)
    return forwards, sliced, solo


@dataclass
class SliceState:
    """What a long sequence carries between its slices: its KV cache and its pooling state."""

    cache: SequenceKVCache
    pooling_state: PoolingState = field(default_factory=PoolingState)


def forward_with_slice(
    model: Any, ids: torch.Tensor, lengths: list[int], piece: SliceRef | None, state: SliceState | None
) -> torch.Tensor:
    """Hidden states `[total, hidden]` of whole sequences of `lengths` followed by one slice (decoders only)."""
    if piece is None:
        return model.forward_packed(ids, lengths)
    assert state is not None
    if state.cache.length != piece.start:
        raise RuntimeError(f"slice {piece.start}:{piece.end} scheduled after {state.cache.length} cached tokens")
    device = model.device
    if not state.cache.keys:
        config = model.backbone.config
        heads = int(config.num_attention_heads)
        head_dim = getattr(config, "head_dim", None) or int(config.hidden_size) // heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        # The weights' dtype: under CPU bf16 autocast that is float32, which holds any key/value losslessly.
        dtype = next(model.backbone.parameters()).dtype
        state.cache.allocate(int(config.num_hidden_layers), int(kv_heads), int(head_dim), dtype, device)
    pack = PackInfo.build(lengths, device) if lengths else None
    positions = [torch.arange(n) for n in lengths] + [torch.arange(piece.start, piece.end)]
    pos = torch.cat(positions).to(device)
    prefix = PrefixSlice(state.cache, piece.length)
    with torch.inference_mode(), model.compute_context():
        hidden = model.forward_with_prefix(ids.to(device), pos, pack, prefix)
    state.cache.advance(piece.length)
    return hidden


@torch.inference_mode()
def pool_forward(
    pooler: Pooler, hidden: torch.Tensor, metadata: PoolingMetadata, states: list[SliceState | None]
) -> list[torch.Tensor | None]:
    """Results of one forward's sequences; `None` for a slice that is not its sequence's last."""
    if not metadata.cursor.is_partial_prefill():
        return list(pooler(hidden, metadata))
    return pooler.pool_slices(hidden, metadata, [s.pooling_state if s is not None else None for s in states])


def run_long(
    enc: Any,
    results: list[torch.Tensor | None],
    *,
    model: Any,
    pooler: Pooler,
    budget: int,
    forward: Callable[[np.ndarray], list[torch.Tensor]],
    params_of: Callable[[int], PoolingParams],
    stats: Any,
    with_token_ids: bool,
    sliceable: bool,
    prompt_tokens: int,
) -> None:
    """Fill `results` for a tokenized batch `enc` with sequences over the token `budget`.

    `forward(members)` runs whole sequences packed (the runner's forward + pooler); `params_of(i)` is
    sequence i's pooling request; pooling leaves out each sequence's first `prompt_tokens` tokens
    (sentence-transformers include_prompt=false). Sliceable (decoder) sequences run in slices through
    `model` with a KV cache and are pooled by `pooler`; otherwise each long sequence runs alone through
    `forward`.
    """
    lengths = enc.lengths
    forwards, _, _ = plan_forwards(lengths, budget, sliceable)
    long_rows = np.unique(enc.owner[lengths > budget]).size
    if sliceable:
        stats.sliced_rows += long_rows
    else:
        stats.solo_rows += long_rows
    states: dict[int, SliceState] = {}
    for fwd in forwards:
        if fwd.slice is None:
            for i, out in zip(fwd.members, forward(np.asarray(fwd.members, dtype=np.int64)), strict=True):
                results[i] = out
            continue
        piece = fwd.slice
        state = states.get(piece.seq)
        if state is None:
            # Sized to the tokens before the final slice, whose own k/v are never read again.
            capacity = slice_bounds(piece.total, budget)[-1][0]
            state = states[piece.seq] = SliceState(SequenceKVCache(capacity=capacity))
        seq_ids = [enc.ids[i] for i in fwd.members] + [enc.ids[piece.seq][piece.start : piece.end]]
        lens = [len(s) for s in seq_ids]
        flat = torch.from_numpy(np.concatenate(seq_ids))
        hidden = forward_with_slice(model, flat, lens[:-1], piece, state)
        order = [*fwd.members, piece.seq]
        cu = np.zeros(len(order) + 1, dtype=np.int64)
        np.cumsum(lens, out=cu[1:])
        metadata = PoolingMetadata.from_cu_seqlens(
            torch.from_numpy(cu), [params_of(i) for i in order], token_ids=flat if with_token_ids else None,
            prompt_lens=[*lens[:-1], piece.total], seq_lens=[*lens[:-1], piece.end],
            prompt_token_lens=[prompt_tokens] * len(order) if prompt_tokens else None,
        )
        outs = pool_forward(pooler, hidden, metadata, [*([None] * len(fwd.members)), state])
        for i, done in zip(order, outs, strict=True):
            if done is not None:
                results[i] = done
        stats.forwards += 1
        stats.tokens += int(cu[-1])
        if piece.is_last:
            state.cache.clear()
            del states[piece.seq]
