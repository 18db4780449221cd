"""Streaming readers for embedcli inputs: JSONL, Parquet, CSV/TSV and plain text, from files, globs or stdin."""

from __future__ import annotations

import contextlib
import csv
import gzip
import hashlib
import json
import os
import re
import select
import stat
import sys
import zlib
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from glob import glob
from typing import IO, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from embedcli.io.errors import STDIN, InputError, display_path

__all__ = [
    "FORMATS",
    "InputBatch",
    "detect_format",
    "expand_paths",
    "input_fingerprint",
    "normalize_format",
    "read_inputs",
]

FORMATS: tuple[str, ...] = ("jsonl", "parquet", "csv", "tsv", "txt")
"""Input formats understood by `read_inputs`."""

_EXTENSIONS = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".csv": "csv",
    ".tsv": "tsv",
    ".txt": "txt",
}
_ALIASES = {"ndjson": "jsonl", "json": "jsonl", "pq": "parquet", "text": "txt", "tab": "tsv"}
_BOM = b"\xef\xbb\xbf"
_FINGERPRINT_CHUNK = 1 << 20
# Inputs up to this size are identified by a hash of their content (see `input_fingerprint`).
CONTENT_HASH_LIMIT = 1 << 30
_CSV_FIELD_LIMIT = 2**31 - 1
_GLOB_CHARS = re.compile(r"[*?\[]")
_UTF8_FIX = "re-encode the file as UTF-8 (e.g. iconv -f latin1 -t utf-8 IN > OUT)"

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

    def __len__(self) -> int:
        """Return the number of records in the batch."""
        return len(self.ids)


@dataclass(frozen=True)
class _Spec:
    text_col: str
    id_col: str
    id_explicit: bool
    keep_cols: tuple[str, ...]
    extra_text_cols: tuple[str, ...]
    batch_rows: int
    on_bad_row: BadRowHandler | None
    batch_chars: int | None = None

    def bad(self, err: InputError) -> None:
        """Raise a row-level error, or hand it to `on_bad_row` (and let the caller skip the row)."""
        if self.on_bad_row is None:
            raise err
        self.on_bad_row(err)


class _Builder:
    """Accumulates records of one file and cuts them into batches of `batch_rows`."""

    def __init__(self, source: str, spec: _Spec) -> None:
        self.source = source
        self.spec = spec
        self.locations: list[str] = []
        self.ids: list[str] = []
        self.texts: list[str | None] = []
        self.columns: dict[str, list[Any]] = {c: [] for c in spec.keep_cols}
        self.extra: dict[str, list[str | None]] = {c: [] for c in spec.extra_text_cols}
        self.chars = 0  # text characters held (only counted under a `batch_chars` cap)

    def __len__(self) -> int:
        return len(self.ids)

    def add(
        self, location: str, rid: str, text: str | None, kept: Sequence[Any], extra: Sequence[Any]
    ) -> None:
        self.locations.append(location)
        self.ids.append(rid)
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
        del self.locations[:n], self.ids[:n], self.texts[:n]
        for v in self.columns.values():
            del v[:n]
        for v in self.extra.values():
            del v[:n]
        return batch

    def drain_full(self) -> Iterator[InputBatch]:
        while self.ids and (len(self.ids) >= self.spec.batch_rows or self._cut() < len(self.ids)):
            yield self.take(self._cut())


# --------------------------------------------------------------------------------------------------
# Paths and formats


def normalize_format(fmt: str) -> str:
    """Map a `--format` value (or alias such as `ndjson`, `pq`, `text`) to one of FORMATS."""
    name = fmt.strip().lower().lstrip(".")
    name = _ALIASES.get(name, name)
    if name not in FORMATS:
        raise ValueError(f"unknown input format {fmt!r}; choose one of: {', '.join(FORMATS)}")
    return name


def detect_format(path: str, fmt: str | None = None) -> str:
    """Return the input format of `path`: `fmt` if given, else from the extension (stdin: jsonl)."""
    if fmt is not None:
        return normalize_format(fmt)
    if path == STDIN:
        return "jsonl"
    name = path.lower()
    if name.endswith(".gz"):
        name = name[:-3]
    ext = os.path.splitext(name)[1]
    if ext in _EXTENSIONS:
        return _EXTENSIONS[ext]
    raise InputError(
        path,
        f"unknown input format {ext or '(no extension)'!r}",
        fix=f"name it .jsonl, .parquet, .csv, .tsv or .txt, or pass --format {{{','.join(FORMATS)}}}",
    )


def expand_paths(paths: Sequence[str]) -> list[str]:
    """Expand globs (sorted, directories dropped) in the order given; raise InputError for no match."""
    if isinstance(paths, str):
        paths = [paths]
    if not paths:
        raise ValueError("no input paths given")
    out: list[str] = []
    for p in paths:
        if p == STDIN:
            out.append(p)
        elif os.path.exists(p):  # a literal path wins, even when it contains glob characters
            if os.path.isdir(p):
                raise InputError(
                    p, "is a directory", fix=f"name the files in it, e.g. '{os.path.join(p, '*.jsonl')}'"
                )
            out.append(p)
        elif _GLOB_CHARS.search(p):
            matches = sorted(m for m in glob(p, recursive=True) if not os.path.isdir(m))
            if not matches:
                raise InputError(
                    p, "no such file: the pattern matched no files", fix="check the pattern and the directory"
                )
            out.extend(matches)
        else:
            raise InputError(p, "no such file", fix="check the path")
    return out


def _id_prefixes(paths: Sequence[str]) -> dict[str, str]:
    """Prefix of default ids per file: the basename, or the path when basenames collide across inputs."""
    bases = {p: ("stdin" if p == STDIN else os.path.basename(p)) for p in paths}
    counts = Counter(bases.values())
    return {p: (b if counts[b] == 1 or p == STDIN else os.path.normpath(p)) for p, b in bases.items()}


# --------------------------------------------------------------------------------------------------
# Public entry point


def read_inputs(
    paths: Sequence[str],
    *,
    text_col: str = "text",
    id_col: str | None = None,
    keep_cols: Sequence[str] = (),
    extra_text_cols: Sequence[str] = (),
    fmt: str | None = None,
    batch_rows: int = 1024,
    on_bad_row: BadRowHandler | None = None,
    batch_chars: int | None = None,
) -> Iterator[InputBatch]:
    """Stream records from files, globs or `-` (stdin) as InputBatch objects, in input order.

    `id_col=None` means "the `id` column if the input has one, else `file:line` / `file:row`"; a
    named `id_col` must exist. Paths, globs and formats are checked now (InputError before any
    reading); column checks happen as each file is opened. Row-level problems (bad UTF-8, malformed
    JSON, a non-object line, a null/empty/badly typed id or text type, a CSV row with the wrong
    number of fields) raise InputError, or, when `on_bad_row` is given, are passed to it and the row
    is skipped. Null text is never an error here: it comes through as None. With `batch_chars` a batch
    also ends at the row whose text brings it to that many characters (the cut depends on the data only).
    """
    if batch_rows < 1:
        raise ValueError("batch_rows must be at least 1")
    spec = _Spec(
        text_col=text_col,
        id_col=id_col if id_col is not None else "id",
        id_explicit=id_col is not None,
        keep_cols=tuple(keep_cols),
        extra_text_cols=tuple(extra_text_cols),
        batch_rows=batch_rows,
        on_bad_row=on_bad_row,
        batch_chars=batch_chars,
    )
    if fmt is not None:
        fmt = normalize_format(fmt)
    resolved = expand_paths(paths)
    plan = [(p, detect_format(p, fmt)) for p in resolved]
    for p, f in plan:
        if f == "txt" and (spec.id_explicit or spec.keep_cols or spec.extra_text_cols):
            asked = [*([spec.id_col] if spec.id_explicit else []), *spec.keep_cols, *spec.extra_text_cols]
            raise InputError(
                p,
                f"plain-text input has no named columns (asked for: {', '.join(asked)}); each line is one text",
                fix="drop --id-col/--keep-cols for .txt input, or use JSONL/CSV/Parquet",
            )
        if f == "parquet" and p.lower().endswith(".gz"):
            raise InputError(p, "gzip-compressed Parquet is not supported", fix="decompress it first")
    return _iter_files(plan, spec, _id_prefixes(resolved))


def _iter_files(plan: list[tuple[str, str]], spec: _Spec, prefixes: dict[str, str]) -> Iterator[InputBatch]:
    for path, fmt in plan:
        if fmt == "jsonl":
            yield from _read_jsonl(path, spec, prefixes[path])
        elif fmt == "parquet":
            yield from _read_parquet(path, spec, prefixes[path])
        elif fmt in ("csv", "tsv"):
            yield from _read_delimited(path, spec, prefixes[path], fmt)
        else:
            yield from _read_txt(path, spec, prefixes[path])


# --------------------------------------------------------------------------------------------------
# Byte-level helpers


def _open_binary(path: str) -> contextlib.AbstractContextManager[IO[bytes]]:
    if path == STDIN:
        return contextlib.nullcontext(sys.stdin.buffer)
    try:
        if path.lower().endswith(".gz"):
            return gzip.open(path, "rb")
        return open(path, "rb")
    except FileNotFoundError:
        raise InputError(path, "no such file", fix="check the path") from None
    except OSError as e:
        raise InputError(path, f"cannot open: {e.strerror or e}") from None


def _pipe_lines(f: IO[bytes]) -> Iterator[bytes | None]:
    """Lines of a pipe as they arrive, and None each time the writer has nothing more for now."""
    try:
        fd = f.fileno()
    except (AttributeError, OSError, ValueError):
        yield from f  # not a real descriptor (an in-memory stream): it never waits
        return
    # Reads go to the descriptor under `f` (nothing has been read through `f` itself yet): a buffered
    # read would wait for a full buffer, not for the next line.
    pending = b""
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


def _numbered_lines(f: IO[bytes], path: str, idle: bool = False) -> Iterator[tuple[int, bytes | None]]:
    """Yield (1-based line number, raw line) lazily, with a leading UTF-8 BOM removed.

    With `idle` (stdin), (line number, None) marks a pause of the writer: the caller hands on what it holds.
    """
    lineno = 0
    try:
        for raw in _pipe_lines(f) if idle and path == STDIN else f:
            if raw is None:
                yield lineno, None
                continue
            lineno += 1
            if lineno == 1 and raw.startswith(_BOM):
                raw = raw[len(_BOM) :]
            yield lineno, raw
    except (OSError, EOFError, zlib.error) as e:
        raise InputError(
            path, f"cannot read the file: {_one_line(e)}", location=f"line {lineno + 1}"
        ) from None


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def _utf8_error(path: str, lineno: int, e: UnicodeDecodeError, record_id: str | None = None) -> InputError:
    return InputError(
        path,
        f"not valid UTF-8 (byte 0x{e.object[e.start]:02x} at byte {e.start + 1} of the line)",
        location=f"line {lineno}",
        record_id=record_id,
        fix=_UTF8_FIX,
    )


def _missing_column(
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


# --------------------------------------------------------------------------------------------------
# JSONL


def _type_name(value: Any) -> str:
    return {dict: "an object", list: "an array", bool: "a boolean", int: "a number", float: "a number"}.get(
        type(value), type(value).__name__
    )


def _id_hint(line: str, key: str) -> str | None:
    """Best-effort id of a malformed JSON line, so the user can find it."""
    m = re.search(r'"' + re.escape(key) + r'"\s*:\s*("(?:[^"\\]|\\.)*"|-?\d+)', line)
    if not m:
        return None
    try:
        return str(json.loads(m.group(1)))
    except ValueError:
        return None


def _read_jsonl(path: str, spec: _Spec, prefix: str) -> Iterator[InputBatch]:
    b = _Builder(path, spec)
    id_key: str | None = None  # decided on the first record: spec.id_col, or None for default ids
    first = True
    with _open_binary(path) as f:
        for lineno, raw in _numbered_lines(f, path, idle=True):
            if raw is None:
                if len(b):
                    yield b.take()  # the writer paused: stream what arrived (stdin runs never resume)
                continue
            if not raw.strip():
                continue
            loc = f"line {lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                spec.bad(_utf8_error(path, lineno, e))
                continue
            try:
                rec = json.loads(line)
            except ValueError as e:
                if first and line.lstrip().startswith("["):
                    raise _json_array_error(path, loc) from None
                msg = f"{e.msg} (column {e.colno})" if isinstance(e, json.JSONDecodeError) else str(e)
                spec.bad(
                    InputError(
                        path,
                        f"malformed JSON: {msg}",
                        location=loc,
                        record_id=_id_hint(line, spec.id_col),
                        fix="each line must be one complete JSON object"
                        + ("; for plain text, one text per line, pass --format txt" if first else ""),
                    )
                )
                continue
            if not isinstance(rec, dict):
                if first and isinstance(rec, list):
                    raise _json_array_error(path, loc)
                spec.bad(
                    InputError(
                        path,
                        f"expected a JSON object, got {_type_name(rec)}",
                        location=loc,
                        fix='each line must be one JSON object like {"id": ..., "text": ...}',
                    )
                )
                continue
            if first:
                first = False
                id_key = _check_jsonl_fields(path, loc, rec, spec)
            if id_key is None:
                rid = f"{prefix}:{lineno}"
            else:
                rid_or_none = _record_id(path, loc, rec.get(id_key, _MISSING), id_key, spec)
                if rid_or_none is None:
                    continue
                rid = rid_or_none
            text = rec.get(spec.text_col)
            if not _text_ok(path, loc, rid, spec.text_col, text, spec):
                continue
            extra = [rec.get(c) for c in spec.extra_text_cols]
            if not all(
                _text_ok(path, loc, rid, c, v, spec) for c, v in zip(spec.extra_text_cols, extra, strict=True)
            ):
                continue
            b.add(loc, rid, text, [rec.get(c) for c in spec.keep_cols], extra)
            if b.full():
                yield b.take()
    if len(b):
        yield b.take()


_MISSING: Any = object()


def _json_array_error(path: str, loc: str) -> InputError:
    return InputError(
        path,
        "looks like a JSON array, not JSON Lines (one object per line)",
        location=loc,
        fix=f"convert it: jq -c '.[]' {path} > {os.path.splitext(os.path.basename(path))[0]}.jsonl",
    )


def _check_jsonl_fields(path: str, loc: str, rec: dict[str, Any], spec: _Spec) -> str | None:
    """Check the first record has the requested fields; return the id key, or None for default ids."""
    fields = list(rec)
    if spec.text_col not in rec:
        raise _missing_column(path, "text", spec.text_col, fields, "--text-col", loc)
    for col in spec.extra_text_cols:
        if col not in rec:
            raise _missing_column(path, "text", col, fields, None, loc)
    for col in spec.keep_cols:
        if col not in rec:
            raise _missing_column(path, "kept", col, fields, "--keep-cols", loc)
    if spec.id_col in rec:
        return spec.id_col
    if spec.id_explicit:
        raise _missing_column(path, "id", spec.id_col, fields, "--id-col", loc)
    return None


def _record_id(path: str, loc: str, value: Any, key: str, spec: _Spec) -> str | None:
    """Return the record's id as a string, or report a bad id (returning None when skipped)."""
    if isinstance(value, str) and value:
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if value is _MISSING:
        reason = f"no id field {key!r}"
    elif value is None:
        reason = f"id field {key!r} is null"
    elif value == "":
        reason = f"id field {key!r} is empty"
    else:
        reason = f"id field {key!r} is {_type_name(value)}; ids must be strings or integers"
    spec.bad(InputError(path, reason, location=loc, fix="give every record a unique id"))
    return None


def _text_ok(path: str, loc: str, rid: str, col: str, value: Any, spec: _Spec) -> bool:
    if value is None or isinstance(value, str):
        return True
    spec.bad(
        InputError(
            path,
            f"text field {col!r} is {_type_name(value)}; expected a string or null",
            location=loc,
            record_id=rid,
        )
    )
    return False


# --------------------------------------------------------------------------------------------------
# Plain text


def _read_txt(path: str, spec: _Spec, prefix: str) -> Iterator[InputBatch]:
    b = _Builder(path, spec)
    with _open_binary(path) as f:
        for lineno, raw in _numbered_lines(f, path, idle=True):
            if raw is None:
                if len(b):
                    yield b.take()
                continue
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                spec.bad(_utf8_error(path, lineno, e, record_id=f"{prefix}:{lineno}"))
                continue
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            b.add(f"line {lineno}", f"{prefix}:{lineno}", line, (), ())
            if b.full():
                yield b.take()
    if len(b):
        yield b.take()


# --------------------------------------------------------------------------------------------------
# CSV / TSV


def _read_delimited(path: str, spec: _Spec, prefix: str, fmt: str) -> Iterator[InputBatch]:
    """CSV (RFC 4180 quoting) or TSV (IANA: no quoting; a tab or newline cannot occur in a field)."""
    if csv.field_size_limit() < _CSV_FIELD_LIMIT:
        csv.field_size_limit(_CSV_FIELD_LIMIT)  # long documents exceed the default 128 KiB per field
    bad_lines: dict[int, UnicodeDecodeError] = {}
    b = _Builder(path, spec)

    with _open_binary(path) as f:

        def decoded() -> Iterator[str]:
            for lineno, raw in _numbered_lines(f, path):
                try:
                    yield raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    bad_lines[lineno] = e
                    yield raw.decode("utf-8", "surrogateescape")

        if fmt == "csv":
            reader = csv.reader(decoded(), delimiter=",", quotechar='"', doublequote=True)
        else:
            reader = csv.reader(decoded(), delimiter="\t", quoting=csv.QUOTE_NONE)
        header: list[str] | None = None
        text_i = id_i = -1
        keep_i: list[int] = []
        extra_i: list[int] = []
        prev_end = 0
        while True:
            try:
                row = next(reader)
            except StopIteration:
                break
            except csv.Error as e:
                raise InputError(
                    path, f"malformed {fmt.upper()}: {e}", location=f"line {reader.line_num}"
                ) from None
            start, end = prev_end + 1, reader.line_num
            prev_end = end
            if not row:
                continue  # blank line
            bad = next((n for n in range(start, end + 1) if n in bad_lines), None) if bad_lines else None
            if header is None:
                if bad is not None:
                    raise _utf8_error(path, bad, bad_lines[bad])
                header = row
                text_i, id_i, keep_i, extra_i = _header_indices(path, header, spec)
                continue
            loc = f"line {start}"
            if bad is not None:
                err = _utf8_error(path, bad, bad_lines[bad])
                bad_lines.clear()
                spec.bad(err)
                continue
            if len(row) != len(header):
                spec.bad(
                    InputError(
                        path,
                        f"{len(row)} fields, but the header has {len(header)}",
                        location=loc,
                        fix="quote fields that contain the delimiter"
                        if fmt == "csv"
                        else "a TSV field cannot hold a tab",
                    )
                )
                continue
            if id_i < 0:
                rid = f"{prefix}:{start}"
            else:
                rid = row[id_i]
                if not rid:
                    spec.bad(
                        InputError(
                            path,
                            f"id field {header[id_i]!r} is empty",
                            location=loc,
                            fix="give every record a unique id",
                        )
                    )
                    continue
            b.add(loc, rid, row[text_i], [row[i] for i in keep_i], [row[i] for i in extra_i])
            if b.full():
                yield b.take()
    if len(b):
        yield b.take()


def _header_indices(path: str, header: list[str], spec: _Spec) -> tuple[int, int, list[int], list[int]]:
    def index(col: str, what: str, flag: str) -> int:
        if col not in header:
            raise _missing_column(path, what, col, header, flag)
        if header.count(col) > 1:
            raise InputError(
                path, f"column {col!r} appears {header.count(col)} times in the header", location="line 1"
            )
        return header.index(col)

    text_i = index(spec.text_col, "text", "--text-col")
    if spec.id_col in header or spec.id_explicit:
        id_i = index(spec.id_col, "id", "--id-col")
    else:
        id_i = -1
    keep_i = [index(c, "kept", "--keep-cols") for c in spec.keep_cols]
    extra_i = [index(c, "text", None) for c in spec.extra_text_cols]
    return text_i, id_i, keep_i, extra_i


# --------------------------------------------------------------------------------------------------
# Parquet


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


def _not_parquet(path: str, e: BaseException, where: str = "") -> InputError:
    return InputError(
        path,
        f"not a readable Parquet file{where}: {_one_line(e)}",
        fix="check the file is complete (truncated copy? still being written?) and really Parquet",
    )


def _read_parquet(path: str, spec: _Spec, prefix: str) -> Iterator[InputBatch]:
    try:
        source: Any = pa.BufferReader(sys.stdin.buffer.read()) if path == STDIN else path
        pf = pq.ParquetFile(source)
    except FileNotFoundError:
        raise InputError(path, "no such file", fix="check the path") from None
    except (pa.ArrowException, OSError) as e:
        raise _not_parquet(path, e) from None
    with pf:
        schema = pf.schema_arrow
        names = schema.names

        def need(col: str, what: str, flag: str) -> None:
            if col not in names:
                raise _missing_column(path, what, col, names, flag)

        need(spec.text_col, "text", "--text-col")
        for c in spec.extra_text_cols:
            need(c, "text", None)
        for c in spec.keep_cols:
            need(c, "kept", "--keep-cols")
        id_col: str | None = spec.id_col if (spec.id_explicit or spec.id_col in names) else None
        if id_col is not None:
            need(id_col, "id", "--id-col")
            t = schema.field(id_col).type
            if not _is_id_type(t):
                raise InputError(path, f"id column {id_col!r} has type {t}; ids must be strings or integers")
        for c in (spec.text_col, *spec.extra_text_cols):
            t = schema.field(c).type
            if not _is_text_type(t):
                raise InputError(path, f"text column {c!r} has type {t}; expected a string column")

        wanted = [spec.text_col, *spec.extra_text_cols, *spec.keep_cols, *([id_col] if id_col else [])]
        columns = list(dict.fromkeys(wanted))
        b = _Builder(path, spec)
        batches = pf.iter_batches(batch_size=spec.batch_rows, columns=columns)
        row = 0
        while True:
            try:
                rb = next(batches)
            except StopIteration:
                break
            except (pa.ArrowException, OSError) as e:
                raise _not_parquet(path, e, f" (reading rows from {row})") from None
            n = rb.num_rows
            rows = range(row, row + n)
            row += n
            locations = [f"row {i}" for i in rows]
            texts = rb.column(spec.text_col).to_pylist()
            kept = {c: rb.column(c).to_pylist() for c in spec.keep_cols}
            extra = {c: rb.column(c).to_pylist() for c in spec.extra_text_cols}
            if id_col is None:
                ids = [f"{prefix}:{i}" for i in rows]
            else:
                ids = pc.cast(rb.column(id_col), pa.string()).to_pylist()
                bad = [j for j, v in enumerate(ids) if not v]
                if bad:
                    for j in bad:
                        what = "null" if ids[j] is None else "empty"
                        spec.bad(
                            InputError(
                                path,
                                f"id column {id_col!r} is {what}",
                                location=locations[j],
                                fix="give every record a unique id",
                            )
                        )
                    keep = [j for j in range(n) if ids[j]]
                    locations, ids, texts = (
                        [locations[j] for j in keep],
                        [ids[j] for j in keep],
                        [texts[j] for j in keep],
                    )
                    kept = {c: [v[j] for j in keep] for c, v in kept.items()}
                    extra = {c: [v[j] for j in keep] for c, v in extra.items()}
            b.extend(locations, ids, texts, kept, extra)
            yield from b.drain_full()
        if len(b):
            yield b.take()


# --------------------------------------------------------------------------------------------------
# Record counts (for a progress total)


def count_records(path: str, fmt: str | None = None) -> int | None:
    """Records in `path` for a progress total: Parquet metadata, or newlines of a regular uncompressed
    text file (a CSV/TSV header is not counted; blank lines and quoted newlines make it an estimate).
    None for stdin, pipes and compressed files, which cannot be read twice or cheaply."""
    if path == STDIN:
        return None
    fmt = detect_format(path, fmt)
    try:
        if fmt == "parquet":
            return int(pq.ParquetFile(path).metadata.num_rows)
        if path.lower().endswith(".gz") or not stat.S_ISREG(os.stat(path).st_mode):
            return None
        lines = 0
        last = b"\n"
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                lines += chunk.count(b"\n")
                last = chunk[-1:]
    except (OSError, pa.ArrowException):
        return None
    lines += last != b"\n"
    return max(0, lines - 1) if fmt in ("csv", "tsv") else lines


# --------------------------------------------------------------------------------------------------
# Fingerprints


def input_fingerprint(path: str, content_limit: int = CONTENT_HASH_LIMIT) -> dict[str, Any]:
    """Identify an input file for resume manifests and reruns.

    Up to `content_limit` bytes: the size and a BLAKE2b hash of the whole content, so a regenerated or
    moved file with the same bytes is the same input (hashing runs at about 1 GB/s, read once per run).
    Larger files: size, mtime_ns and sha256 of the first and last 1 MiB (touching one recomputes it).
    """
    if path == STDIN:
        raise InputError(
            path,
            "stdin cannot be fingerprinted, so a run reading it cannot resume",
            fix="write the input to a file first",
        )
    try:
        st = os.stat(path)
        with open(path, "rb") as f:
            if st.st_size <= content_limit:
                digest = hashlib.blake2b(digest_size=16)
                while chunk := f.read(_FINGERPRINT_CHUNK):
                    digest.update(chunk)
                return {"path": os.path.abspath(path), "size": st.st_size, "blake2b": digest.hexdigest()}
            head = hashlib.sha256(f.read(_FINGERPRINT_CHUNK)).hexdigest()
            f.seek(st.st_size - _FINGERPRINT_CHUNK)
            tail = hashlib.sha256(f.read(_FINGERPRINT_CHUNK)).hexdigest()
    except FileNotFoundError:
        raise InputError(path, "no such file", fix="check the path") from None
    except OSError as e:
        raise InputError(path, f"cannot read: {e.strerror or e}") from None
    return {
        "path": os.path.abspath(path),
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "head_sha256": head,
        "tail_sha256": tail,
        "chunk_bytes": _FINGERPRINT_CHUNK,
    }


def fingerprint_identity(fp: dict[str, Any]) -> dict[str, Any]:
    """What makes two fingerprints the same input: the content when it was hashed (not where the file is)."""
    return {k: v for k, v in fp.items() if k != "path"} if "blake2b" in fp else fp


def describe_input_change(old: list[dict[str, Any]] | None, new: list[dict[str, Any]] | None) -> str:
    """Why two runs' inputs are not the same, in one line (which file, and what changed)."""
    if old is None or new is None:
        return "the previous run read stdin" if old is None else "this run reads stdin"
    old_by_path = {fp.get("path"): fp for fp in old}
    new_paths = {fp.get("path") for fp in new}
    paired = set()
    reasons = []
    for i, fp in enumerate(new):
        before = old_by_path.get(fp.get("path"))
        if before is None and len(old) == len(new) and old[i].get("path") not in new_paths:
            before = old[i]  # the same place in the list under another path: a moved file
            paired.add(before.get("path"))
        name = display_path(str(fp.get("path")))
        if before is None:
            reasons.append(f"{name} is new")
        elif before.get("size") != fp.get("size"):
            reasons.append(f"{name} changed size ({before.get('size'):,} → {fp.get('size'):,} bytes)")
        elif fingerprint_identity(before) != fingerprint_identity(fp):
            what = "content" if "blake2b" in fp and "blake2b" in before else "modification time or content"
            reasons.append(f"{name} changed ({what})")
    gone = [display_path(str(p)) for p in old_by_path if p not in new_paths and p not in paired]
    if gone:
        reasons.append(f"{', '.join(gone)} no longer read")
    if not reasons and [fingerprint_identity(f) for f in old] != [fingerprint_identity(f) for f in new]:
        reasons.append("the input files or their order changed")
    return "; ".join(reasons) or "the inputs were fingerprinted differently (an older embedcli)"
