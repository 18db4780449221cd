"""Issue 22, items 4-7: search keeps every stored row's number (null and non-finite vectors are never hits),
equal vectors tie whatever `--block-rows`, and query ids are unique."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embedcli.io.vectors import embedding_array
from embedcli.retrieval import parquet_vector_blocks, search_blocks


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _write(path: Path, vectors: np.ndarray, null_rows: tuple[int, ...] = ()) -> Path:
    arr = embedding_array(vectors.astype(np.float32))
    if null_rows:
        mask = np.zeros(len(vectors), dtype=bool)
        mask[list(null_rows)] = True
        arr = pa.FixedSizeListArray.from_arrays(arr.values, type=arr.type, mask=pa.array(mask))
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(len(vectors))], "embedding": arr}), path, row_group_size=3)
    return path


def _reference(queries: np.ndarray, vectors: np.ndarray, usable: np.ndarray, k: int) -> list[list[int]]:
    """Rows by float64 cosine, best first, equal scores in row order, unusable rows left out."""
    cos = _unit(queries.astype(np.float64)) @ _unit(np.where(usable[:, None], vectors, 1.0).astype(np.float64)).T
    out = []
    for row in cos:
        order = sorted((i for i in range(len(vectors)) if usable[i]), key=lambda i: (-row[i], i))
        out.append(order[:k])
    return out


@pytest.mark.parametrize("block_rows", [1, 2, 3, 8])
def test_a_null_vector_row_keeps_the_numbers_of_the_rows_after_it(tmp_path: Path, block_rows: int) -> None:
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((8, 16)).astype(np.float32)
    path = _write(tmp_path / "v.parquet", vectors, null_rows=(1,))
    queries = vectors[[2, 5, 7]] + 0.01 * rng.standard_normal((3, 16)).astype(np.float32)
    _scores, rows = search_blocks(queries, parquet_vector_blocks(str(path), block_rows), 4)
    usable = np.ones(8, dtype=bool)
    usable[1] = False
    assert rows.tolist() == _reference(queries, vectors, usable, 4)
    assert rows[:, 0].tolist() == [2, 5, 7]


@pytest.mark.parametrize("block_rows", [1, 5, 64, 999, 1000])
def test_equal_vectors_tie_exactly_and_the_earlier_row_wins_whatever_the_block(block_rows: int) -> None:
    rng = np.random.default_rng(1)
    vectors = rng.standard_normal((1000, 384)).astype(np.float32)
    dupes = [5, 377, 700, 999]
    vectors[dupes] = vectors[5]
    queries = (vectors[[5]] + 0.3 * rng.standard_normal((1, 384))).astype(np.float32)
    queries = np.concatenate([queries, rng.standard_normal((6, 384)).astype(np.float32)])
    blocks = [vectors[i : i + block_rows] for i in range(0, len(vectors), block_rows)]
    scores, rows = search_blocks(queries, blocks, 3)
    assert rows[0].tolist() == dupes[:3]
    assert len(set(scores[0].tolist())) == 1  # bit-equal, not within an ulp
    whole_scores, whole_rows = search_blocks(queries, [vectors], 3)
    assert rows.tolist() == whole_rows.tolist()
    assert scores.tolist() == whole_scores.tolist()


def test_nan_and_inf_rows_are_never_hits_and_top_k_past_the_usable_rows_is_not_a_crash() -> None:
    rng = np.random.default_rng(2)
    vectors = rng.standard_normal((6, 8)).astype(np.float32)
    vectors[1, 3] = np.nan
    vectors[4] = np.inf
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no numpy RuntimeWarning either
        scores, rows = search_blocks(vectors[[0, 2]], [vectors[:3], vectors[3:]], 10)
    assert rows.shape == (2, 4)
    assert set(rows.reshape(-1).tolist()) == {0, 2, 3, 5}
    assert np.isfinite(scores).all()
    usable = np.array([True, False, True, True, False, True])
    assert rows.tolist() == _reference(vectors[[0, 2]], vectors, usable, 10)


@pytest.mark.parametrize("command", ["search", "rerank"])
def test_duplicate_query_ids_are_refused(cli, st_model, tmp_path, command):  # type: ignore[no-untyped-def]
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(["a b", "c d"])))
    queries = tmp_path / "q.jsonl"
    queries.write_text("".join(json.dumps({"id": q, "text": t}) + "\n" for q, t in [("q1", "a"), ("q2", "b"), ("q1", "c")]))
    if command == "search":
        vectors = tmp_path / "v.parquet"
        cli("embed", docs, "-m", st_model, "-o", vectors, "-q")
        args: tuple[object, ...] = ("search", vectors)
    else:
        args = ("rerank", docs)
    result = cli(*args, "--queries", queries, "-m", st_model, "-o", tmp_path / "out.jsonl", "-q", code=1)
    assert "duplicate query id 'q1' (first at line 1)" in result.stderr and "line 3" in result.stderr
    assert not (tmp_path / "out.jsonl").exists()
