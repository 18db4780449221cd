"""Issue 13 through `embedcli embed` on real files and the tiny sentence-transformers model: an output that is
its own input is refused, kept columns never shadow result columns and an empty output keeps its kept columns."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest


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
