"""Command bodies: read inputs, run the model, write results. The CLI only parses flags and calls these."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from embedcli import __version__

EXIT_OK, EXIT_FATAL, EXIT_USAGE, EXIT_SKIPPED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


class UsageError(ValueError):
    """Bad or conflicting flags, or a task the model cannot do (exit 2)."""


@dataclass
class InputOptions:
    """Where rows come from and which columns matter."""

    paths: list[str]
    text_col: str = "text"
    id_col: str | None = None
    keep_cols: list[str] = field(default_factory=list)
    fmt: str | None = None
    batch_rows: int = 1024


@dataclass
class ModelChoice:
    """Which model, on which device and dtype."""

    model: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    max_length: int | None = None
    allow_pickle: bool = False
    trust_remote_code: bool = False
    quantize: bool = False
    reranker: Any = None  # embedcli.models.llm_reranker.RerankerFlags: a causal LM as a yes/no reranker


@dataclass
class OutputOptions:
    """Where results go and how progress is reported."""

    path: str
    fmt: str | None = None
    quiet: bool = False
    stats_file: str | None = None


@dataclass
class EmbedOptions:
    """Embedding-specific choices."""

    normalize: bool | None = None
    max_batch_tokens: int | None = None
    strip: bool = True
    dimensions: int | None = None
    prompt: str | None = None
    prompt_name: str | None = None
    long_inputs: str = "truncate"
    truncation_side: str = "right"
    precision: str = "float32"
    calibration: str | None = None


def load(choice: ModelChoice, spec: Any = None, **options: Any):  # type: ignore[no-untyped-def]
    """Resolve (unless `spec` is given) and load the model; `options` are task options of `ModelOptions`.

    torch is imported here, lazily, so `--help` stays fast.
    """
    if choice.quantize and (choice.dtype not in ("auto", "float32") or choice.device.startswith("cuda")):
        raise UsageError("--quantize (int8 dynamic) runs on the CPU in float32: drop --dtype/--device or --quantize")
    from embedcli.models.loader import LoadedModel, ModelOptions
    from embedcli.models.spec import load_model_spec

    if spec is None:
        spec = load_model_spec(
            choice.model,
            allow_pickle=choice.allow_pickle,
            trust_remote_code=choice.trust_remote_code,
            max_length=choice.max_length,
            reranker=choice.reranker,
        )
    return LoadedModel(
        spec,
        ModelOptions(
            device=choice.device,
            dtype=choice.dtype,
            allow_pickle=choice.allow_pickle,
            trust_remote_code=choice.trust_remote_code,
            quantize=choice.quantize,
            **options,
        ),
    )


def provenance(model: Any, runner: Any, extra: dict[str, Any] | None = None) -> dict[str, str]:
    """Key-value metadata every output carries: model, its content hash, resolved config and its hash."""
    import hashlib

    spec = model.spec
    resolved = {
        "task": runner.params.task,
        "pooling": spec.seq_pooling_type,
        "normalize": bool(runner.params.use_activation),
        "dimensions": runner.params.dimensions,
        "projector": [asdict(d) for d in spec.projector],
        "max_length": runner.max_length,
        "long_inputs": runner.options.long_inputs,
        "truncation_side": runner.options.truncation_side,
        "strip": runner.options.strip,
        "prompt": runner.options.prompt,
        "dtype": str(model.dtype).removeprefix("torch."),
        "quantize": bool(model.options.quantize),
        "model_config_hash": spec.config_hash(),
        **(extra or {}),
    }
    config_json = json.dumps(resolved, sort_keys=True, default=str)
    return {
        "embedcli.version": __version__,
        "embedcli.model": spec.name,
        "embedcli.model_hash": spec.content_hash,
        "embedcli.config": config_json,
        "embedcli.config_hash": hashlib.sha256(config_json.encode()).hexdigest()[:16],
        "embedcli.dtype": resolved["dtype"],
    }


def _progress(quiet: bool, unit: str = "rows"):  # type: ignore[no-untyped-def]
    from tqdm import tqdm

    # Logs and progress go to stderr; a plain throttled line when stderr is not a terminal.
    tty = sys.stderr.isatty()
    return tqdm(
        unit=unit,
        file=sys.stderr,
        disable=quiet,
        mininterval=0.2 if tty else 10.0,
        dynamic_ncols=tty,
    )


def _check_texts(batch: Any) -> None:
    from embedcli.io.errors import InputError

    for loc, rid, text in zip(batch.locations, batch.ids, batch.texts, strict=True):
        if text is None:
            raise InputError(
                batch.source, "text is null", location=loc, record_id=rid, fix="fill or drop the row"
            )


def read_batches(inputs: InputOptions, extra_text_cols: Sequence[str] = ()) -> Iterable[Any]:
    """Input batches of every file, streamed, with null texts rejected.

    Returns a re-readable `BatchSource`: pass it to `run_rows` as is, so the run can fingerprint the
    inputs, resume, skip bad rows and carry rows over (`--incremental`).
    """
    from embedcli.unattended import BatchSource

    return BatchSource(inputs, tuple(extra_text_cols))


def kept_columns(batch: Any, names: Sequence[str]) -> dict[str, Any]:
    """The `--keep-cols` columns of a batch as Arrow arrays."""
    import pyarrow as pa

    out = {}
    for name in names:
        arr = pa.array(batch.columns[name])
        # An all-null first batch would fix the column's type to null for the whole file.
        out[name] = arr.cast(pa.string()) if pa.types.is_null(arr.type) else arr
    return out


def run_rows(
    batches: Iterable[Any],
    runner: Any,
    output: OutputOptions,
    meta: dict[str, str],
    to_inputs: Callable[[Any], Sequence[Any]],
    to_table: Callable[[Any, Any], Any],
    empty_table: Callable[[], Any],
) -> int:
    """Stream input batches through `runner` and commit the result tables to one output; returns the exit code.

    `to_inputs(batch)` gives the runner's inputs (texts or pairs) for a batch, `to_table(batch, result)`
    the output rows, `empty_table()` the output's shape when there are no rows. Committing in shards,
    resume, `--incremental`, bad rows, signals, progress and `--stats` are `embedcli.unattended`'s job
    (settings from `embedcli.run_options.current_settings()`); 0, or 3 when rows were skipped.
    """
    # `--engine ray`, `--shard K/N` and repairing lost shards of a shard directory: embedcli.distributed.
    from embedcli.distributed import run_distributed

    return run_distributed(batches, runner, output, meta, to_inputs, to_table, empty_table)


def run_embed(inputs: InputOptions, choice: ModelChoice, embed: EmbedOptions, output: OutputOptions) -> int:
    """`embedcli embed`: stream rows through the model into one output file; returns the exit code."""
    import pyarrow as pa

    from embedcli.io.writers import check_output_path, embedding_array
    from embedcli.quantize import make_quantizer
    from embedcli.runner import Runner, RunnerOptions
    from embedcli.task_jobs import embed_prompt, load_spec, located, require_task, run_quantized

    check_output_path(output.path)
    require_task(load_spec(choice), "embed", "embed")
    quant = make_quantizer(embed.precision, embed.calibration)
    model = load(choice)
    runner = Runner(
        model,
        RunnerOptions(
            task="embed",
            max_batch_tokens=embed.max_batch_tokens,
            normalize=embed.normalize,
            strip=embed.strip,
            dimensions=embed.dimensions,
            prompt=embed_prompt(model.spec, embed.prompt, embed.prompt_name),
            long_inputs=embed.long_inputs,  # type: ignore[arg-type]
            truncation_side=embed.truncation_side,  # type: ignore[arg-type]
        ),
    )
    width = runner.params.dimensions or model.spec.embedding_size

    def to_table(batch: Any, vectors: Any) -> Any:
        columns = {"id": pa.array(batch.ids, pa.string()), "embedding": embedding_array(np.asarray(vectors))}
        columns.update(kept_columns(batch, inputs.keep_cols))
        return pa.table(columns)

    def empty_table() -> Any:
        return pa.table(
            {"id": pa.array([], pa.string()), "embedding": embedding_array(np.zeros((0, width), np.float32))}
        )

    meta = provenance(model, runner, quant.config())
    if quant.precision != "float32":
        if quant.ranges is not None and quant.ranges.shape[1] != width:
            raise UsageError(f"--calibration {embed.calibration}: {quant.ranges.shape[1]} dims, the output has {width}")
        return run_quantized(
            read_batches(inputs), runner, output, meta, quant,
            to_inputs=located, to_table=to_table, empty_table=empty_table,
        )
    return run_rows(
        read_batches(inputs), runner, output, meta,
        to_inputs=located, to_table=to_table, empty_table=empty_table,
    )


def peak_rss_mb() -> float:
    """Peak resident memory of this process in MiB."""
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def model_info(
    model: str | None, *, allow_pickle: bool = False, trust_remote_code: bool = False, reranker: Any = None
) -> dict[str, Any]:
    """What would run for `model`: architecture, pooling, heads, max length, prompts, tasks."""
    from embedcli.models.spec import load_model_spec

    spec = load_model_spec(model, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code, reranker=reranker)
    from embedcli.task_jobs import commands_for

    info = spec.to_dict()
    info["commands"] = commands_for(spec)
    info["config_hash"] = spec.config_hash()
    return info
