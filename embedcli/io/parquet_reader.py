"""The Parquet reader: columns checked against the file's schema, read a batch of rows at a time."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from embedcli.io.arrow_values import arrow_array, byte_lengths
from embedcli.io.commit import arrow_source
from embedcli.io.errors import STDIN, InputError
from embedcli.io.fingerprint import rereadable
from embedcli.io.positions import UNIT_PIECE, WHOLE, Carried, FilePart, ReadPoint, identity
from embedcli.io.reader_base import (
    BatchBuilder,
    InputBatch,
    ReadSpec,
    missing_column,
    one_line,
)
from embedcli.io.stdin_head import stdin_stream


def _is_text_type(t: pa.DataType) -> bool:
    if pa.types.is_dictionary(t):
        t = t.value_type
    return (
        pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_string_view(t)
        or pa.types.is_null(t)
    )


def _is_id_type(t: pa.DataType) -> bool:
    base = t.value_type if pa.types.is_dictionary(t) else t
    return (_is_text_type(t) and not pa.types.is_null(base)) or pa.types.is_integer(base)


def id_type(t: pa.DataType) -> pa.DataType:
    """The output's id type for a Parquet id column of type `t` (a dictionary's values)."""
    return t.value_type if pa.types.is_dictionary(t) else t


def _plain(arr: pa.Array) -> pa.Array:
    """A decoded column as offset-based arrays: dictionaries decoded, string views as large strings."""
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    # a view column has no offsets buffer, which the text sizes and block identities read
    if pa.types.is_string_view(arr.type):
        return arr.cast(pa.large_string())
    if pa.types.is_binary_view(arr.type):
        return arr.cast(pa.large_binary())
    return arr


def _not_parquet(path: str, e: BaseException, where: str = "") -> InputError:
    return InputError(
        path,
        f"not a readable Parquet file{where}: {one_line(e)}",
        fix="check the file is complete (truncated copy? still being written?) and really Parquet",
    )


READ_BUFFER_BYTES = 1 << 20
"""Bytes a Parquet input is read in: a column chunk (a whole one-row-group file's column) is never held whole."""


def _open(path: str) -> pq.ParquetFile:
    try:
        if path == STDIN:
            source: Any = pa.BufferReader(stdin_stream().read())
        elif not rereadable(path):  # a pipe or FIFO: Parquet needs to seek, so read it once, whole
            with open(path, "rb") as f:
                source = pa.BufferReader(f.read())
        else:
            source = arrow_source(path)
        # A buffered stream without pre-buffering reads a column chunk a page at a time, so memory stays
        # bounded by the batch, not the row group (pyarrow otherwise loads each column chunk whole).
        return pq.ParquetFile(source, buffer_size=READ_BUFFER_BYTES, pre_buffer=False)
    except FileNotFoundError:
        raise InputError(path, "no such file", fix="check the path") from None
    except (pa.ArrowException, OSError) as e:
        raise _not_parquet(path, e) from None


def _check_columns(path: str, schema: pa.Schema, spec: ReadSpec) -> str | None:
    """Check the requested columns and their types against the file's schema; returns the id column."""
    names = schema.names

    def need(col: str, what: str, flag: str | None) -> None:
        if col not in names:
            raise missing_column(path, what, col, names, flag)

    need(spec.text_col, "text", "--text-col")
    for c in spec.extra_text_cols:
        need(c, "text", None)
    for c in spec.keep_cols:
        need(c, "kept", "--keep-cols")
        _fix_kept_type(path, spec, c, schema.field(c).type)
    id_col: str | None = spec.id_col if (spec.id_explicit or spec.id_col in names) else None
    if id_col is not None:
        need(id_col, "id", "--id-col")
        t = schema.field(id_col).type
        if not _is_id_type(t):
            raise InputError(path, f"id column {id_col!r} has type {t}; ids must be strings or integers")
        spec.fix_id_type(path, id_type(t), f"the type of column {id_col!r}")
    else:
        spec.fix_id_type(path, pa.string(), f"no {spec.id_col!r} column: ids are file:row")
    for c in (spec.text_col, *spec.extra_text_cols):
        t = schema.field(c).type
        if not _is_text_type(t):
            raise InputError(path, f"text column {c!r} has type {t}; expected a string column")
    return id_col


_UTF8_FIX = "write the column's text as UTF-8 (its writer stored other bytes under a string type)"

DECODE_ROWS = 1 << 12
"""Rows decoded at a time (a multiple of the block's 16 rows): memory follows it, not the row group."""


class _Columns:
    """The canonical bytes of a decoded chunk's columns, for block identities (offsets and nulls left out of
    the arrays' own layout, so equal values give equal bytes)."""

    def __init__(self, rb: pa.RecordBatch) -> None:
        self.parts: list[tuple[Any, ...]] = []
        for arr in rb.columns:
            t = arr.type
            if pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t) or pa.types.is_large_binary(t):
                wide = pa.types.is_large_string(t) or pa.types.is_large_binary(t)
                bufs = arr.buffers()
                offsets = np.frombuffer(bufs[1], dtype=np.int64 if wide else np.int32)[arr.offset : arr.offset + len(arr) + 1]
                data = memoryview(bufs[2]) if bufs[2] is not None else memoryview(b"")
                nulls = np.asarray(arr.is_null()) if arr.null_count else None
                self.parts.append(("s", offsets, data, nulls))
            else:
                self.parts.append(("x", arr))

    def update(self, h: Any, a: int, b: int) -> None:
        """Add rows `[a, b)` of every column to hash `h`."""
        for part in self.parts:
            if part[0] == "s":
                _, offsets, data, nulls = part
                off = offsets[a : b + 1]
                h.update(np.diff(off).astype(np.int64).tobytes())
                h.update(data[int(off[0]) : int(off[-1])])
                # the block's own nulls, not its chunk's: where a chunk starts (a resume starts one mid-group)
                # must not change a block's identity
                mine = nulls[a:b] if nulls is not None else None
                h.update(mine.tobytes() if mine is not None and bool(mine.any()) else b"\x00")
            else:
                sl = part[1].slice(a, b - a)
                h.update(pa.RecordBatch.from_arrays([sl], ["c"]).serialize().to_pybytes())


def _group_fingerprint(path: str, pf: pq.ParquetFile, group: int, columns: list[str]) -> str | None:
    """A hash of a row group's stored column chunks (compressed bytes, not decoded) for `columns`."""
    if not rereadable(path):
        return None
    md = pf.metadata
    rg = md.row_group(group)
    names = set(columns)
    h = hashlib.blake2b(digest_size=16)
    try:
        with open(path, "rb") as f:
            for i in range(rg.num_columns):
                col = rg.column(i)
                if col.path_in_schema.split(".")[0] not in names:
                    continue
                offset = col.dictionary_page_offset if col.has_dictionary_page else col.data_page_offset
                offset = min(offset, col.data_page_offset) if offset else col.data_page_offset
                f.seek(offset)
                h.update(col.path_in_schema.encode("utf-8", "surrogateescape") + b"\x00")
                left = col.total_compressed_size
                while left > 0:
                    chunk = f.read(min(left, 1 << 20))
                    if not chunk:
                        return None
                    h.update(chunk)
                    left -= len(chunk)
    except OSError:
        return None
    return h.hexdigest()


def _aligned_chunks(
    batches: Iterator[pa.RecordBatch], row0: int, group_start: int, size: int
) -> Iterator[tuple[int, pa.RecordBatch]]:
    """(first row, record batch) of a row group's decoded rows from `row0`, each ending at a row 16k from the
    group's start (or its end), so no block spans two of them."""
    held: list[pa.RecordBatch] = []
    held_rows = 0
    at = row0
    for rb in batches:
        if not rb.num_rows:
            continue
        held.append(rb)
        held_rows += rb.num_rows
        cut = group_start + (at + held_rows - group_start) // size * size
        if cut <= at:
            continue
        whole = pa.Table.from_batches(held).combine_chunks()
        yield at, whole.slice(0, cut - at).to_batches()[0]
        rest = whole.slice(cut - at)
        held = rest.to_batches() if rest.num_rows else []
        held_rows = rest.num_rows
        at = cut
    if held_rows:
        yield at, pa.Table.from_batches(held).combine_chunks().to_batches()[0]


def read_parquet(
    path: str,
    spec: ReadSpec,
    prefix: str,
    part: FilePart = WHOLE,
) -> Iterator[InputBatch]:
    """Parquet, a block of rows at a time; ids from the id column if present, else `file:row`.

    Blocks are 16 rows from each row group's start (fewer where their text passes `BLOCK_BYTES`); a row group
    whose stored column chunks and context are those of one the previous output carried is carried over
    without decoding it. `cuts` are rows (block starts) where a batch must end."""
    with _open(path) as pf:
        id_col = _check_columns(path, pf.schema_arrow, spec)
        wanted = list(dict.fromkeys([spec.text_col, *spec.extra_text_cols, *spec.keep_cols, *([id_col] if id_col else [])]))
        reader = _ParquetBlocks(path, pf, spec, prefix, part.file, id_col, wanted)
        yield from reader.batches(part.start, part.stop, part.cuts)


class _ParquetBlocks:
    """The blocks and batches of one Parquet file (see `read_parquet`)."""

    def __init__(
        self, path: str, pf: pq.ParquetFile, spec: ReadSpec, prefix: str, file: int, id_col: str | None,
        wanted: list[str],
    ) -> None:
        self.path, self.pf, self.spec, self.prefix, self.file = path, pf, spec, prefix, file
        self.id_col, self.wanted = id_col, wanted
        md = pf.metadata
        sizes = [md.row_group(g).num_rows for g in range(md.num_row_groups)]
        self.starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64) if sizes else np.zeros(1, np.int64)
        self.b = BatchBuilder(path, spec, file)
        self.bad_utf8: dict[int, tuple[str, UnicodeDecodeError]] = {}  # of the chunk being read (`read_chunk`)
        self.next_cut: int | None = None
        self._cuts: Iterator[int] = iter(())
        self.unit: bytes | None = None  # the identity of the row group read now, for its first block

    def point(self, row: int, skip: int = 0) -> Callable[[], ReadPoint]:
        return lambda: ReadPoint(self.file, row, row, skip, state={"spec": self.spec.state()})

    def context(self) -> str | None:
        types = self.spec.context() if self.spec.identities else None
        named = self.prefix if self.id_col is None else ""  # the file's name counts where it makes the ids
        return None if types is None else f"parquet\x00{named}\x00{self.id_col}\x00{types}"

    def boundary(self, row: int) -> Iterator[InputBatch]:
        """At a block boundary before row `row`: end the batch where a cut or a full builder says."""
        cut = False
        while self.next_cut is not None and self.next_cut <= row:
            cut = True
            self.next_cut = next(self._cuts, None)
        if (cut or self.b.full()) and self.b.has_blocks():
            yield self.b.take(self.point(row), grid_end=cut)

    def batches(self, start: ReadPoint | None, stop: ReadPoint | None, cuts: Sequence[int]) -> Iterator[InputBatch]:
        total = int(self.starts[-1])
        first_row = start.pos if start is not None else 0
        skip = start.skip if start is not None else 0
        stop_row = min(total, stop.pos + stop.skip) if stop is not None else total
        self._cuts = iter(sorted(c for c in cuts if c > first_row))
        self.next_cut = next(self._cuts, None)
        for g in range(len(self.starts) - 1):
            g0, g1 = int(self.starts[g]), int(self.starts[g + 1])
            if g1 <= first_row or g1 == g0:
                continue
            if g0 >= stop_row:
                break
            if g0 > first_row:
                yield from self.boundary(g0)
            self.unit = self.group_identity(g, g0) if first_row <= g0 else None
            found = self.spec.carry_units.get(self.unit) if (self.unit is not None and self.spec.carry_units) else None
            if found is not None and found[1] == g1 - g0:
                yield from self.carry_group(g, g0, min(g1, stop_row), skip, found[0])
            else:
                yield from self.read_group(g, max(g0, first_row), min(g1, stop_row))
            skip = 0
        if self.b.has_blocks():
            end = self.point(stop_row) if stop_row < total else \
                (lambda: ReadPoint(self.file + 1, 0, 0, state={"spec": self.spec.state()}))
            yield self.b.take(end, grid_end=self.next_cut is not None or stop_row < total)

    def group_identity(self, g: int, g0: int) -> bytes | None:
        """Row group `g`'s identity: its context and a hash of its stored column chunks (nothing decoded)."""
        context = self.context()
        if context is None:
            return None
        fp = _group_fingerprint(self.path, self.pf, g, self.wanted)
        return None if fp is None else identity(f"{context}\x00group\x00{g0}\x00{fp}")

    def carry_group(self, g: int, g0: int, hi: int, skip: int, prev: int) -> Iterator[InputBatch]:
        """Row group `g` (rows `[g0 + skip, hi)`) carried over whole, in pieces of `UNIT_PIECE` rows."""
        done = skip
        while g0 + done < hi:
            rows = min(UNIT_PIECE, hi - g0 - done)
            if done > skip and self.b.has_blocks():
                yield self.b.take(self.point(g0, done))
            reread = self._reread(g, g0 + done, g0 + done + rows)
            self.b.carry(g0 + done, None, Carried(prev + done, rows, unit=True, reread=reread), group=g)
            if done == 0:
                self.b.blocks[-1].unit = self.unit
            done += rows

    def _reread(self, g: int, lo: int, hi: int) -> Any:
        def reread() -> Iterator[InputBatch]:
            # the file opened again: the reader holds a batch back until it has cut the next, so by the time the
            # checks ask for these rows it may have closed this file and gone on to the next (carried rows are
            # of a file that can be read again)
            with _open(self.path) as pf:
                sub = _ParquetBlocks(self.path, pf, self.spec, self.prefix, self.file, self.id_col, self.wanted)
                yield from sub.read_group(g, lo, hi, carry=False)
                if sub.b.has_blocks():
                    yield sub.b.take()
        return reread

    def read_group(self, g: int, lo: int, hi: int, carry: bool = True) -> Iterator[InputBatch]:
        """Decode rows `[lo, hi)` of row group `g` a chunk at a time, block by block."""
        g0 = int(self.starts[g])
        batches = self.pf.iter_batches(batch_size=DECODE_ROWS, row_groups=[g], columns=self.wanted, use_threads=False)
        row = lo
        try:
            for at, rb in _aligned_chunks(_skipping(batches, g0, lo), lo, g0, self.spec.block_lines):
                if at >= hi:
                    break
                if at + rb.num_rows > hi:
                    rb = rb.slice(0, hi - at)
                yield from self.read_chunk(g, g0, at, rb, carry)
                row = at + rb.num_rows
                if row < hi:
                    yield from self.boundary(row)
        except (pa.ArrowException, OSError) as e:
            raise _not_parquet(self.path, e, f" (reading rows from {row})") from None

    def read_chunk(self, g: int, g0: int, at: int, rb: pa.RecordBatch, carry: bool) -> Iterator[InputBatch]:
        """The blocks of one decoded chunk: identities, carried or parsed, and the batch cuts between them."""
        spec, b = self.spec, self.b
        n = rb.num_rows
        rb = pa.RecordBatch.from_arrays([_plain(c) for c in rb.columns], rb.schema.names)
        context = self.context()
        sizes = byte_lengths(rb.column(spec.text_col))
        canon = _Columns(rb) if context is not None else None
        # Blocks: 16 rows from the group's start, cut sooner after the row whose text reaches BLOCK_BYTES.
        blocks: list[tuple[int, int, bytes | None]] = []
        carried: dict[int, tuple[int, int]] = {}
        i = 0
        while i < n:
            size = spec.block_lines
            aligned = g0 + ((at + i - g0) // size + 1) * size
            j = min(n, aligned - at)
            over = np.nonzero(np.cumsum(sizes[i:j]) >= spec.block_bytes)[0]
            end = i + int(over[0]) + 1 if len(over) else j
            ident = None
            if canon is not None:
                h = hashlib.blake2b(f"{context}\x00{at + i}".encode("utf-8", "surrogateescape"), digest_size=16)
                canon.update(h, i, end)
                ident = h.digest()
                found = spec.carry_blocks.get(ident) if (carry and spec.carry_blocks) else None
                if found is not None and found[1] == end - i:
                    carried[i] = found
            blocks.append((i, end, ident))
            i = end
        mask = np.ones(n, dtype=bool)
        for a, (_, rows) in carried.items():
            mask[a : a + rows] = False
        parsed = rb.filter(arrow_array(mask)) if carried else rb
        rows_of = np.cumsum(mask) - 1  # index in `parsed` of each row read
        bad: dict[int, tuple[str, UnicodeDecodeError]] = {}  # index in `parsed` -> (column, error): not UTF-8
        texts = self._values(parsed.column(spec.text_col), spec.text_col, bad)
        kept = {c: self._values(parsed.column(c), c, bad) for c in spec.keep_cols}
        extra = {c: self._values(parsed.column(c), c, bad) for c in spec.extra_text_cols}
        ids = (self._values(parsed.column(self.id_col).cast(pa.string()), self.id_col, bad)
               if self.id_col is not None else None)
        self.bad_utf8 = bad
        for a, e, ident in blocks:
            if a > 0:
                yield from self.boundary(at + a)
            row = at + a
            if a in carried:
                prev, rows = carried[a]
                b.carry(row, ident, Carried(prev, rows, reread=self._reread(g, row, at + e)), group=g)
            else:
                self._parse_block(b, row, at + e, ident, g, texts, kept, extra, ids, int(rows_of[a]))
            if row == g0:
                b.blocks[-1].unit = self.unit

    def _values(self, arr: pa.Array, col: str, bad: dict[int, tuple[str, UnicodeDecodeError]]) -> list[Any]:
        """A column's values as Python values; a string that is not UTF-8 (a writer that did not check) is None
        there, its row noted in `bad` (a bad row), never a UnicodeDecodeError traceback."""
        try:
            return arr.to_pylist()
        except UnicodeDecodeError:
            pass
        t = arr.type
        if not (pa.types.is_string(t) or pa.types.is_large_string(t)):
            raise InputError(self.path, f"column {col!r} holds text that is not valid UTF-8", fix=_UTF8_FIX) from None
        out: list[Any] = []
        for j, raw in enumerate(arr.view(pa.large_binary() if pa.types.is_large_string(t) else pa.binary()).to_pylist()):
            try:
                out.append(None if raw is None else raw.decode("utf-8"))
            except UnicodeDecodeError as e:
                bad.setdefault(j, (col, e))
                out.append(None)
        return out

    def _parse_block(
        self, b: BatchBuilder, lo: int, hi: int, ident: bytes | None, g: int, texts: list[Any],
        kept: dict[str, list[Any]], extra: dict[str, list[Any]], ids: list[Any] | None, p0: int,
    ) -> None:
        """Rows `[lo, hi)` (from index `p0` of the converted columns) as one block read."""
        p1 = p0 + hi - lo
        b.begin(lo, ident, group=g)
        numbers = list(range(lo, hi))
        locations = [f"row {r}" for r in numbers]
        block_ids = [f"{self.prefix}:{r}" for r in numbers] if ids is None else ids[p0:p1]
        utf8 = {j - p0: self.bad_utf8[j] for j in range(p0, p1) if j in self.bad_utf8} if self.bad_utf8 else {}
        good: list[int] | None = None
        if utf8:  # one error per bad row, in row order: its bad UTF-8, else its null or empty id
            good = []
            for j in range(p1 - p0):
                if j in utf8:
                    col, e = utf8[j]
                    rid = block_ids[j] if ids is None or (col != self.id_col and block_ids[j]) else None
                    b.error(InputError(
                        self.path,
                        f"column {col!r} is not valid UTF-8 (byte 0x{e.object[e.start]:02x} at byte {e.start + 1} "
                        "of the value)",
                        location=locations[j], record_id=rid, fix=_UTF8_FIX,
                    ))
                elif ids is None or _good_ids(self.path, self.id_col or "", [block_ids[j]], [locations[j]], b) is None:
                    good.append(j)
        elif ids is not None:
            good = _good_ids(self.path, self.id_col or "", block_ids, locations, b)
        block_texts, block_kept = texts[p0:p1], {c: v[p0:p1] for c, v in kept.items()}
        block_extra = {c: v[p0:p1] for c, v in extra.items()}
        if good is not None:
            numbers = [numbers[j] for j in good]
            locations = [locations[j] for j in good]
            block_ids = [block_ids[j] for j in good]
            block_texts = [block_texts[j] for j in good]
            block_kept = {c: [v[j] for j in good] for c, v in block_kept.items()}
            block_extra = {c: [v[j] for j in good] for c, v in block_extra.items()}
        if block_ids:
            b.extend(locations, numbers, block_ids, block_texts, block_kept, block_extra)
        b.end_block()


def _skipping(batches: Iterator[pa.RecordBatch], g0: int, lo: int) -> Iterator[pa.RecordBatch]:
    """A row group's decoded batches from row `lo` (the rows before it decoded and dropped, never converted)."""
    at = g0
    for rb in batches:
        end = at + rb.num_rows
        if end > lo:
            yield rb.slice(max(0, lo - at))
        at = end


def _good_ids(path: str, id_col: str, ids: list[Any], locations: list[str], b: BatchBuilder) -> list[int] | None:
    """Report null/empty ids as bad rows; the rows to keep, or None when all are good."""
    bad = [j for j, v in enumerate(ids) if not v]
    if not bad:
        return None
    for j in bad:
        what = "null" if ids[j] is None else "empty"
        b.error(
            InputError(path, f"id column {id_col!r} is {what}", location=locations[j], fix="give every record a unique id")
        )
    return [j for j in range(len(ids)) if ids[j]]


def _fix_kept_type(path: str, spec: ReadSpec, col: str, t: pa.DataType) -> None:
    """A kept column takes the Parquet file's own type (never re-guessed from values batch by batch)."""
    known = spec.kept_types.get(col)
    if known is not None and not known.equals(t):
        raise InputError(
            path,
            f"kept column {col!r} is {t} here, but {known} in an earlier input",
            fix="give the column one type in every input, or keep it from one of them only",
        )
    spec.kept_types[col] = t
