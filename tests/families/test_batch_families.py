"""`run-batch` on issue 17's families: each route gives the numbers of the matching command on the same checkpoint.

LLM rerankers: `/score`, `/v1/score`, `/rerank`, `/v1/rerank`, `/v2/rerank` equal `embedcli score` / `rerank`
(the same pair rendering: template, chat template or text pair, the document cut so the suffix stays).
SPLADE: the same routes equal the sparse dot product of `score` / `rerank`; `/pooling` and `/v1/embeddings`
give vLLM's vocabulary-sized vector whose non-zero entries are `sparse-embed`'s indices and values.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

QUERY = "who won the election"
DOCS = [
    "labour won the election",
    "the quick brown fox jumps over the lazy dog",
    "zzz",
    " ".join(["labour won the general election with a reduced majority"] * 6),  # over 40 tokens: cut
]
PAIRS = [(QUERY, DOCS[0]), ("market shares", DOCS[1]), ("hello", DOCS[2]), ("film award", DOCS[3])]
TEMPLATE = "judge : {instruction} query : {query} document : {document} answer yes or no :"
TEMPLATE_FLAGS = ("--classifier-from-tokens", "no,yes", "--pair-template", TEMPLATE, "--instruction", "find news")
CHAT_TEMPLATE = (
    "judge : {% for m in messages %}{% if m['role'] == 'query' %}query : {{ m['content'] }} "
    "{% elif m['role'] == 'document' %}document : {{ m['content'] }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %} answer yes or no :{% endif %}"
)
SCORE_ROUTES = ("/score", "/v1/score")
RERANK_ROUTES = ("/rerank", "/v1/rerank", "/v2/rerank")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    import shutil

    from sentence_transformers import CrossEncoder

    from tests.fixtures.tiny_families import build_llm_reranker, build_splade
    from tests.fixtures.tiny_models import edit_json

    root = tmp_path_factory.mktemp("batch_families")
    qwen3, qwen3_saved = build_llm_reranker("qwen3", root)
    llama, _ = build_llm_reranker("llama", root)
    chat_source = Path(shutil.copytree(qwen3, root / "chat-plain"))
    (chat_source / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
    chat = root / "chat"
    CrossEncoder(str(chat_source), device="cpu").save_pretrained(str(chat))
    edit_json(chat / "sentence_bert_config.json",
              lambda c: c.update(processing_kwargs={"chat_template": {"add_generation_prompt": True}}))
    return {"qwen3-ce": qwen3_saved, "qwen3": qwen3, "llama": llama, "chat": chat, "splade": build_splade(root)}


def req(custom_id: str, url: str, body: dict[str, Any]) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def run_batch(cli, tmp_path: Path, model: Path, lines: list[str], *args: object,  # type: ignore[no-untyped-def]
              code: int = 0) -> list[dict[str, Any]]:
    src = tmp_path / "requests.jsonl"
    src.write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    out = tmp_path / "results.jsonl"
    cli("run-batch", src, "-m", model, "-o", out, "-q", *args, code=code)
    return [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def command_scores(cli, tmp_path: Path, model: Path, *args: object) -> tuple[np.ndarray, np.ndarray]:  # type: ignore[no-untyped-def]
    """`score` over PAIRS and `rerank` of DOCS against QUERY (rerank's scores back in document order)."""
    pairs = _write(tmp_path / "pairs.jsonl", [{"id": f"p{i}", "left": q, "right": d} for i, (q, d) in enumerate(PAIRS)])
    docs = _write(tmp_path / "docs.jsonl", [{"id": str(i), "text": d} for i, d in enumerate(DOCS)])
    cli("score", pairs, "-m", model, *args, "-o", tmp_path / "s.parquet", "-q")
    cli("rerank", docs, "-m", model, "--query", QUERY, *args, "-o", tmp_path / "r.parquet", "-q")
    scores = np.asarray(pq.read_table(tmp_path / "s.parquet").column("score").to_pylist(), dtype=np.float32)
    ranked = pq.read_table(tmp_path / "r.parquet").to_pylist()
    rerank = np.zeros(len(DOCS), dtype=np.float32)
    for row in ranked:
        rerank[int(row["id"])] = row["score"]
    return scores, rerank


def score_lines() -> list[str]:
    lefts, rights = [q for q, _ in PAIRS], [d for _, d in PAIRS]
    lines = [req("s-text", "/score", {"text_1": lefts, "text_2": rights}),
             req("s-queries", "/v1/score", {"queries": lefts, "documents": rights})]
    lines += [req(f"s{i}", SCORE_ROUTES[i % 2], {"data_1": q, "data_2": [d]}) for i, (q, d) in enumerate(PAIRS)]
    lines += [req(url, url, {"query": QUERY, "documents": DOCS}) for url in RERANK_ROUTES]
    return lines


def check_against_commands(lines: list[dict[str, Any]], scores: np.ndarray, rerank: np.ndarray) -> None:
    by_id = {line["custom_id"]: line for line in lines}
    assert all(line["response"]["status_code"] == 200 for line in lines)
    for cid in ("s-text", "s-queries"):
        got = [d["score"] for d in by_id[cid]["response"]["body"]["data"]]
        np.testing.assert_allclose(got, scores, rtol=0, atol=1e-6)
    singles = [by_id[f"s{i}"]["response"]["body"]["data"][0]["score"] for i in range(len(PAIRS))]
    np.testing.assert_allclose(singles, scores, rtol=0, atol=1e-6)
    for url in RERANK_ROUTES:
        results = by_id[url]["response"]["body"]["results"]
        assert [r["index"] for r in results] == np.argsort(-rerank, kind="stable").tolist()
        got = np.zeros(len(DOCS))
        for r in results:
            got[r["index"]] = r["relevance_score"]
            assert r["document"]["text"] == DOCS[r["index"]]
        np.testing.assert_allclose(got, rerank, rtol=0, atol=1e-6)


# -- LLM rerankers ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, flags",
    [
        ("qwen3-ce", ()),  # sentence-transformers' checkpoint: the tokenizer's text pair
        ("qwen3", TEMPLATE_FLAGS),  # a plain causal LM with the template flags
        ("llama", TEMPLATE_FLAGS),
        ("chat", ()),  # the tokenizer's chat template with a suffix after the document
    ],
)
def test_llm_reranker_routes_equal_score_and_rerank(cli, models, tmp_path, name, flags) -> None:
    # --max-length 40: the last document is cut, on the document side where there is a template.
    args = (*flags, "--max-length", 40)
    scores, rerank = command_scores(cli, tmp_path, models[name], *args)
    assert np.ptp(scores) > 1e-3 and np.ptp(rerank) > 1e-3  # the scores differ from each other
    lines = run_batch(cli, tmp_path, models[name], score_lines(), *args, "--max-batch-tokens", 64)
    check_against_commands(lines, scores, rerank)


def test_llm_reranker_use_activation_false_is_raw_scores(cli, models, tmp_path) -> None:
    scores, _ = command_scores(cli, tmp_path, models["qwen3"], *TEMPLATE_FLAGS, "--raw-scores")
    lefts, rights = [q for q, _ in PAIRS], [d for _, d in PAIRS]
    (line,) = run_batch(cli, tmp_path, models["qwen3"],
                        [req("raw", "/score", {"text_1": lefts, "text_2": rights, "use_activation": False})],
                        *TEMPLATE_FLAGS)
    np.testing.assert_allclose([d["score"] for d in line["response"]["body"]["data"]], scores, rtol=0, atol=1e-6)
    assert np.min(scores) < 0 or np.max(scores) > 1  # logit differences, not probabilities


# -- SPLADE ----------------------------------------------------------------------------------------------


def test_splade_score_and_rerank_routes_are_the_sparse_dot_product(cli, models, tmp_path) -> None:
    # Budget 1: every text in a forward of its own on both sides, so the float32 sums are the same operations
    # (the dot products are ~100, where float32's step is ~8e-6: other packings may differ by an ulp).
    scores, rerank = command_scores(cli, tmp_path, models["splade"], "--max-batch-tokens", 1)
    assert np.ptp(scores) > 1e-3
    check_against_commands(run_batch(cli, tmp_path, models["splade"], score_lines(), "--max-batch-tokens", 1),
                           scores, rerank)


def test_splade_pooling_and_embeddings_are_sparse_embed_as_vocabulary_vectors(cli, models, tmp_path) -> None:
    from embedcli.batchapi import decode_base64

    model = models["splade"]
    texts = [QUERY, *DOCS]
    ref = tmp_path / "sparse.parquet"
    cli("sparse-embed", _write(tmp_path / "t.jsonl", [{"id": str(i), "text": t} for i, t in enumerate(texts)]),
        "-m", model, "--max-batch-tokens", 1, "-o", ref, "-q")  # budget 1 on both sides: the same forwards
    want = pq.read_table(ref).to_pylist()
    vocab = json.loads(cli("info", model, "--json").stdout)["embedding_size"]
    lines = run_batch(cli, tmp_path, model, [
        req("pool", "/pooling", {"input": texts}),
        req("pool-embed", "/pooling", {"input": texts, "task": "embed", "normalize": False}),
        req("emb", "/v1/embeddings", {"input": texts}),
        req("b64", "/pooling", {"input": texts, "encoding_format": "base64"}),
    ], "--max-batch-tokens", 1)
    by_id = {line["custom_id"]: line["response"]["body"] for line in lines}
    vectors = {
        "pool": [d["data"] for d in by_id["pool"]["data"]],
        "pool-embed": [d["data"] for d in by_id["pool-embed"]["data"]],
        "emb": [d["embedding"] for d in by_id["emb"]["data"]],
        "b64": [decode_base64(d["data"]) for d in by_id["b64"]["data"]],
    }
    for name, rows in vectors.items():
        assert len(rows) == len(want), name
        for vector, row in zip(rows, want, strict=True):
            vector = np.asarray(vector, dtype=np.float32)
            assert vector.shape == (vocab,), name
            np.testing.assert_array_equal(np.flatnonzero(vector), row["indices"], err_msg=name)
            np.testing.assert_allclose(vector[row["indices"]], row["values"], rtol=0, atol=1e-6, err_msg=name)
    assert all(len(r["indices"]) for r in want) and by_id["pool"]["usage"]["prompt_tokens"] > len(texts)


@pytest.mark.parametrize(
    "url, body, param, message",
    [
        ("/v2/embed", {"texts": ["a"]}, "url", "/pooling"),
        ("/pooling", {"input": "a", "task": "token_embed"}, "body.task", "SPLADE model serves embed"),
        ("/v1/embeddings", {"input": "a", "normalize": True}, "body.normalize", "not normalized"),
        ("/pooling", {"input": "a", "dimensions": 8}, "body.dimensions", "matryoshka"),
        ("/classify", {"input": "a"}, "url", "Classification"),
    ],
)
def test_splade_refuses_what_it_cannot_serve_as_bad_lines(cli, models, tmp_path, url, body, param, message) -> None:
    lines = run_batch(cli, tmp_path, models["splade"], [req("bad", url, body), req("ok", "/pooling", {"input": "a"})],
                      code=3)
    bad, ok = lines
    assert bad["response"]["status_code"] == 400 and bad["error"]["param"] == param
    assert message in bad["error"]["message"]
    assert ok["response"]["status_code"] == 200
