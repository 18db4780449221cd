"""`Embedder.search`: queries against a vectors file (by `embedcli search`'s own functions: provenance, model
check, query recipe, blocked top-k, hit rows) or against an in-memory float matrix with ids."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from embedcli.api.inputs import ids_of
from embedcli.errors import UsageError
from embedcli.io.reader_base import id_array
from embedcli.retrieval import SearchSpace, search_blocks
from embedcli.run.source import refuse_shadowing
from embedcli.tasks.search import (
    HIT_COLUMNS,
    SearchOptions,
    VectorsProvenance,
    check_kept,
    check_vectors_model,
    hit_columns,
    query_recipe,
    search_file,
)

if TYPE_CHECKING:
    from embedcli.api.runners import Runners
    from embedcli.models.spec import ModelSpec
    from embedcli.tasks.common import ModelChoice


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
