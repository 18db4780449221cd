"""`.npy` output: the vector column as one 2-D array, with ids and provenance beside it."""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from embedcli.io.arrow_values import to_numpy
from embedcli.io.commit import (
    check_output_path,
    close_synced,
    fsync_parent,
    open_temp,
    stage_sidecar,
    unlink_quiet,
)
from embedcli.io.errors import STDIN, OutputError
from embedcli.io.sidecar import HashingFile, data_identity
from embedcli.io.writer_base import ResultWriter

_NPY_MAGIC = b"\x93NUMPY\x01\x00"
_NPY_HEADER_LEN = 128  # room for shape (10**19, 10**10); a multiple of 64 as the format asks


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
            dropped = [name for name in schema.names if name not in (column, id_column)]
            if dropped:  # never left out at exit 0 (e.g. the kept columns of shards merged into a .npy)
                raise OutputError(
                    path,
                    f".npy holds the {column!r} vectors and the ids only, not {', '.join(repr(c) for c in dropped)}",
                    fix="write .parquet or .jsonl instead",
                )
        self._ids_tmp: str | None = None
        self._meta_tmp: str | None = None
        self._ids_f: HashingFile | None = None
        self._tmp, f = open_temp(path)
        self._f = HashingFile(f, skip=_NPY_HEADER_LEN)  # the header is not hashed: it is rewritten at commit
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
            values = to_numpy(chunk.flatten())
            self._f.write(np.ascontiguousarray(values, dtype=self._dtype).data)
        if self._has_ids is None:
            self._has_ids = self.id_column in table.column_names
        if self._has_ids:
            if self._ids_f is None:
                self._open_ids()
            assert self._ids_f is not None
            ids = table.column(self.id_column).to_pylist()
            self._ids_f.write(
                "".join(json.dumps(str(i), ensure_ascii=False) + "\n" for i in ids).encode("utf-8")
            )

    def _open_ids(self) -> None:
        self._ids_tmp, f = open_temp(self.ids_path)
        self._ids_f = HashingFile(f)

    def _commit(self) -> None:
        dtype = self._dtype if self._dtype is not None else np.dtype(np.float32)
        self._f.file.seek(0)
        self._f.file.write(_npy_header(dtype, (self.rows_written, self._dim)))
        close_synced(self._f.file)
        meta = {
            "format": "npy",
            "file": os.path.basename(self.path),
            "rows": self.rows_written,
            "shape": [self.rows_written, self._dim],
            "dtype": str(dtype),
            "column": self.column,
            "ids_file": os.path.basename(self.ids_path) if self._has_ids else None,
            "metadata": self.metadata,
            "data": data_identity(self._tmp, self._f.hexdigest(), _NPY_HEADER_LEN),
        }
        if self._has_ids:
            if self._ids_f is None:
                self._open_ids()
            assert self._ids_f is not None and self._ids_tmp is not None
            close_synced(self._ids_f.file)
            meta["ids"] = data_identity(self._ids_tmp, self._ids_f.hexdigest())
        self._meta_tmp = stage_sidecar(self.sidecar_path, meta)
        # Ids and data first, then the sidecar that names their hashes (see embedcli.io.sidecar).
        if self._has_ids:
            assert self._ids_tmp is not None
            os.replace(self._ids_tmp, self.ids_path)
        os.replace(self._tmp, self.path)
        os.replace(self._meta_tmp, self.sidecar_path)
        fsync_parent(self.path)

    def _abort(self) -> None:
        for f in (self._f, self._ids_f):
            if f is not None:
                f.file.close()
        unlink_quiet(self._tmp)
        unlink_quiet(self._ids_tmp)
        unlink_quiet(self._meta_tmp)

