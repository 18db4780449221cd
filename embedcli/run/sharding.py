"""Static sharding (`--shard K/N`): one of N deterministic, contiguous slices of the input records.

For clusters without Ray (a Slurm array, several cron jobs): N independent runs of the same command with
`--shard 0/N` … `--shard N-1/N` and N different `-o` paths compute every input record exactly once.

The partition: the inputs (after glob expansion, in command-line order) are read once without computing
anything to count their records, `total`; shard K takes records `[K*total//N, (K+1)*total//N)`. A record is
what the resume manifest counts: a row a reader returned, or a bad row it reported (a malformed line, bad
UTF-8), in the order the shared loop sees them. Contiguous ranges keep input order, so joining the N outputs
by range start (`embedcli merge`) gives the rows of the unsharded run, in order.

Each shard output carries `embedcli.shard` (K/N), `embedcli.shard_range` (start:stop) and
`embedcli.shard_total` in its metadata next to the usual provenance; `embedcli inspect OUT-* --check` checks
the set is complete (every range once, same config, model and inputs) and `embedcli merge` joins it.

Duplicate ids are detected within a shard only (a repeat whose first occurrence is in another shard is not
seen); `embedcli merge` reports ids repeated across shards.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from embedcli.errors import STDIN, UsageError
from embedcli.io.manifest import KEY_SHARD, KEY_SHARD_RANGE, KEY_SHARD_TOTAL
from embedcli.run.flags import parse_shard
from embedcli.run.source import BatchSource, subset


def shard_range(k: int, n: int, total: int) -> tuple[int, int]:
    """Records `[start, stop)` of shard K of N over `total` records."""
    return k * total // n, (k + 1) * total // n


def _records(
    source: BatchSource, paths: Sequence[str] | None, batch_rows: int | None, batch_chars: int | None = None
) -> Iterator[tuple[list[Any], Any]]:
    """(bad rows reported while reading, batch) pairs of the raw readers, in the shared loop's order."""
    errors: list[Any] = []
    reader = BatchSource.open(source, paths, batch_rows=batch_rows, on_bad_row=errors.append, batch_chars=batch_chars)
    for batch in reader:
        reported = list(errors)
        errors.clear()
        yield reported, batch
    if errors:
        yield list(errors), None


def count_records(source: BatchSource, paths: Sequence[str] | None = None) -> int:
    """Input records (rows and bad rows), counted by reading every input once; nothing is computed."""
    return sum(len(errs) + (len(b) if b is not None else 0) for errs, b in _records(source, paths, None))


@dataclass(frozen=True)
class RangeSource(BatchSource):
    """A `BatchSource` restricted to records `[start, stop)`; the shared loop sees only those records."""

    start: int = 0
    stop: int = 0
    label: str = ""

    def open(
        self,
        paths: Sequence[str] | None = None,
        *,
        batch_rows: int | None = None,
        on_bad_row: Callable[[Any], None] | None = None,
        batch_chars: int | None = None,
        **run: Any,
    ) -> Iterator[Any]:
        if run:
            raise TypeError(f"a record range is read from the inputs' start: {sorted(run)} do not apply")
        pos = 0
        for errors, batch in _records(self, paths, batch_rows, batch_chars):
            if pos >= self.stop:
                return
            for e in errors:
                if self.start <= pos < self.stop:
                    if on_bad_row is None:
                        raise e
                    on_bad_row(e)
                pos += 1
            if batch is None:
                continue
            n = len(batch)
            lo, hi = max(self.start - pos, 0), min(self.stop - pos, n)
            pos += n
            if lo < hi:
                yield batch if (lo, hi) == (0, n) else subset(batch, np.arange(lo, hi))

    def options(self) -> dict[str, Any]:
        # A shard is its own job: another range into the same -o refuses to mix.
        return {**super().options(), "shard": self.label, "records": [self.start, self.stop]}


def shard_source(source: Any, shard: str) -> tuple[RangeSource, dict[str, str]]:
    """The records of `--shard K/N` of `source`, and the metadata keys its output carries."""
    if not isinstance(source, BatchSource):
        raise UsageError("--shard needs input files (the records are counted before the run)")
    k, n = parse_shard(shard)
    paths = source.paths()
    if STDIN in paths:
        raise UsageError("--shard needs input files, not - (stdin): the records are counted before the run")
    total = count_records(source, paths)
    start, stop = shard_range(k, n, total)
    ranged = RangeSource(source.inputs, source.extra_text_cols, start=start, stop=stop, label=f"{k}/{n}")
    meta = {KEY_SHARD: f"{k}/{n}", KEY_SHARD_RANGE: f"{start}:{stop}", KEY_SHARD_TOTAL: str(total)}
    return ranged, meta
