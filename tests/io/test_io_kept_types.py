"""Kept columns keep their types (issue 13, item 9): a Parquet input's schema is taken from the file, and a
JSONL field whose type changes is a bad row at its line, never a raw pyarrow traceback."""

from __future__ import annotations

import datetime
import decimal
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

N = 2100  # past two reader batches of 1,024 rows


def test_parquet_kept_columns_take_the_file_schema(cli, st_model: Path, tmp_path: Path) -> None:
    types = {
        "dec": pa.decimal128(12, 2),  # later values need more digits than the first batch's
        "ts": pa.timestamp("us"),  # null through the first batch
        "m": pa.map_(pa.string(), pa.int64()),
    }
    src = tmp_path / "in.parquet"
    pq.write_table(
        pa.table({
            "id": [f"r{i}" for i in range(N)],
            "text": [f"text {i}" for i in range(N)],
            "dec": pa.array([decimal.Decimal(i * 997) / 100 for i in range(N)], types["dec"]),
            "ts": pa.array([None] * 1500 + [datetime.datetime(2020, 1, 1)] * (N - 1500), types["ts"]),
            "m": pa.array([[("k", i)] for i in range(N)], types["m"]),
        }),
        src,
    )
    out = tmp_path / "out.parquet"
    cli("embed", src, "-m", st_model, "-o", out, "-q", "--keep-cols", "dec,ts,m")
    got = pq.read_table(out)
    assert {c: got.schema.field(c).type for c in types} == types
    assert got.column("dec").to_pylist() == pq.read_table(src).column("dec").to_pylist()
    assert got.column("m").to_pylist()[5] == [("k", 5)]


@pytest.mark.parametrize(
    ("value", "bad"),
    [
        (lambda i: i, "not a number"),
        (lambda i: i, 1500.5),  # pa.array cuts it to 1500 in an int64 column
        (lambda i: {"n": i}, {"n": 0.5}),
        (lambda i: [i], [1, 2.5]),
    ],
    ids=["str-in-int", "fraction-in-int", "fraction-in-struct", "fraction-in-list"],
)
def test_jsonl_kept_field_changing_type_is_a_bad_row(
    cli, st_model: Path, tmp_path: Path, value: Callable[[int], Any], bad: Any
) -> None:
    src = tmp_path / "in.jsonl"
    rows = [{"id": f"r{i}", "text": f"text {i}", "v": value(i)} for i in range(N)]
    rows[1500]["v"] = bad
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out, errors = tmp_path / "out.parquet", tmp_path / "errors.jsonl"
    r = cli("embed", src, "-m", st_model, "-o", out, "-q", "--keep-cols", "v", "--on-error", "skip",
            "--errors-file", errors, code=3)
    assert "Traceback" not in r.stderr
    bad = [json.loads(line) for line in errors.read_text().splitlines()]
    assert [(e["location"], e["id"]) for e in bad] == [("line 1501", "r1500")] and "'v'" in bad[0]["reason"]
    got = pq.read_table(out)
    assert got.column("v").to_pylist() == [r["v"] for r in rows if r["id"] != "r1500"]


def test_parquet_kept_types_survive_a_skipped_row(cli, st_model: Path, tmp_path: Path) -> None:
    # A bad row drops out of its batch (the batch is subset): the rest keep the file's types.
    src = tmp_path / "in.parquet"
    pq.write_table(
        pa.table({
            "id": [f"r{i}" for i in range(N)],
            "text": [None if i == 3 else f"text {i}" for i in range(N)],
            "ts": pa.array([None] * 1500 + [datetime.datetime(2020, 1, 1)] * (N - 1500), pa.timestamp("us")),
        }),
        src,
    )
    out = tmp_path / "out.parquet"
    r = cli("embed", src, "-m", st_model, "-o", out, "-q", "--keep-cols", "ts", "--on-error", "skip", code=3)
    assert "Traceback" not in r.stderr
    got = pq.read_table(out)
    assert got.num_rows == N - 1 and got.schema.field("ts").type == pa.timestamp("us")
