"""The files a run writes besides `-o` (`--stats`, `--errors-file`), checked with `-o` before any work.

Two rules: a path the run writes may never be (by name, symlink or hard link) an input or another path the
run writes, so `embed corpus.parquet -o corpus.parquet` cannot replace the corpus with its vectors (exit 2);
and each must be creatable, with a read-only file system said as such, not as "permission denied".
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from glob import glob

from embedcli.errors import STDIN, OutputError, UsageError
from embedcli.io.commit import check_read_only
from embedcli.io.location import is_url, local_path

GLOB_CHARS = re.compile(r"[*?\[]")  # as the readers expand them (`embedcli.io.readers.expand_paths`)


def check_side_file(flag: str, path: str | None) -> None:
    """OutputError unless the file of `flag` (`--stats`, `--errors-file`) can be created at `path`."""
    if not path:
        return
    if path == STDIN:  # else a file named "-" appears in the working directory
        raise UsageError(f"{flag} -: {flag} writes a file, not stdout (which only -o - writes to); name a file")
    shown = f"{flag} {path}"
    if os.path.isdir(path):
        raise OutputError(shown, "is a directory", fix=f"name a file for {flag}")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise OutputError(shown, f"directory {parent!r} does not exist", fix=f"create it first: mkdir -p {parent}")
    check_read_only(path, shown)
    if not os.access(parent, os.W_OK | os.X_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise OutputError(shown, "permission denied", fix=f"choose a {flag} path you can write to")


def _inputs(patterns: Sequence[str]) -> list[str]:
    """The existing files the input arguments name (globs expanded; a missing one is the reader's to report)."""
    out: list[str] = []
    for pattern in patterns:
        p = local_path(pattern)  # file:///abs/x is the local file; an object is never a local output
        if p == STDIN or is_url(p):
            continue
        if os.path.exists(p):
            out.append(p)
        elif GLOB_CHARS.search(p):
            out.extend(m for m in glob(p, recursive=True) if not os.path.isdir(m))
    return out


class _Named:
    """A path with its file's device and inode and its resolved name, each found once (a glob of 10,000
    inputs resolved the output's name again for each)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._real: str | None = None
        try:
            st = os.stat(path)
            self.key: tuple[int, int] | None = (st.st_dev, st.st_ino)
        except OSError:
            self.key = None

    @property
    def real(self) -> str:
        if self._real is None:
            self._real = os.path.realpath(self.path)
        return self._real

    def same(self, other: _Named) -> bool:
        """Whether both name one file: where both files are there, one inode (a hard link; names resolving
        alike are one file too); where one is there and the other not, two files (one resolved name is there
        or not for both); else the same resolved name."""
        if self.key is not None and other.key is not None:
            return self.key == other.key
        if (self.key is None) != (other.key is None):
            return False
        return self.real == other.real


    def inside(self, directory: _Named) -> bool:
        """Whether it resolves to a path below `directory`."""
        return self.real.startswith(directory.real.rstrip(os.sep) + os.sep)


def check_no_clobber(
    inputs: Sequence[str], output: str, *, output_is_dir: bool = False, writes: Sequence[tuple[str, str | None]] = ()
) -> None:
    """UsageError (exit 2) when `-o output` or a `(flag, path)` of `writes` is an input or another written path.

    Compared by resolved name and by device and inode, so symlinks and hard links are caught; a directory
    of shards may not hold an input either.
    """
    files = [_Named(src) for src in _inputs(inputs)]
    written = [("-o", output)] if output != STDIN else []
    written += [(flag, path) for flag, path in writes if path and path != STDIN]
    targets = [_Named(path) for _, path in written]
    for i, (flag, path) in enumerate(written):
        target = targets[i]
        for src in files:
            if target.same(src) or (flag == "-o" and output_is_dir and src.inside(target)):
                raise UsageError(
                    f"{flag} {path} is the input {src.path}: writing it would destroy the input; choose another {flag}"
                )
        for (other_flag, other), named in zip(written[:i], targets[:i], strict=True):
            if target.same(named) or (other_flag == "-o" and output_is_dir and target.inside(named)):
                raise UsageError(f"{flag} {path} is also {other_flag} {other}: give each its own path")


def check_foreign_file(path: str, shown: str | None = None) -> None:
    """UsageError (exit 2) when `-o path` is a non-empty file that carries no embedcli metadata: a file
    embedcli never wrote is not replaced without `--overwrite` (`shown`: the name to say, a local copy's URL)."""
    if path == STDIN or not os.path.isfile(path) or os.path.getsize(path) == 0:
        return
    raise UsageError(
        f"{shown or path} exists and was not written by embedcli (it has no embedcli metadata); "
        "pass --overwrite to replace it, or choose another -o"
    )
