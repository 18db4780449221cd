"""Atomic result writers: Parquet, JSONL (file and stdout), .npy, and the vector-column helpers."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embedcli.io.errors import OutputError
from embedcli.io.writers import (
    JsonlResultWriter,
    NpyResultWriter,
    ParquetResultWriter,
    check_output_path,
    embedding_array,
    embedding_matrix,
    embedding_type,
    open_writer,
    output_format,
    temp_path,
)

META = {"embedcli.model": "sentence-transformers/all-MiniLM-L6-v2", "embedcli.dtype": "float32"}


def results(start: int, n: int, d: int = 4, dtype: type = np.float32) -> pa.Table:
    rng = np.random.default_rng(start)
    vectors = (
        rng.standard_normal((n, d)).astype(dtype)
        if dtype in (np.float32, np.float16)
        else rng.integers(-100, 100, (n, d)).astype(dtype)
    )
    return pa.table(
        {
            "id": pa.array([f"r{i}" for i in range(start, start + n)], pa.string()),
            "embedding": embedding_array(vectors),
        }
    )


# --------------------------------------------------------------------------------------------------
# Parquet


def test_parquet_round_trip_type_metadata_and_row_groups(tmp_path: Path) -> None:
    out = tmp_path / "emb.parquet"
    parts = [results(0, 5), results(5, 3)]
    with open_writer(str(out), parts[0].schema, META) as w:
        assert isinstance(w, ParquetResultWriter)
        for t in parts:
            w.write(t)
        w.write(parts[0].to_batches()[0].slice(0, 0))  # a RecordBatch, even an empty one
    pf = pq.ParquetFile(out)
    assert pf.num_row_groups >= 2
    table = pf.read()
    assert table.schema.field("embedding").type == pa.list_(pa.float32(), 4)
    t = table.schema.field("embedding").type
    assert pa.types.is_fixed_size_list(t) and t.value_type == pa.float32() and t.list_size == 4
    assert {k.decode(): v.decode() for k, v in table.schema.metadata.items()} == META
    assert pf.metadata.row_group(0).column(0).compression == "ZSTD"
    expected = pa.concat_tables(parts)
    assert table.column("id").to_pylist() == expected.column("id").to_pylist()
    np.testing.assert_array_equal(
        embedding_matrix(table.column("embedding")), embedding_matrix(expected.column("embedding"))
    )


def test_parquet_readable_by_duckdb(tmp_path: Path) -> None:
    duckdb = pytest.importorskip("duckdb")
    out = tmp_path / "emb.parquet"
    t = results(0, 3)
    with open_writer(str(out), t.schema, META) as w:
        w.write(t)
    rows = duckdb.sql(
        f"SELECT id, embedding, len(embedding) AS d FROM read_parquet('{out}') ORDER BY id"
    ).fetchall()
    assert [r[0] for r in rows] == ["r0", "r1", "r2"] and {r[2] for r in rows} == {4}
    np.testing.assert_allclose(
        np.array(rows[0][1], dtype=np.float32), embedding_matrix(t.column("embedding"))[0]
    )


def test_parquet_casts_batches_to_the_output_schema(tmp_path: Path) -> None:
    schema = pa.schema([("id", pa.string()), ("lang", pa.string())])
    out = tmp_path / "o.parquet"
    with ParquetResultWriter(str(out), schema, {}) as w:
        w.write(pa.table({"id": ["a"], "lang": pa.array([None], pa.null())}))  # an all-null kept column
        with pytest.raises(ValueError, match="do not match the output columns"):
            w.write(pa.table({"x": ["a"]}))
    assert pq.read_table(out).column("lang").to_pylist() == [None]


def test_staging_file_until_commit(tmp_path: Path) -> None:
    out = tmp_path / "emb.parquet"
    t = results(0, 2)
    w = open_writer(str(out), t.schema, META)
    w.write(t)
    assert temp_path(str(out)).startswith(str(tmp_path / f".emb.parquet.tmp-{os.getpid()}-"))
    (staged,) = tmp_path.glob(".emb.parquet.tmp-*")
    assert not out.exists()  # a reader never sees a half-written output
    w.commit()
    assert out.exists() and not staged.exists()
    w.commit()  # idempotent


@pytest.mark.parametrize("ext", [".parquet", ".jsonl", ".npy"])
def test_exception_inside_with_leaves_nothing(tmp_path: Path, ext: str) -> None:
    out = tmp_path / f"emb{ext}"
    t = results(0, 4)
    with pytest.raises(RuntimeError, match="model crashed"), open_writer(str(out), t.schema, META) as w:
        w.write(t)
        raise RuntimeError("model crashed")
    assert w.state == "aborted"
    assert os.listdir(tmp_path) == []


def test_abort_keeps_the_previous_output(tmp_path: Path) -> None:
    out = tmp_path / "emb.parquet"
    old = results(0, 2)
    with open_writer(str(out), old.schema, META) as w:
        w.write(old)
    w2 = open_writer(str(out), old.schema, META)
    w2.write(results(10, 5))
    w2.abort()
    assert pq.read_table(out).column("id").to_pylist() == ["r0", "r1"]
    assert sorted(os.listdir(tmp_path)) == ["emb.parquet"]


# --------------------------------------------------------------------------------------------------
# JSONL


def test_jsonl_file_and_sidecar(tmp_path: Path) -> None:
    out = tmp_path / "emb.jsonl"
    t = results(0, 3).append_column("lang", pa.array(["en", "dé", None]))
    with open_writer(str(out), t.schema, META) as w:
        assert isinstance(w, JsonlResultWriter)
        w.write(t.slice(0, 2))
        w.write(t.slice(2))
    lines = out.read_text(encoding="utf-8").splitlines()
    rows = [json.loads(line) for line in lines]
    assert [r["id"] for r in rows] == ["r0", "r1", "r2"]
    assert [r["lang"] for r in rows] == ["en", "dé", None] and "dé" in lines[1]  # UTF-8, not \u escapes
    vectors = np.array([r["embedding"] for r in rows], dtype=np.float32)
    np.testing.assert_array_equal(vectors, embedding_matrix(t.column("embedding")))  # float32 exact
    side = json.loads((tmp_path / "emb.jsonl.meta.json").read_text())
    assert side["metadata"] == META and side["rows"] == 3 and side["format"] == "jsonl"
    assert sorted(os.listdir(tmp_path)) == ["emb.jsonl", "emb.jsonl.meta.json"]


def test_jsonl_lists_nans_and_other_types(tmp_path: Path) -> None:
    out = tmp_path / "o.jsonl"
    t = pa.table(
        {
            "token_ids": pa.array([[1, 2, 3], [], [4]], pa.list_(pa.int32())),
            "scores": pa.array([[0.5, float("nan")], [float("inf")], None], pa.list_(pa.float32())),
            "v": embedding_array(np.array([[1, -2], [3, 4], [5, 6]], dtype=np.int8)),
        }
    )
    with JsonlResultWriter(str(out), {}) as w:
        w.write(t.slice(1))  # sliced arrays keep the right offsets
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["token_ids"] for r in rows] == [[], [4]]
    assert rows[0]["scores"] == [float("inf")] and rows[1]["scores"] is None
    assert [r["v"] for r in rows] == [[3, 4], [5, 6]]


def test_jsonl_to_stdout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    t = results(0, 2)
    with open_writer("-", t.schema, META) as w:
        w.write(t)
    out, err = capsys.readouterr()
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["id"] for r in rows] == ["r0", "r1"] and len(rows[0]["embedding"]) == 4
    assert err == ""
    assert os.listdir(tmp_path) == []  # no sidecar, no staging file for stdout


# --------------------------------------------------------------------------------------------------
# .npy


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int8, np.uint8])
def test_npy_round_trip(tmp_path: Path, dtype: type) -> None:
    out = tmp_path / "emb.npy"
    parts = [results(0, 5, d=3, dtype=dtype), results(5, 2, d=3, dtype=dtype)]
    with open_writer(str(out), parts[0].schema, META) as w:
        assert isinstance(w, NpyResultWriter)
        for t in parts:
            w.write(t)
    arr = np.load(out)
    expected = np.concatenate([embedding_matrix(t.column("embedding")) for t in parts])
    assert arr.dtype == np.dtype(dtype) and arr.shape == (7, 3)
    np.testing.assert_array_equal(arr, expected)
    np.testing.assert_array_equal(np.load(out, mmap_mode="r"), expected)
    ids = [json.loads(line) for line in (tmp_path / "emb.npy.ids.jsonl").read_text().splitlines()]
    assert ids == [f"r{i}" for i in range(7)]
    side = json.loads((tmp_path / "emb.npy.meta.json").read_text())
    assert side["shape"] == [7, 3] and side["metadata"] == META and side["ids_file"] == "emb.npy.ids.jsonl"


def test_npy_empty_output(tmp_path: Path) -> None:
    out = tmp_path / "empty.npy"
    schema = results(0, 1, d=8).schema
    with NpyResultWriter(str(out), META, schema=schema):
        pass
    arr = np.load(out)
    assert arr.shape == (0, 8) and arr.dtype == np.float32


def test_npy_rejects_ragged_vectors(tmp_path: Path) -> None:
    schema = pa.schema([("id", pa.string()), ("embeddings", pa.list_(pa.list_(pa.float32())))])
    with pytest.raises(OutputError, match=r"\.npy .* needs a 'embedding' column"):
        open_writer(str(tmp_path / "tok.npy"), schema, META)


# --------------------------------------------------------------------------------------------------
# Unwritable outputs and format choice


def test_missing_directory(tmp_path: Path) -> None:
    target = tmp_path / "no" / "such" / "emb.parquet"
    with pytest.raises(OutputError, match="does not exist") as e:
        open_writer(str(target), results(0, 1).schema, META)
    assert str(target) in str(e.value) and "mkdir -p" in str(e.value)
    for ext in (".jsonl", ".npy"):
        with pytest.raises(OutputError, match="does not exist"):
            open_writer(str(tmp_path / "nope" / f"e{ext}"), results(0, 1).schema, META)


def test_output_is_a_directory(tmp_path: Path) -> None:
    with pytest.raises(OutputError, match="is a directory"):
        open_writer(str(tmp_path), results(0, 1).schema, META)
    (tmp_path / "file").write_text("")
    with pytest.raises(OutputError, match="is not a directory"):
        check_output_path(str(tmp_path / "file" / "emb.parquet"))


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root ignores permissions")
def test_permission_denied(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(OutputError, match="permission denied"):
            open_writer(str(locked / "emb.parquet"), results(0, 1).schema, META)
    finally:
        locked.chmod(0o700)


def test_permission_denied_reported_before_any_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("embedcli.io.writers.os.access", lambda *_: False)  # works as root too
    with pytest.raises(OutputError, match="permission denied: cannot create files in"):
        open_writer(str(tmp_path / "emb.jsonl"), results(0, 1).schema, META)
    assert os.listdir(tmp_path) == []


def test_output_format_choice() -> None:
    assert output_format("a.parquet") == "parquet"
    assert output_format("a") == "parquet"  # no extension: the default
    assert output_format("a.out", reading=True) == "parquet"  # an existing output of unknown kind
    with pytest.raises(OutputError, match=r"cannot write '\.out' files"):
        output_format("a.out")  # never Parquet bytes under a name that promises another format
    assert output_format("a.NDJSON") == "jsonl"
    assert output_format("a.npy") == "npy"
    assert output_format("a.bin", "npy") == "npy"
    assert output_format("-") == "jsonl"
    with pytest.raises(OutputError, match="parquet cannot be written to stdout"):
        output_format("-", "parquet")


# --------------------------------------------------------------------------------------------------
# Vector columns


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64, np.int8, np.uint8])
def test_embedding_array_dtypes(dtype: type) -> None:
    v = (np.arange(12).reshape(3, 4) % 7).astype(dtype)
    arr = embedding_array(v)
    assert arr.type == embedding_type(4, dtype) and len(arr) == 3
    np.testing.assert_array_equal(embedding_matrix(arr), v)
    np.testing.assert_array_equal(embedding_matrix(arr.slice(1, 2)), v[1:])
    np.testing.assert_array_equal(embedding_matrix(pa.chunked_array([arr.slice(0, 1), arr.slice(1)])), v)


def test_embedding_array_checks() -> None:
    with pytest.raises(ValueError, match="2-D"):
        embedding_array(np.zeros(3, np.float32))
    with pytest.raises(TypeError, match="unsupported vector dtype"):
        embedding_array(np.zeros((2, 2), np.int64))
    assert len(embedding_array(np.zeros((0, 5), np.float32))) == 0
    assert embedding_array(np.asfortranarray(np.ones((2, 3), np.float32))).type == pa.list_(pa.float32(), 3)


def test_npy_refuses_columns_it_would_drop(tmp_path: Path) -> None:
    """(`merge -o x.npy` of shards with kept columns wrote the vectors and ids alone, at exit 0.)"""
    schema = results(0, 1, d=8).schema.append(pa.field("topic", pa.string()))
    with pytest.raises(OutputError, match=r"\.npy holds the 'embedding' vectors and the ids only, not 'topic'"):
        open_writer(str(tmp_path / "emb.npy"), schema, META)
    assert list(tmp_path.iterdir()) == []
