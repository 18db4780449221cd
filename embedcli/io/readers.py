"""Streaming readers for embedcli inputs: JSONL, Parquet, CSV/TSV and plain text, from files, globs or stdin."""

from __future__ import annotations

import json
import os
import re
import stat
from collections import Counter
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from glob import glob
from typing import Any

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
from embedcli.io.positions import (
    BLOCK_BYTES,
    BLOCK_LINES,
    UNIT_PIECE,
    Block,
    Carried,
    FilePart,
    ReadPoint,
    digest,
    identity,
)
from embedcli.io.reader_base import (
    BATCH_RECORDS_PER_ROW,
    BadRowHandler,
    InputBatch,
    ReadSpec,
    compression_of,
    without_compression,
)
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
            if STDIN in out:  # read once: the second `-` would silently add nothing
                raise InputError(p, "stdin is named twice, but it is read once", fix="name - once")
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
    cuts: Mapping[int, Sequence[int]] | None = None,
    fingerprints: Sequence[Mapping[str, Any]] | None = None,
    carry_blocks: Mapping[bytes, tuple[int, int]] | None = None,
    carry_units: Mapping[bytes, tuple[int, int, Any]] | None = None,
    carry_lines: Callable[[Any, Any], Any] | None = None,
    cr_in_lines: bool = False,
) -> InputReader:
    """Stream records from files, globs or `-` (stdin) as InputBatch objects, in input order.

    `id_col=None` means "the `id` column if the input has one, else `file:line` / `file:row`"; a
    named `id_col` must exist. Paths, globs and formats are checked now (InputError before any
    reading); column checks happen as each file is opened. Row-level problems (bad UTF-8, malformed
    JSON, a non-object line, a null/empty/badly typed id or text type, a CSV row with the wrong
    number of fields) raise InputError, or, when `on_bad_row` is given, are passed to it and the row
    is skipped. Null text is never an error here: it comes through as None. Batches are whole blocks
    (`embedcli.io.positions`): a batch ends at the first block boundary past `batch_rows` rows read or
    `batch_chars` characters of text (the cut depends on the data only).

    For a run: `start`/`stop` (`ReadPoint`s) bound what is read; `cuts` (file index -> byte offsets, rows for
    Parquet) are where batches must end; with the inputs' `fingerprints`, `carry_units` (a file's or row
    group's identity -> (first row, rows, reader state after it) in the previous output) and `carry_blocks`
    (a block's identity -> (first row, rows)) say what `--incremental` carries over unread; `carry_lines`
    (a changed block's line identities and numbers -> each line's previous row, -1: none), which of its lines.
    A plain-text line holding a CR that does not end it is a bad row, unless `cr_in_lines` (see `ReadSpec`).
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
        batch_records=batch_rows * BATCH_RECORDS_PER_ROW,
        carry_blocks=carry_blocks,
        carry_lines=carry_lines,
        block_lines=min(BLOCK_LINES, batch_rows),
        block_bytes=min(BLOCK_BYTES, max(1, batch_chars // 8)) if batch_chars else BLOCK_BYTES,
        cr_in_lines=cr_in_lines,
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
    spec.identities = all(rereadable(p) for p, _ in plan)
    if not spec.identities:  # read once (stdin, a pipe): nothing resumes or carries over; cut by rows alone
        spec.block_lines = 1
    return InputReader(plan, spec, _id_prefixes(resolved), start=start, stop=stop, cuts=cuts or {},
                       fingerprints=fingerprints, carry_units=carry_units)


class InputReader:
    """The batches of a run's inputs in order (see `read_inputs`); `spec` holds the readers' shared state
    (types, the rows read from text)."""

    def __init__(
        self,
        plan: list[tuple[str, str]],
        spec: ReadSpec,
        prefixes: dict[str, str],
        *,
        start: ReadPoint | None,
        stop: ReadPoint | None,
        cuts: Mapping[int, Sequence[int]],
        fingerprints: Sequence[Mapping[str, Any]] | None,
        carry_units: Mapping[bytes, tuple[int, int, Any]] | None,
    ) -> None:
        self.plan, self.spec, self.prefixes = plan, spec, prefixes
        self.start, self.stop, self.cuts = start, stop, cuts
        self.fingerprints = fingerprints
        self.carry_units = carry_units or {}
        spec.carry_units = {k: (v[0], v[1]) for k, v in self.carry_units.items()}
        self._it: Generator[InputBatch, None, None] = self._batches()

    def __iter__(self) -> InputReader:
        return self

    def __next__(self) -> InputBatch:
        return next(self._it)

    def close(self) -> None:
        """Stop reading (closes the file in hand)."""
        self._it.close()

    def file_identity(self, f: int) -> bytes | None:
        """Input `f`'s identity as a whole: its content (fingerprint), format, id prefix, the readers' state
        before it and the input options; None where the input has no fingerprint."""
        if self.fingerprints is None or not self.spec.identities or f >= len(self.fingerprints):
            return None
        path, fmt = self.plan[f]
        spec = self.spec
        options = (spec.text_col, spec.id_col, spec.id_explicit, spec.keep_cols, spec.extra_text_cols)
        fp = json.dumps(fingerprint_identity(dict(self.fingerprints[f])), sort_keys=True)
        return identity(f"file\x00{fmt}\x00{self.prefixes[path]}\x00{digest(spec.state(), options)}", fp.encode())

    def _batches(self) -> Generator[InputBatch, None, None]:
        start, stop, spec = self.start, self.stop, self.spec
        if start is not None:
            spec.restore(start.state.get("spec") or {})
        delay = spec.identities  # hold a batch back until the next: a cut at the next file's start ends it
        held: InputBatch | None = None
        for f in range(start.file if start is not None else 0, len(self.plan)):
            if stop is not None and (f > stop.file or (f == stop.file and stop.pos == 0 and stop.skip == 0)):
                break
            path, fmt = self.plan[f]
            here = start if start is not None and start.file == f else None
            fresh = here is None or here.pos == 0  # read (or carried) from the file's start
            file_cuts = self.cuts.get(f, ())
            if held is not None and 0 in file_cuts:
                held.grid_end = True
            unit = self.file_identity(f) if fresh else None
            until = stop if stop is not None and stop.file == f else None
            # carried whole only up to a stop it can express (a count of its rows): a slice that ends inside the
            # file at a byte or row reads up to there, or it gave back rows past its end that the next slices
            # gave too (each one then a "duplicate id" of itself)
            found = self.carry_units.get(unit) if unit is not None and (until is None or until.pos == 0) else None
            skip = here.skip if here is not None else 0
            if found is not None:
                batches = self._carried_file(f, path, found, skip, until, bool(file_cuts))
            else:
                batches = self._read_file(f, path, fmt, here if (here is not None and here.pos) else None, until,
                                          [c for c in file_cuts if c > 0], skip)
            first = True
            for batch in batches:
                if first and fresh and not skip and batch.blocks:
                    batch.blocks[0].file_unit = unit
                first = False
                if batch.end is None or batch.end.file != f:
                    batch.exits.append((f, spec.state()))
                if not delay:
                    yield batch
                    continue
                if held is not None:
                    yield held
                held = batch
        if held is not None:
            yield held

    def _read_file(
        self, f: int, path: str, fmt: str, here: ReadPoint | None, until: ReadPoint | None, cuts: Sequence[int],
        skip: int = 0,
    ) -> Iterator[InputBatch]:
        prefix = self.prefixes[path]
        if skip and here is None:  # inside a file once carried whole, now read: its first `skip` rows dropped
            return _after(self._read_file(f, path, fmt, None, until, cuts), skip)
        part = FilePart(f, here, until, tuple(cuts))
        if fmt == "jsonl":
            return read_jsonl(path, self.spec, prefix, part)
        if fmt == "parquet":
            return read_parquet(path, self.spec, prefix, part)
        if fmt in ("csv", "tsv"):
            return read_delimited(path, self.spec, prefix, fmt, part)
        return read_txt(path, self.spec, prefix, part)

    def _carried_file(
        self, f: int, path: str, found: tuple[int, int, Any], skip: int, until: ReadPoint | None, cut_at_end: bool
    ) -> Iterator[InputBatch]:
        """Input `f` carried over whole, unread, in pieces of `UNIT_PIECE` rows (a batch each)."""
        prev, rows, state = found
        last = min(rows, until.skip) if until is not None and until.pos == 0 and until.skip else rows
        done = skip
        while done < last:
            n = min(UNIT_PIECE, last - done)
            block = Block(f, 0, carried=Carried(prev + done, n, unit=True, reread=self._reread_file(f, done, n)))
            at_end = done + n >= rows
            if at_end and state is not None:
                self.spec.restore(state)
            end = (ReadPoint(f + 1, 0, 0, state={"spec": self.spec.state()}) if at_end
                   else ReadPoint(f, 0, 0, done + n, state={"spec": self.spec.state()}))
            yield InputBatch(source=path, locations=[], ids=[], texts=[], blocks=[block], end=end,
                             grid_end=at_end and cut_at_end, errors=[])
            done += n

    def _reread_file(self, f: int, skip: int, rows: int) -> Callable[[], Iterator[InputBatch]]:
        """Records `[skip, skip + rows)` of input `f` read after all (every record of it is a row)."""
        def reread() -> Iterator[InputBatch]:
            path, fmt = self.plan[f]
            spec = self.spec
            held = spec.carry_blocks, spec.carry_units, spec.carry_lines
            spec.carry_blocks = spec.carry_units = spec.carry_lines = None  # read every row of it (nothing carried)
            try:
                pos = 0
                for batch in self._read_file(f, path, fmt, None, None, ()):
                    n = len(batch)
                    lo, hi = max(skip - pos, 0), min(skip + rows - pos, n)
                    pos += n
                    if lo < hi:
                        yield _rows_of(batch, lo, hi)
                    if pos >= skip + rows:
                        return
            finally:
                spec.carry_blocks, spec.carry_units, spec.carry_lines = held
        return reread


def _after(batches: Iterator[InputBatch], skip: int) -> Iterator[InputBatch]:
    """The batches of a file whose every record is a row, from its row `skip` on."""
    pos = 0
    for batch in batches:
        n = len(batch)
        if pos + n > skip:
            yield batch if pos >= skip else _rows_of(batch, skip - pos, n, end=batch.end)
        pos += n


def _rows_of(batch: InputBatch, lo: int, hi: int, end: ReadPoint | None = None) -> InputBatch:
    """Rows `[lo, hi)` of a batch read from a file whose every record is a row, with the blocks they fill
    (a block cut at either end keeps no identity: it is not read whole)."""
    numbers = batch.numbers[lo:hi] if batch.numbers else None
    blocks = []
    for block in batch.blocks:
        a, b = max(block.first, lo), min(block.stop, hi)
        if a < b:
            whole = (a, b) == (block.first, block.stop)
            blocks.append(Block(block.file, block.start if a == block.first else (numbers[a - lo] if numbers else 0),
                                a - lo, b - lo, identity=block.identity if whole else None, group=block.group))
    if not blocks:
        blocks = [Block(batch.blocks[0].file if batch.blocks else 0, numbers[0] if numbers else 0, 0, hi - lo)]
    return InputBatch(
        source=batch.source, locations=batch.locations[lo:hi], ids=batch.ids[lo:hi], texts=batch.texts[lo:hi],
        columns={c: v[lo:hi] for c, v in batch.columns.items()},
        extra_texts={c: v[lo:hi] for c, v in batch.extra_texts.items()},
        column_types=batch.column_types, id_type=batch.id_type, numbers=numbers,
        lines=batch.lines[lo:hi] if batch.lines else None, blocks=blocks, end=end,
        errors=[],  # every record of the file is a row
    )


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
