"""`score` and `rerank` over in-memory texts, by the model's pair method (`embedcli.tasks.pairs`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from embedcli.api.inputs import BATCH_ROWS, batches, memory_batch, query_ids_of, texts_of
from embedcli.api.session import Session
from embedcli.errors import UsageError
from embedcli.scoring import TopN
from embedcli.tasks.pairs import (
    Documents,
    RerankOptions,
    ScoreOptions,
    check_weights,
    make_scorer,
    pair_recipe,
    rank_batch_rows,
    rank_documents,
    ranked_tables,
    resolve_method,
    score_computation,
)


class PairMethods(Session):
    """The commands that score texts against texts: a cross-encoder (its activation), an LLM reranker (its pair
    prompt), cosine with the model's query/document prompts, ColBERT MaxSim, the sparse dot product, BGE-M3's m3."""

    def score(
        self,
        left: str | Sequence[str],
        right: str | Sequence[str],
        *,
        method: str = "auto",
        weights: Sequence[float] | None = None,
        raw_scores: bool = False,
        long_inputs: str = "truncate",
        truncation_side: str | None = None,
    ) -> np.ndarray:
        """`embedcli score`: float32 scores of the pairs (left[i], right[i]); one `left` text against every `right`
        text (`score --left`), or every `left` text against one `right` text."""
        self._no_quantize("score")
        lefts, rights = texts_of(left, "left"), texts_of(right, "right")
        one_left = isinstance(left, str)
        if isinstance(right, str) and not one_left:
            rights = rights * len(lefts)
        if not one_left and len(lefts) != len(rights):
            raise UsageError(f"score: {len(lefts)} left texts but {len(rights)} right texts; give as many of each "
                             "(or one left text, scored against every right text)")
        opts = ScoreOptions(
            method=method, raw_scores=raw_scores, max_batch_tokens=self.max_batch_tokens, long_inputs=long_inputs,
            truncation_side=truncation_side, weights=_weights(weights), left=lefts[0] if one_left else None,
        )
        work = score_computation(self.spec, self.choice, opts)
        batch = memory_batch(rights) if one_left else memory_batch(lefts, {opts.right_col: rights})
        return np.asarray(self._runners.rows(work, batch).column("score").to_numpy(), dtype=np.float32)

    def rerank(
        self,
        query: str | Sequence[str],
        documents: Sequence[str],
        *,
        top_n: int = 0,
        return_documents: bool = False,
        ids: Sequence[str] | Sequence[int] | None = None,
        query_ids: Sequence[str] | None = None,
        method: str = "auto",
        weights: Sequence[float] | None = None,
        raw_scores: bool = False,
        long_inputs: str = "truncate",
        truncation_side: str | None = None,
    ) -> Any:
        """`embedcli rerank`: a pyarrow Table `query_id, id, score, rank[, text]`, each query's documents best
        first (a stable sort: ties keep input order), cut to `top_n` (0: all). Documents' ids are `ids`, else
        their positions; queries' ids `query_ids`, else 'query' for one query text (as `--query`), else positions."""
        self._no_quantize("rerank")
        if top_n < 0:
            raise UsageError(f"--top-n {top_n}: must be 0 (all) or more")
        texts = texts_of(query, "query")
        q_ids = query_ids_of(query, query_ids, len(texts))
        docs_batch = memory_batch(texts_of(documents, "documents"), ids=ids)
        opts = RerankOptions(
            method=method, raw_scores=raw_scores, max_batch_tokens=self.max_batch_tokens, long_inputs=long_inputs,
            truncation_side=truncation_side, weights=_weights(weights), top_n=top_n, return_documents=return_documents,
        )
        resolved = resolve_method(self.spec, opts.method, "rerank")
        check_weights(opts, resolved)
        runner = self._runners.runner(pair_recipe(self.spec, self.choice, opts, resolved))
        scorer = make_scorer(runner, resolved, opts)
        docs = Documents([], return_documents)
        keepers = [TopN(top_n) for _ in texts]
        parts = batches(docs_batch, rank_batch_rows(resolved, len(texts), BATCH_ROWS))
        rank_documents(runner, scorer, parts, texts, keepers, docs)
        return pa.concat_tables(ranked_tables(docs, q_ids, keepers))


def _weights(weights: Iterable[float] | None) -> tuple[float, ...] | None:
    """`weights` as `--weights` gives them (m3: dense, sparse, colbert)."""
    return None if weights is None else tuple(float(w) for w in weights)
