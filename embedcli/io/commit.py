"""Writing files safely: temp names that never follow links, fsync, and commit by rename."""

from __future__ import annotations

import errno
import json
import os
import secrets
from typing import IO, Any

from embedcli.io.errors import STDIN, OutputError
from embedcli.io.location import is_url, open_random_access

STAGING_SUFFIX = ".embedcli-staging"
OLD_SUFFIX = ".embedcli-old"
INDEX_SUFFIX = ".embedcli-index.parquet"
TEMP_MARK = ".tmp-"
# The longest name embedcli puts beside an output: the index sidecar (23 bytes); a temp name
# `.NAME.tmp-PID-XXXXXXXX` adds at most 22. An output name must leave room for it.
SIBLING_RESERVE = max(len(INDEX_SUFFIX), len(STAGING_SUFFIX), 1 + len(TEMP_MARK) + 7 + 1 + 8)
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC

# --------------------------------------------------------------------------------------------------
# Paths


def temp_prefix(path: str) -> str:
    """The prefix `.NAME.tmp-` that every temp file of `path` starts with, in the same directory."""
    directory, name = os.path.split(os.path.abspath(path))
    return os.path.join(directory, f".{name}{TEMP_MARK}")


def temp_path(path: str) -> str:
    """A fresh temp name `.NAME.tmp-PID-RANDOM` next to `path` (not created: use `create_temp` to write)."""
    return f"{temp_prefix(path)}{os.getpid()}-{secrets.token_hex(4)}"


def create_temp(path: str) -> tuple[str, IO[bytes]]:
    """Create a new empty temp file next to `path`; returns (its path, the open file).

    A fresh random name opened with O_EXCL|O_NOFOLLOW: a file or symlink planted at a guessable
    name is never followed or written through (the kernel refuses instead).
    """
    for _ in range(64):
        tmp = temp_path(path)
        try:
            fd = os.open(tmp, _TEMP_FLAGS, 0o666)
        except FileExistsError:
            continue
        return tmp, os.fdopen(fd, "wb", buffering=1 << 20)
    raise FileExistsError(errno.EEXIST, "no free temp file name", temp_prefix(path))


def name_max(directory: str) -> int:
    """The longest file name (bytes) the filesystem of `directory` allows (255 when unknown)."""
    try:
        return os.pathconf(directory, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def check_name_length(path: str) -> None:
    """Raise OutputError when `path`'s name leaves no room for the staging and sidecar names beside it."""
    directory, name = os.path.split(os.path.abspath(path))
    limit = name_max(directory or ".")
    size = len(os.fsencode(name))
    if size + SIBLING_RESERVE > limit:
        raise OutputError(
            path,
            f"the file name is {size} bytes; embedcli keeps files named NAME{INDEX_SUFFIX} and "
            f"NAME{STAGING_SUFFIX} beside it, {SIBLING_RESERVE} bytes longer, and this filesystem allows {limit}",
            fix=f"choose an output name of at most {limit - SIBLING_RESERVE} bytes",
        )


def check_output_path(path: str, *, as_dir: bool = False) -> None:
    """Raise OutputError unless a file (`as_dir`: a directory of shards) can be created at `path` (`-` passes)."""
    if path == STDIN:
        return
    if as_dir or path.endswith(("/", os.sep)):  # a directory of shards: its parent must be writable
        path = os.path.abspath(path.rstrip("/" + os.sep) or path)
    elif os.path.isdir(path):
        raise OutputError(
            path, "is a directory", fix=f"name a file, e.g. {os.path.join(path, 'embeddings.parquet')}"
        )
    parent = os.path.dirname(path) or "."
    if not os.path.exists(parent):
        raise OutputError(
            path, f"directory {parent!r} does not exist", fix=f"create it first: mkdir -p {parent}"
        )
    if not os.path.isdir(parent):
        raise OutputError(path, f"{parent!r} is not a directory")
    check_name_length(path)
    check_read_only(path)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(
            path,
            f"permission denied: cannot create files in {parent!r}",
            fix="choose a directory you can write to",
        )


def read_only(directory: str) -> bool:
    """Whether `directory` sits on a file system mounted read-only."""
    try:
        return bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):
        return False


def check_read_only(path: str, shown: str | None = None) -> None:
    """OutputError when the directory `path` would be created in is on a read-only file system."""
    if path == STDIN:
        return
    parent = os.path.dirname(os.path.abspath(path.rstrip("/" + os.sep) or path))
    if os.path.isdir(parent) and read_only(parent):
        raise OutputError(
            shown or path,
            f"read-only file system: cannot create files in {parent!r}",
            fix="choose a directory on a writable file system (or remount it read-write)",
        )


def os_error(path: str, e: OSError) -> OutputError:
    reason = e.strerror or str(e)
    fix = "choose a directory you can write to" if isinstance(e, PermissionError) else None
    return OutputError(path, reason, fix=fix)


def open_temp(path: str) -> tuple[str, IO[bytes]]:
    """`create_temp(path)`, with an OSError reported as an OutputError on `path`."""
    try:
        return create_temp(path)  # closed in commit/abort
    except OSError as e:
        raise os_error(path, e) from None


def fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_parent(path: str) -> None:
    try:
        fsync_path(os.path.dirname(os.path.abspath(path)))
    except OSError:  # not supported everywhere; the rename itself is still atomic
        pass


def close_synced(f: IO[bytes]) -> None:
    f.flush()
    os.fsync(f.fileno())
    f.close()


def unlink_quiet(path: str | None) -> None:
    if path is None:
        return
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def write_atomic(path: str, data: bytes) -> None:
    """Write `data` to `path` through a fresh temp file, fsync and rename; the old file stays on any error."""
    tmp, f = create_temp(path)
    try:
        with f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        unlink_quiet(tmp)
        if e.filename is None:  # a full disk on write/fsync names no file: name the one being written
            raise OSError(e.errno, e.strerror, path) from None
        raise
    except BaseException:
        unlink_quiet(tmp)
        raise
    fsync_parent(path)


def stage_sidecar(path: str, payload: dict[str, Any]) -> str:
    """Write a JSON sidecar to a fresh temp file (fsynced) and return its path, to be renamed onto `path`."""
    tmp, f = create_temp(path)
    with f:
        # ASCII escapes: a non-UTF-8 file name (surrogate-escaped by Python) still makes valid JSON.
        f.write(json.dumps(payload, indent=2, sort_keys=True).encode("ascii") + b"\n")
        f.flush()
        os.fsync(f.fileno())
    return tmp


def arrow_source(path: str) -> Any:
    """`path` as pyarrow can open it: pyarrow takes only UTF-8 names, so a non-UTF-8 one is opened here; an
    object URL is opened through its store (a random-access file: ranged reads, never a whole download)."""
    if is_url(path):
        return open_random_access(path)
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return open(path, "rb")  # closed by pyarrow's reader (or when it is collected)
    return path
