"""Flattening requests into units and back, and response lines checked against vLLM's protocol shapes."""

from __future__ import annotations

import base64
import json
import struct
from typing import Any

import numpy as np
import pytest
from batch_models import CLASSIFIER, CROSS_ENCODER, EMBEDDER, line
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

from embedcli.batchapi import (
    BatchRequest,
    ResponseContext,
    ServedModel,
    Unit,
    UnitResult,
    decode_base64,
    encode_base64,
    flatten,
    parse_line,
    read_chunk,
    reassemble,
    response_line,
    write_chunk,
)
from embedcli.quantize import quantize

CREATED = 1_767_225_600


def ctx(model: ServedModel = EMBEDDER, ranges: np.ndarray | None = None) -> ResponseContext:
    return ResponseContext(model=model, created=CREATED, seed="run-seed", ranges=ranges)


def fake_vector(text: str, dim: int = 8) -> np.ndarray:
    """A float32 vector that depends on the text (so a result can be traced back to its input)."""
    rng = np.random.default_rng(sum(map(ord, text)) + 7 * len(text))
    return rng.standard_normal(dim).astype(np.float32)


def fake_engine(unit: Unit) -> UnitResult:
    """What the engine would give for a unit: a value traceable to its input and a token count."""
    if unit.task == "score":
        left, right = unit.input  # type: ignore[misc]
        return UnitResult(np.float32(len(left) + len(right) / 100), 2 + len(left) + len(right))
    text = unit.input if isinstance(unit.input, str) else " ".join(map(str, unit.input))
    n = 2 + len(text.split())
    if unit.task == "embed":
        return UnitResult(fake_vector(text, unit.params.dimensions or 8), n)
    if unit.task == "classify":
        return UnitResult(np.array([0.25, 0.75]) if "good" in text else np.array([0.9, 0.1]), n)
    return UnitResult(np.stack([fake_vector(text + str(i), 3) for i in range(n)]), n)


def run(text: str, model: ServedModel = EMBEDDER) -> dict[str, Any]:
    """One request line through parse → units → fake engine → response line, as JSON read back."""
    req = parse_line(text, 3, model)
    assert isinstance(req, BatchRequest), req
    chunk = read_chunk([(3, text)], model)
    out = write_chunk(chunk, [fake_engine(u) for u in chunk.flat.units], ctx(model))
    assert len(out) == 1 and "\n" not in out[0]
    return json.loads(out[0])


def body(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["response"]["body"]


# -- flatten and reassemble -------------------------------------------------------------------------------


def test_units_of_many_requests_are_flattened_in_order_and_given_back_per_request() -> None:
    texts = [
        line("/v1/embeddings", {"input": ["a", "b"]}, custom_id="r1"),
        line("/v1/embeddings", {"input": "c"}, custom_id="r2"),
        line("/rerank", {"query": "q", "documents": ["d1", "d2", "d3"]}, custom_id="r3"),
    ]
    requests = [parse_line(t, i, EMBEDDER) for i, t in enumerate(texts, 1)]
    flat = flatten(requests)  # type: ignore[arg-type]
    assert [u.input for u in flat.units] == ["a", "b", "c", ("q", "d1"), ("q", "d2"), ("q", "d3")]
    assert flat.spans == ((0, 2), (2, 3), (3, 6))
    results = [UnitResult(i, 1) for i in range(6)]
    assert [[r.value for r in rs] for rs in reassemble(flat, results)] == [[0, 1], [2], [3, 4, 5]]
    with pytest.raises(ValueError, match="5 results for 6 units"):
        reassemble(flat, results[:5])


def test_units_group_by_task_and_params() -> None:
    a = parse_line(line("/v1/embeddings", {"input": ["a", "b"], "dimensions": 4}), 1, EMBEDDER)
    b = parse_line(line("/v1/embeddings", {"input": "c"}), 2, EMBEDDER)
    c = parse_line(line("/v1/embeddings", {"input": "d", "dimensions": 4}), 3, EMBEDDER)
    groups = [u.group for u in flatten([a, b, c]).units]  # type: ignore[list-item]
    assert groups[0] == groups[1] == groups[3] != groups[2]


def test_a_chunk_answers_every_line_in_input_order_with_bad_lines_in_place() -> None:
    texts = [
        line("/v1/embeddings", {"input": ["alpha", "beta"]}, custom_id="e"),
        "{not json",
        line("/score", {"text_1": "q", "text_2": ["xx", "y"]}, custom_id="s"),
        line("/v1/embeddings", {"input": "x", "model": "another"}, custom_id="w"),
        line("/v1/embeddings", {"input": "gamma"}, custom_id="e"),
        line("/v1/embeddings", {"input": "delta"}, custom_id="last"),
    ]
    chunk = read_chunk(enumerate(texts, 1), EMBEDDER)
    results = [fake_engine(u) for u in chunk.flat.units]
    out = [json.loads(x) for x in write_chunk(chunk, results, ctx())]
    assert [o["custom_id"] for o in out] == ["e", None, "s", "w", "e", "last"]
    assert [o["response"]["status_code"] for o in out] == [200, 400, 200, 400, 400, 200]
    for o in out:
        check(o, batch_output(dict) if o["error"] is None else BATCH_ERROR_OUTPUT)
    assert [o["error"]["line"] for o in out if o["error"]] == [2, 4, 5]
    # each request got its own units' results back
    first = [decode(d["embedding"]) for d in body(out[0])["data"]]
    np.testing.assert_array_equal(first[0], fake_vector("alpha"))
    np.testing.assert_array_equal(first[1], fake_vector("beta"))
    assert [d["score"] for d in body(out[2])["data"]] == [pytest.approx(1.02), pytest.approx(1.01)]
    np.testing.assert_array_equal(decode(body(out[5])["data"][0]["embedding"]), fake_vector("delta"))


def decode(value: Any) -> np.ndarray:
    return np.asarray(value, dtype=np.float32)


# -- bodies against vLLM's shapes ----------------------------------------------------------------------------


def test_embedding_response_shape_and_values() -> None:
    out = run(line("/v1/embeddings", {"input": ["one two", "three"]}))
    check(out, batch_output(EMBEDDING_RESPONSE))
    b = body(out)
    assert b["id"].startswith("embd-") and b["model"] == "tiny-embed" and b["created"] == CREATED
    assert [d["index"] for d in b["data"]] == [0, 1]
    # float format: the exact float32 values
    assert b["data"][0]["embedding"] == [float(x) for x in fake_vector("one two")]
    assert b["usage"] == {"prompt_tokens": 4 + 3, "total_tokens": 7, "completion_tokens": 0,
                          "prompt_tokens_details": None}
    assert out["custom_id"] == "req-1" and out["error"] is None


def test_base64_is_little_endian_float32_of_the_float_vector() -> None:
    floats = body(run(line("/v1/embeddings", {"input": ["a b", "c"]})))["data"]
    coded = body(run(line("/v1/embeddings", {"input": ["a b", "c"], "encoding_format": "base64"})))
    check(coded, EMBEDDING_RESPONSE)
    for f, c in zip(floats, coded["data"], strict=True):
        raw = base64.b64decode(c["embedding"])
        assert list(struct.unpack(f"<{len(raw) // 4}f", raw)) == f["embedding"]


@pytest.mark.parametrize(("dtype", "endianness", "fmt"), [
    ("float32", "native", "<f4"), ("float32", "little", "<f4"), ("float32", "big", ">f4"), ("float16", "little", "<f2"),
])
def test_base64_round_trip(dtype: str, endianness: str, fmt: str) -> None:
    v = np.array([0.1, -2.5, 3e-3, 1e4], dtype=np.float32)
    text = encode_base64(v, dtype, endianness)
    assert base64.b64decode(text) == v.astype(fmt).tobytes()
    np.testing.assert_array_equal(decode_base64(text, dtype, endianness), v.astype(fmt).astype(np.float32))


def test_dimensions_reach_the_engine_and_the_vector_is_not_cut_again() -> None:
    out = run(line("/v1/embeddings", {"input": "x y", "dimensions": 4}))
    assert len(body(out)["data"][0]["embedding"]) == 4  # the engine sliced (as --dimensions); no re-slicing
    assert body(out)["data"][0]["embedding"] == [float(x) for x in fake_vector("x y", 4)]


def test_score_response_shape_in_pair_order() -> None:
    out = run(line("/v1/score", {"text_1": "q", "text_2": ["abc", "d"]}), CROSS_ENCODER)
    check(out, batch_output(SCORE_RESPONSE))
    b = body(out)
    assert [(d["index"], d["score"]) for d in b["data"]] == [(0, float(np.float32(1.03))), (1, float(np.float32(1.01)))]
    assert b["usage"]["prompt_tokens"] == (2 + 4) + (2 + 2)


def test_rerank_response_sorted_descending_stable_and_cut_to_top_n() -> None:
    req = parse_line(line("/rerank", {"query": "q", "documents": ["a", "b", "c", "d"], "top_n": 3}), 5, CROSS_ENCODER)
    assert isinstance(req, BatchRequest)
    scores = [0.2, 0.9, 0.2, 0.5]  # ties between documents 0 and 2 keep input order
    out = json.loads(json.dumps(response_line(req, [UnitResult(np.float32(s), 3) for s in scores], ctx(CROSS_ENCODER))))
    check(out, batch_output(RERANK_RESPONSE))
    b = body(out)
    assert [(r["index"], r["document"]["text"]) for r in b["results"]] == [(1, "b"), (3, "d"), (0, "a")]
    assert [r["relevance_score"] for r in b["results"]] == [float(np.float32(s)) for s in (0.9, 0.5, 0.2)]
    assert b["usage"] == {"prompt_tokens": 12, "total_tokens": 12}
    assert b["model"] == "tiny-ce"


def test_rerank_top_n_zero_or_large_keeps_all_and_return_documents_false_drops_them() -> None:
    out = run(line("/v2/rerank", {"query": "q", "documents": ["a", "bb"], "top_n": 5, "return_documents": False}),
              CROSS_ENCODER)
    results = body(out)["results"]
    assert [r["index"] for r in results] == [1, 0]
    assert all(list(r) == ["index", "relevance_score"] for r in results)


def test_classification_response_labels_from_id2label() -> None:
    out = run(line("/classify", {"input": ["good film", "bad"]}), CLASSIFIER)
    check(out, batch_output(CLASSIFICATION_RESPONSE))
    data = body(out)["data"]
    assert [(d["label"], d["num_classes"]) for d in data] == [("pos", 2), ("neg", 2)]
    assert data[0]["probs"] == [0.25, 0.75]
    assert body(out)["id"].startswith("classify-")


def test_classification_label_is_null_without_a_mapping() -> None:
    unlabeled = ServedModel(names=("u",), tasks=frozenset({"classify"}))
    assert body(run(line("/classify", {"input": "good"}), unlabeled))["data"][0]["label"] is None


@pytest.mark.parametrize(("model", "task", "depth"), [
    (EMBEDDER, "embed", 1), (EMBEDDER, "token_embed", 2), (CLASSIFIER, "classify", 1), (CLASSIFIER, "token_classify", 2),
])
def test_pooling_response_per_task(model: ServedModel, task: str, depth: int) -> None:
    out = run(line("/pooling", {"input": ["a b c"], "task": task}), model)
    check(out, batch_output(POOLING_RESPONSE))
    data = body(out)["data"][0]["data"]
    assert np.asarray(data).ndim == depth
    if depth == 2:
        assert len(data) == 2 + 3  # one row per prompt token
    coded = run(line("/pooling", {"input": ["a b c"], "task": task, "encoding_format": "base64"}), model)
    raw = decode_base64(body(coded)["data"][0]["data"])
    np.testing.assert_array_equal(raw, np.asarray(data, dtype=np.float32).reshape(-1))
    assert body(out)["id"].startswith("pool-")


# -- /v2/embed embedding types = --precision -----------------------------------------------------------------


def _packed_bits(v: np.ndarray) -> list[int]:
    """Bits x > 0, 8 per byte, most significant first, zero-padded (written out by hand)."""
    bits = [1 if x > 0 else 0 for x in v] + [0] * (-len(v) % 8)
    return [sum(b << (7 - i) for i, b in enumerate(bits[k : k + 8])) for k in range(0, len(bits), 8)]


def test_cohere_embed_types_are_embedcli_precisions() -> None:
    texts = ["red", "green", "blue"]
    out = run(line("/v2/embed", {"texts": texts, "input_type": "document",
                                 "embedding_types": ["ubinary", "float", "int8", "uint8", "binary", "base64"]}))
    check(out, batch_output(COHERE_EMBED_RESPONSE))
    b = body(out)
    vectors = np.stack([fake_vector("passage: " + t) for t in texts])
    assert list(b["embeddings"]) == ["float", "int8", "uint8", "binary", "ubinary", "base64"]
    assert b["embeddings"]["float"] == vectors.tolist()
    # int8/uint8: sentence-transformers' scalar quantization over the request's vectors, by hand in float32
    lo, hi = vectors.min(axis=0), vectors.max(axis=0)
    steps = (hi - lo) / np.float32(255)
    q = np.clip(np.floor((vectors - lo) / steps), 0, 255)
    assert b["embeddings"]["uint8"] == q.astype(int).tolist()
    assert b["embeddings"]["int8"] == (q.astype(int) - 128).tolist()
    assert b["embeddings"]["ubinary"] == [_packed_bits(v) for v in vectors]
    assert b["embeddings"]["binary"] == [[x - 128 for x in _packed_bits(v)] for v in vectors]
    for name in ("int8", "uint8", "binary", "ubinary"):  # and they are what --precision writes
        ranges = np.stack([lo, hi]) if name in ("int8", "uint8") else None
        assert b["embeddings"][name] == quantize(vectors, name, ranges).tolist()
    assert [decode_base64(s).tolist() for s in b["embeddings"]["base64"]] == vectors.tolist()
    assert b["texts"] == texts  # as sent, without the prompt
    assert b["meta"]["billed_units"]["input_tokens"] == 3 * (2 + 2)


def test_cohere_int8_uses_the_runs_calibration_ranges() -> None:
    req = parse_line(line("/v2/embed", {"texts": ["a"], "embedding_types": ["uint8"]}), 1, EMBEDDER)
    assert isinstance(req, BatchRequest)
    v = np.linspace(-1, 1, 8, dtype=np.float32)
    ranges = np.stack([np.full(8, -2, np.float32), np.full(8, 2, np.float32)])
    out = response_line(req, [UnitResult(v, 3)], ctx(ranges=ranges))
    expected = np.clip(np.floor((v + 2) / np.float32(4 / 255)), 0, 255).astype(int).tolist()
    assert body(out)["embeddings"]["uint8"] == [expected]


def test_cohere_binary_pads_a_dimension_that_is_not_a_multiple_of_8() -> None:
    req = parse_line(line("/v2/embed", {"texts": ["a"], "embedding_types": ["ubinary"]}), 1, EMBEDDER)
    assert isinstance(req, BatchRequest)
    v = np.array([1, -1, 1, 1, -1, -1, 1, -1, 1, 1], dtype=np.float32)
    assert body(response_line(req, [UnitResult(v, 1)], ctx()))["embeddings"]["ubinary"] == [[0b10110010, 0b11000000]]


def test_cohere_truncate_none_with_max_tokens_refuses_longer_inputs_afterwards() -> None:
    req = parse_line(line("/v2/embed", {"texts": ["a", "b"], "truncate": "NONE", "max_tokens": 4}), 9, EMBEDDER)
    assert isinstance(req, BatchRequest)
    out = json.loads(json.dumps(response_line(req, [UnitResult(np.ones(8), 4), UnitResult(np.ones(8), 5)], ctx())))
    check(out, BATCH_ERROR_OUTPUT)
    assert out["error"]["param"] == "body.texts[1]"
    assert out["error"]["message"].startswith("line 9: body.texts[1]: Input of 5 tokens exceeds max_tokens=4")


# -- ids, errors, determinism ------------------------------------------------------------------------------


def test_error_line_shape() -> None:
    out = json.loads(write_chunk(read_chunk([(4, line("/nope", {}))], EMBEDDER), [], ctx())[0])
    check(out, BATCH_ERROR_OUTPUT)
    assert out["custom_id"] == "req-1"
    assert out["error"]["message"].startswith("line 4: url: unknown route '/nope'")
    assert (out["error"]["param"], out["error"]["line"]) == ("url", 4)


def test_same_run_same_bytes_and_ids_differ_per_line() -> None:
    text = line("/v1/embeddings", {"input": ["a", "b"]})
    chunk = read_chunk([(1, text), (2, text.replace("req-1", "req-2"))], EMBEDDER)
    results = [fake_engine(u) for u in chunk.flat.units]
    once, again = write_chunk(chunk, results, ctx()), write_chunk(chunk, results, ctx())
    assert once == again
    ids = [json.loads(x)["id"] for x in once]
    assert ids[0] != ids[1]
    other_run = ResponseContext(model=EMBEDDER, created=CREATED, seed="another-run")
    assert write_chunk(chunk, results, other_run) != once


def test_a_non_finite_score_is_written_as_null() -> None:
    req = parse_line(line("/score", {"text_1": "q", "text_2": "d"}), 1, EMBEDDER)
    assert isinstance(req, BatchRequest)
    out = response_line(req, [UnitResult(float("-inf"), 2)], ctx())
    assert body(out)["data"][0]["score"] is None
    json.loads(json.dumps(out, allow_nan=False))


def test_lines_are_written_as_pydantic_writes_them_for_vllm() -> None:
    from embedcli.batchapi import dumps

    # vLLM's run_batch writes `model_dump_json()`: compact, UTF-8 as is, shortest floats, inf/nan as null.
    obj = {"v": [1e-6, 0.1, float("nan"), float("inf")], "t": "é ü", "n": None, "b": True}
    assert dumps(obj) == '{"v":[1e-6,0.1,null,null],"t":"é ü","n":null,"b":true}'
