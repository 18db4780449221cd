"""The cut points of a run's inputs: where every run of the same inputs ends a batch, so that `--shard K/N`
slices, cut there, hold exactly the batches (and so the packed forwards) of one whole run.

The inputs' bytes on disk, one file after the other, are cut every `segment` bytes (`segment_bytes`: at
least 8 batches of text (256 KiB at the CPU default of 2,048 tokens a forward), and no more than 4,096
cells). A cut ends a pool of rows short, so it costs about one partly filled forward in 8 pools. A cut inside a file falls on the first block start
(`embedcli.io.positions`) at or after it: for a text file the first line 1 + 16k that starts at or after
that byte, for Parquet the first row 16k from its row group's start at or after the row that byte maps to
(by the row groups' sizes in the footer). Inside a CSV or a compressed file (no line is known to start a
record without reading from the top) a cut moves to the file's end. Each run ends a batch at every cut;
slice K of N is cells `[K*C//N, (K+1)*C//N)` of the C cells, read from the cut that starts it: a seek
(Parquet, by its footer; text, after counting the line breaks before it), not a read of the rows before.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow.parquet as pq

from embedcli.errors import STDIN
from embedcli.io.commit import arrow_source
from embedcli.io.errors import InputError
from embedcli.io.location import is_url, object_fingerprint
from embedcli.io.positions import BLOCK_LINES, ReadPoint
from embedcli.io.reader_base import compression_of, open_binary
from embedcli.io.readers import detect_format

CHARS_PER_TOKEN = 4
FORWARDS_PER_BATCH = 4
SEGMENT_BATCHES = 8
MAX_CELLS = 4096
DEFAULT_SEGMENT = 1 << 22


def batch_chars(engine: Any) -> int | None:
    """The text-size cap of a batch for `engine` (None when it has no token budget): a batch is a few of the
    engine's packed forwards on any device and any text length; it depends on the token budget only."""
    budget = getattr(engine, "max_batch_tokens", None)
    return budget * CHARS_PER_TOKEN * FORWARDS_PER_BATCH if isinstance(budget, int) else None


def segment_bytes(total: int, chars: int | None) -> int:
    """The spacing of cuts over `total` bytes of input."""
    least = SEGMENT_BATCHES * chars if chars else DEFAULT_SEGMENT
    return max(least, -(-total // MAX_CELLS), 1)


def seekable(path: str, fmt: str) -> bool:
    """Whether a cut may fall inside this input (else it moves to the input's end)."""
    return path != STDIN and fmt != "csv" and compression_of(path) is None


@dataclass(frozen=True)
class Grid:
    """The cuts of a run's inputs (see the module docstring)."""

    sizes: list[int]
    fmts: list[str]
    segment: int
    block: int = BLOCK_LINES
    cuts: dict[int, list[int]] = field(default_factory=dict)  # file -> positions (bytes; Parquet: rows)

    @property
    def cells(self) -> int:
        """Cells between cuts (at least 1)."""
        return max(1, -(-sum(self.sizes) // self.segment))

    def locate(self, cell: int) -> tuple[int, int] | None:
        """(file, byte offset in it) where cell `cell` starts; None for the end of the inputs."""
        if cell <= 0:
            return 0, 0
        x = cell * self.segment
        at = 0
        for f, size in enumerate(self.sizes):
            if x < at + size:
                return f, x - at
            at += size
        return None


def grid_of(paths: Sequence[str], fmt: str | None, chars: int | None, block: int = BLOCK_LINES,
            first_only: bool = False, fingerprints: Sequence[Mapping[str, Any]] | None = None) -> Grid | None:
    """The cuts of inputs `paths` (None when one is stdin or cannot be sized); `block`: lines of a block;
    `fingerprints`: the inputs' (`embedcli.io.fingerprint`), whose sizes spare a stat (a store request, for an
    object) per input.

    `first_only`: the first cut alone, none of the others located. Every run ends a batch there, `--incremental`
    and `--engine ray` included: the first batch fixes a JSON input's types, so it must end where a whole run's
    does, or a rerun types a column otherwise (and gives line identities elsewhere) than a full run."""
    if any(p == STDIN for p in paths):
        return None
    try:
        known = [n for fp in fingerprints or () if isinstance(n := fp.get("size"), int)]
        if len(known) == len(paths) == len(fingerprints or ()):  # every input's size known
            sizes = known
        else:
            sizes = [_size(p) for p in paths]
    except (OSError, InputError):
        return None
    fmts = [detect_format(p, fmt) for p in paths]
    grid = Grid(sizes, fmts, segment_bytes(sum(sizes), chars), block)
    for cell in range(1, grid.cells):
        where = grid.locate(cell)
        if where is None:
            break
        f, offset = where
        path = paths[f]
        if offset == 0:
            grid.cuts.setdefault(f, []).append(0)
        elif not seekable(path, fmts[f]):
            grid.cuts.setdefault(f, []).append(sizes[f])  # at its end
        elif fmts[f] == "parquet":
            grid.cuts.setdefault(f, []).append(parquet_row(path, offset, block))
        else:
            grid.cuts.setdefault(f, []).append(offset)
        if first_only:
            break
    return grid


def _size(path: str) -> int:
    """An input's size in bytes (an object's from its store's metadata, nothing read)."""
    return int(object_fingerprint(path)["size"]) if is_url(path) else os.stat(path).st_size


def parquet_row(path: str, offset: int, block: int = BLOCK_LINES) -> int:
    """The block start a byte offset of a Parquet file maps to (by its row groups' sizes; 16-row blocks)."""
    md = pq.ParquetFile(arrow_source(path)).metadata
    row = 0
    for g in range(md.num_row_groups):
        rg = md.row_group(g)
        columns = [rg.column(i) for i in range(rg.num_columns)]
        starts = [c.dictionary_page_offset or c.data_page_offset for c in columns]
        ends = [s + c.total_compressed_size for s, c in zip(starts, columns, strict=True)]
        lo, hi = (min(starts), max(ends)) if starts else (0, 0)
        n = rg.num_rows
        if offset < hi or g == md.num_row_groups - 1:
            if offset <= lo:
                return row
            inside = min(n, -(-(offset - lo) * n // max(1, hi - lo)))
            return row + min(n, -(-inside // block) * block)
        row += n
    return row


def text_point(path: str, offset: int, block: int = BLOCK_LINES) -> tuple[int, int] | None:
    """(byte offset, lines before it) of the first line 1 + 16k of a text file starting at or after byte
    `offset`; None when there is none (the cut is at the file's end). Counts line breaks, parses nothing."""
    lines = 0
    pos = 0
    last = b"\n"  # the byte before `pos` (none before the start: a line starts there)
    with open_binary(path) as f:  # read front to back, never seeking (an object's stream cannot)
        while pos < offset:  # line breaks before `offset`, a megabyte at a time
            chunk = f.read(min(1 << 20, offset - pos))
            if not chunk:
                return None
            lines += chunk.count(b"\n")
            pos += len(chunk)
            last = chunk[-1:]
        # `pos == offset`: is a line starting here? Not unless the byte before it is a line break.
        at_start = last == b"\n"
        if not at_start:  # finish the line in hand
            rest = f.readline()
            if not rest.endswith(b"\n"):
                return None
            pos += len(rest)
            lines += 1
        while lines % block:  # the next line 1 + 16k
            line = f.readline()
            if not line.endswith(b"\n"):
                return None
            pos += len(line)
            lines += 1
        if not f.read(1):
            return None
    return pos, lines


def start_point(
    paths: Sequence[str], fmts: Sequence[str], where: tuple[int, int] | None, state: dict[str, Any],
    block: int = BLOCK_LINES,
) -> ReadPoint | None:
    """The read point a slice starting at `where` (from `Grid.locate`) opens at (None: the inputs' end)."""
    while where is not None:
        f, offset = where
        if offset == 0:
            return ReadPoint(f, 0, 0, state=state)
        if not seekable(paths[f], fmts[f]):
            where = (f + 1, 0) if f + 1 < len(paths) else None
            continue
        if fmts[f] == "parquet":
            row = parquet_row(paths[f], offset, block)
            total = pq.ParquetFile(arrow_source(paths[f])).metadata.num_rows
            if row >= total:
                where = (f + 1, 0) if f + 1 < len(paths) else None
                continue
            return ReadPoint(f, row, row, state=state)
        found = text_point(paths[f], offset, block)
        if found is None:
            where = (f + 1, 0) if f + 1 < len(paths) else None
            continue
        return ReadPoint(f, found[0], found[1], state=state)
    return None


def stop_point(
    paths: Sequence[str], fmts: Sequence[str], where: tuple[int, int] | None, block: int = BLOCK_LINES
) -> ReadPoint | None:
    """Where a slice ending at the cut `where` (from `Grid.locate`) stops reading (None: the inputs' end); a
    text file's stop is the cut's byte with `line` -1 (the reader stops at the first line 1 + 16k from it)."""
    if where is None:
        return None
    f, offset = where
    following = ReadPoint(f + 1, 0, 0) if f + 1 < len(paths) else None
    if offset == 0:
        return ReadPoint(f, 0, 0)
    if not seekable(paths[f], fmts[f]):
        return following
    if fmts[f] == "parquet":
        row = parquet_row(paths[f], offset, block)
        return ReadPoint(f, row, row) if row < pq.ParquetFile(arrow_source(paths[f])).metadata.num_rows else following
    return ReadPoint(f, offset, -1)
