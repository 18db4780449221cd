"""A slice's rows dropped by the driver (ids an earlier slice committed) unmark the blocks that lose them
(`embedcli.io.shard_files._unmarked`): a mark says every record of the block became a row, and a later rerun
carries a marked block over as that many rows."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from embedcli.io.shard_files import _unmarked
from embedcli.io.shards import KEY_TYPE


def _index(marks: dict[int, int], n: int = 40) -> pa.Table:
    return pa.table({
        "key": pa.array([b"k" * 16] * n, KEY_TYPE),
        "block": pa.array([b"b" * 16 if i in marks else None for i in range(n)], KEY_TYPE),
        "block_rows": pa.array([marks.get(i) for i in range(n)], pa.int32()),
    })


@pytest.mark.parametrize(
    ("dropped", "kept"),
    [([20], {0: 16, 32: 8}), ([39], {0: 16, 16: 16}), ([0, 31], {32: 8}), ([], {0: 16, 16: 16, 32: 8})],
)
def test_blocks_that_lose_a_row_are_unmarked(dropped: list[int], kept: dict[int, int]) -> None:
    out = _unmarked(_index({0: 16, 16: 16, 32: 8}), np.asarray(dropped, np.int64))
    sizes = out.column("block_rows").to_pylist()
    assert {i: v for i, v in enumerate(sizes) if v is not None} == kept
    assert [i for i, b in enumerate(out.column("block").to_pylist()) if b is not None] == sorted(kept)
