"""The head of stdin, read before the model loads and handed back to the run's reader first.

A run checks its first record before the (slow) model start. A file can be opened twice; stdin cannot, so
the bytes read for the check are kept here and the run's reader gets them before the rest of the stream.
Reading stops at the end of the first non-blank line, so a stream whose writer waits (`tail -f | embedcli
embed - -o -`) loses nothing: the run could not have answered before that line anyway.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Iterator
from typing import IO, Any

HEAD_LIMIT = 1 << 22
"""At most this many bytes (4 MiB) are read ahead for the check; a longer first line is checked by the run."""


class _Head:
    """The bytes read ahead from stdin, not yet handed to a reader."""

    stream: object = None  # the stdin they came from (a test runner swaps stdin between runs)
    data = bytearray()
    taken = False  # a reader has begun: nothing more may be read ahead
    checking = False  # inside `checking_head`: stdin reads as its head alone


def _current() -> IO[bytes]:
    """stdin's bytes, with the read-ahead state reset when stdin is not the one it was read from."""
    stream = sys.stdin.buffer
    if stream is not _Head.stream:
        _Head.stream, _Head.data, _Head.taken = stream, bytearray(), False
    return stream


def _fd(stream: IO[bytes]) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):
        return None


def _read_some(stream: IO[bytes], n: int) -> bytes:
    """What the stream has (up to `n` bytes, at least one unless at its end), without a buffered wait."""
    fd = _fd(stream)
    if fd is not None:
        return os.read(fd, n)  # never through the buffered object: see `reader_base.pipe_lines`
    read1 = getattr(stream, "read1", None)
    return bytes(read1(n) if read1 is not None else stream.read(n))


def read_head() -> bytes:
    """The start of stdin up to the end of its first non-blank line (or its end, or HEAD_LIMIT bytes)."""
    stream = _current()
    if _Head.taken:
        return bytes(_Head.data)
    while len(_Head.data) < HEAD_LIMIT:
        line_end = _Head.data.find(b"\n")
        while line_end >= 0 and not _Head.data[:line_end].strip():
            line_end = _Head.data.find(b"\n", line_end + 1)
        if line_end >= 0:
            break
        chunk = _read_some(stream, 1 << 16)
        if not chunk:
            break
        _Head.data += chunk
    return bytes(_Head.data)


def take_head() -> bytes:
    """The bytes read ahead, handed over once: the caller reads the rest of stdin after them."""
    data = bytes(_Head.data)
    _Head.data = bytearray()
    _Head.taken = True
    return data


class _HeadThenRest(io.RawIOBase):
    """Raw bytes: the read-ahead head, then the rest of stdin."""

    def __init__(self, head: bytes, rest: IO[bytes]) -> None:
        self.head = head
        self.rest = rest

    def readable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.rest.fileno()

    def readinto(self, buffer: Any) -> int:
        if self.head:
            n = min(len(buffer), len(self.head))
            buffer[:n] = self.head[:n]
            self.head = self.head[n:]
            return n
        data = _read_some(self.rest, len(buffer))
        buffer[: len(data)] = data
        return len(data)


def stdin_stream() -> IO[bytes]:
    """stdin as a reader reads it: its head alone inside `checking_head`; else `sys.stdin.buffer` itself
    unless a head was read ahead, then head + rest."""
    stream = _current()
    if _Head.checking:
        return io.BytesIO(read_head())
    if not _Head.data:
        _Head.taken = True
        return stream
    return io.BufferedReader(_HeadThenRest(take_head(), stream), 1 << 16)


@contextlib.contextmanager
def checking_head() -> Iterator[None]:
    """Within: readers of stdin see only its head (read ahead, and kept for the run's reader)."""
    _Head.checking = True
    try:
        yield
    finally:
        _Head.checking = False


def pending_head(f: IO[bytes]) -> bytes:
    """For a reader that reads the descriptor under `f` itself: the head bytes `f` would have given first."""
    raw = getattr(f, "raw", None)
    if isinstance(raw, _HeadThenRest):
        head, raw.head = raw.head, b""
        return head
    return b""
