"""A run into a store (`-o lancedb://DIR/TABLE`, `-o 'postgresql://...?table=NAME'`): the loop's sink is the
store's lifecycle (`embedcli.io.stores.base`), and what the table holds decides what is computed.

- A table made with another config is refused (exit 2, naming the flags that differ) unless `--overwrite`,
  which replaces it; a table this same job completed is left alone (exit 0).
- Each commit of the loop is a store commit with the run's resume point (job key, records done), in the
  same transaction as the rows on Postgres.
- Rows the table holds with the same id and key (id, texts and kept values) are not computed again: under
  `--incremental` (new and changed ids are upserted, ids gone from the input deleted at the end), and when
  the table holds an interrupted run of this same job (the rerun reads the input from the start and computes
  only what no commit of the killed run wrote: no duplicate, no lost row). Any other run replaces the table.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from embedcli.errors import EXIT_OK, EXIT_SKIPPED, InputError, UsageError
from embedcli.io.manifest import KEY_CONFIG_KEY, KEY_ROWS, KEY_SKIPPED
from embedcli.io.shards import RowsOut, keys_numpy, row_keys
from embedcli.io.stores import ResumePoint, Store, StoreSchema, open_store
from embedcli.io.stores.present import PresentRows, store_keys
from embedcli.quantize import METADATA_KEY
from embedcli.run.checks import Work
from embedcli.run.incremental import Carry, describe_config_change
from embedcli.run.source import id_column, kept_columns, subset

if TYPE_CHECKING:  # the pipeline drives this module and is passed in; no import at run time
    from embedcli.run.loop import Pipeline


class StoreCarry(Carry):
    """Splits work items into rows to compute and rows the store holds already (same id and store key): those
    are neither computed nor written. With `present` None every row is computed."""

    def __init__(self, present: PresentRows | None, keep_cols: list[str]) -> None:
        super().__init__(None, keep_cols)
        self.present = present

    def split(self, work: Work) -> None:
        """Keys of the rows read; which to compute (not in the store as they are)."""
        b = work.batch
        if b is None:
            return
        work.keys = row_keys(b.ids, b.texts, b.extra_texts)
        n = len(b)
        unchanged = np.zeros(n, dtype=bool)
        if self.present is not None and n:
            kept = pa.table(kept_columns(b, self.keep_cols)) if self.keep_cols else None
            unchanged = self.present.match(id_column(b), store_keys(work.keys, kept))
        work.compute_idx = np.nonzero(~unchanged)[0]
        work.carry_idx = np.nonzero(unchanged)[0]
        work.carry_rows = np.zeros(len(work.carry_idx), np.int64)  # "in the store": no row of a previous output
        work.compute = subset(b, work.compute_idx) if len(work.compute_idx) else None

    def by_reference(self, batch: Any) -> bool:
        """Rows the store holds stay there: the sink gets them as references (and skips them)."""
        return True


class StoreSink:
    """The loop's sink over a `Store`: rows computed are upserted with their store keys, each loop commit is a
    store commit with the resume point of job `job_key`."""

    def __init__(self, store: Store, job_key: str | None, keep_cols: list[str]) -> None:
        self.store = store
        self.job_key = job_key
        self.keep_cols = keep_cols
        self.errors: list[dict[str, Any]] = []
        self.rows = 0
        self.previous: Any = None

    def write(self, out: RowsOut) -> None:
        """Stage the computed rows of `out` (rows it refers to are in the store already)."""
        table = out.table
        if table is None or table.num_rows == 0:
            return
        if out.index is None:
            raise UsageError("a store output needs one output row per input row; this command does not give that")
        keys = keys_numpy(out.index.column("key"))
        if out.refs is not None:
            keys = keys[out.refs < 0]
        kept = table.select(self.keep_cols) if self.keep_cols else None
        self.store.write(table, store_keys(keys, kept))
        self.rows += table.num_rows

    def delete(self, ids: pa.Array) -> None:
        """Stage ids to delete at the next commit."""
        self.store.delete(ids)

    def add_errors(self, records: list[dict[str, Any]]) -> None:
        """Keep bad rows for `--errors-file`."""
        self.errors.extend(records)

    @property
    def pending_errors(self) -> list[dict[str, Any]]:
        """Bad rows not yet committed (a store keeps none)."""
        return []

    def point(self, records_end: int, complete: bool = False) -> ResumePoint:
        """The resume point after `records_end` input records."""
        run = {KEY_ROWS: str(self.rows), KEY_SKIPPED: str(len(self.errors))}
        return ResumePoint(self.job_key, records_end, complete, run)

    def commit(self, records_end: int, end: Any = None, units: str | None = None) -> None:
        """One store commit: the rows and deletes staged since the last, with the resume point."""
        self.store.commit(self.point(records_end))

    def abort(self) -> None:
        """Drop what was staged since the last commit."""
        self.store.abort()

    def finish(self, records_end: int) -> None:
        """The last commit, marking the run complete."""
        self.store.finish(self.point(records_end, complete=True))


def _first_types(p: Pipeline) -> dict[str, pa.DataType]:
    """The id and kept columns' types as the first rows give them (JSONL: integers are int64, as a file output
    types them), read once more here; nothing for an input read only once (stdin, a pipe) or a bad first row."""
    source = p.source
    if source is None or p.fingerprints is None:
        return {}
    reader = source.open(p.paths, batch_rows=256, on_bad_row=lambda _: None)
    try:
        batch = next(reader, None)
    except (InputError, OSError, pa.ArrowException):
        return {}  # the loop reports it, with its row
    finally:
        close = getattr(reader, "close", None)
        if close is not None:
            close()
    if batch is None or not len(batch):
        return {}
    columns = {"id": id_column(batch), **kept_columns(batch, source.inputs.keep_cols)}
    return {name: a.type for name, a in columns.items() if not pa.types.is_null(a.type)}


def store_schema(p: Pipeline) -> StoreSchema:
    """The rows the job writes into a store: its empty output's columns (typed as its first rows type them), in
    the output precision."""
    empty = p.empty_output().schema
    for name, typ in _first_types(p).items():
        if name in empty.names:
            empty = empty.set(empty.get_field_index(name), pa.field(name, typ))
    if "embedding" not in empty.names or not pa.types.is_fixed_size_list(empty.field("embedding").type):
        raise UsageError(f"-o {p.output.path}: a store takes embed's vectors; write this command's rows to a file")
    quant = p.meta.get(METADATA_KEY)
    precision = str(json.loads(quant).get("precision", "float32")) if quant else "float32"
    width = empty.field("embedding").type.list_size
    dims = width * 8 if precision in ("binary", "ubinary") else width
    return StoreSchema.of(empty, precision, dims)


def _refuse_other(p: Pipeline, store: Store, existing: dict[str, str]) -> None:
    """UsageError (exit 2) for a table embedcli did not make, or made with another config."""
    if not existing:
        raise UsageError(f"{store.display}: the table exists and embedcli did not make it; pass --overwrite to "
                         "replace it, or choose another table")
    if existing.get(KEY_CONFIG_KEY) != p.cfg_key:
        raise UsageError(
            f"{store.display} was made with a different config ({describe_config_change(existing, p.base_meta)}); "
            "pass --overwrite to replace it, or choose another table"
        )


def run_store(p: Pipeline) -> int:
    """Run pipeline `p` into its store (see the module docstring); returns the exit code."""
    schema = store_schema(p)  # a command whose rows a store cannot take is refused before the store is opened
    store = open_store(p.output.path)
    try:
        return _run(p, store, schema)
    finally:
        store.close()


def _run(p: Pipeline, store: Store, schema: StoreSchema) -> int:
    flags, report = p.flags, p.report
    existing = store.metadata()
    point = store.resume_point() if existing is not None else None
    if existing is not None and not flags.overwrite:
        _refuse_other(p, store, existing)
        if point is not None and p.job_key and point.job_key == p.job_key and point.complete:
            rows = point.run.get(KEY_ROWS, "?")
            p.note(f"{store.display} is already complete ({rows} rows written, same inputs and config): nothing to do")
            report.records_done = report.resumed_records = point.records_done
            return EXIT_OK
    resuming = (existing is not None and not flags.overwrite and point is not None and bool(p.job_key)
                and point.job_key == p.job_key and point.records_done > 0)
    keep = existing is not None and not flags.overwrite and (flags.incremental or resuming)
    p.start_engine()
    store.begin(schema, p.base_meta, replace=existing is not None and not keep)
    present = PresentRows(store.present(), schema.id_type) if keep else None
    if resuming and point is not None:
        p.note(f"resuming: {point.records_done:,} input rows committed to {store.display}; "
               "rows the table holds are not computed again")
    elif flags.incremental and present is None:
        p.note(f"--incremental: {store.display} has no rows of this config yet, computing every row")
    sink = StoreSink(store, p.job_key, list(p.carry.keep_cols))
    p.carry = StoreCarry(present, list(p.carry.keep_cols))
    p.guarded_loop(sink, None, 0, errors=lambda: sink.errors)
    if present is not None:
        gone = present.gone()
        if len(gone):
            p.note(f"deleting {len(gone):,} rows whose ids the input no longer has")
        sink.delete(gone)
    sink.finish(report.records_done)
    skipped = len(sink.errors)
    report.rows, report.skipped = sink.rows, skipped
    report.summary(p.job.engine, skipped, sink.rows, flags.errors_file)
    return EXIT_SKIPPED if skipped else EXIT_OK
