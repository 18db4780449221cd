"""Cheap identities of input files, recorded in resume manifests."""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Sequence
from typing import Any

from embedcli.io.errors import STDIN, InputError

_FINGERPRINT_CHUNK = 1 << 20


def rereadable(path: str) -> bool:
    """Whether an input can be read more than once: a regular file (not stdin, a pipe, a FIFO or a device)."""
    if path == STDIN:
        return False
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


def input_fingerprint(path: str) -> dict[str, Any]:
    """Identify an input file cheaply for resume manifests: size, mtime_ns, sha256 of first/last 1 MiB."""
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
            head = hashlib.sha256(f.read(_FINGERPRINT_CHUNK)).hexdigest()
            if st.st_size > _FINGERPRINT_CHUNK:
                f.seek(st.st_size - _FINGERPRINT_CHUNK)
                tail = hashlib.sha256(f.read(_FINGERPRINT_CHUNK)).hexdigest()
            else:
                tail = head
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
