"""`run_job`: the one way a compute command runs, whatever the engine, the slice or the repair."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

from embedcli.io.objects import is_object_url
from embedcli.io.store_area import fetched_output
from embedcli.run.grid import batch_chars
from embedcli.run.job import Job
from embedcli.run.loop import run_pipeline
from embedcli.run.repair import repair_missing_shards
from embedcli.run.sharding import RangeSource, shard_source


def sliced(job: Job) -> Job:
    """`job` restricted to its `--shard K/N` slice, with the shard keys in its provenance (the slice is cut
    once: a job already sliced is returned as it is)."""
    if job.flags.shard is None or isinstance(job.source, RangeSource):
        return job
    source, shard_meta = shard_source(job.source, job.flags.shard, job.flags, batch_chars(job.engine))
    return replace(job, source=source, provenance={**job.provenance, **shard_meta})


def run_job(job: Job) -> int:
    """Run `job`; returns the exit code (0, or 3 when rows were skipped).

    With `--shard K/N` the source is restricted to that slice of the inputs and the output carries the
    shard keys (`sliced`); a finished shard directory that lost shard files gets exactly those recomputed
    first (`embedcli.run.repair`); then the unattended loop (`embedcli.run.loop`) runs: staging, manifest,
    commit by rename, resume, refusing to mix, bad rows, exit codes.
    """
    with local_previous(job) as job:
        job = sliced(job)
        repair_missing_shards(job, run_job)
        return run_pipeline(job)


@contextmanager
def local_previous(job: Job) -> Iterator[Job]:
    """`job` with `--previous s3://...` (`gs://`) read from a private local copy of the object and its sidecars,
    fetched once here: every reader of `--previous` below takes a local path."""
    url = job.flags.previous
    if url is None or not is_object_url(url):
        yield job
        return
    with fetched_output("--previous", url) as local:
        yield replace(job, flags=replace(job.flags, previous=local))
