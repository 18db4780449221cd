"""The run loop of an engine that does whole slices where its workers are (`SliceEngine`: the Ray Data engine).

The driver plans and commits; it reads no row and computes nothing. `run_sliced(pipeline, sink, start,
records, ids)` takes the place of the local loop inside the same staging, resume and output checks
(`embedcli.run.staging`):

1. **Plan** the inputs into slices (`embedcli.run.slices`), from the read point where the manifest's last
   shard ends when the run resumes (the local engine's and this one's record the same `ReadPoint`s).
2. **Hand** them to the engine with a `SliceWork`: each worker reads, checks, computes and writes its slice's
   shard files into the staging directory (`-o -`: sends the rows back).
3. **Commit** the results in plan order as they arrive: a result is adopted as the next shard and the manifest
   rewritten (the commit), so what is committed is always a prefix of the inputs and a rerun resumes after it.
   Each shard records where its slice's reading ended (the worker's last `ReadPoint`, with the readers'
   state there) and the run's `InputUnits`, as the local loop's commits do.
   Here the checks that span slices happen, as the local loop has them (the run's `IdSet`, with the ids of
   the rows committed before a resume): an id repeated from an earlier slice
   (`--on-error fail`: the run stops there; `skip`: the row is dropped and recorded), `--max-errors`, the
   first bad row of a slice under `--on-error fail` (the slices before it are committed, then the run
   stops with that row's error). A signal stops the run after the slices committed so far (exit 130).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from embedcli.errors import InputError, TooManyErrors, UsageError, display_path
from embedcli.io.positions import BLOCK_LINES, LOC_SHIFT, ReadPoint
from embedcli.io.readers import detect_format
from embedcli.io.shard_files import drop_rows
from embedcli.io.shards import RowsOut, ShardStore
from embedcli.run.checks import LOCATED
from embedcli.run.grid import grid_of
from embedcli.run.ids import IdSet
from embedcli.run.incremental import Carry
from embedcli.run.job import Sink, SliceEngine
from embedcli.run.report import RunReport
from embedcli.run.signals import StopFlag, StopNow
from embedcli.run.slice_work import SliceResult, SliceWork, rebuilt
from embedcli.run.slices import InputSlice, first_batch, plan_slices, sliceable
from embedcli.run.source import BatchSource

if TYPE_CHECKING:  # the pipeline drives this module and is passed in; no import at run time
    from embedcli.run.loop import Pipeline

DUPLICATE_FIX = "give every row a unique id (or pass --on-error skip to keep the first and skip the rest)"


class SlicedRun:
    """One sliced run of `pipeline` into `sink` (see the module docstring)."""

    def __init__(self, p: Pipeline, sink: Sink, start: ReadPoint | None, records: int, ids: IdSet,
                 chars: int | None) -> None:
        self.p = p
        self.chars = chars
        engine = p.job.engine
        assert isinstance(engine, SliceEngine)  # the loop hands a run here for its engine
        self.engine = engine
        self.sink = sink
        self.store = sink if isinstance(sink, ShardStore) else None
        self.report: RunReport = p.report
        self.flags = p.flags
        self.start = start
        self.records = records
        self.ids = ids
        self.pointed = False  # the plan cuts the inputs at read points (recorded as each shard's end)
        self.errors_before = p.manifest.errors if p.manifest is not None else 0
        source = p.job.source
        if not isinstance(source, BatchSource):
            raise UsageError("--engine ray reads its inputs on the workers: it needs input files")
        self.source = source
        self.paths: list[str] = list(p.paths or source.paths())
        self._group_ends: dict[int, np.ndarray] = {}  # a Parquet input's row-group ends, read once (`_group_of`)
        self.cuts: dict[int, list[int]] = {}  # where the workers end a batch: the run's cuts (`plan`)
        self._files: dict[str, int] | None = None  # each input's shown name -> its index (`_input_order`)
        if "-" in self.paths:
            raise UsageError("--engine ray reads its inputs on the workers, which cannot read this process's stdin: "
                             "write it to a file first (or drop --engine ray)")

    def plan(self) -> list[InputSlice]:
        """The slices still to do (from where the committed ones end)."""
        source, paths, begin = self.source, self.paths, self.start
        batch_rows = min(source.inputs.batch_rows, self.flags.shard_rows)
        block = min(BLOCK_LINES, batch_rows)
        sliced = sliceable(source, paths)
        # The local run's cuts (`grid_of`): a worker ends its batches at them as that run does, and slices
        # start at them, so a slice's forwards are the local run's; --incremental, like the local loop, keeps
        # only the first, where the batch that fixes a JSON input's types ends.
        grid = grid_of(paths, source.inputs.fmt, self.chars, block, fingerprints=self.p.fingerprints) \
            if self.p.fingerprints is not None else None
        if grid is not None:
            first_cut = {f: cuts[:1] for f, cuts in list(grid.cuts.items())[:1]}
            self.cuts = first_cut if self.p.carry.previous is not None else grid.cuts
        self.pointed = sliced and grid is not None
        if not self.pointed or grid is None:  # a --shard or repair range: one slice (its source bounds what it reads)
            return [InputSlice(0, begin, None)]
        return plan_slices(source, paths, self.flags.shard_rows, grid=grid, workers=self.engine.parallelism,
                           begin=begin, first=lambda: first_batch(source, paths, batch_rows, self.chars, self.cuts))

    def work(self) -> SliceWork:
        """What every worker does with a slice."""
        p = self.p
        previous = p.carry.previous.path if p.carry.previous is not None else None
        if previous is not None:  # the workers open it; the driver holds none of its index
            p.carry.close()
            p.carry = Carry(None, p.carry.keep_cols)
        fingerprints = [dict(f) for f in p.fingerprints] if p.fingerprints is not None else None
        return SliceWork(self.source, self.paths, p.job.codec, self.flags, dict(p.meta),
                         self.store.root if self.store is not None else None, previous, self.chars,
                         fingerprints=fingerprints, id_words=list(self.ids.words), cuts=self.cuts)

    def run(self) -> None:
        """Plan, hand out, commit in order."""
        report = self.report
        report.resumed_records = report.records_done = self.records
        slices = self.plan()
        work = self.work()
        progress = report.start_progress(self.records, self.flags.log_every)
        results: Iterator[Any] = iter(())
        try:
            if slices:
                results = self.engine.run_slices(work, slices)
            with StopFlag() as stop:
                while True:
                    try:
                        with stop.waiting():
                            result = next(results)
                    except StopIteration:
                        break
                    except StopNow:
                        self._stopped(stop)
                    self._commit(result, slices[result.number], work)
                    if stop.requested:
                        self._stopped(stop)
        finally:
            close = getattr(results, "close", None)
            if close is not None:
                close()
            progress.close()
            report.progress = None
        if self.store is not None:
            self.store.clean_stale()  # a dead worker's temp files: never published with the output

    def _stopped(self, stop: StopFlag) -> NoReturn:
        report = self.report
        assert report.progress is not None
        report.progress.close(
            f"stopped by {stop.signal_name}: {report.records_done:,} input rows committed; "
            "rerun the same command to resume"
        )
        raise KeyboardInterrupt(stop.signal_name)

    # -- one slice ------------------------------------------------------------------------------------
    def _commit(self, result: SliceResult, piece: InputSlice, work: SliceWork) -> None:
        error = result.error()
        if error is not None:
            raise error
        result = self._repeats(result, work)
        self._check_max_errors(result)
        report = self.report
        records_end = report.records_done + result.records
        if self.store is None:
            self._write_inline(result)
        self.p.units.merge(result.units)
        if self.store is not None and result.records:  # a slice of blank lines only has nothing to commit
            assert result.written is not None
            end = result.end  # where the worker's reading stopped, with the readers' state there
            if end is None and self.pointed:
                end = (piece.end or ReadPoint(len(self.paths), 0, 0)).to_dict()
            self.store.adopt(result.written, records_end, end, self.p.units.to_json())
        report.records_done = records_end
        report.computed_rows += result.computed_rows
        report.carried_rows += result.carried_rows
        report.carried_unread += result.carried_unread
        report.rows_read += result.rows_read
        for name in ("read", "write"):
            report.seconds[name] += result.seconds.get(name, 0.0)
        self._bad_rows(result)
        assert report.progress is not None
        report.progress.update(result.records, self.engine.stats.tokens)

    def _bad_rows(self, result: SliceResult) -> None:
        """Count a slice's bad rows and show the first few of the run (a slice sends back `SHOWN` > the
        `ERRORS_SHOWN` a run shows, so the note on the rest is printed once as in the local loop)."""
        shown = [e for e in (rebuilt(s) for s in result.shown) if isinstance(e, InputError)]
        self.report.bad_rows(shown)
        rest = result.errors - len(shown)
        if rest > 0:
            self.report.new_errors += rest
            self.report.shown_errors += rest

    def _write_inline(self, result: SliceResult) -> None:
        """`-o -`: the slice's rows and bad rows to the sink, in order."""
        if result.table is not None:
            reader = pa.ipc.open_stream(result.table)
            for rb in reader:
                self.sink.write(RowsOut(pa.Table.from_batches([rb])))
        if result.error_records:
            self.sink.add_errors(result.error_records)

    def _repeats(self, result: SliceResult, work: SliceWork) -> SliceResult:
        """The slice without rows whose id an earlier slice committed (`--on-error fail`: the first one stops
        the run, as the local loop's row checks do)."""
        repeats = self.ids.add(result.id_hashes, result.id_locations)  # the rest are registered
        if not repeats:
            return result
        rows = np.asarray([j for j, _ in repeats], np.int64)
        ids = self._ids_of(result, rows)
        errors = []
        for (j, packed), rid in zip(repeats, ids, strict=True):
            path, where = self.ids.describe(int(result.id_locations[j]))
            first_file, first_where = self.ids.describe(packed)
            errors.append(InputError(path, f"duplicate id {rid!r}: first seen at {display_path(first_file)} "
                                     f"{first_where}", location=where, record_id=rid, fix=DUPLICATE_FIX))
        if self.flags.on_error != "skip":
            raise errors[0]
        keep = np.ones(len(result.id_hashes), dtype=bool)
        keep[rows] = False
        records = [e.to_record() for e in errors]
        if self.store is not None:
            assert result.written is not None
            result.written = drop_rows(self.store.root, result.number, result.written, rows, records,
                                       self._input_order)
        elif result.table is not None:
            table = pa.ipc.open_stream(result.table).read_all().take(pa.array(np.flatnonzero(keep)))
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, table.schema) as stream:
                stream.write_table(table)
            result.table = sink.getvalue().to_pybytes()
            both = [*result.error_records, *records]
            result.error_records = [both[k] for k in self._input_order(both)]
        for j, _ in repeats:  # a dropped row is no row of its file (or row group): not carried whole later
            f, number = divmod(int(result.id_locations[j]), 1 << LOC_SHIFT)
            result.units.add(f, self._group_of(f, number), 0, -1)
        result.id_hashes, result.id_locations = result.id_hashes[keep], result.id_locations[keep]
        result.errors += len(errors)
        shown = [*result.shown, *((type(e), e.args, dict(e.__dict__)) for e in errors)]
        ranks = self._input_order([{"file": display_path(str(d.get("path"))), "location": d.get("location")}
                                   for _, _, d in shown])
        result.shown = [shown[k] for k in ranks]
        result.computed_rows = max(0, result.computed_rows - len(errors))
        return result

    def _input_order(self, records: Sequence[dict[str, Any]]) -> list[int]:
        """The order of a slice's bad rows (records of `--errors-file`) in the inputs, as the local loop lists
        them: by file, then line or row (a record with neither keeps its place after the one before it); the
        driver finds the ids an earlier slice committed after the slice's own bad rows, among them."""
        if self._files is None:
            self._files = {}
            for i, path in enumerate(self.paths):
                self._files.setdefault(display_path(path), i)
        keys: list[tuple[int, int]] = []
        last = (-1, -1)
        for r in records:
            found = LOCATED.fullmatch(str(r.get("location") or ""))
            f = self._files.get(str(r.get("file")))
            if found is not None and f is not None:
                last = (f, int(found.group(1)))
            keys.append(last)
        return sorted(range(len(records)), key=keys.__getitem__)

    def _group_of(self, f: int, row: int) -> int:
        """The row group of row `row` of input `f` when it is a Parquet file, else -1."""
        ends = self._group_ends.get(f)
        if ends is None:
            path = self.paths[f]
            ends = np.zeros(0, np.int64)
            if detect_format(path, self.source.inputs.fmt) == "parquet":
                md = pq.read_metadata(path)
                ends = np.cumsum([md.row_group(g).num_rows for g in range(md.num_row_groups)])
            self._group_ends[f] = ends
        return int(np.searchsorted(ends, row, side="right")) if len(ends) else -1

    def _ids_of(self, result: SliceResult, rows: np.ndarray) -> list[str]:
        """The ids of rows `rows` of a slice's output."""
        if result.table is not None:
            table = pa.ipc.open_stream(result.table).read_all()
        else:
            assert self.store is not None and result.written is not None and result.written.file is not None
            table = pq.read_table(os.path.join(self.store.root, result.written.file), columns=["id"])
        column = table.column("id").cast(pa.string())
        return [str(column[int(j)].as_py()) for j in rows]

    def _check_max_errors(self, result: SliceResult) -> None:
        """`--max-errors` over the whole run: the slice that passes it is not committed."""
        limit = self.flags.max_errors
        before = self.errors_before + self.report.new_errors
        if limit is None or not result.errors or before + result.errors <= limit:
            return
        k = max(0, limit - before)  # the bad row (of this slice) that passes the limit
        last = self._error_at(result, k)
        raise TooManyErrors(
            last.path, f"more than {limit} bad rows (--max-errors {limit}); the last: {last.reason}",
            location=last.location, record_id=last.record_id,
            fix="fix the input, or raise --max-errors; the rows committed so far are kept",
        )

    def _error_at(self, result: SliceResult, k: int) -> InputError:
        """Bad row `k` of a slice (0-based, in the order the slice met them)."""
        if k < len(result.shown):
            e = rebuilt(result.shown[k])
            if isinstance(e, InputError):
                return e
        records: Sequence[dict[str, Any]] = result.error_records
        if self.store is not None and result.written is not None and result.written.errors_file is not None:
            with open(os.path.join(self.store.root, result.written.errors_file), encoding="utf-8") as f:
                records = [json.loads(line) for line in f if line.strip()]
        r = records[min(k, len(records) - 1)]
        return InputError(str(r.get("file")), str(r.get("reason")), location=r.get("location"),
                          record_id=r.get("id"), fix=r.get("fix"))


def run_sliced(p: Pipeline, sink: Sink, start: ReadPoint | None, records: int, ids: IdSet,
               chars: int | None) -> None:
    """Run pipeline `p` through its slice engine into `sink` from `start` (`records` input records committed
    before it, their ids in `ids`; see the module docstring); `chars`: the text cap of a batch, as the local
    loop cuts them."""
    SlicedRun(p, sink, start, records, ids, chars).run()
