"""The per-user cache directory: exported ONNX graphs, parity-probe decisions; never outputs.

Files only, so it sits in `io`: `models` (the parity-probe cache) and the benchmark both use it, and an entry
is written with the one atomic-file helper (`embedcli.io.commit.write_atomic`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from embedcli.io.commit import write_atomic


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
    """Write a cache entry atomically: readers see the old entry or the new one."""
    write_atomic(str(path), (json.dumps(data, indent=2, sort_keys=True) + "\n").encode("utf-8"))
