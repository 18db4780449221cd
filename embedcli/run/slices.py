"""The slices of a run's inputs that the Ray Data engine hands its workers, each read by the worker itself.

A slice is a stretch of the inputs between two `ReadPoint`s (`embedcli.io.positions`): a worker opens the
inputs at the slice's start and reads up to its stop, so no record is read twice and the driver reads none.
Slices start only at the run's cuts (`embedcli.run.grid`), where every run of the same inputs ends a batch and
a pool: a worker's batches, and so its packed forwards, are those of a local run, whose output a Ray run's is
byte for byte. Of the cuts, a slice may start at:

- **a file's start**, and any cut the grid moves to the end of the file before (CSV, TSV, compressed);
- **inside a Parquet file**, at the cut's row (its footer says where; any object store);
- **inside a local, uncompressed JSON Lines or text file**, at the cut's line (the byte offsets of the cuts'
  lines come from one scan of the file's line breaks; nothing is parsed).

A cut inside other text (an object in a store, read front to back) stays inside its slice: the worker ends a
batch there as a local run does. Consecutive pieces are grouped into slices of about `--shard-rows` records
(fewer in a run too small to give every worker four, but not under 1,024), at least one cell of the grid each.
A resumed run plans from where the manifest's last shard ends, and cuts the rest as the first run did.

A slice that starts past the inputs' first batch starts with the readers' state after that batch (the run's
types, which the first batch of JSON rows fixes); a resumed run's first slice starts at the manifest's read
point, with the state recorded there. Inside a JSON Lines file the reader decides the file's id field from its
first record itself (`embedcli.io.jsonl_reader`): what a whole run's reader has when it gets there.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from embedcli.errors import STDIN
from embedcli.io.location import is_url
from embedcli.io.parquet_source import open_parquet
from embedcli.io.positions import BLOCK_LINES, ReadPoint
from embedcli.io.reader_base import compression_of
from embedcli.io.readers import count_records, detect_format
from embedcli.run.grid import Grid, seekable
from embedcli.run.source import BatchSource

SCAN_BYTES = 1 << 22
SLICES_PER_WORKER = 4
"""A small run is cut finer than `--shard-rows`, into this many slices a worker, so every worker has some."""
MIN_SLICE_ROWS = 1024
"""... but no slice of fewer records than this (each slice costs a worker a few files and a round trip)."""


@dataclass(frozen=True)
class InputSlice:
    """One worker's share of the inputs: from `start` up to `stop` (None: the inputs' start / end)."""

    number: int  # its place in the plan (its shard is committed after the slices before it)
    start: ReadPoint | None
    stop: ReadPoint | None
    skip: int = 0  # records at its start already committed (a run resumed from a manifest without read points)
    records: int | None = None  # the records it holds, as far as known without reading (lines, rows)

    @property
    def end(self) -> ReadPoint | None:
        """Where reading goes on after this slice (None: past the inputs)."""
        return self.stop


@dataclass(frozen=True)
class SliceSource(BatchSource):
    """A `BatchSource` read from `start` up to `stop` only (one slice of a run)."""

    start: ReadPoint | None = None
    stop: ReadPoint | None = None

    def open(self, paths: Sequence[str] | None = None, **kwargs: Any) -> Iterator[Any]:
        kwargs.setdefault("start", self.start)
        kwargs.setdefault("stop", self.stop)
        return BatchSource.open(self, paths, **kwargs)


def sliceable(source: Any, paths: Sequence[str]) -> bool:
    """Whether the planner can cut `source` (plain input files; a `--shard` or repair range is one slice)."""
    return type(source) is BatchSource and STDIN not in paths


@dataclass(frozen=True)
class FirstBatch:
    """The readers' state after the batch that settles the run's types (JSON rows fix them from the first
    batch), and where that batch ends: no slice starts before it (None: anywhere)."""

    state: dict[str, Any]
    end: ReadPoint | None = None


def first_batch(source: BatchSource, paths: Sequence[str], batch_rows: int, batch_chars: int | None,
                cuts: Mapping[int, Sequence[int]] | None = None) -> FirstBatch:
    """Read the inputs' first batches alone (`cuts`: where a batch must end, as the run's), up to the one that
    settles the readers' types (`FirstBatch`).

    A slice starting inside that stretch would read its rows with the types already fixed, where a whole run
    reads them before: the same rows, but with the line identities (the row index's `line`) a whole run
    cannot give them yet, and types fixed from fewer rows when the first slice ends inside it."""
    reader: Any = source.open(paths, batch_rows=batch_rows, on_bad_row=lambda e: None, batch_chars=batch_chars,
                              cuts=cuts)
    end = ReadPoint(len(paths), 0, 0)  # read to the end unsettled: one slice
    try:
        for batch in reader:
            if reader.spec.settled:
                end = batch.end if batch.end is not None else end
                break
        return FirstBatch(dict(reader.spec.state()), end)
    finally:
        reader.close()


def line_points(path: str, offsets: Sequence[int], block: int = BLOCK_LINES) -> tuple[list[tuple[int, int] | None], int]:
    """For each byte offset (ascending) of a text file, (byte offset, lines before it) of the first line 1 + 16k
    (`block` lines) starting at or after it, None when there is none (the cut is at the file's end), as
    `embedcli.run.grid.text_point` finds one; and the file's line count: one scan of its line breaks."""
    found: list[tuple[int, int] | None] = [None] * len(offsets)
    pending = 0  # offsets before this one are answered
    lines = pos = 0
    last = b"\n"
    with open(path, "rb") as f:
        while chunk := f.read(SCAN_BYTES):
            breaks = np.flatnonzero(np.frombuffer(chunk, np.uint8) == 10)
            # line starts after this chunk's breaks that begin a block: (lines before them) % block == 0
            first = (-(lines + 1)) % block
            starts = pos + breaks[first::block] + 1
            numbers = lines + 1 + np.arange(first, len(breaks), block)
            while pending < len(offsets):
                k = int(np.searchsorted(starts, offsets[pending]))
                if k == len(starts):
                    break
                found[pending] = (int(starts[k]), int(numbers[k]))
                pending += 1
            lines += len(breaks)
            pos += len(chunk)
            last = chunk[-1:]
    # a line "starting" at the file's end is none
    return [x if x is not None and x[0] < pos else None for x in found], lines + (last != b"\n")


def _splittable_text(path: str, fmt: str) -> bool:
    if fmt not in ("jsonl", "txt") or is_url(path) or compression_of(path) is not None:
        return False
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def _file_points(grid: Grid, paths: Sequence[str], fmts: Sequence[str], f: int
                 ) -> tuple[list[tuple[int, int]], int | None, bool]:
    """(position, records before it) of the cuts a slice may start at inside input `f` (its start excluded), its
    records (None: not known without reading it), and whether a cut falls at (or is moved to) its end, where a
    run then ends a batch and a pool."""
    path, fmt = paths[f], fmts[f]
    inside = sorted({c for c in grid.cuts.get(f, []) if c > 0})
    if fmt == "parquet":
        with open_parquet(path) as pf:
            total = pf.metadata.num_rows
        return [(row, row) for row in inside if row < total], total, any(row >= total for row in inside)
    if _splittable_text(path, fmt):
        found, lines = line_points(path, inside, grid.block)
        return sorted({x for x in found if x is not None}), lines, any(x is None for x in found)
    # read front to back (CSV, compressed, an object's text): no slice starts inside; a cut the grid moved to
    # the end (`embedcli.run.grid.seekable`) is known to end a batch there, one inside text is not
    return [], count_records(path, fmt), bool(inside) and not seekable(path, fmt)


def _pieces(grid: Grid, paths: Sequence[str], fmts: Sequence[str]) -> list[tuple[ReadPoint, int | None]]:
    """(where a slice may start, records from there to the next such place, None: not known) over the inputs,
    from their start: the inputs' start and the cuts of `grid` a worker can open at (the module docstring)."""
    points: list[tuple[ReadPoint, int | None]] = []
    boundary = True  # the inputs' start

    def add(records: int | None) -> None:
        point, n = points[-1]
        points[-1] = (point, None if n is None or records is None else n + records)

    for f in range(len(paths)):
        inside, total, at_end = _file_points(grid, paths, fmts, f)
        if boundary or 0 in grid.cuts.get(f, ()):
            points.append((ReadPoint(f, 0, 0), 0))
        before = 0
        for pos, records in inside:
            add(records - before)
            points.append((ReadPoint(f, pos, records), 0))
            before = records
        add(None if total is None else total - before)
        boundary = at_end
    return points


def slice_rows(rows: int, total: int, workers: int) -> int:
    """Records of a slice: `rows` (`--shard-rows`), or fewer where that leaves `workers` too few slices."""
    share = -(-total // max(1, SLICES_PER_WORKER * workers))
    return max(1, min(rows, max(min(MIN_SLICE_ROWS, rows), share)))


def plan_slices(
    source: BatchSource,
    paths: Sequence[str],
    rows: int,
    *,
    grid: Grid,
    workers: int = 1,
    begin: ReadPoint | None = None,
    first: Callable[[], FirstBatch] | None = None,
) -> list[InputSlice]:
    """The slices of `paths` from `begin` (None: their start) to their end, each starting at a cut of `grid`
    (the run's: `embedcli.run.grid.grid_of`), of about `rows` records (fewer when the inputs would give `workers`
    too few, `slice_rows`); `first()`: the inputs' first batch (`first_batch`): a slice starting elsewhere takes
    the readers' state after it, and none starts inside it."""
    if not paths:
        return []
    fmts = [detect_format(p, source.inputs.fmt) for p in paths]
    points = _pieces(grid, paths, fmts)
    # Sized by the whole inputs, a resumed run included: it cuts the rest as the first run did.
    rows = slice_rows(rows, sum(n or 0 for _, n in points), workers)
    if begin is not None:
        if begin.file >= len(paths):
            return []
        points = [(p, n) for p, n in points if p.order() >= begin.order()]
        if not points or points[0][0].order() != begin.order():  # not one of this plan's (a local run's commit)
            points.insert(0, (begin, None))
        else:
            points[0] = (begin, points[0][1])  # with the readers' state recorded there
    settled: FirstBatch | None = None
    if begin is None and len(points) > 1 and first is not None:
        settled = first()
        if settled.end is not None:
            end = settled.end.order()
            kept = [points[0]]
            for p, n in points[1:]:
                if p.order() < end:  # inside the first batch: its records counted with the inputs' start
                    head, held = kept[0]
                    kept[0] = (head, None if held is None or n is None else held + n)
                else:
                    kept.append((p, n))
            points = kept
    starts: list[tuple[ReadPoint, int | None]] = []
    held = 0
    for point, count in points:
        if not starts or held >= rows:
            starts.append((point, 0))
            held = 0
        held += rows if count is None else count
        p, n = starts[-1]
        starts[-1] = (p, None if n is None or count is None else n + count)
    if not starts:
        return []
    readers_state: dict[str, Any] | None = None
    slices = []
    for i, (point, count) in enumerate(starts):
        start: ReadPoint | None = point
        if point.order() == (0, 0, 0) and not point.state:
            start = None  # the inputs' start: a fresh reader, as a whole run has
        elif not point.state:
            if readers_state is None:
                if settled is None and first is not None:
                    settled = first()
                readers_state = settled.state if settled is not None else {}
            start = ReadPoint(point.file, point.pos, point.line, state={"spec": readers_state})
        stop = starts[i + 1][0] if i + 1 < len(starts) else None
        slices.append(InputSlice(i, start, stop, records=count))
    return slices
