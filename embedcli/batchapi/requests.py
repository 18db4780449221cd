"""Request lines of an OpenAI Batch file, parsed and validated per route as vLLM's protocol names fields.

Mirrored shapes (vllm-project/vllm; the `entrypoints/pooling/` layout, before the `frontend/` move):
- the line: `{"custom_id", "method": "POST", "url", "body"}` — `BatchRequestInput`,
  vllm/entrypoints/openai/run_batch.py @ 0056ae7b (and openai/batch/protocol.py @ 479eabf2);
- common body fields `model`, `user`, `truncate_prompt_tokens` (>= -1), completion `input`
  (str | list[str] | list[int] | list[list[int]]), `add_special_tokens` — pooling/base/protocol.py @ 65772ef1;
- `/v1/embeddings`: `encoding_format`, `dimensions`, `normalize`, `embed_dtype`, `endianness` —
  pooling/embed/protocol.py @ ff8d577a;
- `/v2/embed`: `texts`, `input_type`, `output_dimension`, `embedding_types`, `truncate` NONE|START|END,
  `max_tokens` — pooling/embed/cohere_protocol.py @ b76dd598 and cohere/serving.py @ 4f4c27fe
  (`int8`/`uint8` are Cohere's types that vLLM does not serve; embedcli adds them as `--precision`);
- `/score`: `queries`/`documents`, `queries`/`items`, `data_1`/`data_2`, `text_1`/`text_2`; `/rerank`:
  `query`, `documents`, `top_n`; both `use_activation` — pooling/score/protocol.py @ 1fff4ef8
  (`return_documents` is Cohere's rerank flag; vLLM always echoes the document, which is the default);
- `/classify`: `input`, `use_activation` — pooling/classify/protocol.py @ dff4cad3 (also at 055e47c2, under
  `frontend/`): texts or token ids only, no text pairs, so a pair there is a bad line naming
  `embedcli classify --pair-col`; vLLM's `/score` takes pairs for one-label models only (a scalar score);
- `/pooling`: `input`, `task`, `dimensions`, `normalize`/`use_activation`, encoding fields —
  pooling/pooling/protocol.py @ 343bacaf.
A SPLADE model (`ServedModel.sparse`) is served as vLLM serves `BertSpladeSparseEmbeddingModel`, whose one
sequence task is `embed`: `/pooling` (task `embed` or none) and `/v1/embeddings` give its sparse vectors
(`normalize: true` and `dimensions` are bad lines: the vectors are neither normalized nor Matryoshka);
`/v2/embed` is a bad line (Cohere's types do not apply to a vocabulary-sized sparse vector).
Unknown body fields are ignored (vLLM's `OpenAIBaseModel` logs and drops them); fields vLLM accepts but
embedcli cannot honour (chat `messages`, multimodal inputs, `add_special_tokens: false`, bf16/fp8
`embed_dtype`) make the line bad rather than silently giving other numbers. Types are checked strictly
(a JSON `true` is not an int, `"5"` is not 5).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from embedcli.batchapi.served import SPARSE_TASK, ServedModel
from embedcli.io.json_line import BadJsonLine, parse_json_line

Route = Literal["embeddings", "cohere_embed", "score", "rerank", "classify", "pooling"]
ROUTES: dict[str, Route] = {
    "/v1/embeddings": "embeddings",
    "/v2/embed": "cohere_embed",
    "/score": "score",
    "/v1/score": "score",
    "/rerank": "rerank",
    "/v1/rerank": "rerank",
    "/v2/rerank": "rerank",
    "/classify": "classify",
    "/pooling": "pooling",
}
POOLING_ROUTE_TASKS: tuple[str, ...] = ("embed", "classify", "token_embed", "token_classify")
# vLLM's default pooling task order (ModelConfig.get_pooling_task), for /pooling without `task`.
_DEFAULT_TASK_ORDER: tuple[str, ...] = ("embed", "classify", "token_embed", "token_classify")
# Cohere embedding type -> embedcli `--precision` (base64 is float32 vectors, base64-encoded).
COHERE_PRECISIONS: dict[str, str] = {
    "float": "float32",
    "int8": "int8",
    "uint8": "uint8",
    "binary": "binary",
    "ubinary": "ubinary",
    "base64": "float32",
}
ENCODING_FORMATS: tuple[str, ...] = ("float", "base64")
EMBED_DTYPES: tuple[str, ...] = ("float32", "float16")
ENDIANNESS: tuple[str, ...] = ("native", "little", "big")
MAX_TOKEN_ID = 2**63 - 1  # token ids are int64 tensors

UnitInput = str | tuple[int, ...] | tuple[str, str]


class BadRequest(ValueError):
    """A request body that cannot be served; `param` names the field (e.g. `body.input`)."""

    def __init__(self, param: str | None, message: str) -> None:
        super().__init__(message)
        self.param = param
        self.message = message


@dataclass(frozen=True)
class UnitParams:
    """Per-unit pooling parameters (vLLM `PoolingParams` plus tokenization), shared by a request's units."""

    use_activation: bool | None = None  # None: the model's default (normalize / activation on)
    dimensions: int | None = None  # Matryoshka size, as `--dimensions`
    truncate_prompt_tokens: int | None = None  # None: no truncation (over-long is an error); -1: max length
    truncation_side: str | None = None  # None: the tokenizer's side


@dataclass(frozen=True)
class Unit:
    """One input the existing commands compute: a text or token ids for a pooling task, or a scored pair."""

    task: str  # embed | classify | token_embed | token_classify | score
    input: UnitInput  # text, token ids, or (left, right) for score
    params: UnitParams = UnitParams()

    @property
    def group(self) -> tuple[str, UnitParams]:
        """Units with the same group can share one packed forward with one set of pooling params."""
        return (self.task, self.params)


@dataclass(frozen=True)
class ResponseOptions:
    """How a request wants its response body written (nothing here changes the computed numbers)."""

    encoding_format: str = "float"
    embed_dtype: str = "float32"
    endianness: str = "native"
    embedding_types: tuple[str, ...] = ("float",)  # /v2/embed
    max_tokens: int | None = None  # /v2/embed with truncate NONE: longer inputs are refused afterwards
    top_n: int = 0  # /rerank
    return_documents: bool = True  # /rerank
    echo: tuple[str, ...] = ()  # /v2/embed texts, /rerank documents, as sent


@dataclass(frozen=True)
class BatchRequest:
    """A valid request line: where it was, what it asked for, and its units in response order."""

    line: int
    custom_id: str
    url: str
    route: Route
    units: tuple[Unit, ...]
    options: ResponseOptions = ResponseOptions()


@dataclass(frozen=True)
class BadLine:
    """A request line that gets a 400: its line number, custom_id when known, the field and why."""

    line: int
    custom_id: str | None
    message: str
    param: str | None = None

    @property
    def text(self) -> str:
        """The one-line message: `line N: field: why`."""
        where = f"line {self.line}: " + (f"{self.param}: " if self.param else "")
        return where + self.message


@dataclass
class SeenIds:
    """First line of each custom_id seen so far; later lines with the same id are duplicates."""

    first_line: MutableMapping[str, int] = field(default_factory=dict)

    def claim(self, custom_id: str, line: int) -> int | None:
        """Record `custom_id` on `line`; return the earlier line that holds it, if any."""
        first = self.first_line.setdefault(custom_id, line)
        return None if first == line else first


def scan_custom_ids(lines: Iterable[str], start_line: int = 1) -> SeenIds:
    """First line of every custom_id in a file (a pre-pass, so a shard or a resumed run judges duplicates
    by the whole file, not by the part it reads)."""
    seen = SeenIds()
    for number, text in enumerate(lines, start_line):
        if not text.strip():
            continue
        try:
            obj = parse_json_line(text)
        except BadJsonLine:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("custom_id"), str):
            seen.claim(obj["custom_id"], number)
    return seen


def parse_lines(
    lines: Iterable[str], model: ServedModel, start_line: int = 1, seen: SeenIds | None = None
) -> Iterator[BatchRequest | BadLine]:
    """Parse every non-blank line (blank lines are skipped, as vLLM does); numbering counts every line."""
    seen = seen if seen is not None else SeenIds()
    for number, text in enumerate(lines, start_line):
        if text.strip():
            yield parse_line(text, number, model, seen)


def parse_line(text: str, line: int, model: ServedModel, seen: SeenIds | None = None) -> BatchRequest | BadLine:
    """One request line → a validated request, or the bad line saying which field is wrong and why."""
    try:
        obj = parse_json_line(text)
    except BadJsonLine as e:
        return BadLine(line, None, e.reason)
    if not isinstance(obj, dict):
        return BadLine(line, None, f"a request line must be a JSON object, not {_kind(obj)}")
    custom_id = obj.get("custom_id")
    if not isinstance(custom_id, str):
        what = "missing" if custom_id is None else f"must be a string, not {_kind(custom_id)}"
        return BadLine(line, None, what, "custom_id")
    if seen is not None:
        first = seen.claim(custom_id, line)
        if first is not None:
            return BadLine(line, custom_id, f"duplicate custom_id {custom_id!r} (first on line {first})", "custom_id")
    try:
        method = obj.get("method")
        if method != "POST":
            raise BadRequest("method", "missing" if method is None else f"only POST is supported, not {method!r}")
        url = obj.get("url")
        if not isinstance(url, str):
            raise BadRequest("url", "missing" if url is None else f"must be a string, not {_kind(url)}")
        route = ROUTES.get(url)
        if route is None:
            raise BadRequest("url", f"unknown route {url!r}; supported: {', '.join(ROUTES)}")
        body = obj.get("body")
        if not isinstance(body, dict):
            raise BadRequest("body", "missing" if body is None else f"must be a JSON object, not {_kind(body)}")
        _check_model(body, model)
        units, options = _ROUTE_PARSERS[route](_Body(body), model)
    except BadRequest as e:
        return BadLine(line, custom_id, e.message, e.param)
    return BatchRequest(line, custom_id, url, route, units, options)


# -- field readers ------------------------------------------------------------------------------------


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return {dict: "an object", list: "a list", str: "a string", int: "an integer", float: "a number"}.get(
        type(value), type(value).__name__
    )


class _Body:
    """Typed access to a request body; every error names `body.<field>`."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def has(self, name: str) -> bool:
        return self.data.get(name) is not None

    def required(self, name: str) -> Any:
        if self.data.get(name) is None:
            raise BadRequest(f"body.{name}", "missing")
        return self.data[name]

    def int(self, name: str, minimum: int | None = None) -> int | None:
        value = self.data.get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise BadRequest(f"body.{name}", f"must be an integer, not {_kind(value)}")
        if minimum is not None and value < minimum:
            raise BadRequest(f"body.{name}", f"must be >= {minimum}, got {value}")
        return value

    def bool(self, name: str) -> bool | None:
        value = self.data.get(name)
        if value is None:
            return None
        if not isinstance(value, bool):
            raise BadRequest(f"body.{name}", f"must be true or false, not {_kind(value)}")
        return value

    def choice(self, name: str, choices: tuple[str, ...], default: str) -> str:
        value = self.data.get(name)
        if value is None:
            return default
        if value not in choices:
            raise BadRequest(f"body.{name}", f"{value!r} is not one of {', '.join(choices)}")
        return str(value)


def _check_model(body: dict[str, Any], model: ServedModel) -> None:
    name = body.get("model")
    if name is not None and not isinstance(name, str):
        raise BadRequest("body.model", f"must be a string, not {_kind(name)}")
    if not model.serves(name):
        raise BadRequest("body.model", f"The model `{name}` does not exist; this run serves `{model.name}`")


def _require_task(model: ServedModel, task: str, api: str) -> None:
    if task not in model.tasks:
        raise BadRequest("url", f"The model does not support {api} API")


def _completion_inputs(body: _Body, model: ServedModel, name: str = "input") -> list[UnitInput]:
    """vLLM's completion input: a string, a list of strings, token ids, or a list of token-id lists; every
    token id must be one of the model's (below its vocabulary size)."""
    inputs = _raw_completion_inputs(body, name)
    limit = model.vocab_size or MAX_TOKEN_ID + 1
    nested = any(isinstance(v, list) for v in body.data[name]) if isinstance(body.data[name], list) else False
    for i, x in enumerate(inputs):
        bad = next((t for t in x if isinstance(t, int) and t >= limit), None) if isinstance(x, tuple) else None
        if bad is not None:
            raise BadRequest(f"body.{name}" + (f"[{i}]" if nested else ""),
                             f"token id {bad} is out of range: the model's vocabulary has {limit} ids (0 to {limit - 1})")
    return inputs


def _raw_completion_inputs(body: _Body, name: str) -> list[UnitInput]:
    if body.has("messages"):
        raise BadRequest("body.messages", "chat-style requests are not supported by embedcli; send `input`")
    value = body.required(name)
    param = f"body.{name}"
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        raise BadRequest(param, "multimodal inputs are not supported by embedcli; send text or token ids")
    if not isinstance(value, list):
        raise BadRequest(param, f"must be a string, a list of strings or token ids, not {_kind(value)}")
    if not value:
        raise BadRequest(param, "must not be empty")
    if all(isinstance(v, str) for v in value):
        return list(value)
    if all(_is_token_id(v) for v in value):
        return [tuple(value)]
    if all(isinstance(v, list) for v in value):
        out: list[UnitInput] = []
        for i, ids in enumerate(value):
            if ids and all(isinstance(t, str) for t in ids):
                # vLLM's completion input (/classify, /pooling, /v1/embeddings) has no text pairs.
                raise BadRequest(f"{param}[{i}]", "text pairs are not accepted here (vLLM's input is texts or token "
                                 "ids); score a pair with /score, or classify pairs with `embedcli classify --pair-col`")
            if not ids or not all(_is_token_id(t) for t in ids):
                raise BadRequest(f"{param}[{i}]", "must be a non-empty list of token ids (integers >= 0)")
            out.append(tuple(ids))
        return out
    raise BadRequest(param, "must be a string, a list of strings, a list of token ids or a list of token-id lists")


def _is_token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _string_list(body: _Body, name: str, allow_single: bool = True) -> list[str]:
    value = body.required(name)
    param = f"body.{name}"
    if isinstance(value, str) and allow_single:
        return [value]
    if not isinstance(value, list):
        raise BadRequest(param, f"must be {'a string or ' if allow_single else ''}a list of strings, not {_kind(value)}")
    if not value:
        raise BadRequest(param, "must not be empty")
    for i, v in enumerate(value):
        if isinstance(v, dict):
            raise BadRequest(f"{param}[{i}]", "multimodal inputs are not supported by embedcli; send text")
        if not isinstance(v, str):
            raise BadRequest(f"{param}[{i}]", f"must be a string, not {_kind(v)}")
    return list(value)


def _fewest(model: ServedModel, inputs: Sequence[UnitInput] = ("",), pairs: bool = False) -> int:
    """The fewest tokens the inputs can be cut to: their special tokens (a scored pair's, or an LLM reranker's
    bare template); token-id inputs are cut as they are."""
    if pairs:
        return model.min_pair_tokens
    return model.min_tokens if any(isinstance(x, str) for x in inputs) else 0


def _truncation(body: _Body, model: ServedModel, fewest: int = 0) -> tuple[int | None, str | None]:
    tokens = body.int("truncate_prompt_tokens", minimum=-1)
    if tokens is not None and 0 < tokens < fewest:  # the tokenizer would leave such inputs uncut
        raise BadRequest("body.truncate_prompt_tokens", f"{tokens} is below the {fewest} tokens the model adds to "
                         "every input (special tokens, or a reranker's pair template): nothing could be kept")
    if tokens == 0:  # a max length of 0 reads as none downstream: the whole input would be computed, uncut
        raise BadRequest("body.truncate_prompt_tokens", "0 would keep no tokens; send -1 (the model's max length), "
                         "a positive count, or leave it out")
    if tokens is not None and model.max_length is not None and tokens > model.max_length:
        raise BadRequest(
            "body.truncate_prompt_tokens",
            f"{tokens} is greater than the model's max length ({model.max_length})",
        )
    side = body.data.get("truncation_side")
    if side is not None and side not in ("left", "right"):
        raise BadRequest("body.truncation_side", f"{side!r} is not one of left, right")
    return tokens, side


def _use_activation(body: _Body, *aliases: str) -> bool | None:
    """`use_activation`, or its older per-route name (`normalize` for embeddings); both must agree."""
    values = {name: body.bool(name) for name in ("use_activation", *aliases)}
    given = {k: v for k, v in values.items() if v is not None}
    if len(set(given.values())) > 1:
        raise BadRequest(f"body.{next(iter(given))}", f"conflicts with {', '.join(f'body.{k}' for k in given)}")
    return next(iter(given.values()), None)


def _dimensions(body: _Body, model: ServedModel, name: str = "dimensions") -> int | None:
    """Matryoshka size, checked as `--dimensions` is (embedcli.pooling.params.PoolingParams.verify)."""
    d = body.int(name)
    if d is None:
        return None
    param = f"body.{name}"
    if d < 1:
        raise BadRequest(param, f"dimensions must be >= 1, got {d}")
    if not model.is_matryoshka and not model.matryoshka_dimensions:
        raise BadRequest(param, "Model does not support matryoshka representation")
    if model.matryoshka_dimensions and d not in model.matryoshka_dimensions:
        allowed = ", ".join(map(str, model.matryoshka_dimensions))
        raise BadRequest(param, f"dimensions {d} is not one of the model's Matryoshka sizes: {allowed}")
    if model.embedding_size is not None and d > model.embedding_size:
        raise BadRequest(param, f"dimensions {d} exceeds the embedding size {model.embedding_size}")
    return d


def _encoding(body: _Body) -> ResponseOptions:
    """The response options of the encoding fields (`encoding_format`, `embed_dtype`, `endianness`)."""
    return ResponseOptions(
        encoding_format=body.choice("encoding_format", ENCODING_FORMATS, "float"),
        embed_dtype=body.choice("embed_dtype", EMBED_DTYPES, "float32"),
        endianness=body.choice("endianness", ENDIANNESS, "native"),
    )


def _check_special_tokens(body: _Body) -> None:
    if body.bool("add_special_tokens") is False:
        raise BadRequest("body.add_special_tokens", "false is not supported by embedcli")


# -- routes -------------------------------------------------------------------------------------------


def _sparse_units(body: _Body, model: ServedModel) -> tuple[tuple[Unit, ...], ResponseOptions]:
    """A SPLADE model's `embed` (vLLM's task for `BertSpladeSparseEmbeddingModel`): its sparse vectors."""
    inputs = _completion_inputs(body, model)
    _check_special_tokens(body)
    tokens, side = _truncation(body, model, _fewest(model, inputs))
    if _use_activation(body, "normalize"):
        raise BadRequest(f"body.{'normalize' if body.has('normalize') else 'use_activation'}",
                         "SPLADE vectors are not normalized; send false or leave it out")
    _dimensions(body, model)  # a SPLADE model has no Matryoshka sizes: a bad line
    params = UnitParams(None, None, tokens, side)
    return tuple(Unit(SPARSE_TASK, x, params) for x in inputs), _encoding(body)


def _embeddings(body: _Body, model: ServedModel) -> tuple[tuple[Unit, ...], ResponseOptions]:
    if model.sparse:
        return _sparse_units(body, model)
    _require_task(model, "embed", "Embeddings")
    inputs = _completion_inputs(body, model)
    _check_special_tokens(body)
    tokens, side = _truncation(body, model, _fewest(model, inputs))
    params = UnitParams(_use_activation(body, "normalize"), _dimensions(body, model), tokens, side)
    return tuple(Unit("embed", x, params) for x in inputs), _encoding(body)


def _cohere_embed(body: _Body, model: ServedModel) -> tuple[tuple[Unit, ...], ResponseOptions]:
    if model.sparse:
        raise BadRequest("url", "a SPLADE model's vectors are vocabulary-sized and sparse: Cohere's embedding "
                                "types do not apply; send /pooling or /v1/embeddings (or use embedcli sparse-embed)")
    _require_task(model, "embed", "Embeddings")
    for name in ("images", "inputs"):
        if body.has(name):
            raise BadRequest(f"body.{name}", "image and mixed inputs are not supported by embedcli; send `texts`")
    texts = _string_list(body, "texts", allow_single=False)
    input_type = body.data.get("input_type")
    prefix = ""
    if input_type is not None:
        if not isinstance(input_type, str):
            raise BadRequest("body.input_type", f"must be a string, not {_kind(input_type)}")
        if not model.prompts:
            raise BadRequest(
                "body.input_type",
                f"Unsupported input_type {input_type!r}. This model does not define any input_type prompt prefixes.",
            )
        if input_type not in model.prompts:
            raise BadRequest(
                "body.input_type",
                f"Unsupported input_type {input_type!r}. Supported values: {', '.join(sorted(model.prompts))}",
            )
        prefix = model.prompts[input_type]
    types = body.data.get("embedding_types")
    if types is None:
        types = ["float"]
    if not isinstance(types, list) or not types:
        raise BadRequest("body.embedding_types", "must be a non-empty list")
    for t in types:
        if t not in COHERE_PRECISIONS:
            raise BadRequest("body.embedding_types", f"{t!r} is not one of {', '.join(COHERE_PRECISIONS)}")
    truncate = body.choice("truncate", ("NONE", "START", "END"), "END")
    max_tokens = body.int("max_tokens", minimum=1)
    fewest = _fewest(model)
    if max_tokens is not None and truncate != "NONE" and max_tokens < fewest:  # uncut by the tokenizer
        raise BadRequest("body.max_tokens", f"{max_tokens} is below the {fewest} special tokens the model adds to "
                         "every text: nothing could be kept")
    # vLLM's CohereServingEmbedding._resolve_truncation.
    if truncate == "NONE":
        tokens, side, check = None, None, max_tokens
    else:
        tokens = max_tokens if max_tokens is not None else -1
        side, check = ("left" if truncate == "START" else None), None
    params = UnitParams(None, _dimensions(body, model, "output_dimension"), tokens, side)
    units = tuple(Unit("embed", prefix + t, params) for t in texts)
    options = ResponseOptions(embedding_types=tuple(dict.fromkeys(types)), max_tokens=check, echo=tuple(texts))
    return units, options


_SCORE_FORMS: tuple[tuple[str, str], ...] = (
    ("queries", "documents"),
    ("queries", "items"),
    ("data_1", "data_2"),
    ("text_1", "text_2"),
)


def _score_fewest(model: ServedModel) -> int:
    """The fewest tokens a /score or /rerank side is cut to: a cross-encoder's pair, else one text."""
    return _fewest(model, pairs=model.score_method == "cross-encoder")


def _require_score(model: ServedModel, api: str) -> None:
    if model.score_method is None:
        raise BadRequest("url", f"The model does not support {api} API")


def _score(body: _Body, model: ServedModel) -> tuple[tuple[Unit, ...], ResponseOptions]:
    _require_score(model, "Score")
    form = next((f for f in _SCORE_FORMS if body.has(f[0]) and body.has(f[1])), None)
    if form is None:
        partial = next((f for f in _SCORE_FORMS if body.has(f[0]) or body.has(f[1])), None)
        if partial is None:
            raise BadRequest("body.text_1", "missing (send text_1/text_2, queries/documents or data_1/data_2)")
        body.required(partial[0])
        body.required(partial[1])
    assert form is not None
    left, right = _string_list(body, form[0]), _string_list(body, form[1])
    if len(left) == 1:
        pairs = [(left[0], r) for r in right]
    elif len(left) == len(right):
        pairs = list(zip(left, right, strict=True))
    else:
        raise BadRequest(f"body.{form[1]}", "Input lengths must be either 1:1, 1:N or N:N")
    tokens, side = _truncation(body, model, _score_fewest(model))
    params = UnitParams(_use_activation(body), None, tokens, side)
    return tuple(Unit("score", p, params) for p in pairs), ResponseOptions()


def _rerank(body: _Body, model: ServedModel) -> tuple[tuple[Unit, ...], ResponseOptions]:
    _require_score(model, "Rerank")
    query = body.required("query")
    if not isinstance(query, str):
        raise BadRequest("body.query", f"must be a string, not {_kind(query)}")
    documents = _string_list(body, "documents")
    top_n = body.int("top_n", minimum=0) or 0
    return_documents = body.bool("return_documents")
    tokens, side = _truncation(body, model, _score_fewest(model))
    params = UnitParams(_use_activation(body), None, tokens, side)
    units = tuple(Unit("score", (query, d), params) for d in documents)
    options = ResponseOptions(top_n=top_n, return_documents=return_documents is not False, echo=tuple(documents))
    return units, options


def _classify(body: _Body, model: ServedModel) -> tuple[tuple[Unit, ...], ResponseOptions]:
    _require_task(model, "classify", "Classification")
    inputs = _completion_inputs(body, model)
    _check_special_tokens(body)
    tokens, side = _truncation(body, model, _fewest(model, inputs))
    params = UnitParams(_use_activation(body), None, tokens, side)
    return tuple(Unit("classify", x, params) for x in inputs), ResponseOptions()


def _pooling(body: _Body, model: ServedModel) -> tuple[tuple[Unit, ...], ResponseOptions]:
    task = body.data.get("task")
    if model.sparse:
        if task not in (None, "embed"):
            raise BadRequest("body.task", f"Unsupported task: {task!r} (a SPLADE model serves embed)")
        return _sparse_units(body, model)
    if task is None:
        task = next((t for t in _DEFAULT_TASK_ORDER if t in model.tasks), None)
        if task is None:
            raise BadRequest("url", "The model does not support Pooling API")
    elif task in ("score", "encode"):
        hint = "classify or embed" if task == "score" else "token_embed or token_classify"
        raise BadRequest("body.task", f"Task {task!r} was removed: use {hint} instead")
    elif task not in POOLING_ROUTE_TASKS or task not in model.tasks:
        raise BadRequest("body.task", f"Unsupported task: {task!r}")
    inputs = _completion_inputs(body, model)
    _check_special_tokens(body)
    tokens, side = _truncation(body, model, _fewest(model, inputs))
    if body.has("dimensions") and task not in ("embed", "token_embed"):
        raise BadRequest("body.dimensions", f"Task {task!r} does not take dimensions; it takes use_activation")
    dimensions = _dimensions(body, model)
    params = UnitParams(_use_activation(body, "normalize"), dimensions, tokens, side)
    return tuple(Unit(task, x, params) for x in inputs), _encoding(body)


_ROUTE_PARSERS = {
    "embeddings": _embeddings,
    "cohere_embed": _cohere_embed,
    "score": _score,
    "rerank": _rerank,
    "classify": _classify,
    "pooling": _pooling,
}
