"""One slice of a run, done where a worker of the Ray Data engine runs: read, check, compute, write.

`SliceWork` is picklable (the job's source, codec and flags, the staging directory, the output metadata):
the engine builds one runner per worker and calls `SliceWork.run(runner, piece)` for each `InputSlice` it is
handed. The slice goes through the local engine's steps: the readers from the slice's start to its stop,
the row checks (null texts, repeated ids within the slice), `--incremental`'s carry-over from the previous
output, the runner's `map` (batches cut as a local run cuts them), the codec's rows, and one shard's
files (`embedcli.io.shard_files`). It returns a small `SliceResult`; the driver commits slices in order
(`embedcli.run.sliced`), where the run-wide checks happen: ids repeated across slices, `--max-errors`, the
first bad row under `--on-error fail`.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa

from embedcli.errors import EmbedcliError, InputError
from embedcli.io.arrow_values import to_numpy
from embedcli.io.previous import PreviousOutput
from embedcli.io.shard_files import ShardWriter
from embedcli.io.shards import WrittenShard, resolve_rows
from embedcli.io.units import InputUnits
from embedcli.run.checks import RowChecks, read_work
from embedcli.run.flags import RunFlags
from embedcli.run.ids import IdSet
from embedcli.run.incremental import Carry, count_units
from embedcli.run.job import Rows
from embedcli.run.pools import Pool, pooled
from embedcli.run.report import ERRORS_SHOWN
from embedcli.run.slices import InputSlice
from embedcli.run.source import BatchSource

SHOWN = ERRORS_SHOWN + 1
"""Bad rows of a slice sent back whole, to be shown by the driver (the rest are in the slice's errors file)."""


def portable(e: BaseException) -> tuple[type[BaseException], tuple[Any, ...], dict[str, Any]]:
    """An exception as (class, args, attributes): picklable whatever its `__init__` takes."""
    return type(e), e.args, dict(e.__dict__)


def rebuilt(parts: tuple[type[BaseException], tuple[Any, ...], dict[str, Any]]) -> BaseException:
    """`portable` back."""
    cls, args, state = parts
    e = cls.__new__(cls)
    e.args = args
    e.__dict__.update(state)
    return e


@dataclass
class SliceResult:
    """What a worker sends back for one slice (small: names, counts, the ids of its rows)."""

    number: int
    records: int = 0
    written: WrittenShard | None = None
    table: bytes | None = None  # the rows themselves (Arrow IPC stream) when the run writes to stdout
    error_records: list[dict[str, Any]] = field(default_factory=list)  # every bad row, with `table` only
    errors: int = 0
    shown: list[tuple[type[BaseException], tuple[Any, ...], dict[str, Any]]] = field(default_factory=list)
    # per written row: its id hash and packed location (`embedcli.run.ids`), from the row index; or empty
    id_hashes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    id_locations: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    ids_per_row: bool = True  # id_hashes holds one per written row (else rows are not one per record)
    computed_rows: int = 0
    carried_rows: int = 0
    carried_unread: int = 0
    rows_read: int = 0  # rows parsed from the inputs' text (not carried over unread)
    end: dict[str, Any] | None = None  # where reading goes on after the slice (a `ReadPoint`'s dict), if known
    units: InputUnits = field(default_factory=InputUnits)  # the slice's records and rows per input file
    fatal: tuple[type[BaseException], tuple[Any, ...], dict[str, Any]] | None = None
    seconds: dict[str, float] = field(default_factory=lambda: {"read": 0.0, "write": 0.0})
    stats: dict[str, Any] = field(default_factory=dict)  # the runner's counters for this slice (the engine's)

    def error(self) -> BaseException | None:
        """The error that stopped the slice (a bad row under --on-error fail, a model error), or None."""
        return rebuilt(self.fatal) if self.fatal is not None else None


@dataclass
class SliceWork:
    """A run's slices as a worker does them (see the module docstring)."""

    source: BatchSource
    paths: list[str]
    codec: Any
    flags: RunFlags
    meta: dict[str, str]
    root: str | None  # the staging directory; None: rows go back in the result (stdout)
    previous: str | None = None  # --incremental: the previous output (opened once per worker)
    batch_chars: int | None = None  # the text cap of a batch (the run loop's, from the engine's token budget)
    fingerprints: list[dict[str, Any]] | None = None  # the inputs' (for carrying blocks and files over unread)
    cuts: dict[int, list[int]] = field(default_factory=dict)  # where a batch must end: the run's cuts (`grid_of`)
    id_words: list[str] = field(default_factory=list)  # what each input's numbers count ("line", "row")
    cwd: str = field(default_factory=os.getcwd)
    _carry: Carry | None = field(default=None, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_carry"] = None
        return state

    def enter(self) -> None:
        """Set a worker up: relative input paths and default ids as the driver's (its directory)."""
        try:
            os.chdir(self.cwd)
        except OSError as e:
            raise EmbedcliError(
                f"a Ray worker cannot enter the run's directory {self.cwd} ({e.strerror}): run embedcli from a "
                "directory every node has at the same path (a shared file system), with absolute input paths"
            ) from None

    def carry(self) -> Carry:
        """`--incremental`'s carry-over (the previous output opened once per worker)."""
        if self._carry is None:
            previous = PreviousOutput.open(self.previous) if self.previous else None
            self._carry = Carry(previous, list(self.source.inputs.keep_cols))
        return self._carry

    def run(self, engine: Any, piece: InputSlice) -> SliceResult:
        """Read, check, compute and write one slice (bad rows and errors as the local engine has them)."""
        result = SliceResult(piece.number)
        writer = ShardWriter(self.root, piece.number, self.meta) if self.root is not None else None
        tables: list[pa.Table] = []
        try:
            self._run(engine, piece, result, writer, tables)
        except EmbedcliError as e:
            if writer is not None:
                writer.abort()
            return SliceResult(piece.number, fatal=portable(e), seconds=result.seconds)
        except BaseException:
            if writer is not None:
                writer.abort()
            raise
        t0 = time.perf_counter()
        if writer is not None:
            result.written = writer.finish()
        elif tables:
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, tables[0].schema) as stream:
                for t in tables:
                    stream.write_table(t.cast(tables[0].schema))
            result.table = sink.getvalue().to_pybytes()
        result.seconds["write"] += time.perf_counter() - t0
        return result

    def _run(self, engine: Any, piece: InputSlice, result: SliceResult, writer: ShardWriter | None,
             tables: list[pa.Table]) -> None:
        source: BatchSource = self.source
        flags = replace(self.flags, max_errors=None, errors_file=None)  # run-wide counts are the driver's
        carry = self.carry()
        previous = carry.previous
        indexed = previous is not None and previous.has_ids() and self.fingerprints is not None
        carry_blocks = previous.blocks() if indexed and previous is not None else None
        carry_units = previous.unit_map() if indexed and previous is not None else None
        # a changed block's unchanged lines carried over unread, as the local loop does (`ReadSpec.carry_lines`)
        carry_lines = previous.line_rows if indexed and previous is not None and previous.has_lines() else None
        # ids repeated inside the slice: the local loop's checks (the driver checks them across slices)
        checks = RowChecks(flags, 0, IdSet(self.paths, self.id_words), source.inputs.text_col)
        batch_rows = min(source.inputs.batch_rows, flags.shard_rows)
        held: deque[Pool] = deque()
        hashes: list[np.ndarray] = []
        locations: list[np.ndarray] = []

        specs: list[Any] = []

        def open_reader(on_bad: Any) -> Any:
            reader = source.open(self.paths, batch_rows=batch_rows, on_bad_row=on_bad, batch_chars=self.batch_chars,
                                 start=piece.start, stop=piece.stop, cuts=self.cuts, fingerprints=self.fingerprints,
                                 carry_blocks=carry_blocks, carry_units=carry_units, carry_lines=carry_lines)
            specs.append(reader.spec)
            return reader

        def inputs() -> Iterator[Any]:
            works = read_work((), carry.split, result.seconds, checks, open_reader=open_reader,
                              unread_index=previous.id_rows if previous is not None and previous.has_ids() else None)
            for pool in pooled(works, batch_rows, self.batch_chars):  # the local loop's pools, so its forwards
                held.append(pool)
                yield self.codec.inputs(pool.compute) if pool.compute is not None else []

        for output in engine.map(inputs()):
            pool = held.popleft()
            answered: list[InputError] = []
            if any(w.rows for w in pool.works):
                table, index, answered = self._table(pool, output, carry, result)
                t0 = time.perf_counter()
                if writer is not None:
                    writer.write(table, index)
                else:
                    tables.append(table)
                result.seconds["write"] += time.perf_counter() - t0
                if index is not None:
                    hashes.append(np.asarray(to_numpy(index.column("idh")), np.int64))
                    locations.append(np.asarray(to_numpy(index.column("loc")), np.int64))
                elif table.num_rows:
                    result.ids_per_row = False
            errors = pool.errors
            errors += answered
            if errors:
                records = [e.to_record() for e in errors]
                if writer is not None:
                    writer.add_errors(records)
                else:
                    result.error_records.extend(records)
                result.shown.extend(portable(e) for e in errors[: max(0, SHOWN - len(result.shown))])
                result.errors += len(errors)
            result.records += pool.records
            for work in pool.works:
                count_units(result.units, work, previous, carry_units)
                if work.end is not None:
                    result.end = work.end.to_dict()
        result.rows_read = sum(spec.rows_read for spec in specs)
        if hashes and result.ids_per_row:
            result.id_hashes, result.id_locations = np.concatenate(hashes), np.concatenate(locations)

    def _table(
        self, pool: Pool, output: Any, carry: Carry, result: SliceResult
    ) -> tuple[pa.Table, pa.Table | None, list[InputError]]:
        """A pool's output rows (computed and carried over, in input order, with rows taken over from the
        previous output read: a worker's shard holds every row), their row index (None: rows are not one per
        record) and the rows the codec answered as bad."""
        computed = None
        answered: list[InputError] = []
        if pool.compute is not None:
            computed = self.codec.table(pool.compute, output)
            if isinstance(computed, Rows):
                answered = list(computed.errors)
                computed = computed.table
                if answered and self.flags.on_error == "fail":
                    raise answered[0]
        out = carry.rows_out(pool.works, pool.compute_rows, computed, result)
        if out is None:
            return pa.table({}), None, answered
        table = resolve_rows(out, carry.previous, None)
        assert table is not None
        return table, out.index, answered
