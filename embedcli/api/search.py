"""`search`: in-memory queries against a vectors file (by `embedcli search`'s own functions: provenance, model
check, query recipe, blocked top-k, hit rows) or against an in-memory float matrix with ids."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from embedcli.api.inputs import BATCH_ROWS, ids_of, query_ids_of, texts_of
from embedcli.api.session import Session
from embedcli.errors import UsageError
from embedcli.io.reader_base import id_array
from embedcli.retrieval import DEFAULT_BLOCK_ROWS, SearchSpace, search_blocks
from embedcli.run.source import refuse_shadowing
from embedcli.tasks.search import (
    DEFAULT_RESCORE,
    HIT_COLUMNS,
    SearchOptions,
    VectorsProvenance,
    check_kept,
    check_search_options,
    check_vectors_model,
    hit_columns,
    query_prompt,
    query_recipe,
    search_file,
)

if TYPE_CHECKING:
    from embedcli.api.runners import Runners
    from embedcli.models.spec import ModelSpec
    from embedcli.tasks.common import ModelChoice


class SearchMethods(Session):
    """The command that finds each query's nearest stored vectors."""

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
        nearest stored vectors, best first (ties: the earlier row).

        `vectors` is a vectors file `embedcli embed` wrote (its ids; the queries embedded as its provenance says:
        by the same model, refused otherwise, with its normalization, dimensions, precision and dtype, and the
        model's `query` prompt where it has one, else the corpus's), or an in-memory float matrix `[rows, d]`
        this Embedder's `embed` made, with `ids` (default: positions); cosine for float vectors.
        """
        self._no_quantize("search")
        texts = texts_of(queries, "queries")
        q_ids = query_ids_of(queries, query_ids, len(texts))
        path = "" if isinstance(vectors, np.ndarray) else os.fspath(vectors)
        opts = SearchOptions(path, top_k=top_k, keep_cols=list(keep_cols), rescore_multiplier=rescore,
                             block_rows=block_rows)
        check_search_options(opts)
        if not isinstance(vectors, np.ndarray):
            if ids is not None:
                raise UsageError(f"search: the ids of {path} are its own; give ids only with an in-memory matrix")
            return search_vectors_file(self.spec, self.choice, self._runners, texts, q_ids, opts)
        if keep_cols:
            raise UsageError("search: keep_cols are columns of a vectors file; an in-memory matrix has none")
        # Queries as `embed` embeds (the constructor's settings), with the model's query prompt where it has one.
        recipe = self._embed_recipe()
        options = replace(recipe.runner_options, prompt=query_prompt(self.spec, recipe.runner_options.prompt))
        runner = self._runners.engine(replace(recipe, runner_options=options))
        return search_matrix(runner.embed(texts, batch_rows=BATCH_ROWS).astype(np.float32, copy=False), q_ids,
                             vectors, ids, opts)


def search_vectors_file(
    spec: ModelSpec, choice: ModelChoice, runners: Runners, texts: list[str], query_ids: list[str], opts: SearchOptions
) -> Any:
    """`embedcli search VECTORS` for in-memory queries: the same checks, query vectors and hit rows."""
    refuse_shadowing(HIT_COLUMNS, opts.keep_cols)
    prov = VectorsProvenance.read(opts.vectors)
    check_kept(prov, opts.keep_cols)
    check_vectors_model(prov, spec, f"the Embedder's model {spec.name!r}")
    runner = runners.engine(query_recipe(prov, spec, choice))
    vectors = runner.embed(texts).astype(np.float32, copy=False)
    table, _ = search_file(prov, vectors, query_ids, opts)
    return table


def search_matrix(
    queries: np.ndarray, query_ids: list[str], matrix: np.ndarray, ids: Any, opts: SearchOptions
) -> Any:
    """Exact top-k (cosine) of float `queries` over the rows of a float `matrix`, as hit rows with `ids`."""
    if matrix.ndim != 2 or matrix.dtype.kind != "f":
        raise UsageError(f"search: vectors is a {matrix.ndim}-D {matrix.dtype} array; give a float matrix [rows, d] "
                         "(quantized vectors: search the file embed wrote)")
    if matrix.shape[1] != queries.shape[1]:
        raise UsageError(f"search: the matrix's vectors are {matrix.shape[1]} wide, this Embedder's queries "
                         f"{queries.shape[1]}: the matrix was not made by its embed")
    row_ids, id_type = ids_of(ids, len(matrix))
    stored = matrix.astype(np.float32, copy=False)
    blocks = (stored[i : i + opts.block_rows] for i in range(0, len(stored), opts.block_rows))
    scores, rows = search_blocks(queries, blocks, opts.top_k, SearchSpace("float32", queries.shape[1]))
    hits = id_array(row_ids, id_type).take(pa.array(rows.reshape(-1), pa.int64()))
    return pa.table(hit_columns(query_ids, scores, hits))
