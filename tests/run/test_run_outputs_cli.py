"""Issue 13 through `embedcli embed` on real files and the tiny sentence-transformers model: an output that is
its own input is refused."""

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
