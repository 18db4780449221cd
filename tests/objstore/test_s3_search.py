"""`search` over vectors and queries in S3 (moto on 127.0.0.1): the same hits as over the same files on disk."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

DOCS = ["Labour won the general election.", "The film won best album at the awards.",
        "Shares rose after the bank talks.", "Labour won the general election.",
        "Kyrgyz elections use invisible ink.", "The striker scored twice in the final.",
        "A new phone with a folding screen."]
QUERIES = [("q1", "who won the election"), ("q2", "stock market news"), ("q3", "football final")]


@pytest.fixture
def vectors(cli, st_model, tmp_path):  # type: ignore[no-untyped-def]
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"id": 100 + i, "text": t, "topic": f"t{i % 3}"}) + "\n"
                            for i, t in enumerate(DOCS)))
    queries = tmp_path / "queries.jsonl"
    queries.write_text("".join(json.dumps({"id": q, "text": t}) + "\n" for q, t in QUERIES))
    out = tmp_path / "vectors.parquet"
    cli("embed", docs, "-m", st_model, "--keep-cols", "topic", "-o", out, "-q")
    return out, queries


@pytest.mark.parametrize("precision", ["float32", "int8"])
def test_search_over_objects_equals_the_search_over_the_same_files(
    cli, st_model, bucket, s3_env, tmp_path, vectors, precision
):
    local, queries = vectors
    if precision != "float32":
        quantized = tmp_path / f"{precision}.parquet"
        cli("embed", tmp_path / "docs.jsonl", "-m", st_model, "--keep-cols", "topic", "--precision", precision,
            "-o", quantized, "-q")
        local = quantized
    v_url = bucket.put("vectors/v.parquet", local.read_bytes())
    q_url = bucket.put("queries/q.jsonl", queries.read_bytes())
    args = ("--top-k", 3, "--keep-cols", "topic", "-m", st_model, "-q")
    cli("search", local, "--queries", queries, *args, "-o", tmp_path / "local-hits.parquet")
    cli("search", v_url, "--queries", q_url, *args, "-o", tmp_path / "s3-hits.parquet", env=s3_env)
    want, got = pq.read_table(tmp_path / "local-hits.parquet"), pq.read_table(tmp_path / "s3-hits.parquet")
    assert got.to_pylist() == want.to_pylist()
    assert len(got) == 3 * len(QUERIES)
    local_stdout = cli("search", local, "--queries", queries, *args, "-o", "-").stdout
    assert cli("search", v_url, "--queries", q_url, *args, "-o", "-", env=s3_env).stdout == local_stdout
    search_meta = json.loads(pq.read_schema(tmp_path / "s3-hits.parquet").metadata[b"embedcli.search"])
    assert search_meta["vectors"] == v_url


def test_a_missing_vectors_object_is_said_before_the_model_loads(cli, bucket, s3_env, tmp_path):
    url = bucket.url("vectors/none.parquet")
    result = cli("search", url, "--query", "q", "-m", str(tmp_path / "no-such-model"), code=1, env=s3_env)
    assert f"{url}: no such object" in result.stderr
