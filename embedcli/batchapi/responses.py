"""Response lines: the route's response body as vLLM returns it, wrapped in the OpenAI Batch output object.

Mirrored shapes (vllm-project/vllm), field order as the pydantic models declare it, `None` fields written
as `null` (vLLM serves `model_dump()` and `run_batch` writes `model_dump_json()`):
- line: `{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}` —
  `BatchRequestOutput` / `BatchResponseData`, vllm/entrypoints/openai/run_batch.py @ 0056ae7b; a bad line
  is `status_code` 400 with `body: null` (as its `make_error_request_output`) and `error` a
  `BatchError` object `{"code", "message", "param", "line"}` (openai/batch/protocol.py @ 479eabf2);
- `usage`: `UsageInfo` `{"prompt_tokens", "total_tokens", "completion_tokens": 0, "prompt_tokens_details"}`
  (openai/engine/protocol.py); rerank's own `RerankUsage` `{"prompt_tokens", "total_tokens"}`;
- `/v1/embeddings`: `EmbeddingResponse` `{"id": "embd-…", "object": "list", "created", "model", "data":
  [{"index", "object": "embedding", "embedding"}], "usage"}` — pooling/embed/protocol.py @ ff8d577a;
- `/score`: `ScoreResponse` (`data: [{"index", "object": "score", "score"}]`, id prefix `embd-` as vLLM's
  default) and `/rerank`: `RerankResponse` `{"id", "model", "usage", "results": [{"index", "document":
  {"text", "multi_modal"}, "relevance_score"}]}` — pooling/score/protocol.py @ 1fff4ef8; results sorted by
  score descending, ties in document order, cut to `top_n` when 0 < top_n < documents;
  `return_documents: false` (Cohere's flag) drops the `document` key;
- `/classify`: `ClassificationResponse` (`data: [{"index", "label", "probs", "num_classes"}]`, label =
  id2label[argmax], null without a mapping) — pooling/classify/protocol.py @ dff4cad3;
- `/pooling`: `PoolingResponse` (`data: [{"index", "object": "pooling", "data"}]`, a vector, a per-token
  matrix, or base64) — pooling/pooling/protocol.py @ 343bacaf;
- a SPLADE model's vectors (`/pooling`, `/v1/embeddings`): the dense vocabulary-sized list, zeros off the
  non-zero entries, as vLLM's `BertSpladeSparseEmbeddingModel` answers its `embed` task (its
  `SPLADESparsePooler` returns a `[vocab]` tensor, model_executor/models/bert.py) and as `PoolingResponse`
  types `data` (a list of floats or base64): clients parse it unchanged. The non-zero entries are
  `sparse-embed`'s indices and values; `sparse-embed` is the compact output for corpora;
- `/v2/embed`: `CohereEmbedResponse` `{"id", "embeddings": {type: [...]}, "texts", "meta": {"api_version":
  {"version": "2"}, "billed_units": {"input_tokens"}}, "response_type": "embeddings_by_type"}` with None
  fields left out — pooling/embed/cohere_protocol.py @ b76dd598 (Cohere's documented shape).
  The types are embedcli's `--precision` (embedcli.quantize): binary/ubinary use bit = x > 0 and pad a
  dimension that is not a multiple of 8 (vLLM: x >= 0, refuses such dims); int8/uint8 use the run's
  calibration ranges when it has them, else the min/max over the request's own texts, as
  sentence-transformers' `quantize_embeddings` over one `encode` call.

Ids and `created` are not random: they come from the `ResponseContext` (a run constant and a hash of the
run's seed and the line number), so a killed and resumed run writes the same bytes as an uninterrupted one.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pydantic_core

from embedcli.batchapi.encoding import encode_base64
from embedcli.batchapi.requests import BadLine, BatchRequest, ResponseOptions
from embedcli.batchapi.served import ServedModel
from embedcli.batchapi.units import UnitResult
from embedcli.quantize import quantize, ranges_of
from embedcli.scoring import rank_order

BODY_ID_PREFIX: dict[str, str] = {
    "embeddings": "embd",
    "cohere_embed": "embd",
    "score": "embd",
    "rerank": "rerank",
    "classify": "classify",
    "pooling": "pool",
}
# Key order of Cohere's `embeddings` object (vLLM's CohereEmbedByTypeEmbeddings, plus Cohere's int8/uint8).
_COHERE_TYPE_ORDER: tuple[str, ...] = ("float", "int8", "uint8", "binary", "ubinary", "base64")


@dataclass(frozen=True, eq=False)
class ResponseContext:
    """Run constants every response line is built from."""

    model: ServedModel
    created: int  # unix seconds, fixed for the run (a resumed run reuses it)
    seed: str  # makes ids unique to the run and repeatable (e.g. the config hash and the input's name)
    ranges: np.ndarray | None = None  # int8/uint8 ranges from `--calibration` ([2, dim])

    def token(self, line: int) -> str:
        """A 32-hex-digit id for a line, repeatable for the same seed."""
        return hashlib.sha256(f"{self.seed}\0{line}".encode()).hexdigest()[:32]


def dumps(obj: dict[str, Any]) -> str:
    """One output line (no newline), written by the serializer vLLM's `model_dump_json` uses.

    pydantic-core writes compact JSON, UTF-8 as is, floats as their shortest repr (`1e-6`, not Python's
    `1e-06`), inf/nan as null — the same bytes as vLLM's run_batch — and 7x faster than `json.dumps` on
    vectors, which matters when thousands of one-text requests must cost what `embed` costs.
    """
    return pydantic_core.to_json(obj, inf_nan_mode="null").decode("utf-8")


def error_line(bad: BadLine, ctx: ResponseContext) -> dict[str, Any]:
    """The 400 output object for a bad request line."""
    token = ctx.token(bad.line)
    return {
        "id": f"embedcli-{token}",
        "custom_id": bad.custom_id,
        "response": {"status_code": 400, "request_id": f"embedcli-batch-{token}", "body": None},
        "error": {"code": "invalid_request", "message": bad.text, "param": bad.param, "line": bad.line},
    }


def response_line(request: BatchRequest, results: Sequence[UnitResult], ctx: ResponseContext) -> dict[str, Any]:
    """The 200 output object for a request from its units' results (or a 400 if a result breaks a limit)."""
    if len(results) != len(request.units):
        raise ValueError(f"line {request.line}: {len(results)} results for {len(request.units)} units")
    limit = request.options.max_tokens
    if limit is not None:
        for i, r in enumerate(results):
            if r.tokens > limit:
                message = (
                    f"Input of {r.tokens} tokens exceeds max_tokens={limit} with truncate=NONE. "
                    "Set truncate to END or START to allow truncation."
                )
                return error_line(BadLine(request.line, request.custom_id, message, f"body.texts[{i}]"), ctx)
    token = ctx.token(request.line)
    body = _BODIES[request.route](request, results, ctx, f"{BODY_ID_PREFIX[request.route]}-{token}")
    return {
        "id": f"embedcli-{token}",
        "custom_id": request.custom_id,
        "response": {"status_code": 200, "request_id": f"embedcli-batch-{token}", "body": body},
        "error": None,
    }


# -- bodies -------------------------------------------------------------------------------------------


def _usage(results: Sequence[UnitResult]) -> dict[str, Any]:
    n = sum(int(r.tokens) for r in results)
    return {"prompt_tokens": n, "total_tokens": n, "completion_tokens": 0, "prompt_tokens_details": None}


def _floats(value: Any) -> Any:
    """float32 values as JSON numbers (the exact float32 value, as vLLM's `tensor.tolist()`)."""
    return np.asarray(value, dtype=np.float32).tolist()


def _score(value: Any) -> float | None:
    x = float(np.float32(value))
    return x if math.isfinite(x) else None  # pydantic writes inf/nan as null


def _dense(value: Any, ctx: ResponseContext) -> Any:
    """A sparse `(indices, values)` result as the vocabulary-sized vector vLLM's SPLADE `embed` returns."""
    if not isinstance(value, tuple):
        return value
    indices, values = value
    size = ctx.model.embedding_size
    assert size is not None  # a SPLADE model's embedding size is its vocabulary
    vector = np.zeros(size, dtype=np.float32)
    vector[np.asarray(indices, dtype=np.int64)] = np.asarray(values, dtype=np.float32)
    return vector


def _encoded(value: Any, options: ResponseOptions) -> Any:
    if options.encoding_format == "base64":
        return encode_base64(value, options.embed_dtype, options.endianness)
    return _floats(value)


def _list_body(results: Sequence[UnitResult], ctx: ResponseContext, body_id: str,
               data: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": body_id,
        "object": "list",
        "created": ctx.created,
        "model": ctx.model.name,
        "data": data,
        "usage": _usage(results),
    }


def _embeddings(request: BatchRequest, results: Sequence[UnitResult], ctx: ResponseContext,
                body_id: str) -> dict[str, Any]:
    data = [
        {"index": i, "object": "embedding", "embedding": _encoded(_dense(r.value, ctx), request.options)}
        for i, r in enumerate(results)
    ]
    return _list_body(results, ctx, body_id, data)


def _pooling(request: BatchRequest, results: Sequence[UnitResult], ctx: ResponseContext,
             body_id: str) -> dict[str, Any]:
    data = [
        {"index": i, "object": "pooling", "data": _encoded(_dense(r.value, ctx), request.options)}
        for i, r in enumerate(results)
    ]
    return _list_body(results, ctx, body_id, data)


def _score_body(request: BatchRequest, results: Sequence[UnitResult], ctx: ResponseContext,
                body_id: str) -> dict[str, Any]:
    data = [{"index": i, "object": "score", "score": _score(r.value)} for i, r in enumerate(results)]
    return _list_body(results, ctx, body_id, data)


def _label(id2label: Any, index: int) -> str | None:
    if index in id2label:
        return str(id2label[index])
    return str(id2label[str(index)]) if str(index) in id2label else None


def _classify(request: BatchRequest, results: Sequence[UnitResult], ctx: ResponseContext,
              body_id: str) -> dict[str, Any]:
    data = []
    for i, r in enumerate(results):
        probs = np.asarray(r.value, dtype=np.float32).reshape(-1)
        label = _label(ctx.model.id2label, int(np.argmax(probs))) if len(probs) else None
        data.append({"index": i, "label": label, "probs": probs.tolist(), "num_classes": len(probs)})
    return _list_body(results, ctx, body_id, data)


def _rerank(request: BatchRequest, results: Sequence[UnitResult], ctx: ResponseContext,
            body_id: str) -> dict[str, Any]:
    scores = np.asarray([np.float32(r.value) for r in results], dtype=np.float32)
    order = rank_order(scores)
    top_n = request.options.top_n
    if 0 < top_n < len(order):
        order = order[:top_n]
    out = []
    for i in order.tolist():
        item: dict[str, Any] = {"index": i}
        if request.options.return_documents:
            item["document"] = {"text": request.options.echo[i], "multi_modal": None}
        item["relevance_score"] = _score(scores[i])
        out.append(item)
    n = sum(int(r.tokens) for r in results)
    return {"id": body_id, "model": ctx.model.name, "usage": {"prompt_tokens": n, "total_tokens": n}, "results": out}


def _cohere_embed(request: BatchRequest, results: Sequence[UnitResult], ctx: ResponseContext,
                  body_id: str) -> dict[str, Any]:
    vectors = np.stack([np.asarray(r.value, dtype=np.float32).reshape(-1) for r in results])
    wanted = set(request.options.embedding_types)
    embeddings: dict[str, Any] = {}
    for kind in _COHERE_TYPE_ORDER:
        if kind not in wanted:
            continue
        if kind == "float":
            embeddings[kind] = vectors.tolist()
        elif kind == "base64":
            embeddings[kind] = [encode_base64(v, "float32", "little") for v in vectors]
        elif kind in ("int8", "uint8"):
            ranges = ctx.ranges if ctx.ranges is not None else ranges_of(vectors)
            embeddings[kind] = quantize(vectors, kind, ranges).tolist()
        else:
            embeddings[kind] = quantize(vectors, kind).tolist()
    n = sum(int(r.tokens) for r in results)
    return {
        "id": body_id,
        "embeddings": embeddings,
        "texts": list(request.options.echo),
        "meta": {"api_version": {"version": "2"}, "billed_units": {"input_tokens": n}},
        "response_type": "embeddings_by_type",
    }


_BODIES = {
    "embeddings": _embeddings,
    "cohere_embed": _cohere_embed,
    "score": _score_body,
    "rerank": _rerank,
    "classify": _classify,
    "pooling": _pooling,
}
