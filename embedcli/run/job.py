"""One run of a compute command as one value: `Job`, and the protocols of what it is made of.

A task (`embedcli.tasks`) turns a command's options into a `Job`; `embedcli.run.run_job` runs it: reads the
`source`, hands each batch's `codec.inputs` to the `engine`, turns the results into rows with `codec.table`
and commits them to the `target`, with `provenance` in the output's metadata, under the run `flags`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from embedcli.run.flags import RunFlags


@runtime_checkable
class EngineStats(Protocol):
    """What the loop reads from an engine's counters (`embedcli.compute.runner.RunStats`)."""

    @property
    def rows(self) -> int: ...
    @property
    def tokens(self) -> int: ...
    @property
    def truncated_rows(self) -> int: ...

    def to_dict(self) -> dict[str, Any]: ...


@runtime_checkable
class Engine(Protocol):
    """Turns batches of inputs into one result per batch, in order: the local `Runner`, `RayRunner`,
    `LazyEngine`, run-batch's `UnitEngine` (mypy checks each against this protocol where a `Job` is made)."""

    @property
    def stats(self) -> EngineStats: ...
    @property
    def max_length(self) -> int: ...

    def map(self, batches: Iterable[Any]) -> Iterator[Any]: ...


@runtime_checkable
class SliceEngine(Engine, Protocol):
    """An engine that does whole slices of a run where its workers are (the Ray Data engine): each slice is
    read, computed and written by a worker (`embedcli.run.slice_work.SliceWork.run`), the loop commits the
    results in order (`embedcli.run.sliced`)."""

    def start(self) -> None: ...

    @property
    def parallelism(self) -> int: ...  # slices it works on at once (its workers), once started

    def run_slices(self, work: Any, slices: Sequence[Any]) -> Iterator[Any]: ...


@runtime_checkable
class Sink(Protocol):
    """Where the loop writes committed rows: `embedcli.io.shards.ShardStore` (staged, resumable),
    `embedcli.run.sinks.StdoutSink` (`-o -`) or `embedcli.run.store_run.StoreSink` (a LanceDB / Postgres table)."""

    def write(self, out: Any) -> None: ...  # an embedcli.io.shards.RowsOut

    def add_errors(self, records: list[dict[str, Any]]) -> None: ...

    @property
    def pending_errors(self) -> list[dict[str, Any]]: ...

    # records_end: input records done; end: where reading goes on (a ReadPoint); units: InputUnits JSON
    def commit(self, records_end: int, end: Any = None, units: str | None = None) -> object: ...

    def abort(self) -> None: ...


@dataclass(frozen=True)
class Rows:
    """What `RowCodec.table` may return instead of a bare table: the rows, and the input rows they answer
    as bad (e.g. run-batch's 400 lines). Those count as skipped rows under `--on-error skip` (exit 3,
    `--errors-file`, `--max-errors`) while their rows are still written; `--on-error fail` stops at the first."""

    table: Any
    errors: Sequence[Any] = ()  # embedcli.errors.InputError


@runtime_checkable
class RowCodec(Protocol):
    """A command's rows: the engine's inputs of a batch, the output table of a batch's result (or `Rows`),
    the empty output."""

    def inputs(self, batch: Any) -> Any: ...

    def table(self, batch: Any, result: Any) -> Any: ...

    def empty(self) -> Any: ...


@dataclass(frozen=True)
class Target:
    """Where the rows go: `-o` and `--output-format`."""

    path: str
    fmt: str | None = None


@dataclass(frozen=True)
class Reporting:
    """What the run tells people: `--quiet` and `--stats FILE`."""

    quiet: bool = False
    stats_file: str | None = None


@dataclass(frozen=True)
class Job:
    """Everything one run needs (see the module docstring)."""

    source: Iterable[Any]  # a BatchSource (resumable), or any iterable of input batches
    engine: Engine
    codec: RowCodec
    provenance: dict[str, str]
    target: Target
    flags: RunFlags = field(default_factory=RunFlags)
    reporting: Reporting = field(default_factory=Reporting)

