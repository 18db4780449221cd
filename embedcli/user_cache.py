"""The per-user cache directory: exported ONNX graphs, parity-probe decisions; never outputs.

A bottom-layer utility (beside `errors` and `version`): it imports nothing from embedcli, so `models` (the
parity-probe cache) and the benchmark can both use it.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any


def user_cache_dir(*parts: str) -> Path:
    """`$EMBEDCLI_CACHE_DIR`, else `$XDG_CACHE_HOME/embedcli`, else `~/.cache/embedcli`; `parts` below it, created."""
    root = os.environ.get("EMBEDCLI_CACHE_DIR")
    if not root:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(base, "embedcli")
    path = Path(root, *parts)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def read_json(path: Path) -> dict[str, Any] | None:
    """A cached JSON object, or None when it is missing, unreadable or not an object (a cache miss)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write a cache entry atomically (fresh temp file, fsync, rename): readers see the old entry or the new one."""
    # mkstemp: O_EXCL on a fresh name beside the entry, so the rename stays on one filesystem. No directory
    # fsync: a cache entry lost to a crash is only a miss, decided again on the next run.
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write((json.dumps(data, indent=2, sort_keys=True) + "\n").encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
