"""Blocks and batches of a line-based input (JSON Lines, plain text): where blocks and batches end, which
blocks are carried over unread, and where reading stands after each batch (see `embedcli.io.positions`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from embedcli.io.errors import STDIN
from embedcli.io.positions import BLOCK_LINES, WHOLE, Carried, FilePart, ReadPoint, identity, line_identities
from embedcli.io.reader_base import (
    BOM,
    READ_ERRORS,
    BatchBuilder,
    InputBatch,
    Lines,
    ReadSpec,
    open_binary,
    read_error,
    refuse_utf16,
    seek_binary,
)


def block_start(line: int, size: int = BLOCK_LINES) -> bool:
    """Whether a block of `size` lines starts at 1-based `line` whatever the text before it (lines 1 + 16k)."""
    return (line - 1) % size == 0


@dataclass
class LineFormat:
    """What the driver needs of a format: parse a line into a builder, the context a block's identity depends
    on (None: no identity), the per-file reader state a `ReadPoint` keeps, and a fresh builder."""

    parse: Callable[[BatchBuilder, int, bytes], None]
    context: Callable[[], str | None]
    state: Callable[[], dict[str, Any]]
    builder: Callable[[], BatchBuilder]
    # rows carried over unread: records were read there once, so what a format says of the file's first
    # record (JSON Lines: a JSON array, the --format txt hint) no longer applies, as in a run that reads them
    carried: Callable[[], None] = lambda: None


def read_line_blocks(
    path: str,
    spec: ReadSpec,
    fmt: LineFormat,
    part: FilePart = WHOLE,
    *,
    idle: bool = False,
) -> Iterator[InputBatch]:
    """The batches of one line-based file, from `start` to `stop` (same file) or its end.

    A block ends before line 1 + 16k, or after the line that brings its text to `BLOCK_BYTES`; a batch ends at
    the first block boundary where the builder is full, at a cut (the first line 1 + 16k at or after each
    byte offset in `cuts`), at `stop`, or at the end of the file. A file is read a megabyte at a time and cut
    into blocks by its line breaks (a block carried over is hashed, never split into lines); stdin, line by
    line, as lines arrive."""
    if idle and path == STDIN:
        yield from _stream(path, spec, fmt, part.file)
        return
    yield from _LineBlocks(path, spec, fmt, part).batches()


def _stream(path: str, spec: ReadSpec, fmt: LineFormat, file: int) -> Iterator[InputBatch]:
    """stdin (read once: nothing resumes or carries over), line by line; a pause of its writer hands on what
    arrived, to be computed now."""
    builder = fmt.builder()
    with open_binary(path) as f:
        for lineno, raw in Lines(f, path, idle=True):
            if raw is None:
                if builder.has_blocks():
                    yield builder.take(grid_end=True)
                continue
            builder.begin(lineno)
            fmt.parse(builder, lineno, raw)
            builder.end_block()
            if builder.full():
                yield builder.take()
    if builder.has_blocks():
        yield builder.take()


CHUNK_BYTES = 1 << 20


@dataclass
class _Reread:
    """Carried blocks (or a piece of one) read after all (the run met one of their ids earlier), each a block
    with its identity, so those whose every record becomes a row are marked whole as a full run marks them."""

    blocks: Any  # the _LineBlocks
    # (first line, identity (None: a piece), a chunk of the file, its line ends, the block's first byte, first
    # and last line + 1 of those ends): the block is chunk[start : ends[last - 1]]
    parts: list[tuple[int, bytes | None, bytes, list[int], int, int, int]]

    def __call__(self) -> Iterator[InputBatch]:
        reader = self.blocks
        b = reader.fmt.builder()
        context = reader.fmt.context() if reader.spec.identities else None
        for first_line, ident, chunk, chunk_ends, start, first, last in self.parts:
            data, ends = chunk[start : chunk_ends[last - 1]], [x - start for x in chunk_ends[first:last]]
            b.begin(first_line, ident)
            reader._parse(b, first_line, data, ends, line_identities(context, data, ends) if context else None)
            b.end_block()
        yield b.take()


@dataclass
class _Ahead:
    """A chunk's blocks looked up at once (`_LineBlocks.look_ahead`), under the context they were hashed in:
    first line -> (identity, (first row, rows) in the previous output or None, line identities, previous
    rows of the lines)."""

    context: str
    blocks: dict[int, tuple[bytes, tuple[int, int] | None, np.ndarray | None, np.ndarray | None]] = field(
        default_factory=dict)


class _LineBlocks:
    """One text file's blocks and batches (see `read_line_blocks`)."""

    def __init__(self, path: str, spec: ReadSpec, fmt: LineFormat, part: FilePart) -> None:
        self.path, self.spec, self.fmt, self.file = path, spec, fmt, part.file
        start, stop, cuts = part.start, part.stop, part.cuts
        self.offset0 = start.pos if start is not None else 0
        self.line0 = start.line if start is not None else 0
        self.stop = stop
        self.size = spec.block_lines
        self._cuts = iter([c for c in cuts if c > self.offset0])
        self.next_cut = next(self._cuts, None)
        self.builder = fmt.builder()

    def stops(self, before: int, line: int) -> bool:
        """Whether reading stops before line `line` (at byte `before`): an exact point (a commit's), or a cut
        (`line` -1: the first line 1 + 16k at or after that byte)."""
        stop = self.stop
        return stop is not None and before >= stop.pos and (stop.line >= 0 or block_start(line, self.size))

    def point(self, offset: int, line: int) -> Callable[[], ReadPoint]:
        spec, fmt, file = self.spec, self.fmt, self.file
        return lambda: ReadPoint(file, offset, line, state={"spec": spec.state(), "file": fmt.state()})

    def look_ahead(self, data: bytes, ends: list[int], spans: list[tuple[int, int, int, int]],
                   at_start: bool) -> _Ahead | None:
        """The identities of a chunk's blocks and, for those the previous output lacks, of their lines and
        the previous rows of those: one lookup for the chunk, not one per block that changed."""
        spec = self.spec
        context = self.fmt.context() if spec.identities else None
        if context is None or spec.carry_lines is None:
            return None
        ahead = _Ahead(context)
        changed: list[tuple[int, np.ndarray]] = []
        for first_line, s, a, b in spans:
            if at_start and s == 0 and data.startswith(BOM):
                s += len(BOM)
            block = data[s : ends[b - 1]]
            ident = identity(f"{context}\x00{first_line}", block)
            found = spec.carry_blocks.get(ident) if spec.carry_blocks else None
            lines = None if found is not None else line_identities(context, block, [x - s for x in ends[a:b]])
            ahead.blocks[first_line] = (ident, found, lines, None)
            if lines is not None:
                changed.append((first_line, lines))
        if changed:
            every = np.concatenate([lines for _, lines in changed])
            numbers = np.concatenate([first + np.arange(len(lines), dtype=np.int64) for first, lines in changed])
            prev = spec.carry_lines(every, numbers)
            at = 0
            for first_line, lines in changed:
                ident, found, _, _ = ahead.blocks[first_line]
                ahead.blocks[first_line] = (ident, found, lines, prev[at : at + len(lines)])
                at += len(lines)
        return ahead

    def flush(self, first_line: int, data: bytes, ends: list[int], ahead: _Ahead | None = None) -> None:
        """Read a block's lines (`data`, lines ending at `ends`), or carry them over unread: the whole block, or
        (a block that changed) its unchanged lines."""
        spec, fmt, builder = self.spec, self.fmt, self.builder
        ident = None
        lines = None
        context = fmt.context() if spec.identities else None
        if context is not None:
            known = ahead.blocks.get(first_line) if ahead is not None and ahead.context == context else None
            if known is not None:
                ident, found, lines, prev = known
            else:
                ident = identity(f"{context}\x00{first_line}", data)
                found = spec.carry_blocks.get(ident) if spec.carry_blocks else None
                prev = None
            if found is not None:
                self._carry(ident, found[0], found[1], [(first_line, ident, data, ends, 0, 0, len(ends))])
                return
            if lines is None:
                lines = line_identities(context, data, ends)
            if prev is None and spec.carry_lines is not None:
                prev = spec.carry_lines(lines, first_line + np.arange(len(lines), dtype=np.int64))
            if prev is not None and bool((prev >= 0).any()):
                assert ident is not None
                self._pieces(first_line, ident, data, ends, lines, prev)
                return
        builder.begin(first_line, ident)
        self._parse(builder, first_line, data, ends, lines)
        builder.end_block()

    def _carry(self, ident: bytes, prev: int, rows: int,
               parts: list[tuple[int, bytes | None, bytes, list[int], int, int, int]]) -> None:
        """Carry blocks over unread (their previous rows `prev`, `rows` of them, one after the other); right after
        a carried block whose previous rows they follow, as more of that block (one block of many: the checks
        and the index take a stretch at a time anyway)."""
        builder = self.builder
        if rows:
            self.fmt.carried()
        last = builder.blocks[-1] if builder.blocks and builder.block is None else None
        c = last.carried if last is not None else None
        if (last is not None and c is not None and isinstance(c.reread, _Reread) and not last.piece
                and c.prev + c.rows == prev and self.stop is None and self.next_cut is None):
            c.reread.parts.extend(parts)
            last.carried = Carried(c.prev, c.rows + rows, reread=c.reread)
            builder.records += rows
            return
        builder.carry(parts[0][0], ident, Carried(prev, rows, reread=_Reread(self, parts)))

    def carried_run(self, ahead: _Ahead | None, spans: list[tuple[int, int, int, int]], p: int
                    ) -> tuple[int, int, int]:
        """The run of a chunk's blocks from `spans[p]` that the previous output has, at consecutive rows, and
        that the batch in hand takes whole (its records stay under `batch_records` before each): carried as one,
        with no block-by-block pass. (its end, its first previous row, its rows); the end is `p`: none."""
        if ahead is None or self.stop is not None or self.next_cut is not None:
            return p, -1, 0
        context = self.fmt.context() if self.spec.identities else None
        if context is None or context != ahead.context:
            return p, -1, 0
        blocks = ahead.blocks
        budget = self.spec.batch_records - self.builder.records
        q, first, expect = p, -1, -1
        while q < len(spans):
            known = blocks.get(spans[q][0])
            found = known[1] if known is not None else None
            if found is None or (q > p and (found[0] != expect or budget <= 0)):
                break
            if q == p:
                first = found[0]
            expect = found[0] + found[1]
            budget -= found[1]
            q += 1
        return q, first, expect - first if q > p else 0

    def _pieces(self, first_line: int, ident: bytes, data: bytes, ends: list[int], lines: np.ndarray,
                prev: np.ndarray) -> None:
        """A block that changed, in pieces: each run of lines the previous output has (at consecutive rows)
        carried over, the lines between read."""
        builder = self.builder
        before = len(builder.blocks)
        rows = prev.tolist()
        n = len(ends)
        k = 0
        while k < n:
            m = k + 1
            if rows[k] >= 0:
                while m < n and rows[m] == rows[m - 1] + 1:
                    m += 1
                self.fmt.carried()
                lo = ends[k - 1] if k else 0
                builder.carry(first_line + k, None, Carried(
                    rows[k], m - k, reread=_Reread(self, [(first_line + k, None, data, ends, lo, k, m)])))
            else:
                while m < n and rows[m] < 0:
                    m += 1
                lo = ends[k - 1] if k else 0
                builder.begin(first_line + k)
                self._parse(builder, first_line + k, data[lo:ends[m - 1]], [e - lo for e in ends[k:m]], lines[k:m])
                builder.end_block()
            k = m
        pieces = builder.blocks[before:]
        for block in pieces:
            block.piece = True
        if pieces:
            pieces[0].whole, pieces[0].pieces = ident, len(pieces)

    def _parse(self, b: BatchBuilder, first_line: int, data: bytes, ends: list[int],
               lines: np.ndarray | None = None) -> None:
        at = 0
        line_ids = lines.tolist() if lines is not None else None
        for k, end in enumerate(ends):
            if line_ids is not None:
                b.line = line_ids[k]
            self.fmt.parse(b, first_line + k, data[at:end])
            at = end
        b.line = 0

    def boundary(self, before: int, line: int) -> Iterator[InputBatch | None]:
        """Before a block at byte `before`, line `line`: the batch that ends here, if any; None: stop here."""
        builder = self.builder
        cut = False
        if block_start(line, self.size) and self.next_cut is not None and before >= self.next_cut:
            cut = True
            while self.next_cut is not None and self.next_cut <= before:
                self.next_cut = next(self._cuts, None)
        if self.stops(before, line):
            if builder.has_blocks():
                yield builder.take(self.point(before, line - 1), grid_end=True)
            yield None
            return
        if cut or builder.full():
            yield builder.take(self.point(before, line - 1), grid_end=cut)

    def batches(self) -> Iterator[InputBatch]:
        if self.stops(self.offset0, self.line0 + 1):
            return
        size, cap = self.size, self.spec.block_bytes
        with open_binary(self.path) as f:
            seek_binary(f, self.path, self.offset0)
            pos, line = self.offset0, self.line0  # of data[0]: byte offset, lines before it
            data = b""
            eof = False
            first = True
            while not eof:
                chunk = self._read(f, line, data)
                eof = not chunk
                data += chunk
                if pos == 0 and first:
                    refuse_utf16(self.path, data)
                ends = (np.flatnonzero(np.frombuffer(data, np.uint8) == 10) + 1).tolist()
                if eof and data and (not ends or ends[-1] < len(data)):
                    ends.append(len(data))  # a last line with no line break
                n = len(ends)
                i = 0
                spans = []  # the chunk's blocks: (first line, start byte, first and last line + 1 of `ends`)
                while i < n:
                    first_line = line + i + 1
                    j = i + size - (first_line - 1) % size
                    if j > n and not eof:
                        break  # the block goes on in the next chunk
                    j = min(j, n)
                    s = ends[i - 1] if i else 0
                    if ends[j - 1] - s >= cap:  # the line that brings it to `cap` bytes ends it
                        k = i
                        while ends[k] - s < cap:
                            k += 1
                        j = k + 1
                    spans.append((first_line, s, i, j))
                    i = j
                ahead = self.look_ahead(data, ends, spans, pos == 0) if self.spec.carry_lines is not None else None
                p = 0
                while p < len(spans):
                    first_line, s, a, b = spans[p]
                    if not first:
                        for batch in self.boundary(pos + s, first_line):
                            if batch is None:
                                return
                            yield batch
                    first = False
                    if pos + s == 0 and data.startswith(BOM):
                        s += len(BOM)
                    q, prev, rows = self.carried_run(ahead, spans, p)
                    if q > p:  # a run of unchanged blocks: carried as one, boundaries inside it changing nothing
                        assert ahead is not None
                        run: list[tuple[int, bytes | None, bytes, list[int], int, int, int]] = [
                            (f, ahead.blocks[f][0], data, ends, s if k == 0 else s_, a_, b_)
                            for k, (f, s_, a_, b_) in enumerate(spans[p:q])]
                        self._carry(ahead.blocks[first_line][0], prev, rows, run)
                        p = q
                        continue
                    self.flush(first_line, data[s : ends[b - 1]], [x - s for x in ends[a:b]], ahead)
                    p += 1
                used = ends[i - 1] if i else 0
                data = data[used:]
                pos += used
                line += i
        builder = self.builder
        if builder.has_blocks():
            spec, file = self.spec, self.file
            at_end = self.next_cut is not None  # a cut at (or past) this file's end
            yield builder.take(lambda: ReadPoint(file + 1, 0, 0, state={"spec": spec.state()}), grid_end=at_end)

    def _read(self, f: Any, line: int, held: bytes) -> bytes:
        """The next `CHUNK_BYTES` of the file (fewer at its end), after `line` lines and the bytes `held`.

        Read piece by piece (`read1`), so a file that cannot be read to its end (a truncated .gz) is
        reported after the last whole line it gives, not at the line its chunk began."""
        pieces: list[bytes] = []
        size = 0
        read = getattr(f, "read1", f.read)
        try:
            while size < CHUNK_BYTES:
                piece = bytes(read(CHUNK_BYTES - size))
                if not piece:
                    break
                pieces.append(piece)
                size += len(piece)
        except READ_ERRORS as e:
            raise read_error(self.path, e, line + held.count(b"\n") + sum(p.count(b"\n") for p in pieces)) from None
        return b"".join(pieces) if len(pieces) != 1 else pieces[0]
