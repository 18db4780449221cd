"""Command bodies: read inputs, run the model, write results. The CLI only parses flags and calls these."""

from __future__ import annotations

import json
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
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


def load(choice: ModelChoice):  # type: ignore[no-untyped-def]
    """Resolve and load the model (imports torch lazily so `--help` stays fast)."""
    from embedcli.models.loader import LoadedModel, ModelOptions
    from embedcli.models.spec import load_model_spec

    spec = load_model_spec(
        choice.model,
        allow_pickle=choice.allow_pickle,
        trust_remote_code=choice.trust_remote_code,
        max_length=choice.max_length,
    )
    return LoadedModel(
        spec,
        ModelOptions(
            device=choice.device,
            dtype=choice.dtype,
            allow_pickle=choice.allow_pickle,
            trust_remote_code=choice.trust_remote_code,
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


def read_batches(inputs: InputOptions, extra_text_cols: Sequence[str] = ()) -> Iterator[Any]:
    """Input batches of every file, streamed, with null texts rejected."""
    from embedcli.io.readers import read_inputs

    for batch in read_inputs(
        inputs.paths,
        text_col=inputs.text_col,
        id_col=inputs.id_col,
        keep_cols=inputs.keep_cols,
        extra_text_cols=extra_text_cols,
        fmt=inputs.fmt,
        batch_rows=inputs.batch_rows,
    ):
        _check_texts(batch)
        yield batch


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
    """Stream input batches through `runner` and commit each result table to one output; returns the exit code.

    `to_inputs(batch)` gives the runner's inputs (texts or pairs) for a batch, `to_table(batch, result)`
    the output rows, `empty_table()` the output's shape when there are no rows.
    """
    from embedcli.io.writers import check_output_path, open_writer

    check_output_path(output.path)
    started = time.perf_counter()
    held: deque[Any] = deque()

    def inputs() -> Iterator[Sequence[Any]]:
        for batch in batches:
            held.append(batch)
            yield to_inputs(batch)

    writer = None
    seconds_write = 0.0
    with _progress(output.quiet) as bar:
        try:
            for result in runner.map(inputs()):
                batch = held.popleft()
                t0 = time.perf_counter()
                table = to_table(batch, result)
                if writer is None:
                    writer = open_writer(output.path, table.schema, meta, fmt=output.fmt)
                writer.write(table)
                seconds_write += time.perf_counter() - t0
                bar.update(len(batch))
            if writer is None:
                empty = empty_table()
                writer = open_writer(output.path, empty.schema, meta, fmt=output.fmt)
            writer.commit()
        except BaseException:
            if writer is not None:
                writer.abort()
            raise
    stats = runner.stats
    if stats.truncated_rows and not output.quiet:
        print(
            f"embedcli: {stats.truncated_rows} of {stats.rows} rows were truncated to {runner.max_length} tokens",
            file=sys.stderr,
        )
    if output.stats_file:
        report = stats.to_dict()
        report["seconds"]["write"] = round(seconds_write, 4)
        report["seconds"]["total"] = round(time.perf_counter() - started, 4)
        report["peak_rss_mb"] = peak_rss_mb()
        with open(output.stats_file, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
    return EXIT_OK


def run_embed(inputs: InputOptions, choice: ModelChoice, embed: EmbedOptions, output: OutputOptions) -> int:
    """`embedcli embed`: stream rows through the model into one output file; returns the exit code."""
    import pyarrow as pa

    from embedcli.io.writers import check_output_path, embedding_array
    from embedcli.runner import Runner, RunnerOptions

    check_output_path(output.path)
    model = load(choice)
    runner = Runner(
        model,
        RunnerOptions(
            task="embed",
            max_batch_tokens=embed.max_batch_tokens,
            normalize=embed.normalize,
            strip=embed.strip,
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

    return run_rows(
        read_batches(inputs), runner, output, provenance(model, runner),
        to_inputs=lambda batch: batch.texts, to_table=to_table, empty_table=empty_table,
    )


def peak_rss_mb() -> float:
    """Peak resident memory of this process in MiB."""
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def model_info(model: str | None, *, allow_pickle: bool = False, trust_remote_code: bool = False) -> dict[str, Any]:
    """What would run for `model`: architecture, pooling, heads, max length, prompts, tasks."""
    from embedcli.models.spec import load_model_spec

    spec = load_model_spec(model, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code)
    info = spec.to_dict()
    commands = []
    if "embed" in spec.tasks:
        commands += ["embed", "token-embed"]
    if spec.score_type:
        commands += ["rerank", "score"]
    if "classify" in spec.tasks:
        commands.append("classify")
    if "token_classify" in spec.tasks:
        commands.append("token-classify")
    info["commands"] = commands
    info["config_hash"] = spec.config_hash()
    return info
