"""A LanceDB table as an output: `lancedb://DIR/TABLE` (`Store`), and read back for `search` (`LanceVectors`).

Layout: one Lance table with `id`, the vector (fixed-size list of the model's dims in the output precision),
the kept columns and `_embedcli_key` (the row key, in the table so a row and its key change in one commit).
embedcli's provenance is the table's schema metadata, written once when the table is created (a run
with another config is refused; `--overwrite` recreates the table in one commit); the resume point is the
`id` field's metadata (`embedcli.resume`), rewritten by every commit.

Every Lance operation is one atomic commit (a new table version), but a commit here is up to three: the
upsert (`merge_insert` on id), the deletes, then the resume point. Each is redo-safe: a process killed
between them leaves rows that the previous resume point does not count yet, and the rerun, resuming from
that point, upserts the same ids again (no duplicate) and deletes what is still there; a killed
operation itself never becomes visible. Rows are held in memory between commits (`--shard-rows` of them).
A lock file beside the table keeps a second run off it.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from embedcli.errors import OutputError, UsageError
from embedcli.io.manifest import KEY_CONFIG_KEY
from embedcli.io.shards import keys_numpy
from embedcli.io.stores.base import KEY_COLUMN, ResumePoint, StoreSchema
from embedcli.io.stores.url import LanceTarget, parse_lance

RESUME_KEY = "embedcli.resume"
DELETE_CHUNK = 10_000


def _lancedb() -> Any:
    try:
        import lancedb
    except ImportError:
        raise UsageError("lancedb:// outputs need LanceDB: pip install 'embedcli[lancedb]'") from None
    return lancedb


def _decoded(meta: Mapping[bytes, bytes] | None) -> dict[str, str]:
    return {k.decode("utf-8", "replace"): v.decode("utf-8", "replace") for k, v in (meta or {}).items()}


def open_table(db: Any, name: str) -> Any | None:
    """The table `name` of a LanceDB connection, or None when there is none."""
    try:
        return db.open_table(name)
    except (ValueError, FileNotFoundError):
        return None


def table_metadata(table: Any) -> dict[str, str]:
    """A table's embedcli provenance and resume point as one output-metadata dict ({} when embedcli did not make it)."""
    schema = table.schema
    provenance = {k: v for k, v in _decoded(schema.metadata).items() if k.startswith("embedcli.")}
    if KEY_CONFIG_KEY not in provenance:
        return {}
    point = ResumePoint.from_json(_decoded(schema.field("id").metadata).get(RESUME_KEY))
    return {**provenance, **(point.metadata() if point else {})}


class _LockFile:
    """An exclusive, non-blocking flock on `DIR/.TABLE.embedcli-lock`; the kernel drops it when the process dies."""

    def __init__(self, path: str, display: str) -> None:
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            self.fd: int | None = os.open(path, flags, 0o644)
        except OSError as e:
            raise OutputError(display, f"cannot create its lock file {path}: {e.strerror or e}") from None
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.release()
            raise OutputError(
                display, "another embedcli run is writing this table right now",
                fix="wait for it to finish (or stop it), then rerun",
            ) from None

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class LanceStore:
    """See the module docstring."""

    def __init__(self, target: LanceTarget) -> None:
        lancedb = _lancedb()
        self.target = target
        directory = target.directory
        if not os.path.isdir(directory):
            parent = os.path.dirname(directory)
            if not os.path.isdir(parent):
                raise OutputError(self.display, f"no such folder: {parent}", fix=f"mkdir -p {directory}")
            try:
                os.mkdir(directory)
            except FileExistsError:
                pass
            except OSError as e:
                raise OutputError(self.display, f"cannot create {directory}: {e.strerror or e}") from None
        self._lock = _LockFile(os.path.join(directory, f".{target.table}.embedcli-lock"), self.display)
        try:
            self.db = lancedb.connect(directory)
            self.table: Any = open_table(self.db, target.table)
        except BaseException:
            self._lock.release()
            raise
        self.schema: StoreSchema | None = None
        self._arrow: pa.Schema | None = None
        self._pending: list[pa.Table] = []
        self._gone: list[pa.Array] = []

    @property
    def display(self) -> str:
        """The target URL."""
        return self.target.display

    def metadata(self) -> dict[str, str] | None:
        """Provenance and resume point; None when the table does not exist, {} when embedcli did not make it."""
        return None if self.table is None else table_metadata(self.table)

    def resume_point(self) -> ResumePoint | None:
        """The last recorded resume point."""
        if self.table is None:
            return None
        return ResumePoint.from_json(_decoded(self.table.schema.field("id").metadata).get(RESUME_KEY))

    def begin(self, schema: StoreSchema, provenance: Mapping[str, str], *, replace: bool = False) -> None:
        """Create the table with `provenance` in its schema metadata (`replace`: in place of the one there, one
        commit), or check the table there (UsageError for another config, OutputError for other columns)."""
        arrow = schema.arrow({k: v for k, v in provenance.items() if k.startswith("embedcli.")})
        if self.table is not None and not replace:
            self._check_existing(arrow, provenance.get(KEY_CONFIG_KEY, ""))
        else:
            mode = "overwrite" if self.table is not None else "create"
            try:
                self.table = self.db.create_table(self.target.table, schema=arrow, mode=mode)
            except (OSError, ValueError, RuntimeError) as e:
                raise OutputError(self.display, f"cannot create the table: {e}") from None
        self.schema = schema
        self._arrow = schema.arrow()

    def _check_existing(self, arrow: pa.Schema, config: str) -> None:
        existing = table_metadata(self.table)
        if not existing:
            raise UsageError(
                f"{self.display}: the table exists and embedcli did not make it; pass --overwrite to replace it, "
                "or choose another table"
            )
        if existing.get(KEY_CONFIG_KEY) != config:
            raise UsageError(
                f"{self.display} was made with a different config (config key {existing.get(KEY_CONFIG_KEY)} → "
                f"{config}); pass --overwrite to replace it, or choose another table"
            )
        have = self.table.schema
        for f in arrow:
            got = have.field(f.name).type if f.name in have.names else None
            if got is None or not got.equals(f.type):
                raise OutputError(
                    self.display, f"its column {f.name} is {got or 'missing'}, this run writes {f.type}",
                    fix="pass --overwrite to replace the table, or choose another table",
                )

    # -- reading ----------------------------------------------------------------------------------
    def present(self, block_rows: int = 65536) -> Iterator[tuple[pa.Array, np.ndarray]]:
        """(ids, keys) of the rows in the table, block by block."""
        if self.table is None:
            return
        reader = self.table.search().select(["id", KEY_COLUMN]).to_batches(block_rows)
        for batch in reader:
            if batch.num_rows:
                yield batch.column(0), keys_numpy(batch.column(1))

    # -- writing ----------------------------------------------------------------------------------
    def write(self, table: pa.Table, keys: np.ndarray) -> None:
        """Hold rows (with their keys) for the next commit's upsert."""
        if self.schema is None:
            raise RuntimeError("write() before begin()")
        if table.num_rows:
            self._pending.append(self.schema.rows(table, keys))

    def delete(self, ids: pa.Array) -> None:
        """Hold ids for the next commit's delete."""
        if len(ids):
            self._gone.append(ids)

    def _merge(self, rows: pa.Table) -> None:
        (self.table.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(rows))

    def _delete(self, ids: list[Any]) -> None:
        from lancedb.expr import col

        self.table.delete(col("id").isin(ids))

    def _save_point(self, point: ResumePoint) -> None:
        self.table.update_field_metadata({"path": "id", "metadata": {RESUME_KEY: point.to_json()}})

    def _apply(self) -> None:
        if self._pending:
            rows = pa.concat_tables(self._pending).combine_chunks()
            self._merge(rows)
            self._pending.clear()
        if self._gone:
            ids = pa.concat_arrays([a.cast(self._arrow.field("id").type) if self._arrow else a for a in self._gone])
            values = ids.to_pylist()
            for start in range(0, len(values), DELETE_CHUNK):
                self._delete(values[start : start + DELETE_CHUNK])
            self._gone.clear()

    def commit(self, point: ResumePoint) -> None:
        """Upsert the held rows, delete the held ids, then record `point` (each step redo-safe)."""
        if self.table is None or self.schema is None:
            raise RuntimeError("commit() before begin()")
        try:
            self._apply()
            self._save_point(point)
        except (OSError, RuntimeError, ValueError) as e:
            raise OutputError(self.display, f"the commit failed: {e}", fix="rerun: it resumes from the last commit") from None

    def finish(self, point: ResumePoint) -> None:
        """The last commit; then compact the small fragments the commits left, then record `point` (complete)."""
        if self.table is None or self.schema is None:
            raise RuntimeError("finish() before begin()")
        try:
            self._apply()
            self.table.optimize()
            self._save_point(point)
        except (OSError, RuntimeError, ValueError) as e:
            raise OutputError(self.display, f"the last commit failed: {e}", fix="rerun: it resumes from the last commit") from None

    def abort(self) -> None:
        """Drop the held rows and ids."""
        self._pending.clear()
        self._gone.clear()

    def close(self) -> None:
        """Drop what is held and release the lock."""
        self.abort()
        self._lock.release()

    def row_count(self) -> int:
        """Rows in the table (0 when it does not exist)."""
        return 0 if self.table is None else int(self.table.count_rows())


class LanceVectors:
    """A LanceDB table read as `search` reads a vectors file: its metadata, the vector column block by block,
    and rows by their number in that scan. The version is pinned when it opens, so a run writing the table
    meanwhile changes nothing of what this reads."""

    def __init__(self, url: str) -> None:
        target = parse_lance(url)
        lancedb = _lancedb()
        if not os.path.isdir(target.directory):
            raise OutputError(url, f"no such LanceDB folder: {target.directory}")
        table = open_table(lancedb.connect(target.directory), target.table)
        if table is None:
            raise OutputError(url, f"no table {target.table} in {target.directory}")
        table.checkout(table.version)
        self.url = url
        self.table = table
        self.schema: pa.Schema = table.schema
        self.metadata = table_metadata(table)
        self.rows = int(table.count_rows())
        self._row_ids: np.ndarray | None = None

    def blocks(self, columns: list[str], block_rows: int = 8192) -> Iterator[pa.RecordBatch]:
        """`columns` of every row, in blocks of up to `block_rows`, rows numbered from 0 in this order."""
        ids: list[np.ndarray] = []
        query = self.table.search().select(list(columns)).with_row_id(True).to_batches(block_rows)
        for batch in query:
            if not batch.num_rows:
                continue
            ids.append(batch.column("_rowid").to_numpy().astype(np.uint64))
            yield batch.drop_columns(["_rowid"]) if "_rowid" not in columns else batch
        self._row_ids = np.concatenate(ids) if ids else np.zeros(0, np.uint64)

    def take(self, rows: np.ndarray, columns: list[str]) -> pa.Table:
        """`columns` of rows numbered as `blocks` numbered them (after a full pass of `blocks`), in that order."""
        rows = np.asarray(rows, dtype=np.int64)
        if self._row_ids is None:
            for _ in self.blocks(["id"]):
                pass
        assert self._row_ids is not None
        wanted = np.unique(rows)
        if not len(wanted):
            return pa.schema([self.schema.field(c) for c in columns]).empty_table()
        found = self.table.take_row_ids(self._row_ids[wanted].tolist()).select([*columns]).with_row_id().to_arrow()
        order = np.argsort(found.column("_rowid").to_numpy().astype(np.uint64), kind="stable")
        by_id = found.take(pa.array(order)).select(columns)
        sorted_ids = np.sort(self._row_ids[wanted])
        position = np.searchsorted(sorted_ids, self._row_ids[rows])
        return by_id.take(pa.array(position, pa.int64()))

