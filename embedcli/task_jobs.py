"""Bodies of the task commands (classify, score, rerank, token-embed, token-classify) and embed's helpers
(prompts, rows that can name themselves in errors, quantized output). The CLI parses flags and calls these;
each returns the exit code. torch is imported only when a job runs, so `--help` and `info` stay fast.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
import types
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from embedcli.jobs import (
    EXIT_OK,
    InputOptions,
    ModelChoice,
    OutputOptions,
    UsageError,
    kept_columns,
    load,
    peak_rss_mb,
    provenance,
    read_batches,
    run_rows,
)

ACTIVATIONS: tuple[str, ...] = ("auto", "softmax", "sigmoid", "none")
PAIR_TASK = {"cross-encoder": "classify", "cosine": "embed", "maxsim": "token_embed", "sparse": "sparse_embed"}


# -- models and tasks ------------------------------------------------------------------------------
def commands_for(spec: Any) -> list[str]:
    """The embedcli commands a model can serve (what `info` lists)."""
    commands: list[str] = []
    if "embed" in spec.tasks:
        commands += ["embed", "token-embed"]
    if spec.score_type:
        commands += ["rerank", "score"]
    if "classify" in spec.tasks:
        commands.append("classify")
    if "token_classify" in spec.tasks:
        commands.append("token-classify")
    if "sparse_embed" in spec.tasks:
        commands.append("sparse-embed")
    return commands


def _can_do(spec: Any) -> str:
    return f"it supports {', '.join(spec.tasks)} (commands: {', '.join(commands_for(spec))})"


def require_task(spec: Any, task: str, command: str) -> None:
    """A usage error (exit 2) naming what the model can do, when it cannot do `task`."""
    if task not in spec.tasks:
        raise UsageError(f"{command}: model {spec.name!r} cannot do {task!r}; {_can_do(spec)}")


def load_spec(choice: ModelChoice) -> Any:
    """The model's resolved spec (cheap: no weights are read)."""
    from embedcli.models.spec import load_model_spec

    return load_model_spec(
        choice.model,
        allow_pickle=choice.allow_pickle,
        trust_remote_code=choice.trust_remote_code,
        max_length=choice.max_length,
        reranker=choice.reranker,
    )


def load_model(spec: Any, choice: ModelChoice, **options: Any) -> Any:
    """Load `spec`'s weights with the choice's device/dtype and task options (activation, calibration, step)."""
    return load(choice, spec, **options)


def calibration(spec: Any, logit_mean: float | None = None, logit_sigma: float | None = None) -> tuple[Any, Any]:
    """(logit_mean, logit_sigma): the flags, else the model's config.json keys `logit_mean` / `logit_sigma`
    (vLLM's older names: `logit_bias` = mean, `logit_scale` = 1 / sigma), else none."""
    try:
        with open(Path(spec.path) / "config.json", encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, json.JSONDecodeError):
        config = {}
    mean = logit_mean if logit_mean is not None else config.get("logit_mean", config.get("logit_bias"))
    sigma = logit_sigma
    if sigma is None:
        sigma = config.get("logit_sigma")
        scale = config.get("logit_scale")
        if sigma is None and scale is not None:
            if float(scale) == 0:
                raise UsageError(f"{spec.path}/config.json: logit_scale 0 cannot calibrate logits")
            sigma = 1.0 / float(scale)
    if sigma is not None and float(sigma) == 0:
        raise UsageError("logit_sigma must be non-zero (it divides the logits)")
    return (None if mean is None else float(mean)), (None if sigma is None else float(sigma))


def _activation(name: str) -> str | None:
    if name not in ACTIVATIONS:
        raise UsageError(f"--activation {name!r}: choose one of {', '.join(ACTIVATIONS)}")
    return None if name == "auto" else name


def embed_prompt(spec: Any, prompt: str | None, prompt_name: str | None) -> str:
    """The prompt prepended to every text: `--prompt`, else `--prompt-name`'s entry in the model's prompts,
    else the model's `default_prompt_name` (as sentence-transformers), else none."""
    if prompt is not None and prompt_name is not None:
        raise UsageError("--prompt and --prompt-name conflict: give one")
    if prompt is not None:
        return prompt
    name = prompt_name if prompt_name is not None else spec.default_prompt_name
    if name is None:
        return ""
    table = dict(spec.prompts)
    if name not in table:
        known = ", ".join(table) or "none"
        raise UsageError(f"--prompt-name {name!r} is not one of the model's prompts ({known})")
    return table[name]


# -- rows that can name themselves -------------------------------------------------------------------
class RowInputs(list):  # type: ignore[type-arg]
    """Runner inputs made from one input batch; `locate(i)` names the file, line/row and id of input `i`."""

    def __init__(self, items: Iterable[Any], batch: Any, row_of: Callable[[int], int] | None = None) -> None:
        super().__init__(items)
        self.batch = batch
        self.row_of = row_of

    def locate(self, i: int) -> str:
        """`file line N (id 'x')` of the input row behind runner input `i`."""
        from embedcli.io.errors import display_path

        j = self.row_of(i) if self.row_of else i
        b = self.batch
        return f"{display_path(b.source)} {b.locations[j]} (id {b.ids[j]!r})"


def located(batch: Any) -> RowInputs:
    """A batch's texts as runner inputs that can name their rows."""
    return RowInputs(batch.texts, batch)


def _check_column(batch: Any, col: str) -> list[str]:
    from embedcli.io.errors import InputError

    values = batch.extra_texts[col]
    for loc, rid, text in zip(batch.locations, batch.ids, values, strict=True):
        if text is None:
            raise InputError(batch.source, f"{col} is null", location=loc, record_id=rid, fix="fill or drop the row")
    return values


def _empty_batch(keep_cols: Sequence[str]) -> Any:
    return types.SimpleNamespace(
        ids=[], texts=[], locations=[], source="", columns={c: [] for c in keep_cols}, extra_texts={}
    )


def _write_stats(output: OutputOptions, runner: Any, started: float, seconds_write: float) -> None:
    stats = runner.stats
    if stats.truncated_rows and not output.quiet:
        print(
            f"embedcli: {stats.truncated_rows} of {stats.rows} inputs were truncated to {runner.max_length} tokens",
            file=sys.stderr,
        )
    if output.stats_file:
        report = stats.to_dict()
        report["seconds"]["write"] = round(seconds_write, 4)
        report["seconds"]["total"] = round(time.perf_counter() - started, 4)
        report["peak_rss_mb"] = peak_rss_mb()
        with open(output.stats_file, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)


# -- embed: quantized output ---------------------------------------------------------------------------
SPOOL_SUFFIX = ".embedcli-float32.parquet"


def run_quantized(
    batches: Iterable[Any],
    runner: Any,
    output: OutputOptions,
    meta: dict[str, str],
    quant: Any,
    to_inputs: Callable[[Any], Sequence[Any]],
    to_table: Callable[[Any, Any], Any],
    empty_table: Callable[[], Any],
) -> int:
    """`run_rows` with the `embedding` column quantized (see `embedcli.quantize`).

    With ranges known (any precision but int8/uint8, or `--calibration`) each batch is quantized as it is
    committed. Otherwise the float32 output is first written, by the ordinary resumable loop, to a spool
    `OUT.embedcli-float32.parquet` beside the output (a killed run resumes it); then its per-dimension
    min/max are computed, the spool is quantized into the output in one atomic write, and removed. A rerun
    of a finished job finds the output complete and does nothing; an output made with another config is
    not replaced without `--overwrite`.
    """
    from embedcli.run_options import current_settings

    if not quant.needs_ranges:
        return run_rows(
            batches, runner, output, {**meta, **quant.metadata()}, to_inputs=to_inputs,
            to_table=lambda batch, result: quant.table(to_table(batch, result)),
            empty_table=lambda: quant.table(empty_table()),
        )
    settings = current_settings()
    if settings.incremental or settings.shards_dir:
        raise UsageError(
            f"--precision {quant.precision} takes its ranges from the whole output, which --incremental and "
            "--shards-dir cannot see at once; pass --calibration FILE (e.g. an earlier float32 or "
            f"{quant.precision} output) so every row is quantized with the same ranges"
        )
    from embedcli.io.writers import check_output_path

    check_output_path(output.path)
    if output.path == "-":  # stdout: nothing to resume; spool in a temporary folder
        spool_dir = tempfile.mkdtemp(prefix=".embedcli-spool-")
        try:
            spool = os.path.join(spool_dir, "float32.parquet")
            code = run_rows(batches, runner, replace(output, path=spool, fmt="parquet"),
                            meta, to_inputs=to_inputs, to_table=to_table, empty_table=empty_table)
            _quantize_spool(spool, output, meta, quant, empty_table)
            return code
        finally:
            shutil.rmtree(spool_dir, ignore_errors=True)
    done = _finished_quantized(batches, output, meta, settings.overwrite)
    if done is not None:
        return done
    spool = os.path.abspath(output.path) + SPOOL_SUFFIX
    code = run_rows(batches, runner, replace(output, path=spool, fmt="parquet"), meta,
                    to_inputs=to_inputs, to_table=to_table, empty_table=empty_table)
    _quantize_spool(spool, output, meta, quant, empty_table)
    from embedcli.io.manifest import index_sidecar

    for leftover in (spool, index_sidecar(spool)):
        if os.path.exists(leftover):
            os.remove(leftover)
    return code


def _finished_quantized(batches: Any, output: OutputOptions, meta: dict[str, str], overwrite: bool) -> int | None:
    """Exit code when `output` already holds this job's complete result; UsageError if made otherwise."""
    from embedcli.io.manifest import (
        KEY_COMPLETE,
        KEY_CONFIG_KEY,
        KEY_JOB,
        KEY_SKIPPED,
        config_key,
        job_key,
        output_metadata,
    )
    from embedcli.unattended import BatchSource

    existing = output_metadata(output.path, output.fmt)
    if existing is None or overwrite or not isinstance(batches, BatchSource):
        return None
    cfg = config_key(meta, batches.options(), "parquet")
    if existing.get(KEY_CONFIG_KEY) != cfg:
        raise UsageError(f"{output.path} was made with a different config; pass --overwrite to replace it, "
                         "or choose another -o")
    if existing.get(KEY_JOB) == job_key(cfg, batches.fingerprints(batches.paths())) and existing.get(KEY_COMPLETE) == "true":
        if not output.quiet:
            print(f"embedcli: {output.path} is already complete (same inputs and config): nothing to do", file=sys.stderr)
        return 3 if int(existing.get(KEY_SKIPPED, "0") or 0) else EXIT_OK
    return None


def _quantize_spool(spool: str, output: OutputOptions, meta: dict[str, str], quant: Any, empty_table: Callable[[], Any]) -> None:
    """Ranges from the whole float32 spool, then the spool quantized into `output` (one atomic write)."""
    import pyarrow.parquet as pq

    from embedcli.io.manifest import output_metadata
    from embedcli.io.writers import embedding_matrix, open_writer
    from embedcli.quantize import merge_ranges, ranges_of

    source = pq.ParquetFile(spool)
    ranges, rows = None, 0
    for rb in source.iter_batches(columns=["embedding"], batch_size=8192):
        m = embedding_matrix(rb.column(0))
        if len(m):
            ranges, rows = merge_ranges(ranges, ranges_of(m)), rows + len(m)
    if rows == 1:
        raise UsageError(
            f"--precision {quant.precision}: ranges cannot be computed from a single embedding; "
            "pass --calibration FILE (float vectors, or an earlier int8/uint8 output)"
        )
    if ranges is not None:
        quant.ranges, quant.calibration = ranges, "output"
    if rows and rows < 100 and not output.quiet:
        print(f"embedcli: {quant.precision} ranges computed from only {rows} embeddings", file=sys.stderr)
    # the spool's metadata (config and job keys, rows, completeness) describes the output too
    final_meta = {**(output_metadata(spool, "parquet") or meta), **quant.metadata()}
    writer = None
    try:
        for rb in source.iter_batches(batch_size=8192):
            table = quant.table(_table_of(rb))
            if writer is None:
                writer = open_writer(output.path, table.schema, final_meta, fmt=output.fmt)
            writer.write(table)
        if writer is None:
            writer = open_writer(output.path, quant.table(empty_table()).schema, final_meta, fmt=output.fmt)
        writer.commit()
    except BaseException:
        if writer is not None:
            writer.abort()
        raise


def _table_of(record_batch: Any) -> Any:
    import pyarrow as pa

    return pa.Table.from_batches([record_batch])


# -- classify ------------------------------------------------------------------------------------------
@dataclass
class ClassifyOptions:
    """`classify` choices."""

    activation: str = "auto"
    top_k: int = 1
    all_scores: bool = False
    logit_mean: float | None = None
    logit_sigma: float | None = None
    max_batch_tokens: int | None = None
    long_inputs: str = "truncate"
    truncation_side: str = "right"
    strip: bool = True


def run_classify(inputs: InputOptions, choice: ModelChoice, opts: ClassifyOptions, output: OutputOptions) -> int:
    """`embedcli classify`: label, score (its probability) and optionally every label's probability per row."""
    import pyarrow as pa

    from embedcli.io.writers import check_output_path, embedding_array
    from embedcli.runner import Runner, RunnerOptions

    check_output_path(output.path)
    spec = load_spec(choice)
    require_task(spec, "classify", "classify")
    if not 1 <= opts.top_k <= spec.num_labels:
        raise UsageError(f"--top-k {opts.top_k}: the model has {spec.num_labels} labels")
    mean, sigma = calibration(spec, opts.logit_mean, opts.logit_sigma)
    model = load_model(spec, choice, activation=_activation(opts.activation), logit_mean=mean, logit_sigma=sigma)
    runner = Runner(
        model,
        RunnerOptions(
            task="classify", max_batch_tokens=opts.max_batch_tokens, long_inputs=opts.long_inputs,  # type: ignore[arg-type]
            truncation_side=opts.truncation_side, strip=opts.strip,  # type: ignore[arg-type]
        ),
    )
    labels = np.asarray(spec.id2label, dtype=object)
    num_labels = spec.num_labels

    def to_table(batch: Any, probs: Any) -> Any:
        p = np.asarray(probs, dtype=np.float32).reshape(len(batch.ids), num_labels)
        best = p.argmax(axis=1) if len(p) else np.zeros(0, dtype=np.int64)
        columns: dict[str, Any] = {
            "id": pa.array(batch.ids, pa.string()),
            "label": pa.array(labels[best].tolist(), pa.string()),
            "score": pa.array(p[np.arange(len(p)), best], pa.float32()),
        }
        if opts.top_k > 1:
            order = np.argsort(-p, axis=1, kind="stable")[:, : opts.top_k]
            columns["top_labels"] = pa.array([labels[o].tolist() for o in order], pa.list_(pa.string()))
            columns["top_scores"] = pa.array(
                [p[i, o].tolist() for i, o in enumerate(order)], pa.list_(pa.float32())
            )
        if opts.all_scores:
            columns["scores"] = embedding_array(p)
        columns.update(kept_columns(batch, inputs.keep_cols))
        return pa.table(columns)

    meta = provenance(
        model, runner,
        {"activation": opts.activation, "logit_mean": mean, "logit_sigma": sigma, "labels": list(spec.id2label),
         "top_k": opts.top_k, "all_scores": opts.all_scores},
    )
    return run_rows(
        read_batches(inputs), runner, output, meta, to_inputs=located, to_table=to_table,
        empty_table=lambda: to_table(_empty_batch(inputs.keep_cols), np.zeros((0, num_labels), np.float32)),
    )


# -- token tasks -----------------------------------------------------------------------------------
@dataclass
class TokenOptions:
    """`token-embed` / `token-classify` choices."""

    keep_special: bool = False
    step_tag_id: int | None = None
    returned_token_ids: tuple[int, ...] | None = None
    dimensions: int | None = None  # token-embed
    normalize: bool | None = None  # token-embed
    activation: str = "auto"  # token-classify
    all_scores: bool = False  # token-classify
    logit_mean: float | None = None
    logit_sigma: float | None = None
    max_batch_tokens: int | None = None
    long_inputs: str = "truncate"
    truncation_side: str = "right"
    strip: bool = True


@dataclass
class TokenRows:
    """A token task's result for one batch: each row's token ids and its per-token matrix."""

    ids: list[np.ndarray]
    values: list[np.ndarray]


def _token_runner(model: Any, options: Any) -> Any:
    from embedcli.runner import Runner

    class TokenRunner(Runner):
        """A runner whose results also carry each row's token ids."""

        def _combine(self, enc: Any, results: Any) -> Any:
            return TokenRows(ids=list(enc.ids), values=super()._combine(enc, results))

    return TokenRunner(model, options)


def _special_ids(model: Any) -> np.ndarray:
    """Ids of the tokens the tokenizer's template adds (CLS/SEP/BOS/EOS/PAD); UNK and MASK stay."""
    tok = model.hf_tokenizer
    ids = {getattr(tok, f"{name}_token_id", None) for name in ("cls", "sep", "bos", "eos", "pad")}
    return np.asarray(sorted(i for i in ids if i is not None), dtype=np.int64)


def _select_tokens(
    ids: np.ndarray, values: np.ndarray, special: np.ndarray, opts: TokenOptions
) -> tuple[np.ndarray, np.ndarray]:
    """The kept rows: step-tag tokens under step pooling; else all tokens but special ones (unless kept)."""
    if opts.step_tag_id is not None:
        ids = ids[ids == opts.step_tag_id]
        if len(ids) != len(values):
            raise RuntimeError(f"step pooling returned {len(values)} rows for {len(ids)} step tokens")
        return ids, values
    if opts.keep_special or not len(special):
        return ids, values
    keep = ~np.isin(ids, special)
    return ids[keep], values[keep]


def _list_of_vectors(matrices: Sequence[np.ndarray], width: int, dtype: Any = np.float32) -> Any:
    """`list<fixed_size_list<dtype>[width]>` from one `[n_i, width]` matrix per row."""
    import pyarrow as pa

    from embedcli.io.writers import embedding_array

    offsets = np.zeros(len(matrices) + 1, dtype=np.int32)
    np.cumsum([len(m) for m in matrices], out=offsets[1:])
    flat = np.concatenate([np.asarray(m, dtype=dtype).reshape(-1, width) for m in matrices]) if matrices else None
    if flat is None:
        flat = np.zeros((0, width), dtype=dtype)
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), embedding_array(flat))


def _list_column(parts: Sequence[np.ndarray], typ: Any) -> Any:
    import pyarrow as pa

    offsets = np.zeros(len(parts) + 1, dtype=np.int32)
    np.cumsum([len(p) for p in parts], out=offsets[1:])
    values = np.concatenate(parts) if parts else np.zeros(0)
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(values, typ))


def _token_job(
    task: str, command: str, inputs: InputOptions, choice: ModelChoice, opts: TokenOptions, output: OutputOptions
) -> tuple[Any, Any]:
    from embedcli.io.writers import check_output_path
    from embedcli.runner import RunnerOptions

    check_output_path(output.path)
    if opts.long_inputs == "chunk":
        raise UsageError(f"{command}: --long-inputs chunk applies to embed only; use truncate or error")
    spec = load_spec(choice)
    require_task(spec, task, command)
    if opts.returned_token_ids and task != "token_classify":
        raise UsageError(f"{command}: --returned-token-ids selects label columns; it applies to token-classify")
    # Step pooling's row filter (--step-tag-id) runs in the pooler. Its column filter (--returned-token-ids)
    # must select *label* columns, as in vLLM where a reward model's forward already ends in its score head:
    # here the classifier is part of the head, so the columns are selected after it (see `_select_columns`)
    # and the activation runs on the kept columns only.
    extra: dict[str, Any] = {"step_tag_id": opts.step_tag_id}
    if task == "token_classify":
        mean, sigma = calibration(spec, opts.logit_mean, opts.logit_sigma)
        activation = "none" if opts.returned_token_ids else _activation(opts.activation)
        extra.update(activation=activation, logit_mean=mean, logit_sigma=sigma)
    model = load_model(spec, choice, **extra)
    runner = _token_runner(
        model,
        RunnerOptions(
            task=task, max_batch_tokens=opts.max_batch_tokens, long_inputs=opts.long_inputs,  # type: ignore[arg-type]
            truncation_side=opts.truncation_side, strip=opts.strip,  # type: ignore[arg-type]
            normalize=opts.normalize if task == "token_embed" else None, dimensions=opts.dimensions,
        ),
    )
    return model, runner


def run_token_embed(inputs: InputOptions, choice: ModelChoice, opts: TokenOptions, output: OutputOptions) -> int:
    """`embedcli token-embed`: per-token vectors of each row (list columns), special tokens dropped unless kept."""
    import pyarrow as pa

    model, runner = _token_job("token_embed", "token-embed", inputs, choice, opts, output)
    special = _special_ids(model)
    width = runner.params.dimensions or model.spec.embedding_size

    def to_table(batch: Any, result: TokenRows) -> Any:
        kept = [_select_tokens(i, v, special, opts) for i, v in zip(result.ids, result.values, strict=True)]
        columns: dict[str, Any] = {
            "id": pa.array(batch.ids, pa.string()),
            "token_ids": _list_column([k[0].astype(np.int32) for k in kept], pa.int32()),
            "embeddings": _list_of_vectors([k[1] for k in kept], width),
        }
        columns.update(kept_columns(batch, inputs.keep_cols))
        return pa.table(columns)

    meta = provenance(model, runner, {"keep_special": opts.keep_special, "step_tag_id": opts.step_tag_id,
                                      "returned_token_ids": opts.returned_token_ids})
    return run_rows(
        read_batches(inputs), runner, output, meta, to_inputs=located, to_table=to_table,
        empty_table=lambda: to_table(_empty_batch(inputs.keep_cols), TokenRows([], [])),
    )


def _column_selector(model: Any, opts: TokenOptions) -> Callable[[np.ndarray], np.ndarray]:
    """Identity, or (with --returned-token-ids) keep those label columns of the calibrated logits and apply
    the activation to them: vLLM's step pooling selects columns of the score head's output."""
    if not opts.returned_token_ids:
        return lambda x: x
    import torch

    from embedcli.pooling import get_activation, resolve_classifier_activation

    columns = list(opts.returned_token_ids)
    bad = [j for j in columns if not 0 <= j < model.spec.num_labels]
    if bad:
        raise UsageError(f"--returned-token-ids {bad}: the model has labels 0..{model.spec.num_labels - 1}")
    name = _activation(opts.activation)
    if name is None:
        activation = resolve_classifier_activation(model.backbone.config, static_num_labels=False)
    else:
        activation = get_activation(name, None)

    def select(x: np.ndarray) -> np.ndarray:
        kept = np.ascontiguousarray(x[:, columns])
        if not len(kept):
            return kept
        with torch.inference_mode():
            return activation(torch.from_numpy(kept)).numpy()

    return select


def run_token_classify(inputs: InputOptions, choice: ModelChoice, opts: TokenOptions, output: OutputOptions) -> int:
    """`embedcli token-classify`: a label and its score per token (and every label's with `--all-scores`)."""
    import pyarrow as pa

    model, runner = _token_job("token_classify", "token-classify", inputs, choice, opts, output)
    special = _special_ids(model)
    names = list(model.spec.id2label)
    select = _column_selector(model, opts)
    if opts.returned_token_ids:
        names = [names[j] for j in opts.returned_token_ids]
    label_names = np.asarray(names, dtype=object)
    width = len(names)

    def to_table(batch: Any, result: TokenRows) -> Any:
        kept = [_select_tokens(i, v, special, opts) for i, v in zip(result.ids, result.values, strict=True)]
        probs = [select(np.asarray(k[1], dtype=np.float32)).reshape(-1, width) for k in kept]
        best = [p.argmax(axis=1) if len(p) else np.zeros(0, dtype=np.int64) for p in probs]
        columns: dict[str, Any] = {
            "id": pa.array(batch.ids, pa.string()),
            "token_ids": _list_column([k[0].astype(np.int32) for k in kept], pa.int32()),
            "labels": pa.array([label_names[b].tolist() for b in best], pa.list_(pa.string())),
            "scores": _list_column(
                [p[np.arange(len(p)), b] for p, b in zip(probs, best, strict=True)], pa.float32()
            ),
        }
        if opts.all_scores:
            columns["probs"] = _list_of_vectors(probs, width)
        columns.update(kept_columns(batch, inputs.keep_cols))
        return pa.table(columns)

    meta = provenance(model, runner, {"activation": opts.activation, "labels": names,
                                      "keep_special": opts.keep_special, "step_tag_id": opts.step_tag_id,
                                      "returned_token_ids": opts.returned_token_ids, "all_scores": opts.all_scores,
                                      "logit_mean": model.options.logit_mean, "logit_sigma": model.options.logit_sigma})
    return run_rows(
        read_batches(inputs), runner, output, meta, to_inputs=located, to_table=to_table,
        empty_table=lambda: to_table(_empty_batch(inputs.keep_cols), TokenRows([], [])),
    )


# -- score and rerank --------------------------------------------------------------------------------
@dataclass
class PairOptions:
    """Choices shared by `score` and `rerank`."""

    method: str = "auto"
    raw_scores: bool = False
    max_batch_tokens: int | None = None
    long_inputs: str = "truncate"
    truncation_side: str = "right"


@dataclass
class ScoreOptions(PairOptions):
    """`score` choices: 1:1 pairs from two columns, or one left text against every right text."""

    left_col: str = "left"
    right_col: str = "right"
    left: str | None = None


@dataclass
class RerankOptions(PairOptions):
    """`rerank` choices."""

    query: str | None = None
    queries: str | None = None
    query_col: str = "text"
    query_id_col: str | None = None
    top_n: int = 0
    return_documents: bool = False


def resolve_method(spec: Any, method: str, command: str) -> str:
    """How `spec` scores pairs: cross-encoder, cosine or maxsim (`auto`: by the model, as vLLM's score type)."""
    from embedcli.scoring import METHODS

    if method not in METHODS:
        raise UsageError(f"--method {method!r}: choose one of {', '.join(METHODS)}")
    if method == "auto":
        if spec.score_type == "cross-encoder":
            return "cross-encoder"
        if spec.score_type == "bi-encoder":
            return "cosine"
        if spec.score_type == "sparse":
            return "sparse"
    elif method == "sparse" and spec.score_type == "sparse":
        return method
    elif method == "cross-encoder" and spec.score_type == "cross-encoder":
        return method
    elif method in ("cosine", "maxsim") and spec.head == "base":
        return method
    why = {
        "sequence_classification": f"a classifier with {spec.num_labels} labels scores pairs only as a "
        "cross-encoder, which needs exactly one label",
        "token_classification": "a token classifier cannot score pairs",
        "base": "an embedding model scores pairs by cosine or maxsim, not as a cross-encoder",
        "lm_score": "an LLM reranker scores pairs as a cross-encoder",
        "sparse": "a sparse (SPLADE) model scores pairs by the sparse dot product",
    }[spec.head]
    raise UsageError(f"{command}: model {spec.name!r} cannot score pairs with method {method!r}: {why}; {_can_do(spec)}")


def _pair_scorer(choice: ModelChoice, opts: PairOptions, command: str) -> tuple[Any, Any, Any]:
    from embedcli.runner import Runner, RunnerOptions
    from embedcli.scoring import PairScorer

    spec = load_spec(choice)
    method = resolve_method(spec, opts.method, command)
    extra: dict[str, Any] = {}
    if method == "cross-encoder":
        mean, sigma = calibration(spec)
        extra = {"logit_mean": mean, "logit_sigma": sigma, "activation": "none" if opts.raw_scores else None}
    model = load_model(spec, choice, **extra)
    runner = Runner(
        model,
        RunnerOptions(
            task=PAIR_TASK[method], max_batch_tokens=opts.max_batch_tokens,
            long_inputs=opts.long_inputs, truncation_side=opts.truncation_side,  # type: ignore[arg-type]
            strip=False, normalize=False if (method == "maxsim" and opts.raw_scores) else None,
        ),
    )
    from embedcli.models.llm_reranker import pair_formatter

    pair_format = pair_formatter(model, runner.max_length, truncate=opts.long_inputs == "truncate")
    return model, runner, PairScorer(runner, method, dict(spec.prompts), pair_format)


def run_score(inputs: InputOptions, choice: ModelChoice, opts: ScoreOptions, output: OutputOptions) -> int:
    """`embedcli score`: one score per row, for (left, right) columns or one left text against every right."""
    import pyarrow as pa

    from embedcli.io.writers import check_output_path

    check_output_path(output.path)
    model, runner, scorer = _pair_scorer(choice, opts, "score")
    one_left = opts.left is not None
    if one_left:
        reader = read_batches(replace(inputs, text_col=opts.right_col))
        left_encoded = scorer.encode_queries([opts.left])
    else:
        reader = read_batches(replace(inputs, text_col=opts.left_col), extra_text_cols=[opts.right_col])

    def to_inputs(batch: Any) -> RowInputs:
        n = len(batch.ids)
        if one_left:
            return RowInputs(scorer.doc_inputs([opts.left], batch.texts), batch)
        rights = _check_column(batch, opts.right_col)
        return RowInputs(scorer.pair_inputs(batch.texts, rights), batch, row_of=lambda i: i % max(n, 1))

    def to_table(batch: Any, result: Any) -> Any:
        n = len(batch.ids)
        if one_left:
            scores = scorer.score_matrix(left_encoded, result, 1, n)[0] if n else np.zeros(0, np.float32)
        else:
            scores = scorer.pair_scores(result, n) if n else np.zeros(0, np.float32)
        columns = {"id": pa.array(batch.ids, pa.string()), "score": pa.array(scores, pa.float32())}
        columns.update(kept_columns(batch, inputs.keep_cols))
        return pa.table(columns)

    def empty_table() -> Any:
        columns = {"id": pa.array([], pa.string()), "score": pa.array([], pa.float32())}
        columns.update(kept_columns(_empty_batch(inputs.keep_cols), inputs.keep_cols))
        return pa.table(columns)

    meta = provenance(model, runner, {"method": scorer.method, "raw_scores": opts.raw_scores, "left": opts.left,
                                      "query_prompt": scorer.query_prompt, "document_prompt": scorer.doc_prompt,
                                      "logit_mean": model.options.logit_mean, "logit_sigma": model.options.logit_sigma})
    return run_rows(reader, runner, output, meta, to_inputs=to_inputs, to_table=to_table, empty_table=empty_table)


def _read_queries(opts: RerankOptions) -> list[tuple[str, str]]:
    from embedcli.io.errors import InputError
    from embedcli.io.readers import read_inputs

    if (opts.query is None) == (opts.queries is None):
        raise UsageError("rerank needs exactly one of --query TEXT or --queries FILE")
    if opts.query is not None:
        return [("query", opts.query)]
    out: list[tuple[str, str]] = []
    for batch in read_inputs([opts.queries], text_col=opts.query_col, id_col=opts.query_id_col):  # type: ignore[list-item]
        for loc, rid, text in zip(batch.locations, batch.ids, batch.texts, strict=True):
            if text is None:
                raise InputError(batch.source, "query text is null", location=loc, record_id=rid)
            out.append((rid, text))
    return out


def run_rerank(inputs: InputOptions, choice: ModelChoice, opts: RerankOptions, output: OutputOptions) -> int:
    """`embedcli rerank`: every query against every document, sorted by score (stable), cut to `--top-n`.

    Documents are streamed; per query the best `--top-n` (or all) scores are kept with the documents' ids
    (and texts with `--return-documents`), and the output is written once every document is scored.
    """
    import pyarrow as pa

    from embedcli.io.writers import check_output_path, open_writer
    from embedcli.jobs import _progress
    from embedcli.scoring import TopN

    check_output_path(output.path)
    if opts.top_n < 0:
        raise UsageError(f"--top-n {opts.top_n}: must be 0 (all) or more")
    started = time.perf_counter()
    queries = _read_queries(opts)
    q_ids = [q for q, _ in queries]
    q_texts = [t for _, t in queries]
    model, runner, scorer = _pair_scorer(choice, opts, "rerank")
    nq = len(queries)
    rows = inputs.batch_rows
    if scorer.method == "cross-encoder" and nq:
        rows = max(1, min(rows, 8192 // nq))  # at most ~8k pairs per step
    q_encoded = scorer.encode_queries(q_texts)
    keepers = [TopN(opts.top_n) for _ in queries]
    doc_ids: list[str] = []
    doc_texts: list[str] = []
    doc_cols: dict[str, list[Any]] = {c: [] for c in inputs.keep_cols}
    held: deque[tuple[int, int]] = deque()

    def runner_inputs() -> Iterator[RowInputs]:
        for batch in read_batches(replace(inputs, batch_rows=rows)):
            base = len(doc_ids)
            n = len(batch.ids)
            doc_ids.extend(batch.ids)
            if opts.return_documents:
                doc_texts.extend(batch.texts)
            for c in inputs.keep_cols:
                doc_cols[c].extend(batch.columns[c])
            held.append((base, n))
            yield RowInputs(scorer.doc_inputs(q_texts, batch.texts), batch, row_of=lambda i, n=n: i % n)

    with _progress(output.quiet) as bar:
        if nq:
            for result in runner.map(runner_inputs()):
                base, n = held.popleft()
                scores = scorer.score_matrix(q_encoded, result, nq, n)
                index = np.arange(base, base + n)
                for qi, keeper in enumerate(keepers):
                    keeper.add(scores[qi], index)
                bar.update(n)

    t0 = time.perf_counter()

    def table_for(qi: int) -> Any:
        scores, index = keepers[qi].result()
        idx = index.tolist()
        columns: dict[str, Any] = {
            "query_id": pa.array([q_ids[qi]] * len(idx), pa.string()),
            "id": pa.array([doc_ids[i] for i in idx], pa.string()),
            "score": pa.array(scores, pa.float32()),
            "rank": pa.array(np.arange(1, len(idx) + 1, dtype=np.int32), pa.int32()),
        }
        if opts.return_documents:
            columns["text"] = pa.array([doc_texts[i] for i in idx], pa.string())
        for c in inputs.keep_cols:
            arr = pa.array([doc_cols[c][i] for i in idx])
            columns[c] = arr.cast(pa.string()) if pa.types.is_null(arr.type) else arr
        return pa.table(columns)

    tables = [table_for(qi) for qi in range(nq)]
    if not tables:
        empty: dict[str, Any] = {
            "query_id": pa.array([], pa.string()), "id": pa.array([], pa.string()),
            "score": pa.array([], pa.float32()), "rank": pa.array([], pa.int32()),
        }
        if opts.return_documents:
            empty["text"] = pa.array([], pa.string())
        for c in inputs.keep_cols:
            empty[c] = pa.array([], pa.string())
        tables = [pa.table(empty)]
    schema = tables[0].schema
    meta = provenance(model, runner, {"method": scorer.method, "raw_scores": opts.raw_scores, "top_n": opts.top_n,
                                      "query_prompt": scorer.query_prompt, "document_prompt": scorer.doc_prompt})
    writer = open_writer(output.path, schema, meta, fmt=output.fmt)
    try:
        for table in tables:
            writer.write(table.cast(schema) if table.schema != schema else table)
        writer.commit()
    except BaseException:
        writer.abort()
        raise
    _write_stats(output, runner, started, time.perf_counter() - t0)
    return EXIT_OK
