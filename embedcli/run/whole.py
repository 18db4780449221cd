"""Outputs known only once every input is read (`search`, `rerank`): the output rules of a staged run.

A `WholeJob` is checked before any work exactly as `run_job` checks a `Job`: `-o`, `--stats` and
`--errors-file` against every input (by name, symlink and hard link) and each other (`check_target`); an
existing output made with another config, by another command, or a file embedcli never wrote is refused
with exit 2 unless `--overwrite`; staged work of another run at `-o` is refused the same way; the same
command over the same inputs finds its output complete and does nothing. Publishing takes the staging
lock, records the run in `OUT.embedcli-staging/` (so a kill between the data and sidecar renames is still
recognised as this run's), writes through a temp file and renames it into place. An object output
(`s3://`, `gs://`) is that file in a local spool, put whole in one upload at the end under the store's lease
(`embedcli.io.store_area.StoreArea`): the object appears whole or not at all.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from embedcli.errors import EXIT_OK, EXIT_SKIPPED, STDIN, UsageError
from embedcli.io.commit import unlink_quiet
from embedcli.io.fingerprint import input_fingerprints
from embedcli.io.manifest import (
    KEY_COMPLETE,
    KEY_CONFIG_KEY,
    KEY_INPUT_OPTIONS,
    KEY_INPUTS,
    KEY_JOB,
    KEY_OUTPUT,
    KEY_ROWS,
    KEY_SKIPPED,
    Manifest,
    StagingLock,
    config_key,
    index_sidecar,
    job_key,
    make_staging_dir,
    output_metadata,
    staging_dir,
)
from embedcli.io.objects import is_object_url
from embedcli.io.readers import expand_paths
from embedcli.io.shards import clear_dir, output_key_for, remove_tmp_files
from embedcli.io.store_area import StoreArea
from embedcli.io.stores.url import is_store_url, redact
from embedcli.io.writers import open_writer, output_format
from embedcli.run.flags import RunFlags
from embedcli.run.incremental import describe_config_change
from embedcli.run.job import Reporting, Target
from embedcli.run.paths import check_foreign_file
from embedcli.run.staging import guard_staged_work
from embedcli.run.target import check_target, is_shard_dir

_PUBLISHED = (KEY_ROWS, KEY_OUTPUT, KEY_COMPLETE)  # said by `publish` itself


@dataclass(frozen=True)
class WholeJob:
    """A command that writes its whole output at the end: where, from which inputs, under which flags."""

    target: Target
    inputs: Sequence[str]  # every file the command reads (vectors, queries, documents)
    flags: RunFlags = field(default_factory=RunFlags)
    reporting: Reporting = field(default_factory=Reporting)
    command: str = "search"

    @property
    def fmt(self) -> str:
        """The output format (`jsonl` on stdout)."""
        return output_format(self.target.path, self.target.fmt)


def check_whole(job: WholeJob) -> None:
    """Before any work: the paths `check_target` checks for every command, and one file (not a directory)."""
    if is_store_url(job.target.path):
        raise UsageError(f"{job.command} writes one file; -o {redact(job.target.path)} names a store table")
    if is_shard_dir(job.target.path, job.flags):
        raise UsageError(f"{job.command} writes one file; -o {job.target.path} names a directory of shards")
    check_target(job.target.path, job.flags, list(job.inputs), job.reporting.stats_file)


class WholeOutput:
    """The output of a `WholeJob` with its provenance `meta` and `options`: `settle`, then `publish`."""

    def __init__(
        self, job: WholeJob, meta: dict[str, str], options: dict[str, Any], key_format: str | None = None,
        tables: Sequence[dict[str, Any]] = (),
    ) -> None:
        """`tables`: the fingerprints of inputs that are store tables (their URL and version), not files."""
        self.job = job
        self.meta = dict(meta)
        self.options = dict(options)
        path = job.target.path
        self.stdout = path == STDIN
        # an object (`s3://`, `gs://`): written as a local file in a spool, then put whole (`embedcli.io.store_area`)
        self.area = StoreArea(path) if is_object_url(path) else None
        self.local = self.area.local if self.area is not None else path
        self._opened = False
        self._close = weakref.finalize(self, self.area.close) if self.area is not None else None  # however it ends
        reads_stdin = any(p == STDIN for p in job.inputs)
        files = [] if reads_stdin or not job.inputs else expand_paths(list(job.inputs))
        self.fingerprints = None if len(files) != len(job.inputs) else input_fingerprints(files)
        if self.fingerprints is not None:
            self.fingerprints = [*tables, *self.fingerprints]
        # `key_format`: the format the config key names, where a command keyed its outputs otherwise before
        self.cfg_key = config_key(self.meta, self.options, key_format or job.fmt)
        self.job_key = job_key(self.cfg_key, self.fingerprints)
        self.base_meta = {
            **self.meta,
            KEY_CONFIG_KEY: self.cfg_key,
            KEY_JOB: self.job_key or "",
            KEY_INPUTS: json.dumps(self.fingerprints, sort_keys=True) if self.fingerprints is not None else "null",
            KEY_INPUT_OPTIONS: json.dumps(self.options, sort_keys=True),
        }

    def settle(self) -> int | None:
        """EXIT_OK when the output already holds this job's result; UsageError (exit 2, unless `--overwrite`)
        when it, or staged work at it, was made otherwise; None: there is work to do."""
        if self.stdout:
            return None
        try:
            return self._settle()
        except BaseException:
            self.close()
            raise

    def _settle(self) -> int | None:
        self._open()
        shown, path, overwrite = self.job.target.path, self.local, self.job.flags.overwrite
        guard_staged_work(path, self.cfg_key, self.base_meta, overwrite)
        fmt = self.job.target.fmt
        # a store's Parquet output: from its footer, so a rerun that finds it complete fetches none of it
        existing = self.area.existing_metadata(fmt) if self.area is not None else output_metadata(path, fmt)
        if existing is None:
            if not overwrite and not self._own_staging():
                check_foreign_file(path, shown)
            self._fetch_output()
            return None
        if overwrite:
            self._fetch_output()
            return None
        if existing.get(KEY_CONFIG_KEY) != self.cfg_key:
            raise UsageError(
                f"{shown} was made with a different config ({describe_config_change(existing, self.base_meta)}); "
                "pass --overwrite to replace it, or choose another -o"
            )
        if self.job_key and existing.get(KEY_JOB) == self.job_key and existing.get(KEY_COMPLETE) == "true":
            skipped = int(existing.get(KEY_SKIPPED, "0") or 0)  # its run's bad rows (--on-error skip) still count
            if not self.job.reporting.quiet:
                print(f"embedcli: {shown} is already complete (same inputs and config): nothing to do"
                      + (f"; {skipped:,} bad input rows were skipped (exit code 3)" if skipped else ""),
                      file=sys.stderr)
            shutil.rmtree(staging_dir(path), ignore_errors=True)  # a kill after the last rename left it
            self.close()  # nothing to publish
            return EXIT_SKIPPED if skipped else EXIT_OK
        self._fetch_output()
        return None

    def _fetch_output(self) -> None:
        """There is work to do: fetch a store's existing output (publish replaces it, sidecars included)."""
        if self.area is not None:
            self.area.fetch_output()

    def _own_staging(self) -> bool:
        """Whether the staging area records an interrupted publish of this same config (its data file may
        already be in place without its sidecar)."""
        manifest = Manifest.load(staging_dir(self.local))
        return manifest is not None and manifest.config_key == self.cfg_key

    def publish(self, tables: Sequence[Any], extra: dict[str, str] | None = None) -> None:
        """Write `tables` (same columns) as the output, atomically, with the run's metadata."""
        self.publish_stream(tables[0].schema, sum(t.num_rows for t in tables), tables, extra)

    def publish_stream(
        self, schema: Any, rows: int, tables: Iterable[Any], extra: dict[str, str] | None = None
    ) -> None:
        """Write `rows` rows arriving as `tables` of `schema` as the output, atomically, with the run's
        metadata (`extra` adds keys; the keys that identify the run are this output's own)."""
        extra = {k: v for k, v in (extra or {}).items() if k not in self.base_meta and k not in _PUBLISHED}
        if self.stdout:
            writer = open_writer(STDIN, schema, {**self.base_meta, **extra}, fmt=self.job.target.fmt)
            self.write(writer, tables, schema)
            return
        try:
            self._publish(schema, rows, tables, extra)
        finally:
            self.close()

    def _publish(self, schema: Any, rows: int, tables: Iterable[Any], extra: dict[str, str]) -> None:
        self._open()
        path = self.local
        root = staging_dir(path)
        make_staging_dir(root, path)  # refuses a symlink planted at the staging path
        with StagingLock(root, path):
            clear_dir(root)
            manifest = Manifest(
                config_key=self.cfg_key, job_key=self.job_key, config=self.meta, input_options=self.options,
                inputs=self.fingerprints, output_format=self.job.fmt, mode="file", indexed=False,
            )
            manifest.save(root)
            # keyed as `inspect` reads it back (the saved manifest), so a kill after the last rename reads as published
            saved = Manifest.load(root) or manifest
            meta = {**self.base_meta, **extra, KEY_ROWS: str(rows),
                    KEY_OUTPUT: output_key_for(root, saved), KEY_COMPLETE: "true"}
            remove_tmp_files(os.path.dirname(os.path.abspath(path)), os.path.basename(path))
            with self.area.kept() if self.area is not None else contextlib.nullcontext():  # however long it writes
                self.write(open_writer(path, schema, meta, fmt=self.job.target.fmt), tables, schema)
            unlink_quiet(index_sidecar(path))  # an earlier output's row index does not describe this one
        shutil.rmtree(root, ignore_errors=True)
        if self.area is not None:  # the whole file put in one upload (sidecars first): an object whole or none
            self.area.publish()

    def _open(self) -> None:
        """For an object output: take its lease and fetch the existing output (and staged work) into the spool."""
        if self.area is None or self._opened:
            return
        self._opened = True
        self.area.open()

    def close(self) -> None:
        """For an object output: release its lease and remove the spool (nothing for a local one)."""
        if self._close is not None:
            self._close()

    @staticmethod
    def write(writer: Any, tables: Iterable[Any], schema: Any) -> None:
        """Write `tables` (cast to `schema`) and commit; abort the writer on any error."""
        try:
            for table in tables:
                writer.write(table.cast(schema) if table.schema != schema else table)
            writer.commit()
        except BaseException:
            writer.abort()
            raise
