"""`embedcli run-batch`: each route gives the numbers of the matching command on the same inputs, in vLLM's
response shapes; base64, dimensions and embedding types; bad lines answered with 400 lines and exit 3."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "batchapi"))
from batch_shapes import (
    BATCH_ERROR_OUTPUT,
    CLASSIFICATION_RESPONSE,
    COHERE_EMBED_RESPONSE,
    EMBEDDING_RESPONSE,
    POOLING_RESPONSE,
    RERANK_RESPONSE,
    SCORE_RESPONSE,
    batch_output,
    check,
)

TEXTS = ["The cat sat on the mat.", "Rates rose 5% on Tuesday", "hello", "a longer sentence, with several more words in it"]
QUERY = "what did the central bank do?"


def req(custom_id: str, url: str, body: dict[str, Any]) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def run_batch(cli, tmp_path: Path, model: Path, lines: list[str], *args: object, name: str = "b",  # type: ignore[no-untyped-def]
              code: int = 0) -> list[dict[str, Any]]:
    src = tmp_path / f"{name}.requests.jsonl"
    src.write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    out = tmp_path / f"{name}.results.jsonl"
    cli("run-batch", src, "-m", model, "-o", out, "-q", *args, code=code)
    return [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]


def texts_file(tmp_path: Path, texts: list[str], name: str = "texts") -> Path:
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(json.dumps({"id": f"t{i}", "text": t}) + "\n" for i, t in enumerate(texts)), encoding="utf-8")
    return path


def column(path: Path, name: str) -> list[Any]:
    return pq.read_table(path).column(name).to_pylist()


def bodies(lines: list[dict[str, Any]], schema: Any) -> list[dict[str, Any]]:
    for line in lines:
        check(line, batch_output(schema))
    return [line["response"]["body"] for line in lines]


# -- embeddings -------------------------------------------------------------------------------------


def test_embeddings_equal_embed_and_base64_decodes_to_them(cli, tiny_model, tmp_path):  # type: ignore[no-untyped-def]
    from embedcli.batchapi import decode_base64

    model = tiny_model("bert-st")
    ref = tmp_path / "ref.parquet"
    cli("embed", texts_file(tmp_path, TEXTS), "-m", model, "--prompt", "", "-o", ref, "-q")
    expected = np.asarray(column(ref, "embedding"), dtype=np.float32)

    many = bodies(run_batch(cli, tmp_path, model, [req("all", "/v1/embeddings", {"input": TEXTS})], name="many"),
                  EMBEDDING_RESPONSE)
    got = np.asarray([d["embedding"] for d in many[0]["data"]], dtype=np.float32)
    assert [d["index"] for d in many[0]["data"]] == list(range(len(TEXTS)))
    assert np.array_equal(got, expected)

    singles = bodies(run_batch(cli, tmp_path, model, [req(f"r{i}", "/v1/embeddings", {"input": t})
                                                       for i, t in enumerate(TEXTS)], name="singles"), EMBEDDING_RESPONSE)
    assert np.array_equal(np.asarray([b["data"][0]["embedding"] for b in singles], dtype=np.float32), expected)

    encoded = bodies(run_batch(cli, tmp_path, model, [req("b64", "/v1/embeddings",
                                                          {"input": TEXTS, "encoding_format": "base64"})], name="b64"),
                     EMBEDDING_RESPONSE)
    decoded = np.stack([decode_base64(d["embedding"]) for d in encoded[0]["data"]])
    assert np.array_equal(decoded, expected)
    # little-endian float32 by definition, whatever decode_base64 does
    import base64
    raw = np.frombuffer(base64.b64decode(encoded[0]["data"][0]["embedding"]), dtype="<f4")
    assert np.array_equal(raw, expected[0])
    assert many[0]["usage"]["prompt_tokens"] > len(TEXTS)


def test_dimensions_and_input_type_equal_embed_flags(cli, task_models, tmp_path):  # type: ignore[no-untyped-def]
    model = task_models("st-cls-dense")  # Matryoshka 128/64/32, query/document prompts
    src = texts_file(tmp_path, TEXTS)
    ref = tmp_path / "d64.parquet"
    cli("embed", src, "-m", model, "--prompt", "", "--dimensions", 64, "-o", ref, "-q")
    q_ref = tmp_path / "query.parquet"
    cli("embed", src, "-m", model, "--prompt-name", "query", "-o", q_ref, "-q")
    lines = [req("d", "/v1/embeddings", {"input": TEXTS, "dimensions": 64}),
             req("q", "/v2/embed", {"texts": TEXTS, "input_type": "query", "embedding_types": ["float"]})]
    out = run_batch(cli, tmp_path, model, lines)
    check(out[0], batch_output(EMBEDDING_RESPONSE))
    check(out[1], batch_output(COHERE_EMBED_RESPONSE))
    got = np.asarray([d["embedding"] for d in out[0]["response"]["body"]["data"]], dtype=np.float32)
    assert got.shape == (len(TEXTS), 64)
    assert np.array_equal(got, np.asarray(column(ref, "embedding"), dtype=np.float32))
    cohere = np.asarray(out[1]["response"]["body"]["embeddings"]["float"], dtype=np.float32)
    assert np.array_equal(cohere, np.asarray(column(q_ref, "embedding"), dtype=np.float32))


@pytest.mark.parametrize("precision", ["int8", "uint8", "binary", "ubinary"])
def test_embedding_types_equal_precision(cli, tiny_model, tmp_path, precision):  # type: ignore[no-untyped-def]
    model = tiny_model("bert-st")
    ref = tmp_path / "q.parquet"
    cli("embed", texts_file(tmp_path, TEXTS), "-m", model, "--prompt", "", "--precision", precision, "-o", ref, "-q")
    out = run_batch(cli, tmp_path, model, [req("c", "/v2/embed", {"texts": TEXTS, "embedding_types": [precision]})])
    body = bodies(out, COHERE_EMBED_RESPONSE)[0]
    assert body["embeddings"][precision] == [list(v) for v in column(ref, "embedding")]
    assert body["texts"] == TEXTS


# -- pairs ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["cross-encoder", "bert-st"])
def test_score_equals_score_command(cli, task_models, tiny_model, tmp_path, name):  # type: ignore[no-untyped-def]
    model = task_models(name) if name == "cross-encoder" else tiny_model(name)
    lefts = [QUERY, "who won?", "hello", "rates"]
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"left": a, "right": b}) + "\n" for a, b in zip(lefts, TEXTS, strict=True)))
    ref_pairs = tmp_path / "pairs.parquet"
    cli("score", pairs, "-m", model, "-o", ref_pairs, "-q")
    ref_one = tmp_path / "one.parquet"
    cli("score", texts_file(tmp_path, TEXTS), "-m", model, "--left", QUERY, "--right-col", "text", "-o", ref_one, "-q")
    lines = [req("nn", "/score", {"text_1": lefts, "text_2": TEXTS}),
             req("1n", "/v1/score", {"queries": QUERY, "documents": TEXTS})]
    out = bodies(run_batch(cli, tmp_path, model, lines), SCORE_RESPONSE)
    # Both requests' pairs share forwards in run-batch, so the matmuls see other row counts than the commands':
    # on an AVX2-only CPU oneDNN's float32 kernels block by row count and the last bit can move (1 ulp seen).
    same = {"rtol": 0, "atol": 1e-6}
    np.testing.assert_allclose(np.float32([d["score"] for d in out[0]["data"]]), np.float32(column(ref_pairs, "score")), **same)
    np.testing.assert_allclose(np.float32([d["score"] for d in out[1]["data"]]), np.float32(column(ref_one, "score")), **same)


def test_rerank_equals_rerank_command(cli, task_models, tmp_path):  # type: ignore[no-untyped-def]
    model = task_models("cross-encoder")
    ref = tmp_path / "ranked.parquet"
    cli("rerank", texts_file(tmp_path, TEXTS), "-m", model, "--query", QUERY, "-o", ref, "-q")
    lines = [req("all", "/rerank", {"query": QUERY, "documents": TEXTS}),
             req("top", "/v2/rerank", {"query": QUERY, "documents": TEXTS, "top_n": 2})]
    out = bodies(run_batch(cli, tmp_path, model, lines), RERANK_RESPONSE)
    ids = [int(i.removeprefix("t")) for i in column(ref, "id")]
    assert [r["index"] for r in out[0]["results"]] == ids
    assert np.array_equal(np.float32([r["relevance_score"] for r in out[0]["results"]]), np.float32(column(ref, "score")))
    assert [r["document"]["text"] for r in out[0]["results"]] == [TEXTS[i] for i in ids]
    assert out[1]["results"] == out[0]["results"][:2]


# -- classify and token tasks -------------------------------------------------------------------------


def test_classify_equals_classify_command(cli, task_models, tmp_path):  # type: ignore[no-untyped-def]
    model = task_models("multi-class")
    src = texts_file(tmp_path, TEXTS)
    ref = tmp_path / "labels.parquet"
    cli("classify", src, "-m", model, "--all-scores", "-o", ref, "-q")
    raw = tmp_path / "raw.parquet"
    cli("classify", src, "-m", model, "--all-scores", "--activation", "none", "-o", raw, "-q")
    lines = [req("c", "/classify", {"input": TEXTS}), req("r", "/classify", {"input": TEXTS, "use_activation": False})]
    out = bodies(run_batch(cli, tmp_path, model, lines), CLASSIFICATION_RESPONSE)
    assert np.array_equal(np.float32([d["probs"] for d in out[0]["data"]]), np.float32(column(ref, "scores")))
    assert [d["label"] for d in out[0]["data"]] == column(ref, "label")
    assert all(d["num_classes"] == 4 for d in out[0]["data"])
    assert np.array_equal(np.float32([d["probs"] for d in out[1]["data"]]), np.float32(column(raw, "scores")))


def test_pooling_token_tasks_equal_token_commands(cli, task_models, tiny_model, tmp_path):  # type: ignore[no-untyped-def]
    embedder, tagger = tiny_model("bert-st"), task_models("token-classifier")
    src = texts_file(tmp_path, TEXTS)
    ref_embed = tmp_path / "tok.parquet"
    cli("token-embed", src, "-m", embedder, "--keep-special", "-o", ref_embed, "-q")
    ref_tags = tmp_path / "tags.parquet"
    cli("token-classify", src, "-m", tagger, "--keep-special", "--all-scores", "-o", ref_tags, "-q")

    out = bodies(run_batch(cli, tmp_path, embedder, [req("e", "/pooling", {"input": TEXTS, "task": "token_embed"})],
                           name="te"), POOLING_RESPONSE)
    for d, want in zip(out[0]["data"], column(ref_embed, "embeddings"), strict=True):
        assert np.array_equal(np.float32(d["data"]), np.float32(want))
    out = bodies(run_batch(cli, tmp_path, tagger, [req("t", "/pooling", {"input": TEXTS, "task": "token_classify"})],
                           name="tc"), POOLING_RESPONSE)
    for d, want in zip(out[0]["data"], column(ref_tags, "probs"), strict=True):
        assert np.array_equal(np.float32(d["data"]), np.float32(want))


# -- bad lines ----------------------------------------------------------------------------------------


def bad_file_lines() -> list[str]:
    return [
        req("ok-1", "/v1/embeddings", {"input": "fine"}),
        '{"custom_id": "broken", "method": "POST", "url": ',  # malformed JSON
        req("route", "/v1/chat/completions", {"input": "x"}),  # unknown route
        req("missing", "/v1/embeddings", {"dimensions": None}),  # no input
        req("model", "/v1/embeddings", {"input": "x", "model": "someone-else/model"}),  # wrong model
        req("ok-1", "/v1/embeddings", {"input": "again"}),  # duplicate custom_id
        req("ok-2", "/v1/score", {"text_1": "a", "text_2": ["b", "c"]}),
    ]


def test_bad_lines_get_400_lines_the_rest_results_exit_3(cli, tiny_model, tmp_path):  # type: ignore[no-untyped-def]
    errors = tmp_path / "errors.jsonl"
    out = run_batch(cli, tmp_path, tiny_model("bert-st"), bad_file_lines(), "--errors-file", errors, code=3)
    assert [x["response"]["status_code"] for x in out] == [200, 400, 400, 400, 400, 400, 200]
    for x in out[1:6]:
        check(x, BATCH_ERROR_OUTPUT)
    assert [(x["error"]["line"], x["error"]["param"]) for x in out[1:6]] == [
        (2, None), (3, "url"), (4, "body.input"), (5, "body.model"), (6, "custom_id")]
    assert "malformed JSON" in out[1]["error"]["message"]
    assert out[5]["custom_id"] == "ok-1" and "first on line 1" in out[5]["error"]["message"]
    check(out[0], batch_output(EMBEDDING_RESPONSE))
    check(out[6], batch_output(SCORE_RESPONSE))
    records = [json.loads(x) for x in errors.read_text().splitlines()]
    assert [r["location"] for r in records] == ["line 2", "line 3", "line 4", "line 5", "line 6"]


def test_on_error_fail_stops_at_the_first_bad_line(cli, tiny_model, tmp_path):  # type: ignore[no-untyped-def]
    src = tmp_path / "requests.jsonl"
    src.write_text("".join(x + "\n" for x in bad_file_lines()))
    out = tmp_path / "out.jsonl"
    result = cli("run-batch", src, "-m", tiny_model("bert-st"), "-o", out, "--on-error", "fail", code=1)
    assert "line 2" in result.stderr and "malformed JSON" in result.stderr
    assert not out.exists()


def test_help_example_runs_as_printed(cli, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    import re
    import shlex
    import subprocess

    help_text = cli("run-batch", "--help").stdout
    flat = " ".join(help_text.split())
    echo = re.search(r"echo '(\{.*?\})' > requests\.jsonl", flat)
    assert echo and "embedcli run-batch requests.jsonl -o results.jsonl" in flat
    assert re.search(r"--on-error\b.*?\[default: skip\]", flat)
    monkeypatch.chdir(tmp_path)
    subprocess.run(f"echo {shlex.quote(echo.group(1))} > requests.jsonl", shell=True, check=True)
    cli("run-batch", "requests.jsonl", "-o", "results.jsonl", "-q")
    (line,) = (tmp_path / "results.jsonl").read_text().splitlines()
    check(json.loads(line), batch_output(EMBEDDING_RESPONSE))


def test_token_ids_and_truncate_prompt_tokens_equal_embed(cli, tiny_model, tmp_path):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    model = tiny_model("bert-st")
    src = texts_file(tmp_path, TEXTS)
    ref = tmp_path / "ref.parquet"
    cli("embed", src, "-m", model, "--prompt", "", "-o", ref, "-q")
    short = tmp_path / "short.parquet"
    cli("embed", src, "-m", model, "--prompt", "", "--max-length", 6, "-o", short, "-q")
    ids = [AutoTokenizer.from_pretrained(str(model))(t)["input_ids"] for t in TEXTS]
    lines = [req("ids", "/v1/embeddings", {"input": ids}),
             req("cut", "/v1/embeddings", {"input": TEXTS, "truncate_prompt_tokens": 6})]
    out = bodies(run_batch(cli, tmp_path, model, lines), EMBEDDING_RESPONSE)
    assert np.array_equal(np.float32([d["embedding"] for d in out[0]["data"]]), np.float32(column(ref, "embedding")))
    assert np.array_equal(np.float32([d["embedding"] for d in out[1]["data"]]), np.float32(column(short, "embedding")))
    assert out[1]["usage"]["prompt_tokens"] == sum(min(len(i), 6) for i in ids)  # tokens after truncation
    assert out[0]["usage"]["prompt_tokens"] == sum(len(i) for i in ids)


def test_max_errors_counts_answered_bad_lines(cli, tiny_model, tmp_path):  # type: ignore[no-untyped-def]
    src = tmp_path / "requests.jsonl"
    src.write_text("".join(x + "\n" for x in bad_file_lines()))
    out = tmp_path / "out.jsonl"
    result = cli("run-batch", src, "-m", tiny_model("bert-st"), "-o", out, "--max-errors", 2, code=1)
    assert "more than 2 bad rows" in result.stderr and "line 4" in result.stderr  # the third bad line, not the last
    cli("run-batch", src, "-m", tiny_model("bert-st"), "-o", out, "--max-errors", 5, "-q", code=3)


def test_a_rerun_with_other_calibration_ranges_refuses_to_mix(cli, tiny_model, tmp_path):  # type: ignore[no-untyped-def]
    """The config held only the calibration file's name: a rerun with other ranges under that name found the
    output complete (exit 0) and kept int8 codes quantized with the old ranges."""
    model = tiny_model("bert-st")
    floats = tmp_path / "f.parquet"
    cli("embed", texts_file(tmp_path, TEXTS), "-m", model, "-o", floats, "-q")
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    vectors = np.stack(column(floats, "embedding")).astype(np.float32)
    np.save(a / "cal.npy", vectors)
    np.save(b / "cal.npy", vectors * 3)
    lines = [req("c", "/v2/embed", {"texts": TEXTS, "embedding_types": ["int8"]})]
    run_batch(cli, tmp_path, model, lines, "--calibration", a / "cal.npy")
    src, out = tmp_path / "b.requests.jsonl", tmp_path / "b.results.jsonl"
    err = cli("run-batch", src, "-m", model, "-o", out, "--calibration", b / "cal.npy", "-q", code=2)
    assert "different config" in err.stderr


def test_a_truncation_below_the_special_tokens_is_a_400_line(cli, tiny_model, tmp_path):  # type: ignore[no-untyped-def]
    """truncate_prompt_tokens below the tokens the tokenizer adds (2 for a text, 3 for a BERT pair) was left
    uncut by the tokenizer: the whole input's numbers at 200. Below an LLM reranker's bare pair template it
    stopped the whole run. Each is now a 400 line; at the special-token count the input is cut to it."""
    import transformers as tf

    from tests.fixtures.tiny_families import build_llm_reranker
    from tests.fixtures.tiny_models import build_tiny_model

    cross = tmp_path / "ce"
    base = build_tiny_model("bert", tmp_path / "bert")
    tf.BertForSequenceClassification.from_pretrained(str(base), num_labels=1).save_pretrained(str(cross))
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (base / name).is_file():
            (cross / name).write_bytes((base / name).read_bytes())
    lines = [req("one", "/v1/embeddings", {"input": "the quick brown fox", "truncate_prompt_tokens": 1}),
             req("two", "/v1/embeddings", {"input": "the quick brown fox", "truncate_prompt_tokens": 2}),
             req("ids", "/v1/embeddings", {"input": [0, 50, 2], "truncate_prompt_tokens": 1})]
    out = run_batch(cli, tmp_path, tiny_model("bert-st"), lines, name="embed", code=3)
    assert [o["response"]["status_code"] for o in out] == [400, 200, 200]
    assert "below the 2 tokens" in out[0]["error"]["message"]
    assert out[1]["response"]["body"]["usage"]["prompt_tokens"] == 2 and out[2]["response"]["body"]["usage"]["prompt_tokens"] == 1
    lines = [req("pair", "/score", {"text_1": "cat", "text_2": "the cat", "truncate_prompt_tokens": 2}),
             req("text", "/classify", {"input": "the cat", "truncate_prompt_tokens": 1}),
             req("ok", "/rerank", {"query": "cat", "documents": ["the cat"], "truncate_prompt_tokens": 3})]
    out = run_batch(cli, tmp_path, cross, lines, name="ce", code=3)
    assert [o["response"]["status_code"] for o in out] == [400, 400, 200]
    assert "below the 3 tokens" in out[0]["error"]["message"] and "below the 2 tokens" in out[1]["error"]["message"]
    plain, _ = build_llm_reranker("qwen2", tmp_path / "llm")
    lines = [req("short", "/score", {"text_1": "cat", "text_2": "the cat", "truncate_prompt_tokens": 3}),
             req("ok", "/score", {"text_1": "cat", "text_2": "the cat"})]
    out = run_batch(cli, tmp_path, plain, lines, "--classifier-from-tokens", "no,yes", "--pair-template",
                    "Query: {query}\nDocument: {document}\nRelevant:", name="llm", code=3)
    assert [o["response"]["status_code"] for o in out] == [400, 200] and "template" in out[0]["error"]["message"]
