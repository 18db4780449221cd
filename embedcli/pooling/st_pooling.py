"""sentence-transformers' `Pooling` over a packed buffer: cls, max, mean, mean_sqrt_len_tokens, weightedmean,
lasttoken, several concatenated, prompt tokens excluded; per-slice accumulators carry them across a chunked prefill."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch

from embedcli.pooling.metadata import PoolingCursor, PoolingMetadata
from embedcli.pooling.methods import MEAN_POOL_CHUNK_BYTES, SEQ_METHODS, Partial, SequencePoolingMethod

# sentence-transformers' mode names, in the order its legacy `pooling_mode_*` booleans concatenate.
ST_POOLING_MODES: tuple[str, ...] = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
# The embedcli / vLLM-style pooling type of each mode (`seq_pooling_type`; several are joined by "+").
ST_MODE_TYPES: dict[str, str] = {
    "cls": "CLS",
    "max": "MAX",
    "mean": "MEAN",
    "mean_sqrt_len_tokens": "MEAN_SQRT_LEN",
    "weightedmean": "WEIGHTEDMEAN",
    "lasttoken": "LAST",
}
TYPE_ST_MODES: dict[str, str] = {v: k for k, v in ST_MODE_TYPES.items()}
# Mirrors sentence-transformers' `torch.clamp(count, min=1e-9)`: a sequence with no kept token pools to 0.
_MIN_COUNT = 1e-9


@dataclass
class SegmentAccumulator:
    """Per-sequence partial pooling results over the tokens seen so far (float32; `None` when not needed)."""

    total: torch.Tensor | None = None  # [n, h] sum of kept token states
    count: torch.Tensor | None = None  # [n] kept tokens
    weighted: torch.Tensor | None = None  # [n, h] sum of (position + 1) * state over kept tokens
    weight: torch.Tensor | None = None  # [n] sum of (position + 1)
    maximum: torch.Tensor | None = None  # [n, h] elementwise max over kept tokens (-inf when none)
    first: torch.Tensor | None = None  # [n, h] state of the first kept token (zeros until seen)
    has_first: torch.Tensor | None = None  # [n] bool
    last: torch.Tensor | None = None  # [n, h] state of the sequence's last token (zeros until seen)

    def row(self, i: int) -> SegmentAccumulator:
        """The accumulator of sequence `i` alone (a copy)."""
        return SegmentAccumulator(
            **{f.name: None if (t := getattr(self, f.name)) is None else t[i : i + 1].clone() for f in fields(self)}
        )

    def put(self, i: int, other: SegmentAccumulator) -> None:
        """Overwrite sequence `i` with the one-row accumulator `other`."""
        for f in fields(self):
            mine = getattr(self, f.name)
            if mine is not None:
                mine[i] = getattr(other, f.name)[0]

    def merge(self, later: SegmentAccumulator) -> SegmentAccumulator:
        """Combine with the accumulator of the tokens that follow (same sequences, in order)."""
        out = SegmentAccumulator()
        for name in ("total", "count", "weighted", "weight"):
            a, b = getattr(self, name), getattr(later, name)
            setattr(out, name, None if a is None else a + b)
        if self.maximum is not None:
            out.maximum = torch.maximum(self.maximum, later.maximum)  # type: ignore[arg-type]  # the accumulator's field is set for every mode in use
        if self.first is not None:
            keep = self.has_first.unsqueeze(-1)  # type: ignore[union-attr]  # the accumulator's field is set for every mode in use
            out.first = torch.where(keep, self.first, later.first)  # type: ignore[arg-type]  # the accumulator's field is set for every mode in use
            out.has_first = self.has_first | later.has_first  # type: ignore[operator]  # the accumulator's field is set for every mode in use
        if self.last is not None:
            out.last = later.last
        return out


def _positions(cursor: PoolingCursor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per scheduled token: its buffer row, its sequence and its position within the whole sequence."""
    sched = cursor.num_scheduled_tokens
    seg = torch.repeat_interleave(torch.arange(len(cursor)), sched)
    cu = torch.zeros(len(cursor) + 1, dtype=torch.long)
    torch.cumsum(sched, 0, out=cu[1:])
    local = torch.arange(int(cu[-1])) - cu[:-1][seg]
    rows = cursor.first_token_indices[seg] + local
    # A slice of a chunked prefill starts at `seq_lens - scheduled` within its sequence.
    pos = (cursor.seq_lens - sched)[seg] + local
    return rows.to(device), seg.to(device), pos.to(device)


class SentenceTransformerPool(SequencePoolingMethod):
    """sentence-transformers' `Pooling`: each mode over the sequence's kept tokens, concatenated in `modes` order.

    `include_prompt=False` drops each sequence's first `PoolingMetadata.prompt_token_lens` tokens from every
    mode, as sentence-transformers zeroes them in the attention mask: CLS becomes the first token after the
    prompt, weightedmean keeps the tokens' original position weights, lasttoken is unchanged.
    """

    def __init__(
        self, modes: Sequence[str], include_prompt: bool = True, chunk_bytes: int = MEAN_POOL_CHUNK_BYTES
    ) -> None:
        super().__init__()
        unknown = [m for m in modes if m not in ST_POOLING_MODES]
        if not modes or unknown:
            raise NotImplementedError(f"Unsupported pooling modes {list(modes)}; choose from {ST_POOLING_MODES}")
        self.modes = tuple(modes)
        self.include_prompt = include_prompt
        self.chunk_bytes = chunk_bytes

    @property
    def width_factor(self) -> int:
        """How many hidden-size blocks the pooled vector holds (one per mode)."""
        return len(self.modes)

    def skip(self, metadata: PoolingMetadata | PoolingCursor) -> torch.Tensor:
        """Leading tokens excluded per sequence: the prompt's, when `include_prompt` is off and it is known."""
        cursor = metadata.cursor if isinstance(metadata, PoolingMetadata) else metadata
        lens = metadata.prompt_token_lens if isinstance(metadata, PoolingMetadata) else None
        if self.include_prompt or lens is None:
            return torch.zeros(len(cursor), dtype=torch.long)
        return torch.as_tensor(lens, dtype=torch.long)

    def accumulate(
        self, hidden_states: torch.Tensor, metadata: PoolingMetadata | PoolingCursor, skip: torch.Tensor | None = None
    ) -> SegmentAccumulator:
        """Partial results of this forward's tokens, to `merge` with earlier slices and `finish`.

        `skip` (leading tokens left out per sequence) defaults to `self.skip(metadata)`.
        """
        cursor = metadata.cursor if isinstance(metadata, PoolingMetadata) else metadata
        if skip is None:
            skip = self.skip(metadata)
        n, h, device = len(cursor), hidden_states.shape[-1], hidden_states.device
        modes = set(self.modes)
        acc = SegmentAccumulator()
        def zeros(*shape: int) -> torch.Tensor:
            return torch.zeros(*shape, dtype=torch.float32, device=device)

        if modes & {"mean", "mean_sqrt_len_tokens"}:
            acc.total, acc.count = zeros(n, h), zeros(n)
        if "weightedmean" in modes:
            acc.weighted, acc.weight = zeros(n, h), zeros(n)
        if "max" in modes:
            acc.maximum = torch.full((n, h), float("-inf"), dtype=torch.float32, device=device)
        if "cls" in modes:
            acc.first, acc.has_first = zeros(n, h), torch.zeros(n, dtype=torch.bool, device=device)
        if "lasttoken" in modes:
            acc.last = zeros(n, h)
        if n == 0:
            return acc
        rows, seg, pos = _positions(cursor, device)
        skip_d = skip.to(device)
        prompt_lens = cursor.prompt_lens.to(device)
        # When the prompt fills the sequence, sentence-transformers' CLS falls back to position 0.
        first_pos = torch.where(skip_d < prompt_lens, skip_d, torch.zeros_like(skip_d))
        step = max(1, self.chunk_bytes // (h * 4))
        for lo in range(0, int(rows.numel()), step):
            r, s, p = rows[lo : lo + step], seg[lo : lo + step], pos[lo : lo + step]
            x = hidden_states[r].to(torch.float32)
            kept = p >= skip_d[s]
            self._add(acc, x, s, p, kept, first_pos, prompt_lens, skip_d)
        return acc

    @staticmethod
    def _add(
        acc: SegmentAccumulator, x: torch.Tensor, s: torch.Tensor, p: torch.Tensor, kept: torch.Tensor,
        first_pos: torch.Tensor, prompt_lens: torch.Tensor, skip: torch.Tensor,
    ) -> None:
        ks, kx, kp = s[kept], x[kept], p[kept]
        if acc.total is not None and acc.count is not None:
            acc.total.index_add_(0, ks, kx)
            acc.count.index_add_(0, ks, torch.ones_like(ks, dtype=torch.float32))
        if acc.weighted is not None and acc.weight is not None:
            w = (kp + 1).to(torch.float32)
            acc.weighted.index_add_(0, ks, kx * w.unsqueeze(-1))
            acc.weight.index_add_(0, ks, w)
        if acc.maximum is not None:
            index = ks.unsqueeze(-1).expand(-1, kx.shape[-1])
            acc.maximum.scatter_reduce_(0, index, kx, reduce="amax")
        if acc.first is not None and acc.has_first is not None:
            at = p == first_pos[s]
            acc.first[s[at]] = x[at]
            acc.has_first[s[at]] = True
        if acc.last is not None:
            # sentence-transformers multiplies by the mask: a sequence that is all prompt gives zeros.
            at = (p == prompt_lens[s] - 1) & (skip[s] < prompt_lens[s])
            acc.last[s[at]] = x[at]

    def finish(self, acc: Partial, cursor: PoolingCursor | None = None) -> torch.Tensor:
        """The pooled `[n, len(modes) * hidden]` vectors from a complete accumulator."""
        assert isinstance(acc, SegmentAccumulator)
        out: list[torch.Tensor] = []
        for mode in self.modes:
            if mode == "cls":
                out.append(acc.first)  # type: ignore[arg-type]  # the accumulator's field is set for every mode in use
            elif mode == "lasttoken":
                out.append(acc.last)  # type: ignore[arg-type]  # the accumulator's field is set for every mode in use
            elif mode == "max":
                # sentence-transformers gives -inf for a sequence with no kept token; zeros keep the row finite.
                m = acc.maximum
                out.append(torch.where(torch.isinf(m), torch.zeros_like(m), m))  # type: ignore[arg-type]  # the accumulator's field is set for every mode in use
            elif mode == "weightedmean":
                out.append(acc.weighted / acc.weight.clamp(min=_MIN_COUNT).unsqueeze(-1))  # type: ignore[union-attr,operator,arg-type]  # set when the mode is
            else:
                count = acc.count.clamp(min=_MIN_COUNT).unsqueeze(-1)  # type: ignore[union-attr]  # the accumulator's field is set for every mode in use
                out.append(acc.total / (count if mode == "mean" else count.sqrt()))  # type: ignore[operator,arg-type]  # set when the mode is
        return out[0] if len(out) == 1 else torch.cat(out, dim=-1)

    def forward(self, hidden_states: torch.Tensor, metadata: PoolingMetadata | PoolingCursor) -> torch.Tensor:
        cursor = metadata.cursor if isinstance(metadata, PoolingMetadata) else metadata
        if cursor.is_partial_prefill():
            raise RuntimeError("a partial prefill is pooled through accumulate/merge/finish (SequencePooler.pool_slices)")
        return self.finish(self.accumulate(hidden_states, metadata))


def parse_pooling_type(pooling_type: str) -> tuple[str, ...]:
    """sentence-transformers mode names of a `seq_pooling_type` such as `MEAN` or `CLS+MEAN`."""
    parts = pooling_type.upper().split("+")
    unknown = [p for p in parts if p not in TYPE_ST_MODES]
    if unknown:
        raise NotImplementedError(f"Unsupported sequence pooling type: {pooling_type!r}")
    return tuple(TYPE_ST_MODES[p] for p in parts)


def pooling_type_of(modes: Sequence[str]) -> str:
    """The `seq_pooling_type` naming sentence-transformers `modes` (joined by "+" in their order)."""
    return "+".join(ST_MODE_TYPES[m] for m in modes)


def get_seq_pooling_method(pooling_type: str, include_prompt: bool = True) -> SequencePoolingMethod:
    """The sequence pooling method named `CLS`, `LAST`, `MEAN` (vLLM's), or any sentence-transformers mode.

    `MAX`, `MEAN_SQRT_LEN`, `WEIGHTEDMEAN`, several joined by "+" (`CLS+MEAN`, concatenated in that order),
    and any mode with `include_prompt=False` run as sentence-transformers' `Pooling` does.
    """
    if include_prompt and pooling_type in SEQ_METHODS:
        return SEQ_METHODS[pooling_type]()
    return SentenceTransformerPool(parse_pooling_type(pooling_type), include_prompt)
