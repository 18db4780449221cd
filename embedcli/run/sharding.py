"""Static sharding (`--shard K/N`): one of N deterministic, contiguous slices of the inputs.

For clusters without Ray (a Slurm array, several cron jobs): N independent runs of the same command with
`--shard 0/N` … `--shard N-1/N` and N different `-o` paths compute every input record exactly once.

The partition is by the run's cuts (`embedcli.run.grid`): the inputs' bytes are cut into C cells at points
every run of these inputs ends a batch at; shard K takes cells `[K*C//N, (K+1)*C//N)`. It opens the inputs
at its first cut (a Parquet file by its footer; a text file after counting the line breaks before it) and
stops at its last, reading nothing of the other slices but the first batch of the inputs (whose rows fix
a JSON input's types). Since every slice ends where a whole run ends a batch, its batches, packed forwards
and so its vectors are those of the whole run: `embedcli merge` of the N outputs is, byte for byte, the
output of the unsharded run, row index included.

Each shard output carries `embedcli.shard` (K/N), `embedcli.shard_range` (first:last cell) and
`embedcli.shard_total` (C) in its metadata next to the usual provenance; `embedcli inspect OUT-* --check`
checks the set is complete (every cell once, same config, model and inputs) and `embedcli merge` joins it.

Duplicate ids are detected within a shard only (a repeat whose first occurrence is in another shard is not
seen); `embedcli merge` reports ids repeated across shards.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from embedcli.errors import STDIN, UsageError
from embedcli.io.manifest import KEY_SHARD, KEY_SHARD_RANGE, KEY_SHARD_TOTAL
from embedcli.io.positions import BLOCK_LINES, ReadPoint
from embedcli.io.readers import detect_format
from embedcli.run.flags import RunFlags, parse_shard
from embedcli.run.grid import grid_of, start_point, stop_point
from embedcli.run.slices import first_batch
from embedcli.run.source import BatchSource


def shard_range(k: int, n: int, total: int) -> tuple[int, int]:
    """Cells `[start, stop)` of shard K of N over `total` cells."""
    return k * total // n, (k + 1) * total // n


@dataclass(frozen=True)
class RangeSource(BatchSource):
    """A `BatchSource` read from `start` to `stop` only (`ReadPoint`s; a stop with `line` -1 is a cut)."""

    start: ReadPoint | None = None
    stop: ReadPoint | None = None
    label: str = ""
    cells: tuple[int, int] = (0, 0)
    empty: bool = False  # the slice holds no record

    def open(self, paths: Any = None, **kwargs: Any) -> Any:
        if self.empty:
            kwargs["start"] = ReadPoint(len(self.paths()), 0, 0)
        elif kwargs.get("start") is None:
            kwargs["start"] = self.start
        kwargs["stop"] = self.stop
        return BatchSource.open(self, paths, **kwargs)

    def options(self) -> dict[str, Any]:
        # A shard is its own job: another range into the same -o refuses to mix.
        return {**super().options(), "shard": self.label, "cells": list(self.cells)}


def shard_source(source: Any, shard: str, flags: RunFlags, chars: int | None) -> tuple[RangeSource, dict[str, str]]:
    """The slice `--shard K/N` of `source`, and the metadata keys its output carries (`chars`: the run's
    batch text cap, which spaces the cuts)."""
    if not isinstance(source, BatchSource):
        raise UsageError("--shard needs input files (the slices are cut by their sizes before the run)")
    k, n = parse_shard(shard)
    paths = source.paths()
    if STDIN in paths:
        raise UsageError("--shard needs input files, not - (stdin): the slices are cut by their sizes before the run")
    block = min(BLOCK_LINES, source.inputs.batch_rows, flags.shard_rows)
    grid = grid_of(paths, source.inputs.fmt, chars, block)
    if grid is None:
        raise UsageError("--shard needs input files that can be sized and read again")
    a, b = shard_range(k, n, grid.cells)
    fmts = [detect_format(p, source.inputs.fmt) for p in paths]
    start: ReadPoint | None = None
    empty = a >= b
    if not empty and a > 0:
        first = first_batch(source, paths, min(source.inputs.batch_rows, flags.shard_rows), chars, grid.cuts)
        start = start_point(paths, fmts, grid.locate(a), {"spec": first.state}, block)
        empty = start is None
    stop = stop_point(paths, fmts, grid.locate(b), block) if b < grid.cells else None
    ranged = RangeSource(source.inputs, source.extra_text_cols, start=start, stop=stop, label=f"{k}/{n}",
                         cells=(a, b), empty=empty)
    meta = {KEY_SHARD: f"{k}/{n}", KEY_SHARD_RANGE: f"{a}:{b}", KEY_SHARD_TOTAL: str(grid.cells)}
    return ranged, meta
