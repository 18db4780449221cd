"""Identities of input files, recorded in resume manifests, and why two runs' inputs differ."""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Sequence
from typing import Any

from embedcli.io.errors import STDIN, InputError, display_path
from embedcli.io.location import is_url, object_fingerprint

_FINGERPRINT_CHUNK = 1 << 20
# Inputs up to this size are identified by a hash of their content (see `input_fingerprint`).
CONTENT_HASH_LIMIT = 1 << 30


def rereadable(path: str) -> bool:
    """Whether an input can be read more than once: a regular file (not stdin, a pipe, a FIFO or a device)."""
    if path == STDIN:
        return False
    if is_url(path):
        return True  # an object can be read again (it may change: its fingerprint says so)
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return True  # a missing file is reported by whoever opens it


def input_fingerprints(paths: Sequence[str]) -> list[dict[str, Any]] | None:
    """Fingerprints of every input, or None when one can be read only once (such a run cannot resume).

    A pipe, FIFO or stdin is never opened here: reading it to fingerprint it would consume it.
    """
    if not all(rereadable(p) for p in paths):
        return None
    return [input_fingerprint(p) for p in paths]


def input_fingerprint(path: str, content_limit: int = CONTENT_HASH_LIMIT) -> dict[str, Any]:
    """Identify an input file for resume manifests and reruns.

    Up to `content_limit` bytes: the size and a BLAKE2b hash of the whole content, so a regenerated or
    moved file with the same bytes is the same input (hashing runs at about 1 GB/s, read once per run).
    Larger files: size, mtime_ns and sha256 of the first and last 1 MiB (touching one recomputes it).
    A pipe, FIFO or device is refused before it is opened: reading it would consume it. An object (a URL): its
    size, ETag and modification time as the store gives them, nothing read (`location.object_fingerprint`).
    """
    if is_url(path):
        return object_fingerprint(path)
    if path == STDIN:
        raise InputError(
            path,
            "stdin cannot be fingerprinted, so a run reading it cannot resume",
            fix="write the input to a file first",
        )
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise InputError(
                path,
                "is not a regular file (a pipe, FIFO or device): it can be read only once, so it is not fingerprinted",
                fix="write the input to a file first to make the run resumable",
            )
        with open(path, "rb") as f:
            if st.st_size <= content_limit:
                digest = hashlib.blake2b(digest_size=16)
                while chunk := f.read(_FINGERPRINT_CHUNK):
                    digest.update(chunk)
                return {"path": os.path.abspath(path), "size": st.st_size, "blake2b": digest.hexdigest()}
            head = hashlib.sha256(f.read(_FINGERPRINT_CHUNK)).hexdigest()
            f.seek(st.st_size - _FINGERPRINT_CHUNK)
            tail = hashlib.sha256(f.read(_FINGERPRINT_CHUNK)).hexdigest()
    except FileNotFoundError:
        raise InputError(path, "no such file", fix="check the path") from None
    except OSError as e:
        raise InputError(path, f"cannot read: {e.strerror or e}") from None
    return {
        "path": os.path.abspath(path),
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "head_sha256": head,
        "tail_sha256": tail,
        "chunk_bytes": _FINGERPRINT_CHUNK,
    }


def fingerprint_identity(fp: dict[str, Any]) -> dict[str, Any]:
    """What makes two fingerprints the same input: the content when it was hashed (not where the file is)."""
    return {k: v for k, v in fp.items() if k != "path"} if "blake2b" in fp else fp


def describe_input_change(old: list[dict[str, Any]] | None, new: list[dict[str, Any]] | None) -> str:
    """Why two runs' inputs are not the same, in one line (which file, and what changed)."""
    if old is None or new is None:
        return "the previous run read stdin" if old is None else "this run reads stdin"
    old_by_path = {fp.get("path"): fp for fp in old}
    new_paths = {fp.get("path") for fp in new}
    paired = set()
    reasons = []
    for i, fp in enumerate(new):
        before = old_by_path.get(fp.get("path"))
        if before is None and len(old) == len(new) and old[i].get("path") not in new_paths:
            before = old[i]  # the same place in the list under another path: a moved file
            paired.add(before.get("path"))
        name = display_path(str(fp.get("path")))
        if before is None:
            reasons.append(f"{name} is new")
        elif before.get("size") != fp.get("size"):
            reasons.append(f"{name} changed size ({before.get('size'):,} → {fp.get('size'):,} bytes)")
        elif fingerprint_identity(before) != fingerprint_identity(fp):
            what = "content" if "blake2b" in fp and "blake2b" in before else "modification time or content"
            reasons.append(f"{name} changed ({what})")
    gone = [display_path(str(p)) for p in old_by_path if p not in new_paths and p not in paired]
    if gone:
        reasons.append(f"{', '.join(gone)} no longer read")
    if not reasons and [fingerprint_identity(f) for f in old] != [fingerprint_identity(f) for f in new]:
        reasons.append("the input files or their order changed")
    return "; ".join(reasons) or "the inputs were fingerprinted differently (an older embedcli)"
