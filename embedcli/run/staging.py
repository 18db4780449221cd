"""Staging, commit and resume policy of a file or shard-directory output (`OUT.embedcli-staging/`).

`run_staged(pipeline)` decides, from what is on disk, whether this run resumes the staged work of an
interrupted one, starts over, refuses to mix configs (exit 2 without `--overwrite`), or finds the output
already complete; then runs the pipeline's loop into a `ShardStore` and publishes the result.

The output's staging area (`embedcli.io.store_area.output_area`, chosen by the path) is where this happens:
the output's own folder for a local path; for an object URL (`s3://`, `gs://`) a local spool mirrored to the
store, each commit and the publish put there, the lock a lease object. This module does not tell them apart.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from embedcli.errors import EXIT_OK, EXIT_SKIPPED, UsageError
from embedcli.io.arrow_values import read_parquet, to_numpy
from embedcli.io.fingerprint import describe_input_change
from embedcli.io.manifest import (
    KEY_COMPLETE,
    KEY_CONFIG,
    KEY_CONFIG_KEY,
    KEY_ERRORS,
    KEY_INPUT_OPTIONS,
    KEY_INPUTS,
    KEY_JOB,
    KEY_MODEL,
    KEY_RECORDS,
    KEY_ROWS,
    KEY_SKIPPED,
    Manifest,
    StagingLock,
    make_staging_dir,
    output_error,
    staging_dir,
)
from embedcli.io.positions import ReadPoint
from embedcli.io.shards import (
    ShardStore,
    assemble_file,
    clear_dir,
    publish_dir,
    recover_dir,
    remove_tmp_files,
)
from embedcli.io.store_area import OutputArea, output_area
from embedcli.io.units import InputUnits
from embedcli.run.ids import IdSet
from embedcli.run.incremental import describe_config_change
from embedcli.run.paths import check_foreign_file

if TYPE_CHECKING:  # the pipeline drives this module and is passed in; no import at run time
    from embedcli.run.loop import Pipeline

ERRORS_IN_METADATA = 20


def _config_differs(p: Pipeline, existing: dict[str, str]) -> bool:
    if existing.get(KEY_CONFIG_KEY):
        return existing[KEY_CONFIG_KEY] != p.cfg_key
    return existing.get(KEY_CONFIG) != p.meta.get(KEY_CONFIG) or existing.get(KEY_MODEL) != p.meta.get(KEY_MODEL)


def _complete_for_this_job(p: Pipeline, existing: dict[str, str]) -> bool:
    return bool(p.job_key) and existing.get(KEY_JOB) == p.job_key and existing.get(KEY_COMPLETE) == "true"


def _already_complete(p: Pipeline, existing: dict[str, str], root: str, lock: Any, area: OutputArea) -> int:
    staged = Manifest.load(root)
    if staged is None or staged.job_key == p.job_key:
        lock.release()
        shutil.rmtree(root, ignore_errors=True)
    area.publish()
    skipped = int(existing.get(KEY_SKIPPED, "0") or 0)
    rows = existing.get(KEY_ROWS, "?")
    also = f"; {skipped} bad rows were skipped when it was made" if skipped else ""
    p.note(f"{p.output.name} is already complete ({rows} rows, same inputs and config{also}): nothing to do")
    report = p.report
    report.records_done = report.resumed_records = int(existing.get("embedcli.input_records", "0") or 0)
    report.rows = int(rows) if str(rows).isdigit() else 0
    report.skipped = skipped
    return EXIT_OK  # README: 0 when the output was already complete, whatever its run skipped


def _json_list(value: str | None) -> list[dict[str, Any]] | None:
    try:
        loaded = json.loads(value) if value else None
    except ValueError:
        return None
    return loaded if isinstance(loaded, list) else None


def _check_existing(p: Pipeline, existing: dict[str, str] | None) -> bool:
    """Refuse an output made otherwise (exit 2 without --overwrite); True when it is this job's, complete."""
    target, overwrite = p.output, p.flags.overwrite
    if existing is not None and not overwrite:
        if _config_differs(p, existing):
            raise UsageError(
                f"{target.name} was made with a different config ({describe_config_change(existing, p.base_meta)}); "
                "pass --overwrite to replace it, or choose another -o"
            )
        if _complete_for_this_job(p, existing):
            return True
        if not p.flags.incremental and existing.get(KEY_COMPLETE) == "true":
            why = describe_input_change(_json_list(existing.get(KEY_INPUTS)), p.fingerprints)
            p.note(f"{target.name} was made from other inputs ({why}): computing every row "
                   "(--incremental would carry unchanged rows over)")
        return False
    if existing is None and target.mode == "file" and not overwrite and Manifest.load(staging_dir(target.path)) is None:
        check_foreign_file(target.path)  # a kill between a first JSONL commit's two renames left staging behind
    if existing is None and target.mode == "dir" and os.path.isdir(target.path):
        if os.listdir(target.path) and not overwrite:
            raise UsageError(
                f"{target.path} is a directory that embedcli did not write; pass --overwrite to replace it, "
                "or choose another -o"
            )
    return False


def _staged_meta(manifest: Manifest) -> dict[str, str]:
    """The metadata of staged work as an output's: its config plus the input options the manifest keeps apart
    (without them every refusal listed a false `input options: None → {...}`)."""
    meta = dict(manifest.metadata or manifest.config)
    meta.setdefault(KEY_INPUT_OPTIONS, json.dumps(manifest.input_options, sort_keys=True))
    return meta


def _refuse_other_config(root: str, manifest: Manifest, cfg_key: str, meta: dict[str, str]) -> None:
    if manifest.config_key != cfg_key:
        raise UsageError(
            f"{root} holds the work of an interrupted run with a different config "
            f"({describe_config_change(_staged_meta(manifest), meta)}); "
            "rerun that command to finish it, or pass --overwrite to discard it"
        )


def guard_staged_work(output: str, cfg_key: str, meta: dict[str, str], overwrite: bool) -> None:
    """For a run that publishes `output` without staging there (`--precision int8` stages a float32 spool):
    the rule of every staged run. Staged work of another config at `output` is refused (exit 2) unless
    `overwrite`, which discards it (OutputError while another run holds it)."""
    root = staging_dir(output)
    manifest = Manifest.load(root) if os.path.isdir(root) else None
    if manifest is None or manifest.config_key == cfg_key:
        return
    if not overwrite:
        _refuse_other_config(root, manifest, cfg_key, meta)
    with StagingLock(root, output):
        clear_dir(root)
    shutil.rmtree(root, ignore_errors=True)


def _resume_or_start(p: Pipeline, root: str) -> tuple[Manifest, bool]:
    """The manifest to continue (staged work of this same job) or a fresh one; and whether it is fresh."""
    overwrite = p.flags.overwrite
    manifest = Manifest.load(root)
    if manifest is not None and not overwrite:
        _refuse_other_config(root, manifest, p.cfg_key, p.base_meta)
    p.start_engine()  # only now that there is work, and before a manifest of it is staged
    if manifest is not None:
        if overwrite or p.job_key is None or manifest.job_key != p.job_key or manifest.complete:
            if not overwrite and manifest.records_done and manifest.job_key != p.job_key:
                why = describe_input_change(manifest.inputs, p.fingerprints)
                p.note(f"the inputs changed since the interrupted run ({why}): starting over")
            clear_dir(root)
            manifest = None
        elif manifest.records_done and not (manifest.version >= 2 and manifest.shards and manifest.shards[-1].end):
            p.note("the interrupted run was staged by an older embedcli (no read points): starting over")
            clear_dir(root)
            manifest = None
    elif os.listdir(root):
        clear_dir(root)
    if manifest is not None:
        return manifest, False
    manifest = Manifest(
        config_key=p.cfg_key,
        job_key=p.job_key,
        config=p.meta,
        input_options=p.options,
        inputs=p.fingerprints,
        output_format=p.output.fmt,
        mode=p.output.mode,
    )
    try:
        manifest.save(root)
    except OSError as e:  # e.g. a disk already full: name the output, not a bare "[Errno 28]"
        raise output_error(root, e, resumable=False) from None  # the staging dir: it names the output too
    return manifest, True


def _same_previous(p: Pipeline, root: str, manifest: Manifest) -> Manifest:
    """The manifest to go on with, given the output this run carries rows over from: staged work made with
    another previous output (or none) is started over; a fresh manifest records this one."""
    previous = p.carry.previous
    now = {"path": previous.path, "output_key": previous.output_key or ""} if previous is not None else None
    if manifest.records_done and manifest.previous != now:
        p.note("the interrupted run carried rows over from another previous output: starting over")
        clear_dir(root)
        manifest = Manifest(
            config_key=manifest.config_key, job_key=manifest.job_key, config=manifest.config,
            input_options=manifest.input_options, inputs=manifest.inputs, output_format=manifest.output_format,
            mode=manifest.mode,
        )
    if manifest.previous != now:
        manifest.previous = now
        try:
            manifest.save(root)
        except OSError as e:
            raise output_error(root, e, resumable=False) from None
    return manifest


def _committed_ids(root: str, manifest: Manifest, ids: IdSet) -> None:
    """Register the ids of the committed rows (their hashes and locations, from the shards' row index: the
    committed records are not read again)."""
    if not manifest.indexed:
        return
    for s in manifest.shards:
        if not s.index:
            continue
        try:
            t = read_parquet(os.path.join(root, s.index), columns=["idh", "loc"])
        except (pa.ArrowException, OSError, KeyError):
            continue
        ids.add(np.asarray(to_numpy(t.column("idh")), np.int64), np.asarray(to_numpy(t.column("loc")), np.int64))


def _final_meta(p: Pipeline) -> dict[str, str]:
    m = p.manifest
    first = []
    for record in p.store.committed_errors():
        first.append(record)
        if len(first) >= ERRORS_IN_METADATA:
            break
    return {
        **p.base_meta,
        KEY_ROWS: str(m.rows_done),
        KEY_RECORDS: str(m.records_done),
        KEY_SKIPPED: str(m.errors),
        KEY_ERRORS: json.dumps(first, ensure_ascii=False, sort_keys=True),
    }


def _finish(p: Pipeline, root: str, lock: Any, area: OutputArea) -> int:
    t0 = time.perf_counter()
    manifest = p.manifest
    meta = _final_meta(p)
    if p.output.mode == "file":
        empty_schema = p.empty_output().schema
        with area.kept():  # an object output's lease outlives an assembly of any length
            assemble_file(root, manifest, p.output.path, p.job.target.fmt, meta, empty_schema, p.store.previous)
        lock.release()
        shutil.rmtree(root, ignore_errors=True)
    else:
        lock.release()
        publish_dir(root, manifest, p.output.path, meta)
    area.publish()
    p.report.seconds["finalize"] += time.perf_counter() - t0
    p.report.rows, p.report.skipped = manifest.rows_done, manifest.errors
    p.report.summary(p.job.engine, manifest.errors, manifest.rows_done, p.flags.errors_file)
    return EXIT_SKIPPED if manifest.errors else EXIT_OK


def run_staged(p: Pipeline) -> int:
    """Run pipeline `p` into its staged output (see the module docstring); returns the exit code."""
    # a lease outlives the longest wait between two commits (one pool past --commit-every) several times over
    with output_area(p.output.name, 3 * p.flags.commit_every) as area:
        p.output = replace(p.output, path=area.local)
        return _run_in(p, area)


def _run_in(p: Pipeline, area: OutputArea) -> int:
    target = p.output
    root = staging_dir(target.path)
    if target.mode == "dir":
        recover_dir(target.path, root)
    created_root = make_staging_dir(root, target.path)  # refuses a symlink planted at the staging path
    lock = StagingLock(root, target.path).acquire()
    created_manifest = False
    try:
        # a store's Parquet output: from its footer, so a run that finds it complete fetches none of it
        existing = area.existing_metadata(None if target.mode == "dir" else p.job.target.fmt)
        if _check_existing(p, existing):
            assert existing is not None  # complete means there is an output
            return _already_complete(p, existing, root, lock, area)
        area.fetch_output()  # the run goes on: `--incremental` in place reads it, publish replaces it
        manifest, created_manifest = _resume_or_start(p, root)
        p.manifest = manifest
        p.open_previous(target.path if existing is not None else None, existing)
        manifest = p.manifest = _same_previous(p, root, manifest)
        area.committed(manifest)
        store = p.store = ShardStore(root, manifest, p.meta, target.path, p.carry.previous, area.committed)
        store.clean_stale()
        if target.mode == "file":
            remove_tmp_files(os.path.dirname(os.path.abspath(target.path)), os.path.basename(target.path))
        start = None
        ids = p.id_set()
        if manifest.records_done:
            p.note(f"resuming: {manifest.records_done:,} input rows already committed in {len(manifest.shards)} shards")
            end = manifest.shards[-1].end
            start = ReadPoint.from_dict(end) if end else None
            _committed_ids(root, manifest, ids)
            p.units = InputUnits.from_json(manifest.units)
        p.read_point = start
        p.guarded_loop(store, start, manifest.records_done,
                       lambda: [*store.committed_errors(), *store.pending_errors], ids)
        return _finish(p, root, lock, area)
    except BaseException:
        lock.release()
        fresh = p.manifest is None or (created_manifest and not p.manifest.shards)
        if fresh and (created_root or created_manifest):
            shutil.rmtree(root, ignore_errors=True)
        raise
    finally:
        lock.release()
