"""The slices of a run's inputs that the Ray Data engine hands its workers, each read by the worker itself.

A slice is a stretch of the inputs between two `ReadPoint`s (`embedcli.io.positions`): a worker opens the
inputs at the slice's start and reads up to its stop, so no record is read twice and the driver reads none.
The planner cuts where a reader can start without reading what comes before:

- **Parquet**: at row group starts (from the footer);
- **JSON Lines and plain text** (uncompressed local files): every 1,024 lines (or `--shard-rows`, when fewer,
  rounded up to whole 16-line blocks: a reader stops only between blocks, `embedcli.io.positions`),
  at the start of the next line (the byte offsets come from one scan of the file's line breaks; nothing is
  parsed);
- **CSV, TSV, compressed and object-store text**: at the file's start only (a record's start inside them is not
  known without reading from the top);

and groups consecutive pieces into slices of about `--shard-rows` records (fewer in a run too small to give
every worker four slices, but not under 1,024), so many small files share a slice. The cuts depend on the
inputs, `--shard-rows` and the number of workers only; a resumed run plans from where the manifest's last
shard ends.

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
from embedcli.run.source import BatchSource

SCAN_BYTES = 1 << 22
CUT_LINES = 1024
"""A text file may be cut every this many lines (fewer with a smaller `--shard-rows`); slices group the pieces.
A multiple of the readers' 16-line blocks (`embedcli.io.positions`), so a slice's blocks are a whole run's."""
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


def _text_cuts(path: str, every: int) -> tuple[list[tuple[int, int]], int]:
    """(byte offset, lines before it) of the start of line 1 + k*`every` for k >= 1 (inside the file), and
    the file's line count: one scan of its line breaks."""
    cuts: list[tuple[int, int]] = []
    lines = pos = 0
    wanted = every
    last = b"\n"
    with open(path, "rb") as f:
        while chunk := f.read(SCAN_BYTES):
            breaks = np.flatnonzero(np.frombuffer(chunk, np.uint8) == 10)
            while wanted <= lines + len(breaks):
                cuts.append((pos + int(breaks[wanted - lines - 1]) + 1, wanted))
                wanted += every
            lines += len(breaks)
            pos += len(chunk)
            last = chunk[-1:]
    if cuts and cuts[-1][0] >= pos:
        cuts.pop()  # a cut at the very end: nothing after it
    return cuts, lines + (last != b"\n")


def _splittable_text(path: str, fmt: str) -> bool:
    if fmt not in ("jsonl", "txt") or is_url(path) or compression_of(path) is not None:
        return False
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def _pieces(path: str, fmt: str, rows: int) -> list[tuple[int, int, int | None]]:
    """(position, lines before it, records up to the next piece or None) of the places a slice may start
    inside one input (its start first)."""
    if fmt == "parquet":
        with open_parquet(path) as pf:
            md = pf.metadata
            out: list[tuple[int, int, int | None]] = []
            at = 0
            for g in range(md.num_row_groups):
                n = md.row_group(g).num_rows
                out.append((at, at, n))
                at += n
            return out or [(0, 0, 0)]
    if _splittable_text(path, fmt):
        cuts, lines = _text_cuts(path, rows)
        starts = [(0, 0), *cuts]
        ends = [line for _, line in cuts] + [lines]
        return [(pos, line, end - line) for (pos, line), end in zip(starts, ends, strict=True)]
    return [(0, 0, count_records(path, fmt))]


def cut_lines(rows: int, block: int = BLOCK_LINES) -> int:
    """Lines between a text file's cuts: `CUT_LINES`, or `rows` when fewer, rounded up to whole blocks of
    `block` lines (the readers stop a slice only between blocks, `embedcli.io.line_blocks`)."""
    return -(-min(rows, CUT_LINES) // block) * block


def slice_rows(rows: int, total: int, workers: int) -> int:
    """Records of a slice: `rows` (`--shard-rows`), or fewer where that leaves `workers` too few slices."""
    share = -(-total // max(1, SLICES_PER_WORKER * workers))
    return max(1, min(rows, max(min(MIN_SLICE_ROWS, rows), share)))


def plan_slices(
    source: BatchSource,
    paths: Sequence[str],
    rows: int,
    *,
    workers: int = 1,
    begin: ReadPoint | None = None,
    first: Callable[[], FirstBatch] | None = None,
    block: int = BLOCK_LINES,
) -> list[InputSlice]:
    """The slices of `paths` from `begin` (None: their start) to their end, of about `rows` records each (fewer
    when the inputs would give `workers` too few, `slice_rows`); `first()`: the inputs' first batch
    (`first_batch`): a slice starting elsewhere takes the readers' state after it, and none starts inside it;
    `block`: the readers' block lines (text is cut between blocks)."""
    points: list[tuple[ReadPoint, int | None]] = []
    fmts = [detect_format(p, source.inputs.fmt) for p in paths]
    for f, path in enumerate(paths):
        for pos, line, count in _pieces(path, fmts[f], cut_lines(rows, block)):
            points.append((ReadPoint(f, pos, line), count))
    # Sized by the whole inputs, a resumed run included: it cuts the rest as the first run did.
    rows = slice_rows(rows, sum(n or 0 for _, n in points), workers)
    if begin is not None:
        if begin.file >= len(paths):
            return []
        points = [(p, n) for p, n in points if p.order() >= begin.order()]
        if not points or points[0][0].order() != begin.order():  # not one of this plan's cuts (another --shard-rows)
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
