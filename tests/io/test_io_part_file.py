"""`PartFile`, the one writer of a shard's Parquet rows (a local run's shards, a Ray worker's slices, their
rewrites): nothing at the final name until `publish`, nothing left behind by `discard`, the old file kept
until the new one replaces it whole."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embedcli.io.shards import INDEX_SCHEMA, PartFile, index_bytes, rewrite_part

TABLE = pa.table({"id": ["a", "b", "c"], "embedding": pa.array([[1.0, 2.0]] * 3, pa.list_(pa.float32(), 2))})


@pytest.mark.parametrize("old", [None, b"the previous shard"])
def test_publish_replaces_whole_and_discard_leaves_nothing(tmp_path: Path, old: bytes | None) -> None:
    path = tmp_path / "shard-000000.parquet"
    if old is not None:
        path.write_bytes(old)
    part = PartFile(str(path), TABLE.schema, {"embedcli.model": "m"})
    part.write(TABLE.slice(0, 2))
    part.write(TABLE.slice(2))
    assert (path.read_bytes() if path.exists() else None) == old  # untouched before publish
    assert part.publish() == str(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]
    read = pq.read_table(path)
    assert read.to_pylist() == TABLE.to_pylist()
    assert read.schema.metadata == {b"embedcli.model": b"m"}

    again = PartFile(str(path), TABLE.schema)
    again.write(TABLE.slice(0, 1))
    again.discard()
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]
    assert pq.read_table(path).num_rows == 3


def test_publish_to_another_name(tmp_path: Path) -> None:
    part = PartFile(str(tmp_path / "slice-000003.parquet"), TABLE.schema)
    part.write(TABLE)
    target = tmp_path / "shard-000007.parquet"
    assert part.publish(str(target)) == str(target)
    assert [p.name for p in tmp_path.iterdir()] == [target.name]


def test_a_schema_that_does_not_open_leaves_no_temp_file(tmp_path: Path) -> None:
    bad = pa.schema([pa.field("x", pa.month_day_nano_interval())])  # no Parquet type for it
    with pytest.raises(pa.ArrowNotImplementedError):
        PartFile(str(tmp_path / "s.parquet"), bad)
    assert list(tmp_path.iterdir()) == []


def test_index_bytes_keeps_the_index_schema() -> None:
    rows = INDEX_SCHEMA.empty_table()
    back = pq.read_table(pa.BufferReader(index_bytes(rows)))
    assert back.schema.equals(INDEX_SCHEMA)


def test_rewrite_part_replaces_whole_or_keeps_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "slice-000001.parquet"
    rewrite_part(str(path), TABLE, TABLE.schema)
    old = path.read_bytes()
    wrong = pa.table({"other": [1, 2]})  # not the file's schema: the write fails
    with pytest.raises((ValueError, pa.ArrowInvalid)):
        rewrite_part(str(path), wrong, TABLE.schema)
    assert path.read_bytes() == old and [p.name for p in tmp_path.iterdir()] == [path.name]
    rewrite_part(str(path), TABLE.slice(1), TABLE.schema, {"k": "v"})
    back = pq.read_table(path)
    assert back.num_rows == 2 and back.schema.metadata == {b"k": b"v"}
