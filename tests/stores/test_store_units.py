"""Store pieces without a store: target URLs, the resume point, the stored schema, what is present."""

from __future__ import annotations

import sys

import numpy as np
import pyarrow as pa
import pytest

from embedcli.errors import EXIT_USAGE, UsageError
from embedcli.io.stores import KEY_COLUMN, ResumePoint, StoreSchema, is_store_url, open_store, redact
from embedcli.io.stores.present import PresentRows
from embedcli.io.stores.url import parse_lance, parse_postgres


@pytest.mark.parametrize(
    ("url", "directory", "table"),
    [("lancedb://db/docs", "db", "docs"), ("lancedb:///abs/db/docs/", "/abs/db", "docs"),
     ("lancedb://./x/y/t_1.lance", "x/y", "t_1")],
)
def test_lance_urls(url: str, directory: str, table: str) -> None:
    import os

    target = parse_lance(url)
    assert (target.directory, target.table) == (os.path.abspath(directory), table)


@pytest.mark.parametrize("url", ["lancedb://docs", "lancedb://db/", "lancedb://db/bad-name", "lancedb://s3://b/db/t"])
def test_bad_lance_urls_are_usage_errors(url: str) -> None:
    with pytest.raises(UsageError) as e:
        parse_lance(url)
    assert e.value.exit_code == EXIT_USAGE


def test_postgres_url_keeps_libpq_parts_and_takes_embedcli_ones() -> None:
    t = parse_postgres("postgresql://me:s3cret@db.example:5433/search?sslmode=require&table=vec.docs&index=hnsw&metric=l2")
    assert t.conninfo == "postgresql://me:s3cret@db.example:5433/search?sslmode=require"
    assert (t.schema, t.table, t.index, t.metric) == ("vec", "docs", "hnsw", "l2")
    assert "s3cret" not in t.display and "me:***@db.example" in t.display
    assert parse_postgres("postgres:///?table=docs").conninfo == "postgresql:///"  # all from PG* variables
    assert "hunter2" not in redact("postgresql:///db?password=hunter2&table=t")


@pytest.mark.parametrize(
    "url", ["postgresql://me@h/db", "postgresql://me@h/db?table=a.b.c", "postgresql://me@h/db?table=x;drop",
            "postgresql://me@h/db?table=t&index=ivf", "postgresql://me:pw@h/db?table=t&metric=dot"],
)
def test_bad_postgres_urls_are_usage_errors_without_the_password(url: str) -> None:
    with pytest.raises(UsageError) as e:
        parse_postgres(url)
    assert ":pw@" not in str(e.value)


def test_store_urls() -> None:
    assert is_store_url("lancedb://db/t") and is_store_url("postgres://x/y?table=t")
    assert not is_store_url("out.parquet") and not is_store_url("s3://bucket/out.parquet")


def test_missing_client_library_is_one_usage_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "lancedb", None)
    monkeypatch.setitem(sys.modules, "psycopg", None)
    with pytest.raises(UsageError, match=r"pip install 'embedcli\[lancedb\]'"):
        open_store("lancedb://db/t")
    with pytest.raises(UsageError, match=r"pip install 'embedcli\[postgres\]'"):
        open_store("postgresql:///db?table=t")


def test_resume_point_round_trips_as_metadata() -> None:
    point = ResumePoint("job1", 40, complete=True, run={"embedcli.skipped_rows": "2"})
    assert ResumePoint.from_json(point.to_json()) == point
    assert point.metadata()["embedcli.input_records"] == "40"
    assert ResumePoint.from_json("not json") is None and ResumePoint.from_json(None) is None


def test_store_schema_of_an_output_table() -> None:
    schema = pa.schema([("id", pa.string()), ("embedding", pa.list_(pa.int8(), 2)), ("title", pa.null())])
    s = StoreSchema.of(schema, "binary", dims=12)
    assert (s.dims, s.width, s.kept) == (12, 2, (pa.field("title", pa.string()),))
    assert s.arrow().names == ["id", "embedding", "title", KEY_COLUMN]
    with pytest.raises(ValueError, match="may not be named"):
        StoreSchema(pa.int64(), pa.list_(pa.float32(), 4), kept=(pa.field(KEY_COLUMN, pa.string()),))
    with pytest.raises(ValueError, match="row keys"):
        s.rows(pa.table({"id": ["a"], "embedding": pa.array([[1, 2]], pa.list_(pa.int8(), 2)), "title": ["t"]}),
               np.zeros(2, "S16"))


def _keys(*values: int) -> np.ndarray:
    return np.array([v.to_bytes(16, "little") for v in values], dtype="S16")


def test_present_rows_tell_unchanged_rows_and_gone_ids() -> None:
    present = PresentRows([(pa.array([1, 2, 3]), _keys(1, 2, 3)), (pa.array([4, 5]), _keys(4, 5))], pa.int64())
    unchanged = present.match(pa.array([2, 3, 9], pa.int64()), _keys(2, 33, 9))
    assert unchanged.tolist() == [True, False, False]  # 3 changed its key, 9 is new
    present.match(pa.array([5], pa.int64()), None)  # committed earlier: only marked
    assert present.gone().to_pylist() == [1, 4]


def test_present_rows_of_an_empty_store() -> None:
    present = PresentRows([], pa.string())
    assert present.match(pa.array(["a"]), _keys(1)).tolist() == [False]
    assert present.gone().to_pylist() == []
