"""The loop every compute command shares, made safe to run unattended.

`run_pipeline(job)` streams input batches through the job's engine into its output and adds what cron needs:

- **Atomic, resumable output.** Results are committed in shards through `OUT.embedcli-staging/`
  (see `embedcli.io.manifest` and `embedcli.run.staging`); the manifest records the input fingerprints,
  the committed record ranges and the config. The same command after a crash (even `kill -9`) skips the
  committed records (read, not recomputed) and continues; the final file is assembled from the shards and
  renamed into place, so nothing half-written is ever visible. Batches and shard cuts fall on the same
  records in every run, so a resumed run's output is the same, byte for byte, as an uninterrupted one.
- **Refusing to mix.** An output or staged work made with a different config stops the run with
  exit 2 unless `--overwrite`; a complete output of the same command is left alone (exit 0).
- **`--incremental`.** Rows whose key is in the previous output's index are carried over
  (`embedcli.run.incremental`), the rest are computed.
- **Bad rows.** Malformed lines, bad UTF-8, null texts and duplicate ids stop the run
  (`--on-error fail`) or are skipped and recorded (`--on-error skip`, `--errors-file`, `--max-errors`,
  exit 3; `embedcli.run.checks`). SIGINT/SIGTERM commit what is done and exit 130; a full disk exits 1
  with the committed work kept for the rerun.
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NoReturn

import pyarrow as pa

from embedcli.errors import (
    EXIT_FATAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_SKIPPED,
    InputError,
    OutputError,
    TooManyErrors,
)
from embedcli.io.arrow_values import arrow_array
from embedcli.io.manifest import KEY_CONFIG_KEY, KEY_INPUT_OPTIONS, KEY_INPUTS, KEY_JOB, config_key, job_key
from embedcli.io.positions import BLOCK_LINES, ReadPoint
from embedcli.io.readers import detect_format
from embedcli.io.units import InputUnits
from embedcli.run.checks import RowChecks, Work, read_work
from embedcli.run.grid import batch_chars, grid_of
from embedcli.run.ids import IdSet
from embedcli.run.incremental import Carry, count_units, open_previous
from embedcli.run.job import Job, Rows, Sink, SliceEngine
from embedcli.run.pools import Pool, pooled
from embedcli.run.report import RunReport, write_stats
from embedcli.run.signals import StopFlag, StopNow
from embedcli.run.sinks import StdoutSink
from embedcli.run.sliced import run_sliced
from embedcli.run.source import BatchSource
from embedcli.run.staging import run_staged
from embedcli.run.store_run import run_store
from embedcli.run.target import check_target, resolve_output
from embedcli.startup import resume


class Pipeline:
    """One run of a `Job` (see the module docstring)."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.flags = job.flags
        self.meta = dict(job.provenance)
        self.source = job.source if isinstance(job.source, BatchSource) else None
        self.report = RunReport(quiet=job.reporting.quiet)
        self.carry = Carry(None, list(self.source.inputs.keep_cols) if self.source else [])
        self.carry_blocks: dict[bytes, tuple[int, int]] = {}
        self.carry_units: dict[bytes, tuple[int, int, Any]] = {}
        self.carry_lines: Callable[[Any, Any], Any] | None = None
        self.units = InputUnits()
        self.read_point: ReadPoint | None = None
        self.manifest: Any = None
        self.store: Any = None
        self.paths: list[str] | None = None
        inputs = self.source.inputs.paths if self.source else ()
        check_target(job.target.path, self.flags, inputs, job.reporting.stats_file)
        self.output = resolve_output(job.target.path, job.target.fmt, self.flags)
        job.codec.empty()  # a codec refuses a kept column that would shadow its own here, before any work

    def note(self, message: str) -> None:
        """A one-line note on stderr (kept clear of the progress bar)."""
        self.report.note(message)

    # -- entry point -------------------------------------------------------------------------------
    def run(self) -> int:
        """Run the job; returns the exit code (0, or 3 when rows were skipped)."""
        self._keys()
        try:
            if self.output.mode == "stdout":
                code = self._run_stdout()
            elif self.output.mode == "store":
                code = run_store(self)
            else:
                code = run_staged(self)
            self.report.exit_code = code
            return code
        except KeyboardInterrupt:
            self.report.exit_code = EXIT_INTERRUPTED
            raise
        except BaseException as e:
            self.report.exit_code = getattr(e, "exit_code", EXIT_FATAL)
            self.report.error = str(e)
            raise
        finally:
            self.carry.close()
            self._write_stats()

    def _keys(self) -> None:
        """The job's config key, job key (config + input fingerprints) and the metadata every output carries."""
        fingerprints = None
        options: dict[str, Any] = {}
        if self.source is not None:
            self.paths = self.source.paths()
            fingerprints = self.source.fingerprints(self.paths)
            if fingerprints is None and self.output.mode != "stdout":
                self.note("an input is stdin, a pipe or a FIFO, read once: this run cannot resume if interrupted")
            options = self.source.options()
            self.report.total = self.source.total_rows(self.paths)
        fmt = self.output.fmt if self.output.mode != "dir" else "parquet-dir"  # a store: "lancedb" / "postgresql"
        self.cfg_key = config_key(self.meta, options, fmt)
        self.job_key = job_key(self.cfg_key, fingerprints)
        self.fingerprints = fingerprints
        self.options = options
        self.base_meta = {
            **self.meta,
            KEY_CONFIG_KEY: self.cfg_key,
            KEY_JOB: self.job_key or "",
            KEY_INPUTS: json.dumps(fingerprints, sort_keys=True) if fingerprints is not None else "null",
            KEY_INPUT_OPTIONS: json.dumps(options, sort_keys=True),
        }

    def empty_output(self) -> Any:
        """The output of no rows: the codec's, with the id and each kept column typed as a Parquet input declares
        it (else string), so an empty output has the same columns as a full one."""
        table = self.job.codec.empty()
        if self.source is None:
            return table
        types = self.source.kept_types(self.paths or [])
        id_type = self.source.id_type(self.paths or [])
        if id_type is not None and "id" in table.column_names:
            table = table.set_column(table.column_names.index("id"), "id", arrow_array([], id_type))
        for name in self.source.inputs.keep_cols:
            column = arrow_array([], types.get(name, pa.string()))
            if name in table.column_names:
                table = table.set_column(table.column_names.index(name), name, column)
            else:
                table = table.append_column(name, column)
        return table

    def start_engine(self) -> None:
        """Load the engine's model now if it defers that (`start`): the output's state says there is work."""
        start = getattr(self.job.engine, "start", None)
        if start is not None:
            start()

    def open_previous(self, in_place: str | None, existing: dict[str, str] | None) -> None:
        """Set up `--incremental`'s carry-over from the previous output (if any)."""
        previous = open_previous(self.flags, in_place, existing, self.meta, self.base_meta, self.note)
        self.carry = Carry(previous, self.carry.keep_cols)
        if previous is not None and previous.has_ids() and self.fingerprints is not None:
            self.carry_blocks = previous.blocks()
            self.carry_units = previous.unit_map()
            self.carry_lines = previous.line_rows if previous.has_lines() else None

    # -- stdout --------------------------------------------------------------------------------------
    def _run_stdout(self) -> int:
        self.start_engine()
        sink = StdoutSink(self.output.fmt, self.base_meta)
        self.open_previous(None, None)
        sink.previous = self.carry.previous
        try:
            self.guarded_loop(sink, None, 0, errors=lambda: sink.errors)
        finally:
            self.report.rows = sink.rows
        sink.finish(self.empty_output())
        self.report.summary(self.job.engine, self.report.new_errors, sink.rows, self.flags.errors_file)
        return EXIT_SKIPPED if self.report.new_errors else EXIT_OK

    def guarded_loop(
        self, sink: Sink, start: ReadPoint | None, records: int, errors: Callable[[], Iterable[dict[str, Any]]],
        ids: IdSet | None = None,
    ) -> None:
        """The loop from `start` (`records` input records done before it), then `--errors-file` with every bad
        row (`errors()`) and the row that stopped the run."""
        fatal: list[dict[str, Any]] = []
        try:
            self._loop(sink, start, records, ids)
        except InputError as e:
            if e.location or e.record_id is not None:
                fatal.append(e.to_record())
            raise
        finally:
            self.report.write_errors_file(self.flags.errors_file, [*errors(), *fatal])

    # -- the loop ------------------------------------------------------------------------------------
    def id_set(self) -> IdSet:
        """An empty duplicate-id set naming this run's inputs."""
        paths = self.paths or []
        words = []
        for p in paths:
            try:
                words.append("row" if detect_format(p, self.source.inputs.fmt if self.source else None) == "parquet"
                             else "line")
            except InputError:
                words.append("record")
        return IdSet(paths, words)

    def _open_reader(self, start: ReadPoint | None, chars: int | None) -> Callable[[Any], Any]:
        source = self.source
        assert source is not None
        batch_rows = min(source.inputs.batch_rows, self.flags.shard_rows)
        block = min(BLOCK_LINES, batch_rows)
        # The cuts make a run's batches those of its --shard slices; --incremental (which --shard refuses)
        # keeps the first alone (`grid_of`), so rows to compute 1% apart fill forwards as appended rows do.
        grid = (grid_of(self.paths or [], source.inputs.fmt, chars, block, first_only=self.carry.previous is not None,
                        fingerprints=self.fingerprints)
                if self.fingerprints is not None else None)
        run: dict[str, Any] = {
            "start": start, "cuts": grid.cuts if grid is not None else None, "fingerprints": self.fingerprints,
            "carry_blocks": self.carry_blocks, "carry_units": self.carry_units, "carry_lines": self.carry_lines,
        }

        def open_reader(on_bad: Any) -> Any:
            reader = source.open(self.paths, batch_rows=batch_rows, on_bad_row=on_bad, batch_chars=chars, **run)
            self._reader_spec = reader.spec
            return reader

        return open_reader

    def _loop(self, sink: Sink, start: ReadPoint | None, records: int, ids: IdSet | None) -> None:
        resume()  # rows are read and computed from here: the collector back on (`embedcli.startup`)
        if isinstance(self.job.engine, SliceEngine):  # its workers read, compute and write; this commits
            run_sliced(self, sink, start, records, ids if ids is not None else self.id_set(),
                       batch_chars(self.job.engine))
            return
        report, engine, codec = self.report, self.job.engine, self.job.codec
        report.resumed_records = report.records_done = records
        errors_before = self._errors_before = self.manifest.errors if self.manifest is not None else 0
        progress = report.start_progress(records, self.flags.log_every)
        held: deque[Pool] = deque()
        chars = batch_chars(engine)
        checks = RowChecks(self.flags, errors_before, ids if ids is not None else self.id_set(),
                           self.source.inputs.text_col if self.source is not None else "text")
        batch_rows = min(self.source.inputs.batch_rows, self.flags.shard_rows) if self.source else \
            self.flags.shard_rows
        previous = self.carry.previous

        def inputs() -> Iterator[Sequence[Any]]:
            works = read_work(
                self.job.source, self.carry.split, report.seconds, checks,
                open_reader=self._open_reader(start, chars) if self.source is not None else None,
                unread_index=previous.id_rows if previous is not None and previous.has_ids() else None,
            )
            for pool in pooled(works, batch_rows, chars):
                held.append(pool)
                yield codec.inputs(pool.compute) if pool.compute is not None else []

        results = engine.map(inputs())
        self._in_write = False
        try:
            with StopFlag() as stop:
                self._drive(sink, results, held, stop)
        except (OutputError, OSError):
            sink.abort()
            raise
        except BaseException:
            if self._in_write:
                sink.abort()
            else:
                self._commit_quietly(sink)
            raise
        finally:
            close = getattr(results, "close", None)  # a generator: join the engine's prefetch thread
            if close is not None:
                close()
            progress.close()
            report.progress = None
            spec = getattr(self, "_reader_spec", None)
            if spec is not None:
                report.rows_read = spec.rows_read

    def _drive(self, sink: Sink, results: Iterator[Any], held: deque[Pool], stop: StopFlag) -> None:
        """Write each pool's rows, commit every `--shard-rows` records or `--commit-every` seconds (always
        between pools), stop on a signal."""
        report, flags = self.report, self.flags
        last_commit = time.monotonic()
        since_commit = 0
        while True:
            try:
                with stop.waiting():
                    result = next(results)
            except StopIteration:
                break
            except StopNow:
                self._stopped(sink, stop)
            pool = held.popleft()
            answered = self._write(sink, pool, result)
            errors = pool.errors
            errors += answered
            if errors:
                sink.add_errors([e.to_record() for e in errors])
                report.bad_rows(errors)
            for work in pool.works:
                self.units_done(work)
                if work.end is not None:
                    self.read_point = work.end
            report.records_done += pool.records
            # rows carried over unread are cheap to take again: they weigh an eighth towards --shard-rows
            unread = sum(w.unread for w in pool.works)
            since_commit += pool.records - unread + unread // 8
            assert report.progress is not None
            report.progress.update(pool.records, self.job.engine.stats.tokens)
            if stop.requested:
                self._stopped(sink, stop)
            now = time.monotonic()
            if since_commit >= flags.shard_rows or now - last_commit >= flags.commit_every:
                self._commit(sink)
                last_commit, since_commit = now, 0
        self._commit(sink)

    def units_done(self, work: Work) -> None:
        """Count a work item's records and rows per input file and row group (`InputUnits`)."""
        count_units(self.units, work, self.carry.previous, self.carry_units)

    def _stopped(self, sink: Sink, stop: StopFlag) -> NoReturn:
        """Commit what is written, say so, and stop (exit 130)."""
        self._commit(sink)
        assert self.report.progress is not None
        self.report.progress.close(
            f"stopped by {stop.signal_name}: {self.report.records_done:,} input rows committed; "
            "rerun the same command to resume"
        )
        raise KeyboardInterrupt(stop.signal_name)

    def _write(self, sink: Sink, pool: Pool, result: Any) -> list[InputError]:
        """Write a pool's rows; returns the rows the codec answered as bad (see `Rows`)."""
        computed = None
        answered: list[InputError] = []
        if pool.compute is not None:
            computed = self.job.codec.table(pool.compute, result)
            if isinstance(computed, Rows):
                answered = list(computed.errors)
                computed = computed.table
                if answered and self.flags.on_error == "fail":
                    raise answered[0]
                read_errors = len(pool.errors)
                self._check_max_errors(answered, read_errors)  # before anything of this pool is written
        out = self.carry.rows_out(pool.works, pool.compute_rows, computed, self.report)
        if out is None:
            return answered
        t0 = time.perf_counter()
        self._in_write = True
        sink.write(out)
        self._in_write = False
        self.report.seconds["write"] += time.perf_counter() - t0
        return answered

    def _check_max_errors(self, answered: list[InputError], read_errors: int) -> None:
        """`--max-errors` over read-stage and answered bad rows together (the reader counts only its own);
        `read_errors`: the reader's bad rows of this pool, not yet reported."""
        limit = self.flags.max_errors
        before = self._errors_before + self.report.new_errors + read_errors
        if not answered or limit is None or before + len(answered) <= limit:
            return
        last = answered[max(0, limit - before)]  # the bad row that passes the limit
        raise TooManyErrors(
            last.path, f"more than {limit} bad rows (--max-errors {limit}); the last: {last.reason}",
            location=last.location, record_id=last.record_id,
            fix="fix the input, or raise --max-errors; the rows committed so far are kept",
        )

    def _commit(self, sink: Sink) -> None:
        t0 = time.perf_counter()
        sink.commit(self.report.records_done, self.read_point, self.units.to_json())
        self.report.seconds["write"] += time.perf_counter() - t0

    def _commit_quietly(self, sink: Sink) -> None:
        """Commit finished pools on the way out of a failure; a failing commit is dropped."""
        try:
            sink.commit(self.report.records_done, self.read_point, self.units.to_json())
        except Exception:
            sink.abort()

    def _write_stats(self) -> None:
        report, m = self.report, self.manifest
        if m is not None:
            report.rows = m.rows_done if report.rows is None else report.rows
            report.skipped = m.errors if report.skipped is None else report.skipped
            report.shards = len(m.shards)
        write_stats(self.job.reporting.stats_file, report.to_stats(self.job.engine.stats))


def run_pipeline(job: Job) -> int:
    """Run the shared loop for `job`; returns the exit code (0 or 3)."""
    return Pipeline(job).run()
