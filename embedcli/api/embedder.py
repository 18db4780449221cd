"""`Embedder`: one model, every command it serves, over in-memory texts; each method runs what its CLI command
runs (the same recipe, the same runner builder, the same codec), so results equal the command's output."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa

from embedcli.api.inputs import BATCH_ROWS, batches, memory_batch, pairs_of, texts_of
from embedcli.api.runners import Runners
from embedcli.api.search import search_matrix, search_vectors_file
from embedcli.compute.build import RunnerRecipe, embed_recipe
from embedcli.errors import UsageError
from embedcli.models.llm_reranker import reranker_flags
from embedcli.quantize import make_quantizer, ranges_of
from embedcli.retrieval import DEFAULT_BLOCK_ROWS
from embedcli.scoring import TopN
from embedcli.tasks.classify import ClassifyOptions, classify_computation
from embedcli.tasks.common import ModelChoice, load_spec
from embedcli.tasks.embed import calibrate_on_output, check_calibration_width
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
from embedcli.tasks.search import DEFAULT_RESCORE, SearchOptions, check_search_options, query_prompt
from embedcli.tasks.sparse import SparseOptions, check_sparse_options, sparse_computation
from embedcli.tasks.tokens import TokenOptions, token_embed_computation

PAIR_COL = "pair"  # the second text of a classified pair, as the column `classify --pair-col` names


class Embedder:
    """One model, resolved offline, and what `embedcli` does with it, over lists of texts in memory.

    `Embedder(model)` takes the model flags every command shares (`--device`, `--dtype`, `--threads`,
    `--max-batch-tokens`, `--max-length`, `--allow-pickle`, `--trust-remote-code`, the LLM-reranker flags), with
    the CLI's defaults: `dtype="auto"` (bfloat16 where the model passes its parity probe on a CPU with native bf16
    matmuls, else float32), prompts, activation, normalization and max length from the checkpoint. Each method
    takes its command's own flags as keyword arguments, builds (once) the runner the command builds, and returns
    what the command writes, without ids (rows are in input order): vectors as numpy, rows with ragged or label
    columns as a pyarrow Table with the command's columns (`embedcli.api.ragged` turns a list column into numpy
    arrays). Bad input or flags raise `embedcli.errors` exceptions (`UsageError` for a usage error) with the
    command's messages. `normalize`, `dimensions`, `prompt` and `prompt_name` given here are `embed`'s defaults
    (and how `search` embeds queries against an in-memory matrix); `quantize` applies to `embed` only, as
    `embedcli embed --quantize`.
    """

    def __init__(
        self,
        model: str | None = None,
        *,
        device: str = "auto",
        dtype: str = "auto",
        threads: int | None = None,
        max_batch_tokens: int | None = None,
        max_length: int | None = None,
        allow_pickle: bool = False,
        trust_remote_code: bool = False,
        quantize: bool = False,
        classifier_from_tokens: str | Sequence[str] | None = None,
        pair_template: str | None = None,
        instruction: str | None = None,
        reranker_preset: str | None = None,
        normalize: bool | None = None,
        dimensions: int | None = None,
        prompt: str | None = None,
        prompt_name: str | None = None,
    ) -> None:
        tokens = classifier_from_tokens
        if tokens is not None and not isinstance(tokens, str):
            tokens = ",".join(texts_of(tokens, "classifier_from_tokens"))
        reranker = reranker_flags(tokens, pair_template, instruction, reranker_preset)
        self.choice = ModelChoice(str(model) if model is not None else None, device, dtype, max_length, allow_pickle,
                                  trust_remote_code, quantize, reranker, threads)
        self.choice.options()  # refused device / dtype / --quantize values: usage errors now, not at first use
        self.spec = load_spec(self.choice)  # resolved (its weight files hashed) once; weights load on first use
        self.max_batch_tokens = max_batch_tokens
        self._embed_defaults = (normalize, dimensions, prompt, prompt_name)
        self._runners = Runners()

    # -- embed ----------------------------------------------------------------------------------------
    def _embed_recipe(
        self, normalize: bool | None, dimensions: int | None, prompt: str | None, prompt_name: str | None,
        long_inputs: str, truncation_side: str, strip: bool,
    ) -> RunnerRecipe:
        d_normalize, d_dimensions, d_prompt, d_prompt_name = self._embed_defaults
        if prompt is None and prompt_name is None:  # a prompt asked here replaces the constructor's
            prompt, prompt_name = d_prompt, d_prompt_name
        return embed_recipe(
            self.spec, self.choice.options(), max_batch_tokens=self.max_batch_tokens,
            normalize=d_normalize if normalize is None else normalize, strip=strip,
            dimensions=d_dimensions if dimensions is None else dimensions, prompt=prompt, prompt_name=prompt_name,
            long_inputs=long_inputs, truncation_side=truncation_side, threads=self.choice.threads,
        )

    def embed(
        self,
        texts: str | Sequence[str],
        *,
        normalize: bool | None = None,
        dimensions: int | None = None,
        prompt: str | None = None,
        prompt_name: str | None = None,
        long_inputs: str = "truncate",
        truncation_side: str = "right",
        strip: bool = False,
        precision: str = "float32",
        calibration: str | None = None,
    ) -> np.ndarray:
        """`embedcli embed`: vectors `[len(texts), d]` in input order (a single string gives `[d]`); float32, or
        the `precision`'s dtype (int8/uint8 ranges from these vectors unless `calibration` names a file)."""
        rows = texts_of(texts)
        quant = make_quantizer(precision, calibration)
        recipe = self._embed_recipe(normalize, dimensions, prompt, prompt_name, long_inputs, truncation_side, strip)
        vectors = self._runners.engine(recipe).embed(rows, batch_rows=BATCH_ROWS).astype(np.float32, copy=False)
        if quant.precision != "float32":
            check_calibration_width(quant, calibration, vectors.shape[1])
            if quant.needs_ranges:
                calibrate_on_output(quant, ranges_of(vectors), len(vectors))
            vectors = quant(vectors)
        return vectors[0] if isinstance(texts, str) else vectors

    # -- classify -------------------------------------------------------------------------------------
    def classify(
        self,
        texts: str | Sequence[str] | Sequence[tuple[str, str]],
        *,
        activation: str = "auto",
        top_k: int = 1,
        all_scores: bool = False,
        logit_mean: float | None = None,
        logit_sigma: float | None = None,
        long_inputs: str = "truncate",
        truncation_side: str = "right",
        strip: bool = False,
    ) -> Any:
        """`embedcli classify`: a pyarrow Table `label, score[, top_labels, top_scores][, scores]`, one row per
        text; `texts` may be (first, second) pairs, classified as `classify --pair-col` does (e.g. NLI)."""
        self._no_quantize("classify")
        firsts, seconds = pairs_of(texts)
        opts = ClassifyOptions(
            activation=activation, top_k=top_k, all_scores=all_scores, logit_mean=logit_mean, logit_sigma=logit_sigma,
            max_batch_tokens=self.max_batch_tokens, long_inputs=long_inputs, truncation_side=truncation_side,
            strip=strip, pair_col=PAIR_COL if seconds is not None else None,
        )
        work = classify_computation(self.spec, self.choice, opts)
        return self._runners.rows(work, memory_batch(firsts, {PAIR_COL: seconds} if seconds is not None else None))

    # -- token-embed and sparse-embed -----------------------------------------------------------------
    def token_embed(
        self,
        texts: str | Sequence[str],
        *,
        role: str = "auto",
        normalize: bool | None = None,
        dimensions: int | None = None,
        keep_special: bool = False,
        step_tag_id: int | None = None,
        long_inputs: str = "truncate",
        truncation_side: str = "right",
        strip: bool = False,
    ) -> Any:
        """`embedcli token-embed`: a pyarrow Table `token_ids` (list<int32>), `embeddings`
        (list<fixed_size_list<float32>[d]>), one row per text; a ColBERT model's query or document vectors by
        `role` (auto: document), BGE-M3's colbert vectors."""
        self._no_quantize("token_embed")
        opts = TokenOptions(
            keep_special=keep_special, step_tag_id=step_tag_id, dimensions=dimensions, normalize=normalize,
            max_batch_tokens=self.max_batch_tokens, long_inputs=long_inputs, truncation_side=truncation_side,
            strip=strip, role=role,
        )
        work = token_embed_computation(self.spec, self.choice, opts)
        return self._runners.rows(work, memory_batch(texts_of(texts)))

    def sparse_embed(
        self,
        texts: str | Sequence[str],
        *,
        top_k: int | None = None,
        with_tokens: bool = False,
        prompt: str | None = None,
        prompt_name: str | None = None,
        long_inputs: str = "truncate",
        truncation_side: str = "right",
        strip: bool = False,
    ) -> Any:
        """`embedcli sparse-embed`: a pyarrow Table `indices` (list<int32>, ascending), `values` (list<float32>)
        [, `tokens`], one row per text (SPLADE; BGE-M3's lexical weights)."""
        self._no_quantize("sparse_embed")
        opts = SparseOptions(
            top_k=top_k, with_tokens=with_tokens, max_batch_tokens=self.max_batch_tokens, long_inputs=long_inputs,
            truncation_side=truncation_side, strip=strip, prompt=prompt, prompt_name=prompt_name,
        )
        check_sparse_options(opts)
        work = sparse_computation(self.spec, self.choice, opts)
        return self._runners.rows(work, memory_batch(texts_of(texts)))

    # -- score and rerank -----------------------------------------------------------------------------
    def score(
        self,
        left: str | Sequence[str],
        right: str | Sequence[str],
        *,
        method: str = "auto",
        weights: Sequence[float] | None = None,
        raw_scores: bool = False,
        long_inputs: str = "truncate",
        truncation_side: str = "right",
    ) -> np.ndarray:
        """`embedcli score`: float32 scores of the pairs (left[i], right[i]); one `left` text against every
        `right` text (`score --left`), or every `left` against one `right`. The method is the model's (a
        cross-encoder with its activation, an LLM reranker's pair prompt, cosine, ColBERT MaxSim, sparse)."""
        self._no_quantize("score")
        lefts, rights = texts_of(left, "left"), texts_of(right, "right")
        if isinstance(right, str) and not isinstance(left, str):
            rights = rights * len(lefts)
        one_left = isinstance(left, str)
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
        truncation_side: str = "right",
    ) -> Any:
        """`embedcli rerank`: a pyarrow Table `query_id, id, score, rank[, text]`, per query its documents best
        first (a stable sort: ties keep input order), cut to `top_n` (0: all). Document ids are `ids`, else
        their positions; query ids `query_ids`, else 'query' for one query (as `--query`) or positions."""
        self._no_quantize("rerank")
        if top_n < 0:
            raise UsageError(f"--top-n {top_n}: must be 0 (all) or more")
        texts = texts_of(query, "query")
        q_ids = _query_ids(query, query_ids, len(texts))
        batch = memory_batch(texts_of(documents, "documents"), ids=ids)
        opts = RerankOptions(
            method=method, raw_scores=raw_scores, max_batch_tokens=self.max_batch_tokens, long_inputs=long_inputs,
            truncation_side=truncation_side, weights=_weights(weights), top_n=top_n, return_documents=return_documents,
        )
        method = resolve_method(self.spec, opts.method, "rerank")
        check_weights(opts, method)
        runner = self._runners.runner(pair_recipe(self.spec, self.choice, opts, method))
        scorer = make_scorer(runner, method, opts)
        docs = Documents([], return_documents)
        keepers = [TopN(top_n) for _ in texts]
        rows = rank_batch_rows(method, len(texts), BATCH_ROWS)
        rank_documents(runner, scorer, batches(batch, rows), texts, keepers, docs)
        return pa.concat_tables(ranked_tables(docs, q_ids, keepers))

    # -- search ---------------------------------------------------------------------------------------
    def search(
        self,
        queries: str | Sequence[str],
        vectors: str | os.PathLike[str] | np.ndarray,
        *,
        ids: Sequence[str] | Sequence[int] | None = None,
        query_ids: Sequence[str] | None = None,
        top_k: int = 10,
        keep_cols: Sequence[str] = (),
        rescore: int = DEFAULT_RESCORE,
        block_rows: int = DEFAULT_BLOCK_ROWS,
    ) -> Any:
        """`embedcli search`: a pyarrow Table `query_id, rank, id, score[, kept columns]`, each query's `top_k`
        nearest stored vectors best first (ties: the earlier row).

        `vectors` is a vectors file `embedcli embed` wrote (its ids; queries embedded as its provenance says:
        the same model, refused otherwise, its normalization, dimensions, precision, dtype, and the model's
        `query` prompt where it has one, else the corpus's), or an in-memory float matrix `[rows, d]` with `ids`
        (default: positions), its rows made by this Embedder's `embed` (queries embedded with the constructor's
        embed settings and the model's `query` prompt where it has one); cosine for float vectors.
        """
        self._no_quantize("search")
        texts = texts_of(queries, "queries")
        q_ids = _query_ids(queries, query_ids, len(texts))
        opts = SearchOptions(str(vectors) if not isinstance(vectors, np.ndarray) else "", top_k=top_k,
                             keep_cols=list(keep_cols), rescore_multiplier=rescore, block_rows=block_rows)
        check_search_options(opts)
        if not isinstance(vectors, np.ndarray):
            if ids is not None:
                raise UsageError(f"search: the ids of {vectors} are its own; give ids only with an in-memory matrix")
            return search_vectors_file(self.spec, self.choice, self._runners, texts, q_ids, opts)
        if keep_cols:
            raise UsageError("search: keep_cols are columns of a vectors file; an in-memory matrix has none")
        recipe = self._embed_recipe(None, None, None, None, "truncate", "right", False)
        recipe = replace(recipe, runner_options=replace(
            recipe.runner_options, prompt=query_prompt(self.spec, recipe.runner_options.prompt)))
        query_vectors = self._runners.engine(recipe).embed(texts, batch_rows=BATCH_ROWS).astype(np.float32, copy=False)
        return search_matrix(query_vectors, q_ids, vectors, ids, opts)

    def _no_quantize(self, method: str) -> None:
        if self.choice.quantize:
            raise UsageError(f"{method}: quantize=True (int8 dynamic) applies to embed only, as "
                             "`embedcli embed --quantize`; make an Embedder without it")


def _weights(weights: Iterable[float] | None) -> tuple[float, ...] | None:
    """`--weights` as the pair options take them."""
    return None if weights is None else tuple(float(w) for w in weights)


def _query_ids(queries: str | Sequence[str], query_ids: Sequence[str] | None, n: int) -> list[str]:
    """The queries' ids: given (one str per query), else 'query' for one query text (as `--query`), else positions."""
    if query_ids is None:
        return ["query"] if isinstance(queries, str) else [str(i) for i in range(n)]
    given = texts_of(query_ids, "query_ids")
    if len(given) != n:
        raise UsageError(f"query_ids: {len(given)} ids for {n} queries; give one id per query")
    return given
