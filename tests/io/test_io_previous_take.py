"""Rows of a previous output taken by row number (`embedcli.io.previous._Segments.take`, what an assembly
reads of it): in any order, across row groups and files, as a plain gather of the whole table gives them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embedcli.io.previous import _Segments


def _files(tmp_path: Path, sizes: list[int], group: int) -> list[str]:
    whole = pa.table({"id": [f"r{i}" for i in range(sum(sizes))], "x": np.arange(sum(sizes), dtype=np.float32)})
    files, at = [], 0
    for k, n in enumerate(sizes):
        path = tmp_path / f"part-{k}.parquet"
        pq.write_table(whole.slice(at, n), path, row_group_size=group)
        files.append(str(path))
        at += n
    return files


@pytest.mark.parametrize(
    "rows",
    [
        [5, 6, 7, 95, 96, 3, 4, 250, 0],  # back and forth between row groups (lines moved in a rerun)
        [99, 100, 101, 102],  # a run over a row-group boundary
        [260, 259, 10, 11, 12, 180, 181, 9],  # across files, then back
        list(range(300))[::-1],  # every row, backwards
    ],
    ids=["back-and-forth", "over-a-boundary", "across-files", "backwards"],
)
def test_rows_in_any_order_are_the_rows_asked_for(tmp_path: Path, rows: list[int]) -> None:
    files = _files(tmp_path, [200, 100], group=100)
    taken = _Segments(files).take(np.asarray(rows, np.int64), ["id", "x"])
    assert taken.column("id").to_pylist() == [f"r{r}" for r in rows]
    assert taken.column("x").to_pylist() == [float(r) for r in rows]
