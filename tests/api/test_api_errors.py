"""The API raises embedcli's own exceptions with clear messages (never exits): bad in-memory inputs, refused
options and tasks a model cannot do."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from embedcli.errors import EmbedcliError, UsageError

# (model, method, positional arguments, keyword arguments, message)
CASES: dict[str, tuple[str, str, tuple[Any, ...], dict[str, Any], str]] = {
    "empty": ("static", "embed", ([],), {}, "texts is empty: give at least one"),
    "none-item": ("static", "embed", (["a", None],), {}, r"texts\[1\] is NoneType, not str"),
    "bytes-item": ("cross-encoder", "classify", ([b"a"],), {}, r"texts\[0\] is bytes, not str"),
    "bytes-among-pairs": ("nli", "classify", ([("a", "b"), b"c"],), {}, r"texts\[1\] is bytes, not str"),
    "not-a-list": ("static", "embed", (42,), {}, "texts: give a list, not int"),
    "generator-ok-but-empty": ("static", "embed", ((t for t in ()),), {}, "texts is empty"),
    "mixed-pairs": ("nli", "classify", ([("a", "b"), "c"],), {}, r"texts\[1\] is a text among text pairs: give texts \(str\) or text pairs"),
    "short-pair": ("nli", "classify", ([("a", "b"), ("c",)],), {}, r"texts\[1\] is a tuple of 1: a text pair is 2 texts"),
    "pair-of-int": ("nli", "classify", ([("a", 3)],), {}, r"texts\[0\]\[1\] is int, not str"),
    "mismatched-pairs": ("cross-encoder", "score", (["a", "b"], ["c", "d", "e"]), {},
                         "score: 2 left texts but 3 right texts; give as many of each"),
    "empty-right": ("cross-encoder", "score", ("a", []), {}, "right is empty"),
    "no-documents": ("cross-encoder", "rerank", ("q", []), {}, "documents is empty"),
    "ids-count": ("cross-encoder", "rerank", ("q", ["a"]), {"ids": [1, 2]}, "ids: 2 ids for 1 rows"),
    "ids-mixed": ("cross-encoder", "rerank", ("q", ["a", "b"]), {"ids": [1, "x"]}, "a mix of str and int ids"),
    "ids-float": ("cross-encoder", "rerank", ("q", ["a"]), {"ids": [1.5]}, r"ids\[0\] is float: ids are str or int"),
    "query-ids-count": ("cross-encoder", "rerank", (["q", "r"], ["a"]), {"query_ids": ["x"]},
                        "query_ids: 1 ids for 2 queries"),
    "top-n": ("cross-encoder", "rerank", ("q", ["a"]), {"top_n": -1}, "--top-n -1: must be 0"),
    "top-k-labels": ("nli", "classify", (["a"],), {"top_k": 4}, "--top-k 4: the model has 3 labels"),
    "activation": ("nli", "classify", (["a"],), {"activation": "tanh"}, "--activation 'tanh': choose one of"),
    "cannot-classify": ("static", "classify", (["a"],), {}, "cannot do 'classify'"),
    "static-score": ("static", "score", ("a", ["b"]), {}, "a static embedding model serves embed only"),
    "cannot-embed": ("cross-encoder", "embed", (["a"],), {}, "cannot do 'embed'"),
    "role-not-colbert": ("static", "token_embed", (["a"],), {"role": "query"}, "cannot do 'token_embed'"),
    "chunk-sparse": ("splade", "sparse_embed", (["a"],), {"long_inputs": "chunk"}, "--long-inputs chunk applies to embed only"),
    "sparse-top-k": ("splade", "sparse_embed", (["a"],), {"top_k": 0}, "--sparse-top-k 0: must be at least 1"),
    "precision": ("static", "embed", (["a", "b"],), {"precision": "int4"}, "--precision 'int4': choose one of"),
    "int8-one-row": ("static", "embed", (["a"],), {"precision": "int8"}, "ranges cannot be computed from a single"),
    "prompt-conflict": ("static", "embed", (["a"],), {"prompt": "x", "prompt_name": "query"}, "--prompt and --prompt-name conflict"),
    "search-no-file": ("static", "search", ("q", "missing.parquet"), {}, "missing.parquet: no such vectors file"),
    "search-top-k": ("static", "search", ("q", np.zeros((2, 16), np.float32)), {"top_k": 0}, "--top-k 0: must be 1 or more"),
    "search-int-matrix": ("static", "search", ("q", np.zeros((2, 16), np.int8)), {}, "give a float matrix"),
    "search-keep-cols": ("static", "search", ("q", np.zeros((2, 16), np.float32)), {"keep_cols": ["text"]},
                         "keep_cols are columns of a vectors file"),
    "search-ids": ("static", "search", ("q", np.zeros((2, 16), np.float32)), {"ids": ["a"]}, "ids: 1 ids for 2 rows"),
    "weights-not-m3": ("cross-encoder", "score", ("a", ["b"]), {"weights": [1, 1, 1]}, "--weights combine BGE-M3's"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_raises_a_usage_error(case: str, api_model: Callable[[str], Path]) -> None:
    from embedcli import Embedder

    name, method, args, kwargs, message = CASES[case]
    embedder = Embedder(str(api_model(name)), device="cpu", dtype="float32")
    with pytest.raises(UsageError, match=message):
        getattr(embedder, method)(*args, **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"dtype": "float64"}, UsageError, "--dtype 'float64': choose one of"),
        ({"device": "tpu"}, UsageError, "--device 'tpu': choose one of"),
        ({"threads": 0}, UsageError, "--threads 0: must be 1 or more"),
        ({"reranker_preset": "nope"}, UsageError, "--reranker-preset 'nope': choose one of qwen3-reranker"),
        ({"pair_template": "{query} only"}, UsageError, "lacks {document}"),
        ({"classifier_from_tokens": ["no", "yes", "maybe"]}, UsageError, "give one token or two"),
        ({"model": "/nonexistent/model-folder"}, EmbedcliError, "model-folder"),
    ],
)
def test_bad_model_flags_are_refused_when_the_embedder_is_made(
    kwargs: dict[str, Any], error: type[Exception], message: str, api_model: Callable[[str], Path]
) -> None:
    from embedcli import Embedder

    with pytest.raises(error, match=message):
        Embedder(**{"model": str(api_model("static")), **kwargs})


def test_quantize_applies_to_embed_only(api_model: Callable[[str], Path]) -> None:
    from embedcli import Embedder

    embedder = Embedder(str(api_model("cross-encoder")), device="cpu", quantize=True)
    with pytest.raises(UsageError, match=r"score: quantize=True .* applies to embed only"):
        embedder.score("a", ["b"])
