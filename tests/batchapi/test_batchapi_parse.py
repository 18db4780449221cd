"""Request lines per route, as vLLM's protocol names their fields, and every kind of bad line."""

from __future__ import annotations

import json
from typing import Any

import pytest
from batch_models import CLASSIFIER, CROSS_ENCODER, EMBEDDER, PLAIN_EMBEDDER, line

from embedcli.batchapi import (
    BadLine,
    BatchRequest,
    SeenIds,
    ServedModel,
    Unit,
    UnitParams,
    parse_line,
    parse_lines,
    scan_custom_ids,
)


def parsed(url: str, body: Any, model: ServedModel = EMBEDDER) -> BatchRequest:
    out = parse_line(line(url, body), 7, model)
    assert isinstance(out, BatchRequest), out
    assert (out.line, out.custom_id, out.url) == (7, "req-1", url)
    return out


# -- /v1/embeddings -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "inputs"),
    [
        ("hello", ["hello"]),
        (["a", "b", "c"], ["a", "b", "c"]),
        ([101, 7, 102], [(101, 7, 102)]),
        ([[101, 102], [101, 5, 102]], [(101, 102), (101, 5, 102)]),
        ("", [""]),
    ],
)
def test_embeddings_input_forms(value: Any, inputs: list[Any]) -> None:
    req = parsed("/v1/embeddings", {"input": value})
    assert req.route == "embeddings"
    assert [u.input for u in req.units] == inputs
    assert {u.task for u in req.units} == {"embed"}
    assert req.options.encoding_format == "float"


def test_embeddings_fields_map_to_unit_params_and_options() -> None:
    body = {
        "model": "tiny-embed", "input": ["a", "b"], "dimensions": 4, "encoding_format": "base64",
        "truncate_prompt_tokens": 10, "normalize": False, "user": "someone", "embed_dtype": "float16",
        "endianness": "big", "request_id": "ignored", "some_unknown_field": 1,
    }
    req = parsed("/v1/embeddings", body)
    assert req.units == (
        Unit("embed", "a", UnitParams(use_activation=False, dimensions=4, truncate_prompt_tokens=10)),
        Unit("embed", "b", UnitParams(use_activation=False, dimensions=4, truncate_prompt_tokens=10)),
    )
    assert (req.options.encoding_format, req.options.embed_dtype, req.options.endianness) == (
        "base64", "float16", "big"
    )


def test_model_may_be_absent_or_any_served_name() -> None:
    assert parsed("/v1/embeddings", {"input": "x"}).units[0].input == "x"
    assert parsed("/v1/embeddings", {"input": "x", "model": "/models/tiny-embed"}).units[0].input == "x"


def test_dimensions_follow_matryoshka_sizes_like_the_dimensions_flag() -> None:
    assert parsed("/v1/embeddings", {"input": "x", "dimensions": 8}).units[0].params.dimensions == 8
    any_size = ServedModel(names=("m",), tasks=frozenset({"embed"}), embedding_size=8, is_matryoshka=True)
    assert parsed("/v1/embeddings", {"input": "x", "dimensions": 3}, any_size).units[0].params.dimensions == 3


# -- /v2/embed (Cohere) ---------------------------------------------------------------------------------


def test_cohere_embed_input_type_prepends_the_model_prompt() -> None:
    req = parsed("/v2/embed", {"texts": ["cats", "dogs"], "input_type": "query", "embedding_types": ["int8", "float"]})
    assert req.route == "cohere_embed"
    assert [u.input for u in req.units] == ["query: cats", "query: dogs"]
    assert req.options.echo == ("cats", "dogs")  # Cohere echoes the texts as sent
    assert req.options.embedding_types == ("int8", "float")


def test_cohere_embed_without_input_type_sends_texts_unchanged() -> None:
    req = parsed("/v2/embed", {"texts": ["cats"]})
    assert [u.input for u in req.units] == ["cats"]
    assert req.options.embedding_types == ("float",)


@pytest.mark.parametrize(
    ("fields", "tokens", "side", "check"),
    [
        ({}, -1, None, None),  # END by default: cut at the max length
        ({"truncate": "END"}, -1, None, None),
        ({"truncate": "START"}, -1, "left", None),
        ({"truncate": "NONE"}, None, None, None),
        ({"truncate": "END", "max_tokens": 5}, 5, None, None),
        ({"truncate": "START", "max_tokens": 5}, 5, "left", None),
        ({"truncate": "NONE", "max_tokens": 5}, None, None, 5),  # not cut, refused afterwards
    ],
)
def test_cohere_truncate_as_vllm_resolves_it(fields: dict[str, Any], tokens: Any, side: Any, check: Any) -> None:
    req = parsed("/v2/embed", {"texts": ["x"], **fields})
    assert (req.units[0].params.truncate_prompt_tokens, req.units[0].params.truncation_side) == (tokens, side)
    assert req.options.max_tokens == check


def test_cohere_output_dimension_is_dimensions() -> None:
    assert parsed("/v2/embed", {"texts": ["x"], "output_dimension": 4}).units[0].params.dimensions == 4


# -- /score, /rerank --------------------------------------------------------------------------------------


@pytest.mark.parametrize("url", ["/score", "/v1/score"])
@pytest.mark.parametrize(
    ("fields", "pairs"),
    [
        ({"text_1": "q", "text_2": "d"}, [("q", "d")]),
        ({"text_1": ["q"], "text_2": ["d1", "d2"]}, [("q", "d1"), ("q", "d2")]),
        ({"text_1": "q", "text_2": ["d1", "d2", "d3"]}, [("q", "d1"), ("q", "d2"), ("q", "d3")]),
        ({"queries": ["a", "b"], "documents": ["c", "d"]}, [("a", "c"), ("b", "d")]),
        ({"queries": "a", "items": ["c", "d"]}, [("a", "c"), ("a", "d")]),
        ({"data_1": "a", "data_2": "b"}, [("a", "b")]),
    ],
)
def test_score_forms(url: str, fields: dict[str, Any], pairs: list[tuple[str, str]]) -> None:
    req = parsed(url, {**fields, "use_activation": False}, CROSS_ENCODER)
    assert req.route == "score"
    assert [u.input for u in req.units] == pairs
    assert {u.task for u in req.units} == {"score"}
    assert {u.params.use_activation for u in req.units} == {False}


@pytest.mark.parametrize("url", ["/rerank", "/v1/rerank", "/v2/rerank"])
def test_rerank_fields(url: str) -> None:
    body = {"query": "q", "documents": ["a", "b", "c"], "top_n": 2, "return_documents": False}
    req = parsed(url, body, EMBEDDER)
    assert req.route == "rerank"
    assert [u.input for u in req.units] == [("q", "a"), ("q", "b"), ("q", "c")]
    assert (req.options.top_n, req.options.return_documents, req.options.echo) == (2, False, ("a", "b", "c"))


def test_rerank_defaults_echo_documents_and_keep_all() -> None:
    req = parsed("/rerank", {"query": "q", "documents": ["a"]}, CROSS_ENCODER)
    assert (req.options.top_n, req.options.return_documents) == (0, True)


# -- /classify, /pooling ----------------------------------------------------------------------------------


def test_classify_input() -> None:
    req = parsed("/classify", {"input": ["good", "bad"], "use_activation": True}, CLASSIFIER)
    assert req.route == "classify"
    assert req.units == (
        Unit("classify", "good", UnitParams(use_activation=True)),
        Unit("classify", "bad", UnitParams(use_activation=True)),
    )


@pytest.mark.parametrize(
    ("model", "task"),
    [(EMBEDDER, "embed"), (EMBEDDER, "token_embed"), (CLASSIFIER, "classify"), (CLASSIFIER, "token_classify")],
)
def test_pooling_tasks(model: ServedModel, task: str) -> None:
    req = parsed("/pooling", {"input": ["x", "y"], "task": task, "encoding_format": "base64"}, model)
    assert req.route == "pooling"
    assert [(u.task, u.input) for u in req.units] == [(task, "x"), (task, "y")]
    assert req.options.encoding_format == "base64"


def test_pooling_without_task_uses_the_model_default() -> None:
    assert parsed("/pooling", {"input": "x"}, EMBEDDER).units[0].task == "embed"
    assert parsed("/pooling", {"input": "x"}, CLASSIFIER).units[0].task == "classify"


def test_pooling_dimensions_on_token_embed() -> None:
    req = parsed("/pooling", {"input": "x", "task": "token_embed", "dimensions": 4}, EMBEDDER)
    assert req.units[0].params.dimensions == 4


# -- bad lines ------------------------------------------------------------------------------------------


def _bad(text: str, model: ServedModel = EMBEDDER, number: int = 12) -> BadLine:
    out = parse_line(text, number, model)
    assert isinstance(out, BadLine), out
    assert out.line == number
    assert out.text.startswith(f"line {number}: ")
    if out.param:
        assert f"{out.param}: " in out.text
    return out


@pytest.mark.parametrize(
    ("text", "param", "fragment"),
    [
        ('{"custom_id": "a", "url": ', None, "malformed JSON"),
        ("[1, 2]", None, "must be a JSON object"),
        (json.dumps({"method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}}), "custom_id", "missing"),
        (line("/v1/embeddings", {"input": "x"}, custom_id=5), "custom_id", "must be a string"),
        (line("/v1/embeddings", {"input": "x"}, method="GET"), "method", "only POST"),
        (json.dumps({"custom_id": "a", "method": "POST", "body": {}}), "url", "missing"),
        (line("/v1/chat/completions", {"messages": []}), "url", "unknown route '/v1/chat/completions'"),
        (line("/embeddings", {"input": "x"}), "url", "unknown route"),
        (json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/embeddings"}), "body", "missing"),
        (line("/v1/embeddings", "x"), "body", "must be a JSON object"),
        (line("/v1/embeddings", {"input": "x", "model": "other-model"}), "body.model", "`other-model` does not exist"),
        (line("/v1/embeddings", {"input": "x", "model": 3}), "body.model", "must be a string"),
        (line("/v1/embeddings", {}), "body.input", "missing"),
        (line("/v1/embeddings", {"input": None}), "body.input", "missing"),
        (line("/v1/embeddings", {"input": []}), "body.input", "must not be empty"),
        (line("/v1/embeddings", {"input": ["a", 3]}), "body.input", "must be a string, a list of strings"),
        (line("/v1/embeddings", {"input": [[1, 2], []]}), "body.input[1]", "non-empty list of token ids"),
        (line("/v1/embeddings", {"input": [1, -2]}), "body.input", "must be a string"),
        (line("/v1/embeddings", {"input": {"text": "x"}}), "body.input", "multimodal"),
        (line("/v1/embeddings", {"messages": [{"role": "user", "content": "x"}]}), "body.messages", "chat-style"),
        (line("/v1/embeddings", {"input": "x", "encoding_format": "bytes"}), "body.encoding_format", "'bytes'"),
        (line("/v1/embeddings", {"input": "x", "embed_dtype": "bfloat16"}), "body.embed_dtype", "'bfloat16'"),
        (line("/v1/embeddings", {"input": "x", "dimensions": 5}), "body.dimensions", "Matryoshka sizes: 4, 8"),
        (line("/v1/embeddings", {"input": "x", "dimensions": 0}), "body.dimensions", ">= 1"),
        (line("/v1/embeddings", {"input": "x", "dimensions": True}), "body.dimensions", "must be an integer"),
        (line("/v1/embeddings", {"input": "x", "dimensions": "4"}), "body.dimensions", "must be an integer"),
        (line("/v1/embeddings", {"input": "x", "truncate_prompt_tokens": -2}), "body.truncate_prompt_tokens", ">= -1"),
        (line("/v1/embeddings", {"input": "x", "truncate_prompt_tokens": 0}), "body.truncate_prompt_tokens",
         "0 would keep no tokens"),
        (line("/rerank", {"query": "q", "documents": ["a"], "truncate_prompt_tokens": 0}),
         "body.truncate_prompt_tokens", "0 would keep no tokens"),
        (line("/v1/embeddings", {"input": "x", "truncate_prompt_tokens": 65}), "body.truncate_prompt_tokens",
         "greater than the model's max length (64)"),
        (line("/v1/embeddings", {"input": "x", "truncation_side": "middle"}), "body.truncation_side", "'middle'"),
        (line("/v1/embeddings", {"input": "x", "normalize": "yes"}), "body.normalize", "true or false"),
        (line("/v1/embeddings", {"input": "x", "normalize": True, "use_activation": False}), "body.use_activation",
         "conflicts"),
        (line("/v1/embeddings", {"input": "x", "add_special_tokens": False}), "body.add_special_tokens", "not supported"),
        (line("/v2/embed", {"input_type": "query"}), "body.texts", "missing"),
        (line("/v2/embed", {"texts": "x"}), "body.texts", "a list of strings"),
        (line("/v2/embed", {"images": ["data:..."]}), "body.images", "not supported"),
        (line("/v2/embed", {"texts": ["x"], "input_type": "classification"}), "body.input_type",
         "Supported values: document, query"),
        (line("/v2/embed", {"texts": ["x"], "embedding_types": ["float", "int4"]}), "body.embedding_types", "'int4'"),
        (line("/v2/embed", {"texts": ["x"], "embedding_types": []}), "body.embedding_types", "non-empty"),
        (line("/v2/embed", {"texts": ["x"], "truncate": "MIDDLE"}), "body.truncate", "'MIDDLE'"),
        (line("/v2/embed", {"texts": ["x"], "output_dimension": 6}), "body.output_dimension", "Matryoshka"),
        (line("/score", {"text_1": "q"}), "body.text_2", "missing"),
        (line("/score", {"queries": ["q"]}), "body.documents", "missing"),
        (line("/score", {"input": "q"}), "body.text_1", "missing"),
        (line("/v1/score", {"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}), "body.text_2", "1:1, 1:N or N:N"),
        (line("/score", {"text_1": "a", "text_2": []}), "body.text_2", "must not be empty"),
        (line("/score", {"text_1": "a", "text_2": ["b", 1]}), "body.text_2[1]", "must be a string"),
        (line("/rerank", {"documents": ["a"]}), "body.query", "missing"),
        (line("/rerank", {"query": ["q"], "documents": ["a"]}), "body.query", "must be a string"),
        (line("/v2/rerank", {"query": "q"}), "body.documents", "missing"),
        (line("/rerank", {"query": "q", "documents": ["a"], "top_n": -1}), "body.top_n", ">= 0"),
        (line("/rerank", {"query": "q", "documents": ["a"], "return_documents": "no"}), "body.return_documents",
         "true or false"),
        (line("/classify", {"input": "x"}), "url", "does not support Classification API"),
        (line("/pooling", {"input": "x", "task": "score"}), "body.task", "was removed"),
        (line("/pooling", {"input": "x", "task": "encode"}), "body.task", "was removed"),
        (line("/pooling", {"input": "x", "task": "classify"}), "body.task", "Unsupported task: 'classify'"),
        (line("/pooling", {"input": "x", "task": "plugin"}), "body.task", "Unsupported task"),
    ],
)
def test_bad_lines_name_line_and_field(text: str, param: str | None, fragment: str) -> None:
    bad = _bad(text)
    assert bad.param == param
    assert fragment in bad.message


@pytest.mark.parametrize(
    ("model", "url", "body", "param", "fragment"),
    [
        (CLASSIFIER, "/v1/embeddings", {"input": "x"}, "url", "does not support Embeddings API"),
        (CLASSIFIER, "/v2/embed", {"texts": ["x"]}, "url", "does not support Embeddings API"),
        (CLASSIFIER, "/score", {"text_1": "a", "text_2": "b"}, "url", "does not support Score API"),
        (CLASSIFIER, "/rerank", {"query": "a", "documents": ["b"]}, "url", "does not support Rerank API"),
        (CLASSIFIER, "/pooling", {"input": "x", "task": "token_classify", "dimensions": 4}, "body.dimensions",
         "does not take dimensions"),
        # vLLM's /classify input is texts or token ids: a text pair names the command that classifies pairs
        (CLASSIFIER, "/classify", {"input": [["a premise", "a hypothesis"]]}, "body.input[0]",
         "text pairs are not accepted here"),
        (CLASSIFIER, "/pooling", {"input": [[101, 7], ["a", "b"]], "task": "classify"}, "body.input[1]",
         "embedcli classify --pair-col"),
        (PLAIN_EMBEDDER, "/v1/embeddings", {"input": "x", "dimensions": 4}, "body.dimensions",
         "does not support matryoshka"),
        (PLAIN_EMBEDDER, "/v2/embed", {"texts": ["x"], "input_type": "query"}, "body.input_type",
         "does not define any input_type"),
        (EMBEDDER, "/v1/embeddings", {"input": "x", "dimensions": 16, "model": "tiny-embed"}, "body.dimensions",
         "Matryoshka sizes"),
    ],
)
def test_bad_lines_for_what_the_model_cannot_do(
    model: ServedModel, url: str, body: dict[str, Any], param: str, fragment: str
) -> None:
    bad = _bad(line(url, body), model)
    assert (bad.param, bad.custom_id) == (param, "req-1")
    assert fragment in bad.message


def test_duplicate_custom_id_is_a_bad_line_after_the_first() -> None:
    lines = [
        line("/v1/embeddings", {"input": "a"}, custom_id="x"),
        line("/v1/embeddings", {"input": "b"}, custom_id="y"),
        line("/v1/embeddings", {"input": "c"}, custom_id="x"),
    ]
    items = list(parse_lines(lines, EMBEDDER))
    assert [type(x).__name__ for x in items] == ["BatchRequest", "BatchRequest", "BadLine"]
    bad = items[2]
    assert isinstance(bad, BadLine)
    assert (bad.line, bad.custom_id, bad.param) == (3, "x", "custom_id")
    assert "first on line 1" in bad.message


def test_a_shard_judges_duplicates_by_the_whole_file() -> None:
    lines = [line("/v1/embeddings", {"input": str(i)}, custom_id=cid) for i, cid in enumerate("abcab")]
    seen = scan_custom_ids(lines)
    # a shard that reads only lines 4 and 5 still knows they repeat lines 1 and 2 ...
    tail = [parse_line(lines[i], i + 1, EMBEDDER, seen) for i in (3, 4)]
    assert [getattr(x, "message", "") for x in tail] == [
        "duplicate custom_id 'a' (first on line 1)", "duplicate custom_id 'b' (first on line 2)"
    ]
    # ... and the first holder of an id stays valid when it is read after the scan.
    assert isinstance(parse_line(lines[0], 1, EMBEDDER, seen), BatchRequest)


def test_blank_lines_are_skipped_but_counted() -> None:
    lines = ["", line("/v1/embeddings", {"input": "a"}), "   ", "{oops"]
    items = list(parse_lines(lines, EMBEDDER, seen=SeenIds()))
    assert [x.line for x in items] == [2, 4]
    assert isinstance(items[1], BadLine) and items[1].text.startswith("line 4: malformed JSON")


def test_the_batch_api_package_imports_no_torch() -> None:
    import subprocess
    import sys

    code = "import sys, embedcli.batchapi; sys.exit('torch' in sys.modules or 'transformers' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def _spec(**fields: Any) -> Any:
    from embedcli.models.spec import ModelSpec

    base = {"name": "org/tiny", "path": "/m/tiny", "architecture": "BertModel", "model_type": "bert",
            "head": "base", "is_decoder": False, "hidden_size": 16, "max_length": 32, "do_lower_case": False,
            "seq_pooling_type": "MEAN", "normalize": True}
    return ModelSpec(**{**base, **fields})


def test_served_model_from_an_embedding_spec() -> None:
    spec = _spec(embedding_size=8, is_matryoshka=True, matryoshka_dimensions=(4, 8),
                 prompts=(("query", "q: "),))
    served = ServedModel.from_spec(spec, names=("/m/tiny", "org/tiny"))
    assert served.names == ("org/tiny", "/m/tiny") and served.name == "org/tiny"
    assert served.tasks == {"embed", "token_embed"}
    assert (served.embedding_size, served.matryoshka_dimensions, served.max_length) == (8, (4, 8), 32)
    assert dict(served.prompts) == {"query": "q: "} and served.score_method == "cosine"
    assert ServedModel.from_spec(spec, score_method="maxsim").score_method == "maxsim"


@pytest.mark.parametrize(("num_labels", "method"), [(1, "cross-encoder"), (2, None)])
def test_served_model_from_a_classifier_spec(num_labels: int, method: str | None) -> None:
    labels = tuple(f"L{i}" for i in range(num_labels))
    served = ServedModel.from_spec(_spec(head="sequence_classification", num_labels=num_labels, id2label=labels))
    assert served.tasks == {"classify"} and served.score_method == method
    assert dict(served.id2label) == dict(enumerate(labels))
    assert served.embedding_size == 16  # no pooled embedding size: the hidden size


@pytest.mark.parametrize(("head", "method", "sparse"), [("sparse", "sparse", True), ("lm_score", "cross-encoder", False)])
def test_served_model_from_issue_17_family_specs(head: str, method: str, sparse: bool) -> None:
    served = ServedModel.from_spec(_spec(head=head, embedding_size=30, is_decoder=head == "lm_score"))
    assert served.score_method == method and served.sparse is sparse
    if sparse:  # the vocabulary-sized vector of /pooling and /v1/embeddings
        assert served.tasks == {"sparse_embed"} and served.embedding_size == 30
        (request,) = parse_lines([line("/pooling", {"input": ["a", "b"]})], served)
        assert isinstance(request, BatchRequest) and [u.task for u in request.units] == ["sparse_embed"] * 2
