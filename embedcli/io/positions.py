"""Where a run's reading stands, and the blocks it reads in: what lets a resume, a `--shard` and a rerun seek
and carry instead of reading again.

A **block** is a short stretch of one input file: lines `16k+1 .. 16k+16` of a text input, or rows
`16k .. 16k+15` from the start of each Parquet row group, cut sooner where its text passes `BLOCK_BYTES`.
Where a block starts depends on the file alone, so the same bytes give the same blocks in every run; a
batch of the run loop is a whole number of blocks, and so are the run's commits. A block whose records all
became rows is written to the output's row index with its **identity**: a BLAKE2b of its raw content and
its context (file format, default-id prefix, id field, reader types, first line/row). A later run that
meets a block of the same identity knows, before reading its text, that it gives the same rows, and
carries them over from the previous output. Each row of a text input also has its **line identity** (a
BLAKE2b-64 of its raw line under the same context): in a block that changed, a line of the same identity at
the same line number gives the same row, and is carried over alone.

A `ReadPoint` is a position between two blocks: the file (its index in the run's inputs), the byte offset
of the next line (text; in the decompressed stream) or the next row (Parquet), the lines read before it,
and the reader state a reader needs to go on from there (the types fixed so far, a JSONL file's id field).
The resume manifest records one after every commit (`embedcli.io.manifest`), so a resumed run opens each
input at the point its last commit reached instead of reading the committed records again.
"""

from __future__ import annotations

import base64
import functools
import hashlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

BLOCK_LINES = 16
"""Lines of a text input (rows of a Parquet row group) in a block; blocks start at line 1 + 16k."""
BLOCK_BYTES = 1 << 16
"""A block also ends at the line (row) that brings its text to this many bytes (or an eighth of a batch's
text, where that is less): long documents make short blocks, so a batch of whole blocks still holds a few
forwards."""
IDENTITY_BYTES = 16
LOC_SHIFT = 40
"""A row's packed location: its input file's index << LOC_SHIFT | its line (text) or row (Parquet) number."""
UNIT_PIECE = 1 << 16
"""A file or row group carried over whole is handed on in pieces of this many rows (a batch each)."""


@dataclass(frozen=True)
class ReadPoint:
    """A position between two blocks of a run's inputs (see the module docstring)."""

    file: int = 0
    pos: int = 0  # text: byte offset of the next line; Parquet: the next row
    line: int = 0  # text: lines before `pos` (the next line is line + 1); Parquet: = pos
    skip: int = 0  # rows of a carried unit (file or row group) starting at `pos` already done
    state: Mapping[str, Any] = field(default_factory=dict)  # the readers' state there (JSON values)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view."""
        return {"file": self.file, "pos": self.pos, "line": self.line, "skip": self.skip, "state": dict(self.state)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ReadPoint:
        """Parse `to_dict`'s view (ValueError when it is not one)."""
        try:
            return cls(int(data["file"]), int(data["pos"]), int(data["line"]), int(data.get("skip", 0)),
                       dict(data.get("state") or {}))
        except (KeyError, TypeError) as e:
            raise ValueError(f"not a read point: {e}") from None

    def order(self) -> tuple[int, int, int]:
        """Sort key: earlier points first."""
        return self.file, self.pos, self.skip


@dataclass(frozen=True)
class FilePart:
    """What a reader reads of one input file: the file's index in the run's inputs, where to start and stop
    (`ReadPoint`s, None: its start and end) and where a batch must end (`cuts`: byte offsets of a text file,
    rows of a Parquet one; see `embedcli.run.grid`)."""

    file: int = 0
    start: ReadPoint | None = None
    stop: ReadPoint | None = None
    cuts: tuple[int, ...] = ()


WHOLE = FilePart()


@dataclass(frozen=True)
class Carried:
    """A block, file or row group whose rows are taken over from the previous output without reading it."""

    prev: int  # first row in the previous output
    rows: int
    unit: bool = False  # a whole file or row group (else one block)
    # The rows read after all, as batches, when the run cannot take them over (an id seen earlier in this run).
    reread: Callable[[], Iterator[Any]] | None = None


@dataclass
class Block:
    """One block of a batch: its parsed rows `[first, stop)` of the batch, or the rows it carries over."""

    file: int
    start: int  # first line (text, 1-based) or row (Parquet, 0-based) of the block in its file
    first: int = 0
    stop: int = 0
    errors: int = 0  # bad rows the reader reported in it
    identity: bytes | None = None
    group: int = -1  # Parquet row group
    carried: Carried | None = None
    unit: bytes | None = None  # on a Parquet row group's first block: the row group's identity
    file_unit: bytes | None = None  # on a file's first block: the file's identity
    # A block that changed, read in pieces (its unchanged lines carried over, the others read): on its first
    # piece, its identity and how many pieces it has (the identity goes to its first row if all its records
    # become rows, as for a block read whole)
    whole: bytes | None = None
    pieces: int = 0
    piece: bool = False  # one piece of such a block

    @property
    def records(self) -> int:
        """Input records of the block: rows (read or carried) and bad rows."""
        return (self.carried.rows if self.carried is not None else self.stop - self.first) + self.errors


def type_state(id_type: pa.DataType | None, kept: Mapping[str, pa.DataType], null_kept: set[str]) -> dict[str, Any]:
    """The readers' types as JSON values (an Arrow schema, base64)."""
    fields = [pa.field("\x00id", id_type)] if id_type is not None else []
    fields += [pa.field(name, t) for name, t in kept.items()]
    raw = pa.schema(fields).serialize().to_pybytes()
    return {"types": base64.b64encode(raw).decode("ascii"), "null_kept": sorted(null_kept)}


def parse_type_state(state: Mapping[str, Any]) -> tuple[pa.DataType | None, dict[str, pa.DataType], set[str]]:
    """`type_state` back: (id type, kept column types, kept columns typed from nulls)."""
    schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(state["types"])))
    id_type = schema.field("\x00id").type if "\x00id" in schema.names else None
    kept = {f.name: f.type for f in schema if f.name != "\x00id"}
    return id_type, kept, set(state.get("null_kept", []))


def digest(*parts: object) -> str:
    """A short hex digest of some values (a context's)."""
    h = hashlib.blake2b(digest_size=8)
    for p in parts:
        h.update(repr(p).encode("utf-8", "surrogateescape"))
        h.update(b"\x00")
    return h.hexdigest()


def line_identities(context: str, data: bytes, ends: Sequence[int]) -> np.ndarray:
    """Each line's identity: BLAKE2b-64 of its context and raw bytes (int64, never 0: a null's stand-in).

    A line of a block that changed gives the same row as the previous output's line of the same identity at
    the same line number (`PreviousOutput.line_rows` checks the number), so it is carried over alone."""
    h0 = _line_hasher(context)
    view = memoryview(data)
    parts = []
    at = 0
    for end in ends:
        h = h0.copy()
        h.update(view[at:end])
        parts.append(h.digest())
        at = end
    ids = np.frombuffer(b"".join(parts), "<i8").copy()
    ids[ids == 0] = 1
    return ids


@functools.lru_cache(maxsize=64)
def _line_hasher(context: str) -> Any:
    key = hashlib.blake2b(context.encode("utf-8", "surrogateescape")).digest()  # fixed length: no prefix is another's
    return hashlib.blake2b(key, digest_size=8, person=b"embedcli-line")


def identity(context: str, *payload: bytes | memoryview) -> bytes:
    """A block's identity: BLAKE2b-128 of its context and raw content."""
    h = hashlib.blake2b(context.encode("utf-8", "surrogateescape"), digest_size=IDENTITY_BYTES)
    for p in payload:
        h.update(p)
    return h.digest()
