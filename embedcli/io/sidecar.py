"""The `.meta.json` sidecar of a JSONL or .npy output, and the data identity that ties it to its data.

A JSONL/.npy output is committed data first (and the .npy's ids file before it), the sidecar last;
the sidecar names the size, mtime and sha256 of every file it describes. A kill between the renames
leaves a sidecar that names other bytes than the data beside it: `check_sidecar` sees the mismatch,
so the output never counts as complete for a run it does not belong to.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from typing import IO, Any

SIDECAR_SUFFIX = ".meta.json"
_READ_BLOCK = 1 << 20


class HashingFile:
    """A binary file that hashes (sha256) the bytes written to it after its first `skip` bytes."""

    def __init__(self, f: IO[bytes], skip: int = 0) -> None:
        self.file = f
        self.skip = skip
        self._seen = 0
        self._sha = hashlib.sha256()

    def write(self, data: bytes | memoryview) -> int:
        """Write `data` at the end, hashing what lies past the skipped prefix."""
        view = memoryview(data).cast("B")
        if self._seen + len(view) > self.skip:
            self._sha.update(view[max(0, self.skip - self._seen) :])
        self._seen += len(view)
        return self.file.write(view)

    def hexdigest(self) -> str:
        """The sha256 of the bytes written past the skipped prefix."""
        return self._sha.hexdigest()


def read_json_file(path: str) -> dict[str, Any] | None:
    """A JSON object from a file, or None."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def data_identity(path: str, sha256: str, offset: int = 0) -> dict[str, Any]:
    """What a sidecar records of a finished (synced, closed) data file: size, mtime and sha256 from `offset`."""
    st = os.stat(path)
    return {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha256, "sha256_offset": offset}


def file_sha256(path: str, offset: int = 0) -> str:
    """The sha256 of a file's bytes from `offset` on."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(offset)
        for block in iter(lambda: f.read(_READ_BLOCK), b""):
            h.update(block)
    return h.hexdigest()


def _identity_problem(path: str, ident: Any, deep: bool) -> str | None:
    name = os.path.basename(path)
    if not isinstance(ident, Mapping):
        return f"its sidecar does not describe {name}"
    try:
        st = os.stat(path)
    except OSError:
        return f"{name} is missing"
    if st.st_size != ident.get("bytes"):
        return f"{name} is {st.st_size} bytes, its sidecar names {ident.get('bytes')} (not the data it describes)"
    if deep or st.st_mtime_ns != ident.get("mtime_ns"):  # a copy keeps size but not mtime: hash to be sure
        if file_sha256(path, int(ident.get("sha256_offset") or 0)) != ident.get("sha256"):
            return f"{name} does not match the sha256 its sidecar names (not the data it describes)"
    return None


def check_sidecar(path: str, sidecar: Mapping[str, Any] | None = None, *, deep: bool = False) -> list[str]:
    """Problems tying the output `path` to its sidecar ([] when they belong together).

    Cheap by default (sizes, and a hash only when an mtime differs); `deep` always hashes.
    A sidecar written before data identities existed (no `data` key) is taken as is.
    """
    if sidecar is None:
        sidecar = read_json_file(path + SIDECAR_SUFFIX)
    if not sidecar or "data" not in sidecar:
        return []
    problems = []
    problem = _identity_problem(path, sidecar.get("data"), deep)
    if problem:
        problems.append(problem)
    if sidecar.get("ids_file"):
        ids_path = os.path.join(os.path.dirname(os.path.abspath(path)), str(sidecar["ids_file"]))
        problem = _identity_problem(ids_path, sidecar.get("ids"), deep)
        if problem:
            problems.append(problem)
    return problems
