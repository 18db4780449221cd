"""The plain-text reader: each non-blank line is one text, ids `file:line`."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from embedcli.io.positions import ReadPoint
from embedcli.io.reader_base import (
    BatchBuilder,
    InputBatch,
    ReadSpec,
    numbered_lines,
    open_binary,
    seek_binary,
    utf8_error,
)


def read_txt(
    path: str, spec: ReadSpec, prefix: str, *, start: ReadPoint | None = None, stop: ReadPoint | None = None
) -> Iterator[InputBatch]:
    """Plain text, one text per non-blank line; from `start` (a line start: byte offset, lines before it) up to
    the line after `stop.line`."""
    b = BatchBuilder(path, spec)
    spec.fix_id_type(path, pa.string(), "plain-text ids are file:line")
    last_line = stop.line if stop is not None else None
    with open_binary(path) as f:
        if start is not None and start.pos:
            seek_binary(f, path, start.pos)
        for lineno, raw in numbered_lines(f, path, idle=True, start_line=start.line if start is not None else 0):
            if raw is None:
                if len(b):
                    yield b.take()
                continue
            if last_line is not None and lineno > last_line:
                break
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                spec.bad(utf8_error(path, lineno, e, record_id=f"{prefix}:{lineno}"))
                continue
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            b.add(f"line {lineno}", f"{prefix}:{lineno}", line, (), ())
            if b.full():
                yield b.take()
    if len(b):
        yield b.take()

