"""The plain-text reader: each non-blank line is one text, ids `file:line`."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from embedcli.io.errors import InputError
from embedcli.io.line_blocks import LineFormat, read_line_blocks
from embedcli.io.positions import WHOLE, FilePart
from embedcli.io.reader_base import BatchBuilder, InputBatch, ReadSpec, utf8_error


def read_txt(
    path: str,
    spec: ReadSpec,
    prefix: str,
    part: FilePart = WHOLE,
) -> Iterator[InputBatch]:
    spec.fix_id_type(path, pa.string(), "plain-text ids are file:line")

    def parse(b: BatchBuilder, lineno: int, raw: bytes) -> None:
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            b.error(utf8_error(path, lineno, e, record_id=f"{prefix}:{lineno}"))
            return
        line = line.rstrip("\r\n")
        if not line.strip():
            return
        if "\r" in line and not spec.cr_in_lines:
            # a lone CR ends a line for Python's universal newlines (`str.splitlines`, `for line in open(...)`),
            # but not for the line machinery here (read points, blocks, slice cuts count LF): never one long text
            b.error(InputError(
                path,
                "holds a carriage return (CR) inside the line, which is not taken as a line break "
                "(a file with old Mac CR line breaks?)",
                location=f"line {lineno}",
                record_id=f"{prefix}:{lineno}",
                fix="end lines with LF or CRLF (e.g. tr '\\r' '\\n' < IN > OUT)",
            ))
            return
        b.add(f"line {lineno}", f"{prefix}:{lineno}", line, (), (), number=lineno)

    def context() -> str | None:
        types = spec.context()
        return None if types is None else f"txt\x00{prefix}\x00{types}"

    fmt = LineFormat(parse, context, dict, lambda: BatchBuilder(path, spec, part.file))
    yield from read_line_blocks(path, spec, fmt, part, idle=True)
