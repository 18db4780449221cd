"""`run_job`: the one way a compute command runs, whatever the engine, the slice or the repair."""

from __future__ import annotations

from dataclasses import replace

from embedcli.run.job import Job
from embedcli.run.loop import run_pipeline
from embedcli.run.repair import repair_missing_shards
from embedcli.run.sharding import shard_source


def run_job(job: Job) -> int:
    """Run `job`; returns the exit code (0, or 3 when rows were skipped).

    With `--shard K/N` the source is restricted to that slice of the records and the output carries the
    shard keys; a finished shard directory that lost shard files gets exactly those recomputed first
    (`embedcli.run.repair`); then the unattended loop (`embedcli.run.loop`) runs: staging, manifest, commit
    by rename, resume, refusing to mix, bad rows, exit codes.
    """
    if job.flags.shard is not None:
        source, shard_meta = shard_source(job.source, job.flags.shard)
        job = replace(job, source=source, provenance={**job.provenance, **shard_meta})
    repair_missing_shards(job, run_job)
    return run_pipeline(job)
