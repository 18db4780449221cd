"""Inputs are read in bounded slices (a Parquet file of one big row group too): memory follows the batch, not the file."""

from __future__ import annotations

import base64
import io
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embedcli.io import parquet_reader
from embedcli.io.readers import read_inputs


def _texts(n: int, seed: int = 0) -> list[str]:
    """`n` texts of 200 random characters: the column barely compresses, so its chunk is big."""
    rnd = random.Random(seed)
    return [base64.b64encode(rnd.randbytes(150)).decode() for _ in range(n)]


def _one_row_group(path: Path, rows: int, **cols: list[Any]) -> Path:
    texts = _texts(rows)
    pq.write_table(pa.table({"text": texts, "unread": texts, **cols}), path, row_group_size=rows)
    assert pq.ParquetFile(path).metadata.num_row_groups == 1
    return path


class _CountingFile(io.FileIO):
    """A file that records the largest single read pyarrow asks of it."""

    largest = 0

    def read(self, size: int | None = -1, /) -> bytes:
        data = super().read(size)
        _CountingFile.largest = max(_CountingFile.largest, len(data))
        return data


def test_one_row_group_is_read_a_slice_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = 20_000  # a ~4 MB text column chunk, four times the read buffer
    p = _one_row_group(tmp_path / "one.parquet", rows, id=[f"d{i}" for i in range(rows)], n=list(range(rows)))
    chunk = pq.ParquetFile(p).metadata.row_group(0).column(1).total_compressed_size
    assert chunk > 3 * parquet_reader.READ_BUFFER_BYTES
    _CountingFile.largest = 0
    monkeypatch.setattr(parquet_reader, "arrow_source", lambda path: _CountingFile(path, "rb"))
    batches = list(read_inputs([str(p)], keep_cols=["n"], batch_rows=1000))
    assert _CountingFile.largest <= parquet_reader.READ_BUFFER_BYTES  # never a whole column chunk at once
    # batches are whole 16-row blocks: each ends at the first block boundary past 1000 rows
    assert [len(b) for b in batches] == [1008] * 19 + [rows - 19 * 1008]
    whole = pq.read_table(p)
    assert [i for b in batches for i in b.ids] == whole.column("id").to_pylist()
    assert [t for b in batches for t in b.texts] == whole.column("text").to_pylist()
    assert [v for b in batches for v in b.columns["n"]] == list(range(rows))
    assert [loc for b in batches for loc in b.locations] == [f"row {i}" for i in range(rows)]


@pytest.mark.parametrize("batch_rows", [1, 7, 4096])
def test_slices_give_the_rows_of_a_whole_read(tmp_path: Path, batch_rows: int) -> None:
    rows = 5000
    p = _one_row_group(tmp_path / "one.parquet", rows)
    batches = list(read_inputs([str(p)], batch_rows=batch_rows))
    assert all(len(b) <= batch_rows for b in batches)
    assert [t for b in batches for t in b.texts] == pq.read_table(p).column("text").to_pylist()
    assert [i for b in batches for i in b.ids] == [f"one.parquet:{i}" for i in range(rows)]


_CHILD = """
import sys
from embedcli.io.readers import read_inputs
n = sum(len(b) for b in read_inputs([sys.argv[1]], batch_rows=1024))
hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM"))
print(n, int(hwm.split()[1]) * 1024)
"""


def _peak_bytes(path: Path) -> int:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss over exec from the forking (pytest) process.
    out = subprocess.run([sys.executable, "-c", _CHILD, str(path)], capture_output=True, text=True, env=env, check=True)
    return int(out.stdout.split()[1])


def _jsonl(path: Path, rows: int) -> Path:
    path.write_text("".join(json.dumps({"text": t, "unread": t}) + "\n" for t in _texts(rows)))
    return path


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads the peak RSS from /proc")
@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_peak_memory_does_not_follow_the_input(tmp_path: Path, fmt: str) -> None:
    write = _one_row_group if fmt == "parquet" else _jsonl
    small = _peak_bytes(write(tmp_path / f"small.{fmt}", 20_000))
    big = _peak_bytes(write(tmp_path / f"big.{fmt}", 200_000))  # a ~40 MB text column (chunk)
    assert big - small < 10 << 20, (small, big)  # a Parquet chunk read whole would add ~30 MB
