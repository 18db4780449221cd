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
from embedcli.io.line_blocks import LineFormat, read_line_blocks
from embedcli.io.positions import WHOLE, FilePart
from embedcli.io.reader_base import (
    BadRowHandler,
    BatchBuilder,
    InputBatch,
    ReadSpec,
    missing_column,
    numbered_lines,
    open_binary,
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


def _parse(path: str, lineno: int, raw: bytes, spec: ReadSpec, first: bool, bad: BadRowHandler) -> dict[str, Any] | None:
    """The JSON object on a line, or None when the line is a bad row (reported to `bad`)."""
    loc = f"line {lineno}"
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        bad(utf8_error(path, lineno, e))
        return None
    try:
        rec = parse_json_line(line)
    except BadJsonLine as e:
        if e.kind == "malformed" and first and line.lstrip().startswith("["):
            raise _json_array_error(path, loc) from None
        cr = "\r" in line.rstrip("\r\n")  # JSON Lines break at LF: CR line breaks leave records on one line
        fix = {
            "malformed": "each line must be one complete JSON object"
            + ("; the line holds a carriage return (CR): end lines with LF or CRLF (e.g. tr '\\r' '\\n' < IN > OUT)"
               if cr else "; for plain text, one text per line, pass --format txt" if first else ""),
            "surrogate": "write the character itself, or both halves of its surrogate pair",
        }.get(e.kind)
        bad(InputError(path, e.reason, location=loc, record_id=_id_hint(line, spec.id_col), fix=fix))
        return None
    if not isinstance(rec, dict):
        if first and isinstance(rec, list):
            raise _json_array_error(path, loc)
        bad(
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


def _first_record(path: str, spec: ReadSpec) -> dict[str, Any] | None:
    """The first line of a file that is a JSON object, read without reporting anything (None: none)."""
    with open_binary(path) as f:
        for _, raw in numbered_lines(f, path):
            if raw is None or not raw.strip():
                continue
            try:
                rec = parse_json_line(raw.decode("utf-8"))
            except (UnicodeDecodeError, BadJsonLine):
                continue
            if isinstance(rec, dict):
                return rec
    return None


def read_jsonl(
    path: str,
    spec: ReadSpec,
    prefix: str,
    part: FilePart = WHOLE,
) -> Iterator[InputBatch]:
    """JSON Lines; ids from the id field when any record of the file has one, else `file:line`."""
    # Per file: whether its id field is decided yet, the field (None: default ids), whether a record was read.
    start = part.start
    state: dict[str, Any] = {"decided": False, "id_key": None, "first": True}
    if start is not None and start.state.get("file"):
        state.update(start.state["file"])
    elif rereadable(path):
        _decide_early(path, spec, state)
        if start is not None and start.pos > 0:
            state["first"] = False  # a slice starting inside the file

    def decide(loc: str, rec: dict[str, Any]) -> None:
        id_key = _check_jsonl_fields(path, loc, rec, spec)
        if id_key is None and rereadable(path) and _any_record_has(path, spec.id_col):
            id_key = spec.id_col  # a later record has ids: every record must have one
        if id_key is None:
            spec.fix_id_type(path, pa.string(), f"no {spec.id_col!r} field: ids are file:line")
        state["id_key"], state["decided"] = id_key, True

    def parse(b: BatchBuilder, lineno: int, raw: bytes) -> None:
        if not raw.strip():
            return
        rec = _parse(path, lineno, raw, spec, state["first"], b.error)
        if rec is None:
            return
        loc = f"line {lineno}"
        if state["first"]:
            state["first"] = False
            if not state["decided"]:
                decide(loc, rec)
        id_key = state["id_key"]
        if id_key is None:
            if spec.id_col in rec:
                b.error(_late_id_error(path, loc, spec.id_col))
                return
            rid = f"{prefix}:{lineno}"
        else:
            rid_or_none = _record_id(path, loc, rec.get(id_key, _MISSING), id_key, b.error)
            if rid_or_none is None:
                return
            rid = rid_or_none
        text = rec.get(spec.text_col)
        extra = [rec.get(c) for c in spec.extra_text_cols] if spec.extra_text_cols else []
        if not isinstance(text, str) or extra:  # (a string text, no other text field: nothing to check)
            if not all(
                _text_ok(path, loc, rid, c, v, b.error)
                for c, v in zip((spec.text_col, *spec.extra_text_cols), (text, *extra), strict=True)
            ):
                return
        b.add(loc, rid, text, [rec.get(c) for c in spec.keep_cols], extra, rec.get(id_key) if id_key else None,
              number=lineno)

    def context() -> str | None:
        types = spec.context()
        if types is None or not state["decided"]:
            return None
        # the file's name counts where it makes the ids (`file:line`); with an id field, a renamed copy carries over
        named = prefix if state["id_key"] is None else ""
        return f"jsonl\x00{named}\x00{state['id_key']}\x00{types}"

    def carried() -> None:
        state["first"] = False

    fmt = LineFormat(parse, context, lambda: dict(state), lambda: BatchBuilder(path, spec, part.file, infer_types=True),
                     carried)
    yield from read_line_blocks(path, spec, fmt, part, idle=True)


def _decide_early(path: str, spec: ReadSpec, state: dict[str, Any]) -> None:
    """Decide a file's id field from its first record before reading it, so its first blocks can be carried
    over; left to the first record's reading when that record would stop the run (a missing field)."""
    rec = _first_record(path, spec)
    if rec is None:
        return
    try:
        id_key = _check_jsonl_fields(path, "line 1", rec, spec)
    except InputError:
        return
    if id_key is None and _any_record_has(path, spec.id_col):
        id_key = spec.id_col
    if id_key is None:
        spec.fix_id_type(path, pa.string(), f"no {spec.id_col!r} field: ids are file:line")
    state["id_key"], state["decided"] = id_key, True


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


def _record_id(path: str, loc: str, value: Any, key: str, bad: BadRowHandler) -> str | None:
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
    bad(InputError(path, reason, location=loc, fix="give every record a unique id"))
    return None


def _text_ok(path: str, loc: str, rid: str, col: str, value: Any, bad: BadRowHandler) -> bool:
    if value is None or isinstance(value, str):
        return True
    bad(
        InputError(
            path,
            f"text field {col!r} is {type_name(value)}; expected a string or null",
            location=loc,
            record_id=rid,
        )
    )
    return False

