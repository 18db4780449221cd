"""Output errors that break the contract (issue 13): a read-only filesystem is reported as such, and a disk
full before the run starts names the file it could not write; one line, never a traceback."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest


def _corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.jsonl"
    path.write_text(json.dumps({"id": "a", "text": "hello"}) + "\n")
    return path


def test_read_only_filesystem_is_reported_as_such(cli, st_model: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    out_dir = tmp_path / "ro"
    out_dir.mkdir()
    real_statvfs, real_access = os.statvfs, os.access

    class _ReadOnly:  # what statvfs says of a filesystem mounted read-only
        def __init__(self, st: os.statvfs_result) -> None:
            self._st = st

        def __getattr__(self, name: str) -> int:
            return os.ST_RDONLY | self._st.f_flag if name == "f_flag" else getattr(self._st, name)

    def statvfs(path):  # type: ignore[no-untyped-def]
        st = real_statvfs(path)
        return _ReadOnly(st) if os.path.abspath(path) == str(out_dir) else st

    def access(path, mode, *a, **k):  # type: ignore[no-untyped-def]
        # access(2) answers EROFS as "no" for W_OK, as on a real read-only mount (also as root)
        return False if os.path.abspath(path) == str(out_dir) and mode & os.W_OK else real_access(path, mode, *a, **k)

    monkeypatch.setattr(os, "statvfs", statvfs)
    monkeypatch.setattr(os, "access", access)
    r = cli("embed", _corpus(tmp_path), "-m", st_model, "-o", out_dir / "o.parquet", code=1)
    assert "read-only file system" in r.stderr and "permission denied" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_disk_full_before_the_run_starts_names_the_file(cli, st_model: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    def fsync(fd: int) -> None:  # the first durable write of the run: its manifest
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", fsync)
    out = tmp_path / "o.parquet"
    r = cli("embed", _corpus(tmp_path), "-m", st_model, "-o", out, code=1)
    (line,) = r.stderr.strip().splitlines()
    assert "No space left on device" in line and f"{out}.embedcli-staging" in line, line
