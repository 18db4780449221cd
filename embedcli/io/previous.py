"""Reading a previous output back for `--incremental`: its rows by row key, a row group at a time."""

from __future__ import annotations

import contextlib
import json
import os
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from embedcli.io.arrow_values import read_parquet
from embedcli.io.commit import arrow_source
from embedcli.io.errors import InputError
from embedcli.io.manifest import (
    INDEX_SUFFIX,
    KEY_CONFIG_KEY,
    KEY_INPUT_OPTIONS,
    KEY_OUTPUT,
    Manifest,
    output_metadata,
)
from embedcli.io.shards import KEY_WIDTH, keys_numpy


class PreviousOutput:
    """A finished embedcli output (Parquet file or shard directory) with its row-key index.

    `lookup(keys)` gives the row of each key (-1 when absent); `take(rows, columns)` reads those rows,
    a row group at a time through a small cache, so a corpus in a stable order reads each group once.
    """

    def __init__(
        self,
        path: str,
        metadata: dict[str, str],
        segments: list[tuple[str, int, int]],
        schema: pa.Schema,
        keys: np.ndarray | None,
    ) -> None:
        self.path = path
        self.metadata = metadata
        self.schema = schema
        self._files = [s[0] for s in segments]
        self._groups = [s[1] for s in segments]
        counts = np.asarray([s[2] for s in segments], dtype=np.int64)
        self._starts = np.concatenate([[0], np.cumsum(counts)]) if len(counts) else np.zeros(1, np.int64)
        self.rows = int(self._starts[-1])
        self.keys_ok = keys is not None and len(keys) == self.rows
        if self.keys_ok:
            assert keys is not None
            self._order = np.argsort(keys, kind="stable")
            self._sorted = keys[self._order]
        else:
            self._order = np.zeros(0, np.int64)
            self._sorted = np.zeros(0, f"S{KEY_WIDTH}")
        self._cache: OrderedDict[tuple[int, tuple[str, ...]], pa.Table] = OrderedDict()
        self._files_open: dict[str, pq.ParquetFile] = {}

    @property
    def keep_cols(self) -> list[str]:
        """The kept input columns the previous output carried."""
        try:
            return list(json.loads(self.metadata.get(KEY_INPUT_OPTIONS, "{}")).get("keep_cols") or [])
        except ValueError:
            return []

    @classmethod
    def open(cls, path: str) -> PreviousOutput:
        """Open a previous output; InputError when it is missing or not an embedcli Parquet output."""
        path = os.path.abspath(path.rstrip("/") or path)
        if not os.path.exists(path):
            raise InputError(path, "no such previous output", fix="check --previous, or drop it for a full run")
        meta = output_metadata(path)
        if meta is None:
            raise InputError(
                path,
                "not an embedcli output (no embedcli metadata)",
                fix="point --previous at an output embedcli wrote, or drop --incremental",
            )
        if os.path.isdir(path):
            manifest = Manifest.load(path)
            assert manifest is not None
            segments: list[tuple[str, int, int]] = []
            schema = None
            for s in manifest.shards:
                if not s.file:
                    continue
                f = os.path.join(path, s.file)
                md = pq.ParquetFile(arrow_source(f)).metadata
                schema = schema or pq.read_schema(arrow_source(f))
                segments += [(f, g, md.row_group(g).num_rows) for g in range(md.num_row_groups)]
            keys = None
            if manifest.indexed:
                files = [os.path.join(path, s.index) for s in manifest.shards if s.index]
                keys = np.concatenate([keys_numpy(read_parquet(arrow_source(f)).column("key")) for f in files]) if files else None
            if schema is None:
                return cls(path, meta, [], pa.schema([]), np.zeros(0, f"S{KEY_WIDTH}"))
            return cls(path, meta, segments, schema, keys)
        try:
            pf = pq.ParquetFile(arrow_source(path))
        except (pa.ArrowException, OSError) as e:
            raise InputError(
                path, f"the previous output is not a readable Parquet file: {e}", fix="drop --incremental"
            ) from None
        md = pf.metadata
        segments = [(path, g, md.row_group(g).num_rows) for g in range(md.num_row_groups)]
        keys = None
        sidecar = path + INDEX_SUFFIX
        if os.path.isfile(sidecar):
            try:
                index = read_parquet(arrow_source(sidecar))
                tag = (index.schema.metadata or {}).get(KEY_OUTPUT.encode(), b"").decode()
                if tag and tag == meta.get(KEY_OUTPUT):
                    keys = keys_numpy(index.column("key"))
            except (pa.ArrowException, OSError, KeyError):
                keys = None
        return cls(path, meta, segments, pf.schema_arrow, keys)

    @property
    def config_key(self) -> str | None:
        """The config key the previous output was made with."""
        return self.metadata.get(KEY_CONFIG_KEY)

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """Row of each key in the previous output, -1 where it has none."""
        out = np.full(len(keys), -1, dtype=np.int64)
        if not self.keys_ok or not len(keys) or not len(self._sorted):
            return out
        pos = np.searchsorted(self._sorted, keys)
        pos_c = np.minimum(pos, len(self._sorted) - 1)
        hit = self._sorted[pos_c] == keys
        out[hit] = self._order[pos_c[hit]]
        return out

    def _group(self, seg: int, columns: tuple[str, ...]) -> pa.Table:
        key = (seg, columns)
        table = self._cache.get(key)
        if table is not None:
            self._cache.move_to_end(key)
            return table
        path = self._files[seg]
        pf = self._files_open.get(path)
        if pf is None:
            pf = self._files_open[path] = pq.ParquetFile(arrow_source(path))
        table = pf.read_row_group(self._groups[seg], columns=list(columns))
        self._cache[key] = table
        if len(self._cache) > 4:
            self._cache.popitem(last=False)
        return table

    def take(self, rows: np.ndarray, columns: Sequence[str]) -> pa.Table:
        """Rows `rows` (in that order) of `columns`."""
        cols = tuple(columns)
        rows = np.asarray(rows, dtype=np.int64)
        if not len(rows):
            return self.schema.empty_table().select(list(cols))
        seg = np.searchsorted(self._starts, rows, side="right") - 1
        pieces: list[pa.Table] = []
        positions: list[np.ndarray] = []
        for s in np.unique(seg).tolist():
            where = np.nonzero(seg == s)[0]
            local = rows[where] - self._starts[s]
            pieces.append(self._group(s, cols).take(pa.array(local)))
            positions.append(where)
        table = pa.concat_tables(pieces) if len(pieces) > 1 else pieces[0]
        order = np.concatenate(positions)
        inverse = np.empty_like(order)
        inverse[order] = np.arange(len(order))
        return table.take(pa.array(inverse)).combine_chunks()

    def close(self) -> None:
        """Release open files and the cache."""
        for pf in self._files_open.values():
            with contextlib.suppress(Exception):
                pf.close()
        self._files_open.clear()
        self._cache.clear()

