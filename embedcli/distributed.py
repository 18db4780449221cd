"""Where `run_rows` picks the engine and the records: `--engine ray`, `--shard K/N`, and shard repair.

Every compute command's loop (`embedcli.jobs.run_rows`) comes through `run_distributed`, which

1. with `--shard K/N`, restricts the input to that slice of the records (`embedcli.sharding`) and adds
   the shard keys to the output's metadata;
2. with `--engine ray`, swaps the local runner for `RayRunner` (same runner code inside Ray actors);
3. for a finished shard-directory output (`-o DIR/` or `--shards-dir`) whose manifest lists shard files
   that are gone, recomputes exactly those shards' record ranges and puts each back under its own
   deterministic name (`part-NNNNNN.parquet`) by rename; the other shards are not touched;
4. then runs the ordinary unattended loop (`embedcli.unattended.run_pipeline`): staging, manifest,
   commit by rename, resume, refusing to mix, bad rows, exit codes — the same for both engines.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

from embedcli.run_options import current_settings, use_settings


def run_distributed(
    batches: Iterable[Any],
    runner: Any,
    output: Any,
    meta: dict[str, str],
    to_inputs: Callable[[Any], Sequence[Any]],
    to_table: Callable[[Any, Any], Any],
    empty_table: Callable[[], Any],
) -> int:
    """`run_rows` with the Distributed flags applied (see the module docstring); returns the exit code."""
    from embedcli.unattended import run_pipeline

    settings = current_settings()
    if settings.shard is not None:
        from embedcli.sharding import shard_source

        batches, shard_meta = shard_source(batches, settings.shard)
        meta = {**meta, **shard_meta}
    if settings.engine == "ray":
        from embedcli.engines.ray_engine import ray_runner

        runner = ray_runner(runner, settings)
    repair_missing_shards(batches, runner, output, meta, to_inputs, to_table, empty_table)
    return run_pipeline(batches, runner, output, meta, to_inputs, to_table, empty_table)


def _note(output: Any, message: str) -> None:
    if not getattr(output, "quiet", False):
        print(f"embedcli: {message}", file=sys.stderr, flush=True)


def repair_missing_shards(
    batches: Iterable[Any],
    runner: Any,
    output: Any,
    meta: dict[str, str],
    to_inputs: Callable[[Any], Sequence[Any]],
    to_table: Callable[[Any, Any], Any],
    empty_table: Callable[[], Any],
) -> list[str]:
    """Recompute the shards a finished shard directory lists but lacks; returns the repaired file names.

    Only when the directory was made by this same job (config key and input fingerprints match): each
    missing shard's record range is run through the ordinary loop into a scratch directory next to the
    output, checked (same row count as the manifest says), and renamed into place under its own name.
    """
    from embedcli.io.manifest import Manifest, config_key, manifest_path, strip_slash
    from embedcli.io.shards import _errors_name, _index_name
    from embedcli.sharding import RangeSource
    from embedcli.unattended import BatchSource, run_pipeline

    settings = current_settings()
    path = output.path
    if path == "-" or not isinstance(batches, BatchSource) or settings.overwrite:
        return []
    out = os.path.abspath(strip_slash(path))
    if not os.path.isfile(manifest_path(out)):
        return []
    manifest = Manifest.load(out)
    if manifest is None or not manifest.complete:
        return []
    missing = [s for s in manifest.shards if s.file and not os.path.isfile(os.path.join(out, s.file))]
    if not missing:
        return []
    paths = batches.paths()
    if manifest.config_key != config_key(meta, batches.options(), "parquet-dir"):
        return []
    if manifest.inputs != batches.fingerprints(paths):
        return []
    base = batches.start if isinstance(batches, RangeSource) else 0
    scratch = out + ".embedcli-repair"
    repaired: list[str] = []
    for s in missing:
        lo, hi = s.records
        source = RangeSource(batches.inputs, batches.extra_text_cols, start=base + lo, stop=base + hi, label="repair")
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(scratch + ".embedcli-staging", ignore_errors=True)
        sub = replace(
            settings, shards_dir=True, overwrite=True, incremental=False, previous=None, shard=None,
            errors_file=None, shard_rows=max(1, hi - lo), commit_every=1e9,
        )
        sub_output = replace(output, path=scratch, stats_file=None, quiet=True)
        with use_settings(sub):
            run_pipeline(source, runner, sub_output, meta, to_inputs, to_table, empty_table)
        made = Manifest.load(scratch)
        if made is None or len(made.shards) != 1 or made.shards[0].rows != s.rows:
            rows = sum(x.rows for x in made.shards) if made else "?"
            shutil.rmtree(scratch, ignore_errors=True)
            from embedcli.io.errors import OutputError

            raise OutputError(
                path, f"shard {s.file} recomputed to {rows} rows, the manifest says {s.rows}",
                fix="the inputs may have changed: rerun with --overwrite",
            )
        new = made.shards[0]
        moves = [(new.file, s.file)]
        if s.index and new.index and not os.path.isfile(os.path.join(out, s.index)):
            moves.append((new.index, _index_name(s.number)))
        if s.errors_file and new.errors_file and not os.path.isfile(os.path.join(out, s.errors_file)):
            moves.append((new.errors_file, _errors_name(s.number)))
        for src, dst in moves:
            os.replace(os.path.join(scratch, src), os.path.join(out, dst))
        shutil.rmtree(scratch, ignore_errors=True)
        repaired.append(s.file)
        _note(output, f"repaired {s.file}: recomputed input records {lo:,}-{hi:,} ({s.rows:,} rows)")
    return repaired
