"""The lifecycle every store output implements (`Store`), the rows it holds (`StoreSchema`) and how far a run
got (`ResumePoint`).

A run drives a store in this order::

    store = open_store(url)              # connect, take the store's writer lock; nothing is written
    store.metadata()                     # provenance + resume point, as an output file's metadata (or None)
    store.begin(schema, provenance, replace=False)   # create the table, or check the one there
    store.present()                      # (id, key) blocks of the rows there, for --incremental and deletes
    store.write(table, keys) ...; store.delete(ids) ...; store.commit(point)    # repeated
    store.finish(point)                  # the last commit: marks the run complete (and builds an index)
    store.close()                        # always: drops uncommitted rows, releases the lock

A commit makes the rows written and the ids deleted since the last one visible together with the resume
point; a process killed at any moment leaves either the commit before or this one (Postgres: one
transaction), or this commit's rows with the previous resume point (LanceDB: every step is a redo-safe
upsert or delete, so the rerun that resumes from the previous point repairs it). Never a duplicate id,
never a lost row.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import pyarrow as pa

from embedcli.io.manifest import KEY_COMPLETE, KEY_JOB, KEY_RECORDS
from embedcli.io.shards import KEY_TYPE

KEY_COLUMN = "_embedcli_key"
"""The column holding each row's key (BLAKE2b of its id and texts, `embedcli.io.shards.row_keys`)."""
VECTOR_COLUMN = "embedding"
PRECISIONS = ("float32", "float16", "int8", "uint8", "binary", "ubinary")


@dataclass(frozen=True)
class StoreSchema:
    """The rows a run writes: the id type, the vector column (fixed-size list of the model's dims in the
    output precision; `dims` counts bits for the binary precisions) and the kept columns, typed from the input."""

    id_type: pa.DataType
    vector_type: pa.DataType
    precision: str = "float32"
    dims: int = 0
    kept: tuple[pa.Field, ...] = ()
    vector_column: str = VECTOR_COLUMN

    def __post_init__(self) -> None:
        if not pa.types.is_fixed_size_list(self.vector_type):
            raise TypeError(f"a store's vector column is a fixed-size list, not {self.vector_type}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"unknown precision {self.precision!r}; one of {', '.join(PRECISIONS)}")
        if not self.dims:
            object.__setattr__(self, "dims", self.width)
        names = [f.name for f in self.kept]
        for reserved in ("id", self.vector_column, KEY_COLUMN):
            if reserved in names:
                raise ValueError(f"a kept column may not be named {reserved!r}: the store writes its own")
        if len(set(names)) != len(names):
            raise ValueError(f"kept columns repeat a name: {', '.join(names)}")

    @property
    def width(self) -> int:
        """Values per stored vector (bytes for the binary precisions)."""
        return int(self.vector_type.list_size)

    @classmethod
    def of(cls, schema: pa.Schema, precision: str = "float32", dims: int | None = None) -> StoreSchema:
        """The store schema of an output table's Arrow schema (`id`, `embedding`, kept columns...)."""
        vector = schema.field(VECTOR_COLUMN).type
        kept = tuple(
            pa.field(f.name, pa.string() if pa.types.is_null(f.type) else f.type)
            for f in schema
            if f.name not in ("id", VECTOR_COLUMN)
        )
        return cls(schema.field("id").type, vector, precision, dims or 0, kept)

    def arrow(self, metadata: Mapping[str, str] | None = None) -> pa.Schema:
        """The Arrow schema of the stored rows: id (not null), the vector, kept columns, the row key."""
        fields = [
            pa.field("id", self.id_type, nullable=False),
            pa.field(self.vector_column, self.vector_type),
            *self.kept,
            pa.field(KEY_COLUMN, KEY_TYPE, nullable=False),
        ]
        return pa.schema(fields, metadata=dict(metadata) if metadata else None)

    def rows(self, table: pa.Table, keys: np.ndarray) -> pa.Table:
        """`table` (an output batch) with its row keys, in the stored column order and types."""
        from embedcli.io.shards import keys_array

        if len(keys) != table.num_rows:
            raise ValueError(f"{table.num_rows} rows but {len(keys)} row keys")
        schema = self.arrow()
        columns = [table.column(f.name).cast(f.type) for f in schema if f.name != KEY_COLUMN]
        return pa.Table.from_arrays([*columns, keys_array(keys)], schema=schema)


@dataclass(frozen=True)
class ResumePoint:
    """How far the run `job_key` got: the input records it has committed, whether it finished, and the rest of
    its run metadata (input fingerprints, skipped rows... as an output file's metadata keys)."""

    job_key: str | None
    records_done: int = 0
    complete: bool = False
    run: Mapping[str, str] = field(default_factory=dict)

    def metadata(self) -> dict[str, str]:
        """The point as output metadata keys (`embedcli.job_key`, `embedcli.input_records`...)."""
        return {
            **self.run,
            KEY_JOB: self.job_key or "",
            KEY_RECORDS: str(self.records_done),
            KEY_COMPLETE: "true" if self.complete else "false",
        }

    def to_json(self) -> str:
        """The point as one JSON object (what a store records)."""
        return json.dumps(self.metadata(), sort_keys=True)

    @classmethod
    def from_metadata(cls, meta: Mapping[str, str]) -> ResumePoint:
        """The inverse of `metadata`."""
        run = {k: v for k, v in meta.items() if k not in (KEY_JOB, KEY_RECORDS, KEY_COMPLETE)}
        try:
            records = int(meta.get(KEY_RECORDS, "0") or 0)
        except ValueError:
            records = 0
        return cls(meta.get(KEY_JOB) or None, records, meta.get(KEY_COMPLETE) == "true", run)

    @classmethod
    def from_json(cls, text: str | None) -> ResumePoint | None:
        """The inverse of `to_json`; None for nothing or something else."""
        try:
            loaded = json.loads(text) if text else None
        except ValueError:
            return None
        if not isinstance(loaded, dict):
            return None
        return cls.from_metadata({str(k): str(v) for k, v in loaded.items()})


class Store(Protocol):
    """A store output driven through the lifecycle of the module docstring."""

    @property
    def display(self) -> str:
        """The store as shown to people (never with a password)."""
        ...

    def metadata(self) -> dict[str, str] | None:
        """Provenance and resume point as one output-metadata dict; None when the table does not exist."""
        ...

    def resume_point(self) -> ResumePoint | None:
        """The last committed resume point (None: no table, or nothing committed yet)."""
        ...

    def begin(self, schema: StoreSchema, provenance: Mapping[str, str], *, replace: bool = False) -> None:
        """Create the table (`replace`: drop the one there first), or check that the one there takes `schema`
        and was made with `provenance`'s config (UsageError otherwise)."""
        ...

    def present(self, block_rows: int = 65536) -> Iterator[tuple[pa.Array, np.ndarray]]:
        """The (ids, keys) of the committed rows, block by block."""
        ...

    def write(self, table: pa.Table, keys: np.ndarray) -> None:
        """Stage rows to upsert by id at the next commit."""
        ...

    def delete(self, ids: pa.Array) -> None:
        """Stage ids to delete at the next commit."""
        ...

    def commit(self, point: ResumePoint) -> None:
        """Apply the staged upserts and deletes and record `point` (see the module docstring)."""
        ...

    def abort(self) -> None:
        """Drop what was staged since the last commit."""
        ...

    def finish(self, point: ResumePoint) -> None:
        """The last commit of a run (`point.complete` is set here), then whatever the store builds after a load."""
        ...

    def close(self) -> None:
        """Drop uncommitted work, release the writer lock and the connection (idempotent)."""
        ...
