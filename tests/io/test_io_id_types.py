"""The output's `id` column keeps the input's id type (issue 15, section 2): a Parquet input's from its schema,
a JSONL input's from its values (a row of another type is a bad row at its line); CSV, text and default
`file:line` ids stay strings."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

N = 2100  # past two reader batches of 1,024 rows


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize(
    ("ids", "expected"),
    [
        ([i * 7 for i in range(N)], pa.int64()),
        ([f"r{i}" for i in range(N)], pa.string()),
    ],
)
def test_jsonl_ids_keep_their_json_type(cli, st_model: Path, tmp_path: Path, ids: list, expected) -> None:
    src = _jsonl(tmp_path / "in.jsonl", [{"id": i, "text": f"text {j}"} for j, i in enumerate(ids)])
    out = tmp_path / "out.parquet"
    cli("embed", src, "-m", st_model, "-o", out, "-q")
    got = pq.read_table(out)
    assert got.schema.field("id").type == expected
    assert got.column("id").to_pylist() == ids


@pytest.mark.parametrize("id_type", [pa.int32(), pa.int64(), pa.uint16(), pa.string(), pa.large_string()])
def test_parquet_id_column_keeps_the_file_type(cli, st_model: Path, tmp_path: Path, id_type) -> None:
    src = tmp_path / "in.parquet"
    ids = pa.array([str(i * 3) for i in range(50)]).cast(id_type)
    pq.write_table(pa.table({"id": ids, "text": [f"text {i}" for i in range(50)]}), src)
    out = tmp_path / "out.parquet"
    cli("embed", src, "-m", st_model, "-o", out, "-q")
    got = pq.read_table(out)
    assert got.schema.field("id").type == id_type
    assert got.column("id").to_pylist() == ids.to_pylist()


@pytest.mark.parametrize("line", [1, 1501])  # in the batch that fixes the type, and in a later one
def test_jsonl_string_id_among_integers_is_a_bad_row(cli, st_model: Path, tmp_path: Path, line: int) -> None:
    rows = [{"id": i, "text": f"text {i}"} for i in range(N)]
    rows[line]["id"] = "x"  # the record on line `line + 1`
    src = _jsonl(tmp_path / "in.jsonl", rows)
    out, errors = tmp_path / "out.parquet", tmp_path / "errors.jsonl"
    r = cli("embed", src, "-m", st_model, "-o", out, "-q", "--on-error", "skip", "--errors-file", errors, code=3)
    assert "Traceback" not in r.stderr
    bad = [json.loads(x) for x in errors.read_text().splitlines()]
    assert [e["location"] for e in bad] == [f"line {line + 1}"] and "id field 'id' is str" in bad[0]["reason"]
    got = pq.read_table(out)
    assert got.num_rows == N - 1 and got.schema.field("id").type == pa.int64()
    assert "x" not in got.column("id").to_pylist()


def test_jsonl_integer_id_among_strings_is_kept_as_its_string(cli, st_model: Path, tmp_path: Path) -> None:
    # A string id column can hold any id: the integer is written as its digits (no bad row, as before).
    rows = [{"id": f"r{i}", "text": f"text {i}"} for i in range(N)]
    rows[1500]["id"] = 7
    src = _jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.parquet"
    cli("embed", src, "-m", st_model, "-o", out, "-q")
    got = pq.read_table(out)
    assert got.schema.field("id").type == pa.string() and got.column("id").to_pylist()[1500] == "7"


def test_csv_and_default_ids_stay_strings(cli, st_model: Path, tmp_path: Path) -> None:
    csv = tmp_path / "in.csv"
    csv.write_text("id,text\n1,one\n2,two\n")
    out = tmp_path / "csv.parquet"
    cli("embed", csv, "-m", st_model, "-o", out, "-q")
    assert pq.read_table(out).column("id").to_pylist() == ["1", "2"]
    plain = _jsonl(tmp_path / "plain.jsonl", [{"text": "one"}, {"text": "two"}])
    out = tmp_path / "plain.parquet"
    cli("embed", plain, "-m", st_model, "-o", out, "-q")
    got = pq.read_table(out)
    assert got.schema.field("id").type == pa.string() and got.column("id").to_pylist() == ["plain.jsonl:1", "plain.jsonl:2"]


def test_inputs_with_different_id_types_are_refused_by_name(cli, st_model: Path, tmp_path: Path) -> None:
    a = _jsonl(tmp_path / "a.jsonl", [{"id": 1, "text": "one"}])
    b = tmp_path / "b.csv"
    b.write_text("id,text\n2,two\n")
    r = cli("embed", a, b, "-m", st_model, "-o", tmp_path / "out.parquet", "-q", code=1)  # an input error, as kept columns'
    assert "Traceback" not in r.stderr
    assert "b.csv" in r.stderr and "int64 in an earlier input" in r.stderr
    # The other order is a string run: the integer ids are written as strings.
    out = tmp_path / "both.parquet"
    cli("embed", b, a, "-m", st_model, "-o", out, "-q")
    got = pq.read_table(out)
    assert got.schema.field("id").type == pa.string() and got.column("id").to_pylist() == ["2", "1"]
    c = tmp_path / "c.parquet"  # a Parquet int id column in a string run: written as strings too
    pq.write_table(pa.table({"id": pa.array([3], pa.int32()), "text": ["three"]}), c)
    cli("embed", b, c, "-m", st_model, "-o", out, "-q", "--overwrite")
    assert pq.read_table(out).column("id").to_pylist() == ["2", "3"]


def test_zero_row_output_has_the_parquet_id_type(cli, st_model: Path, tmp_path: Path) -> None:
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": pa.array([], pa.int32()), "text": pa.array([], pa.string())}), src)
    out = tmp_path / "out.parquet"
    cli("embed", src, "-m", st_model, "-o", out, "-q")
    got = pq.read_table(out)
    assert got.num_rows == 0 and got.schema.field("id").type == pa.int32()


def test_incremental_rerun_over_int_ids_carries_rows_over(cli, st_model: Path, tmp_path: Path) -> None:
    rows = [{"id": i, "text": f"text {i}"} for i in range(40)]
    src = _jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.parquet"
    cli("embed", src, "-m", st_model, "-o", out, "-q")
    before = pq.read_table(out)
    same = tmp_path / "same.parquet"  # every row carried over: the ids come from the input, not the old output
    cli("embed", src, "-m", st_model, "-o", same, "-q", "--incremental", "--previous", out)
    assert pq.read_table(same).schema.field("id").type == pa.int64()
    rows[3]["text"] = "changed"
    _jsonl(src, rows)
    stats, again = tmp_path / "stats.json", tmp_path / "again.parquet"
    cli("embed", src, "-m", st_model, "-o", again, "-q", "--incremental", "--previous", out, "--stats", stats)
    after = pq.read_table(again)
    assert after.schema.field("id").type == pa.int64() and after.column("id").to_pylist() == list(range(40))
    s = json.loads(stats.read_text())
    assert s["carried_rows"] == 39 and s["computed_rows"] == 1, s
    same = [i for i in range(40) if i != 3]
    assert after.take(same).column("embedding").equals(before.take(same).column("embedding"))


@pytest.mark.parametrize("command", ["rerank", "token-embed"])
def test_other_commands_keep_int_ids(cli, st_model: Path, tmp_path: Path, command: str) -> None:
    src = _jsonl(tmp_path / "in.jsonl", [{"id": 5 + i, "text": f"text {i}"} for i in range(4)])
    out = tmp_path / "out.parquet"
    cli(command, src, "-m", st_model, "-o", out, "-q", *(("--query", "text 2") if command == "rerank" else ()))
    got = pq.read_table(out)
    assert got.schema.field("id").type == pa.int64() and sorted(got.column("id").to_pylist()) == [5, 6, 7, 8]


@pytest.mark.parametrize(
    ("ids", "kept", "id_type", "bad"),
    [
        ([2**70, 1], ["1180591620717411303424", "1"], pa.string(), []),  # past int64 first: a string run
        ([1, 2**70], ["1"], pa.int64(), ["line 2"]),  # past int64 in an int64 run: a bad row, named
    ],
)
def test_jsonl_integer_ids_past_64_bits(tmp_path: Path, ids: list, kept: list, id_type, bad: list) -> None:
    from embedcli.io.readers import read_inputs

    src = _jsonl(tmp_path / "in.jsonl", [{"id": i, "text": "t"} for i in ids])
    errors: list = []
    batches = list(read_inputs([str(src)], on_bad_row=errors.append))
    assert [b.id_array().type for b in batches] == [id_type]
    assert batches[0].id_array().to_pylist() == ([int(k) for k in kept] if id_type == pa.int64() else kept)
    assert [e.location for e in errors] == bad
    assert all("past 64 bits" in e.reason for e in errors)
