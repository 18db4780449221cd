"""`embedcli run-batch`: vLLM's pooling endpoints as OpenAI Batch files, through the shared run loop.

The input file is read as plain lines (`txt`: a row per non-blank line, its id `FILE:LINE`); a batch of rows
is a block of request lines. `BatchCodec.inputs` parses the block (`embedcli.batchapi.read_chunk`) into the
units of its valid requests; `UnitEngine` groups the units of the block by task and pooling parameters and
runs each group as one packed batch under `--max-batch-tokens` (`embedcli.tasks.batch_engine`; so 2,000
one-text requests cost what `embed` over the same 2,000 texts costs); `BatchCodec.table` writes one response line per request line, in
input order, and reports the 400 lines as bad rows (`embedcli.run.job.Rows`). The lines are committed like
any command's rows (format `lines`): staging, manifest, resume, `--shard`, progress and `--stats` are the
loop's. Duplicate `custom_id`s are judged over the whole file by a pre-pass, so every shard and every resume
sees the same duplicates; `created` is the input file's modification time and the ids are hashes of the run's
config and the line number, so a resumed run writes the same bytes as an uninterrupted one.

What each route computes (vLLM's semantics; whitespace is kept, as vLLM does): `/v1/embeddings`,
`/classify` and `/pooling` apply no prompt; `/v2/embed` prepends its `input_type`'s prompt; `/score` and
`/rerank` score pairs as `embedcli score` / `rerank` do with the model's method (`--method`). An input
longer than the model's max length (or `truncate_prompt_tokens`) is cut, as embedcli's default
`--long-inputs truncate` (vLLM answers 400 without `truncate_prompt_tokens`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from embedcli.batchapi import (
    BatchRequest,
    Chunk,
    ResponseContext,
    SeenIds,
    ServedModel,
    dumps,
    error_line,
    read_chunk,
    reassemble,
    response_line,
    scan_custom_ids,
)
from embedcli.compute.runner import RunnerOptions
from embedcli.errors import STDIN, InputError, UsageError
from embedcli.io.writers import LINES
from embedcli.quantize import make_quantizer
from embedcli.run.execute import run_job
from embedcli.run.flags import RunFlags
from embedcli.run.job import Job, Reporting, Rows, Target
from embedcli.run.source import BatchSource, InputOptions
from embedcli.run.target import check_target
from embedcli.tasks.batch_engine import ChunkResult, unit_engine
from embedcli.tasks.common import (
    ModelChoice,
    OutputOptions,
    build,
    calibration,
    load_spec,
    provenance,
)
from embedcli.tasks.pairs import resolve_method

RESPONSE_COL = "response"
_POOLING_TASKS = ("embed", "classify", "token_embed", "token_classify")


@dataclass(frozen=True)
class BatchOptions:
    """`run-batch` choices."""

    method: str = "auto"
    max_batch_tokens: int | None = None
    truncation_side: str = "right"
    calibration: str | None = None  # int8/uint8 ranges for /v2/embed


# -- rows -----------------------------------------------------------------------------------------


def line_number(location: str) -> int:
    """The line number of a `txt` reader location (`line N`)."""
    return int(location.rsplit(" ", 1)[-1])


@dataclass(frozen=True, eq=False)
class BatchCodec:
    """Rows of `run-batch`: one response line per request line (a string column, written as is)."""

    model: ServedModel
    seen: SeenIds
    ctx: ResponseContext

    def inputs(self, batch: Any) -> Chunk:
        """The block's request lines, parsed; its units are what the engine computes."""
        lines = [(line_number(loc), text) for loc, text in zip(batch.locations, batch.texts, strict=True)]
        return read_chunk(lines, self.model, self.seen)

    def table(self, batch: Any, result: ChunkResult) -> Rows:
        """The response lines of a block, and its 400 lines as bad rows."""
        chunk = result.chunk
        assert chunk is not None
        per_request = iter(reassemble(chunk.flat, result.results))
        lines: list[str] = []
        errors: list[InputError] = []
        for item in chunk.items:
            obj = response_line(item, next(per_request), self.ctx) if isinstance(item, BatchRequest) \
                else error_line(item, self.ctx)
            lines.append(dumps(obj))
            error = obj["error"]
            if error is not None:
                errors.append(InputError(
                    batch.source, error["message"].removeprefix(f"line {error['line']}: "),
                    location=f"line {error['line']}", record_id=obj["custom_id"],
                    fix="see the line's error object in the output",
                ))
        return Rows(pa.table({RESPONSE_COL: pa.array(lines, pa.string())}), errors)

    def empty(self) -> Any:
        """The output of no rows."""
        return pa.table({RESPONSE_COL: pa.array([], pa.string())})


# -- the job ----------------------------------------------------------------------------------------


def _served_score_method(spec: Any, method: str) -> str | None:
    """`--method` as resolved for /score and /rerank; None when the model cannot score (auto only)."""
    try:
        return resolve_method(spec, method, "run-batch")
    except UsageError:
        if method == "auto":
            return None
        raise


def run_batch(
    path: str, choice: ModelChoice, opts: BatchOptions, output: OutputOptions, flags: RunFlags | None = None
) -> int:
    """`embedcli run-batch`: one response line per request line of an OpenAI Batch file; returns the exit code."""
    flags = flags or RunFlags(on_error="skip")
    if path == STDIN:
        raise UsageError("run-batch reads a file (duplicate custom_ids are judged over the whole file); not stdin")
    if flags.incremental or flags.shards_dir:
        raise UsageError("run-batch writes one JSONL file of response lines: --incremental and --shards-dir do not apply")
    check_target(output.path, flags)
    inputs = InputOptions([path], fmt="txt")
    source = BatchSource(inputs)
    source.paths()  # a missing file is an input error before the model loads
    spec = load_spec(choice)
    method = _served_score_method(spec, opts.method)
    mean, sigma = calibration(spec)
    default_task = next(t for t in _POOLING_TASKS if t in spec.tasks)
    base = RunnerOptions(
        task=default_task, max_batch_tokens=opts.max_batch_tokens, strip=False,
        truncation_side=opts.truncation_side,  # type: ignore[arg-type]
    )
    runner = build(spec, choice, base, logit_mean=mean, logit_sigma=sigma)
    engine = unit_engine(runner, method, engine=flags.engine, address=flags.ray_address, workers=flags.workers,
                         gpus_per_worker=flags.gpus_per_worker)
    names = (choice.model, os.path.basename(os.path.normpath(choice.model))) if choice.model else ()
    served = ServedModel.from_spec(spec, names=tuple(n for n in names if n), score_method=method)
    ranges = make_quantizer("int8", opts.calibration).ranges if opts.calibration else None
    meta = provenance(runner.model, runner, {
        "command": "run-batch", "score_method": method, "logit_mean": mean, "logit_sigma": sigma,
        "served_names": list(served.names), "calibration": os.path.basename(opts.calibration or ""),
    })
    with open(path, encoding="utf-8", errors="replace") as f:
        seen = scan_custom_ids(f)
    created = int(os.stat(path).st_mtime)
    seed = f"{meta['embedcli.config_hash']}\0{os.path.basename(path)}"
    codec = BatchCodec(served, seen, ResponseContext(served, created, seed, ranges))
    target, reporting = Target(output.path, LINES), Reporting(output.quiet, output.stats_file)
    return run_job(Job(source, engine, codec, meta, target, flags, reporting))
