"""Pools: consecutive work items whose rows to compute go to the engine as one batch.

The local loop and a Ray worker's slice (`embedcli.run.slice_work`) group their work items the same way,
so a slice's packed forwards are the local run's: rows to compute scattered over many batches or small files
share forwards, and a pool always ends at a cut of the run (`embedcli.run.grid`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from embedcli.errors import InputError
from embedcli.run.checks import Work, joined

POOL_RECORDS_PER_ROW = 64
"""A pool spans at most this many times a batch's rows in records (rows carried over count): a stretch carried
over commits now and then, while rows to compute 1% apart still fill a pool's forwards as rows appended together
do."""


@dataclass
class Pool:
    """Consecutive work items whose rows to compute go to the engine as one batch: the loop's unit of
    work (progress, `--commit-every` and a clean stop act between pools)."""

    works: list[Work]
    compute: Any = None
    compute_rows: int = 0
    records: int = 0

    @property
    def errors(self) -> list[InputError]:
        """The bad rows its work items' reading and checks found, in input order."""
        return [e for w in self.works for e in w.errors]


def pooled(works: Iterable[Work], rows: int, chars: int | None) -> Iterator[Pool]:
    """Work items grouped into pools: a pool closes after the work item that brings its rows to compute to
    `rows` rows or `chars` characters of text, its records to `rows * POOL_RECORDS_PER_ROW`, or that ends at a
    cut of the run (`embedcli.run.grid`). Rows to compute scattered over many batches or files share forwards;
    the cut depends on the data (and the previous output) only, so a resumed run pools the same rows."""
    records = rows * POOL_RECORDS_PER_ROW
    current: list[Work] = []
    n_rows = n_chars = n_records = 0
    for work in works:
        current.append(work)
        compute = work.compute
        if compute is not None:
            n_rows += len(compute)
            if chars is not None:
                n_chars += sum(len(t) for t in compute.texts if t is not None)
        n_records += work.records
        if work.grid_end or n_rows >= rows or (chars is not None and n_chars >= chars) or n_records >= records:
            yield Pool(current, joined(current), n_rows, n_records)
            current, n_rows, n_chars, n_records = [], 0, 0, 0
    if current:
        yield Pool(current, joined(current), n_rows, n_records)
