"""The JSON Lines reader: one object per line, ids from the id field or `file:line`."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from typing import Any

from embedcli.io.errors import InputError
from embedcli.io.reader_base import (
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


def read_jsonl(path: str, spec: ReadSpec, prefix: str) -> Iterator[InputBatch]:
    b = BatchBuilder(path, spec)
    id_key: str | None = None  # decided on the first record: spec.id_col, or None for default ids
    first = True
    with open_binary(path) as f:
        for lineno, raw in numbered_lines(f, path):
            if not raw.strip():
                continue
            loc = f"line {lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                spec.bad(utf8_error(path, lineno, e))
                continue
            try:
                rec = json.loads(line)
            except ValueError as e:
                if first and line.lstrip().startswith("["):
                    raise _json_array_error(path, loc) from None
                msg = f"{e.msg} (column {e.colno})" if isinstance(e, json.JSONDecodeError) else str(e)
                spec.bad(
                    InputError(
                        path,
                        f"malformed JSON: {msg}",
                        location=loc,
                        record_id=_id_hint(line, spec.id_col),
                        fix="each line must be one complete JSON object",
                    )
                )
                continue
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
                continue
            if first:
                first = False
                id_key = _check_jsonl_fields(path, loc, rec, spec)
            if id_key is None:
                rid = f"{prefix}:{lineno}"
            else:
                rid_or_none = _record_id(path, loc, rec.get(id_key, _MISSING), id_key, spec)
                if rid_or_none is None:
                    continue
                rid = rid_or_none
            text = rec.get(spec.text_col)
            if not _text_ok(path, loc, rid, spec.text_col, text, spec):
                continue
            extra = [rec.get(c) for c in spec.extra_text_cols]
            if not all(
                _text_ok(path, loc, rid, c, v, spec) for c, v in zip(spec.extra_text_cols, extra, strict=True)
            ):
                continue
            b.add(loc, rid, text, [rec.get(c) for c in spec.keep_cols], extra)
            if b.full():
                yield b.take()
    if len(b):
        yield b.take()


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

