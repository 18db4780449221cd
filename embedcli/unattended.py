"""The loop every compute command shares, made safe to run unattended.

`run_pipeline` streams input batches through a runner into an output and adds what cron needs:

- **Atomic, resumable output.** Results are committed in shards through `OUT.embedcli-staging/`
  (see `embedcli.io.manifest`); the manifest records the input fingerprints, the committed record
  ranges and the config. The same command after a crash (even `kill -9`) skips the committed records
  (read, not recomputed) and continues; the final file is assembled from the shards and renamed into
  place, so nothing half-written is ever visible. Batches and shard cuts fall on the same records in
  every run, so a resumed run's output is the same, byte for byte, as an uninterrupted one.
- **Refusing to mix.** An output or staged work made with a different config stops the run with
  exit 2 unless `--overwrite`; a complete output of the same command is left alone (exit 0).
- **`--incremental`.** Each row has a 16-byte key (BLAKE2b of its id and texts); rows whose key is in
  the previous output's index are carried over, the rest are computed.
- **Bad rows.** Malformed lines, bad UTF-8, null texts and duplicate ids stop the run
  (`--on-error fail`) or are skipped and recorded (`--on-error skip`, `--errors-file`, `--max-errors`,
  exit 3). SIGINT/SIGTERM commit what is done and exit 130; a full disk exits 1 with the committed work
  kept for the rerun.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from embedcli.io.errors import STDIN, InputError, OutputError
from embedcli.run_options import RunSettings, current_settings

ERRORS_IN_METADATA = 20
ERRORS_SHOWN = 5


# --------------------------------------------------------------------------------------------------
# Where batches come from


@dataclass
class BatchSource:
    """The inputs of a command, re-readable: what `jobs.read_batches` returns.

    Iterating it yields input batches with null texts rejected (the plain behaviour); `run_rows`
    instead opens it itself, to fingerprint the inputs, skip committed records and collect bad rows.
    """

    inputs: Any  # jobs.InputOptions
    extra_text_cols: tuple[str, ...] = ()

    def paths(self) -> list[str]:
        """The input files after glob expansion (InputError when one is missing)."""
        from embedcli.io.readers import detect_format, expand_paths, normalize_format

        paths = expand_paths(self.inputs.paths)
        fmt = normalize_format(self.inputs.fmt) if self.inputs.fmt else None
        for p in paths:
            detect_format(p, fmt)
        return paths

    def open(
        self,
        paths: Sequence[str] | None = None,
        *,
        batch_rows: int | None = None,
        on_bad_row: Callable[[InputError], None] | None = None,
    ) -> Iterator[Any]:
        """The raw reader over `paths` (default: all inputs), no row checks."""
        from embedcli.io.readers import read_inputs

        return read_inputs(
            list(paths) if paths is not None else self.inputs.paths,
            text_col=self.inputs.text_col,
            id_col=self.inputs.id_col,
            keep_cols=self.inputs.keep_cols,
            extra_text_cols=self.extra_text_cols,
            fmt=self.inputs.fmt,
            batch_rows=batch_rows or self.inputs.batch_rows,
            on_bad_row=on_bad_row,
        )

    def __iter__(self) -> Iterator[Any]:
        from embedcli.jobs import _check_texts

        for batch in self.open():
            _check_texts(batch)
            yield batch

    def options(self) -> dict[str, Any]:
        """The input options that decide what the output holds."""
        return {
            "text_col": self.inputs.text_col,
            "id_col": self.inputs.id_col,
            "keep_cols": list(self.inputs.keep_cols),
            "extra_text_cols": list(self.extra_text_cols),
            "format": self.inputs.fmt,
        }

    def fingerprints(self, paths: Sequence[str]) -> list[dict[str, Any]] | None:
        """Fingerprints of every input (None when one is stdin: such a run cannot resume)."""
        from embedcli.io.readers import input_fingerprints

        return input_fingerprints(paths)  # None for stdin, a pipe or a FIFO: never read to fingerprint it

    def total_rows(self, paths: Sequence[str]) -> int | None:
        """Row count from Parquet metadata when every input is Parquet (for an ETA), else None."""
        import pyarrow.parquet as pq

        from embedcli.io.readers import detect_format, rereadable

        total = 0
        for p in paths:
            if not rereadable(p) or detect_format(p, self.inputs.fmt) != "parquet":
                return None
            try:
                total += pq.ParquetFile(p).metadata.num_rows
            except Exception:
                return None
        return total


# --------------------------------------------------------------------------------------------------
# Duplicate ids


class IdSet:
    """The ids seen so far, as 64-bit hashes with the packed location of their first occurrence.

    16 bytes per row in sorted numpy runs (merged like an LSM tree), so a 10M-row corpus costs ~160 MB
    rather than a Python set's ~1 GB. Python's string hash is 64-bit: a false duplicate among 10M ids
    has a probability of about 3e-6.
    """

    SHIFT = 40

    def __init__(self) -> None:
        self._runs: list[tuple[np.ndarray, np.ndarray]] = []
        self._files: dict[str, int] = {}
        self._names: list[str] = []
        self._words: dict[int, str] = {}

    def _loc(self, source: str, location: str) -> int:
        idx = self._files.get(source)
        if idx is None:
            idx = self._files[source] = len(self._names)
            self._names.append(source)
        word, _, number = location.rpartition(" ")
        self._words.setdefault(idx, word or "record")
        try:
            n = int(number)
        except ValueError:
            n = 0
        return (idx << self.SHIFT) | n

    def describe(self, packed: int) -> tuple[str, str]:
        """(file, 'line N' / 'row N') of a packed location."""
        idx = packed >> self.SHIFT
        return self._names[idx], f"{self._words.get(idx, 'record')} {packed & ((1 << self.SHIFT) - 1)}"

    def add(self, source: str, ids: Sequence[str], locations: Sequence[str]) -> list[tuple[int, int]]:
        """Register a batch's ids; returns (index in batch, packed first location) of every repeat.

        The first occurrence wins; repeats are not registered.
        """
        n = len(ids)
        if n == 0:
            return []
        h = np.fromiter(map(hash, ids), dtype=np.int64, count=n)
        locs = np.fromiter((self._loc(source, loc) for loc in locations), dtype=np.int64, count=n)
        first = np.full(n, -1, dtype=np.int64)
        seen = np.zeros(n, dtype=bool)
        for rh, rl in self._runs:
            pos = np.minimum(np.searchsorted(rh, h), len(rh) - 1)
            hit = (rh[pos] == h) & ~seen
            first[hit] = rl[pos[hit]]
            seen |= hit
        order = np.argsort(h, kind="stable")
        hs = h[order]
        starts = np.ones(n, dtype=bool)
        starts[1:] = hs[1:] != hs[:-1]
        group_first = order[np.maximum.accumulate(np.where(starts, np.arange(n), 0))]
        first_index = np.empty(n, dtype=np.int64)
        first_index[order] = group_first
        within = first_index != np.arange(n)
        newly = within & ~seen
        first[newly] = locs[first_index[newly]]
        repeat = seen | within
        keep = ~repeat
        if keep.any():
            kh, kl = h[keep], locs[keep]
            o = np.argsort(kh, kind="stable")
            self._runs.append((kh[o], kl[o]))
            while len(self._runs) > 1 and len(self._runs[-2][0]) <= 2 * len(self._runs[-1][0]):
                (ah, al), (bh, bl) = self._runs.pop(), self._runs.pop()
                mh, ml = np.concatenate([bh, ah]), np.concatenate([bl, al])
                o = np.argsort(mh, kind="stable")
                self._runs.append((mh[o], ml[o]))
        return [(int(i), int(first[i])) for i in np.nonzero(repeat)[0]]


# --------------------------------------------------------------------------------------------------
# Work items


def subset(batch: Any, idx: np.ndarray) -> Any:
    """The rows `idx` of an input batch, as a batch."""
    from embedcli.io.readers import InputBatch

    if len(idx) == len(batch):
        return batch
    il = idx.tolist()
    return InputBatch(
        source=batch.source,
        locations=[batch.locations[i] for i in il],
        ids=[batch.ids[i] for i in il],
        texts=[batch.texts[i] for i in il],
        columns={c: [v[i] for i in il] for c, v in batch.columns.items()},
        extra_texts={c: [v[i] for i in il] for c, v in batch.extra_texts.items()},
    )


def _slice(batch: Any, start: int, stop: int | None = None) -> Any:
    n = len(batch)
    return subset(batch, np.arange(start, n if stop is None else stop))


@dataclass
class _Work:
    records: int
    batch: Any = None
    compute: Any = None
    compute_idx: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    carry_idx: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    carry_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    keys: np.ndarray | None = None
    errors: list[InputError] = field(default_factory=list)


class TooManyErrors(InputError):
    """More bad rows than `--max-errors` allows (exit 1)."""


# --------------------------------------------------------------------------------------------------
# Sinks


class _StdoutSink:
    """Rows straight to stdout (`-o -`): no staging, nothing to resume."""

    def __init__(self, fmt: str | None, meta: dict[str, str]) -> None:
        self.fmt = fmt
        self.meta = meta
        self.writer: Any = None
        self.schema: Any = None
        self.errors: list[dict[str, Any]] = []
        self.rows = 0
        self.pending_rows = 0

    def write(self, table: Any, keys: np.ndarray | None) -> None:
        from embedcli.io.writers import open_writer

        if self.writer is None:
            self.schema = table.schema
            self.writer = open_writer(STDIN, table.schema, self.meta, fmt=self.fmt)
        elif not table.schema.equals(self.schema, check_metadata=False):
            table = table.select(self.schema.names).cast(self.schema)
        self.writer.write(table)
        self.rows += table.num_rows

    def add_errors(self, records: list[dict[str, Any]]) -> None:
        self.errors.extend(records)

    @property
    def pending_errors(self) -> list[dict[str, Any]]:
        return []

    def commit(self, records_end: int) -> None:
        sys.stdout.flush()

    def abort(self) -> None:
        pass

    def finish(self, empty: Any) -> None:
        from embedcli.io.writers import open_writer

        if self.writer is None:
            self.writer = open_writer(STDIN, empty.schema, self.meta, fmt=self.fmt)
        self.writer.commit()


# --------------------------------------------------------------------------------------------------
# The pipeline


@dataclass
class _Target:
    mode: str  # "stdout" | "file" | "dir"
    path: str
    fmt: str


def _target(path: str, fmt: str | None, settings: RunSettings) -> _Target:
    from embedcli.io.manifest import manifest_path, strip_slash
    from embedcli.io.writers import check_output_path, output_format
    from embedcli.jobs import UsageError

    if path == STDIN:
        if settings.shards_dir:
            raise UsageError("--shards-dir needs a directory for -o, not - (stdout)")
        if settings.incremental and not settings.previous:
            raise UsageError("--incremental with -o - (stdout) needs --previous OLD_OUTPUT")
        return _Target("stdout", STDIN, output_format(STDIN, fmt))
    as_dir = (
        settings.shards_dir
        or path.endswith(("/", os.sep))
        or (os.path.isdir(path) and os.path.isfile(manifest_path(path)))
    )
    if as_dir:
        if fmt is not None and output_format("x.parquet", fmt) != "parquet":
            raise UsageError(f"a directory of shards is Parquet; --output-format {fmt} needs a file name for -o")
        out = os.path.abspath(strip_slash(path))
        if os.path.exists(out) and not os.path.isdir(out):
            raise OutputError(path, "exists and is not a directory", fix="name a directory for --shards-dir")
        check_output_path(os.path.join(os.path.dirname(out), "x"))
        return _Target("dir", out, "parquet")
    check_output_path(path)
    return _Target("file", path, output_format(path, fmt))


def _describe_config_change(old: dict[str, str], new: dict[str, str]) -> str:
    from embedcli.io.manifest import KEY_CONFIG, KEY_INPUT_OPTIONS, KEY_MODEL

    parts = []
    for key, label in ((KEY_MODEL, "model hash"), (KEY_CONFIG, "config hash"), (KEY_INPUT_OPTIONS, "input options")):
        if old.get(key) != new.get(key):
            parts.append(f"{label} {old.get(key)} → now {new.get(key)}")
    if old.get("embedcli.model") != new.get("embedcli.model"):
        parts.insert(0, f"model {old.get('embedcli.model')} → now {new.get('embedcli.model')}")
    return "; ".join(parts) or "output format or options differ"


class Pipeline:
    """One run of `run_rows` (see the module docstring)."""

    def __init__(
        self,
        batches: Iterable[Any],
        runner: Any,
        output: Any,
        meta: dict[str, str],
        to_inputs: Callable[[Any], Sequence[Any]],
        to_table: Callable[[Any, Any], Any],
        empty_table: Callable[[], Any],
        settings: RunSettings | None = None,
    ) -> None:
        self.batches = batches
        self.source = batches if isinstance(batches, BatchSource) else None
        self.runner = runner
        self.output = output
        self.meta = dict(meta)
        self.to_inputs = to_inputs
        self.to_table = to_table
        self.empty_table = empty_table
        self.settings = (settings or current_settings()).check()
        self.started = time.perf_counter()
        self.seconds = {"read": 0.0, "write": 0.0, "finalize": 0.0}
        self.computed_rows = 0
        self.carried_rows = 0
        self.new_errors = 0
        self.shown_errors = 0
        self.resumed_records = 0
        self.records_done = 0
        self.total: int | None = None
        self.progress: Any = None
        self.previous: Any = None
        self.manifest: Any = None
        self.store: Any = None
        self.exit_code: int | None = None
        self.error: str | None = None
        self.stdout_sink: _StdoutSink | None = None

    # -- helpers -----------------------------------------------------------------------------------
    def note(self, message: str) -> None:
        if self.progress is not None:
            self.progress.note(message)
        elif not self.output.quiet:
            print(f"embedcli: {message}", file=sys.stderr, flush=True)

    def _keep_names(self) -> list[str]:
        return list(self.source.inputs.keep_cols) if self.source else []

    # -- entry point -------------------------------------------------------------------------------
    def run(self) -> int:
        from embedcli.io.manifest import (
            KEY_CONFIG_KEY,
            KEY_INPUT_OPTIONS,
            KEY_INPUTS,
            KEY_JOB,
            config_key,
            job_key,
        )

        target = _target(self.output.path, self.output.fmt, self.settings)
        paths: list[str] | None = None
        fingerprints = None
        options: dict[str, Any] = {}
        if self.source is not None:
            paths = self.source.paths()
            fingerprints = self.source.fingerprints(paths)
            if fingerprints is None and target.mode != "stdout":
                self.note("an input is stdin, a pipe or a FIFO, read once: this run cannot resume if interrupted")
            options = self.source.options()
            self.total = self.source.total_rows(paths)
        self.paths = paths
        self.target = target
        self.cfg_key = config_key(self.meta, options, target.fmt if target.mode != "dir" else "parquet-dir")
        self.job_key = job_key(self.cfg_key, fingerprints)
        self.fingerprints = fingerprints
        self.options = options
        self.base_meta = {
            **self.meta,
            KEY_CONFIG_KEY: self.cfg_key,
            KEY_JOB: self.job_key or "",
            KEY_INPUTS: json.dumps(fingerprints, sort_keys=True) if fingerprints is not None else "null",
            KEY_INPUT_OPTIONS: json.dumps(options, sort_keys=True),
        }
        try:
            if target.mode == "stdout":
                code = self._run_stdout()
            else:
                code = self._run_staged()
            self.exit_code = code
            return code
        except KeyboardInterrupt:
            self.exit_code = 130
            raise
        except BaseException as e:
            self.exit_code = 2 if type(e).__name__ == "UsageError" else 1
            self.error = str(e)
            raise
        finally:
            if self.previous is not None:
                self.previous.close()
            self._write_stats()

    # -- stdout --------------------------------------------------------------------------------------
    def _run_stdout(self) -> int:
        sink = self.stdout_sink = _StdoutSink(self.target.fmt, self.base_meta)
        self.previous = self._open_previous(None, None)
        fatal: list[dict[str, Any]] = []
        try:
            self._loop(sink, skip=0)
        except InputError as e:
            if e.location or e.record_id is not None:
                fatal.append(e.to_record())
            raise
        finally:
            self._write_errors_file([*sink.errors, *fatal])
        sink.finish(self.empty_table())
        self._summary(self.new_errors, sink.rows)
        return 3 if self.new_errors else 0

    # -- staged ----------------------------------------------------------------------------------
    def _run_staged(self) -> int:
        from embedcli.io.manifest import Manifest, StagingLock, make_staging_dir, output_metadata, staging_dir
        from embedcli.io.shards import ShardStore, clear_dir, recover_dir, remove_tmp_files

        target, settings = self.target, self.settings
        root = staging_dir(target.path)
        self.root = root
        if target.mode == "dir":
            recover_dir(target.path, root)
        created_root = make_staging_dir(root, target.path)  # refuses a symlink planted at the staging path
        lock = StagingLock(root, target.path).acquire()
        created_manifest = False
        try:
            existing = output_metadata(target.path, None if target.mode == "dir" else self.output.fmt)
            if existing is not None and not settings.overwrite:
                if self._config_differs(existing):
                    raise self._usage(
                        f"{target.path} was made with a different config ({_describe_config_change(existing, self.base_meta)}); "
                        "pass --overwrite to replace it, or choose another -o"
                    )
                if self._complete_for_this_job(existing):
                    return self._already_complete(existing, root, lock)
            elif existing is None and target.mode == "dir" and os.path.isdir(target.path):
                if os.listdir(target.path) and not settings.overwrite:
                    raise self._usage(
                        f"{target.path} is a directory that embedcli did not write; pass --overwrite to replace it, "
                        "or choose another -o"
                    )
            manifest = Manifest.load(root)
            if manifest is not None:
                if manifest.config_key != self.cfg_key and not settings.overwrite:
                    raise self._usage(
                        f"{root} holds the work of an interrupted run with a different config "
                        f"({_describe_config_change(manifest.metadata or manifest.config, self.base_meta)}); "
                        "rerun that command to finish it, or pass --overwrite to discard it"
                    )
                if settings.overwrite or self.job_key is None or manifest.job_key != self.job_key or manifest.complete:
                    if not settings.overwrite and manifest.records_done and manifest.job_key != self.job_key:
                        self.note("the inputs changed since the interrupted run: starting over")
                    clear_dir(root)
                    manifest = None
            elif os.listdir(root):
                clear_dir(root)
            if manifest is None:
                manifest = Manifest(
                    config_key=self.cfg_key,
                    job_key=self.job_key,
                    config=self.meta,
                    input_options=self.options,
                    inputs=self.fingerprints,
                    output_format=target.fmt,
                    mode=target.mode,
                )
                manifest.save(root)
                created_manifest = True
            self.manifest = manifest
            store = self.store = ShardStore(root, manifest, self.meta, target.path)
            store.clean_stale()
            if target.mode == "file":
                remove_tmp_files(os.path.dirname(os.path.abspath(target.path)), os.path.basename(target.path))
            self.previous = self._open_previous(target.path if existing is not None else None, existing)
            if manifest.records_done:
                self.note(
                    f"resuming: {manifest.records_done:,} input rows already committed in {len(manifest.shards)} shards"
                )
            fatal: list[dict[str, Any]] = []
            try:
                self._loop(store, skip=manifest.records_done)
            except InputError as e:
                if e.location or e.record_id is not None:
                    fatal.append(e.to_record())
                raise
            finally:
                self._write_errors_file([*store.committed_errors(), *store.pending_errors, *fatal])
            return self._finish(store, lock)
        except BaseException:
            lock.release()
            fresh = self.manifest is None or (created_manifest and not self.manifest.shards)
            if fresh and (created_root or created_manifest):
                shutil.rmtree(root, ignore_errors=True)
            raise
        finally:
            lock.release()

    def _usage(self, message: str) -> Exception:
        from embedcli.jobs import UsageError

        return UsageError(message)

    def _config_differs(self, existing: dict[str, str]) -> bool:
        from embedcli.io.manifest import KEY_CONFIG, KEY_CONFIG_KEY, KEY_MODEL

        if existing.get(KEY_CONFIG_KEY):
            return existing[KEY_CONFIG_KEY] != self.cfg_key
        return existing.get(KEY_CONFIG) != self.meta.get(KEY_CONFIG) or existing.get(KEY_MODEL) != self.meta.get(KEY_MODEL)

    def _complete_for_this_job(self, existing: dict[str, str]) -> bool:
        from embedcli.io.manifest import KEY_COMPLETE, KEY_JOB

        return bool(self.job_key) and existing.get(KEY_JOB) == self.job_key and existing.get(KEY_COMPLETE) == "true"

    def _already_complete(self, existing: dict[str, str], root: str, lock: Any) -> int:
        from embedcli.io.manifest import KEY_ROWS, KEY_SKIPPED, Manifest

        staged = Manifest.load(root)
        if staged is None or staged.job_key == self.job_key:
            lock.release()
            shutil.rmtree(root, ignore_errors=True)
        skipped = int(existing.get(KEY_SKIPPED, "0") or 0)
        rows = existing.get(KEY_ROWS, "?")
        self.note(f"{self.target.path} is already complete ({rows} rows, same inputs and config): nothing to do")
        self.records_done = int(existing.get("embedcli.input_records", "0") or 0)
        self.resumed_records = self.records_done
        self._final_rows = int(rows) if str(rows).isdigit() else 0
        self._final_skipped = skipped
        return 3 if skipped else 0

    # -- incremental ---------------------------------------------------------------------------------
    def _open_previous(self, in_place: str | None, existing: dict[str, str] | None) -> Any:
        from embedcli.io.manifest import KEY_CONFIG, KEY_MODEL, output_metadata
        from embedcli.io.shards import PreviousOutput
        from embedcli.io.writers import output_format

        settings = self.settings
        if not settings.incremental:
            return None
        path = settings.previous or in_place
        if path is None:
            self.note("--incremental: no previous output yet, computing every row")
            return None
        if settings.previous is None and existing is None:
            self.note(f"--incremental: {path} has no embedcli metadata, computing every row")
            return None
        if not os.path.isdir(path) and os.path.exists(path) and output_format(path, None, reading=True) != "parquet":
            self.note(f"--incremental carries rows over from Parquet outputs only; {path} is not: computing every row")
            return None
        meta = output_metadata(path) if os.path.exists(path) else None
        if meta is not None and (meta.get(KEY_CONFIG) != self.meta.get(KEY_CONFIG) or meta.get(KEY_MODEL) != self.meta.get(KEY_MODEL)):
            if settings.overwrite:
                self.note(f"--incremental: {path} was made with a different config; --overwrite: computing every row")
                return None
            raise self._usage(
                f"--incremental: {path} was made with a different config ({_describe_config_change(meta, self.base_meta)}); "
                "its rows cannot be carried over. Pass --overwrite to compute every row"
            )
        previous = PreviousOutput.open(path)
        if not previous.keys_ok:
            self.note(f"--incremental: {path} has no valid row index ({os.path.basename(path)}.embedcli-index.parquet): computing every row")
            previous.close()
            return None
        return previous

    # -- the loop ------------------------------------------------------------------------------------
    def _work(self, skip: int, errors_before: int) -> Iterator[_Work]:
        """Read, check and split batches (runs in the runner's prefetch thread).

        A work item accounts for the bad rows the reader reported while reading its batch plus the
        batch's records; `skip` records (committed by an earlier run) are read and dropped, never
        computed. Ids of dropped records still count for duplicate detection.
        """
        settings = self.settings
        pending: list[InputError] = []  # filled by the reader under --on-error skip
        skip_mode = settings.on_error == "skip"
        if self.source is not None:
            batch_rows = min(self.source.inputs.batch_rows, settings.shard_rows)
            reader = self.source.open(self.paths, batch_rows=batch_rows, on_bad_row=pending.append if skip_mode else None)
        else:
            reader = iter(self.batches)
        ids = IdSet()
        skip_left = skip
        errors_total = errors_before
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(reader)
            except StopIteration:
                self.seconds["read"] += time.perf_counter() - t0
                break
            self.seconds["read"] += time.perf_counter() - t0
            if skip_left:
                reported = min(len(pending), skip_left)
                del pending[:reported]
                skip_left -= reported
                n = len(batch)
                head = batch if n <= skip_left else _slice(batch, 0, skip_left)
                if len(head):
                    valid = self._valid(head)
                    ids.add(head.source, [head.ids[i] for i in valid], [head.locations[i] for i in valid])
                skip_left -= len(head)
                if n == len(head):
                    continue
                batch = _slice(batch, len(head))
            reported = list(pending)
            pending.clear()
            work = self._check(batch, ids, reported, skip_mode)
            errors_total += len(work.errors)
            self._check_max(work.errors, errors_total)
            self._split(work)
            yield work
        if skip_left:
            del pending[: min(len(pending), skip_left)]
        if pending:
            errors_total += len(pending)
            self._check_max(pending, errors_total)
            yield _Work(records=len(pending), errors=list(pending))

    def _check_max(self, errors: list[InputError], total: int) -> None:
        limit = self.settings.max_errors
        if limit is None or total <= limit or not errors:
            return
        last = errors[-1]
        raise TooManyErrors(
            last.path,
            f"more than {limit} bad rows (--max-errors {limit}); the last: {last.reason}",
            location=last.location,
            record_id=last.record_id,
            fix="fix the input, or raise --max-errors; the rows committed so far are kept",
        )

    def _valid(self, batch: Any) -> list[int]:
        extra = list(batch.extra_texts.values())
        return [
            i for i, t in enumerate(batch.texts) if t is not None and all(col[i] is not None for col in extra)
        ]

    def _check(self, batch: Any, ids: IdSet, pending: list[InputError], skip_mode: bool) -> _Work:
        """Row errors of a batch (null text, repeated id); fail mode raises the first."""
        errors = list(pending)
        n = len(batch)
        valid = self._valid(batch)
        if len(valid) < n:
            good = set(valid)
            for i in range(n):
                if i in good:
                    continue
                col = "text" if batch.texts[i] is None else next(
                    c for c, v in batch.extra_texts.items() if v[i] is None
                )
                err = InputError(
                    batch.source,
                    f"{col} is null" if col == "text" else f"text field {col!r} is null",
                    location=batch.locations[i],
                    record_id=batch.ids[i],
                    fix="fill in the text or drop the row (or pass --on-error skip)",
                )
                if not skip_mode:
                    raise err
                errors.append(err)
        repeats = ids.add(batch.source, [batch.ids[i] for i in valid], [batch.locations[i] for i in valid])
        drop = set()
        for j, packed in repeats:
            i = valid[j]
            first_file, first_where = ids.describe(packed)
            from embedcli.io.errors import display_path

            err = InputError(
                batch.source,
                f"duplicate id {batch.ids[i]!r}: first seen at {display_path(first_file)} {first_where}",
                location=batch.locations[i],
                record_id=batch.ids[i],
                fix="give every row a unique id (or pass --on-error skip to keep the first and skip the rest)",
            )
            if not skip_mode:
                raise err
            errors.append(err)
            drop.add(i)
        keep = np.asarray([i for i in valid if i not in drop], dtype=np.int64)
        return _Work(records=len(pending) + n, batch=subset(batch, keep), errors=errors)

    def _split(self, work: _Work) -> None:
        """Keys of the valid rows; which to compute and which to carry over from the previous output."""
        from embedcli.io.shards import row_keys

        b = work.batch
        work.keys = row_keys(b.ids, b.texts, b.extra_texts)
        n = len(b)
        if self.previous is None or n == 0:
            work.compute = b
            work.compute_idx = np.arange(n, dtype=np.int64)
            return
        prev_rows = self.previous.lookup(work.keys)
        hit = prev_rows >= 0
        work.compute_idx = np.nonzero(~hit)[0]
        work.carry_idx = np.nonzero(hit)[0]
        work.carry_rows = prev_rows[hit]
        work.compute = subset(b, work.compute_idx)

    def _carried(self, work: _Work) -> Any:
        import pyarrow as pa

        from embedcli.jobs import kept_columns

        prev = self.previous
        keep = self._keep_names()
        drop = {"id", *prev.keep_cols, *keep}
        result_cols = [c for c in prev.schema.names if c not in drop]
        sub = subset(work.batch, work.carry_idx)
        taken = prev.take(work.carry_rows, result_cols)
        columns: dict[str, Any] = {"id": pa.array(sub.ids, pa.string())}
        for c in result_cols:
            columns[c] = taken.column(c)
        columns.update(kept_columns(sub, keep))
        return pa.table(columns)

    def _table(self, work: _Work, result: Any) -> Any:
        import pyarrow as pa

        n_carry = len(work.carry_idx)
        computed = None
        if len(work.compute_idx) or not n_carry:
            computed = self.to_table(work.compute, result)
            if self.previous is not None and computed.num_rows != len(work.compute):
                raise self._usage("--incremental needs one output row per input row; this command does not give that")
        if not n_carry:
            return computed
        carried = self._carried(work)
        self.carried_rows += n_carry
        if computed is None or computed.num_rows == 0:
            return carried
        carried = carried.select(computed.column_names).cast(computed.schema)
        both = pa.concat_tables([computed.replace_schema_metadata(None), carried.replace_schema_metadata(None)])
        position = np.empty(len(work.batch), dtype=np.int64)
        position[work.compute_idx] = np.arange(len(work.compute_idx))
        position[work.carry_idx] = len(work.compute_idx) + np.arange(n_carry)
        return both.take(pa.array(position)).combine_chunks()

    def _record_errors(self, sink: Any, errors: list[InputError]) -> None:
        if not errors:
            return
        self.new_errors += len(errors)
        sink.add_errors([e.to_record() for e in errors])
        for e in errors:
            if self.shown_errors < ERRORS_SHOWN:
                self.note(f"skipped: {e}")
            elif self.shown_errors == ERRORS_SHOWN:
                self.note("skipped more bad rows (not shown); see --errors-file / --stats")
            self.shown_errors += 1

    def _loop(self, sink: Any, skip: int) -> None:
        from embedcli.progress import Progress
        from embedcli.signals import StopFlag

        self.resumed_records = skip
        self.records_done = skip
        errors_before = self.manifest.errors if self.manifest is not None else 0
        self.progress = Progress(
            self.total, initial=skip, quiet=self.output.quiet, log_every=self.settings.log_every
        )
        held: deque[_Work] = deque()

        def inputs() -> Iterator[Sequence[Any]]:
            for work in self._work(skip, errors_before):
                held.append(work)
                yield self.to_inputs(work.compute) if work.compute is not None else []

        last_commit = time.monotonic()
        since_commit = 0
        in_write = False
        results = self.runner.map(inputs())
        try:
            with StopFlag() as stop:
                for result in results:
                    work = held.popleft()
                    if work.batch is not None and len(work.batch):
                        table = self._table(work, result)
                        self.computed_rows += len(work.compute_idx)
                        t0 = time.perf_counter()
                        in_write = True
                        sink.write(table, work.keys if table.num_rows == len(work.batch) else None)
                        in_write = False
                        self.seconds["write"] += time.perf_counter() - t0
                    self._record_errors(sink, work.errors)
                    self.records_done += work.records
                    since_commit += work.records
                    self.progress.update(work.records, self.runner.stats.tokens)
                    if stop.requested:
                        self._commit(sink)
                        self.progress.close(
                            f"stopped by {stop.signal_name}: {self.records_done:,} input rows committed; "
                            "rerun the same command to resume"
                        )
                        raise KeyboardInterrupt(stop.signal_name)
                    now = time.monotonic()
                    if since_commit >= self.settings.shard_rows or now - last_commit >= self.settings.commit_every:
                        self._commit(sink)
                        last_commit, since_commit = now, 0
                self._commit(sink)
        except KeyboardInterrupt:
            if in_write:
                sink.abort()
            else:
                self._commit_quietly(sink)
            raise
        except (OutputError, OSError):
            sink.abort()
            raise
        except BaseException:
            if in_write:
                sink.abort()
            else:
                self._commit_quietly(sink)
            raise
        finally:
            results.close()
            if self.progress is not None:
                self.progress.close()

    def _commit(self, sink: Any) -> None:
        t0 = time.perf_counter()
        sink.commit(self.records_done)
        self.seconds["write"] += time.perf_counter() - t0

    def _commit_quietly(self, sink: Any) -> None:
        """Commit finished batches on the way out of a failure; a failing commit is dropped."""
        try:
            sink.commit(self.records_done)
        except Exception:
            sink.abort()

    # -- the end -------------------------------------------------------------------------------------
    def _final_meta(self) -> dict[str, str]:
        from embedcli.io.manifest import KEY_ERRORS, KEY_RECORDS, KEY_ROWS, KEY_SKIPPED

        m = self.manifest
        first = []
        for record in self.store.committed_errors():
            first.append(record)
            if len(first) >= ERRORS_IN_METADATA:
                break
        return {
            **self.base_meta,
            KEY_ROWS: str(m.rows_done),
            KEY_RECORDS: str(m.records_done),
            KEY_SKIPPED: str(m.errors),
            KEY_ERRORS: json.dumps(first, ensure_ascii=False, sort_keys=True),
        }

    def _finish(self, store: Any, lock: Any) -> int:
        from embedcli.io.shards import assemble_file, publish_dir

        t0 = time.perf_counter()
        manifest = self.manifest
        meta = self._final_meta()
        if self.target.mode == "file":
            assemble_file(self.root, manifest, self.target.path, self.output.fmt, meta, self.empty_table().schema)
            lock.release()
            shutil.rmtree(self.root, ignore_errors=True)
        else:
            lock.release()
            publish_dir(self.root, manifest, self.target.path, meta)
        self.seconds["finalize"] += time.perf_counter() - t0
        self._final_rows = manifest.rows_done
        self._final_skipped = manifest.errors
        self._summary(manifest.errors, manifest.rows_done)
        return 3 if manifest.errors else 0

    def _summary(self, skipped: int, rows: int) -> None:
        stats = self.runner.stats
        if stats.truncated_rows:
            self.note(f"{stats.truncated_rows} of {stats.rows} rows were truncated to {self.runner.max_length} tokens")
        if skipped:
            where = f"see {self.settings.errors_file}" if self.settings.errors_file else "pass --errors-file FILE to list them"
            self.note(f"{skipped:,} bad input rows were skipped ({where}); exit code 3")
        elapsed = time.perf_counter() - self.started
        parts = [f"{rows:,} rows written", f"{self.computed_rows:,} computed"]
        if self.carried_rows:
            parts.append(f"{self.carried_rows:,} carried over")
        if self.resumed_records:
            parts.append(f"{self.resumed_records:,} resumed")
        self.note(f"done: {', '.join(parts)} in {elapsed:.1f}s")

    def _write_errors_file(self, records: Iterable[dict[str, Any]]) -> None:
        if not self.settings.errors_file:
            return
        from embedcli.io.manifest import write_atomic

        data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
        try:
            write_atomic(self.settings.errors_file, data.encode("utf-8"))
        except OSError as e:
            self.note(f"cannot write --errors-file {self.settings.errors_file}: {e.strerror or e}")

    def _write_stats(self) -> None:
        path = self.output.stats_file
        if not path:
            return
        from embedcli.jobs import peak_rss_mb

        stats = self.runner.stats
        runner_seconds = stats.to_dict()["seconds"]
        m = self.manifest
        rows = getattr(self, "_final_rows", None)
        if rows is None:
            rows = m.rows_done if m is not None else (self.stdout_sink.rows if self.stdout_sink else 0)
        skipped = getattr(self, "_final_skipped", None)
        if skipped is None:
            skipped = m.errors if m is not None else self.new_errors
        report = {
            "rows": rows,
            "input_rows": self.records_done,
            "computed_rows": self.computed_rows,
            "carried_rows": self.carried_rows,
            "skipped_rows": skipped,
            "resumed_rows": self.resumed_records,
            "tokens": stats.tokens,
            "forwards": stats.forwards,
            "truncated_rows": stats.truncated_rows,
            "chunked_rows": stats.chunked_rows,
            "sliced_rows": getattr(stats, "sliced_rows", 0),
            "solo_rows": getattr(stats, "solo_rows", 0),
            "shards": len(m.shards) if m is not None else 0,
            "seconds": {
                "read": round(self.seconds["read"], 4),
                **runner_seconds,
                "write": round(self.seconds["write"], 4),
                "finalize": round(self.seconds["finalize"], 4),
                "total": round(time.perf_counter() - self.started, 4),
            },
            "peak_rss_mb": peak_rss_mb(),
            "exit_code": self.exit_code,
        }
        if self.error:
            report["error"] = self.error
        try:
            with open(path, "w", encoding="utf-8") as f:
                json.dump(report, f, indent=2)
        except OSError as e:
            print(f"embedcli: cannot write --stats {path}: {e.strerror or e}", file=sys.stderr)


def run_pipeline(
    batches: Iterable[Any],
    runner: Any,
    output: Any,
    meta: dict[str, str],
    to_inputs: Callable[[Any], Sequence[Any]],
    to_table: Callable[[Any, Any], Any],
    empty_table: Callable[[], Any],
    settings: RunSettings | None = None,
) -> int:
    """Run the shared loop with the current (or given) settings; returns the exit code (0 or 3)."""
    return Pipeline(batches, runner, output, meta, to_inputs, to_table, empty_table, settings).run()
