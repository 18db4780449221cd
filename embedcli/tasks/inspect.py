"""`embedcli inspect OUTPUT`: provenance, completeness and errors of an output, for people and for cron."""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from embedcli.io.commit import arrow_source
from embedcli.io.location import refuse_output_urls
from embedcli.io.manifest import (
    INDEX_SUFFIX,
    KEY_COMPLETE,
    KEY_CONFIG,
    KEY_CONFIG_KEY,
    KEY_ERRORS,
    KEY_INPUT_OPTIONS,
    KEY_INPUTS,
    KEY_MODEL,
    KEY_OUTPUT,
    KEY_RECORDS,
    KEY_ROWS,
    KEY_SKIPPED,
    Manifest,
    manifest_path,
    output_metadata,
    read_json_file,
    staging_dir,
    strip_slash,
)
from embedcli.io.shards import output_key_for
from embedcli.io.sidecar import check_sidecar
from embedcli.io.writers import output_format

PROVENANCE_KEYS = (
    "embedcli.version", "embedcli.model", "embedcli.model_hash", KEY_CONFIG, "embedcli.dtype", "embedcli.dtype_reason"
)


def _loads(value: str | None) -> Any:
    if value is None:
        return None
    try:
        return json.loads(value)
    except ValueError:
        return value


def _provenance(meta: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {k.removeprefix("embedcli."): meta.get(k) for k in PROVENANCE_KEYS if k in meta}
    if "embedcli.config" in meta:
        out["config"] = _loads(meta["embedcli.config"])
    return out


def _count_lines(path: str) -> int:
    n = 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            n += block.count(b"\n")
    return n


def _file_rows(path: str, fmt: str) -> tuple[int | None, list[str], str | None]:
    """(rows actually in the file, columns, problem) of an output file."""
    if fmt == "parquet":

        try:
            pf = pq.ParquetFile(arrow_source(path))
        except (pa.ArrowException, OSError) as e:
            return None, [], f"not a readable Parquet file: {e}"
        return pf.metadata.num_rows, pf.schema_arrow.names, None
    if fmt == "jsonl":
        return _count_lines(path), [], None

    try:
        arr = np.load(path, mmap_mode="r")
    except (OSError, ValueError) as e:
        return None, [], f"not a readable .npy file: {e}"
    return int(arr.shape[0]), [], None


def _staged(root: str) -> dict[str, Any] | None:
    manifest = Manifest.load(root)
    if manifest is None:
        return None
    return {
        "path": root,
        "committed_input_rows": manifest.records_done,
        "committed_rows": manifest.rows_done,
        "shards": len(manifest.shards),
        "skipped_rows": manifest.errors,
        "config_key": manifest.config_key,
        "complete": manifest.complete,
        "output_key": _staged_output_key(root, manifest),
    }


def _staged_output_key(root: str, manifest: Manifest) -> str | None:
    """The output key the staged work publishes as (None when its shards cannot be read)."""
    try:
        return output_key_for(root, manifest)
    except (pa.ArrowException, OSError, ValueError):
        return None


def _inspect_dir(path: str, report: dict[str, Any]) -> None:

    manifest = Manifest.load(path)
    report["format"] = "parquet shards"
    if manifest is None:
        report["problems"].append("no readable _embedcli/manifest.json: not an embedcli shard directory")
        return
    meta = manifest.metadata or {KEY_CONFIG: manifest.config.get(KEY_CONFIG) or "",
                                 KEY_MODEL: manifest.config.get(KEY_MODEL) or ""}
    report["metadata"] = meta
    listed = {s.file for s in manifest.shards if s.file}
    rows = 0
    hashes = set()
    for s in manifest.shards:
        if not s.file:
            continue
        f = os.path.join(path, s.file)
        try:
            pf = pq.ParquetFile(arrow_source(f))
        except FileNotFoundError:
            report["problems"].append(f"shard {s.file} is missing")
            continue
        except (pa.ArrowException, OSError) as e:
            report["problems"].append(f"shard {s.file} is unreadable: {e}")
            continue
        n = pf.metadata.num_rows
        rows += n
        if n != s.rows:
            report["problems"].append(f"shard {s.file} has {n} rows, the manifest says {s.rows}")
        kv = pf.schema_arrow.metadata or {}
        hashes.add(
            ((kv.get(KEY_CONFIG.encode()) or b"").decode(), (kv.get(KEY_MODEL.encode()) or b"").decode())
        )
        report.setdefault("columns", pf.schema_arrow.names)
    extra = sorted(
        n for n in os.listdir(path) if n.endswith(".parquet") and not n.startswith((".", "_")) and n not in listed
    )
    if extra:
        report["mixed"] = True
        report["problems"].append(f"shard files the manifest does not list: {', '.join(extra[:5])}")
    if len(hashes) > 1:
        report["mixed"] = True
        report["problems"].append(f"shards made with {len(hashes)} different configs or models")
    elif hashes and hashes != {(manifest.config.get(KEY_CONFIG) or "", manifest.config.get(KEY_MODEL) or "")}:
        report["mixed"] = True
        report["problems"].append("shards were made with another config than the manifest records")
    report["rows"] = rows
    report["complete"] = bool(manifest.complete) and not report["problems"]
    report["skipped_rows"] = manifest.errors
    report["shards"] = len(listed)


def inspect_output(path: str) -> dict[str, Any]:
    """What an output is: format, rows, provenance, complete or not (and why), skipped rows and errors."""
    refuse_output_urls("inspect", [path])

    report: dict[str, Any] = {"path": path, "exists": False, "complete": False, "mixed": False, "problems": []}
    target = strip_slash(path)
    root = staging_dir(target)
    staged = _staged(root)
    if os.path.isdir(target) and (os.path.isfile(manifest_path(target)) or path.endswith("/")):
        report["exists"] = True
        _inspect_dir(target, report)
        meta = report.get("metadata") or {}
    elif os.path.isfile(target):
        report["exists"] = True
        fmt = output_format(target, reading=True)
        report["format"] = fmt
        rows, columns, problem = _file_rows(target, fmt)
        if columns:
            report["columns"] = columns
        report["rows"] = rows
        if problem:
            report["problems"].append(problem)
        meta = output_metadata(target) or {}
        report["metadata"] = meta
        if not meta:
            report["problems"].append("no embedcli metadata: not written by embedcli")
        elif meta.get(KEY_COMPLETE) != "true" and KEY_CONFIG_KEY in meta:
            report["problems"].append("the metadata does not mark the output complete")
        if meta.get(KEY_ROWS) and rows is not None and str(rows) != meta[KEY_ROWS]:
            report["problems"].append(f"{rows} rows in the file, the metadata says {meta[KEY_ROWS]}")
        sidecar = read_json_file(f"{target}.meta.json") if fmt != "parquet" else None
        if sidecar and rows is not None and sidecar.get("rows") not in (None, rows):
            report["problems"].append(f"{rows} rows in the file, its sidecar says {sidecar.get('rows')}")
        if sidecar:
            report["problems"] += check_sidecar(target, sidecar, deep=True)  # the sidecar names these bytes
        index = target + INDEX_SUFFIX
        if os.path.isfile(index):
            report["index"] = _index_state(index, meta)
        report["complete"] = not report["problems"]
        report["skipped_rows"] = int(meta.get(KEY_SKIPPED, "0") or 0)
    else:
        meta = {}
        if staged is None:
            report["problems"].append("no such output, and no staged work for it")
        else:
            report["problems"].append("not published yet: only staged work of an unfinished run exists")
    if meta:
        report["provenance"] = _provenance(meta)
        report["config_hash"] = meta.get(KEY_CONFIG)
        report["model_hash"] = meta.get(KEY_MODEL)
        report["input_rows"] = int(meta[KEY_RECORDS]) if meta.get(KEY_RECORDS, "").isdigit() else None
        report["inputs"] = _loads(meta.get(KEY_INPUTS))
        report["input_options"] = _loads(meta.get(KEY_INPUT_OPTIONS))
        report["errors"] = _loads(meta.get(KEY_ERRORS)) or []
        report["output_key"] = meta.get(KEY_OUTPUT)
    published = staged is not None and staged["output_key"] is not None and staged["output_key"] == meta.get(KEY_OUTPUT)
    if staged is not None and report["complete"] and published:
        # killed after publishing, before removing its staging: the output is this work's, complete;
        # the next run of the command removes the leftover
        report["staged"] = {**staged, "published": True}
    elif staged is not None:
        report["staged"] = staged
        report["complete"] = False
        report["problems"].append(
            f"an unfinished run has staged work in {root} "
            f"({staged['committed_input_rows']:,} input rows committed): rerun its command to finish it"
        )
        if meta.get(KEY_CONFIG_KEY) and staged["config_key"] != meta.get(KEY_CONFIG_KEY):
            report["mixed"] = True
            report["problems"].append("the staged work was made with another config than the output")
    report.pop("metadata", None)
    if report["mixed"]:
        report["complete"] = False
    report["status"] = "mixed" if report["mixed"] else ("complete" if report["complete"] else "incomplete")
    return report


def _index_state(index: str, meta: dict[str, str]) -> str:

    try:
        tag = (pq.read_schema(arrow_source(index)).metadata or {}).get(KEY_OUTPUT.encode(), b"").decode()
    except (pa.ArrowException, OSError):
        return "unreadable"
    return "valid" if tag and tag == meta.get(KEY_OUTPUT) else "stale (ignored by --incremental)"


def format_report(report: dict[str, Any]) -> list[tuple[str, str]]:
    """The report as (key, value) lines for a table."""
    lines: list[tuple[str, str]] = [("path", report["path"]), ("status", report["status"])]
    for key in ("format", "rows", "input_rows", "skipped_rows", "shards", "columns", "config_hash", "model_hash", "index"):
        if report.get(key) is not None:
            value = report[key]
            lines.append((key, ", ".join(value) if isinstance(value, list) else str(value)))
    prov = report.get("provenance") or {}
    for key in ("model", "version", "dtype", "dtype_reason"):
        if prov.get(key):
            lines.append((key, str(prov[key])))
    for fp in report.get("inputs") or []:
        lines.append(("input", f"{fp.get('path')} ({fp.get('size'):,} bytes)"))
    if report.get("staged"):
        s = report["staged"]
        lines.append(("staged", f"{s['committed_input_rows']:,} input rows in {s['shards']} shards at {s['path']}"))
    for e in (report.get("errors") or [])[:5]:
        lines.append(("error", f"{e.get('file')} {e.get('location') or ''} id={e.get('id')!r}: {e.get('reason')}"))
    for p in report["problems"]:
        lines.append(("problem", p))
    return lines
