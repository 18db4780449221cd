"""Atomic result writers (Parquet, JSONL, .npy) with provenance metadata, and vector-column helpers."""

from __future__ import annotations

import abc
import base64
import codecs
import datetime
import decimal
import itertools
import json
import os
import struct
import sys
from collections.abc import Mapping
from types import TracebackType
from typing import IO, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from embedcli.io.errors import STDIN, OutputError

__all__ = [
    "LINES",
    "OUTPUT_FORMATS",
    "JsonlResultWriter",
    "LinesResultWriter",
    "NpyResultWriter",
    "ParquetResultWriter",
    "ResultWriter",
    "check_output_path",
    "embedding_array",
    "embedding_matrix",
    "embedding_type",
    "open_writer",
    "output_format",
    "table_to_json_lines",
    "temp_path",
]

OUTPUT_FORMATS: tuple[str, ...] = ("parquet", "jsonl", "npy")
"""Output formats understood by `open_writer`."""
LINES = "lines"
"""A table of one string column written as is, one value per line (run-batch's response lines); a
command asks for it by name (`fmt="lines"`), it is not chosen by extension nor offered by `--output-format`."""

_OUT_EXTENSIONS = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".npy": "npy",
}
_OUT_ALIASES = {"pq": "parquet", "ndjson": "jsonl", "json": "jsonl"}
_VECTOR_TYPES: dict[np.dtype[Any], pa.DataType] = {
    np.dtype(np.float32): pa.float32(),
    np.dtype(np.float16): pa.float16(),
    np.dtype(np.float64): pa.float64(),
    np.dtype(np.int8): pa.int8(),
    np.dtype(np.uint8): pa.uint8(),
}
_JSON_SEPARATORS = (",", ":")
_NPY_MAGIC = b"\x93NUMPY\x01\x00"
_NPY_HEADER_LEN = 128  # room for shape (10**19, 10**10); a multiple of 64 as the format asks

BatchLike = pa.RecordBatch | pa.Table


# --------------------------------------------------------------------------------------------------
# Paths


def temp_path(path: str) -> str:
    """Return the staging path `.{name}.tmp-{pid}` next to `path` (same directory, so rename is atomic)."""
    directory, name = os.path.split(os.path.abspath(path))
    return os.path.join(directory, f".{name}.tmp-{os.getpid()}")


def check_output_path(path: str, *, as_dir: bool = False) -> None:
    """Raise OutputError unless a file (`as_dir`: a directory of shards) can be created at `path` (`-` passes)."""
    if path == STDIN:
        return
    if as_dir or path.endswith(("/", os.sep)):  # a directory of shards: its parent must be writable
        path = os.path.abspath(path.rstrip("/" + os.sep) or path)
    elif os.path.isdir(path):
        raise OutputError(
            path, "is a directory", fix=f"name a file, e.g. {os.path.join(path, 'embeddings.parquet')}"
        )
    parent = os.path.dirname(path) or "."
    if not os.path.exists(parent):
        raise OutputError(
            path, f"directory {parent!r} does not exist", fix=f"create it first: mkdir -p {parent}"
        )
    if not os.path.isdir(parent):
        raise OutputError(path, f"{parent!r} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(
            path,
            f"permission denied: cannot create files in {parent!r}",
            fix="choose a directory you can write to",
        )


def _os_error(path: str, e: OSError) -> OutputError:
    reason = e.strerror or str(e)
    fix = "choose a directory you can write to" if isinstance(e, PermissionError) else None
    return OutputError(path, reason, fix=fix)


def _open_temp(path: str, tmp: str) -> IO[bytes]:
    try:
        return open(tmp, "wb")  # closed in commit/abort
    except OSError as e:
        raise _os_error(path, e) from None


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: str) -> None:
    try:
        _fsync(os.path.dirname(os.path.abspath(path)))
    except OSError:  # not supported everywhere; the rename itself is still atomic
        pass


def _close_synced(f: IO[bytes]) -> None:
    f.flush()
    os.fsync(f.fileno())
    f.close()


def _unlink(path: str | None) -> None:
    if path is None:
        return
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _str_metadata(metadata: Mapping[str, Any] | None) -> dict[str, str]:
    """Metadata values as strings: strings as-is, anything else JSON-encoded."""
    return {
        str(k): v if isinstance(v, str) else json.dumps(v, sort_keys=True)
        for k, v in (metadata or {}).items()
    }


def _stage_sidecar(path: str, payload: dict[str, Any]) -> str:
    """Write a JSON sidecar to its staging path (fsynced) and return that path."""
    tmp = temp_path(path)
    with open(tmp, "wb") as f:
        f.write(json.dumps(payload, indent=2, sort_keys=True, ensure_ascii=False).encode("utf-8") + b"\n")
        f.flush()
        os.fsync(f.fileno())
    return tmp


def _as_table(batch: BatchLike) -> pa.Table:
    if isinstance(batch, pa.Table):
        return batch
    if isinstance(batch, pa.RecordBatch):
        return pa.Table.from_batches([batch])
    raise TypeError(f"expected a pyarrow RecordBatch or Table, got {type(batch).__name__}")


# --------------------------------------------------------------------------------------------------
# Base class


class ResultWriter(abc.ABC):
    """Writes result batches to a staging file; `commit()` renames it into place, `abort()` deletes it."""

    format: str = ""

    def __init__(self, path: str, metadata: Mapping[str, Any] | None) -> None:
        self.path = path
        self.metadata = _str_metadata(metadata)
        self.rows_written = 0
        self._state = "open"

    @property
    def state(self) -> str:
        """Return "open", "committed" or "aborted"."""
        return self._state

    def write(self, batch: BatchLike) -> None:
        """Append the rows of a RecordBatch or Table."""
        if self._state != "open":
            raise ValueError(f"the writer for {self.path} is {self._state}")
        table = _as_table(batch)
        try:
            self._write(table)
        except OSError as e:
            raise _os_error(self.path, e) from None
        self.rows_written += table.num_rows

    def commit(self) -> None:
        """Finish the file and move it onto its final path atomically (idempotent)."""
        if self._state == "committed":
            return
        if self._state == "aborted":
            raise ValueError(f"the writer for {self.path} was aborted")
        try:
            self._commit()
        except OSError as e:
            self.abort()
            raise _os_error(self.path, e) from None
        except BaseException:
            self.abort()
            raise
        self._state = "committed"

    def close(self) -> None:
        """Same as commit()."""
        self.commit()

    def abort(self) -> None:
        """Drop everything written so far; the final path is left as it was (idempotent)."""
        if self._state != "open":
            return
        self._state = "aborted"
        self._abort()

    def __enter__(self) -> ResultWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()

    @abc.abstractmethod
    def _write(self, table: pa.Table) -> None: ...

    @abc.abstractmethod
    def _commit(self) -> None: ...

    @abc.abstractmethod
    def _abort(self) -> None: ...


# --------------------------------------------------------------------------------------------------
# Parquet


def _with_metadata(schema: pa.Schema, metadata: dict[str, str]) -> pa.Schema:
    merged = dict(schema.metadata or {})
    merged.update({k.encode("utf-8"): v.encode("utf-8") for k, v in metadata.items()})
    return schema.with_metadata(merged)


def dictionary_columns(schema: pa.Schema) -> list[str]:
    """Columns worth dictionary-encoding: all but numeric vectors.

    Dictionary encoding of float vectors never pays (every value differs): each row group hashes up to a
    megabyte of values before falling back, which made writes ~4x slower and files ~40% larger.
    """
    def is_vector(t: pa.DataType) -> bool:
        if pa.types.is_fixed_size_list(t) or pa.types.is_list(t) or pa.types.is_large_list(t):
            return is_vector(t.value_type)
        return pa.types.is_floating(t) or pa.types.is_integer(t)

    return [f.name for f in schema if not (is_vector(f.type) and not pa.types.is_integer(f.type))]


def _conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """Return `table` with exactly `schema`'s types (casting e.g. all-null columns), or raise ValueError."""
    if table.schema.equals(schema, check_metadata=False):
        return table
    if table.column_names != schema.names:
        raise ValueError(f"batch columns {table.column_names} do not match the output columns {schema.names}")
    try:
        return table.cast(schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
        raise ValueError(
            f"batch does not match the output schema: {e}\nbatch: {table.schema}\noutput: {schema}"
        ) from None


class ParquetResultWriter(ResultWriter):
    """Parquet output (zstd; one or more row groups per write) with provenance in the key-value metadata."""

    format = "parquet"

    def __init__(
        self,
        path: str,
        schema: pa.Schema,
        metadata: Mapping[str, Any] | None = None,
        *,
        compression: str = "zstd",
    ) -> None:
        super().__init__(path, metadata)
        if path == STDIN:
            raise OutputError(
                path, "Parquet cannot be written to stdout", fix="use -o FILE.parquet, or -o - for JSONL"
            )
        check_output_path(path)
        self.schema = _with_metadata(schema, self.metadata)
        self._tmp = temp_path(path)
        try:
            self._writer = pq.ParquetWriter(
                self._tmp, self.schema, compression=compression, use_dictionary=dictionary_columns(self.schema)
            )
        except OSError as e:
            _unlink(self._tmp)
            raise _os_error(path, e) from None

    def _write(self, table: pa.Table) -> None:
        self._writer.write_table(_conform(table, self.schema))

    def _commit(self) -> None:
        self._writer.close()
        _fsync(self._tmp)
        os.replace(self._tmp, self.path)
        _fsync_dir(self.path)

    def _abort(self) -> None:
        try:
            self._writer.close()
        except Exception:  # the file is being thrown away
            pass
        _unlink(self._tmp)


# --------------------------------------------------------------------------------------------------
# JSONL


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, datetime.date | datetime.time | datetime.datetime):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _numeric_list_json(arr: pa.Array) -> list[str] | None:
    """JSON arrays for a list column of numbers, built with numpy; None when the fast path does not apply."""
    t = arr.type
    if not (pa.types.is_fixed_size_list(t) or pa.types.is_list(t) or pa.types.is_large_list(t)):
        return None
    vt = t.value_type
    if not (pa.types.is_floating(vt) or pa.types.is_integer(vt)) or arr.null_count:
        return None
    flat = arr.flatten()
    if flat.null_count:
        return None
    values = flat.to_numpy(zero_copy_only=False)
    strs = values.astype(str)
    if pa.types.is_floating(vt) and not np.isfinite(values).all():
        strs[np.isnan(values)] = "NaN"  # what json.dumps writes
        strs[values == np.inf] = "Infinity"
        strs[values == -np.inf] = "-Infinity"
    items = strs.tolist()
    if pa.types.is_fixed_size_list(t):
        d = t.list_size
        return ["[" + ",".join(items[i : i + d]) + "]" for i in range(0, len(items), d)]
    offsets = arr.offsets.to_numpy()
    offsets = (offsets - offsets[0]).tolist()
    return ["[" + ",".join(items[a:b]) + "]" for a, b in itertools.pairwise(offsets)]


def _column_json(col: pa.ChunkedArray, ensure_ascii: bool) -> list[str]:
    out: list[str] = []
    for chunk in col.chunks:
        fast = _numeric_list_json(chunk)
        if fast is not None:
            out += fast
        else:
            out += [
                json.dumps(v, ensure_ascii=ensure_ascii, separators=_JSON_SEPARATORS, default=_json_default)
                for v in chunk.to_pylist()
            ]
    return out


def table_to_json_lines(table: pa.Table, *, ensure_ascii: bool = False) -> list[str]:
    """Render each row as one compact JSON object; list columns become arrays (float32 in shortest form)."""
    keys = [json.dumps(n, ensure_ascii=ensure_ascii) + ":" for n in table.column_names]
    cols = [_column_json(table.column(i), ensure_ascii) for i in range(table.num_columns)]
    return [
        "{" + ",".join(k + v for k, v in zip(keys, vals, strict=True)) + "}"
        for vals in zip(*cols, strict=True)
    ]


def _stdout_is_utf8() -> bool:
    try:
        return codecs.lookup(getattr(sys.stdout, "encoding", None) or "utf-8").name == "utf-8"
    except LookupError:
        return False


class JsonlResultWriter(ResultWriter):
    """JSON Lines output to a file (provenance in `{path}.meta.json`) or to stdout for `-` (no sidecar)."""

    format = "jsonl"

    def __init__(self, path: str, metadata: Mapping[str, Any] | None = None) -> None:
        super().__init__(path, metadata)
        self._tmp: str | None = None
        self._f: IO[bytes] | None = None
        if path != STDIN:
            check_output_path(path)
            self._tmp = temp_path(path)
            self._f = _open_temp(path, self._tmp)

    @property
    def sidecar_path(self) -> str | None:
        """Return the provenance sidecar's path (None for stdout)."""
        return None if self.path == STDIN else f"{self.path}.meta.json"

    def _write(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        if self._f is None:
            lines = table_to_json_lines(table, ensure_ascii=not _stdout_is_utf8())
            sys.stdout.write("\n".join(lines) + "\n")
        else:
            lines = table_to_json_lines(table)
            self._f.write(("\n".join(lines) + "\n").encode("utf-8"))

    def _commit(self) -> None:
        if self._f is None:
            sys.stdout.flush()
            return
        assert self._tmp is not None and self.sidecar_path is not None
        _close_synced(self._f)
        meta = {
            "format": self.format,
            "file": os.path.basename(self.path),
            "rows": self.rows_written,
            "metadata": self.metadata,
        }
        meta_tmp = _stage_sidecar(self.sidecar_path, meta)
        os.replace(meta_tmp, self.sidecar_path)
        os.replace(self._tmp, self.path)  # the data file last: its appearance is the commit
        _fsync_dir(self.path)

    def _abort(self) -> None:
        if self._f is None:
            try:
                sys.stdout.flush()
            except OSError:
                pass
            return
        self._f.close()
        _unlink(self._tmp)
        if self.sidecar_path:
            _unlink(temp_path(self.sidecar_path))


class LinesResultWriter(JsonlResultWriter):
    """Each value of a table's one string column as one line, unchanged (already-serialized JSON lines)."""

    format = LINES

    def _write(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        if table.num_columns != 1 or not pa.types.is_string(table.schema.field(0).type):
            raise OutputError(self.path, f"the lines format writes one string column, not {table.schema.names}")
        data = "\n".join(table.column(0).to_pylist()) + "\n"
        if self._f is None:
            sys.stdout.write(data)
        else:
            self._f.write(data.encode("utf-8"))


# --------------------------------------------------------------------------------------------------
# .npy


def _npy_header(dtype: np.dtype[Any], shape: tuple[int, int]) -> bytes:
    """A version 1.0 .npy header of exactly _NPY_HEADER_LEN bytes."""
    fields = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
    body = repr(fields).encode("latin1")
    header_len = _NPY_HEADER_LEN - len(_NPY_MAGIC) - 2
    pad = header_len - len(body) - 1
    if pad < 0:
        raise ValueError(f"shape {shape} does not fit the reserved .npy header")
    return _NPY_MAGIC + struct.pack("<H", header_len) + body + b" " * pad + b"\n"


def _vector_dtype(path: str, column: str, t: pa.DataType) -> tuple[np.dtype[Any], int]:
    if not pa.types.is_fixed_size_list(t) or not (
        pa.types.is_floating(t.value_type) or pa.types.is_integer(t.value_type)
    ):
        raise OutputError(
            path,
            f".npy holds one fixed-size numeric vector per row, but column {column!r} is {t}",
            fix="write .parquet or .jsonl instead",
        )
    return np.dtype(t.value_type.to_pandas_dtype()), t.list_size


class NpyResultWriter(ResultWriter):
    """A 2-D .npy of the vector column, streamed to disk; ids in `{path}.ids.jsonl`, provenance in `{path}.meta.json`."""

    format = "npy"

    def __init__(
        self,
        path: str,
        metadata: Mapping[str, Any] | None = None,
        *,
        schema: pa.Schema | None = None,
        column: str = "embedding",
        id_column: str = "id",
    ) -> None:
        super().__init__(path, metadata)
        if path == STDIN:
            raise OutputError(
                path, ".npy cannot be written to stdout", fix="use -o FILE.npy, or -o - for JSONL"
            )
        check_output_path(path)
        self.column = column
        self.id_column = id_column
        self._dtype: np.dtype[Any] | None = None
        self._dim = 0
        self._has_ids: bool | None = None
        if schema is not None:
            if column not in schema.names:
                raise OutputError(
                    path, f".npy output needs a {column!r} column; the results have {schema.names}"
                )
            self._dtype, self._dim = _vector_dtype(path, column, schema.field(column).type)
            self._has_ids = id_column in schema.names
        self._tmp = temp_path(path)
        self._ids_tmp = temp_path(self.ids_path)
        self._ids_f: IO[bytes] | None = None
        self._f = _open_temp(path, self._tmp)
        self._f.write(b"\0" * _NPY_HEADER_LEN)  # the real header is written at commit, with the row count

    @property
    def ids_path(self) -> str:
        """Return the ids sidecar's path (one JSON string per line, in row order)."""
        return f"{self.path}.ids.jsonl"

    @property
    def sidecar_path(self) -> str:
        """Return the provenance sidecar's path."""
        return f"{self.path}.meta.json"

    def _write(self, table: pa.Table) -> None:
        if self.column not in table.column_names:
            raise ValueError(
                f".npy output needs a {self.column!r} column; the batch has {table.column_names}"
            )
        col = table.column(self.column)
        dtype, dim = _vector_dtype(self.path, self.column, col.type)
        if self._dtype is None:
            self._dtype, self._dim = dtype, dim
        elif (dtype, dim) != (self._dtype, self._dim):
            raise ValueError(f"vectors changed from {self._dtype}[{self._dim}] to {dtype}[{dim}] mid-output")
        for chunk in col.chunks:
            if chunk.null_count:
                raise ValueError(f"{chunk.null_count} null vectors cannot be written to .npy")
            values = chunk.flatten().to_numpy(zero_copy_only=False)
            self._f.write(np.ascontiguousarray(values, dtype=self._dtype).data)
        if self._has_ids is None:
            self._has_ids = self.id_column in table.column_names
        if self._has_ids:
            if self._ids_f is None:
                self._ids_f = _open_temp(self.path, self._ids_tmp)
            ids = table.column(self.id_column).to_pylist()
            self._ids_f.write(
                "".join(json.dumps(str(i), ensure_ascii=False) + "\n" for i in ids).encode("utf-8")
            )

    def _commit(self) -> None:
        dtype = self._dtype if self._dtype is not None else np.dtype(np.float32)
        self._f.seek(0)
        self._f.write(_npy_header(dtype, (self.rows_written, self._dim)))
        _close_synced(self._f)
        if self._has_ids:
            if self._ids_f is None:
                self._ids_f = _open_temp(self.path, self._ids_tmp)
            _close_synced(self._ids_f)
            os.replace(self._ids_tmp, self.ids_path)
        meta = {
            "format": "npy",
            "file": os.path.basename(self.path),
            "rows": self.rows_written,
            "shape": [self.rows_written, self._dim],
            "dtype": str(dtype),
            "column": self.column,
            "ids_file": os.path.basename(self.ids_path) if self._has_ids else None,
            "metadata": self.metadata,
        }
        meta_tmp = _stage_sidecar(self.sidecar_path, meta)
        os.replace(meta_tmp, self.sidecar_path)
        os.replace(self._tmp, self.path)  # the data file last: its appearance is the commit
        _fsync_dir(self.path)

    def _abort(self) -> None:
        for f in (self._f, self._ids_f):
            if f is not None:
                f.close()
        _unlink(self._tmp)
        _unlink(self._ids_tmp)
        _unlink(temp_path(self.sidecar_path))


# --------------------------------------------------------------------------------------------------
# Choosing a writer


def output_format(path: str, fmt: str | None = None) -> str:
    """Return the output format for `path`: `fmt` if given, else by extension (unknown → parquet; `-` → jsonl)."""
    if fmt is not None:
        name = fmt.strip().lower().lstrip(".")
        name = _OUT_ALIASES.get(name, name)
        if name == LINES:
            return name
        if name not in OUTPUT_FORMATS:
            raise ValueError(f"unknown output format {fmt!r}; choose one of: {', '.join(OUTPUT_FORMATS)}")
        if path == STDIN and name != "jsonl":
            raise OutputError(
                path,
                f"{name} cannot be written to stdout",
                fix="-o - writes JSONL; give a file name for other formats",
            )
        return name
    if path == STDIN:
        return "jsonl"
    return _OUT_EXTENSIONS.get(os.path.splitext(path)[1].lower(), "parquet")


def open_writer(
    path: str, schema: pa.Schema, metadata: Mapping[str, Any] | None = None, fmt: str | None = None
) -> ResultWriter:
    """Open the writer for `path` (checked now, before any compute): Parquet, JSONL (`-`: stdout) or .npy."""
    kind = output_format(path, fmt)
    if kind == "parquet":
        return ParquetResultWriter(path, schema, metadata)
    if kind == "jsonl":
        check_output_path(path)
        return JsonlResultWriter(path, metadata)
    if kind == LINES:
        return LinesResultWriter(path, metadata)
    return NpyResultWriter(path, metadata, schema=schema)


# --------------------------------------------------------------------------------------------------
# Vector columns


def embedding_type(dim: int, dtype: Any = np.float32) -> pa.DataType:
    """Return `fixed_size_list<dtype>[dim]` for float32/float16/float64/int8/uint8 vectors."""
    np_dtype = np.dtype(dtype)
    if np_dtype not in _VECTOR_TYPES:
        raise TypeError(
            f"unsupported vector dtype {np_dtype}; use one of {', '.join(map(str, _VECTOR_TYPES))}"
        )
    if dim < 1:
        raise ValueError("vector dimension must be at least 1")
    return pa.list_(_VECTOR_TYPES[np_dtype], dim)


def embedding_array(vectors: np.ndarray) -> pa.FixedSizeListArray:
    """Wrap a 2-D (rows, dim) numpy array as a `fixed_size_list<...>[dim]` array, without Python loops."""
    if vectors.ndim != 2:
        raise ValueError(f"expected a 2-D array (rows, dim), got shape {vectors.shape}")
    typ = embedding_type(vectors.shape[1], vectors.dtype)
    flat = np.ascontiguousarray(vectors).reshape(-1)
    return pa.FixedSizeListArray.from_arrays(pa.array(flat, type=typ.value_type), type=typ)


def embedding_matrix(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Return a `fixed_size_list` column as a 2-D numpy array (rows, dim); the inverse of embedding_array."""
    t = column.type
    if not pa.types.is_fixed_size_list(t):
        raise TypeError(f"expected a fixed_size_list column, got {t}")
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    dtype = np.dtype(t.value_type.to_pandas_dtype())
    parts = [c.flatten().to_numpy(zero_copy_only=False) for c in chunks if len(c)]
    flat = np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
    return flat.reshape(-1, t.list_size).astype(dtype, copy=False)
