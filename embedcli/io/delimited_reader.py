"""The CSV (RFC 4180 quoting) and TSV (IANA, no quoting) readers."""

from __future__ import annotations

import csv
from collections import deque
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from embedcli.io.errors import InputError
from embedcli.io.positions import WHOLE, FilePart, ReadPoint
from embedcli.io.reader_base import (
    MAX_TEXT_CHARS,
    BatchBuilder,
    InputBatch,
    Lines,
    ReadSpec,
    missing_column,
    open_binary,
    seek_binary,
    utf8_error,
)

MAX_RECORD_LINES = 1000
"""A quoted CSV field may run over at most this many lines; longer, it is an unclosed quote (a bad row)."""
MAX_FIELD_CHARS = MAX_TEXT_CHARS
"""The longest field read; longer, it is a runaway quoted field (a bad row)."""

SWALLOW_MIN = 10
"""A multi-line field over at least this many lines that read as rows is a runaway quote (a bad row)."""


class _Records:
    """The records of a delimited file as (first line, last line, fields), with resync after a runaway quote.

    A quoted field left open runs to the end of the file (or to the next stray quote) in csv's own
    parser, folding every later row into one text. Here a record still open at the end of the file, or
    over MAX_RECORD_LINES lines or MAX_FIELD_CHARS characters, is reported as a bad row at the line
    that opened it, and parsing restarts on the line after, so the rows behind it are still read.
    """

    def __init__(self, lines: Iterator[tuple[int, str]], fmt: str) -> None:
        self.source = lines
        self.fmt = fmt
        self.pending: deque[tuple[int, str]] = deque()
        self.record: list[tuple[int, str]] = []
        self.chars = 0
        self.cut = False
        self.exhausted = False
        self.width = 0  # fields per row, once the header is known

    def _feed(self) -> Iterator[str]:
        while True:
            item: tuple[int, str] | None
            if self.pending:
                item = self.pending.popleft()
            else:
                item = next(self.source, None)
                if item is None:
                    self.exhausted = True
                    return
            self.record.append(item)
            self.chars += len(item[1])
            if len(self.record) > MAX_RECORD_LINES or self.chars > MAX_FIELD_CHARS:
                self.cut = True
                return
            yield item[1]

    def _reader(self) -> Iterator[list[str]]:
        if self.fmt == "csv":
            return csv.reader(self._feed(), delimiter=",", quotechar='"', doublequote=True)
        return csv.reader(self._feed(), delimiter="\t", quoting=csv.QUOTE_NONE)

    def _unclosed_at_end(self) -> bool:
        if self.fmt != "csv" or not self.exhausted or not self.record:
            return False
        try:
            list(csv.reader(["".join(t for _, t in self.record)], strict=True))
        except csv.Error as e:
            return "unexpected end of data" in str(e)
        return False

    def _swallows_rows(self) -> int:
        """Lines folded into this record that parse on their own as whole rows (0 unless most of them do)."""
        # Prose with a comma per line can pass for rows now and then; SWALLOW_MIN lines of which nine in
        # ten do cannot: that is an unclosed quote that a stray quote further down happened to close.
        lines = self.record[1:]
        if self.fmt != "csv" or not self.width or len(lines) < SWALLOW_MIN:
            return 0
        rows = sum(1 for _, t in lines if len(next(csv.reader([t]), [])) == self.width)
        return rows if rows >= SWALLOW_MIN and 10 * rows >= 9 * len(lines) else 0

    def __iter__(self) -> Iterator[tuple[int, int, list[str] | InputError]]:
        reader = self._reader()
        while True:
            self.record, self.chars, self.cut = [], 0, False
            try:
                row: list[str] | None = next(reader)
            except StopIteration:
                row = None
            except csv.Error as e:
                if not self.record:
                    raise
                if "new-line character seen in unquoted field" in str(e):  # csv's words for a lone CR
                    err = InputError("", "a carriage return (CR) inside an unquoted field, which is not taken as a "
                                     "line break (a file with old Mac CR line breaks?)",
                                     fix="end lines with LF or CRLF (e.g. tr '\\r' '\\n' < IN > OUT)"
                                     + (", or quote the field" if self.fmt == "csv" else ""))
                else:
                    err = self._runaway(f"malformed {self.fmt.upper()}: {e}")
                yield self.record[0][0], self.record[-1][0], err
                self._resync()
                reader = self._reader()
                continue
            swallowed = self._swallows_rows() if row is not None and not self.cut else 0
            if self.cut or swallowed or (row is not None and self._unclosed_at_end()):
                if self.cut:
                    how = f"is still open after {MAX_RECORD_LINES:,} lines or {MAX_FIELD_CHARS:,} characters"
                elif swallowed:
                    how = f"runs to line {self.record[-1][0]}, over {swallowed} lines that read as rows themselves"
                else:
                    how = "runs to the end of the file"
                yield self.record[0][0], self.record[0][0], self._runaway(f"a quoted field opened here {how}")
                self._resync()
                reader = self._reader()
                continue
            if row is None:
                return
            yield self.record[0][0], self.record[-1][0], row

    def _runaway(self, reason: str) -> InputError:
        return InputError("", reason, fix="close the quote (a quote inside a field is written \"\")")

    def _resync(self) -> None:
        """Drop the record's first line and parse again from the line after it."""
        self.pending.extendleft(reversed(self.record[1:]))
        self.exhausted = False


def _lines_of(f: Any, path: str, lines: Lines, bad_lines: dict[int, UnicodeDecodeError],
              ends: dict[int, int]) -> Iterator[tuple[int, str]]:
    """Decoded lines (bad UTF-8 noted in `bad_lines`, kept as surrogates), each line's end offset in `ends`."""
    for lineno, raw in lines:
        assert raw is not None  # None marks a pause of stdin, only with idle=True
        ends[lineno] = lines.offset
        try:
            yield lineno, raw.decode("utf-8")
        except UnicodeDecodeError as e:
            bad_lines[lineno] = e
            yield lineno, raw.decode("utf-8", "surrogateescape")


def _header(path: str, spec: ReadSpec, fmt: str) -> list[str]:
    """The header row of a file (read from its start: a run resuming inside the file needs it)."""
    bad_lines: dict[int, UnicodeDecodeError] = {}
    with open_binary(path) as f:
        lines = Lines(f, path)
        for start, _, row in _Records(_lines_of(f, path, lines, bad_lines, {}), fmt):
            if isinstance(row, InputError):
                raise _located(row, path, start)
            if row:
                return row
    return []


def read_delimited(
    path: str,
    spec: ReadSpec,
    prefix: str,
    fmt: str,
    part: FilePart = WHOLE,
) -> Iterator[InputBatch]:
    """CSV (RFC 4180 quoting) or TSV (IANA: no quoting; a tab or newline cannot occur in a field).

    Blocks are 16 records (or fewer where their text passes `BLOCK_BYTES`); they carry no identity, since a
    line of a CSV file may be inside a quoted field: a CSV or TSV file is read whole by `--incremental`."""
    if csv.field_size_limit() < MAX_FIELD_CHARS + 1:
        csv.field_size_limit(MAX_FIELD_CHARS + 1)  # long documents exceed the default 128 KiB per field
    file, start, stop, cuts = part.file, part.start, part.stop, part.cuts
    offset0 = start.pos if start is not None else 0
    if stop is not None and offset0 >= stop.pos:
        return
    bad_lines: dict[int, UnicodeDecodeError] = {}
    ends: dict[int, int] = {}
    b = BatchBuilder(path, spec, file)
    header: list[str] | None = None
    cols: tuple[int, int, list[int], list[int]] = (-1, -1, [], [])

    def set_header(row: list[str]) -> None:
        nonlocal header, cols
        header = row
        cols = _header_indices(path, header, spec, fmt)
        # CSV/TSV fields have no types: ids stay strings, as written.
        spec.fix_id_type(path, pa.string(), f"{fmt.upper()} fields are strings")

    if offset0 > 0:
        set_header(_header(path, spec, fmt))
    in_block = 0  # records of the open block
    block_bytes = 0
    boundary: ReadPoint | None = None  # where reading stands when the open block is complete
    with open_binary(path) as f:
        seek_binary(f, path, offset0)
        lines = Lines(f, path, offset=offset0, line=start.line if start is not None else 0)
        records = _Records(_lines_of(f, path, lines, bad_lines, ends), fmt)
        if header is not None:
            records.width = len(header)
        for rec_start, rec_end, row in records:
            if not isinstance(row, InputError) and not row:
                continue  # blank line
            if header is None and not isinstance(row, InputError):
                bad = next((n for n in range(rec_start, rec_end + 1) if n in bad_lines), None) if bad_lines else None
                if bad is not None:
                    raise utf8_error(path, bad, bad_lines[bad])
                set_header(row)
                assert header is not None
                records.width = len(header)
                continue
            if boundary is not None:  # a record begins after a complete block: the batch may end before it
                if stop is not None and boundary.pos >= stop.pos:
                    if b.has_blocks():
                        yield b.take(boundary, grid_end=True)
                    return
                if b.full():
                    yield b.take(boundary)
                boundary = None
            if in_block == 0:
                b.begin(rec_start)
            for n in [n for n in ends if n < rec_start]:
                del ends[n]
            if isinstance(row, InputError):
                if header is None:
                    raise _located(row, path, rec_start)
                b.error(_located(row, path, rec_start))
            else:
                bad = next((n for n in range(rec_start, rec_end + 1) if n in bad_lines), None) if bad_lines else None
                if bad is not None:
                    err = utf8_error(path, bad, bad_lines[bad])
                    bad_lines.clear()
                    b.error(err)
                else:
                    assert header is not None
                    record = _record(path, prefix, fmt, header, cols, rec_start, row, b)
                    if record is not None:
                        b.add(*record, number=rec_start)
                        block_bytes += len(record[2] or "")
            in_block += 1
            if in_block >= spec.block_lines or block_bytes >= spec.block_bytes:
                b.end_block()
                in_block, block_bytes = 0, 0
                end = ends.get(rec_end, lines.offset)
                boundary = ReadPoint(file, end, rec_end, state={"spec": spec.state()})
    if b.has_blocks():
        yield b.take(lambda: ReadPoint(file + 1, 0, 0, state={"spec": spec.state()}), grid_end=bool(cuts))


def _located(err: InputError, path: str, line: int) -> InputError:
    return InputError(path, err.reason, location=f"line {line}", fix=err.fix)


def _record(
    path: str,
    prefix: str,
    fmt: str,
    header: list[str],
    cols: tuple[int, int, list[int], list[int]],
    start: int,
    row: list[str],
    b: BatchBuilder,
) -> tuple[str, str, str, list[str], list[str]] | None:
    """(location, id, text, kept, extra) of a data row, or None when it is a bad row (reported)."""
    text_i, id_i, keep_i, extra_i = cols
    loc = f"line {start}"
    if len(row) != len(header):
        fix = "quote fields that contain the delimiter" if fmt == "csv" else "a TSV field cannot hold a tab"
        b.error(InputError(path, f"{len(row)} fields, but the header has {len(header)}", location=loc, fix=fix))
        return None
    if id_i < 0:
        rid = f"{prefix}:{start}"
    else:
        rid = row[id_i]
        if not rid:
            reason = f"id field {header[id_i]!r} is empty"
            b.error(InputError(path, reason, location=loc, fix="give every record a unique id"))
            return None
    return loc, rid, row[text_i], [row[i] for i in keep_i], [row[i] for i in extra_i]


_OTHER_DELIMITERS = {";": "semicolon", "\t": "tab", "|": "pipe", ",": "comma"}


def _one_column_header(path: str, header: list[str], spec: ReadSpec, fmt: str) -> None:
    """InputError naming the delimiter when the header is one column that another delimiter would split (a
    ';'-separated .csv, a .tsv with commas): not "no text column; the columns are: 'id;text'"."""
    if len(header) != 1 or spec.text_col in header:
        return
    own = "," if fmt == "csv" else "\t"
    for sep, name in _OTHER_DELIMITERS.items():
        if sep != own and spec.text_col in header[0].split(sep):
            raise InputError(
                path,
                f"the header {header[0]!r} reads as one column: its fields are separated by {name}s, but "
                f"{fmt.upper()} fields by {_OTHER_DELIMITERS[own]}s",
                location="line 1",
                fix="pass --format tsv" if sep == "\t" else "pass --format csv" if sep == "," else
                "convert it to CSV (comma-separated) or TSV (tab-separated) first",
            )


def _header_indices(path: str, header: list[str], spec: ReadSpec, fmt: str) -> tuple[int, int, list[int], list[int]]:
    _one_column_header(path, header, spec, fmt)
    def index(col: str, what: str, flag: str | None) -> int:
        if col not in header:
            raise missing_column(path, what, col, header, flag)
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

