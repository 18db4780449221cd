"""A set of `--shard K/N` outputs: checking it is complete (`embedcli inspect A B C --check`) and joining
it in input order (`embedcli merge A B C -o ALL.parquet`).

A set is complete when every member is a complete output of the same job apart from its slice (same
model hash, config hash, input fingerprints and input options), all say the same N and number of cells,
and their cell ranges cover `[0, total)` exactly once. The merged file is what the unsharded run writes,
byte for byte (`embedcli.run.sharding`): its rows by range start in row groups of the same size, its
metadata (config and job keys, counts, output key) and its row index sidecar.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from embedcli.errors import UsageError
from embedcli.io.commit import arrow_source, unlink_quiet
from embedcli.io.location import refuse_output_urls, refuse_url
from embedcli.io.manifest import (
    INDEX_SUFFIX,
    KEY_COMPLETE,
    KEY_CONFIG,
    KEY_CONFIG_KEY,
    KEY_ERRORS,
    KEY_INPUT_OPTIONS,
    KEY_INPUTS,
    KEY_JOB,
    KEY_MODEL,
    KEY_OUTPUT,
    KEY_RECORDS,
    KEY_ROWS,
    KEY_SHARD,
    KEY_SHARD_RANGE,
    KEY_SHARD_TOTAL,
    KEY_SKIPPED,
    SHARD_KEYS,
    Manifest,
    config_key,
    job_key,
    manifest_path,
    output_metadata,
)
from embedcli.io.shards import (
    FINAL_ROW_GROUP_ROWS,
    INDEX_COLUMNS,
    INDEX_ROW_GROUP_ROWS,
    file_tables,
    index_digest,
    rechunk,
    write_index_sidecar,
)
from embedcli.io.units import KEY_UNITS, InputUnits, merged
from embedcli.io.writers import check_output_path, open_writer, output_format
from embedcli.run.ids import IdSet, id_hashes
from embedcli.run.incremental import describe_config_change
from embedcli.run.paths import check_foreign_file, check_no_clobber
from embedcli.tasks.inspect import inspect_output


def expand_members(paths: Sequence[str]) -> list[str]:
    """Outputs named by `paths`: files, globs, shard directories, or a plain directory of shard outputs."""
    out: list[str] = []
    for p in paths:
        matches = sorted(glob.glob(p)) if glob.has_magic(p) else [p]
        for m in matches:
            stripped = m.rstrip("/") or m
            if os.path.isdir(stripped) and not os.path.isfile(manifest_path(stripped)):
                names = sorted(os.listdir(stripped))
                out += [os.path.join(stripped, n) for n in names if n.endswith(".parquet") and not n.startswith((".", "_"))]
                out += [os.path.join(stripped, n) for n in names
                        if os.path.isfile(manifest_path(os.path.join(stripped, n)))]
            else:
                out.append(stripped)
    # A shell glob like out-*.parquet also matches the index sidecars (out-0.parquet.embedcli-index.parquet).
    return [m for m in out if not m.endswith(INDEX_SUFFIX)]


def is_set(paths: Sequence[str]) -> bool:
    """Whether `paths` name a set of outputs (several paths, a glob, a plain directory) rather than one."""
    if len(paths) != 1:
        return True
    p = paths[0].rstrip("/") or paths[0]
    if glob.has_magic(p):
        return True
    return os.path.isdir(p) and not os.path.isfile(manifest_path(p))


def _input_options(meta: dict[str, str]) -> dict[str, Any]:
    try:
        options = json.loads(meta.get(KEY_INPUT_OPTIONS, "{}"))
    except ValueError:
        return {}
    return {k: v for k, v in options.items() if k not in ("shard", "records", "cells")}


def inspect_set(paths: Sequence[str]) -> dict[str, Any]:
    """A report on a set of shard outputs: each member's own report plus the set's completeness."""
    refuse_output_urls("inspect", paths)
    members = expand_members(paths)
    report: dict[str, Any] = {"path": ", ".join(paths), "set": True, "members": [], "problems": [], "mixed": False}
    if not members:
        report["problems"].append("no outputs match")
    metas: list[tuple[str, dict[str, str]]] = []
    for m in members:
        r = inspect_output(m)
        report["members"].append({"path": m, "status": r["status"], "rows": r.get("rows"), "shard": None})
        for p in r["problems"]:
            report["problems"].append(f"{m}: {p}")
        meta = output_metadata(m) or {}
        report["members"][-1]["shard"] = meta.get(KEY_SHARD)
        if r["status"] == "mixed":
            report["mixed"] = True
        if KEY_SHARD not in meta:
            report["problems"].append(f"{m}: not a --shard K/N output (no {KEY_SHARD} metadata)")
            continue
        metas.append((m, meta))
    if metas:
        first = metas[0][1]
        same = (KEY_MODEL, KEY_CONFIG, KEY_INPUTS)
        for m, meta in metas[1:]:
            for key in same:
                if meta.get(key) != first.get(key):
                    report["mixed"] = True
                    report["problems"].append(f"{m}: {key} differs from {metas[0][0]}")
            if _input_options(meta) != _input_options(first):
                report["mixed"] = True
                report["problems"].append(f"{m}: input options differ from {metas[0][0]}")
        ns = {meta[KEY_SHARD].split("/")[1] for _, meta in metas}
        totals = {meta.get(KEY_SHARD_TOTAL) for _, meta in metas}
        if len(ns) > 1 or len(totals) > 1:
            report["mixed"] = True
            report["problems"].append(f"members were cut differently (N {sorted(ns)}, totals {sorted(map(str, totals))})")
        else:
            n, total = int(ns.pop()), int(totals.pop() or 0)
            ranges = sorted((tuple(map(int, meta[KEY_SHARD_RANGE].split(":"))), m) for m, meta in metas)
            pos = 0
            for (start, stop), m in ranges:
                if start > pos:
                    report["problems"].append(f"input cells {pos}-{start} are in no output (a shard is missing)")
                elif start < pos:
                    report["problems"].append(f"{m}: input cells {start}-{min(pos, stop)} are in another output too")
                pos = max(pos, stop)
            if pos < total:
                report["problems"].append(f"input cells {pos}-{total} are in no output (a shard is missing)")
            seen = sorted(int(meta[KEY_SHARD].split("/")[0]) for _, meta in metas)
            absent = sorted(set(range(n)) - set(seen))
            if absent:
                report["problems"].append(f"shards {', '.join(f'{k}/{n}' for k in absent)} are missing")
            report["shards"] = n
            report["cells"] = total
            report["input_rows"] = sum(int(meta.get(KEY_RECORDS, "0") or 0) for _, meta in metas)
        report["rows"] = sum(int(meta.get(KEY_ROWS, "0") or 0) for _, meta in metas)
        report["skipped_rows"] = sum(int(meta.get(KEY_SKIPPED, "0") or 0) for _, meta in metas)
        report["config_hash"] = first.get(KEY_CONFIG)
        report["model_hash"] = first.get(KEY_MODEL)
    report["complete"] = not report["problems"] and not report["mixed"]
    report["status"] = "mixed" if report["mixed"] else ("complete" if report["complete"] else "incomplete")
    return report


def format_set_report(report: dict[str, Any]) -> list[tuple[str, str]]:
    """The set report as (key, value) lines."""
    lines = [("set", report["path"]), ("status", report["status"])]
    for key in ("shards", "rows", "input_rows", "skipped_rows", "config_hash", "model_hash"):
        if report.get(key) is not None:
            lines.append((key, str(report[key])))
    for m in report["members"]:
        lines.append(("member", f"{m['path']} shard {m['shard']}: {m['status']}, {m['rows']} rows"))
    for p in report["problems"]:
        lines.append(("problem", p))
    return lines


def _data_files(path: str) -> list[str]:
    if os.path.isdir(path):
        manifest = Manifest.load(path)
        assert manifest is not None
        return [os.path.join(path, s.file) for s in manifest.shards if s.file]
    return [path]


def _index_files(path: str, meta: dict[str, str]) -> list[str] | None:
    """A member's row index files (its sidecar, or a shard directory's index files); None when it has none."""
    if os.path.isdir(path):
        manifest = Manifest.load(path)
        if manifest is None or not manifest.indexed:
            return None
        return [os.path.join(path, s.index) for s in manifest.shards if s.index]
    sidecar = path + INDEX_SUFFIX
    try:
        tag = (pq.read_schema(arrow_source(sidecar)).metadata or {}).get(KEY_OUTPUT.encode(), b"").decode()
    except (pa.ArrowException, OSError):
        return None
    return [sidecar] if tag and tag == meta.get(KEY_OUTPUT) else None


def _units_of(path: str) -> InputUnits:
    """A member's input units (sidecar metadata, or a shard directory's manifest)."""
    if os.path.isdir(path):
        manifest = Manifest.load(path)
        return InputUnits.from_json(manifest.units if manifest is not None else None)
    try:
        md = pq.read_schema(arrow_source(path + INDEX_SUFFIX)).metadata or {}
    except (pa.ArrowException, OSError):
        return InputUnits()
    return InputUnits.from_json(md.get(KEY_UNITS.encode(), b"").decode() or None)


def _check_existing(output: str, fmt: str | None, meta: dict[str, str], force: bool) -> None:
    """The rule of every command's -o: an output of another config, or a file embedcli never wrote, is not
    replaced (exit 2) unless `force`."""
    if force:
        return
    existing = output_metadata(output, fmt)
    if existing is None:
        check_foreign_file(output)
    elif existing.get(KEY_CONFIG) != meta.get(KEY_CONFIG) or existing.get(KEY_MODEL) != meta.get(KEY_MODEL):
        raise UsageError(f"{output} was made with a different config ({describe_config_change(existing, meta)}); "
                         "pass --force to replace it, or choose another -o")


def whole_run_metadata(metas: list[dict[str, str]], output_format: str) -> dict[str, str]:
    """The metadata the unsharded run writes, from its slices' (in order): the provenance without the shard
    keys, the whole run's config and job keys, input options, and the counts added up."""
    first = metas[0]
    provenance: dict[str, str] = {}
    for k, v in first.items():
        if k == KEY_CONFIG_KEY:
            break
        if k not in SHARD_KEYS:
            provenance[k] = v
    options = _input_options(first)
    cfg = config_key(provenance, options, output_format)
    try:
        fingerprints = json.loads(first.get(KEY_INPUTS, "null"))
    except ValueError:
        fingerprints = None
    errors: list[Any] = []
    for m in metas:
        try:
            errors += json.loads(m.get(KEY_ERRORS, "[]"))
        except ValueError:
            pass
    return {
        **provenance,
        KEY_CONFIG_KEY: cfg,
        KEY_JOB: job_key(cfg, fingerprints) or "",
        KEY_INPUTS: first.get(KEY_INPUTS, "null"),
        KEY_INPUT_OPTIONS: json.dumps(options, sort_keys=True),
        KEY_ROWS: str(sum(int(m.get(KEY_ROWS, "0") or 0) for m in metas)),
        KEY_RECORDS: str(sum(int(m.get(KEY_RECORDS, "0") or 0) for m in metas)),
        KEY_SKIPPED: str(sum(int(m.get(KEY_SKIPPED, "0") or 0) for m in metas)),
        KEY_ERRORS: json.dumps(errors[:20], ensure_ascii=False, sort_keys=True),
    }


def merge_outputs(paths: Sequence[str], output: str, fmt: str | None = None, *, force: bool = False) -> dict[str, Any]:
    """Join a complete set of shard outputs into `output` in input order (atomic write); returns a summary.

    The output is what the unsharded run writes, byte for byte: its metadata (config and job keys, counts,
    output key), its rows in row groups of the same size, and its row index sidecar (`OUT.embedcli-index.
    parquet`, so the next `--incremental` carries the rows over), written first and renamed into place
    before the output appears. UsageError when the set is incomplete or mixed (unless `force`, which still
    needs every member readable)."""
    refuse_url("-o", output, "a local path")
    refuse_output_urls("merge", paths)
    report = inspect_set(paths)
    if report["status"] != "complete" and not force:
        raise UsageError("the outputs are not one complete set: " + "; ".join(report["problems"][:5]))
    check_output_path(output)
    members = expand_members(paths)
    check_no_clobber(members, output)  # the set must survive a merge, whatever -o names
    metas = [(output_metadata(m) or {}, m) for m in members]
    metas.sort(key=lambda x: int(x[0].get(KEY_SHARD_RANGE, "0:0").split(":")[0]))
    kind = output_format(output, fmt)
    meta = whole_run_metadata([m for m, _ in metas], kind)
    _check_existing(output, fmt, meta, force)
    files = [f for _, m in metas for f in _data_files(m)]
    schema = pq.read_schema(files[0]).remove_metadata()
    index_parts = [_index_files(p, m) for m, p in metas]
    indexed = all(part is not None for part in index_parts)
    index_files = [f for part in index_parts if part for f in part]
    if indexed:
        output_key = index_digest(meta[KEY_CONFIG_KEY], index_files)[0]
    else:
        output_key = hashlib.sha256(json.dumps([meta[KEY_CONFIG_KEY], [p for _, p in metas]]).encode()).hexdigest()[:32]
    final = {**meta, KEY_OUTPUT: output_key, KEY_COMPLETE: "true"}
    repeated = _repeated_ids(files, index_files if indexed else None)
    units = merged(_units_of(p) for _, p in metas) if indexed else None
    sidecar = os.path.abspath(output) + INDEX_SUFFIX
    sidecar_tmp = None
    writer = None
    written = 0
    try:
        if indexed:
            columns = [c for c in INDEX_COLUMNS if c in pq.read_schema(index_files[0]).names] if index_files else \
                list(INDEX_COLUMNS)
            sidecar_tmp = write_index_sidecar(sidecar, file_tables(index_files, INDEX_ROW_GROUP_ROWS, columns),
                                              output_key, units.to_json() if units is not None else None, columns)
        writer = open_writer(output, schema, final, fmt=fmt)
        for table in rechunk(file_tables(files), schema, FINAL_ROW_GROUP_ROWS):
            writer.write(table)
            written += table.num_rows
        if sidecar_tmp is not None:
            os.replace(sidecar_tmp, sidecar)
            sidecar_tmp = None
        else:
            unlink_quiet(sidecar)  # an index of an earlier output at this name must not describe this one
        writer.commit()
    except BaseException:
        if writer is not None:
            writer.abort()
        unlink_quiet(sidecar_tmp)
        raise
    return {"rows": written, "members": [p for _, p in metas], "repeated_ids": repeated, "output": output}


def _repeated_ids(files: list[str], index_files: list[str] | None, shown: int = 5) -> list[str]:
    """Up to `shown` ids that repeat across the members (the first occurrence in input order wins)."""
    ids = IdSet()
    repeats: list[int] = []
    row = 0
    if index_files is not None and index_files and "idh" in pq.read_schema(index_files[0]).names:
        for t in file_tables(index_files, INDEX_ROW_GROUP_ROWS, ["idh"]):
            h = np.asarray(t.column("idh").to_numpy(), np.int64)
            repeats += [row + j for j, _ in ids.add(h, np.arange(row, row + len(h), dtype=np.int64))]
            row += len(h)
    else:
        for t in file_tables(files, FINAL_ROW_GROUP_ROWS, ["id"]):
            values = [str(i) for i in t.column("id").to_pylist()]
            repeats += [row + j for j, _ in ids.add(id_hashes(values), np.arange(row, row + len(values), dtype=np.int64))]
            row += len(values)
    if not repeats:
        return []
    wanted = sorted(repeats)[:shown]
    out: list[str] = []
    row = 0
    for t in file_tables(files, FINAL_ROW_GROUP_ROWS, ["id"]):
        n = t.num_rows
        out += [str(t.column("id")[r - row].as_py()) for r in wanted if row <= r < row + n]
        row += n
    return out
