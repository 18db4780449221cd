"""One shard's files, written where the rows are computed: a worker of the Ray Data engine writes its slice's
rows, row keys and bad rows here, and the run's driver commits them by naming them in the manifest
(`ShardStore.adopt`). This is the one place a worker writes an output; an object store goes here later.

Files (in the staging directory `root`, each written to a fresh temp name and renamed into place, so a
retried slice replaces its own files whole):

    slice-NNNNNN.parquet                   the rows (the run's Parquet settings and metadata)
    _embedcli/slice-NNNNNN.index.parquet   their row index (`INDEX_SCHEMA`: row keys, id hashes, blocks)
    _embedcli/slice-NNNNNN.errors.jsonl    the slice's bad rows
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from embedcli.io.commit import write_atomic
from embedcli.io.manifest import META_DIR
from embedcli.io.shards import INDEX_SCHEMA, PartFile, WrittenShard, conform_table, index_bytes, rewrite_part


def slice_names(number: int) -> tuple[str, str, str]:
    """(data, index, errors) file names of slice `number`, relative to the staging directory."""
    stem = f"slice-{number:06d}"
    return f"{stem}.parquet", f"{META_DIR}/{stem}.index.parquet", f"{META_DIR}/{stem}.errors.jsonl"


class ShardWriter:
    """Writes one slice's rows, row keys and bad rows under `root` (see the module docstring)."""

    def __init__(self, root: str, number: int, meta: Mapping[str, str]) -> None:
        self.root = root
        self.names = slice_names(number)
        self.meta = dict(meta)
        self.schema: pa.Schema | None = None
        self._part: PartFile | None = None
        self._index: list[pa.Table] = []
        self._errors: list[dict[str, Any]] = []
        self.rows = 0
        self.indexed = True

    def write(self, table: pa.Table, index: pa.Table | None) -> None:
        """Append rows (and their row index, or None when rows are not one per input record)."""
        table = conform_table(table, self.schema)
        if self.schema is None:
            self.schema = table.schema.remove_metadata()
        if self._part is None:
            self._part = PartFile(os.path.join(self.root, self.names[0]), self.schema, self.meta)
        self._part.write(table)
        self.rows += table.num_rows
        if index is None:
            self.indexed = False
        elif self.indexed:
            self._index.append(index)

    def add_errors(self, records: Iterable[dict[str, Any]]) -> None:
        """Bad rows of the slice."""
        self._errors.extend(records)

    def finish(self) -> WrittenShard:
        """Close and rename the slice's files into place."""
        data, index, errors = self.names
        written_data = written_index = written_errors = None
        if self._part is not None:
            self._part.publish()
            self._part = None
            written_data = data
        if self.indexed and self.rows:
            index_table = pa.concat_tables(self._index) if self._index else INDEX_SCHEMA.empty_table()
            if index_table.num_rows == self.rows:
                write_atomic(os.path.join(self.root, index), index_bytes(index_table))
                written_index = index
            else:
                self.indexed = False
        if self._errors:
            lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in self._errors)
            write_atomic(os.path.join(self.root, errors), lines.encode("utf-8"))
            written_errors = errors
        return WrittenShard(written_data, written_index, written_errors, self.rows, len(self._errors), self.indexed)

    def abort(self) -> None:
        """Drop what was written (the slice is recomputed by a later run)."""
        if self._part is not None:
            self._part.discard()
        self._part = None


def _unmarked(index: pa.Table, dropped: np.ndarray) -> pa.Table:
    """`index` without the marks of the blocks that lose rows `dropped`: a block is marked (its identity and rows,
    on its first row) only when every record of it became a row, and a later rerun carries a marked block over
    as that many rows."""
    if "block_rows" not in index.column_names or not len(dropped):
        return index
    sizes = np.asarray(index.column("block_rows").fill_null(0).to_numpy(), np.int64)
    starts = np.flatnonzero(sizes > 0)
    if not len(starts):
        return index
    ends = starts + sizes[starts]
    at = np.searchsorted(starts, dropped, side="right") - 1
    hit = at[(at >= 0) & (dropped < ends[np.maximum(at, 0)])]
    if not len(hit):
        return index
    import pyarrow.compute as pc  # here: a run's start imports no pyarrow.compute (tests/test_start_lean.py)

    clear = np.zeros(index.num_rows, dtype=bool)
    clear[starts[hit]] = True
    mask = pa.array(clear)
    for name in ("block", "block_rows"):
        column = index.column(name)
        index = index.set_column(index.schema.get_field_index(name), name,
                                 pc.if_else(mask, pa.scalar(None, column.type), column))
    return index


def drop_rows(
    root: str, number: int, written: WrittenShard, rows: np.ndarray, records: list[dict[str, Any]],
    order: Callable[[list[dict[str, Any]]], list[int]] | None = None,
) -> WrittenShard:
    """Slice `number`'s `written` files without rows `rows` (positions), `records` added to its bad rows: a slice whose
    rows repeat ids that an earlier slice committed (`--on-error skip`). Each file is rewritten whole; `order`
    gives the order of all its bad rows (those it had, then `records`), else `records` go last."""
    keep = np.ones(written.rows, dtype=bool)
    keep[rows] = False
    take = pa.array(np.flatnonzero(keep))
    data, index, errors = written.file, written.index, written.errors_file
    if data is not None:
        path = os.path.join(root, data)
        pf = pq.ParquetFile(path)
        schema = pf.schema_arrow
        table = pf.read().take(take)
        pf.close()
        rewrite_part(path, table, schema)
    if index is not None:
        path = os.path.join(root, index)
        write_atomic(path, index_bytes(_unmarked(pq.read_table(path), rows).take(take)))
    if records:
        errors = errors or slice_names(number)[2]
        path = os.path.join(root, errors)
        lines: list[bytes] = []
        if written.errors_file is not None:
            with open(path, "rb") as f:
                lines = [line for line in f if line.strip()]
        lines += [(json.dumps(r, ensure_ascii=False) + "\n").encode("utf-8") for r in records]
        if order is not None:
            ranks = order([json.loads(line) for line in lines])
            lines = [lines[k] for k in ranks]
        write_atomic(path, b"".join(lines))
    return WrittenShard(data, index, errors, int(keep.sum()), written.errors + len(records), written.indexed)
