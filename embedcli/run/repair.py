"""Shard repair: a finished shard directory that lists shard files which are gone gets exactly those back.

Each missing shard's record range is run as the same job (`run_job(replace(job, ...))`, so with every output
check a run has) into a scratch directory of a fresh name next to the output, checked (same row count as the
manifest says), and renamed into place under its own deterministic name (`part-NNNNNN.parquet`); the other
shards are not touched. The output's staging lock is held throughout, so no other run writes it meanwhile.
"""

from __future__ import annotations

import glob
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import replace

from embedcli.errors import OutputError
from embedcli.io.manifest import (
    Manifest,
    ShardEntry,
    StagingLock,
    config_key,
    make_staging_dir,
    manifest_path,
    staging_dir,
    strip_slash,
)
from embedcli.io.positions import ReadPoint
from embedcli.io.shards import _errors_name, _index_name
from embedcli.run.job import Job, Reporting, Target
from embedcli.run.sharding import RangeSource
from embedcli.run.source import BatchSource


def missing_shards(job: Job) -> tuple[str, Manifest, list[ShardEntry]] | None:
    """(directory, manifest, missing shards) when the job's `-o` is a finished shard directory of this same
    job (config key and input fingerprints match) that lacks shard files; else None."""
    source, flags, path = job.source, job.flags, job.target.path
    if path == "-" or not isinstance(source, BatchSource) or flags.overwrite:
        return None
    out = os.path.abspath(strip_slash(path))
    if not os.path.isfile(manifest_path(out)):
        return None
    manifest = Manifest.load(out)
    if manifest is None or not manifest.complete:
        return None
    missing = [s for s in manifest.shards if s.file and not os.path.isfile(os.path.join(out, s.file))]
    if not missing:
        return None
    if manifest.config_key != config_key(job.provenance, source.options(), "parquet-dir"):
        return None
    if manifest.inputs != source.fingerprints(source.paths()):
        return None
    return out, manifest, missing


def _shard_job(job: Job, manifest: Manifest, shard: ShardEntry, scratch: str) -> Job:
    """The job that recomputes one shard's records into `scratch`: read from where the shard before it ended
    (the manifest's read points) to where it ended."""
    source = job.source
    assert isinstance(source, BatchSource)
    before = manifest.shards[shard.number - 1].end if shard.number > 0 else None
    start = ReadPoint.from_dict(before) if before else (source.start if isinstance(source, RangeSource) else None)
    stop = ReadPoint.from_dict(shard.end) if shard.end else None
    ranged = RangeSource(source.inputs, source.extra_text_cols, start=start, stop=stop, label="repair")
    # The same --shard-rows (batches are cut by it): the shard's pools are those of the run that made it, and
    # they commit once, at its end.
    flags = replace(
        job.flags, shards_dir=True, overwrite=True, incremental=False, previous=None, shard=None,
        errors_file=None, commit_every=1e9,
    )
    return replace(job, source=ranged, flags=flags, target=Target(scratch), reporting=Reporting(quiet=True))


def repair_missing_shards(job: Job, run_job: Callable[[Job], int]) -> list[str]:
    """Recompute the shards a finished shard directory lists but lacks (see the module docstring); returns
    the repaired file names."""
    found = missing_shards(job)
    if found is None:
        return []
    out, manifest, missing = found
    root = staging_dir(out)
    created = make_staging_dir(root, out)  # refuses a link planted there
    repaired: list[str] = []
    try:
        with StagingLock(root, out):  # no other run writes this output while shards go in
            for stale in glob.glob(glob.escape(os.path.join(os.path.dirname(out), _repair_prefix(out))) + "*"):
                shutil.rmtree(stale, ignore_errors=True)  # a killed repair's scratch (a name only repair makes)
            for s in missing:
                _repair_one(job, run_job, out, manifest, s)
                repaired.append(s.file or "")
    finally:
        if created:
            shutil.rmtree(root, ignore_errors=True)
    return repaired


def _repair_prefix(out: str) -> str:
    return f"{os.path.basename(out)}.embedcli-repair-"


def _repair_one(job: Job, run_job: Callable[[Job], int], out: str, manifest: Manifest, s: ShardEntry) -> None:
    """Recompute shard `s` into a fresh scratch directory beside `out`, check it, rename its files in."""
    # a fresh name: nothing already beside the output (a link, a user's folder) is ever emptied or written through
    holder = tempfile.mkdtemp(prefix=_repair_prefix(out), dir=os.path.dirname(out))
    scratch = os.path.join(holder, "shard")
    try:
        run_job(_shard_job(job, manifest, s, scratch))
        made = Manifest.load(scratch)
        if made is None or len(made.shards) != 1 or made.shards[0].rows != s.rows:
            rows = sum(x.rows for x in made.shards) if made else "?"
            raise OutputError(
                job.target.path, f"shard {s.file} recomputed to {rows} rows, the manifest says {s.rows}",
                fix="the inputs may have changed: rerun with --overwrite",
            )
        new = made.shards[0]
        assert new.file is not None and s.file is not None  # a shard with rows has a data file
        moves = [(new.file, s.file)]
        if s.index and new.index and not os.path.isfile(os.path.join(out, s.index)):
            moves.append((new.index, _index_name(s.number)))
        if s.errors_file and new.errors_file and not os.path.isfile(os.path.join(out, s.errors_file)):
            moves.append((new.errors_file, _errors_name(s.number)))
        for src, dst in moves:
            os.replace(os.path.join(scratch, src), os.path.join(out, dst))
    finally:
        shutil.rmtree(holder, ignore_errors=True)
    if not job.reporting.quiet:
        lo, hi = s.records
        print(f"embedcli: repaired {s.file}: recomputed input records {lo:,}-{hi:,} ({s.rows:,} rows)",
              file=sys.stderr, flush=True)
