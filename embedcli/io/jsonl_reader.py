"""The JSON Lines reader: one object per line, ids from the id field or `file:line`."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from embedcli.io.errors import InputError
from embedcli.io.fingerprint import rereadable
from embedcli.io.json_line import BadJsonLine, parse_json_line
from embedcli.io.positions import ReadPoint
from embedcli.io.reader_base import (
    BatchBuilder,
    InputBatch,
    ReadSpec,
    missing_column,
    numbered_lines,
    open_binary,
    seek_binary,
    type_name,
    utf8_error,
)


def _id_hint(line: str, key: str) -> str | None:
    """Best-effort id of a malformed JSON line, so the user can find it."""
    m = re.search(r'"' + re.escape(key) + r'"\s*:\s*("(?:[^"\\]|\\.)*"|-?\d+)', line)
    if not m:
        return None
    try:
        return str(json.loads(m.group(1)))
    except ValueError:
        return None


def _parse(path: str, lineno: int, raw: bytes, spec: ReadSpec, first: bool) -> dict[str, Any] | None:
    """The JSON object on a line, or None when the line is a bad row (reported to `spec`)."""
    loc = f"line {lineno}"
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        spec.bad(utf8_error(path, lineno, e))
        return None
    try:
        rec = parse_json_line(line)
    except BadJsonLine as e:
        if e.kind == "malformed" and first and line.lstrip().startswith("["):
            raise _json_array_error(path, loc) from None
        fix = {
            "malformed": "each line must be one complete JSON object"
            + ("; for plain text, one text per line, pass --format txt" if first else ""),
            "surrogate": "write the character itself, or both halves of its surrogate pair",
        }.get(e.kind)
        spec.bad(InputError(path, e.reason, location=loc, record_id=_id_hint(line, spec.id_col), fix=fix))
        return None
    if not isinstance(rec, dict):
        if first and isinstance(rec, list):
            raise _json_array_error(path, loc)
        spec.bad(
            InputError(
                path,
                f"expected a JSON object, got {type_name(rec)}",
                location=loc,
                fix='each line must be one JSON object like {"id": ..., "text": ...}',
            )
        )
        return None
    return rec


def _any_record_has(path: str, key: str) -> bool:
    """Whether any line of a (re-readable) JSONL file is an object with `key` (a byte scan, parsing only hits)."""
    pattern = re.compile(b'"' + re.escape(json.dumps(key)[1:-1].encode()) + rb'"\s*:')
    with open_binary(path) as f:
        for _, raw in numbered_lines(f, path):
            if raw is not None and pattern.search(raw):
                try:
                    rec = parse_json_line(raw.decode("utf-8", "replace"))
                except BadJsonLine:
                    continue
                if isinstance(rec, dict) and key in rec:
                    return True
    return False


def decide_id_key(path: str, spec: ReadSpec) -> str | None:
    """The id field of a (re-readable) JSONL file as `read_jsonl` decides it at the file's first record: the id
    field when any record has it, else None (ids `file:line`). The first record's fields are checked as there
    (InputError when a column is missing); lines before it that are not JSON objects are passed over."""
    with open_binary(path) as f:
        for lineno, raw in numbered_lines(f, path):
            if raw is None or not raw.strip():
                continue
            try:
                rec = parse_json_line(raw.decode("utf-8"))
            except (UnicodeDecodeError, BadJsonLine):
                continue
            if not isinstance(rec, dict):
                continue
            id_key = _check_jsonl_fields(path, f"line {lineno}", rec, spec)
            if id_key is None and _any_record_has(path, spec.id_col):
                id_key = spec.id_col
            return id_key
    return None


def read_jsonl(
    path: str, spec: ReadSpec, prefix: str, *, start: ReadPoint | None = None, stop: ReadPoint | None = None
) -> Iterator[InputBatch]:
    """JSON Lines; ids from the id field when any record of the file has one, else `file:line`.

    From `start` (a line start inside the file: its byte offset and the lines before it; the file's id field
    from `start.state["file"]["id_key"]`, else decided by `decide_id_key`) up to `stop` (the lines up to `stop.line`)."""
    b = BatchBuilder(path, spec, infer_types=True)
    id_key: str | None = None  # decided per file: spec.id_col when any record has it, else default ids
    first = True
    last_line = stop.line if stop is not None else None
    with open_binary(path) as f:
        if start is not None and start.pos:
            seek_binary(f, path, start.pos)
            first = False
            known = (start.state.get("file") or {})
            id_key = known["id_key"] if "id_key" in known else decide_id_key(path, spec)
            if id_key is None:
                spec.fix_id_type(path, pa.string(), f"no {spec.id_col!r} field: ids are file:line")
        for lineno, raw in numbered_lines(f, path, idle=True, start_line=start.line if start is not None else 0):
            if raw is None:
                if len(b):
                    yield b.take()  # the writer paused: stream what arrived (stdin runs never resume)
                continue
            if last_line is not None and lineno > last_line:
                break
            if not raw.strip():
                continue
            rec = _parse(path, lineno, raw, spec, first)
            if rec is None:
                continue
            loc = f"line {lineno}"
            if first:
                first = False
                id_key = _check_jsonl_fields(path, loc, rec, spec)
                if id_key is None and rereadable(path) and _any_record_has(path, spec.id_col):
                    id_key = spec.id_col  # a later record has ids: every record must have one
                if id_key is None:
                    spec.fix_id_type(path, pa.string(), f"no {spec.id_col!r} field: ids are file:line")
            if id_key is None:
                if spec.id_col in rec:
                    spec.bad(_late_id_error(path, loc, spec.id_col))
                    continue
                rid = f"{prefix}:{lineno}"
            else:
                rid_or_none = _record_id(path, loc, rec.get(id_key, _MISSING), id_key, spec)
                if rid_or_none is None:
                    continue
                rid = rid_or_none
            text = rec.get(spec.text_col)
            extra = [rec.get(c) for c in spec.extra_text_cols]
            if not all(
                _text_ok(path, loc, rid, c, v, spec)
                for c, v in zip((spec.text_col, *spec.extra_text_cols), (text, *extra), strict=True)
            ):
                continue
            b.add(loc, rid, text, [rec.get(c) for c in spec.keep_cols], extra, rec.get(id_key) if id_key else None)
            if b.full():
                yield b.take()
    if len(b):
        yield b.take()


def _late_id_error(path: str, loc: str, key: str) -> InputError:
    return InputError(
        path,
        f"has an id field {key!r}, but earlier records of this stream have none (their ids are file:line)",
        location=loc,
        fix=f"give every record an {key!r}, or none; or write the input to a file first",
    )


_MISSING: Any = object()


def _json_array_error(path: str, loc: str) -> InputError:
    return InputError(
        path,
        "looks like a JSON array, not JSON Lines (one object per line)",
        location=loc,
        fix=f"convert it: jq -c '.[]' {path} > {os.path.splitext(os.path.basename(path))[0]}.jsonl",
    )


def _check_jsonl_fields(path: str, loc: str, rec: dict[str, Any], spec: ReadSpec) -> str | None:
    """Check the first record has the requested fields; return the id key, or None for default ids."""
    fields = list(rec)
    if spec.text_col not in rec:
        raise missing_column(path, "text", spec.text_col, fields, "--text-col", loc)
    for col in spec.extra_text_cols:
        if col not in rec:
            raise missing_column(path, "text", col, fields, None, loc)
    for col in spec.keep_cols:
        if col not in rec:
            raise missing_column(path, "kept", col, fields, "--keep-cols", loc)
    if spec.id_col in rec:
        return spec.id_col
    if spec.id_explicit:
        raise missing_column(path, "id", spec.id_col, fields, "--id-col", loc)
    return None


def _record_id(path: str, loc: str, value: Any, key: str, spec: ReadSpec) -> str | None:
    """Return the record's id as a string, or report a bad id (returning None when skipped)."""
    if isinstance(value, str) and value:
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if value is _MISSING:
        reason = f"no id field {key!r}"
    elif value is None:
        reason = f"id field {key!r} is null"
    elif value == "":
        reason = f"id field {key!r} is empty"
    else:
        reason = f"id field {key!r} is {type_name(value)}; ids must be strings or integers"
    spec.bad(InputError(path, reason, location=loc, fix="give every record a unique id"))
    return None


def _text_ok(path: str, loc: str, rid: str, col: str, value: Any, spec: ReadSpec) -> bool:
    if value is None or isinstance(value, str):
        return True
    spec.bad(
        InputError(
            path,
            f"text field {col!r} is {type_name(value)}; expected a string or null",
            location=loc,
            record_id=rid,
        )
    )
    return False

