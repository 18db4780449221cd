"""The Parquet reader: columns checked against the file's schema, read a batch of rows at a time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from embedcli.io.commit import arrow_source
from embedcli.io.errors import STDIN, InputError
from embedcli.io.fingerprint import rereadable
from embedcli.io.positions import ReadPoint
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


def _row_groups(pf: pq.ParquetFile, first: int, last: int | None) -> tuple[list[int], int]:
    """The row groups holding rows `[first, last)` of a file, and the first row of the first of them."""
    md = pf.metadata
    groups: list[int] = []
    at = 0
    begin = 0
    for g in range(md.num_row_groups):
        n = md.row_group(g).num_rows
        if at + n > first and (last is None or at < last):
            if not groups:
                begin = at
            groups.append(g)
        at += n
    return groups, begin


def read_parquet(
    path: str, spec: ReadSpec, prefix: str, *, start: ReadPoint | None = None, stop: ReadPoint | None = None
) -> Iterator[InputBatch]:
    """Parquet, a batch of rows at a time; ids from the id column if present, else `file:row`. Rows from
    `start.pos` up to `stop.pos` (the row groups holding them are read; rows outside are dropped)."""
    first = start.pos if start is not None else 0
    last = stop.pos if stop is not None else None
    with _open(path) as pf:
        id_col = _check_columns(path, pf.schema_arrow, spec)
        wanted = [spec.text_col, *spec.extra_text_cols, *spec.keep_cols, *([id_col] if id_col else [])]
        b = BatchBuilder(path, spec)
        columns = list(dict.fromkeys(wanted))
        row = 0
        if first or last is not None:
            groups, row = _row_groups(pf, first, last)
            batches = pf.iter_batches(batch_size=spec.batch_rows, row_groups=groups, columns=columns) if groups else iter(())
        else:
            batches = pf.iter_batches(batch_size=spec.batch_rows, columns=columns)
        while True:
            try:
                rb = next(batches)
            except StopIteration:
                break
            except (pa.ArrowException, OSError) as e:
                raise _not_parquet(path, e, f" (reading rows from {row})") from None
            n = rb.num_rows
            lo = min(max(first - row, 0), n)
            hi = n if last is None else max(lo, min(last - row, n))
            base, row = row, row + n
            if lo or hi < n:
                rb = rb.slice(lo, hi - lo)
            if not rb.num_rows:
                if last is not None and base >= last:
                    break
                continue
            rows = range(base + lo, base + hi)
            locations = [f"row {i}" for i in rows]
            texts = rb.column(spec.text_col).to_pylist()
            kept = {c: rb.column(c).to_pylist() for c in spec.keep_cols}
            extra = {c: rb.column(c).to_pylist() for c in spec.extra_text_cols}
            if id_col is None:
                ids = [f"{prefix}:{i}" for i in rows]
            else:
                ids = rb.column(id_col).cast(pa.string()).to_pylist()
                keep = _good_ids(path, id_col, ids, locations, spec)
                if keep is not None:
                    locations, ids, texts = [locations[j] for j in keep], [ids[j] for j in keep], [texts[j] for j in keep]
                    kept = {c: [v[j] for j in keep] for c, v in kept.items()}
                    extra = {c: [v[j] for j in keep] for c, v in extra.items()}
            b.extend(locations, ids, texts, kept, extra)
            yield from b.drain_full()
        if len(b):
            yield b.take()


def _good_ids(path: str, id_col: str, ids: list[Any], locations: list[str], spec: ReadSpec) -> list[int] | None:
    """Report null/empty ids as bad rows; the rows to keep, or None when all are good."""
    bad = [j for j, v in enumerate(ids) if not v]
    if not bad:
        return None
    for j in bad:
        what = "null" if ids[j] is None else "empty"
        spec.bad(
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
