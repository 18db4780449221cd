"""The CSV (RFC 4180 quoting) and TSV (IANA, no quoting) readers."""

from __future__ import annotations

import csv
from collections.abc import Iterator

from embedcli.io.errors import InputError
from embedcli.io.reader_base import (
    BatchBuilder,
    InputBatch,
    ReadSpec,
    missing_column,
    numbered_lines,
    open_binary,
    utf8_error,
)

_CSV_FIELD_LIMIT = 2**31 - 1


def read_delimited(path: str, spec: ReadSpec, prefix: str, fmt: str) -> Iterator[InputBatch]:
    """CSV (RFC 4180 quoting) or TSV (IANA: no quoting; a tab or newline cannot occur in a field)."""
    if csv.field_size_limit() < _CSV_FIELD_LIMIT:
        csv.field_size_limit(_CSV_FIELD_LIMIT)  # long documents exceed the default 128 KiB per field
    bad_lines: dict[int, UnicodeDecodeError] = {}
    b = BatchBuilder(path, spec)

    with open_binary(path) as f:

        def decoded() -> Iterator[str]:
            for lineno, raw in numbered_lines(f, path):
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
                    raise utf8_error(path, bad, bad_lines[bad])
                header = row
                text_i, id_i, keep_i, extra_i = _header_indices(path, header, spec)
                continue
            loc = f"line {start}"
            if bad is not None:
                err = utf8_error(path, bad, bad_lines[bad])
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


def _header_indices(path: str, header: list[str], spec: ReadSpec) -> tuple[int, int, list[int], list[int]]:
    def index(col: str, what: str, flag: str) -> int:
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

