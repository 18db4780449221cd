"""`embedcli embed`: one vector per row; with `--precision`, quantized as sentence-transformers does."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from embedcli.compute.build import embed_recipe
from embedcli.errors import UsageError
from embedcli.io.commit import INDEX_SUFFIX
from embedcli.io.location import refuse_url
from embedcli.io.manifest import (
    index_sidecar,
    output_metadata,
)
from embedcli.io.objects import delete, is_object_url
from embedcli.io.store_area import fetched_output
from embedcli.io.stores.url import is_store_url
from embedcli.io.writers import embedding_array, embedding_matrix, open_writer
from embedcli.models.spec import ModelSpec
from embedcli.quantize import Quantizer, make_quantizer, merge_ranges, ranges_of
from embedcli.run.execute import run_job, sliced
from embedcli.run.flags import RunFlags
from embedcli.run.job import Job, Target
from embedcli.run.source import BatchSource, InputOptions, check_head, empty_batch, id_column, with_kept
from embedcli.run.target import check_target
from embedcli.run.whole import WholeJob, WholeOutput
from embedcli.tasks.common import (
    ModelChoice,
    OutputOptions,
    job_engine,
    load_spec,
    located,
    make_job,
    run_computation,
)
from embedcli.tasks.m3 import HybridRequest, check_hybrid, hybrid_computation, output_format

SPOOL_SUFFIX = ".embedcli-float32.parquet"


@dataclass(frozen=True)
class EmbedOptions:
    """Embedding-specific choices."""

    normalize: bool | None = None
    max_batch_tokens: int | None = None
    strip: bool = False
    dimensions: int | None = None
    prompt: str | None = None
    prompt_name: str | None = None
    long_inputs: str = "truncate"
    truncation_side: str | None = None
    precision: str = "float32"
    calibration: str | None = None
    # BGE-M3: any of dense, sparse, colbert as columns of one output, from one forward per pack.
    outputs: tuple[str, ...] = ("dense",)


@dataclass(frozen=True)
class EmbedCodec:
    """Rows of `embed`: id, embedding (fixed_size_list<float32>[width]) and the kept columns."""

    width: int
    keep_cols: tuple[str, ...] = ()

    def inputs(self, batch: Any) -> Any:
        """The batch's texts."""
        return located(batch)

    def table(self, batch: Any, vectors: Any) -> Any:
        """The output rows of a batch."""
        columns = {"id": id_column(batch), "embedding": embedding_array(np.asarray(vectors))}
        return pa.table(with_kept(columns, batch, self.keep_cols))

    def empty(self) -> Any:
        """The output of no rows."""
        return self.table(empty_batch(self.keep_cols), np.zeros((0, self.width), np.float32))


@dataclass(frozen=True)
class QuantizedCodec:
    """Another codec's rows with the `embedding` column quantized (see `embedcli.quantize`)."""

    inner: Any
    quant: Quantizer

    def inputs(self, batch: Any) -> Any:
        """The inner codec's inputs."""
        return self.inner.inputs(batch)

    def table(self, batch: Any, result: Any) -> Any:
        """The inner codec's rows, quantized."""
        return self.quant.table(self.inner.table(batch, result))

    def empty(self) -> Any:
        """The inner codec's empty output, quantized."""
        return self.quant.table(self.inner.empty())


def run_embed(
    inputs: InputOptions, choice: ModelChoice, embed: EmbedOptions, output: OutputOptions, flags: RunFlags | None = None
) -> int:
    """`embedcli embed`: stream rows through the model into one output; returns the exit code."""
    flags = flags or RunFlags()
    refuse_url("--calibration", embed.calibration, "a local file")
    check_target(output.path, flags, inputs.paths, output.stats_file)
    check_head(BatchSource(inputs), flags)  # said before the model loads
    spec = load_spec(choice)  # resolved (and its weight files hashed) once per run
    if embed.outputs != ("dense",):
        if is_store_url(output.path):
            raise UsageError(f"--outputs {','.join(embed.outputs)}: a store table takes dense vectors only; "
                             "write the hybrid outputs to a .parquet file")
        return run_hybrid(inputs, choice, embed, output, flags, spec)
    recipe = embed_recipe(
        spec, choice.options(), max_batch_tokens=embed.max_batch_tokens, normalize=embed.normalize,
        strip=embed.strip, dimensions=embed.dimensions, prompt=embed.prompt, prompt_name=embed.prompt_name,
        long_inputs=embed.long_inputs, truncation_side=embed.truncation_side, threads=choice.threads,
    )
    quant = make_quantizer(embed.precision, embed.calibration)
    # The model loads once the output's state says there is work (unless only loading can settle the dtype).
    engine, meta, plan = job_engine(recipe, flags, quant.config())
    width = plan.dimensions or spec.embedding_size
    codec = EmbedCodec(width, tuple(inputs.keep_cols))
    job = make_job(BatchSource(inputs), engine, codec, meta, output, flags)
    if quant.precision == "float32":
        return run_job(job)
    check_calibration_width(quant, embed.calibration, width)
    return run_quantized(job, quant)


def run_hybrid(
    inputs: InputOptions, choice: ModelChoice, embed: EmbedOptions, output: OutputOptions, flags: RunFlags, spec: ModelSpec
) -> int:
    """`embed --outputs ...` on a BGE-M3 model: the asked outputs as columns of one output, one pass over the rows."""
    request = HybridRequest(
        embed.outputs, max_batch_tokens=embed.max_batch_tokens, strip=embed.strip, prompt=embed.prompt,
        prompt_name=embed.prompt_name, long_inputs=embed.long_inputs, truncation_side=embed.truncation_side,
    )
    check_hybrid(spec, request, precision=embed.precision, dimensions=embed.dimensions, normalize=embed.normalize,
                 calibration=embed.calibration, fmt=output_format(output.path, output.fmt))
    work = hybrid_computation(spec, choice, request, tuple(inputs.keep_cols))
    return run_computation(BatchSource(inputs), work, output, flags)


def run_quantized(job: Job, quant: Quantizer) -> int:
    """`job` with the `embedding` column quantized.

    With ranges known (any precision but int8/uint8, or `--calibration`) each batch is quantized as it is
    committed. Otherwise the float32 output is first written, by the ordinary resumable loop, to a spool
    `OUT.embedcli-float32.parquet` beside the output (a killed run resumes it); then its per-dimension
    min/max are computed, the spool is quantized into the output in one atomic write, and removed. A rerun
    of a finished job finds the output complete and does nothing; an output made with another config is
    not replaced without `--overwrite`.
    """
    if not quant.needs_ranges:
        meta = {**job.provenance, **quant.metadata()}
        return run_job(replace(job, codec=QuantizedCodec(job.codec, quant), provenance=meta))
    if job.flags.incremental or job.flags.shards_dir:
        raise UsageError(
            f"--precision {quant.precision} takes its ranges from the whole output, which --incremental and "
            "--shards-dir cannot see at once; pass --calibration FILE (e.g. an earlier float32 or "
            f"{quant.precision} output) so every row is quantized with the same ranges"
        )
    if is_store_url(job.target.path):
        raise UsageError(
            f"--precision {quant.precision} takes its ranges from the whole output, which a store output does not "
            "see at once; pass --calibration FILE (e.g. an earlier float32 output) to write it to a store"
        )
    if job.target.path == "-":  # stdout: nothing to resume; spool in a temporary folder
        spool_dir = tempfile.mkdtemp(prefix=".embedcli-spool-")
        try:
            return _spooled(job, quant, os.path.join(spool_dir, "float32.parquet"), None)
        finally:
            shutil.rmtree(spool_dir, ignore_errors=True)
    # an object output's spool is an object beside it, written (and resumed) as any object output is
    url = is_object_url(job.target.path)
    spool = job.target.path + SPOOL_SUFFIX if url else os.path.abspath(job.target.path) + SPOOL_SUFFIX
    job = sliced(job)  # the slice is cut once, for the spool and the output's keys alike
    out = _quantized_output(job)
    done = out.settle()  # the output checks of every command that publishes a whole output
    if done is not None:
        _remove_spool(spool)  # a run killed after publishing, before removing its spool
        return done
    try:
        code = _spooled(job, quant, spool, out)
    except UsageError:  # one embedding, no ranges: the refused run leaves no spool beside the output
        _remove_spool(spool)
        raise
    _remove_spool(spool)
    return code


def _quantized_output(job: Job) -> WholeOutput:
    """The quantized output as one whole output of the job's config and inputs (keyed as the float32 spool is)."""
    source = job.source
    assert isinstance(source, BatchSource)  # embed reads a BatchSource (sliced: its shard keys are in provenance)
    whole = WholeJob(job.target, source.paths(), job.flags, job.reporting, command="embed")
    options = BatchSource(source.inputs, source.extra_text_cols).options()  # the options of the unsliced inputs
    return WholeOutput(whole, dict(job.provenance), options, key_format="parquet")


def _remove_spool(spool: str) -> None:
    """Delete the float32 spool and its index sidecar once the quantized output is published."""
    if is_object_url(spool):
        delete(spool + INDEX_SUFFIX)  # first: an index with no output describes nothing
        delete(spool)
        return
    for leftover in (spool, index_sidecar(spool)):
        if os.path.exists(leftover):
            os.remove(leftover)


def _spooled(job: Job, quant: Quantizer, spool: str, out: WholeOutput | None) -> int:
    """Run `job` into a float32 Parquet `spool`, then quantize the spool into the job's output."""
    code = run_job(replace(job, target=Target(spool, "parquet")))
    if not is_object_url(spool):
        _quantize_spool(spool, job, quant, out)
        return code
    with fetched_output("--precision", spool) as local:  # read whole twice: a local copy
        _quantize_spool(local, job, quant, out)
    return code


def _spool_ranges(source: pq.ParquetFile, quant: Quantizer, quiet: bool) -> None:
    """Set `quant`'s ranges from the whole float32 spool."""
    ranges, rows = None, 0
    for rb in source.iter_batches(columns=["embedding"], batch_size=8192):
        m = embedding_matrix(rb.column(0))
        if len(m):
            ranges, rows = merge_ranges(ranges, ranges_of(m)), rows + len(m)
    calibrate_on_output(quant, ranges, rows)
    if rows and rows < 100 and not quiet:
        print(f"embedcli: {quant.precision} ranges computed from only {rows} embeddings", file=sys.stderr)


def calibrate_on_output(quant: Quantizer, ranges: np.ndarray | None, rows: int) -> None:
    """Set `quant`'s ranges to the whole output's (`ranges` of its `rows` embeddings): one embedding has none."""
    if rows == 1:
        raise UsageError(
            f"--precision {quant.precision}: ranges cannot be computed from a single embedding; "
            "pass --calibration FILE (float vectors, or an earlier int8/uint8 output)"
        )
    if ranges is not None:
        quant.ranges, quant.calibration = ranges, "output"


def check_calibration_width(quant: Quantizer, calibration: str | None, width: int) -> None:
    """UsageError when `--calibration`'s ranges are not as wide as the output's vectors."""
    if quant.ranges is not None and quant.ranges.shape[1] != width:
        raise UsageError(f"--calibration {calibration}: {quant.ranges.shape[1]} dims, the output has {width}")


def _quantize_spool(spool: str, job: Job, quant: Quantizer, out: WholeOutput | None) -> None:
    """Ranges from the whole float32 spool, then the spool quantized into the output (one atomic write)."""
    source = pq.ParquetFile(spool)
    _spool_ranges(source, quant, job.reporting.quiet)
    # the spool's metadata (rows skipped, errors, ...) describes the output too
    spool_meta = {**(output_metadata(spool, "parquet") or job.provenance), **quant.metadata()}
    empty = source.schema_arrow.empty_table().replace_schema_metadata(None)  # the spool's columns and types
    schema = quant.table(empty).schema
    tables = (quant.table(pa.Table.from_batches([rb])) for rb in source.iter_batches(batch_size=8192))
    if out is None:  # stdout: nothing to resume or replace
        WholeOutput.write(open_writer(job.target.path, schema, spool_meta, fmt=job.target.fmt), tables, schema)
        return
    out.publish_stream(schema, source.metadata.num_rows, tables, spool_meta)

