"""What every input reader shares: the batch type, the batch builder, byte-level helpers and row errors."""

from __future__ import annotations

import bz2
import contextlib
import gzip
import io
import json
import lzma
import os
import select
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, cast

import numpy as np
import pyarrow as pa

from embedcli.io.arrow_values import arrow_array, value_type
from embedcli.io.errors import STDIN, InputError
from embedcli.io.location import is_url, open_stream
from embedcli.io.positions import (
    BLOCK_BYTES,
    BLOCK_LINES,
    Block,
    Carried,
    ReadPoint,
    digest,
    parse_type_state,
    type_state,
)
from embedcli.io.stdin_head import pending_head, stdin_stream

BOM = b"\xef\xbb\xbf"
UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")  # bytes UTF-8 never has: no line of such a file reads as itself
UTF8_FIX = "re-encode the file as UTF-8 (e.g. iconv -f latin1 -t utf-8 IN > OUT)"

MAX_TEXT_CHARS = 1 << 26
"""The longest text read (64 Mi characters); past it a record is a bad row (truncation keeps far less)."""

BadRowHandler = Callable[[InputError], None]


@dataclass
class InputBatch:
    """Consecutive records of one input file, in file order, with their locations and ids.

    Readers of a run cut batches at block boundaries (`embedcli.io.positions`): `blocks` lists them, each
    with its parsed rows or the rows it carries over; `end` is where reading goes on after the batch
    (None where the input cannot be read again, e.g. stdin); `grid_end` marks a batch that ends at one of
    the run's cut points (`--shard` slices end there)."""

    source: str
    locations: list[str]
    ids: list[str]
    texts: list[str | None]
    columns: dict[str, list[Any]] = field(default_factory=dict)
    extra_texts: dict[str, list[str | None]] = field(default_factory=dict)
    column_types: dict[str, pa.DataType] = field(default_factory=dict)
    id_type: pa.DataType = field(default_factory=pa.string)  # of the input's ids; `ids` holds their string form
    numbers: list[int] | None = None  # the line (text) or row (Parquet) number of each row
    lines: list[int] | None = None  # a text input's rows: each one's line identity (0: none)
    blocks: list[Block] = field(default_factory=list)
    end: ReadPoint | None = None
    grid_end: bool = False
    sources: list[str] | None = None  # per row, where a batch joins rows of several files
    exits: list[tuple[int, dict[str, Any]]] = field(default_factory=list)  # (file, reader state) of files ended in it
    # the bad rows reported in it under --on-error skip (None: a batch not cut by a `BatchBuilder`); a reader
    # may cut the next batch before this one is handed on, so the batch, not the order of reports, says whose
    errors: list[InputError] | None = None

    def __len__(self) -> int:
        """Return the number of records in the batch."""
        return len(self.ids)

    def source_of(self, i: int) -> str:
        """The file row `i` comes from."""
        return self.sources[i] if self.sources is not None else self.source

    @property
    def records(self) -> int:
        """Input records the batch accounts for: rows read or carried over, and bad rows (by its blocks)."""
        return sum(b.records for b in self.blocks) if self.blocks else len(self.ids)

    def kept_arrays(self, names: Sequence[str]) -> dict[str, pa.Array]:
        """The kept columns as Arrow arrays of the run's type (a Parquet input's own, else the first seen)."""
        return kept_arrays(self.columns, names, self.column_types)

    def id_array(self) -> pa.Array:
        """The ids as an Arrow array of the input's id type."""
        return id_array(self.ids, self.id_type)


def id_array(ids: Sequence[str], id_type: pa.DataType | None = None) -> pa.Array:
    """Ids (their string form) as an Arrow array of `id_type` (default string): the output's `id` column."""
    arr = arrow_array(ids, pa.string())
    # The string form of an integer id is its decimal digits, so the cast gives back the input's value.
    return arr if id_type is None or arr.type.equals(id_type) else arr.cast(id_type)


def kept_arrays(
    columns: Mapping[str, Sequence[Any]], names: Sequence[str], types: Mapping[str, pa.DataType] | None = None
) -> dict[str, pa.Array]:
    """Kept column values as Arrow arrays, of the given types where known (else inferred)."""
    out = {}
    for name in names:
        arr = arrow_array(columns[name], type=(types or {}).get(name))
        # A column null so far would fix its type to null for the whole output.
        out[name] = arr.cast(pa.string()) if pa.types.is_null(arr.type) else arr
    return out


BATCH_RECORDS_PER_ROW = 8
"""A batch spans at most this many times its rows in records (rows carried over unread count, and bad rows):
every reader of a run's inputs (the run's, the planner's, a Ray worker's) ends its batches at the same records."""


@dataclass
class ReadSpec:
    text_col: str
    id_col: str
    id_explicit: bool
    keep_cols: tuple[str, ...]
    extra_text_cols: tuple[str, ...]
    batch_rows: int
    on_bad_row: BadRowHandler | None
    batch_chars: int | None = None  # a batch also ends at the row whose text brings it to this many characters
    kept_types: dict[str, pa.DataType] = field(default_factory=dict)  # the run's type of each kept column
    id_type: pa.DataType | None = None  # the run's id type, fixed by the first input that has ids
    null_kept: set[str] = field(default_factory=set)  # kept columns whose first batch was all null (text columns)
    batch_records: int = 1 << 13  # a batch also ends at this many records (`read_inputs`: its rows x BATCH_RECORDS_PER_ROW)
    # `--incremental`: identity -> (first row, rows) in the previous output of a block / a file or row group
    carry_blocks: Mapping[bytes, tuple[int, int]] | None = None
    carry_units: Mapping[bytes, tuple[int, int]] | None = None
    # ... and of a text block that changed: (its lines' identities, their line numbers) -> each line's row
    # in the previous output (-1: none), so its unchanged lines are carried over one by one
    carry_lines: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None
    identities: bool = True  # compute block identities (not for inputs read once, such as stdin)
    block_lines: int = BLOCK_LINES  # lines (rows) of a block: 16, or `batch_rows` when that is less
    block_bytes: int = BLOCK_BYTES  # a block ends at the line bringing its text to this: 64 KiB or 1/8 batch
    rows_read: int = 0  # rows parsed from the inputs' text (not carried over unread)
    # a CR inside a plain-text line is kept (run-batch's request lines: JSON, where it is whitespace), not a bad row
    cr_in_lines: bool = False
    _context: tuple[Any, Any, str] | None = None
    _state: tuple[Any, Any, dict[str, Any]] | None = None

    @property
    def settled(self) -> bool:
        """Whether reading more rows can no longer change the run's types (JSONL fixes them from its first
        rows; the other formats from each file's header or schema)."""
        return self.id_type is not None and (not self.keep_cols or all(c in self.kept_types for c in self.keep_cols))

    def state(self) -> dict[str, Any]:
        """The run-wide reader state (types), as JSON values: a `ReadPoint` carries it."""
        # serialized once per state, not at the end of every file (a glob of 10,000 small files spent ~1.3 s on it)
        key = (len(self.kept_types), len(self.null_kept))
        cached = self._state
        if cached is None or cached[0] is not self.id_type or cached[1] != key:
            cached = self._state = (self.id_type, key, type_state(self.id_type, self.kept_types, self.null_kept))
        state = cached[2]
        return {"types": state["types"], "null_kept": list(state["null_kept"])}

    def restore(self, state: Mapping[str, Any]) -> None:
        """Go on from `state` (see `state`)."""
        if "types" in state:
            self.id_type, kept, self.null_kept = parse_type_state(state)
            self.kept_types.update(kept)

    def context(self) -> str | None:
        """What the rows of the same bytes depend on in the reader (its types), or None while unsettled."""
        # kept columns' types are only ever added, never changed: their count tells the state apart
        key = (len(self.kept_types), len(self.null_kept))
        cached = self._context
        if cached is not None and cached[0] is self.id_type and cached[1] == key:  # (`is`: no slow type ==)
            return cached[2]
        if not self.settled:
            return None
        kept = sorted((c, str(t)) for c, t in self.kept_types.items())
        text = digest(str(self.id_type), kept, sorted(self.null_kept), self.text_col, self.id_col, self.id_explicit,
                      self.keep_cols, self.extra_text_cols, self.block_lines, self.block_bytes)
        self._context = (self.id_type, key, text)
        return text

    def fix_id_type(self, path: str, t: pa.DataType, what: str) -> None:
        """Fix the run's id type to a whole input's `t` (InputError when an earlier input's differs)."""
        if self.id_type is not None and is_string_type(self.id_type) and pa.types.is_integer(t):
            return  # integer ids in a run of string ids: written as their string form
        if self.id_type is not None and not self.id_type.equals(t):
            raise InputError(
                path,
                f"ids are {t} here ({what}), but {self.id_type} in an earlier input",
                fix="give the ids one type in every input (strings or integers), or run the inputs separately",
            )
        self.id_type = t

    def bad(self, err: InputError) -> None:
        """Raise a row-level error, or hand it to `on_bad_row` (and let the caller skip the row)."""
        if self.on_bad_row is None:
            raise err
        self.on_bad_row(err)


class BatchBuilder:
    """Accumulates the blocks of one file, read or carried over, and hands them on as batches of whole blocks.

    A reader opens a block (`begin`), adds its rows (`add`, `extend`) and bad rows (`error`), or adds a block
    carried over whole (`carry`); `full()` says, at a block boundary, that the blocks so far make a batch
    (`batch_rows` rows read, `batch_chars` characters of text, or `batch_records` records); `take` hands them
    on. The cut depends on the data alone, so every run cuts the same batches from the same point."""

    def __init__(self, source: str, spec: ReadSpec, file: int = 0, infer_types: bool = False) -> None:
        self.source = source
        self.spec = spec
        self.file = file
        self.infer_types = infer_types  # JSON values: the first typed batch fixes each kept column's and the id's type
        self.locations: list[str] = []
        self.numbers: list[int] = []
        self.ids: list[str] = []
        self.raw_ids: list[Any] = []  # the ids as the input has them (JSON: int or str), when inferring types
        self.texts: list[str | None] = []
        self.lines: list[int] = []  # per row: its line's identity (0: none)
        self.line = 0  # the identity of the line being parsed (set by a line-based reader)
        self.columns: dict[str, list[Any]] = {c: [] for c in spec.keep_cols}
        self.extra: dict[str, list[str | None]] = {c: [] for c in spec.extra_text_cols}
        self.chars = 0  # text characters held (only counted under a `batch_chars` cap)
        self.blocks: list[Block] = []
        self.block: Block | None = None  # the open block
        self.records = 0  # records of the closed blocks
        self.errors: list[InputError] = []  # bad rows reported since the last batch was taken

    def __len__(self) -> int:
        return len(self.ids)

    # -- blocks ------------------------------------------------------------------------------------
    def begin(self, start: int, identity: bytes | None = None, group: int = -1) -> None:
        """Open a block at line/row `start` (closing the open one)."""
        self.end_block()
        n = len(self.ids)
        self.block = Block(self.file, start, first=n, stop=n, identity=identity, group=group)

    def end_block(self) -> None:
        """Close the open block, if any."""
        block = self.block
        if block is None:
            return
        block.stop = len(self.ids)
        self.block = None
        if block.stop > block.first or block.errors:
            self.blocks.append(block)
            self.records += block.records

    def carry(self, start: int, identity: bytes | None, carried: Carried, group: int = -1) -> None:
        """Add a block (or a file or row group) whose rows are carried over unread."""
        self.end_block()
        n = len(self.ids)
        block = Block(self.file, start, first=n, stop=n, identity=identity, group=group, carried=carried)
        self.blocks.append(block)
        self.records += block.records

    def error(self, err: InputError) -> None:
        """A bad row of the open block: raised, or reported and counted."""
        self.spec.bad(err)
        self.errors.append(err)
        if self.block is None:
            self.begin(0)
        assert self.block is not None
        self.block.errors += 1

    def has_blocks(self) -> bool:
        """Whether anything (a row, a bad row, a carried block) waits to be handed on."""
        return bool(self.blocks) or (self.block is not None and (len(self.ids) > self.block.first or self.block.errors > 0))

    def too_long(self, location: str, rid: str, texts: Sequence[Any]) -> bool:
        """Report the record as a bad row when a text of it is past MAX_TEXT_CHARS."""
        size = max((len(t) for t in texts if isinstance(t, str)), default=0)
        if size <= MAX_TEXT_CHARS:
            return False
        self.error(
            InputError(
                self.source,
                f"a text of {size:,} characters, past the {MAX_TEXT_CHARS:,} embedcli reads",
                location=location,
                record_id=rid,
                fix="split the document into parts",
            )
        )
        return True

    # -- rows --------------------------------------------------------------------------------------
    def add(
        self, location: str, rid: str, text: str | None, kept: Sequence[Any], extra: Sequence[Any], raw_id: Any = None,
        number: int = 0,
    ) -> None:
        if (extra or (isinstance(text, str) and len(text) > MAX_TEXT_CHARS)) and self.too_long(location, rid, [text, *extra]):
            return
        if self.block is None:
            self.begin(number)
        self.locations.append(location)
        self.numbers.append(number)
        self.ids.append(rid)
        self.lines.append(self.line)
        if self.infer_types:
            self.raw_ids.append(rid if raw_id is None else raw_id)
        self.texts.append(text)
        if self.spec.batch_chars is not None and text is not None:
            self.chars += len(text)
        for col, value in zip(self.spec.keep_cols, kept, strict=True):
            self.columns[col].append(value)
        for col, value in zip(self.spec.extra_text_cols, extra, strict=True):
            self.extra[col].append(value)

    def extend(
        self,
        locations: list[str],
        numbers: list[int],
        ids: list[str],
        texts: list[str | None],
        kept: dict[str, list[Any]],
        extra: dict[str, list[Any]],
    ) -> None:
        """Rows of the open block, many at once."""
        longest = max((len(t) for col in (texts, *extra.values()) for t in col if isinstance(t, str)), default=0)
        if longest > MAX_TEXT_CHARS:  # rare: fall back to one record at a time
            for j, loc in enumerate(locations):
                self.add(loc, ids[j], texts[j], [kept[c][j] for c in self.spec.keep_cols],
                         [extra[c][j] for c in self.spec.extra_text_cols], number=numbers[j])
            return
        if self.block is None:
            self.begin(numbers[0] if numbers else 0)
        self.locations += locations
        self.numbers += numbers
        self.ids += ids
        self.lines += [0] * len(ids)
        self.texts += texts
        if self.spec.batch_chars is not None:
            self.chars += sum(len(t) for t in texts if t is not None)
        for col in self.spec.keep_cols:
            self.columns[col] += kept[col]
        for col in self.spec.extra_text_cols:
            self.extra[col] += extra[col]

    def full(self) -> bool:
        """Whether the closed blocks make a batch (asked at a block boundary)."""
        cap = self.spec.batch_chars
        return (
            len(self.ids) >= self.spec.batch_rows
            or (cap is not None and self.chars >= cap)
            or self.records >= self.spec.batch_records
        )

    def take(self, end: ReadPoint | Callable[[], ReadPoint] | None = None, grid_end: bool = False) -> InputBatch:
        """Hand on every block so far (the open one closed) as a batch that reading goes on after at `end`
        (a callable: asked once the batch's rows are typed, so the point carries the types they fixed)."""
        self.end_block()
        batch = InputBatch(
            source=self.source,
            locations=self.locations,
            ids=self.ids,
            texts=self.texts,
            columns=self.columns,
            extra_texts=self.extra,
            numbers=self.numbers,
            lines=self.lines,
            blocks=self.blocks,
            grid_end=grid_end,
            errors=self.errors,
        )
        self.errors = []
        raw_ids = self.raw_ids
        self.locations, self.numbers, self.ids, self.texts, self.raw_ids, self.lines = [], [], [], [], [], []
        self.columns = {c: [] for c in self.spec.keep_cols}
        self.extra = {c: [] for c in self.spec.extra_text_cols}
        self.blocks, self.records, self.chars = [], 0, 0
        self.spec.rows_read += len(batch.ids)
        if self.infer_types and batch.ids:
            batch = self._typed(batch, raw_ids)
        batch.column_types = {c: t for c in self.spec.keep_cols if (t := self.spec.kept_types.get(c)) is not None}
        batch.id_type = self.spec.id_type or pa.string()
        batch.end = end() if callable(end) else end
        return batch

    def _typed(self, batch: InputBatch, raw_ids: list[Any]) -> InputBatch:
        """Check ids and kept values against the run's types (fixing them on first sight); drop conflicting rows."""
        bad: set[int] = set()
        # A string id column holds any id as its string form (an integer id among strings is kept, as "7");
        # an integer one holds integers only.
        # An integer past int64 counts as its digits: only a string column holds it (as main always did).
        typed = [str(v) if _past_int64(v) else v for v in raw_ids]
        run_type = self.spec.id_type or _first_type(typed)
        values = batch.ids if run_type is not None and is_string_type(run_type) else typed
        field_name = f"id field {self.spec.id_col!r}"
        self.spec.id_type = self._check_type(batch, values, self.spec.id_type, field_name, bad, shown=raw_ids)
        for col in self.spec.keep_cols:
            if col in self.spec.null_kept:
                # the first rows left it null, so the output holds it as text: a later value is its JSON text
                batch.columns[col] = [v if v is None or isinstance(v, str) else json.dumps(v, ensure_ascii=False)
                                      for v in batch.columns[col]]
            t = self._check_type(batch, batch.columns[col], self.spec.kept_types.get(col), f"kept field {col!r}", bad)
            if t is not None:
                self.spec.kept_types[col] = t
            elif col not in self.spec.kept_types:  # null so far: written as a string column (`kept_arrays`)
                self.spec.kept_types[col] = pa.string()
                self.spec.null_kept.add(col)
        if not bad:
            return batch
        keep = [j for j in range(len(batch)) if j not in bad]
        kept_before = 0
        for block in batch.blocks:  # the dropped rows are bad rows of their blocks now
            dropped = sum(1 for j in bad if block.first <= j < block.stop)
            size = block.stop - block.first - dropped
            block.errors += dropped
            block.first, block.stop = kept_before, kept_before + size
            kept_before += size
        numbers = batch.numbers or []
        lines = batch.lines or []
        return InputBatch(
            source=batch.source,
            locations=[batch.locations[j] for j in keep],
            ids=[batch.ids[j] for j in keep],
            texts=[batch.texts[j] for j in keep],
            columns={c: [v[j] for j in keep] for c, v in batch.columns.items()},
            extra_texts={c: [v[j] for j in keep] for c, v in batch.extra_texts.items()},
            numbers=[numbers[j] for j in keep] if numbers else None,
            lines=[lines[j] for j in keep] if lines else None,
            blocks=batch.blocks,
            end=batch.end,
            grid_end=batch.grid_end,
            errors=batch.errors,
        )

    def _check_type(
        self,
        batch: InputBatch,
        values: Sequence[Any],
        known: pa.DataType | None,
        field_name: str,
        bad: set[int],
        shown: Sequence[Any] | None = None,
    ) -> pa.DataType | None:
        """The run's type of a field after this batch (`known`, else the first value's); each row whose value
        does not fit it is reported as a bad row (naming its value in `shown`, default `values`) and added to `bad`."""
        try:
            arr = arrow_array(values, type=known)
        except (pa.ArrowException, OverflowError, TypeError, ValueError):
            arr = None
        if arr is not None and known is not None and _has_integer(known) and any(_truncated(v, known) for v in values):
            arr = None  # a fraction in an integer column: a bad row, as a string there is, never cut silently
        if arr is not None:
            return known if known is not None or pa.types.is_null(arr.type) else arr.type
        # Find the rows that do not fit: against the known type, or (first sight) the first value's.
        ref = known if known is not None else _first_type(values)
        for j, v in enumerate(values):
            if j not in bad and not _fits(v, ref):
                bad.add(j)
                err = InputError(
                    self.source,
                    f"{field_name} is {_kind((shown or values)[j])}, but the column is {ref} in earlier rows",
                    location=batch.locations[j],
                    record_id=batch.ids[j],
                    fix="give the field one type in every record",
                )
                self.spec.bad(err)
                if batch.errors is not None:
                    batch.errors.append(err)
        return known if ref is None or pa.types.is_null(ref) else ref

# --------------------------------------------------------------------------------------------------
# Byte-level helpers


COMPRESSIONS: dict[str, str] = {".gz": "gzip", ".bz2": "bz2", ".xz": "xz", ".zst": "zstd", ".zstd": "zstd"}


def compression_of(path: str) -> str | None:
    """The compression a text input's name says (`.gz`, `.bz2`, `.xz`, `.zst`), read transparently; else None."""
    return COMPRESSIONS.get(os.path.splitext(path.lower())[1]) if path != STDIN else None


def without_compression(path: str) -> str:
    """`docs.jsonl.zst` → `docs.jsonl` (the name that says the format)."""
    return path[: -len(os.path.splitext(path)[1])] if compression_of(path) else path


class _RawStream(io.RawIOBase):
    """A pyarrow input stream as raw bytes, so `io.BufferedReader` gives it lines (pyarrow's compressed
    streams cannot `readline`)."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        # a short read is allowed: pieces of at most 64 KiB, so a stream that breaks (a truncated .zst) loses
        # no more than that of what it gave before (reported at the line it reached)
        data = self.stream.read(min(len(buffer), 1 << 16))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self.stream.close()
        super().close()


def open_binary(path: str) -> contextlib.AbstractContextManager[Any]:
    """The decompressed bytes of an input (stdin as is)."""
    if path == STDIN:
        return contextlib.nullcontext(stdin_stream())
    if is_url(path):  # an object: streamed from its store
        return open_object_binary(path)
    try:
        kind = compression_of(path)
        if kind == "gzip":
            return gzip.open(path, "rb")
        if kind == "bz2":
            return bz2.open(path, "rb")
        if kind == "xz":
            return lzma.open(path, "rb")
        if kind == "zstd":  # pyarrow speaks zstd (the Python standard library does from 3.14 only)
            return io.BufferedReader(_RawStream(pa.input_stream(path, compression="zstd")), 1 << 20)
        return open(path, "rb")
    except FileNotFoundError:
        raise InputError(path, "no such file", fix="check the path") from None
    except OSError as e:
        raise InputError(path, f"cannot open: {e.strerror or e}") from None


@contextlib.contextmanager
def open_object_binary(url: str) -> Iterator[IO[bytes]]:
    """The decompressed bytes of an object (by its name's `.gz`/`.bz2`/`.xz`/`.zst`), read front to back in
    bounded pieces (`location.READ_BYTES` per request): never downloaded whole."""
    with contextlib.ExitStack() as stack:
        stream = open_stream(url)
        stack.callback(stream.close)
        kind = compression_of(url)
        if kind == "zstd":  # as a local .zst: pyarrow's decoder
            stream = pa.CompressedInputStream(stream, "zstd")
        raw = stack.enter_context(io.BufferedReader(_RawStream(stream), 1 << 20))
        if kind == "gzip":
            yield cast(IO[bytes], stack.enter_context(gzip.open(raw, "rb")))
        elif kind == "bz2":
            yield cast(IO[bytes], stack.enter_context(bz2.open(raw, "rb")))
        elif kind == "xz":
            yield cast(IO[bytes], stack.enter_context(lzma.open(raw, "rb")))
        else:
            yield raw


def pipe_lines(f: IO[bytes]) -> Iterator[bytes | None]:
    """Lines of a pipe as they arrive, and None each time the writer has nothing more for now."""
    try:
        fd = f.fileno()
    except (AttributeError, OSError, ValueError):
        yield from f  # not a real descriptor (an in-memory stream): it never waits
        return
    # Reads go to the descriptor under `f` (nothing has been read through `f` itself yet): a buffered
    # read would wait for a full buffer, not for the next line.
    pending = pending_head(f)
    while True:
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            yield line + b"\n"
        if not select.select([fd], [], [], 0)[0]:
            yield None
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        pending += chunk
    if pending:
        yield pending


class Lines:
    """The lines of an open text input with their numbers; `offset` is the byte offset (in the decompressed
    stream) after the last line handed out, so a later run can seek there (`seek_binary`)."""

    def __init__(self, f: IO[bytes], path: str, idle: bool = False, offset: int = 0, line: int = 0) -> None:
        self.f = f
        self.path = path
        self.idle = idle
        self.offset = offset
        self.line = line

    def __iter__(self) -> Iterator[tuple[int, bytes | None]]:
        """Yield (1-based line number, raw line) lazily, with a leading UTF-8 BOM removed.

        With `idle` (stdin), (line number, None) marks a pause of the writer: the caller hands on what it holds.
        """
        try:
            for raw in pipe_lines(self.f) if self.idle and self.path == STDIN else self.f:
                if raw is None:
                    yield self.line, None
                    continue
                self.line += 1
                at_start = self.offset == 0
                self.offset += len(raw)
                if at_start:
                    refuse_utf16(self.path, raw)
                    if raw.startswith(BOM):
                        raw = raw[len(BOM) :]
                yield self.line, raw
        except READ_ERRORS as e:
            raise read_error(self.path, e, self.line) from None


def refuse_utf16(path: str, head: bytes) -> None:
    """InputError for the whole file when its first bytes are a UTF-16 byte order mark: every line of it is
    bad UTF-8 or, read past the first, other text (NULs between the letters), never a row to skip."""
    if head.startswith(UTF16_BOMS):
        raise InputError(
            path,
            "is UTF-16 (it starts with a UTF-16 byte order mark), not UTF-8",
            location="line 1",
            fix="re-encode the file as UTF-8 (e.g. iconv -f utf-16 -t utf-8 IN > OUT)",
        )


def numbered_lines(f: IO[bytes], path: str, idle: bool = False) -> Iterator[tuple[int, bytes | None]]:
    """Yield (1-based line number, raw line) lazily, with a leading UTF-8 BOM removed (see `Lines`)."""
    yield from Lines(f, path, idle)


def seek_binary(f: IO[bytes], path: str, offset: int) -> None:
    """Move an input opened by `open_binary` to byte `offset` of its (decompressed) content."""
    if offset <= 0:
        return
    if compression_of(path) is None and f.seekable():
        f.seek(offset)
        return
    left = offset  # a compressed stream or an object's: read and dropped up to there (nothing is parsed)
    while left:
        chunk = f.read(min(left, 1 << 20))
        if not chunk:
            raise InputError(path, f"is shorter than when its reading was recorded ({offset:,} bytes)")
        left -= len(chunk)


READ_ERRORS = (OSError, EOFError, zlib.error, lzma.LZMAError, pa.ArrowException)
"""What reading a (decompressed) input can raise where its bytes cannot be had: `read_error` says it."""


def read_error(path: str, e: BaseException, lines: int) -> InputError:
    """The error of an input that cannot be read past its `lines` whole lines (a truncated .gz, a disk error)."""
    packed = compression_of(path)
    ext = os.path.splitext(path)[1]
    return InputError(
        path,
        f"cannot read the file{f' past line {lines}' if lines else ''}: {one_line(e)}",
        location=f"line {lines + 1}",
        fix=(f"the {packed} file is truncated or damaged: compress or copy it again"
             + ("" if lines else f" (or, not {packed} at all, name it without {ext})")) if packed else None,
    )


def one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def utf8_error(path: str, lineno: int, e: UnicodeDecodeError, record_id: str | None = None) -> InputError:
    return InputError(
        path,
        f"not valid UTF-8 (byte 0x{e.object[e.start]:02x} at byte {e.start + 1} of the line)",
        location=f"line {lineno}",
        record_id=record_id,
        fix=UTF8_FIX,
    )


def missing_column(
    path: str, what: str, col: str, existing: Sequence[str], flag: str | None, location: str | None = None
) -> InputError:
    noun = "field" if location else "column"
    listing = ", ".join(repr(c) for c in existing) if existing else "(none)"
    return InputError(
        path,
        f"no {what} {noun} {col!r}; the {noun}s are: {listing}",
        location=location,
        fix=f"pass {flag} with one of them" if flag else "name one of them",
    )


def type_name(value: Any) -> str:
    return {dict: "an object", list: "an array", bool: "a boolean", int: "a number", float: "a number"}.get(
        type(value), type(value).__name__
    )


def _past_int64(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and not -(1 << 63) <= value < (1 << 63)


def _kind(value: Any) -> str:
    return "an integer past 64 bits" if _past_int64(value) else type_name(value)


def is_string_type(t: pa.DataType) -> bool:
    """Whether `t` is one of Arrow's string types."""
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def _fits(value: Any, t: pa.DataType | None) -> bool:
    try:
        arrow_array([value], type=t)
    except (pa.ArrowException, OverflowError, TypeError, ValueError):
        return False
    return t is None or not _truncated(value, t)


def _has_integer(t: pa.DataType) -> bool:
    """Whether `t` holds an integer anywhere (only then can a value be cut to fit it: `_truncated`)."""
    if pa.types.is_integer(t):
        return True
    if pa.types.is_struct(t):
        return any(_has_integer(f.type) for f in t)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _has_integer(t.value_type)
    return False


def _truncated(value: Any, t: pa.DataType) -> bool:
    """Whether `value` holds a number with a fraction where `t` has an integer (which pa.array cuts to it: 3.5 -> 3)."""
    if value is None:
        return False
    if pa.types.is_integer(t):
        return isinstance(value, float) and not value.is_integer()
    if pa.types.is_struct(t):
        return isinstance(value, dict) and any(_truncated(value.get(f.name), f.type) for f in t)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return isinstance(value, list) and any(_truncated(v, t.value_type) for v in value)
    return False


def _first_type(values: Sequence[Any]) -> pa.DataType | None:
    for v in values:
        if v is not None:
            try:
                return value_type(v)
            except (pa.ArrowException, OverflowError, TypeError, ValueError):
                return None
    return None
