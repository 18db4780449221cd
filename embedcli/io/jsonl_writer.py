"""JSON Lines output: one compact object per row, to a file or stdout."""

from __future__ import annotations

import base64
import codecs
import datetime
import decimal
import itertools
import json
import os
import sys
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
from embedcli.io.formats import LINES
from embedcli.io.sidecar import HashingFile, data_identity
from embedcli.io.writer_base import ResultWriter

_JSON_SEPARATORS = (",", ":")


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
    values = to_numpy(flat)
    strs = values.astype(str)
    if pa.types.is_floating(vt) and not np.isfinite(values).all():
        strs[np.isnan(values)] = "NaN"  # what json.dumps writes
        strs[values == np.inf] = "Infinity"
        strs[values == -np.inf] = "-Infinity"
    items = strs.tolist()
    if pa.types.is_fixed_size_list(t):
        d = t.list_size
        return ["[" + ",".join(items[i : i + d]) + "]" for i in range(0, len(items), d)]
    offsets = to_numpy(arr.offsets)
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
        self._meta_tmp: str | None = None
        self._f: HashingFile | None = None
        if path != STDIN:
            check_output_path(path)
            self._tmp, f = open_temp(path)
            self._f = HashingFile(f)

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
        close_synced(self._f.file)
        meta = {
            "format": self.format,
            "file": os.path.basename(self.path),
            "rows": self.rows_written,
            "metadata": self.metadata,
            "data": data_identity(self._tmp, self._f.hexdigest()),
        }
        self._meta_tmp = stage_sidecar(self.sidecar_path, meta)
        # The data first, then the sidecar that names its hash: a kill in between leaves a sidecar that
        # does not match the data, never one that vouches for data it does not describe.
        os.replace(self._tmp, self.path)
        os.replace(self._meta_tmp, self.sidecar_path)
        fsync_parent(self.path)

    def _abort(self) -> None:
        if self._f is None:
            try:
                sys.stdout.flush()
            except OSError:
                pass
            return
        self._f.file.close()
        unlink_quiet(self._tmp)
        unlink_quiet(self._meta_tmp)



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
