"""The per-user cache directory: exported ONNX graphs, parity-probe decisions, model content hashes; never outputs.

Files only, so it sits in `io`: `models` (the parity-probe cache) and the benchmark both use it, and an entry
is written with the one atomic-file helper (`embedcli.io.commit.write_atomic`).
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from embedcli.io.commit import write_atomic

_UNUSABLE: dict[str, Path] = {}  # cache root that cannot be used -> this process's throwaway stand-in


def _say_once(root: str, why: str) -> Path:
    """A throwaway directory standing in for an unusable cache root, with one note on stderr per root."""
    if root not in _UNUSABLE:
        _UNUSABLE[root] = Path(tempfile.mkdtemp(prefix="embedcli-cache-"))
        atexit.register(shutil.rmtree, _UNUSABLE[root], ignore_errors=True)
        print(f"embedcli: note: the cache {root} cannot be used ({why}); deciding without it "
              "(set EMBEDCLI_CACHE_DIR to a writable folder to keep decisions between runs)", file=sys.stderr)
    return _UNUSABLE[root]


def user_cache_dir(*parts: str) -> Path:
    """`$EMBEDCLI_CACHE_DIR`, else `$XDG_CACHE_HOME/embedcli`, else `~/.cache/embedcli`; `parts` below it, created.

    A cache is an optimisation: where it cannot be created or written (a read-only home in a container or a
    cron job) a throwaway directory stands in, said once on stderr, and the run goes on without it."""
    root = _root()
    if root in _UNUSABLE:
        path = Path(_UNUSABLE[root], *parts)
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        return path
    path = Path(root, *parts)
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError("not writable")
    except OSError as e:
        stand_in = Path(_say_once(root, e.strerror or str(e)), *parts)
        stand_in.mkdir(mode=0o700, parents=True, exist_ok=True)
        return stand_in
    return path


def quiet_cache_dir(*parts: str) -> Path | None:
    """`user_cache_dir(*parts)` where it can be created and written, else None, with nothing said: for a cache
    whose absence costs only time, in runs that may use no other cache."""
    root = _root()
    if root in _UNUSABLE:
        return None
    path = Path(root, *parts)
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        return None
    return path if os.access(path, os.W_OK | os.X_OK) else None


def _root() -> str:
    root = os.environ.get("EMBEDCLI_CACHE_DIR")
    if not root:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(base, "embedcli")
    return root


def read_json(path: Path) -> dict[str, Any] | None:
    """A cached JSON object, or None when it is missing, unreadable or not an object (a cache miss)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_json(path: Path, data: dict[str, Any], *, say: bool = True) -> None:
    """Write a cache entry atomically: readers see the old entry or the new one; a cache that cannot be
    written (full, read-only) loses the entry, said once (unless `say` is False), and the run goes on."""
    try:
        write_atomic(str(path), (json.dumps(data, indent=2, sort_keys=True) + "\n").encode("utf-8"))
    except OSError as e:
        if say:
            _say_once(str(path.parent), e.strerror or str(e))
