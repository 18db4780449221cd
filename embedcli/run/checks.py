"""Reading and checking rows: the work items of a run, with bad rows failed on or set aside.

A work item accounts for the bad rows the reader reported while reading its batch plus the batch's
records; records committed by an earlier run are read and dropped, never computed (their ids still
count for duplicate detection).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from embedcli.errors import InputError, TooManyErrors, display_path
from embedcli.run.flags import RunFlags
from embedcli.run.ids import IdSet
from embedcli.run.source import BatchSource, null_text_error, slice_batch, subset

NULL_FIX = "fill in the text or drop the row (or pass --on-error skip)"


@dataclass
class Work:
    """One batch's worth of records: the valid rows, what to compute and carry over, and the bad rows."""

    records: int
    batch: Any = None
    compute: Any = None
    compute_idx: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    carry_idx: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    carry_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    keys: np.ndarray | None = None
    errors: list[InputError] = field(default_factory=list)


def valid_rows(batch: Any) -> list[int]:
    """Indices of the rows whose text (and every extra text) is there."""
    extra = list(batch.extra_texts.values())
    return [i for i, t in enumerate(batch.texts) if t is not None and all(col[i] is not None for col in extra)]


class RowChecks:
    """Null texts, repeated ids and `--max-errors` over a whole run; fail mode raises the first bad row."""

    def __init__(self, flags: RunFlags, errors_before: int = 0) -> None:
        self.skip_mode = flags.on_error == "skip"
        self.limit = flags.max_errors
        self.total = errors_before
        self.ids = IdSet()

    def seen(self, batch: Any) -> None:
        """Register the ids of records an earlier run committed (they are not checked again)."""
        if len(batch):
            valid = valid_rows(batch)
            self.ids.add(batch.source, [batch.ids[i] for i in valid], [batch.locations[i] for i in valid])

    def check(self, batch: Any, pending: list[InputError]) -> Work:
        """The work item of a batch and the bad rows the reader reported with it."""
        errors = list(pending)
        n = len(batch)
        valid = valid_rows(batch)
        for i in sorted(set(range(n)) - set(valid)):
            errors.append(self._bad(null_text_error(batch, i, NULL_FIX)))
        repeats = self.ids.add(batch.source, [batch.ids[i] for i in valid], [batch.locations[i] for i in valid])
        drop = set()
        for j, packed in repeats:
            i = valid[j]
            first_file, first_where = self.ids.describe(packed)
            errors.append(self._bad(InputError(
                batch.source,
                f"duplicate id {batch.ids[i]!r}: first seen at {display_path(first_file)} {first_where}",
                location=batch.locations[i],
                record_id=batch.ids[i],
                fix="give every row a unique id (or pass --on-error skip to keep the first and skip the rest)",
            )))
            drop.add(i)
        keep = np.asarray([i for i in valid if i not in drop], dtype=np.int64)
        self.count(errors)
        return Work(records=len(pending) + n, batch=subset(batch, keep), errors=errors)

    def _bad(self, err: InputError) -> InputError:
        if not self.skip_mode:
            raise err
        return err

    def count(self, errors: list[InputError]) -> None:
        """Add skipped rows to the run's total; TooManyErrors past `--max-errors`."""
        self.total += len(errors)
        if self.limit is None or self.total <= self.limit or not errors:
            return
        last = errors[-1]
        raise TooManyErrors(
            last.path,
            f"more than {self.limit} bad rows (--max-errors {self.limit}); the last: {last.reason}",
            location=last.location,
            record_id=last.record_id,
            fix="fix the input, or raise --max-errors; the rows committed so far are kept",
        )


def read_work(
    batches: Iterable[Any],
    paths: list[str] | None,
    flags: RunFlags,
    skip: int,
    errors_before: int,
    split: Callable[[Work], None],
    seconds: dict[str, float],
    batch_chars: int | None = None,
) -> Iterator[Work]:
    """Read, check and `split` batches into work items, `skip` records first (runs in the engine's prefetch
    thread); read time is added to `seconds["read"]`; `batch_chars` caps a batch's text (see `read_inputs`)."""
    checks = RowChecks(flags, errors_before)
    pending: list[InputError] = []  # filled by the reader under --on-error skip
    if isinstance(batches, BatchSource):
        batch_rows = min(batches.inputs.batch_rows, flags.shard_rows)
        on_bad = pending.append if checks.skip_mode else None
        reader = batches.open(paths, batch_rows=batch_rows, on_bad_row=on_bad, batch_chars=batch_chars)
    else:
        reader = iter(batches)
    skip_left = skip
    while True:
        t0 = time.perf_counter()
        batch = next(reader, None)
        seconds["read"] += time.perf_counter() - t0
        if batch is None:
            break
        if skip_left:
            reported = min(len(pending), skip_left)
            del pending[:reported]
            skip_left -= reported
            head = batch if len(batch) <= skip_left else slice_batch(batch, 0, skip_left)
            checks.seen(head)
            skip_left -= len(head)
            if len(batch) == len(head):
                continue
            batch = slice_batch(batch, len(head))
        work = checks.check(batch, pending)
        pending.clear()
        split(work)
        yield work
    if skip_left:
        del pending[: min(len(pending), skip_left)]
    if pending:
        checks.count(pending)
        yield Work(records=len(pending), errors=list(pending))
