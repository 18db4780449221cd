"""The plain-text reader: each non-blank line is one text, ids `file:line`."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from embedcli.io.reader_base import (
    BatchBuilder,
    InputBatch,
    ReadSpec,
    numbered_lines,
    open_binary,
    utf8_error,
)


def read_txt(path: str, spec: ReadSpec, prefix: str) -> Iterator[InputBatch]:
    b = BatchBuilder(path, spec)
    spec.fix_id_type(path, pa.string(), "plain-text ids are file:line")
    with open_binary(path) as f:
        for lineno, raw in numbered_lines(f, path, idle=True):
            if raw is None:
                if len(b):
                    yield b.take()
                continue
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

