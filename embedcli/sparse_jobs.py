"""`embedcli sparse-embed`: SPLADE vectors of each row as Parquet `indices: list<int32>`, `values: list<float32>`.

A command of its own rather than `embed --sparse`: like `token-embed` it is a different task (vLLM's task
class: one output shape per task) with a different output schema, and none of `embed`'s vector options
(`--precision`, `--calibration`, `--dimensions`, `--normalize`, `--long-inputs chunk`) means anything for a
vocabulary-sized sparse vector; a separate command keeps those flags out of its help instead of refusing
them at run time. It goes through the shared loop (`run_rows`), so resume, `--incremental`, `--shard` and
`--engine ray` work as for `embed`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from embedcli.jobs import (
    InputOptions,
    ModelChoice,
    OutputOptions,
    UsageError,
    kept_columns,
    load,
    provenance,
    read_batches,
    run_rows,
)


@dataclass
class SparseOptions:
    """`sparse-embed` choices."""

    top_k: int | None = None
    with_tokens: bool = False
    max_batch_tokens: int | None = None
    long_inputs: str = "truncate"
    truncation_side: str = "right"
    strip: bool = True
    prompt: str | None = None
    prompt_name: str | None = None


def list_array(parts: Sequence[np.ndarray], typ: Any) -> Any:
    """`list<typ>` with one entry per row from per-row 1-D arrays (int32 offsets)."""
    import pyarrow as pa

    offsets = np.zeros(len(parts) + 1, dtype=np.int32)
    np.cumsum([len(p) for p in parts], out=offsets[1:])
    values = np.concatenate(parts) if parts else np.zeros(0)
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(values, typ))


def sparse_columns(rows: Sequence[tuple[np.ndarray, np.ndarray]], vocab: Sequence[str] | None = None) -> dict[str, Any]:
    """The `indices` / `values` (and, given the vocabulary, `tokens`) columns of sparse rows."""
    import pyarrow as pa

    columns = {
        "indices": list_array([np.asarray(i, np.int32) for i, _ in rows], pa.int32()),
        "values": list_array([np.asarray(v, np.float32) for _, v in rows], pa.float32()),
    }
    if vocab is not None:
        table = np.asarray(vocab, dtype=object)
        columns["tokens"] = pa.array([table[np.asarray(i, np.int64)].tolist() for i, _ in rows], pa.list_(pa.string()))
    return columns


def run_sparse_embed(inputs: InputOptions, choice: ModelChoice, opts: SparseOptions, output: OutputOptions) -> int:
    """`embedcli sparse-embed`: one sparse vector per row (id, indices, values[, tokens]) and kept columns."""
    import pyarrow as pa

    from embedcli.io.writers import check_output_path
    from embedcli.runner import RunnerOptions
    from embedcli.task_jobs import embed_prompt, load_spec, located, require_task

    check_output_path(output.path)
    fmt = (output.fmt or Path(output.path).suffix.lstrip(".")).lower()
    if fmt == "npy":
        raise UsageError("sparse-embed writes list columns (indices, values): use .parquet or .jsonl, not .npy")
    if opts.long_inputs == "chunk":
        raise UsageError("sparse-embed: --long-inputs chunk applies to embed only; use truncate or error")
    if opts.top_k is not None and opts.top_k < 1:
        raise UsageError(f"--sparse-top-k {opts.top_k}: must be at least 1")
    spec = load_spec(choice)
    require_task(spec, "sparse_embed", "sparse-embed")
    model = load(choice, spec, sparse_top_k=opts.top_k)
    from embedcli.runner import Runner

    runner = Runner(
        model,
        RunnerOptions(
            task="sparse_embed", max_batch_tokens=opts.max_batch_tokens, strip=opts.strip,
            prompt=embed_prompt(spec, opts.prompt, opts.prompt_name),
            long_inputs=opts.long_inputs, truncation_side=opts.truncation_side,  # type: ignore[arg-type]
        ),
    )
    vocab = _vocabulary(model) if opts.with_tokens else None

    def to_table(batch: Any, rows: Any) -> Any:
        columns = {"id": pa.array(batch.ids, pa.string()), **sparse_columns(list(rows), vocab)}
        columns.update(kept_columns(batch, inputs.keep_cols))
        return pa.table(columns)

    def empty_table() -> Any:
        return pa.table({"id": pa.array([], pa.string()), **sparse_columns([], vocab)})

    top_k = opts.top_k if opts.top_k is not None else spec.sparse_top_k
    meta = provenance(
        model, runner,
        {"sparse_pooling": spec.sparse_pooling, "sparse_activation": spec.sparse_activation,
         "sparse_top_k": top_k, "with_tokens": opts.with_tokens, "vocab_size": spec.embedding_size},
    )
    return run_rows(read_batches(inputs), runner, output, meta, to_inputs=located, to_table=to_table,
                    empty_table=empty_table)


def _vocabulary(model: Any) -> list[str]:
    """Token text of every id (the tokenizer's vocabulary, in id order; ids it lacks map to '')."""
    tok = model.tokenizer
    size = max(model.spec.embedding_size, tok.get_vocab_size(with_added_tokens=True))
    return [tok.id_to_token(i) or "" for i in range(size)]
