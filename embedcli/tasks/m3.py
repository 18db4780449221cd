"""BGE-M3 runs: `embed --outputs dense,sparse,colbert` (several outputs as columns of one output, one forward
per pack), and the checks `sparse-embed` / `token-embed` apply to its lexical weights and colbert vectors.

The columns have the names the single-output commands give them, so a hybrid output holds exactly what
`embed`, `sparse-embed` and `token-embed` write: `embedding` (dense), `indices` / `values` (the lexical
weights, sorted by token id), `token_ids` / `embeddings` (the colbert vectors and the token each belongs to:
every token after `<s>`, the final `</s>` included, as FlagEmbedding's `colbert_vecs`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from embedcli.compute.build import RunnerRecipe
from embedcli.compute.choice import embed_prompt
from embedcli.compute.options import RunnerOptions
from embedcli.errors import UsageError
from embedcli.io.writers import embedding_array
from embedcli.models.spec import ModelSpec
from embedcli.run.source import empty_batch, id_column, with_kept
from embedcli.tasks.common import Computation, ModelChoice, located, runner_recipe
from embedcli.tasks.m3_rules import m3_extra, require_m3
from embedcli.tasks.sparse import sparse_columns
from embedcli.tasks.tokens import list_column, list_of_vectors


@dataclass(frozen=True)
class HybridRequest:
    """What `embed --outputs` asked for beside the dense vector."""

    outputs: tuple[str, ...]
    max_batch_tokens: int | None = None
    strip: bool = False
    prompt: str | None = None
    prompt_name: str | None = None
    long_inputs: str = "truncate"
    truncation_side: str | None = None


def check_hybrid(spec: ModelSpec, request: HybridRequest, *, precision: str, dimensions: int | None,
                 normalize: bool | None, calibration: str | None, fmt: str) -> None:
    """Usage errors for `embed --outputs` with more than the dense vector, before the model loads."""
    require_m3(spec, f"--outputs {','.join(request.outputs)}")
    refused = [flag for flag, given in (
        ("--precision", precision != "float32"), ("--calibration", calibration is not None),
        ("--dimensions", dimensions is not None), ("--normalize/--no-normalize", normalize is not None),
        ("--long-inputs chunk", request.long_inputs == "chunk"),
    ) if given]
    if refused:
        raise UsageError(f"embed --outputs {','.join(request.outputs)}: {', '.join(refused)} apply to a dense-only "
                         "run (--outputs dense); the hybrid output keeps FlagEmbedding's float32 values")
    if fmt == "npy":
        raise UsageError("embed --outputs with sparse or colbert writes list columns: use .parquet or .jsonl, not .npy")


def hybrid_recipe(spec: ModelSpec, choice: ModelChoice, request: HybridRequest) -> RunnerRecipe:
    """The runner recipe of a BGE-M3 run writing `request.outputs` from one forward per pack."""
    options = RunnerOptions(
        task="hybrid_embed", max_batch_tokens=request.max_batch_tokens, strip=request.strip,
        prompt=embed_prompt(spec, request.prompt, request.prompt_name),
        long_inputs=request.long_inputs, truncation_side=request.truncation_side,  # type: ignore[arg-type]  # typer's Literal choices; RunnerOptions takes the same values
    )
    # `--dtype auto` is probed on the dense vector, as for `embed`.
    return runner_recipe(spec, choice, options, m3_outputs=request.outputs, task="embed")


@dataclass(frozen=True)
class HybridCodec:
    """Rows of `embed --outputs`: id, then each output's columns in the order asked, then kept columns."""

    outputs: tuple[str, ...]
    dense_width: int
    colbert_width: int
    keep_cols: tuple[str, ...] = ()

    def inputs(self, batch: Any) -> Any:
        """The batch's texts."""
        return located(batch)

    def table(self, batch: Any, rows: Sequence[dict[str, Any]]) -> Any:
        """The output rows of a batch."""
        columns: dict[str, Any] = {"id": id_column(batch)}
        for name in self.outputs:
            if name == "dense":
                matrix = np.stack([r["dense"] for r in rows]) if rows else np.zeros((0, self.dense_width), np.float32)
                columns["embedding"] = embedding_array(matrix.astype(np.float32, copy=False))
            elif name == "sparse":
                columns.update(sparse_columns([r["sparse"] for r in rows]))
            else:
                columns["token_ids"] = list_column([np.asarray(r["colbert_ids"], np.int32) for r in rows], pa.int32())
                columns["embeddings"] = list_of_vectors([r["colbert"] for r in rows], self.colbert_width)
        return pa.table(with_kept(columns, batch, self.keep_cols))

    def empty(self) -> Any:
        """The output of no rows."""
        return self.table(empty_batch(self.keep_cols), [])


def hybrid_computation(
    spec: ModelSpec, choice: ModelChoice, request: HybridRequest, keep_cols: tuple[str, ...] = ()
) -> Computation:
    """The runner recipe, codec and provenance of `embed --outputs` on a BGE-M3 model (checked by `check_hybrid`)."""
    codec = HybridCodec(request.outputs, spec.embedding_size, spec.hidden_size, keep_cols)
    return Computation(hybrid_recipe(spec, choice, request), codec, {"outputs": list(request.outputs), **m3_extra(spec)})


def output_format(path: str, fmt: str | None) -> str:
    """The output's format name as `-o` / `--output-format` give it."""
    return (fmt or Path(path).suffix.lstrip(".")).lower()
