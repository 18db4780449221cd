"""The one JSON-line parser of every reader (the JSONL reader, run-batch's request lines, their pre-pass):
a line too deeply nested, malformed, or holding a lone UTF-16 surrogate is that line's error, never a crash."""

from __future__ import annotations

import json
import re
from typing import Any

_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


class BadJsonLine(ValueError):
    """Why a line is not usable JSON: `reason` (one line), `kind` malformed | nested | surrogate."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


def parse_json_line(line: str) -> Any:
    """The JSON value on `line`; BadJsonLine when it is malformed, nested too deeply to read, or holds a
    string with a lone surrogate (`"\\ud83d"` alone parses to a string no UTF-8 encoder can take)."""
    try:
        value = json.loads(line)
    except RecursionError:
        raise BadJsonLine("nested", "JSON nested too deeply to read") from None
    except ValueError as e:
        msg = f"{e.msg} (column {e.colno})" if isinstance(e, json.JSONDecodeError) else str(e)
        raise BadJsonLine("malformed", f"malformed JSON: {msg}") from None
    if _SURROGATE_ESCAPE.search(line) and has_lone_surrogate(value):
        raise BadJsonLine("surrogate", "a string holds a lone UTF-16 surrogate escape (e.g. \\ud83d without its pair)")
    return value


def has_lone_surrogate(value: Any) -> bool:
    """Whether a parsed JSON value holds a string (or key) with a lone surrogate, at any depth."""
    stack = [value]
    while stack:  # iterative: a value deep enough to parse is not too deep to check
        v = stack.pop()
        if isinstance(v, str):
            if _LONE_SURROGATE.search(v):
                return True
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return False
