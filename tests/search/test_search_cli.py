"""`embedcli search` through the CLI on a tiny sentence-transformers model, against sentence-transformers itself."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

DOCS = [
    "Labour won the general election.",
    "The film won best album at the awards.",
    "Shares rose after the bank talks.",
    "Labour won the general election.",  # a tie with doc 0
    "Kyrgyz elections use invisible ink.",
    "The striker scored twice in the final.",
    "A new phone with a folding screen.",
]
QUERIES = [("q1", "who won the election"), ("q2", "stock market news"), ("q3", "football final")]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("search")
    docs = root / "docs.jsonl"
    docs.write_text("".join(json.dumps({"id": 100 + i, "text": t, "topic": f"t{i % 3}"}) + "\n"
                            for i, t in enumerate(DOCS)), encoding="utf-8")
    queries = root / "queries.jsonl"
    queries.write_text("".join(json.dumps({"id": q, "text": t}) + "\n" for q, t in QUERIES), encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def st(tiny_model):  # type: ignore[no-untyped-def]
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(tiny_model("bert-st")), device="cpu")


def _stored(path) -> np.ndarray:  # type: ignore[no-untyped-def]
    from embedcli.io.writers import embedding_matrix

    return embedding_matrix(pq.read_table(path).column("embedding"))


def _hits(path) -> list[dict]:  # type: ignore[no-untyped-def]
    if str(path).endswith(".jsonl"):
        return [json.loads(line) for line in open(path, encoding="utf-8")]
    return pq.read_table(path).to_pylist()


def test_float32_search_equals_semantic_search_with_the_query_prompt(cli, st, st_model, corpus, tmp_path):
    from sentence_transformers import util

    vectors = tmp_path / "v.parquet"
    cli("embed", corpus / "docs.jsonl", "-m", st_model, "--keep-cols", "text,topic", "-o", vectors, "-q")
    out = tmp_path / "hits.parquet"
    cli("search", vectors, "--queries", corpus / "queries.jsonl", "--top-k", 4, "--keep-cols", "text", "-m", st_model,
        "-o", out, "-q")
    got = _hits(out)
    # sentence-transformers: encode_query uses the model's "query: " prompt
    q = st.encode_query([t for _, t in QUERIES], convert_to_numpy=True)
    expected = util.semantic_search(q, _stored(vectors), top_k=4)
    assert [r["query_id"] for r in got] == [q for q, _ in QUERIES for _ in range(4)]
    assert [r["rank"] for r in got] == [1, 2, 3, 4] * 3
    for qi, hits in enumerate(expected):
        mine = got[4 * qi : 4 * qi + 4]
        np.testing.assert_allclose([r["score"] for r in mine], [h["score"] for h in hits], atol=1e-5)
        assert {r["id"] for r in mine} == {100 + h["corpus_id"] for h in hits}  # int ids in, int ids out
        assert [r["text"] for r in mine] == [DOCS[int(r["id"]) - 100] for r in mine]
    # stdout (the default -o -) as JSONL; the duplicated document ties exactly and the earlier row comes first
    lines = cli("search", vectors, "--query", DOCS[0], "--top-k", 99, "-m", st_model, "-q").stdout.splitlines()
    full = [json.loads(line) for line in lines]
    assert [r["rank"] for r in full] == list(range(1, len(DOCS) + 1))
    ids = [r["id"] for r in full]
    first = ids.index(100)
    assert ids[first + 1] == 103 and full[first]["score"] == full[first + 1]["score"]


@pytest.mark.parametrize("precision", ["int8", "ubinary"])
def test_quantized_search_uses_the_stored_ranges(cli, st, st_model, corpus, tmp_path, precision):
    from sentence_transformers.util.quantization import quantize_embeddings

    from embedcli.quantize import METADATA_KEY

    vectors = tmp_path / "v.parquet"
    cli("embed", corpus / "docs.jsonl", "-m", st_model, "--precision", precision, "-o", vectors, "-q")
    out = tmp_path / "hits.jsonl"
    cli("search", vectors, "--queries", corpus / "queries.jsonl", "--top-k", 20, "--rescore", 0, "-o", out, "-q",
        "-m", st_model)
    got = _hits(out)
    assert len(got) == 3 * len(DOCS)  # k > n: every document once, by the quantized score alone
    codes = _stored(vectors)
    q = st.encode_query([t for _, t in QUERIES], convert_to_numpy=True)
    info = json.loads(pq.read_schema(vectors).metadata[METADATA_KEY.encode()])
    if precision == "int8":
        qc = quantize_embeddings(q, "int8", ranges=np.asarray(info["ranges"], dtype=np.float32))
        ref = qc.astype(np.int64) @ codes.astype(np.int64).T
    else:
        dim = q.shape[1]
        bits = lambda b: np.unpackbits(b, axis=-1)[:, :dim].astype(np.int64)  # noqa: E731
        ref = dim - (bits(quantize_embeddings(q, "ubinary"))[:, None, :] != bits(codes)[None]).sum(-1)
    for qi in range(len(QUERIES)):
        mine = got[len(DOCS) * qi : len(DOCS) * (qi + 1)]
        order = sorted(range(len(DOCS)), key=lambda j: -ref[qi, j])  # stable: ties by row
        assert [r["id"] for r in mine] == [100 + j for j in order]
        assert [r["score"] for r in mine] == [float(ref[qi, j]) for j in order]


def test_search_refuses_another_model(cli, tiny_model, st_model, corpus, tmp_path):
    vectors = tmp_path / "v.parquet"
    cli("embed", corpus / "docs.jsonl", "-m", st_model, "-o", vectors, "-q")
    for other, why in (("mpnet-st", "content hash"), ("bert-st-cls", "pooling config differs")):
        result = cli("search", vectors, "--query", "x", "-m", tiny_model(other), code=2)
        assert "is not the model that made" in result.stderr and why in result.stderr, other
        assert "Traceback" not in result.stderr


def test_search_refuses_files_that_are_not_embed_vectors(cli, corpus, tmp_path):
    import pyarrow as pa

    plain = tmp_path / "plain.parquet"
    pq.write_table(pa.table({"id": ["a"], "embedding": pa.array([[0.0, 1.0]], pa.list_(pa.float32(), 2))}), plain)
    result = cli("search", plain, "--query", "x", code=2)
    assert "no embedcli provenance" in result.stderr
    result = cli("search", corpus / "docs.jsonl", "--query", "x", code=2)
    assert "not a Parquet file" in result.stderr


def test_search_piped_into_rerank_scores_each_candidate_against_its_own_query(cli, st_model, corpus, tmp_path):
    """`search ... -o - | rerank - --group-col query_id`: search's stdout fed to rerank's stdin."""
    from typer.testing import CliRunner

    from embedcli.cli import app

    vectors = tmp_path / "v.parquet"
    cli("embed", corpus / "docs.jsonl", "-m", st_model, "--keep-cols", "text", "-o", vectors, "-q")
    queries = corpus / "queries.jsonl"
    ranked = tmp_path / "ranked.jsonl"
    searched = cli("search", vectors, "--queries", queries, "--top-k", 3, "--keep-cols", "text", "-m", st_model, "-q")
    done = CliRunner().invoke(app, ["rerank", "-", "--queries", str(queries), "--group-col", "query_id", "-m", str(st_model),
                                    "-q", "-o", str(ranked)], input=searched.stdout, env={"EMBEDCLI_DTYPE": "float32"})
    assert done.exit_code == 0, done.stderr
    got = _hits(ranked)
    hits = {}
    for line in searched.stdout.splitlines():
        r = json.loads(line)
        hits[(r["query_id"], r["id"])] = r["score"]
    # each query ranks exactly its own 3 candidates; cosine with the same prompts gives search's own scores
    assert sorted((r["query_id"], r["id"]) for r in got) == sorted(hits)
    for r in got:
        assert abs(r["score"] - hits[(r["query_id"], r["id"])]) < 1e-5
    for qid, _ in QUERIES:
        mine = [r for r in got if r["query_id"] == qid]
        assert [r["rank"] for r in mine] == [1, 2, 3]
        assert [r["score"] for r in mine] == sorted((r["score"] for r in mine), reverse=True)


def test_rerank_refuses_candidates_of_an_unknown_query(cli, st_model, tmp_path):
    cands = tmp_path / "c.jsonl"
    cands.write_text('{"query_id": "q1", "id": "a", "text": "x"}\n{"query_id": "zz", "id": "b", "text": "y"}\n')
    result = cli("rerank", cands, "--query", "hello", "--group-col", "query_id", "-m", st_model, "-o", tmp_path / "r.jsonl", code=1)
    assert "query_id 'q1' is not the id of a query" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(("flags", "k", "mult"), [([], 1, 4), (["--rescore", "2"], 2, 2), (["--rescore", "0"], 2, 0)])
def test_int8_search_rescores_4x_top_k_by_default(cli, st, st_model, corpus, tmp_path, flags, k, mult):
    from sentence_transformers.util.quantization import quantize_embeddings

    from embedcli.quantize import METADATA_KEY

    vectors = tmp_path / "v.parquet"
    cli("embed", corpus / "docs.jsonl", "-m", st_model, "--precision", "int8", "-o", vectors, "-q")
    out = tmp_path / "hits.parquet"
    cli("search", vectors, "--queries", corpus / "queries.jsonl", "--top-k", k, *flags, "-m", st_model, "-o", out, "-q")
    got = _hits(out)
    codes = _stored(vectors).astype(np.int64)
    ranges = np.asarray(json.loads(pq.read_schema(vectors).metadata[METADATA_KEY.encode()])["ranges"], np.float64)
    q = st.encode_query([t for _, t in QUERIES], convert_to_numpy=True).astype(np.float64)
    coarse = quantize_embeddings(q.astype(np.float32), "int8", ranges=ranges.astype(np.float32)).astype(np.int64) @ codes.T
    step = (ranges[1] - ranges[0]) / 255
    fine = q @ ((codes + 128) * step + ranges[0]).T  # the recipe's dequantized candidates, in float64
    for qi in range(len(QUERIES)):
        by_codes = sorted(range(len(DOCS)), key=lambda j: -coarse[qi, j])  # stable: ties to the earlier row
        if mult:
            best = sorted(by_codes[: k * mult], key=lambda j: -fine[qi, j])[:k]
            expected = fine[qi, best]
        else:  # --rescore 0: the quantized score alone, as before rescoring was the default
            best = by_codes[:k]
            expected = coarse[qi, best].astype(np.float64)
        mine = got[k * qi : k * qi + k]
        assert [r["id"] for r in mine] == [100 + j for j in best]
        np.testing.assert_allclose([r["score"] for r in mine], expected, rtol=1e-5)
    config = json.loads(pq.read_schema(out).metadata[b"embedcli.search"])
    assert config["rescore_multiplier"] == mult
    # the duplicated document (rows 0 and 3) ties after rescoring too: the earlier row first
    full = [json.loads(line) for line in cli("search", vectors, "--query", DOCS[0], "--top-k", 7, *flags, "-m", st_model,
                                             "-q").stdout.splitlines()]
    ids = [r["id"] for r in full]
    assert ids.index(100) + 1 == ids.index(103) and full[ids.index(100)]["score"] == full[ids.index(103)]["score"]


def test_rescore_has_no_effect_on_float_vectors(cli, st_model, corpus, tmp_path):
    vectors = tmp_path / "v.parquet"
    cli("embed", corpus / "docs.jsonl", "-m", st_model, "-o", vectors, "-q")
    runs = [cli("search", vectors, "--queries", corpus / "queries.jsonl", "--top-k", 3, *flags, "-m", st_model, "-q").stdout
            for flags in ([], ["--rescore", "0"], ["--rescore", "9"])]
    assert runs[0] == runs[1] == runs[2]


def test_rescore_below_zero_is_a_usage_error(cli, st_model, corpus, tmp_path):
    vectors = tmp_path / "v.parquet"
    cli("embed", corpus / "docs.jsonl", "-m", st_model, "--precision", "int8", "-o", vectors, "-q")
    result = cli("search", vectors, "--query", "x", "--rescore", "-1", "-m", st_model, code=2)
    assert "--rescore -1: must be 0 (off) or more" in result.stderr


def test_rerank_refuses_a_candidate_without_a_query_id(cli, st_model, tmp_path):
    cands = tmp_path / "c.jsonl"
    cands.write_text('{"query_id": "query", "id": "a", "text": "x"}\n{"query_id": null, "id": "b", "text": "y"}\n')
    result = cli("rerank", cands, "--query", "hello", "--group-col", "query_id", "-m", st_model, "-o", tmp_path / "r.jsonl", code=1)
    assert "line 2 (id 'b'): text field 'query_id' is null" in result.stderr and "Traceback" not in result.stderr


def test_search_over_vectors_made_with_max_length_embeds_queries_cut_as_they_were(cli, st, st_model, corpus, tmp_path):
    """`embed --max-length N` vectors are searched with queries cut at N tokens (ST with max_seq_length N)."""
    from sentence_transformers import util

    vectors = tmp_path / "v.parquet"
    cli("embed", corpus / "docs.jsonl", "-m", st_model, "--max-length", 6, "-o", vectors, "-q")
    out = tmp_path / "hits.jsonl"
    cli("search", vectors, "--queries", corpus / "queries.jsonl", "--top-k", 3, "-o", out, "-q")
    got = _hits(out)
    saved = st.max_seq_length
    st.max_seq_length = 6
    try:
        q = st.encode_query([t for _, t in QUERIES], convert_to_numpy=True)
    finally:
        st.max_seq_length = saved
    for qi, hits in enumerate(util.semantic_search(q, _stored(vectors), top_k=3)):
        np.testing.assert_allclose([r["score"] for r in got[3 * qi : 3 * qi + 3]], [h["score"] for h in hits], atol=1e-5)
