"""Expected response shapes, transcribed by hand from vLLM's protocol models (not from embedcli's output).

Sources (vllm-project/vllm): pooling/embed/protocol.py @ ff8d577a (EmbeddingResponse,
EmbeddingResponseData), pooling/score/protocol.py @ 1fff4ef8 (ScoreResponse, ScoreResponseData,
RerankResponse, RerankResult, RerankDocument, RerankUsage), pooling/classify/protocol.py @ dff4cad3
(ClassificationResponse, ClassificationData), pooling/pooling/protocol.py @ 343bacaf (PoolingResponse,
PoolingResponseData), openai/engine/protocol.py (UsageInfo), pooling/embed/cohere_protocol.py @ b76dd598
(CohereEmbedResponse, dumped with exclude_none), openai/run_batch.py @ 0056ae7b (BatchRequestOutput,
BatchResponseData) and openai/batch/protocol.py @ 479eabf2 (BatchError).

A schema is a type (or tuple of types), `Const(v)`, `[item_schema]` (a list of items), `Optional(...)`
(may be absent from a dict) or a dict of field -> schema: exact keys, in the pydantic model's field order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

NONE = type(None)


@dataclass(frozen=True)
class Const:
    value: Any


@dataclass(frozen=True)
class Optional:
    schema: Any


@dataclass(frozen=True)
class AnyOf:
    options: tuple[Any, ...]


USAGE_INFO = {"prompt_tokens": int, "total_tokens": int, "completion_tokens": int, "prompt_tokens_details": NONE}

EMBEDDING_RESPONSE = {
    "id": str,
    "object": Const("list"),
    "created": int,
    "model": str,
    "data": [{"index": int, "object": Const("embedding"), "embedding": AnyOf(([float], str))}],
    "usage": USAGE_INFO,
}

SCORE_RESPONSE = {
    "id": str,
    "object": Const("list"),
    "created": int,
    "model": str,
    "data": [{"index": int, "object": Const("score"), "score": float}],
    "usage": USAGE_INFO,
}

RERANK_RESPONSE = {
    "id": str,
    "model": str,
    "usage": {"prompt_tokens": int, "total_tokens": int},
    "results": [{"index": int, "document": {"text": str, "multi_modal": NONE}, "relevance_score": float}],
}

CLASSIFICATION_RESPONSE = {
    "id": str,
    "object": Const("list"),
    "created": int,
    "model": str,
    "data": [{"index": int, "label": (str, NONE), "probs": [float], "num_classes": int}],
    "usage": USAGE_INFO,
}

POOLING_RESPONSE = {
    "id": str,
    "object": Const("list"),
    "created": int,
    "model": str,
    "data": [{"index": int, "object": Const("pooling"), "data": AnyOf(([[float]], [float], str))}],
    "usage": USAGE_INFO,
}

COHERE_EMBED_RESPONSE = {
    "id": str,
    "embeddings": {
        "float": Optional([[float]]),
        "int8": Optional([[int]]),
        "uint8": Optional([[int]]),
        "binary": Optional([[int]]),
        "ubinary": Optional([[int]]),
        "base64": Optional([str]),
    },
    "texts": [str],
    "meta": {"api_version": {"version": Const("2")}, "billed_units": {"input_tokens": int}},
    "response_type": Const("embeddings_by_type"),
}


def batch_output(body: Any) -> dict[str, Any]:
    """The OpenAI Batch output line for a 200 response with `body`."""
    return {
        "id": str,
        "custom_id": str,
        "response": {"status_code": Const(200), "request_id": str, "body": body},
        "error": NONE,
    }


BATCH_ERROR_OUTPUT = {
    "id": str,
    "custom_id": (str, NONE),
    "response": {"status_code": Const(400), "request_id": str, "body": NONE},
    "error": {"code": str, "message": str, "param": (str, NONE), "line": int},
}


def check(value: Any, schema: Any, where: str = "$") -> None:
    """Raise AssertionError naming the first place `value` does not match `schema`."""
    if isinstance(schema, Const):
        assert value == schema.value, f"{where}: {value!r} != {schema.value!r}"
    elif isinstance(schema, AnyOf):
        errors = []
        for option in schema.options:
            try:
                check(value, option, where)
                return
            except AssertionError as e:
                errors.append(str(e))
        raise AssertionError(f"{where}: matches none of {errors}")
    elif isinstance(schema, list):
        assert isinstance(value, list), f"{where}: expected a list, got {type(value).__name__}"
        for i, item in enumerate(value):
            check(item, schema[0], f"{where}[{i}]")
    elif isinstance(schema, dict):
        assert isinstance(value, dict), f"{where}: expected an object, got {type(value).__name__}"
        required = [k for k, s in schema.items() if not isinstance(s, Optional)]
        assert set(required) <= set(value), f"{where}: missing {sorted(set(required) - set(value))}"
        assert set(value) <= set(schema), f"{where}: unexpected {sorted(set(value) - set(schema))}"
        order = [k for k in schema if k in value]
        assert list(value) == order, f"{where}: key order {list(value)} != {order}"
        for k, v in value.items():
            s = schema[k]
            check(v, s.schema if isinstance(s, Optional) else s, f"{where}.{k}")
    else:
        types = schema if isinstance(schema, tuple) else (schema,)
        ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
        assert ok, f"{where}: {value!r} is not {' | '.join(t.__name__ for t in types)}"
