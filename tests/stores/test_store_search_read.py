"""`search` over a LanceDB table: the vectors streamed in blocks, the hits' rows taken by number, exact top-k as
over a vectors file, and a pinned version that a run writing the table meanwhile does not move."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pytest

from embedcli.io.stores.lance import LanceVectors
from embedcli.io.vectors import embedding_matrix
from embedcli.retrieval import search_blocks, vector_block
from tests.stores.store_helpers import corpus, sync, vectors


@pytest.mark.parametrize("block_rows", [7, 64])
def test_blocks_and_take_read_the_table(block_rows: int, lance_url: Callable[[], str]) -> None:
    url = lance_url()
    c = corpus(50)
    sync(url, c, batch=8)
    sync(url, corpus(50, start=10))  # an upsert and delete pass: rows move between fragments
    reader = LanceVectors(url)
    assert reader.metadata["embedcli.complete"] == "true" and reader.rows == 50
    blocks = list(reader.blocks(["id", "embedding"], block_rows))
    assert max(b.num_rows for b in blocks) <= block_rows
    table = pa.Table.from_batches(blocks)
    ids = table.column("id").to_pylist()
    assert sorted(ids) == list(range(10, 60))
    texts = [f"text of {i}" for i in ids]
    np.testing.assert_array_equal(embedding_matrix(table.column("embedding")), vectors(texts))
    rows = np.array([49, 0, 7, 7, 23])
    taken = reader.take(rows, ["id", "embedding"])
    assert taken.column("id").to_pylist() == [ids[r] for r in rows]


def test_exact_top_k_over_a_table_equals_numpy(lance_url: Callable[[], str]) -> None:
    url = lance_url()
    c = corpus(200, id_type=pa.string())
    sync(url, c, batch=30)
    reader = LanceVectors(url)
    queries = vectors([f"query {i}" for i in range(5)])
    scores, rows = search_blocks(queries, (vector_block(b.column(0)) for b in reader.blocks(["embedding"], 32)), k=4)
    hits = reader.take(rows.reshape(-1), ["id"]).column("id").to_pylist()
    order = pa.Table.from_batches(reader.blocks(["id"], 1000)).column("id").to_pylist()
    matrix = vectors([f"text of {rid}" for rid in order])  # the corpus's texts, independently of the table
    reference = queries.astype(np.float64) @ matrix.astype(np.float64).T
    best = np.argsort(-reference, axis=1, kind="stable")[:, :4]
    assert hits == [order[i] for i in best.reshape(-1)]
    np.testing.assert_allclose(scores, np.take_along_axis(reference, best, axis=1), atol=1e-6)


def test_the_version_read_is_pinned(lance_url: Callable[[], str]) -> None:
    url = lance_url()
    sync(url, corpus(30))
    reader = LanceVectors(url)
    sync(url, corpus(30, start=100))  # every row replaced meanwhile
    ids = pa.Table.from_batches(reader.blocks(["id"], 8)).column("id").to_pylist()
    assert sorted(ids) == list(range(30))
    assert reader.take(np.array([3]), ["id"]).column("id").to_pylist() == [ids[3]]
