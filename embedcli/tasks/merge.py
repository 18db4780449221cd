"""A set of `--shard K/N` outputs: checking it is complete (`embedcli inspect A B C --check`) and joining
it in input order (`embedcli merge A B C -o ALL.parquet`).

A set is complete when every member is a complete output of the same job apart from its slice (same
model hash, config hash, input fingerprints and input options), all say the same N and record total, and
their record ranges cover `[0, total)` exactly once. The merged file holds the members' rows by range
start, with the members' provenance and the set's row, record and skipped counts.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from embedcli.errors import UsageError
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
    manifest_path,
    output_metadata,
)
from embedcli.io.writers import check_output_path, open_writer
from embedcli.run.ids import IdSet
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
    return {k: v for k, v in options.items() if k not in ("shard", "records")}


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
                    report["problems"].append(f"input records {pos}-{start} are in no output (a shard is missing)")
                elif start < pos:
                    report["problems"].append(f"{m}: input records {start}-{min(pos, stop)} are in another output too")
                pos = max(pos, stop)
            if pos < total:
                report["problems"].append(f"input records {pos}-{total} are in no output (a shard is missing)")
            seen = sorted(int(meta[KEY_SHARD].split("/")[0]) for _, meta in metas)
            absent = sorted(set(range(n)) - set(seen))
            if absent:
                report["problems"].append(f"shards {', '.join(f'{k}/{n}' for k in absent)} are missing")
            report["shards"] = n
            report["input_rows"] = total
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


def merge_outputs(paths: Sequence[str], output: str, fmt: str | None = None, *, force: bool = False) -> dict[str, Any]:
    """Join a complete set of shard outputs into `output` in input order (atomic write); returns a summary.

    UsageError when the set is incomplete or mixed (unless `force`, which still needs every member readable).
    """
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
    first = metas[0][0]
    meta = {k: v for k, v in first.items() if k not in (*SHARD_KEYS, KEY_OUTPUT, KEY_JOB, KEY_CONFIG_KEY)}
    errors: list[Any] = []
    for m, _ in metas:
        try:
            errors += json.loads(m.get(KEY_ERRORS, "[]"))
        except ValueError:
            pass
    rows = sum(int(m.get(KEY_ROWS, "0") or 0) for m, _ in metas)
    meta.update({
        KEY_INPUT_OPTIONS: json.dumps(_input_options(first), sort_keys=True),
        KEY_ROWS: str(rows),
        KEY_RECORDS: first.get(KEY_SHARD_TOTAL, str(report.get("input_rows", ""))),
        KEY_SKIPPED: str(sum(int(m.get(KEY_SKIPPED, "0") or 0) for m, _ in metas)),
        KEY_ERRORS: json.dumps(errors[:20], ensure_ascii=False, sort_keys=True),
        KEY_COMPLETE: "true",
        "embedcli.merged_from": json.dumps([p for _, p in metas]),
    })
    _check_existing(output, fmt, meta, force)
    files = [f for _, m in metas for f in _data_files(m)]
    schema = pq.read_schema(files[0]).remove_metadata()
    writer = open_writer(output, schema, meta, fmt=fmt)

    ids = IdSet()  # 16 bytes per row, not the ids themselves
    repeated: list[str] = []
    written = 0
    try:
        for f in files:
            with pq.ParquetFile(f) as pf:
                for rb in pf.iter_batches(batch_size=8192):
                    t = pa.Table.from_batches([rb]).replace_schema_metadata(None)
                    if not t.schema.equals(schema):
                        t = t.select(schema.names).cast(schema)
                    if "id" in t.column_names:
                        batch_ids = [str(i) for i in t.column("id").to_pylist()]
                        where = [f"row {written + j}" for j in range(len(batch_ids))]
                        for j, _ in ids.add(output, batch_ids, where)[: 5 - len(repeated)]:
                            repeated.append(batch_ids[j])
                    writer.write(t)
                    written += t.num_rows
        writer.commit()
    except BaseException:
        writer.abort()
        raise
    return {"rows": written, "members": [p for _, p in metas], "repeated_ids": repeated, "output": output}
