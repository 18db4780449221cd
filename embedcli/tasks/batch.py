"""`embedcli run-batch`: vLLM's pooling endpoints as OpenAI Batch files, through the shared run loop.

The input file is read as plain lines (`txt`: a row per non-blank line, its id `FILE:LINE`); a batch of rows
is a block of request lines. `BatchCodec.inputs` parses the block (`embedcli.batchapi.read_chunk`) into the
units of its valid requests; `UnitEngine` groups the units of the block by task and pooling parameters and
runs each group as one packed batch under `--max-batch-tokens` (`embedcli.tasks.batch_engine`; so 2,000
one-text requests cost what `embed` over the same 2,000 texts costs); `BatchCodec.table` writes one response line per request line, in
input order, and reports the 400 lines as bad rows (`embedcli.run.job.Rows`). The lines are committed like
any command's rows (format `lines`): staging, manifest, resume, `--shard`, progress and `--stats` are the
loop's. Duplicate `custom_id`s are judged over the whole file by a pre-pass, so every shard and every resume
sees the same duplicates; `created` is the input file's modification time when the run first started (a
resumed run takes the staged run's, even if the file was rewritten with the same bytes since) and the ids are
hashes of the run's config and the line number, so a resumed run writes the same bytes as an uninterrupted one.

What each route computes (vLLM's semantics; whitespace is kept, as vLLM does): `/v1/embeddings`,
`/classify` and `/pooling` apply no prompt; `/v2/embed` prepends its `input_type`'s prompt; `/score` and
`/rerank` score pairs as `embedcli score` / `rerank` do with the model's method (`--method`): an LLM
reranker's pair is its template or chat template rendered with the document cut to keep the suffix (the
reranker flags `--classifier-from-tokens`, `--pair-template`, `--instruction`, `--reranker-preset` are
`score`'s), a SPLADE model's is the sparse dot product. A SPLADE model serves `/pooling` (task `embed`, or
none) and `/v1/embeddings` as vLLM serves `BertSpladeSparseEmbeddingModel`: the vocabulary-sized vector,
zeros off `sparse-embed`'s indices; its numbers are sentence-transformers' (every token pooled, [CLS] and
[SEP] included, where vLLM's pooler leaves those two out); `/v2/embed` is a 400 line. An input
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
from embedcli.io.fingerprint import fingerprint_identity, input_fingerprints
from embedcli.io.location import refuse_url
from embedcli.io.manifest import Manifest, staging_dir
from embedcli.io.writers import LINES
from embedcli.models.llm_reranker import pair_formatter
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
KEY_CREATED = "embedcli.batch_created"
_POOLING_TASKS = ("embed", "classify", "token_embed", "token_classify", "sparse_embed")


@dataclass(frozen=True)
class BatchOptions:
    """`run-batch` choices."""

    method: str = "auto"
    max_batch_tokens: int | None = None
    truncation_side: str | None = None
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


def vocab_size(model: Any) -> int | None:
    """The rows of the loaded backbone's token embedding: request token ids must be below it."""
    backbone = model.backbone
    getter = getattr(backbone, "get_input_embeddings", None)
    table = getter() if callable(getter) else None
    if table is None:
        table = next((m for m in backbone.modules() if hasattr(m, "num_embeddings")), None)
    rows = getattr(table, "num_embeddings", None)
    return int(rows) if isinstance(rows, int) and rows > 0 else None


def fewest_tokens(runner: Any, method: str | None) -> dict[str, int]:
    """`min_tokens` / `min_pair_tokens` of the served model: the special tokens its tokenizer adds to a text and
    to a pair, or an LLM reranker's pair template with nothing in it (a truncation below them is refused)."""
    processor = runner.model.tokenizer.post_processor
    single = processor.num_special_tokens_to_add(False) if processor is not None else 0
    pair = processor.num_special_tokens_to_add(True) if processor is not None else 0
    if method == "cross-encoder":
        render = pair_formatter(runner.model, runner.max_length)
        if render is not None:
            pair = len(runner.model.tokenizer.encode(render("", "")).ids)
    return {"min_tokens": int(single), "min_pair_tokens": int(pair)}


def resumed_created(output: str, path: str) -> int | None:
    """`created` of the interrupted run of this same request file staged at `output` (judged by content, as
    resume is), so a resumed output never mixes two: the file may have been rewritten with the same bytes."""
    manifest = Manifest.load(staging_dir(output)) if output != STDIN else None
    if manifest is None or not manifest.inputs or KEY_CREATED not in manifest.config:
        return None
    now = input_fingerprints([path])
    if now is None or [fingerprint_identity(f) for f in manifest.inputs] != [fingerprint_identity(f) for f in now]:
        return None
    value = manifest.config[KEY_CREATED]
    return int(value) if value.isdigit() else None


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
    refuse_url("run-batch", path, "a local request file")  # read twice and stat'ed: object storage comes later
    refuse_url("--calibration", opts.calibration, "a local file")
    check_target(output.path, flags, [path], output.stats_file)  # -o, --stats vs the request file, before loading
    inputs = InputOptions([path], fmt="txt", cr_in_lines=True)  # a CR is JSON whitespace, as vLLM reads it
    source = BatchSource(inputs)
    source.paths()  # a missing file is an input error before the model loads
    spec = load_spec(choice)
    method = _served_score_method(spec, opts.method)
    mean, sigma = calibration(spec)
    default_task = next(t for t in _POOLING_TASKS if t in spec.tasks)
    base = RunnerOptions(
        task=default_task, max_batch_tokens=opts.max_batch_tokens, strip=False,
        truncation_side=opts.truncation_side,  # type: ignore[arg-type]  # typer's Literal choices; RunnerOptions takes the same values
        # A ColBERT model's /pooling vectors are its document vectors; /score and /rerank give each side its role.
        role="document" if spec.late_interaction is not None else None,
    )
    runner = build(spec, choice, base, logit_mean=mean, logit_sigma=sigma)
    engine = unit_engine(runner, method, engine=flags.engine, address=flags.ray_address, workers=flags.workers,
                         gpus_per_worker=flags.gpus_per_worker)
    names = (choice.model, os.path.basename(os.path.normpath(choice.model))) if choice.model else ()
    served = ServedModel.from_spec(spec, names=tuple(n for n in names if n), score_method=method,
                                   vocab_size=vocab_size(runner.model), **fewest_tokens(runner, method))
    quant = make_quantizer("int8", opts.calibration) if opts.calibration else None
    ranges = quant.ranges if quant is not None else None
    meta = provenance(runner.model, runner, {
        "command": "run-batch", "score_method": method, "logit_mean": mean, "logit_sigma": sigma,
        "served_names": list(served.names), "calibration": os.path.basename(opts.calibration or ""),
        # the ranges themselves, as `embed` records them: another file (or the same one rewritten) refuses to mix
        **({"calibration_ranges": quant.config()["ranges"]} if quant is not None else {}),
    })
    # Lines as the txt reader reads them: newline="\n" (universal newlines would also break at a lone CR, JSON
    # whitespace, shifting every later line number) and a leading BOM dropped (else line 1 is not JSON here).
    with open(path, encoding="utf-8-sig", errors="replace", newline="\n") as f:
        seen = scan_custom_ids(f)
    created = resumed_created(output.path, path) or int(os.stat(path).st_mtime)
    meta[KEY_CREATED] = str(created)  # outside the config key; kept in the manifest for a resumed run
    seed = f"{meta['embedcli.config_hash']}\0{os.path.basename(path)}"
    codec = BatchCodec(served, seen, ResponseContext(served, created, seed, ranges))
    target, reporting = Target(output.path, LINES), Reporting(output.quiet, output.stats_file)
    return run_job(Job(source, engine, codec, meta, target, flags, reporting))
