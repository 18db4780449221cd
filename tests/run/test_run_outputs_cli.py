"""Issue 13 through `embedcli embed` on real files and the tiny sentence-transformers model: an output that is
its own input is refused, kept columns never shadow result columns, an empty output keeps its kept columns,
and `--precision int8` refuses staged work of another config like every other path."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embedcli.io.manifest import Manifest, staging_dir


def _corpus(path: Path, n: int = 12, null_at: int | None = None) -> Path:
    rows = [{"id": f"d{i}", "text": None if i == null_at else f"row {i} text", "embedding": [0.5, 1.5]}
            for i in range(n)]
    if path.suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_embedding_a_corpus_into_itself_is_refused_and_the_corpus_kept(cli, st_model: Path, tmp_path: Path,
                                                                         suffix: str) -> None:
    corpus = _corpus(tmp_path / f"corpus{suffix}")
    before = corpus.read_bytes()
    result = cli("embed", corpus, "-m", st_model, "-o", corpus, "-q", code=2)
    assert "is the input" in result.stderr and "Traceback" not in result.stderr
    assert corpus.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [corpus.name]


@pytest.mark.parametrize("column", ["embedding", "id"])
def test_a_kept_column_may_not_shadow_a_result_column(cli, st_model: Path, tmp_path: Path, column: str) -> None:
    corpus = _corpus(tmp_path / "corpus.parquet")
    out = tmp_path / "out.parquet"
    result = cli("embed", corpus, "-m", st_model, "-o", out, "--keep-cols", column, "-q", code=2)
    assert f"--keep-cols {column}:" in result.stderr and not out.exists()


@pytest.mark.parametrize("precision", ["float32", "int8"])
def test_zero_rows_keep_the_kept_columns_in_the_schema(cli, st_model: Path, tmp_path: Path, precision: str) -> None:
    corpus = tmp_path / "empty.parquet"
    pq.write_table(pa.schema([("id", pa.string()), ("text", pa.string()), ("n", pa.int16())]).empty_table(), corpus)
    out = tmp_path / "out.parquet"
    cli("embed", corpus, "-m", st_model, "-o", out, "--keep-cols", "n", "--precision", precision, "-q")
    schema = pq.read_schema(out)
    assert schema.names == ["id", "embedding", "n"] and schema.field("n").type == pa.int16()


def test_int8_refuses_staged_work_of_another_config_unless_overwrite(cli, st_model: Path, tmp_path: Path) -> None:
    corpus = _corpus(tmp_path / "corpus.jsonl", n=40, null_at=30)
    out = tmp_path / "out.parquet"
    # a float32 run stopped by a bad row after committing 3 shards: its work waits in the staging directory
    cli("embed", corpus, "-m", st_model, "-o", out, "--shard-rows", 10, "-q", code=1)
    staged = Manifest.load(staging_dir(str(out)))
    assert staged is not None and staged.records_done == 30
    _corpus(corpus, n=40)  # the row is fixed; rerunning the float32 command would finish that work
    result = cli("embed", corpus, "-m", st_model, "-o", out, "--precision", "int8", "-q", code=2)
    assert "interrupted run with a different config" in result.stderr and not out.exists()
    again = Manifest.load(staging_dir(str(out)))
    assert again is not None and again.records_done == 30
    cli("embed", corpus, "-m", st_model, "-o", out, "--precision", "int8", "--overwrite", "-q")
    assert pq.read_table(out).num_rows == 40 and not Path(staging_dir(str(out))).exists()
    assert pq.read_schema(out).field("embedding").type.value_type == pa.int8()
