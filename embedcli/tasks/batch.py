"""`embedcli run-batch`: vLLM's pooling endpoints as OpenAI Batch files, through the shared run loop.

The input file is read as plain lines (`txt`: a row per non-blank line, its id `FILE:LINE`); a batch of rows
is a block of request lines. `BatchCodec.inputs` parses the block (`embedcli.batchapi.read_chunk`) into the
units of its valid requests; `UnitEngine` groups the units of the block by task and pooling parameters and
runs each group as one packed batch under `--max-batch-tokens` (so 2,000 one-text requests cost what
`embed` over the same 2,000 texts costs); `BatchCodec.table` writes one response line per request line, in
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

import dataclasses
import os
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from embedcli.batchapi import (
    BatchRequest,
    Chunk,
    ResponseContext,
    SeenIds,
    ServedModel,
    Unit,
    UnitParams,
    UnitResult,
    dumps,
    error_line,
    read_chunk,
    reassemble,
    response_line,
    scan_custom_ids,
)
from embedcli.compute.runner import Encoded, Runner, RunnerOptions, RunStats, prefetch
from embedcli.errors import STDIN, InputError, UsageError
from embedcli.io.writers import LINES
from embedcli.models.loader import LoadedModel
from embedcli.quantize import make_quantizer
from embedcli.run.execute import run_job
from embedcli.run.flags import RunFlags
from embedcli.run.job import Rows
from embedcli.run.source import BatchSource, InputOptions
from embedcli.run.target import check_target
from embedcli.scoring import PairScorer
from embedcli.tasks.common import (
    ModelChoice,
    OutputOptions,
    build,
    calibration,
    load_spec,
    make_job,
    provenance,
)
from embedcli.tasks.pairs import PAIR_TASK, resolve_method

RESPONSE_COL = "response"
_POOLING_TASKS = ("embed", "classify", "token_embed", "token_classify")


@dataclass(frozen=True)
class BatchOptions:
    """`run-batch` choices."""

    method: str = "auto"
    max_batch_tokens: int | None = None
    truncation_side: str = "right"
    calibration: str | None = None  # int8/uint8 ranges for /v2/embed


# -- the engine -----------------------------------------------------------------------------------


@dataclass
class ChunkResult:
    """A block's parsed lines and the result of each of its units, in unit order."""

    chunk: Chunk | None
    results: list[UnitResult]


@dataclass
class _Group:
    """Units of one block that share a runner: their positions, the runner and its tokenized inputs."""

    task: str
    positions: list[int]
    runner: Runner
    encoded: Encoded
    scorer: PairScorer | None = None


def _is_token_ids(value: Any) -> bool:
    return isinstance(value, tuple) and (not value or isinstance(value[0], int))


class UnitEngine:
    """Runs the units of request blocks with one loaded model: one runner per (task, pooling params)."""

    def __init__(self, model: LoadedModel, base: RunnerOptions, score_method: str | None) -> None:
        self.model = model
        self.base = base
        self.score_method = score_method
        self.prompts = dict(model.spec.prompts)
        self.stats = RunStats()
        self.max_length = int(base.max_length or model.spec.max_length)
        self._runners: dict[tuple[str, UnitParams], Runner] = {}

    # -- runners -------------------------------------------------------------------------------------
    def runner(self, task: str, params: UnitParams) -> Runner:
        """The runner of a pooling task under a unit's params (made once, sharing the model and the stats)."""
        key = (task, params)
        runner = self._runners.get(key)
        if runner is not None:
            return runner
        limit = params.truncate_prompt_tokens
        max_length = self.max_length if limit is None or limit < 0 else min(limit, self.max_length)
        embeds = task in ("embed", "token_embed")
        options = dataclasses.replace(
            self.base, task=task, max_length=max_length, dimensions=params.dimensions,
            normalize=params.use_activation if embeds else None,
            truncation_side=params.truncation_side or self.base.truncation_side,  # type: ignore[arg-type]
        )
        runner = Runner(self.model, options)
        if not embeds and params.use_activation is not None:
            runner.params.use_activation = params.use_activation  # the classifier's activation, per request
        runner.stats = self.stats
        self._runners[key] = runner
        return runner

    def _encode(self, runner: Runner, inputs: Sequence[Any]) -> Encoded:
        """Texts (and pairs) tokenized by the runner; token-id inputs taken as they are, cut to its max length."""
        n = len(inputs)
        ids: list[Any] = [None] * n
        types: list[Any] = [None] * n
        text_at = [i for i, x in enumerate(inputs) if not _is_token_ids(x)]
        if text_at:
            enc = runner.tokenize([inputs[i] for i in text_at])  # truncation: no chunks, one sequence per input
            for j, i in enumerate(text_at):
                ids[i] = enc.ids[j]
                types[i] = enc.type_ids[j] if enc.type_ids is not None else np.zeros(len(enc.ids[j]), np.int64)
        limit = runner.max_length
        for i, x in enumerate(inputs):
            if ids[i] is not None:
                continue
            seq = np.asarray(x, dtype=np.int64)
            if len(seq) > limit:
                self.stats.truncated_rows += 1
                seq = seq[-limit:] if runner.options.truncation_side == "left" else seq[:limit]
            ids[i], types[i] = seq, np.zeros(len(seq), np.int64)
        return Encoded(ids=ids, type_ids=types, owner=np.arange(n, dtype=np.int64), num_rows=n)

    # -- one block -------------------------------------------------------------------------------------
    def prepare(self, units: Sequence[Unit]) -> list[_Group]:
        """The block's units grouped by (task, params), in first-seen order, each group tokenized."""
        by_group: dict[tuple[str, UnitParams], list[int]] = defaultdict(list)
        for i, unit in enumerate(units):
            by_group[unit.group].append(i)
        groups = []
        for (task, params), positions in by_group.items():
            if task == "score":
                method = self.score_method
                assert method is not None  # requests were refused when the model cannot score
                runner = self.runner(PAIR_TASK[method], params)
                scorer = PairScorer(runner, method, self.prompts)
                pairs = [units[i].input for i in positions]
                inputs = scorer.pair_inputs([p[0] for p in pairs], [p[1] for p in pairs])  # type: ignore[index]
                groups.append(_Group(task, positions, runner, self._encode(runner, inputs), scorer))
            else:
                runner = self.runner(task, params)
                groups.append(_Group(task, positions, runner, self._encode(runner, [units[i].input for i in positions])))
        return groups

    def compute(self, n: int, groups: list[_Group]) -> list[UnitResult]:
        """Every unit's result, in unit order."""
        out: list[UnitResult | None] = [None] * n
        for g in groups:
            result = g.runner.run_encoded(g.encoded)
            lengths = g.encoded.lengths
            m = len(g.positions)
            if g.scorer is not None:
                scores = g.scorer.pair_scores(result, m)
                tokens = lengths if g.scorer.method == "cross-encoder" else lengths[:m] + lengths[m:]
                values: Sequence[Any] = scores
            else:
                tokens, values = lengths, result  # type: ignore[assignment]
            for k, i in enumerate(g.positions):
                out[i] = UnitResult(values[k], int(tokens[k]))
        return out  # type: ignore[return-value]

    def map(self, batches: Iterable[Any]) -> Iterator[ChunkResult]:
        """One `ChunkResult` per block, in order; the next block is parsed and tokenized while this one runs."""

        def prepared() -> Iterator[tuple[Any, list[_Group]]]:
            for chunk in batches:
                if not isinstance(chunk, Chunk):  # the loop's empty input of a batch with no rows to compute
                    yield None, []
                    continue
                t0 = time.perf_counter()
                groups = self.prepare(chunk.flat.units)
                self.stats.seconds["tokenize"] += time.perf_counter() - t0
                yield chunk, groups

        for chunk, groups in prefetch(prepared(), depth=2):
            if chunk is None:
                yield ChunkResult(None, [])
            else:
                yield ChunkResult(chunk, self.compute(len(chunk.flat.units), groups))


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
    if flags.engine != "local":
        raise UsageError("run-batch runs on the local engine (--engine ray is not wired for it yet); "
                         "scale out with --shard K/N")
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
    engine = UnitEngine(runner.model, runner.options, method)
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
    job = make_job(source, runner, codec, meta, OutputOptions(output.path, LINES, output.quiet, output.stats_file), flags)
    return run_job(dataclasses.replace(job, engine=engine))
