"""Served models and request lines shared by the batch API tests."""

from __future__ import annotations

import json
from typing import Any

from embedcli.batchapi import ServedModel

EMBEDDER = ServedModel(
    names=("tiny-embed", "/models/tiny-embed"),
    tasks=frozenset({"embed", "token_embed"}),
    embedding_size=8,
    is_matryoshka=True,
    matryoshka_dimensions=(4, 8),
    max_length=64,
    prompts={"query": "query: ", "document": "passage: "},
    score_method="cosine",
)
CROSS_ENCODER = ServedModel(
    names=("tiny-ce",), tasks=frozenset({"classify"}), max_length=64, id2label={0: "LABEL_0"},
    score_method="cross-encoder",
)
CLASSIFIER = ServedModel(
    names=("tiny-cls",), tasks=frozenset({"classify", "token_classify"}), max_length=64,
    id2label={0: "neg", 1: "pos"},
)
PLAIN_EMBEDDER = ServedModel(names=("plain",), tasks=frozenset({"embed"}), embedding_size=8, max_length=64)


def line(url: str, body: Any, custom_id: Any = "req-1", method: str = "POST") -> str:
    return json.dumps({"custom_id": custom_id, "method": method, "url": url, "body": body})


