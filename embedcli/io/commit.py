"""Writing files safely: temp names that never follow links, fsync, and commit by rename."""

from __future__ import annotations

import json
import os
from typing import IO, Any

from embedcli.io.errors import STDIN, OutputError

# --------------------------------------------------------------------------------------------------
# Paths


def temp_path(path: str) -> str:
    """Return the staging path `.{name}.tmp-{pid}` next to `path` (same directory, so rename is atomic)."""
    directory, name = os.path.split(os.path.abspath(path))
    return os.path.join(directory, f".{name}.tmp-{os.getpid()}")


def check_output_path(path: str) -> None:
    """Raise OutputError unless a file can be created at `path` (`-`, stdout, always passes)."""
    if path == STDIN:
        return
    if shards_dir_output(path):  # a directory of shards: its parent must be writable
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
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(
            path,
            f"permission denied: cannot create files in {parent!r}",
            fix="choose a directory you can write to",
        )


def shards_dir_output(path: str) -> bool:
    """An `-o` that names a directory of shards: a trailing /, `--shards-dir`, or a directory embedcli wrote."""
    if path.endswith(("/", os.sep)):
        return True
    from embedcli.io.manifest import manifest_path
    from embedcli.run_options import current_settings

    return os.path.isfile(manifest_path(path)) or current_settings().shards_dir


def os_error(path: str, e: OSError) -> OutputError:
    reason = e.strerror or str(e)
    fix = "choose a directory you can write to" if isinstance(e, PermissionError) else None
    return OutputError(path, reason, fix=fix)


def open_temp(path: str, tmp: str) -> IO[bytes]:
    try:
        return open(tmp, "wb")  # closed in commit/abort
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


def stage_sidecar(path: str, payload: dict[str, Any]) -> str:
    """Write a JSON sidecar to its staging path (fsynced) and return that path."""
    tmp = temp_path(path)
    with open(tmp, "wb") as f:
        f.write(json.dumps(payload, indent=2, sort_keys=True, ensure_ascii=False).encode("utf-8") + b"\n")
        f.flush()
        os.fsync(f.fileno())
    return tmp
