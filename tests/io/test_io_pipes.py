"""Inputs that can be read only once (a named FIFO, /dev/stdin) are never consumed by the resume fingerprint:
every row arrives, the run says it cannot resume, and a FIFO does not hang (issue 13, item 6)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from embedcli.io.errors import InputError
from embedcli.io.readers import input_fingerprint, input_fingerprints

ROWS = 40


def _lines(n: int = ROWS) -> bytes:
    return "".join(json.dumps({"id": f"p{i}", "text": f"piped text {i}"}) + "\n" for i in range(n)).encode()


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "EMBEDCLI_DTYPE": "float32", "HF_HUB_OFFLINE": "1"}


def _embed(model: Path, src: str, out: Path, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "embedcli", "embed", src, "--format", "jsonl", "-m", str(model), "-o", str(out)]
    return subprocess.run(argv, input=stdin, capture_output=True, timeout=120, env=_env(), check=False)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_named_fifo_gives_every_row_once_and_does_not_hang(st_model: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "corpus.jsonl"
    os.mkfifo(fifo)

    def feed() -> None:
        with open(fifo, "wb") as f:  # blocks until embedcli opens the FIFO for reading
            f.write(_lines())

    threading.Thread(target=feed, daemon=True).start()
    out = tmp_path / "out.parquet"
    r = _embed(st_model, str(fifo), out)
    assert r.returncode == 0, r.stderr.decode()
    assert pq.read_table(out).column("id").to_pylist() == [f"p{i}" for i in range(ROWS)]
    assert b"cannot resume" in r.stderr


def test_dev_stdin_gives_every_row(st_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.parquet"
    r = _embed(st_model, "/dev/stdin", out, stdin=_lines())
    assert r.returncode == 0, r.stderr.decode()
    assert pq.read_table(out).num_rows == ROWS
    assert b"cannot resume" in r.stderr


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_fingerprints_never_open_a_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "f.jsonl"
    os.mkfifo(fifo)
    plain = tmp_path / "a.jsonl"
    plain.write_bytes(_lines(2))
    assert input_fingerprints([str(plain), str(fifo)]) is None  # returns at once: no open() that would block
    assert input_fingerprints([str(plain)]) is not None
    with pytest.raises(InputError, match="read only once"):
        input_fingerprint(str(fifo))
