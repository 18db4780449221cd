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

import hashlib
import os
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa

from embedcli.errors import EmbedcliError, InputError
from embedcli.io.previous import PreviousOutput
from embedcli.io.shard_files import ShardWriter
from embedcli.io.shards import WrittenShard
from embedcli.run.checks import Work, read_work
from embedcli.run.flags import RunFlags
from embedcli.run.incremental import Carry
from embedcli.run.job import Rows
from embedcli.run.report import ERRORS_SHOWN
from embedcli.run.slices import InputSlice, SliceSource
from embedcli.run.source import BatchSource

SHOWN = ERRORS_SHOWN + 1
"""Bad rows of a slice sent back whole, to be shown by the driver (the rest are in the slice's errors file)."""
LOCATION_SHIFT = 40


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


def id_hashes(ids: Sequence[str]) -> np.ndarray:
    """A 64-bit hash of each id, the same in every process (Python's `hash` of a string is not)."""
    out = np.empty(len(ids), dtype=np.int64)
    for i, rid in enumerate(ids):
        digest = hashlib.blake2b(rid.encode("utf-8", "surrogatepass"), digest_size=8).digest()
        out[i] = int.from_bytes(digest, "little", signed=True)
    return out


def pack_locations(files: Sequence[int], locations: Sequence[str]) -> np.ndarray:
    """`file index << 41 | is_row << 40 | N` of each `line N` / `row N` location."""
    out = np.empty(len(locations), dtype=np.int64)
    for i, (f, loc) in enumerate(zip(files, locations, strict=True)):
        word, _, number = loc.rpartition(" ")
        n = int(number) if number.isdigit() else 0
        out[i] = (f << (LOCATION_SHIFT + 1)) | ((word == "row") << LOCATION_SHIFT) | n
    return out


def describe_location(paths: Sequence[str], packed: int) -> tuple[str, str]:
    """(file, 'line N' / 'row N') of a packed location."""
    f, row, n = packed >> (LOCATION_SHIFT + 1), (packed >> LOCATION_SHIFT) & 1, packed & ((1 << LOCATION_SHIFT) - 1)
    return (paths[f] if 0 <= f < len(paths) else "?"), f"{'row' if row else 'line'} {n}"


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
    id_hashes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # per written row, or empty
    id_locations: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    ids_per_row: bool = True  # id_hashes holds one per written row (else rows are not one per record)
    computed_rows: int = 0
    carried_rows: int = 0
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
        if piece.start is not None or piece.stop is not None:
            source = SliceSource(source.inputs, source.extra_text_cols, start=piece.start, stop=piece.stop)
        flags = replace(self.flags, max_errors=None, errors_file=None)  # run-wide counts are the driver's
        carry = self.carry()
        files = {p: i for i, p in enumerate(self.paths)}
        held: deque[Work] = deque()
        hashes: list[np.ndarray] = []
        locations: list[np.ndarray] = []

        def inputs() -> Iterator[Any]:
            items = read_work(source, self.paths, flags, piece.skip, 0, carry.split, result.seconds,
                              self.batch_chars)
            for work in items:
                held.append(work)
                yield self.codec.inputs(work.compute) if work.compute is not None else []

        for output in engine.map(inputs()):
            work = held.popleft()
            answered: list[InputError] = []
            if work.batch is not None and len(work.batch):
                table, answered = self._table(work, output, carry, result)
                t0 = time.perf_counter()
                one_per_record = table.num_rows == len(work.batch)
                if writer is not None:
                    writer.write(table, work.keys if one_per_record else None)
                else:
                    tables.append(table)
                result.seconds["write"] += time.perf_counter() - t0
                if one_per_record:
                    b = work.batch
                    hashes.append(id_hashes(b.ids))
                    locations.append(pack_locations([files.get(b.source, 0)] * len(b), b.locations))
                elif table.num_rows:
                    result.ids_per_row = False
            errors = [*work.errors, *answered]
            if errors:
                records = [e.to_record() for e in errors]
                if writer is not None:
                    writer.add_errors(records)
                else:
                    result.error_records.extend(records)
                result.shown.extend(portable(e) for e in errors[: max(0, SHOWN - len(result.shown))])
                result.errors += len(errors)
            result.records += work.records
        if hashes and result.ids_per_row:
            result.id_hashes, result.id_locations = np.concatenate(hashes), np.concatenate(locations)

    def _table(self, work: Work, output: Any, carry: Carry, result: SliceResult) -> tuple[Any, list[InputError]]:
        """A work item's output rows (computed and carried over, in input order) and the rows the codec answered
        as bad."""
        computed = None
        answered: list[InputError] = []
        if len(work.compute_idx) or not len(work.carry_idx):
            computed = self.codec.table(work.compute, output)
            if isinstance(computed, Rows):
                answered = list(computed.errors)
                computed = computed.table
                if answered and self.flags.on_error == "fail":
                    raise answered[0]
        table, carried = carry.join(work, computed)
        result.carried_rows += carried
        result.computed_rows += len(work.compute_idx)
        return table, answered
