"""Pair scoring (cross-encoder, bi-encoder cosine, late-interaction MaxSim) and the stable rerank order.

How each method scores a (left, right) = (query, document) pair, as vLLM's `/score` and `/rerank`:

- **cross-encoder** (a sequence-classification model with one label): the pair is tokenized as a text pair
  (`[CLS] query [SEP] document [SEP]` with token types 0…0 1…1, both from the tokenizer), packed like any
  other sequence; the score is the classifier output after calibration and the model's activation
  (sigmoid for one label), or the raw logit with `--raw-scores`. Pairs longer than the max length are cut
  with the tokenizer's `longest_first` rule, as sentence-transformers' CrossEncoder does: one token at a
  time from whichever side is currently longer (so a short query is kept whole and the document is cut
  first), from the right (`--truncation-side left`: from the left); special tokens count toward the limit.
- **cosine** (an embedding model, a bi-encoder): query and document are embedded independently — the query
  with the model's `query` prompt, the document with its `document` (else `passage`, else `corpus`) prompt,
  as sentence-transformers' `encode_query` / `encode_document` — and scored by the model's similarity, as
  sentence-transformers' `model.similarity`: `similarity_fn_name` in config_sentence_transformers.json
  (cosine, dot, euclidean = -L2 distance, manhattan = -L1 distance), cosine when it names none or when
  `--method cosine` is asked for explicitly (`--raw-scores` has no effect).
- **sparse** (a SPLADE model): query and document are encoded independently into sparse vocabulary vectors
  (prompts as for cosine); score = their dot product (sentence-transformers' `SparseEncoder.similarity`).
- **LLM reranker** (a causal LM scored by its yes/no logits): a cross-encoder whose pair is one prompt: the
  pair template with `{query}`/`{document}` filled in (the document cut so the template's suffix stays), or,
  without a template, the tokenizer's text pair (for a decoder: query tokens then document tokens).
- **maxsim** (late interaction): score = Σ over query tokens of the max over document tokens of the dot
  product, in float32. A ColBERT model (Stanford or PyLate layout) gives its own vectors: the query as a query
  (marker, `[MASK]` expansion to the query length), each document as a document (marker, cut to the document
  length, skiplist tokens dropped), L2-normalized token projections — sentence-transformers'
  `MultiVectorEncoder.encode_query` / `encode_document` and `similarity`. Any other embedding model: the raw
  per-token hidden states of both sides (every token, special tokens included, L2-normalized unless
  `--raw-scores`).
- **m3** (BGE-M3, as FlagEmbedding's `BGEM3FlagModel.compute_score`): both sides give their dense vector,
  lexical weights and colbert vectors from one forward each; dense = the dot product of the normalized dense
  vectors, sparse = the lexical weights' dot product over shared token ids, colbert = the MaxSim over the
  colbert vectors divided by the query's colbert-vector count; the score is `(w_dense * dense + w_sparse *
  sparse + w_colbert * colbert) / (w_dense + w_sparse + w_colbert)` (its `colbert+sparse+dense`), weights
  `--weights` (default 1,1,1 as FlagEmbedding's). FlagEmbedding pads a batch's passages with zero colbert
  vectors, which enter its max (a query token whose best real match is negative scores 0 there); embedcli
  takes the max over the passage's own vectors, as its per-pair `colbert_score` does.

Neither side is stripped of whitespace (CrossEncoder and vLLM keep it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from embedcli.errors import PoolingConfigError

METHODS: tuple[str, ...] = ("auto", "cross-encoder", "cosine", "maxsim", "sparse", "m3")
M3_WEIGHTS: tuple[float, float, float] = (1.0, 1.0, 1.0)  # FlagEmbedding's default [dense, sparse, colbert]
ROLES: tuple[str, ...] = ("query", "document")


class RoleText(str):
    """A text that a late-interaction model encodes as a query or as a document (its `role`)."""

    role: str

    def __new__(cls, text: str, role: str) -> RoleText:
        self = super().__new__(cls, text)
        self.role = role
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (RoleText, (str(self), self.role))


def role_of(text: object, default: str | None) -> str | None:
    """The role a runner input asks for (`RoleText`), else `default`."""
    return text.role if isinstance(text, RoleText) else default
SparseVector = tuple[np.ndarray, np.ndarray]  # (indices, values), indices sorted and unique
DOCUMENT_PROMPT_NAMES: tuple[str, ...] = ("document", "passage", "corpus")


def _unit_rows(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.maximum(norms, 1e-12)


def cosine_pairs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine of `[n, d]` and `[n, d]` → `[n]` float32."""
    return np.sum(_unit_rows(a) * _unit_rows(b), axis=-1).astype(np.float32)


def cosine_matrix(queries: np.ndarray, docs: np.ndarray) -> np.ndarray:
    """Cosine of every query against every document: `[q, d]` x `[n, d]` → `[q, n]` float32."""
    return (_unit_rows(queries) @ _unit_rows(docs).T).astype(np.float32)


def similarity_pairs(name: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise `model.similarity` of `[n, d]` and `[n, d]` → `[n]` float32 (cosine, dot, euclidean, manhattan)."""
    if name == "cosine":
        return cosine_pairs(a, b)
    a64, b64 = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if name == "dot":
        return np.sum(a64 * b64, axis=-1).astype(np.float32)
    order = {"euclidean": 2, "manhattan": 1}[name]
    return (-np.linalg.norm(a64 - b64, ord=order, axis=-1)).astype(np.float32)


def similarity_matrix(name: str, queries: np.ndarray, docs: np.ndarray) -> np.ndarray:
    """`model.similarity` of every query against every document → `[q, n]` float32."""
    if name == "cosine":
        return cosine_matrix(queries, docs)
    q64, d64 = np.asarray(queries, dtype=np.float64), np.asarray(docs, dtype=np.float64)
    if name == "dot":
        return (q64 @ d64.T).astype(np.float32)
    order = {"euclidean": 2, "manhattan": 1}[name]
    diff = q64[:, None, :] - d64[None, :, :]
    return (-np.linalg.norm(diff, ord=order, axis=-1)).astype(np.float32)


def maxsim(query: np.ndarray, doc: np.ndarray) -> float:
    """Late-interaction score: Σ over query tokens of the max over document tokens of the dot product (float32)."""
    q = np.asarray(query, dtype=np.float32)
    d = np.asarray(doc, dtype=np.float32)
    if len(q) == 0:
        return 0.0
    if len(d) == 0:
        return float("-inf")
    return float((q @ d.T).max(axis=1).sum(dtype=np.float32))


def maxsim_matrix(queries: Sequence[np.ndarray], docs: Sequence[np.ndarray]) -> np.ndarray:
    """MaxSim of every query matrix against every document matrix → `[q, n]` float32."""
    out = np.empty((len(queries), len(docs)), dtype=np.float32)
    for i, q in enumerate(queries):
        for j, d in enumerate(docs):
            out[i, j] = maxsim(q, d)
    return out


def sparse_dot(a: SparseVector, b: SparseVector) -> float:
    """Dot product of two sparse vectors given as (sorted indices, values), accumulated in float64."""
    _, ia, ib = np.intersect1d(a[0], b[0], assume_unique=True, return_indices=True)
    return float(np.dot(np.asarray(a[1], np.float64)[ia], np.asarray(b[1], np.float64)[ib]))


def sparse_matrix(queries: Sequence[SparseVector], docs: Sequence[SparseVector]) -> np.ndarray:
    """Sparse dot product of every query against every document → `[q, n]` float32."""
    out = np.empty((len(queries), len(docs)), dtype=np.float32)
    for i, q in enumerate(queries):
        for j, d in enumerate(docs):
            out[i, j] = sparse_dot(q, d)
    return out


def m3_components(query: dict[str, Any], doc: dict[str, Any]) -> tuple[float, float, float]:
    """BGE-M3's (dense, sparse, colbert) scores of a query and a document (see the module docstring)."""
    dense = float(np.dot(np.asarray(query["dense"], np.float32), np.asarray(doc["dense"], np.float32)))
    sparse = sparse_dot(query["sparse"], doc["sparse"])
    q_vectors = query["colbert"]
    colbert = maxsim(q_vectors, doc["colbert"]) / len(q_vectors) if len(q_vectors) else 0.0
    return dense, sparse, colbert


def m3_score(query: dict[str, Any], doc: dict[str, Any], weights: Sequence[float] = M3_WEIGHTS) -> float:
    """FlagEmbedding's `colbert+sparse+dense`: the weighted mean of BGE-M3's three scores."""
    parts = m3_components(query, doc)
    return float(sum(w * p for w, p in zip(weights, parts, strict=True)) / sum(weights))


def rank_order(scores: np.ndarray, index: np.ndarray | None = None) -> np.ndarray:
    """Positions sorted by score descending; ties keep input order (a stable sort, as vLLM and CrossEncoder)."""
    scores = np.asarray(scores)
    index = np.arange(len(scores)) if index is None else np.asarray(index)
    return np.lexsort((index, -scores.astype(np.float64)))


class TopN:
    """The best `n` (score, index) pairs seen so far (all of them when `n` is 0), in stable rank order."""

    def __init__(self, n: int = 0) -> None:
        self.n = n
        self.scores = np.zeros(0, dtype=np.float32)
        self.index = np.zeros(0, dtype=np.int64)

    def add(self, scores: np.ndarray, index: np.ndarray) -> None:
        """Offer more candidates."""
        self.scores = np.concatenate([self.scores, np.asarray(scores, dtype=np.float32)])
        self.index = np.concatenate([self.index, np.asarray(index, dtype=np.int64)])
        if self.n and len(self.scores) > 2 * self.n:
            self._trim()

    def _trim(self) -> None:
        order = rank_order(self.scores, self.index)
        if self.n:
            order = order[: self.n]
        self.scores, self.index = self.scores[order], self.index[order]

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """(scores, indices) sorted best first, cut to `n`."""
        self._trim()
        return self.scores, self.index


def document_prompt(prompts: dict[str, str]) -> str:
    """The prompt sentence-transformers' `encode_document` uses: document, else passage, else corpus."""
    for name in DOCUMENT_PROMPT_NAMES:
        if name in prompts:
            return prompts[name]
    return ""


def pair_prompts(method: str, prompts: dict[str, str]) -> tuple[str, str]:
    """(query prompt, document prompt) a pair method puts before each side; none for a cross-encoder."""
    if method == "cross-encoder":
        return "", ""
    return prompts.get("query", ""), document_prompt(prompts)


class PairScorer:
    """Scores pairs with one runner: builds the runner's inputs and turns its results into scores."""

    def __init__(
        self,
        runner: Any,
        method: str,
        prompts: dict[str, str] | None = None,
        similarity: str = "cosine",
        pair_format: Callable[[str, str], str] | None = None,
        weights: Sequence[float] = M3_WEIGHTS,
    ) -> None:
        self.runner = runner
        self.method = method
        self.weights = tuple(weights)  # m3: [dense, sparse, colbert]
        self.similarity = similarity
        # Cross-encoders whose pair is one templated prompt (LLM rerankers); None: a tokenizer text pair.
        self.pair_format = pair_format
        self.query_prompt, self.doc_prompt = pair_prompts(method, prompts or {})
        spec = getattr(getattr(runner, "model", None), "spec", None)
        # A late-interaction model encodes each side in its role (markers, query expansion, skiplist).
        self.roles = getattr(spec, "late_interaction", None) is not None
        if (self.query_prompt or self.doc_prompt) and spec is not None and not spec.include_prompt:
            # The prompts are prepended here, per side; the runner could not leave their tokens out of pooling.
            raise PoolingConfigError(
                f"include_prompt=false ({spec.pooling_source}) with query/document prompts is not supported "
                "for score and rerank; embed queries and documents with `embedcli embed --prompt-name`"
            )

    def _query(self, text: str) -> str:
        return RoleText(text, "query") if self.roles else self.query_prompt + text

    def _doc(self, text: str) -> str:
        return RoleText(text, "document") if self.roles else self.doc_prompt + text

    # -- 1:1 pairs ---------------------------------------------------------------------------------
    def pair_inputs(self, lefts: Sequence[str], rights: Sequence[str]) -> list[Any]:
        """Runner inputs for the pairs (left_i, right_i)."""
        if self.method == "cross-encoder":
            if self.pair_format is not None:
                return [self.pair_format(q, d) for q, d in zip(lefts, rights, strict=True)]
            return list(zip(lefts, rights, strict=True))
        return [self._query(t) for t in lefts] + [self._doc(t) for t in rights]

    def pair_scores(self, result: Any, n: int) -> np.ndarray:
        """Scores of `n` pairs from the runner's result for `pair_inputs`."""
        if self.method == "cross-encoder":
            return np.asarray(result, dtype=np.float32).reshape(n, -1)[:, 0]
        if self.method == "cosine":
            vectors = np.asarray(result)
            return similarity_pairs(self.similarity, vectors[:n], vectors[n:])
        if self.method == "sparse":
            return np.asarray([sparse_dot(result[i], result[n + i]) for i in range(n)], dtype=np.float32)
        if self.method == "m3":
            return np.asarray([m3_score(result[i], result[n + i], self.weights) for i in range(n)], dtype=np.float32)
        return np.asarray([maxsim(result[i], result[n + i]) for i in range(n)], dtype=np.float32)

    # -- queries against documents -----------------------------------------------------------------
    def encode_queries(self, queries: Sequence[str]) -> Any:
        """Query representations for `score_matrix` (bi-encoder and late interaction); None for cross-encoders."""
        if self.method == "cross-encoder" or not queries:
            return None
        results = list(self.runner.map([[self._query(q) for q in queries]]))
        if self.method == "cosine":
            return np.concatenate([np.asarray(r) for r in results])
        return [m for r in results for m in r]

    def doc_inputs(self, queries: Sequence[str], docs: Sequence[str]) -> list[Any]:
        """Runner inputs scoring every query against `docs` (cross-encoders: all query x doc pairs, query-major)."""
        if self.method == "cross-encoder":
            if self.pair_format is not None:
                return [self.pair_format(q, d) for q in queries for d in docs]
            return [(q, d) for q in queries for d in docs]
        return [self._doc(d) for d in docs]

    def score_matrix(self, encoded_queries: Any, result: Any, num_queries: int, num_docs: int) -> np.ndarray:
        """`[queries, docs]` scores from the runner's result for `doc_inputs`."""
        if self.method == "cross-encoder":
            return np.asarray(result, dtype=np.float32).reshape(num_queries, num_docs, -1)[..., 0]
        if self.method == "cosine":
            return similarity_matrix(self.similarity, encoded_queries, np.asarray(result))
        if self.method == "sparse":
            return sparse_matrix(encoded_queries, list(result))
        if self.method == "m3":
            docs = list(result)
            return np.asarray([[m3_score(q, d, self.weights) for d in docs] for q in encoded_queries],
                              dtype=np.float32).reshape(len(encoded_queries), len(docs))
        return maxsim_matrix(encoded_queries, list(result))
