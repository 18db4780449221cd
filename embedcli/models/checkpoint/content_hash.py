"""A model's content hash, remembered per file state, so that a rerun stats the weights instead of reading them.

The hash (sha256 over each present file's name and bytes, 16 hex digits) is what outputs record as their model
hash and what the parity probe keys its decisions by. Reading the files costs ~0.1 s of every run for
all-MiniLM-L6-v2's 90 MB and ~10 s for a 7B model's 14 GB, no-op reruns included. So the hash of a set of files
is kept in the user cache under a key made of the folder and each file's name and stat identity (device, inode,
size, mtime and ctime in ns; a symlink, as in the Hub cache, counts as the file it points to). Any change to a
file gives it a new ctime from the kernel, so it misses the cache and is read again. As git does with racy index
entries, a hash is kept only when every file was last changed at least 2 s before it was read: a write within
the timestamps' granularity could otherwise leave a changed file with its old key. `remembered` keeps any other
value computed from files the same way (a static model's median token length).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from embedcli.io.user_cache import quiet_cache_dir, read_json, write_json

_RACY_NS = 2_000_000_000
_KEY_VERSION = 1  # bump when what the hash covers changes
_clock = time.time_ns
T = TypeVar("T")


def hash_files(folder: Path, names: Sequence[str]) -> str:
    """sha256 over the name and bytes of each of `names` that is a file in `folder` (16 hex digits)."""
    return remembered("content-hash", folder, names, lambda present: _read(folder, present), str, field="hash")


def remembered(kind: str, folder: Path, names: Sequence[str], compute: Callable[[list[str]], T], of: type[T], *,
               field: str = "value") -> T:
    """`compute(the names of `names` that are files in `folder`)`, a JSON value of type `of`, kept in the user
    cache under `kind` and the files' state (see the module docstring); computed again when one of them changes."""
    present = [(name, st) for name in names if (st := _file_stat(folder / name)) is not None]
    key = _key(folder, present)
    where = quiet_cache_dir(kind)
    entry = where / f"{key}.json" if where is not None else None
    cached = read_json(entry) if entry is not None else None
    if cached is not None and isinstance(cached.get(field), of):
        return cached[field]
    start = _clock()
    value = compute([name for name, _ in present])
    if entry is not None and all(max(st.st_mtime_ns, st.st_ctime_ns) < start - _RACY_NS for _, st in present):
        write_json(entry, {field: value, "folder": str(folder), "files": [name for name, _ in present]}, say=False)
    return value


def _file_stat(path: Path) -> os.stat_result | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st if stat.S_ISREG(st.st_mode) else None


def _key(folder: Path, present: Sequence[tuple[str, os.stat_result]]) -> str:
    files = [[name, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns] for name, st in present]
    return hashlib.sha256(json.dumps([_KEY_VERSION, str(folder.resolve()), files]).encode()).hexdigest()[:32]


def _read(folder: Path, names: Sequence[str]) -> str:
    digest = hashlib.sha256()
    for name in names:
        digest.update(name.encode())
        with (folder / name).open("rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                digest.update(block)
    return digest.hexdigest()[:16]
