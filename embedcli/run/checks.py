"""Reading and checking rows: the work items of a run, with bad rows failed on or set aside.

A work item is one batch of the readers (whole blocks, `embedcli.io.positions`): its bad rows (reported by
the reader, or found here: null texts, repeated ids) and its rows in output order, each read (to compute, or
to carry over by row key under `--incremental`) or carried over unread (a block, file or row group the
previous output has whole). Ids of every row count for duplicate detection, unread ones by the id hashes the
previous output's row index keeps; a carried block one of whose ids was seen earlier in the run is read
after all, so the repeat is reported where a full run reports it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from embedcli.errors import InputError, TooManyErrors, display_path
from embedcli.io.arrow_values import arrow_array, scattered, to_numpy, valid_mask
from embedcli.io.positions import LOC_SHIFT, Block, ReadPoint
from embedcli.io.shards import INDEX_SCHEMA, KEY_TYPE, conform_index, keys_array
from embedcli.run.flags import RunFlags
from embedcli.run.ids import IdSet, id_hashes, pack_locations
from embedcli.run.source import concat_batches, null_text_error, slice_batch, subset

UnreadIds = Callable[[int, int], tuple[np.ndarray, np.ndarray]]
"""`(start, stop)` -> the id hashes and packed locations of a previous output's rows `[start, stop)`."""
NULL_FIX = "fill in the text or drop the row (or pass --on-error skip)"
_NO_ROWS = np.zeros(0, np.int64)


@dataclass
class Work:
    """One batch's records after the row checks (see the module docstring)."""

    records: int
    batch: Any = None  # the valid rows read, in input order (an InputBatch), or None
    errors: list[InputError] = field(default_factory=list)
    end: ReadPoint | None = None  # where reading goes on after it
    grid_end: bool = False
    # Output rows in order: ("read", n, None) for the next n rows of `batch`, ("unread", n, locations) for n
    # rows carried over unread (their packed locations in this run; the rest of their row index is the
    # previous output's, of rows `unread_prev`).
    segments: list[tuple[str, int, Any]] = field(default_factory=list)
    src: np.ndarray = field(default_factory=lambda: _NO_ROWS)  # per output row: its row of `batch`, -1: unread
    unread_prev: np.ndarray = field(default_factory=lambda: _NO_ROWS)  # per output row: previous row if unread
    read_idh: np.ndarray = field(default_factory=lambda: _NO_ROWS)  # per row of `batch`: id hash
    read_loc: np.ndarray = field(default_factory=lambda: _NO_ROWS)  # per row of `batch`: packed location
    marks: list[tuple[int, bytes, int]] = field(default_factory=list)  # (row of `batch`, block identity, rows)
    # Blocks read in pieces (`Block.pieces`): (output row, block identity, rows) of those whose every record
    # became a row; and per row carried over unread, whether it is a piece's (its old block mark not kept;
    # empty: none is)
    piece_marks: list[tuple[int, bytes, int]] = field(default_factory=list)
    unread_pieces: np.ndarray = field(default_factory=lambda: np.zeros(0, np.bool_))
    keys: np.ndarray | None = None  # per row of `batch`: row key (set by `Carry.split`)
    compute_idx: np.ndarray = field(default_factory=lambda: _NO_ROWS)  # rows of `batch` to compute
    carry_idx: np.ndarray = field(default_factory=lambda: _NO_ROWS)  # rows of `batch` carried over by row key
    carry_rows: np.ndarray = field(default_factory=lambda: _NO_ROWS)  # ... their previous-output rows
    compute: Any = None  # the rows to compute (an InputBatch), or None
    counts: list[tuple[int, int, int, int]] = field(default_factory=list)  # (file, group, records, rows) per block
    identities: list[tuple[int, int, bytes]] = field(default_factory=list)  # (file, group, identity) of units
    exits: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    # files carried over whole and unread from their start here (not those known unchanged but read, or carried
    # only up to a slice's stop inside them)
    whole_files: list[int] = field(default_factory=list)

    @property
    def rows(self) -> int:
        """Output rows."""
        return len(self.src)

    @property
    def unread(self) -> int:
        """Rows carried over without reading them."""
        return int((self.src < 0).sum())

    def prev_rows(self) -> np.ndarray:
        """Per output row: the previous-output row it is taken from, or -1 (computed)."""
        prev = self.unread_prev.copy()
        if len(self.carry_idx):
            by_row = np.full(len(self.batch), -1, np.int64)
            by_row[self.carry_idx] = self.carry_rows
            read = self.src >= 0
            prev[read] = by_row[self.src[read]]
        return prev


def valid_rows(batch: Any) -> list[int]:
    """Indices of the rows whose text (and every extra text) is there."""
    extra = list(batch.extra_texts.values())
    return [i for i, t in enumerate(batch.texts) if t is not None and all(col[i] is not None for col in extra)]


class RowChecks:
    """Null texts, repeated ids and `--max-errors` over a whole run; fail mode raises a batch's first bad row."""

    def __init__(self, flags: RunFlags, errors_before: int = 0, ids: IdSet | None = None, text_col: str = "text") -> None:
        self.text_col = text_col  # named in a null text's error
        self.skip_mode = flags.on_error == "skip"
        self.limit = flags.max_errors
        self.total = errors_before
        self.ids = ids if ids is not None else IdSet()

    def valid(self, batch: Any, files: np.ndarray) -> tuple[np.ndarray, list[InputError], np.ndarray, np.ndarray]:
        """(rows with their texts, bad rows, id hashes and packed locations of those rows) of a batch's rows
        (`files`: each row's input)."""
        errors: list[InputError] = []
        n = len(batch)
        valid = valid_rows(batch) if n else []
        if len(valid) < n:
            for i in sorted(set(range(n)) - set(valid)):
                errors.append(null_text_error(batch, i, NULL_FIX, self.text_col))
        h = id_hashes([batch.ids[i] for i in valid])
        numbers = np.asarray(batch.numbers, np.int64)[valid] if batch.numbers else np.zeros(len(valid), np.int64)
        return np.asarray(valid, np.int64), errors, h, pack_locations(files[valid], numbers)

    def repeats(self, batch: Any, valid: np.ndarray, h: np.ndarray, locs: np.ndarray) -> tuple[np.ndarray, list[InputError]]:
        """Register the ids of rows `valid` of a batch; (which of them are repeats, their bad rows)."""
        errors: list[InputError] = []
        drop = np.zeros(len(valid), dtype=bool)
        for j, packed in self.ids.add(h, locs):
            i = int(valid[j])
            first_file, first_where = self.ids.describe(packed)
            errors.append(InputError(
                batch.source_of(i),
                f"duplicate id {batch.ids[i]!r}: first seen at {display_path(first_file)} {first_where}",
                location=batch.locations[i],
                record_id=batch.ids[i],
                fix="give every row a unique id (or pass --on-error skip to keep the first and skip the rest)",
            ))
            drop[j] = True
        return drop, errors

    def whole(self, batch: Any, files: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """(id hashes, packed locations) of every row of a batch when every row has its texts, else None."""
        extra = list(batch.extra_texts.values())
        if any(t is None for t in batch.texts) or any(v is None for col in extra for v in col):
            return None
        numbers = np.asarray(batch.numbers, np.int64) if batch.numbers else np.zeros(len(batch), np.int64)
        return id_hashes(batch.ids), pack_locations(files, numbers)

    def check(self, batch: Any, files: np.ndarray) -> tuple[np.ndarray, list[InputError], np.ndarray, np.ndarray]:
        """(rows kept, bad rows, their id hashes, packed locations) of a batch's rows (`files`: each row's input)."""
        valid, errors, h, locs = self.valid(batch, files)
        drop, repeated = self.repeats(batch, valid, h, locs)
        return valid[~drop], errors + repeated, h[~drop], locs[~drop]

    def count(self, errors: list[InputError]) -> None:
        """Add skipped rows to the run's total; TooManyErrors past `--max-errors`."""
        before, self.total = self.total, self.total + len(errors)
        if self.limit is None or self.total <= self.limit or not errors:
            return
        last = errors[max(0, self.limit - before)]  # the bad row that passes the limit, as a --workers run names
        raise TooManyErrors(
            last.path,
            f"more than {self.limit} bad rows (--max-errors {self.limit}); the last: {last.reason}",
            location=last.location,
            record_id=last.record_id,
            fix="fix the input, or raise --max-errors; the rows committed so far are kept",
        )


class _Builder:
    """The output rows of one work item, segment by segment."""

    def __init__(self) -> None:
        self.batches: list[tuple[Any, list[np.ndarray]]] = []  # batches read, and the rows of each kept
        self.read_rows = 0  # rows of `batches` so far
        self.segments: list[tuple[str, int, Any]] = []
        self.src: list[np.ndarray] = []
        self.unread_prev: list[np.ndarray] = []
        self.idh: list[np.ndarray] = []
        self.loc: list[np.ndarray] = []
        self.errors: list[InputError] = []
        self.marks: list[tuple[int, bytes, int]] = []
        self.counts: list[tuple[int, int, int, int]] = []
        self.rows = 0  # output rows so far
        self.unread_pieces: list[tuple[int, np.ndarray | None]] = []  # per unread stretch: rows, which are a piece's
        # per piece of a block read in pieces, in output order: (block, its first output row, rows, every
        # record of it a row)
        self.placed: list[tuple[Block, int, int, bool]] = []

    def read(self, batch: Any, keep: np.ndarray, h: np.ndarray, locs: np.ndarray) -> None:
        n = len(keep)
        if not n:
            return
        last = self.batches[-1] if self.batches else None
        if last is not None and last[0] is batch:  # rows of the batch read before: one subset at the end
            last[1].append(keep)
        else:
            self.batches.append((batch, [keep]))
        self.src.append(self.read_rows + np.arange(n, dtype=np.int64))
        self.unread_prev.append(np.full(n, -1, np.int64))
        self.idh.append(h)
        self.loc.append(locs)
        self.segments.append(("read", n, None))
        self.read_rows += n
        self.rows += n

    def unread_rows(self, locs: np.ndarray, prev: int, pieces: np.ndarray | None) -> None:
        n = len(locs)
        self.src.append(np.full(n, -1, np.int64))
        self.unread_prev.append(prev + np.arange(n, dtype=np.int64))
        self.segments.append(("unread", n, locs))
        self.unread_pieces.append((n, pieces))
        self.rows += n

    def _unread_pieces(self) -> np.ndarray:
        if all(p is None for _, p in self.unread_pieces):
            return np.zeros(0, np.bool_)
        return np.concatenate([p if p is not None else np.zeros(n, np.bool_) for n, p in self.unread_pieces])

    def piece_marks(self) -> list[tuple[int, bytes, int]]:
        """The marks of the blocks read in pieces whose every record became a row (see `Work.piece_marks`)."""
        marks = []
        for i, (block, start, _, _) in enumerate(self.placed):
            if block.whole is None or block.pieces < 1:
                continue
            group = self.placed[i : i + block.pieces]
            rows = sum(g[2] for g in group)
            if all(g[3] for g in group) and rows:
                marks.append((start, block.whole, rows))
        return marks

    def work(self, records: int, batch: Any) -> Work:
        def cat(parts: list[np.ndarray]) -> np.ndarray:
            return np.concatenate(parts) if parts else _NO_ROWS

        joined = None
        if self.batches:
            parts = [subset(b, keep[0] if len(keep) == 1 else np.concatenate(keep)) for b, keep in self.batches]
            joined = parts[0] if len(parts) == 1 else concat_batches(parts)
        return Work(
            records=records, batch=joined, errors=self.errors, end=batch.end, grid_end=batch.grid_end,
            segments=self.segments, src=cat(self.src), unread_prev=cat(self.unread_prev),
            read_idh=cat(self.idh), read_loc=cat(self.loc), marks=self.marks, counts=self.counts,
            piece_marks=self.piece_marks(),
            unread_pieces=self._unread_pieces(),
        )


def read_work(
    batches: Iterable[Any],
    split: Callable[[Work], None],
    seconds: dict[str, float],
    checks: RowChecks,
    *,
    open_reader: Callable[[Callable[[InputError], None] | None], Any] | None = None,
    unread_index: UnreadIds | None = None,
) -> Iterator[Work]:
    """Read, check and `split` batches into work items (runs in the engine's prefetch thread); read time is
    added to `seconds["read"]`. `open_reader(on_bad_row)` opens the readers (a `BatchSource`'s); else
    `batches` are iterated. `unread_index(start, stop)`: the id hashes and packed locations (its row index's
    `idh`, `loc`) of the previous output's rows it gives back whole."""
    # filled by the reader; under --on-error fail too, so that a line that does not parse is not said before
    # an earlier row the checks refuse (a null text, a repeated id), or before those of a batch held back
    pending: list[InputError] = []
    on_bad = pending.append
    reader = open_reader(on_bad) if open_reader is not None else iter(batches)
    try:
        while True:
            t0 = time.perf_counter()
            batch = next(reader, None)
            seconds["read"] += time.perf_counter() - t0
            if batch is None:
                break
            # the batch's own bad rows: the reader may have cut the next batch already, whose bad rows are
            # reported too (a batch that does not say which are its own: every one reported so far)
            own = getattr(batch, "errors", None)
            work = _check_batch(batch, list(pending) if own is None else own, checks, unread_index)
            handed = {id(e) for e in work.errors}  # (with those of blocks read again after all)
            pending[:] = [e for e in pending if id(e) not in handed]
            split(work)
            yield work
        if pending:  # bad rows after the last batch of a reader that cuts no blocks
            if not checks.skip_mode:
                raise pending[0]
            checks.count(pending)
            yield Work(records=len(pending), errors=list(pending))
    finally:
        close = getattr(reader, "close", None)
        if close is not None:
            close()


def _files_of(batch: Any, n: int) -> np.ndarray:
    """The input file index of each parsed row of a batch (by its blocks)."""
    files = np.zeros(n, np.int64)
    for block in batch.blocks:
        if block.carried is None and block.stop > block.first:
            files[block.first : block.stop] = block.file
    return files


@dataclass
class _Segment:
    """Rows of a batch in input order, checked but not yet registered: read rows (`part`, rows `valid` with
    texts, `blocks`), or a stretch of blocks carried over unread (`unread`, from previous row `prev`)."""

    part: Any = None
    blocks: list[Block] = field(default_factory=list)
    valid: np.ndarray = field(default_factory=lambda: _NO_ROWS)
    errors: list[InputError] = field(default_factory=list)
    h: np.ndarray = field(default_factory=lambda: _NO_ROWS)
    locs: np.ndarray = field(default_factory=lambda: _NO_ROWS)
    unread: bool = False
    prev: int = 0
    at: int = 0  # the row of `part` that is the first row of `blocks` (0: `part` is those blocks' rows alone)


LOCATED = re.compile(r"(?:line|row) (\d+)")
"""A bad row's location as a line (text) or row (Parquet) number."""


def _distinct(h: np.ndarray) -> bool:
    """Whether no value of `h` repeats (sorted neighbours; `np.unique` imports numpy.ma, ~10-30 ms of a start)."""
    s = np.sort(h)
    return not bool((s[1:] == s[:-1]).any())


def _check_batch(
    batch: Any, reported: list[InputError], checks: RowChecks, unread_index: UnreadIds | None
) -> Work:
    """The work item of one batch (see `read_work`), whose reader reported bad rows `reported`."""
    out = _Builder()
    out.errors.extend(reported)
    blocks: list[Block] = batch.blocks or [Block(0, 0, 0, len(batch), errors=len(reported))]
    records = sum(b.records for b in blocks) if batch.blocks else len(batch) + len(reported)
    files = _files_of(batch, len(batch))
    # Every row with its texts (the usual case): hash and locate the batch's ids once, not per read stretch
    # (scattered changes cut a batch into thousands of stretches).
    whole = checks.whole(batch, files) if len(batch) else None
    segments: list[_Segment] = []
    i = 0
    while i < len(blocks):
        j = i
        if blocks[i].carried is not None:
            while j < len(blocks) and blocks[j].carried is not None:
                j += 1
            segments += _carried_segments(blocks[i:j], unread_index)
        else:
            while j < len(blocks) and blocks[j].carried is None:
                j += 1
            segments.append(_read_segment(batch, blocks[i:j], files, checks, whole))
        i = j
    every = [s.h for s in segments if len(s.h)]
    h = np.concatenate(every) if every else _NO_ROWS
    if _distinct(h) and not checks.ids.any_seen(h):  # no id seen before, none repeated: at once
        checks.ids.register(h, np.concatenate([s.locs for s in segments if len(s.h)]) if every else _NO_ROWS)
        for seg in segments:
            if seg.unread:
                _add_unread(out, seg)
            else:
                out.errors.extend(seg.errors)
                _add_read(out, seg, np.zeros(len(seg.valid), dtype=bool))
    else:  # in input order, each stretch against the ids before it
        for seg in segments:
            if not seg.unread:
                drop, repeated = checks.repeats(seg.part, seg.valid, seg.h, seg.locs)
                out.errors.extend([*seg.errors, *repeated])
                _add_read(out, seg, drop)
            elif not checks.ids.any_seen(seg.h):
                checks.ids.register(seg.h, seg.locs)
                _add_unread(out, seg)
            else:
                _reread_blocks(out, seg, checks, unread_index)
    in_input_order(out.errors)
    if out.errors and not checks.skip_mode:
        raise out.errors[0]
    checks.count(out.errors)
    work = out.work(records, batch)
    work.identities = [(b.file, b.group, b.unit) for b in blocks if b.unit is not None]
    work.identities += [(b.file, -1, b.file_unit) for b in blocks if b.file_unit is not None]
    if work.unread:  # (a file read after all, its ids met earlier, has its rows counted as read)
        work.whole_files = [b.file for b in blocks if b.file_unit is not None and b.carried is not None
                            and b.carried.unit and b.group < 0]
    work.exits = list(getattr(batch, "exits", []))
    return work


def in_input_order(errors: list[InputError]) -> None:
    """Sort a batch's bad rows (all of one file) by line or row, in place.

    They are found in two passes, the lines that do not parse as the batch is read and the rows the checks
    refuse (a repeated id) after it, so without this their order would follow where batches end: a rerun that
    carries blocks over unread cuts its batches elsewhere than a full run, and its errors came out in another
    order (the same records, `--errors-file` and the output's metadata not the same bytes).
    """
    found = [LOCATED.fullmatch(e.location or "") for e in errors]
    numbers = [int(m.group(1)) for m in found if m is not None]
    if len(numbers) == len(errors) > 1:
        order = sorted(range(len(errors)), key=numbers.__getitem__)
        errors[:] = [errors[k] for k in order]


def _unread(ids: tuple[np.ndarray, np.ndarray], prev: int, file: int, blocks: list[Block]) -> _Segment:
    h, loc = ids
    loc = (loc & ((1 << LOC_SHIFT) - 1)) | (np.int64(file) << LOC_SHIFT)  # where this run read it
    return _Segment(blocks=blocks, h=h, locs=loc, unread=True, prev=prev)


def _carried_segments(blocks: list[Block], unread_index: UnreadIds | None) -> list[_Segment]:
    """Consecutive blocks carried over unread, as stretches of contiguous previous rows (their row index read
    a stretch at a time)."""
    segments = []
    k = 0
    while k < len(blocks):
        first = blocks[k].carried
        assert first is not None
        end = first.prev + first.rows
        m = k + 1
        while m < len(blocks):  # blocks whose previous rows follow on: one stretch
            c = blocks[m].carried
            if c is None or c.prev != end or blocks[m].file != blocks[k].file:
                break
            end += c.rows
            m += 1
        if unread_index is None:  # carried blocks come from a previous output with a row index only
            raise RuntimeError("a block carried over with no previous row index to take it from")
        segments.append(_unread(unread_index(first.prev, end), first.prev, blocks[k].file, blocks[k:m]))
        k = m
    return segments


def _add_unread(out: _Builder, seg: _Segment) -> None:
    blocks = seg.blocks
    out.counts += [(b.file, b.group, b.carried.rows, b.carried.rows) for b in blocks if b.carried is not None]
    if not any(b.piece for b in blocks):
        out.unread_rows(seg.locs, seg.prev, None)
        return
    start = out.rows
    rows = []
    for b in blocks:
        c = b.carried
        assert c is not None
        if b.piece:
            out.placed.append((b, start, c.rows, True))
        rows.append(c.rows)
        start += c.rows
    out.unread_rows(seg.locs, seg.prev, np.repeat(np.asarray([b.piece for b in blocks], np.bool_), rows))


def _reread_blocks(out: _Builder, seg: _Segment, checks: RowChecks, unread_index: UnreadIds | None) -> None:
    """A stretch carried over unread in which an id seen earlier in the run is: block by block, each carried
    over or (the one with that id) read after all, so the repeat is reported where a full run reports it."""
    for block in seg.blocks:
        c = block.carried
        assert c is not None
        if unread_index is not None:
            one = _unread(unread_index(c.prev, c.prev + c.rows), c.prev, block.file, [block])
            if not checks.ids.any_seen(one.h):
                checks.ids.register(one.h, one.locs)
                _add_unread(out, one)
                continue
        assert c.reread is not None
        start, errors = out.rows, len(out.errors)
        parsed: list[InputError] = []
        for again in c.reread():
            again_blocks = list(again.blocks) or [Block(block.file, block.start, 0, len(again))]
            files = _files_of(again, len(again)) if again.blocks else np.full(len(again), block.file, np.int64)
            part = _read_segment(again, again_blocks, files, checks)
            drop, repeated = checks.repeats(part.part, part.valid, part.h, part.locs)
            out.errors.extend([*part.errors, *repeated])
            _add_read(out, part, drop)
            parsed += again.errors or []
        out.errors.extend(parsed)
        if block.piece:  # a piece read after all: whole if each of its rows is one still
            out.placed.append((block, start, out.rows - start, out.rows - start == c.rows and len(out.errors) == errors))


def _read_segment(
    batch: Any, blocks: list[Block], files: np.ndarray, checks: RowChecks,
    whole: tuple[np.ndarray, np.ndarray] | None = None,
) -> _Segment:
    """The rows read of consecutive `blocks` of `batch`, their texts checked (ids not yet registered);
    `whole`: the id hashes and packed locations of every row of `batch`, all of them with their texts."""
    lo, hi = blocks[0].first, blocks[-1].stop
    if whole is not None:
        return _Segment(part=batch, blocks=blocks, valid=np.arange(lo, hi, dtype=np.int64), h=whole[0][lo:hi],
                        locs=whole[1][lo:hi], at=lo)
    part = batch if (lo, hi) == (0, len(batch)) else slice_batch(batch, lo, hi)
    valid, errors, h, locs = checks.valid(part, files[lo:hi])
    return _Segment(part=part, blocks=blocks, valid=valid, errors=errors, h=h, locs=locs)


def _add_read(out: _Builder, seg: _Segment, drop: np.ndarray) -> None:
    """Add a read segment's kept rows (its valid rows but `drop`) to `out`, with its blocks' counts and marks."""
    blocks = seg.blocks
    if not blocks:
        return
    lo, hi = blocks[0].first, blocks[-1].stop
    keep = seg.valid[~drop]
    first = out.read_rows
    start = out.rows
    kept = np.zeros(hi - lo, dtype=bool)
    kept[keep - seg.at] = True
    kept_before = np.concatenate([[0], np.cumsum(kept)])
    for block in blocks:
        a, b = block.first - lo, block.stop - lo
        rows = int(kept_before[b] - kept_before[a])
        out.counts.append((block.file, block.group, block.records, rows))
        if block.piece:
            out.placed.append((block, start + int(kept_before[a]), rows, block.errors == 0 and rows == b - a))
        if block.identity is not None and block.errors == 0 and rows == b - a and rows:
            out.marks.append((first + int(kept_before[a]), block.identity, rows))
    out.read(seg.part, keep, seg.h[~drop], seg.locs[~drop])


def index_table(work: Work, previous_index: Callable[[np.ndarray], pa.Table] | None = None) -> pa.Table:
    """The row index (INDEX_SCHEMA) of a work item's output rows: the rows read (keys, id hashes, locations,
    blocks read whole, line identities), and the rows carried over unread (their previous row index,
    `previous_index(rows)`, located in this run; a block read in pieces marked as this run reads it)."""
    n = len(work.read_idh)
    keys = work.keys if work.keys is not None else np.zeros(n, f"S{KEY_TYPE.byte_width}")
    src = work.src
    read_marks = list(work.marks)
    unread_marks: list[tuple[int, bytes, int]] = []
    if work.piece_marks:
        rank = np.cumsum(src < 0) - 1  # per output row: its place among the rows carried over unread
        for row, ident, rows in work.piece_marks:
            if src[row] >= 0:
                read_marks.append((int(src[row]), ident, rows))
            else:
                unread_marks.append((int(rank[row]), ident, rows))
    lines = getattr(work.batch, "lines", None) if work.batch is not None else None
    line_ids = np.asarray(lines, np.int64) if lines else np.zeros(n, np.int64)
    read = pa.table(
        [keys_array(keys[:n]), arrow_array(np.asarray(work.read_idh, np.int64)),
         arrow_array(np.asarray(work.read_loc, np.int64)), *_marks(n, read_marks),
         scattered(n, np.nonzero(line_ids)[0], line_ids[line_ids != 0], pa.int64())],
        schema=INDEX_SCHEMA,
    )
    locs = [payload for kind, _, payload in work.segments if kind == "unread"]
    if not locs:
        return read
    assert previous_index is not None
    # one read of the previous row index for every stretch carried unread (thousands of them in a rerun
    # whose changes are spread out), not one each
    unread = conform_index(previous_index(work.unread_prev[src < 0]).replace_schema_metadata(None))
    unread = unread.set_column(unread.schema.get_field_index("loc"), "loc", arrow_array(np.concatenate(locs)))
    if unread_marks or bool(work.unread_pieces.any()):
        # a piece's rows keep no mark of the previous output's block (that block changed); the blocks read in
        # pieces get theirs
        old = unread.column("block").combine_chunks()
        old_rows = unread.column("block_rows").combine_chunks()
        pieces = work.unread_pieces if len(work.unread_pieces) == len(old) else np.zeros(len(old), np.bool_)
        at = np.nonzero(valid_mask(old) & ~pieces)[0]
        kept = arrow_array(at)
        marks = sorted([*zip(at.tolist(), old.take(kept).to_pylist(), to_numpy(old_rows.take(kept)).tolist(),
                             strict=True), *unread_marks])
        block, block_rows = _marks(unread.num_rows, marks)
        unread = unread.set_column(unread.schema.get_field_index("block"), "block", block)
        unread = unread.set_column(unread.schema.get_field_index("block_rows"), "block_rows", block_rows)
    both = pa.concat_tables([read, unread])
    position = np.where(src >= 0, src, 0)
    position[src < 0] = n + np.arange(int((src < 0).sum()))
    return both.take(arrow_array(position)).combine_chunks()


def _marks(n: int, marks: list[tuple[int, bytes, int]]) -> tuple[Any, Any]:
    """The `block` and `block_rows` columns of `n` rows with `marks` (row, identity, rows)."""
    if not marks:
        return pa.nulls(n, KEY_TYPE), pa.nulls(n, pa.int32())
    at = np.asarray([m[0] for m in marks], np.int64)
    return scattered(n, at, [m[1] for m in marks], KEY_TYPE), scattered(n, at, [m[2] for m in marks], pa.int32())


def joined(works: list[Work]) -> Any:
    """The rows to compute of several work items as one batch (None when there are none)."""
    parts = [w.compute for w in works if w.compute is not None and len(w.compute)]
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else concat_batches(parts)


__all__ = ["RowChecks", "Work", "in_input_order", "index_table", "joined", "read_work"]
