"""`embedcli sparse-embed`: SPLADE vectors of each row as Parquet `indices: list<int32>`, `values: list<float32>`.

A command of its own rather than `embed --sparse`: like `token-embed` it is a different task (vLLM's task
class: one output shape per task) with a different output schema, and none of `embed`'s vector options
(`--precision`, `--calibration`, `--dimensions`, `--normalize`, `--long-inputs chunk`) means anything for a
vocabulary-sized sparse vector; a separate command keeps those flags out of its help instead of refusing
them at run time. It is one `Job` like the other tasks, so resume, `--incremental`, `--shard` and
`--engine ray` work as for `embed`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from embedcli.compute.choice import embed_prompt, require_task
from embedcli.compute.options import RunnerOptions
from embedcli.errors import UsageError
from embedcli.run.flags import RunFlags
from embedcli.run.source import BatchSource, InputOptions, check_head, empty_batch, id_column, kept_columns
from embedcli.run.target import check_target
from embedcli.scoring import SparseVector
from embedcli.tasks.common import (
    Computation,
    ModelChoice,
    OutputOptions,
    load_spec,
    located,
    run_computation,
    runner_recipe,
)
from embedcli.tasks.m3_rules import check_m3_sparse, m3_extra
from embedcli.tasks.tokens import list_column

if TYPE_CHECKING:  # torch: loaded with the model, only once a run has work to do
    from embedcli.compute.runner import Runner
    from embedcli.models.loader import LoadedModel
    from embedcli.models.spec import ModelSpec


@dataclass(frozen=True)
class SparseOptions:
    """`sparse-embed` choices."""

    top_k: int | None = None
    with_tokens: bool = False
    max_batch_tokens: int | None = None
    long_inputs: str = "truncate"
    truncation_side: str | None = None
    strip: bool = False
    prompt: str | None = None
    prompt_name: str | None = None


def sparse_columns(rows: Sequence[SparseVector], vocab: Sequence[str] | None = None) -> dict[str, Any]:
    """The `indices` / `values` (and, given the vocabulary, `tokens`) columns of sparse rows."""
    columns = {
        "indices": list_column([np.asarray(i, np.int32) for i, _ in rows], pa.int32()),
        "values": list_column([np.asarray(v, np.float32) for _, v in rows], pa.float32()),
    }
    if vocab is not None:
        table = np.asarray(vocab, dtype=object)
        columns["tokens"] = pa.array([table[np.asarray(i, np.int64)].tolist() for i, _ in rows], pa.list_(pa.string()))
    return columns


@dataclass
class SparseCodec:
    """Rows of `sparse-embed`: id, indices, values, [tokens], kept columns.

    With `with_tokens` the vocabulary is the model's tokenizer's: `load` reads it once the model loads.
    """

    with_tokens: bool = False
    keep_cols: tuple[str, ...] = ()
    vocab: tuple[str, ...] | None = None

    def load(self, runner: Runner) -> None:
        """Take the vocabulary of the built runner's tokenizer (with `with_tokens`)."""
        if self.with_tokens:
            self.vocab = vocabulary(runner.model)

    def inputs(self, batch: Any) -> Any:
        """The batch's texts."""
        return located(batch)

    def table(self, batch: Any, rows: Sequence[SparseVector]) -> Any:
        """The output rows of a batch."""
        vocab = (self.vocab or ()) if self.with_tokens else None
        columns = {"id": id_column(batch), **sparse_columns(list(rows), vocab)}
        columns.update(kept_columns(batch, self.keep_cols))
        return pa.table(columns)

    def empty(self) -> Any:
        """The output of no rows."""
        return self.table(empty_batch(self.keep_cols), [])


def vocabulary(model: LoadedModel) -> tuple[str, ...]:
    """Token text of every id (the tokenizer's vocabulary, in id order; ids it lacks map to '')."""
    tok = model.tokenizer
    size = max(model.spec.embedding_size, tok.get_vocab_size(with_added_tokens=True))
    return tuple(tok.id_to_token(i) or "" for i in range(size))


def check_sparse_options(opts: SparseOptions) -> None:
    """Usage errors of `sparse-embed`'s options, decided before the model is resolved."""
    if opts.long_inputs == "chunk":
        raise UsageError("sparse-embed: --long-inputs chunk applies to embed only; use truncate or error")
    if opts.top_k is not None and opts.top_k < 1:
        raise UsageError(f"--sparse-top-k {opts.top_k}: must be at least 1")


def sparse_computation(
    spec: ModelSpec, choice: ModelChoice, opts: SparseOptions, keep_cols: tuple[str, ...] = ()
) -> Computation:
    """The runner recipe, codec and provenance of `sparse-embed` on `spec` (usage errors before anything loads)."""
    check_sparse_options(opts)
    require_task(spec, "sparse_embed", "sparse-embed")
    check_m3_sparse(spec, opts.top_k)
    recipe = runner_recipe(
        spec, choice,
        RunnerOptions(
            task="sparse_embed", max_batch_tokens=opts.max_batch_tokens, strip=opts.strip,
            prompt=embed_prompt(spec, opts.prompt, opts.prompt_name),
            long_inputs=opts.long_inputs, truncation_side=opts.truncation_side,  # type: ignore[arg-type]  # typer's Literal choices; RunnerOptions takes the same values
        ),
        sparse_top_k=opts.top_k,
    )
    codec = SparseCodec(opts.with_tokens, keep_cols)
    top_k = opts.top_k if opts.top_k is not None else spec.sparse_top_k
    extra = {"sparse_pooling": spec.sparse_pooling, "sparse_activation": spec.sparse_activation,
             "sparse_top_k": top_k, "with_tokens": opts.with_tokens, "vocab_size": spec.embedding_size, **m3_extra(spec)}
    return Computation(recipe, codec, extra, codec.load)


def run_sparse_embed(
    inputs: InputOptions, choice: ModelChoice, opts: SparseOptions, output: OutputOptions, flags: RunFlags | None = None
) -> int:
    """`embedcli sparse-embed`: one sparse vector per row (id, indices, values[, tokens]) and kept columns."""
    flags = flags or RunFlags()
    check_target(output.path, flags, inputs.paths, output.stats_file)
    check_head(BatchSource(inputs), flags)  # said before the model loads
    fmt = (output.fmt or Path(output.path).suffix.lstrip(".")).lower()
    if fmt == "npy":
        raise UsageError("sparse-embed writes list columns (indices, values): use .parquet or .jsonl, not .npy")
    check_sparse_options(opts)  # before the model is resolved
    work = sparse_computation(load_spec(choice), choice, opts, tuple(inputs.keep_cols))
    return run_computation(BatchSource(inputs), work, output, flags)
