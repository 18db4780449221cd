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

import pyarrow as pa

from embedcli.io.arrow_values import arrow_array, value_type
from embedcli.io.errors import STDIN, InputError
from embedcli.io.location import is_url, open_stream
from embedcli.io.positions import parse_type_state, type_state
from embedcli.io.stdin_head import pending_head, stdin_stream

BOM = b"\xef\xbb\xbf"
UTF8_FIX = "re-encode the file as UTF-8 (e.g. iconv -f latin1 -t utf-8 IN > OUT)"

MAX_TEXT_CHARS = 1 << 26
"""The longest text read (64 Mi characters); past it a record is a bad row (truncation keeps far less)."""

BadRowHandler = Callable[[InputError], None]


@dataclass
class InputBatch:
    """Consecutive records of one input file, in file order, with their locations and ids."""

    source: str
    locations: list[str]
    ids: list[str]
    texts: list[str | None]
    columns: dict[str, list[Any]] = field(default_factory=dict)
    extra_texts: dict[str, list[str | None]] = field(default_factory=dict)
    column_types: dict[str, pa.DataType] = field(default_factory=dict)
    id_type: pa.DataType = field(default_factory=pa.string)  # of the input's ids; `ids` holds their string form

    def __len__(self) -> int:
        """Return the number of records in the batch."""
        return len(self.ids)

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

    def state(self) -> dict[str, Any]:
        """The run-wide reader state (types), as JSON values: a `ReadPoint` carries it."""
        return type_state(self.id_type, self.kept_types, self.null_kept)

    def restore(self, state: Mapping[str, Any]) -> None:
        """Go on from `state` (see `state`)."""
        if "types" in state:
            self.id_type, kept, self.null_kept = parse_type_state(state)
            self.kept_types.update(kept)

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
    """Accumulates records of one file and cuts them into batches of `batch_rows`."""

    def __init__(self, source: str, spec: ReadSpec, infer_types: bool = False) -> None:
        self.source = source
        self.spec = spec
        self.infer_types = infer_types  # JSON values: the first typed batch fixes each kept column's and the id's type
        self.locations: list[str] = []
        self.ids: list[str] = []
        self.raw_ids: list[Any] = []  # the ids as the input has them (JSON: int or str), when inferring types
        self.texts: list[str | None] = []
        self.columns: dict[str, list[Any]] = {c: [] for c in spec.keep_cols}
        self.extra: dict[str, list[str | None]] = {c: [] for c in spec.extra_text_cols}
        self.chars = 0  # text characters held (only counted under a `batch_chars` cap)

    def __len__(self) -> int:
        return len(self.ids)

    def too_long(self, location: str, rid: str, texts: Sequence[Any]) -> bool:
        """Report the record as a bad row when a text of it is past MAX_TEXT_CHARS."""
        size = max((len(t) for t in texts if isinstance(t, str)), default=0)
        if size <= MAX_TEXT_CHARS:
            return False
        self.spec.bad(
            InputError(
                self.source,
                f"a text of {size:,} characters, past the {MAX_TEXT_CHARS:,} embedcli reads",
                location=location,
                record_id=rid,
                fix="split the document into parts",
            )
        )
        return True

    def add(
        self, location: str, rid: str, text: str | None, kept: Sequence[Any], extra: Sequence[Any], raw_id: Any = None
    ) -> None:
        if self.too_long(location, rid, [text, *extra]):
            return
        self.locations.append(location)
        self.ids.append(rid)
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
        ids: list[str],
        texts: list[str | None],
        kept: dict[str, list[Any]],
        extra: dict[str, list[Any]],
    ) -> None:
        longest = max((len(t) for col in (texts, *extra.values()) for t in col if isinstance(t, str)), default=0)
        if longest > MAX_TEXT_CHARS:  # rare: fall back to one record at a time
            for j, loc in enumerate(locations):
                self.add(loc, ids[j], texts[j], [kept[c][j] for c in self.spec.keep_cols],
                         [extra[c][j] for c in self.spec.extra_text_cols])
            return
        self.locations += locations
        self.ids += ids
        self.texts += texts
        if self.spec.batch_chars is not None:
            self.chars += sum(len(t) for t in texts if t is not None)
        for col in self.spec.keep_cols:
            self.columns[col] += kept[col]
        for col in self.spec.extra_text_cols:
            self.extra[col] += extra[col]

    def full(self) -> bool:
        cap = self.spec.batch_chars
        return len(self.ids) >= self.spec.batch_rows or (cap is not None and self.chars >= cap)

    def _cut(self) -> int:
        """Rows of the next full batch: `batch_rows`, or fewer where the texts reach `batch_chars`."""
        n = min(len(self.ids), self.spec.batch_rows)
        cap = self.spec.batch_chars
        if cap is None:
            return n
        used = 0
        for i in range(n):
            used += len(self.texts[i] or "")
            if used >= cap:
                return i + 1
        return n

    def take(self, n: int | None = None) -> InputBatch:
        """Remove and return the first `n` records (all when None) as a batch."""
        n = len(self.ids) if n is None else n
        if self.spec.batch_chars is not None:
            self.chars -= sum(len(t) for t in self.texts[:n] if t is not None)
        batch = InputBatch(
            source=self.source,
            locations=self.locations[:n],
            ids=self.ids[:n],
            texts=self.texts[:n],
            columns={c: v[:n] for c, v in self.columns.items()},
            extra_texts={c: v[:n] for c, v in self.extra.items()},
        )
        raw_ids = self.raw_ids[:n]
        del self.locations[:n], self.ids[:n], self.texts[:n], self.raw_ids[:n]
        for v in self.columns.values():
            del v[:n]
        for v in self.extra.values():
            del v[:n]
        if self.infer_types:
            batch = self._typed(batch, raw_ids)
        batch.column_types = {c: t for c in self.spec.keep_cols if (t := self.spec.kept_types.get(c)) is not None}
        batch.id_type = self.spec.id_type or pa.string()
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
        return InputBatch(
            source=batch.source,
            locations=[batch.locations[j] for j in keep],
            ids=[batch.ids[j] for j in keep],
            texts=[batch.texts[j] for j in keep],
            columns={c: [v[j] for j in keep] for c, v in batch.columns.items()},
            extra_texts={c: [v[j] for j in keep] for c, v in batch.extra_texts.items()},
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
        if arr is not None:
            return known if known is not None or pa.types.is_null(arr.type) else arr.type
        # Find the rows that do not fit: against the known type, or (first sight) the first value's.
        ref = known if known is not None else _first_type(values)
        for j, v in enumerate(values):
            if j not in bad and not _fits(v, ref):
                bad.add(j)
                self.spec.bad(
                    InputError(
                        self.source,
                        f"{field_name} is {_kind((shown or values)[j])}, but the column is {ref} in earlier rows",
                        location=batch.locations[j],
                        record_id=batch.ids[j],
                        fix="give the field one type in every record",
                    )
                )
        return known if ref is None or pa.types.is_null(ref) else ref

    def drain_full(self) -> Iterator[InputBatch]:
        while self.ids and (len(self.ids) >= self.spec.batch_rows or self._cut() < len(self.ids)):
            yield self.take(self._cut())


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
        data = self.stream.read(len(buffer))
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


def numbered_lines(
    f: IO[bytes], path: str, idle: bool = False, start_line: int = 0
) -> Iterator[tuple[int, bytes | None]]:
    """Yield (1-based line number, raw line) lazily, with a leading UTF-8 BOM removed.

    With `idle` (stdin), (line number, None) marks a pause of the writer: the caller hands on what it holds.
    `start_line`: the lines before where `f` stands (it was moved there by `seek_binary`).
    """
    lineno = start_line
    try:
        for raw in pipe_lines(f) if idle and path == STDIN else f:
            if raw is None:
                yield lineno, None
                continue
            lineno += 1
            if lineno == 1 and raw.startswith(BOM):
                raw = raw[len(BOM) :]
            yield lineno, raw
    except (OSError, EOFError, zlib.error, lzma.LZMAError, pa.ArrowException) as e:
        raise InputError(
            path, f"cannot read the file: {one_line(e)}", location=f"line {lineno + 1}"
        ) from None


def seek_binary(f: IO[bytes], path: str, offset: int) -> None:
    """Move an input opened by `open_binary` to byte `offset` of its (decompressed) content."""
    if offset <= 0:
        return
    if compression_of(path) is None and not is_url(path):
        f.seek(offset)
        return
    left = offset  # a stream: decompressed (or fetched) and dropped up to there; nothing is parsed
    while left:
        chunk = f.read(min(left, 1 << 20))
        if not chunk:
            raise InputError(path, f"is shorter than when its reading was planned ({offset:,} bytes)")
        left -= len(chunk)


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
    return True


def _first_type(values: Sequence[Any]) -> pa.DataType | None:
    for v in values:
        if v is not None:
            try:
                return value_type(v)
            except (pa.ArrowException, OverflowError, TypeError, ValueError):
                return None
    return None
