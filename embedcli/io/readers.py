"""Streaming readers for embedcli inputs: JSONL, Parquet, CSV/TSV and plain text, from files, globs or stdin."""

from __future__ import annotations

import os
import re
import stat
from collections import Counter
from collections.abc import Generator, Sequence
from glob import glob

import pyarrow as pa
import pyarrow.parquet as pq

from embedcli.errors import UsageError
from embedcli.io.commit import arrow_source
from embedcli.io.delimited_reader import read_delimited
from embedcli.io.errors import STDIN, InputError, printable
from embedcli.io.fingerprint import (
    describe_input_change,
    fingerprint_identity,
    input_fingerprint,
    input_fingerprints,
    rereadable,
)
from embedcli.io.jsonl_reader import read_jsonl
from embedcli.io.location import expand_url, is_url, local_path
from embedcli.io.parquet_reader import read_parquet
from embedcli.io.positions import ReadPoint
from embedcli.io.reader_base import BadRowHandler, InputBatch, ReadSpec, compression_of, without_compression
from embedcli.io.text_reader import read_txt

__all__ = [
    "FORMATS",
    "InputBatch",
    "InputReader",
    "count_records",
    "describe_input_change",
    "detect_format",
    "expand_paths",
    "fingerprint_identity",
    "input_fingerprint",
    "input_fingerprints",
    "normalize_format",
    "read_inputs",
    "rereadable",
]

FORMATS: tuple[str, ...] = ("jsonl", "parquet", "csv", "tsv", "txt")
"""Input formats understood by `read_inputs`."""

_EXTENSIONS = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".csv": "csv",
    ".tsv": "tsv",
    ".txt": "txt",
}
_ALIASES = {"ndjson": "jsonl", "json": "jsonl", "pq": "parquet", "text": "txt", "tab": "tsv"}
_GLOB_CHARS = re.compile(r"[*?\[]")


# --------------------------------------------------------------------------------------------------
# Paths and formats


def normalize_format(fmt: str) -> str:
    """Map a `--format` value (or alias such as `ndjson`, `pq`, `text`) to one of FORMATS."""
    name = fmt.strip().lower().lstrip(".")
    name = _ALIASES.get(name, name)
    if name not in FORMATS:
        raise UsageError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    return name


def detect_format(path: str, fmt: str | None = None) -> str:
    """Return the input format of `path`: `fmt` if given, else from the extension (stdin: jsonl)."""
    if fmt is not None:
        return normalize_format(fmt)
    if path == STDIN:
        return "jsonl"
    name = without_compression(path.lower())
    ext = os.path.splitext(name)[1]
    if ext in _EXTENSIONS:
        return _EXTENSIONS[ext]
    raise InputError(
        path,
        f"unknown input format {ext or '(no extension)'!r}",
        fix=f"name it .jsonl, .parquet, .csv, .tsv or .txt, or pass --format {{{','.join(FORMATS)}}}",
    )


def expand_paths(paths: Sequence[str]) -> list[str]:
    """Expand globs (sorted, directories dropped) in the order given; raise InputError for no match."""
    if isinstance(paths, str):
        paths = [paths]
    if not paths:
        raise ValueError("no input paths given")
    out: list[str] = []
    for p in paths:
        if p == STDIN:
            out.append(p)
        elif is_url(p):  # never a local path, even where a folder named `s3:` exists
            out.extend(expand_paths([local_path(p)]) if local_path(p) != p else expand_url(p))
        elif os.path.exists(p):  # a literal path wins, even when it contains glob characters
            if os.path.isdir(p):
                raise InputError(
                    p, "is a directory", fix=f"name the files in it, e.g. '{os.path.join(p, '*.jsonl')}'"
                )
            out.append(p)
        elif _GLOB_CHARS.search(p):
            matches = sorted(m for m in glob(p, recursive=True) if not os.path.isdir(m))
            if not matches:
                raise InputError(
                    p, "no such file: the pattern matched no files", fix="check the pattern and the directory"
                )
            out.extend(matches)
        else:
            raise InputError(p, "no such file", fix="check the path")
    return out


def _id_prefixes(paths: Sequence[str]) -> dict[str, str]:
    """Prefix of default ids per file: the basename, or the path when basenames collide across inputs."""
    bases = {p: ("stdin" if p == STDIN else os.path.basename(p)) for p in paths}
    counts = Counter(bases.values())
    # printable: an id is text in the output, so a non-UTF-8 file name shows its bytes as \xNN there.
    return {p: printable(b if counts[b] == 1 or p == STDIN else _whole_name(p)) for p, b in bases.items()}


def _whole_name(path: str) -> str:
    """A path as an id prefix where basenames collide: normalized, a URL as written."""
    return path if is_url(path) else os.path.normpath(path)


# --------------------------------------------------------------------------------------------------
# Public entry point


def read_inputs(
    paths: Sequence[str],
    *,
    text_col: str = "text",
    id_col: str | None = None,
    keep_cols: Sequence[str] = (),
    extra_text_cols: Sequence[str] = (),
    fmt: str | None = None,
    batch_rows: int = 1024,
    on_bad_row: BadRowHandler | None = None,
    batch_chars: int | None = None,
    start: ReadPoint | None = None,
    stop: ReadPoint | None = None,
) -> InputReader:
    """Stream records from files, globs or `-` (stdin) as InputBatch objects, in input order.

    `id_col=None` means "the `id` column if the input has one, else `file:line` / `file:row`"; a
    named `id_col` must exist. Paths, globs and formats are checked now (InputError before any
    reading); column checks happen as each file is opened. Row-level problems (bad UTF-8, malformed
    JSON, a non-object line, a null/empty/badly typed id or text type, a CSV row with the wrong
    number of fields) raise InputError, or, when `on_bad_row` is given, are passed to it and the row
    is skipped. Null text is never an error here: it comes through as None. With `batch_chars` a batch
    also ends at the row whose text brings it to that many characters (the cut depends on the data only).

    `start` / `stop` (`ReadPoint`s between records of the resolved inputs) bound what is read: from `start`
    (with the readers' state it carries) up to `stop`. Inside a file they fall on a line start of an
    uncompressed JSONL or text file, or on a Parquet row; elsewhere on a file's start.
    """
    if batch_rows < 1:
        raise ValueError("batch_rows must be at least 1")
    spec = ReadSpec(
        text_col=text_col,
        id_col=id_col if id_col is not None else "id",
        id_explicit=id_col is not None,
        keep_cols=tuple(keep_cols),
        extra_text_cols=tuple(extra_text_cols),
        batch_rows=batch_rows,
        on_bad_row=on_bad_row,
        batch_chars=batch_chars,
    )
    if fmt is not None:
        fmt = normalize_format(fmt)
    resolved = expand_paths(paths)
    plan = [(p, detect_format(p, fmt)) for p in resolved]
    for p, f in plan:
        if f == "txt" and (spec.id_explicit or spec.keep_cols or spec.extra_text_cols):
            asked = [*([spec.id_col] if spec.id_explicit else []), *spec.keep_cols, *spec.extra_text_cols]
            raise InputError(
                p,
                f"plain-text input has no named columns (asked for: {', '.join(asked)}); each line is one text",
                fix="drop --id-col/--keep-cols for .txt input, or use JSONL/CSV/Parquet",
            )
        if f == "parquet" and compression_of(p):
            raise InputError(p, f"{compression_of(p)}-compressed Parquet is not supported (Parquet compresses its "
                             "own columns)", fix=f"decompress it first, to {os.path.basename(without_compression(p))}")
    return InputReader(spec, _iter_files(plan, spec, _id_prefixes(resolved), start, stop))


class InputReader:
    """The batches of `read_inputs` in order; `spec` holds the readers' shared state (the run's types)."""

    def __init__(self, spec: ReadSpec, batches: Generator[InputBatch, None, None]) -> None:
        self.spec = spec
        self._it = batches

    def __iter__(self) -> InputReader:
        return self

    def __next__(self) -> InputBatch:
        return next(self._it)

    def close(self) -> None:
        """Stop reading (closes the file in hand)."""
        self._it.close()


def _iter_files(
    plan: list[tuple[str, str]], spec: ReadSpec, prefixes: dict[str, str], start: ReadPoint | None,
    stop: ReadPoint | None,
) -> Generator[InputBatch, None, None]:
    if start is not None and start.state.get("spec"):
        spec.restore(start.state["spec"])
    for f in range(start.file if start is not None else 0, len(plan)):
        if stop is not None and (f > stop.file or (f == stop.file and not stop.pos)):
            return
        path, fmt = plan[f]
        here = start if start is not None and start.file == f and start.pos else None
        until = stop if stop is not None and stop.file == f else None
        if fmt == "jsonl":
            yield from read_jsonl(path, spec, prefixes[path], start=here, stop=until)
        elif fmt == "parquet":
            yield from read_parquet(path, spec, prefixes[path], start=here, stop=until)
        elif fmt in ("csv", "tsv"):
            if here is not None or until is not None:
                raise ValueError(f"{path}: a {fmt} input is read whole, never from or up to a point inside it")
            yield from read_delimited(path, spec, prefixes[path], fmt)
        else:
            yield from read_txt(path, spec, prefixes[path], start=here, stop=until)



# --------------------------------------------------------------------------------------------------
# Record counts (for a progress total)


def count_records(path: str, fmt: str | None = None) -> int | None:
    """Records in `path` for a progress total: Parquet metadata, or newlines of a regular uncompressed
    text file (a CSV/TSV header is not counted; blank lines and quoted newlines make it an estimate).
    None for stdin, pipes and compressed files, which cannot be read twice or cheaply."""
    if not rereadable(path):
        return None  # stdin, a pipe or a FIFO: never opened here (that would consume it)
    fmt = detect_format(path, fmt)
    if is_url(path):  # an object: its Parquet footer; a text object is not read twice for a count
        return _parquet_rows(path) if fmt == "parquet" else None
    try:
        if fmt == "parquet":
            return int(pq.ParquetFile(path).metadata.num_rows)
        if compression_of(path) or not stat.S_ISREG(os.stat(path).st_mode):
            return None
        lines = 0
        last = b"\n"
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                lines += chunk.count(b"\n")
                last = chunk[-1:]
    except (OSError, pa.ArrowException):
        return None
    lines += last != b"\n"
    return max(0, lines - 1) if fmt in ("csv", "tsv") else lines


def _parquet_rows(url: str) -> int | None:
    """Rows of a Parquet object from its footer (None when it cannot be read: the reader says why)."""
    try:
        with arrow_source(url) as f:
            return int(pq.ParquetFile(f).metadata.num_rows)
    except (OSError, pa.ArrowException, InputError):
        return None
