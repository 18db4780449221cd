"""Reading a previous output back for `--incremental`: its rows by row key, its row index by row, and the
blocks, files and row groups it can give back whole (`embedcli.io.positions`, `embedcli.io.units`)."""

from __future__ import annotations

import contextlib
import json
import os
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from embedcli.io.arrow_values import arrow_array, to_numpy, valid_mask
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
from embedcli.io.positions import LOC_SHIFT
from embedcli.io.shards import INDEX_COLUMNS, INDEX_SCHEMA, KEY_WIDTH, conform_index, keys_numpy
from embedcli.io.units import KEY_UNITS, InputUnits


def _index_group(pf: pq.ParquetFile, g: int, columns: Sequence[str]) -> pa.Table:
    """`columns` of row group `g` of a row index file; a column an index shard of an older embedcli lacks
    (`line`, left by a resume across versions) is null."""
    names = pf.schema_arrow.names
    return conform_index(pf.read_row_group(g, columns=[c for c in columns if c in names]),
                         pa.schema([INDEX_SCHEMA.field(c) for c in columns]))


class _Segments:
    """Rows of a sequence of Parquet files read by global row, a row group at a time (a small cache)."""

    def __init__(self, files: Sequence[str], index: bool = False) -> None:
        self.files = list(files)
        self.is_index = index  # row index files (`_index_group`)
        self.groups: list[tuple[int, int]] = []  # (file index, row group)
        counts = []
        self._open: dict[int, pq.ParquetFile] = {}
        for i, f in enumerate(self.files):
            md = pq.ParquetFile(arrow_source(f)).metadata
            for g in range(md.num_row_groups):
                self.groups.append((i, g))
                counts.append(md.row_group(g).num_rows)
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64) if counts else np.zeros(1, np.int64)
        self.rows = int(self.starts[-1])
        self._cache: OrderedDict[tuple[int, tuple[str, ...]], pa.Table] = OrderedDict()

    def group(self, seg: int, columns: tuple[str, ...]) -> pa.Table:
        key = (seg, columns)
        table = self._cache.get(key)
        if table is not None:
            self._cache.move_to_end(key)
            return table
        i, g = self.groups[seg]
        pf = self._open.get(i)
        if pf is None:
            pf = self._open[i] = pq.ParquetFile(arrow_source(self.files[i]))
        table = _index_group(pf, g, columns) if self.is_index else pf.read_row_group(g, columns=list(columns))
        self._cache[key] = table
        if len(self._cache) > 4:
            self._cache.popitem(last=False)
        return table

    def take(self, rows: np.ndarray, columns: Sequence[str]) -> pa.Table:
        """Rows `rows` (in that order, any order) of `columns`; runs of consecutive rows are sliced, not
        gathered."""
        cols = tuple(columns)
        rows = np.asarray(rows, dtype=np.int64)
        seg = np.searchsorted(self.starts, rows, side="right") - 1
        # runs of rows in one row group: a rerun whose lines moved takes rows back and forth between groups
        bounds = np.flatnonzero(seg[1:] != seg[:-1]) + 1
        pieces: list[pa.Table] = []
        for i, j in zip([0, *bounds.tolist()], [*bounds.tolist(), len(rows)], strict=True):
            if i == j:
                continue
            s = int(seg[i])
            local = rows[i:j] - self.starts[s]
            table = self.group(s, cols)
            if len(local) and int(local[-1]) - int(local[0]) == len(local) - 1 and bool(np.all(np.diff(local) == 1)):
                pieces.append(table.slice(int(local[0]), len(local)))
            else:
                pieces.append(table.take(arrow_array(local)))
        return pa.concat_tables(pieces).combine_chunks() if len(pieces) != 1 else pieces[0].combine_chunks()

    def slice(self, start: int, stop: int, columns: Sequence[str]) -> pa.Table:
        """Rows `[start, stop)` of `columns`."""
        cols = tuple(columns)
        first = int(np.searchsorted(self.starts, start, side="right")) - 1
        pieces = []
        seg = first
        while start < stop:
            lo = int(self.starts[seg])
            n = min(stop, int(self.starts[seg + 1])) - start
            pieces.append(self.group(seg, cols).slice(start - lo, n))
            start += n
            seg += 1
        if not pieces:
            return self.group(max(first, 0), cols).slice(0, 0) if self.groups else pa.table({})
        return pieces[0] if len(pieces) == 1 else pa.concat_tables(pieces).combine_chunks()

    def close(self) -> None:
        for pf in self._open.values():
            with contextlib.suppress(Exception):
                pf.close()
        self._open.clear()
        self._cache.clear()


class PreviousOutput:
    """A finished embedcli output (Parquet file or shard directory) with its row index.

    `lookup(keys)` gives the row of each row key (-1 when absent); `take(rows, columns)` reads rows; `index(
    start, stop)` its row index's columns for rows `[start, stop)`; `blocks` and `units` what it can give
    back whole, by identity."""

    def __init__(
        self,
        path: str,
        metadata: dict[str, str],
        data_files: list[str],
        schema: pa.Schema,
        index_files: list[str] | None,
        units: InputUnits,
    ) -> None:
        self.path = path
        self.metadata = metadata
        self.schema = schema
        self.data = _Segments(data_files)
        self.rows = self.data.rows
        self.units = units
        self.index: _Segments | None = None
        keys = None
        if index_files:
            try:
                self.index = _Segments(index_files, index=True)
                keys = self._keys()
            except (pa.ArrowException, OSError, KeyError):
                self.index, keys = None, None
        self.keys_ok = keys is not None and len(keys) == self.rows
        self.keys = keys if self.keys_ok and keys is not None else np.zeros(0, f"S{KEY_WIDTH}")
        prefix = self.keys.view(np.uint8).reshape(-1, KEY_WIDTH)[:, :8].copy().view("<u8").reshape(-1)
        self._order = np.argsort(prefix, kind="stable")
        self._prefix = prefix[self._order]
        self.columns: set[str] = set()
        self._ids: tuple[np.ndarray, np.ndarray] | None = None
        self._lines: tuple[np.ndarray, np.ndarray] | None = None
        if self.index is not None and self.index.files:
            self.columns = set(pq.read_schema(arrow_source(self.index.files[0])).names)

    def _batches(self, columns: list[str]) -> Iterator[pa.RecordBatch]:
        """The row index's `columns`, a batch at a time (never a whole column of a big index at once)."""
        assert self.index is not None
        for f in self.index.files:
            with pq.ParquetFile(arrow_source(f)) as pf:
                if all(c in pf.schema_arrow.names for c in columns):
                    yield from pf.iter_batches(batch_size=1 << 16, columns=columns)
                else:
                    for g in range(pf.metadata.num_row_groups):
                        yield from _index_group(pf, g, columns).combine_chunks().to_batches()

    def _keys(self) -> np.ndarray:
        """Every row key, in row order (`S16`)."""
        assert self.index is not None
        keys = np.empty(self.index.rows, dtype=f"S{KEY_WIDTH}")
        at = 0
        for rb in self._batches(["key"]):
            part = keys_numpy(rb.column(0))
            keys[at : at + len(part)] = part
            at += len(part)
        return keys[:at]

    @property
    def keep_cols(self) -> list[str]:
        """The kept input columns the previous output carried."""
        try:
            return list(json.loads(self.metadata.get(KEY_INPUT_OPTIONS, "{}")).get("keep_cols") or [])
        except ValueError:
            return []

    @property
    def config_key(self) -> str | None:
        """The config key the previous output was made with."""
        return self.metadata.get(KEY_CONFIG_KEY)

    @property
    def output_key(self) -> str | None:
        """The content key the previous output was published with."""
        return self.metadata.get(KEY_OUTPUT)

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
            files = [os.path.join(path, s.file) for s in manifest.shards if s.file]
            schema = pq.read_schema(arrow_source(files[0])) if files else pa.schema([])
            index = [os.path.join(path, s.index) for s in manifest.shards if s.index] if manifest.indexed else None
            return cls(path, meta, files, schema, index, InputUnits.from_json(manifest.units))
        try:
            pf = pq.ParquetFile(arrow_source(path))
        except (pa.ArrowException, OSError) as e:
            raise InputError(
                path, f"the previous output is not a readable Parquet file: {e}", fix="drop --incremental"
            ) from None
        schema = pf.schema_arrow
        pf.close()
        sidecar = path + INDEX_SUFFIX
        index, units = None, InputUnits()
        if os.path.isfile(sidecar):
            try:
                md = pq.read_schema(arrow_source(sidecar)).metadata or {}
                tag = md.get(KEY_OUTPUT.encode(), b"").decode()
                if tag and tag == meta.get(KEY_OUTPUT):
                    index = [sidecar]
                    units = InputUnits.from_json(md.get(KEY_UNITS.encode(), b"").decode() or None)
            except (pa.ArrowException, OSError):
                index = None
        return cls(path, meta, [path], schema, index, units)

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """Row of each key in the previous output, -1 where it has none."""
        out = np.full(len(keys), -1, dtype=np.int64)
        if not self.keys_ok or not len(keys) or not len(self._prefix):
            return out
        keys = np.ascontiguousarray(keys, dtype=f"S{KEY_WIDTH}")
        q = keys.view(np.uint8).reshape(-1, KEY_WIDTH)[:, :8].copy().view("<u8").reshape(-1)
        pos = np.minimum(np.searchsorted(self._prefix, q), len(self._prefix) - 1)
        cand = self._order[pos]
        hit = (self._prefix[pos] == q) & (self.keys[cand] == keys)
        out[hit] = cand[hit]
        for i in np.nonzero((self._prefix[pos] == q) & ~hit)[0]:  # a shared 8-byte prefix (about never): look on
            j = int(pos[i])
            while j < len(self._prefix) and self._prefix[j] == q[i]:
                if self.keys[self._order[j]] == keys[i]:
                    out[i] = self._order[j]
                    break
                j += 1
        return out

    def take(self, rows: np.ndarray, columns: Sequence[str]) -> pa.Table:
        """Rows `rows` (in that order) of `columns`."""
        rows = np.asarray(rows, dtype=np.int64)
        if not len(rows):
            return self.schema.empty_table().select(list(columns))
        return self.data.take(rows, columns)

    def index_rows(self, start: int, stop: int) -> pa.Table:
        """The row index (INDEX_COLUMNS that it has) of rows `[start, stop)`."""
        assert self.index is not None
        columns = [c for c in INDEX_COLUMNS if c in self.columns]
        return self.index.slice(start, stop, columns)

    def index_take(self, rows: np.ndarray) -> pa.Table:
        """The row index (INDEX_COLUMNS that it has) of rows `rows`, in that order."""
        assert self.index is not None
        columns = [c for c in INDEX_COLUMNS if c in self.columns]
        if not len(rows):
            return self.index.slice(0, 0, columns)
        return self.index.take(np.asarray(rows, np.int64), columns)

    def id_rows(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """The id hashes and packed locations (the row index's `idh`, `loc`) of rows `[start, stop)`."""
        if self._ids is None:  # read once, on the first rows given back unread: 16 bytes a row
            idh = np.empty(self.rows, np.int64)
            loc = np.empty(self.rows, np.int64)
            at = 0
            for rb in self._batches(["idh", "loc"]):
                n = rb.num_rows
                idh[at : at + n] = to_numpy(rb.column(0))
                loc[at : at + n] = to_numpy(rb.column(1))
                at += n
            self._ids = (idh[:at], loc[:at])
        return self._ids[0][start:stop], self._ids[1][start:stop]

    def has_ids(self) -> bool:
        """Whether the row index has the id hashes and locations a run needs to carry rows over unread."""
        return self.index is not None and self.keys_ok and {"idh", "loc", "block", "block_rows"} <= self.columns

    def has_lines(self) -> bool:
        """Whether the row index has its text rows' line identities (carried over line by line)."""
        return self.has_ids() and "line" in self.columns

    def line_rows(self, lines: np.ndarray, numbers: np.ndarray) -> np.ndarray:
        """Per line identity (of a text file's lines `numbers`): the row the previous output has for that line
        (the same identity and line number), or -1."""
        if self._lines is None:  # read once, on the first block that changed: 16 bytes a row
            ids = np.zeros(self.rows, np.int64)
            at = 0
            for rb in self._batches(["line"]):
                column = rb.column(0)
                n = len(column)
                if column.null_count < n:
                    values = np.frombuffer(column.buffers()[1], np.int64)[column.offset : column.offset + n]
                    ids[at : at + n] = np.where(valid_mask(column), values, 0)
                at += n
            order = np.argsort(ids[:at], kind="stable")
            self._lines = (ids[order], order)
        values, order = self._lines
        out = np.full(len(lines), -1, np.int64)
        if not len(values) or not len(lines):
            return out
        loc = self.id_rows(0, self.rows)[1]
        mask = (1 << LOC_SHIFT) - 1
        lo = np.searchsorted(values, lines, side="left")
        hi = np.searchsorted(values, lines, side="right")
        first = order[np.minimum(lo, len(order) - 1)]
        hit = (hi > lo) & ((loc[first] & mask) == numbers)
        out[hit] = first[hit]
        for k in np.nonzero(~hit & (hi - lo > 1))[0].tolist():  # the same line at other numbers (a repeated text)
            for j in range(int(lo[k]) + 1, int(hi[k])):
                row = int(order[j])
                if int(loc[row]) & mask == int(numbers[k]):
                    out[k] = row
                    break
        return out

    def blocks(self) -> dict[bytes, tuple[int, int]]:
        """Block identity -> (first row, rows) of every block the previous output has whole."""
        if not self.has_ids():
            return {}
        out: dict[bytes, tuple[int, int]] = {}
        at = 0
        for rb in self._batches(["block", "block_rows"]):
            ident, rows = rb.column(0), rb.column(1)
            # to_numpy, not np.asarray: pyarrow's own conversion imports pandas (0.25-0.5 s)
            where = np.nonzero(valid_mask(ident))[0]
            if len(where):
                marks = ident.take(arrow_array(where)).to_pylist()
                counts = to_numpy(rows.take(arrow_array(where))).tolist()
                for i, r, c in zip(marks, (where + at).tolist(), counts, strict=True):
                    out[i] = (r, c)
            at += rb.num_rows
        return out

    def unit_map(self) -> dict[bytes, tuple[int, int, Any]]:
        """File and row-group identity -> (first row, rows, readers' state after it) of what it has whole."""
        return self.units.carry_map() if self.has_ids() else {}

    def close(self) -> None:
        """Release open files and the caches."""
        self.data.close()
        if self.index is not None:
            self.index.close()
