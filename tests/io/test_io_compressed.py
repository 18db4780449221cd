"""Issue 22, poor errors: `.bz2`, `.xz` and `.zst` text inputs are read (as `.gz` is), not refused with a fix
(`--format`) that would read compressed bytes as text; compressed Parquet names the real fix."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ROWS = [{"id": f"r{i}", "text": f"market shares rise {i}"} for i in range(5)]


def _compress(data: bytes, path: Path) -> Path:
    suffix = path.suffix
    if suffix == ".gz":
        path.write_bytes(gzip.compress(data))
    elif suffix == ".bz2":
        path.write_bytes(bz2.compress(data))
    elif suffix == ".xz":
        path.write_bytes(lzma.compress(data))
    else:
        with pa.output_stream(str(path), compression="zstd") as f:
            f.write(data)
    return path


@pytest.mark.parametrize("name", ["docs.jsonl.gz", "docs.jsonl.bz2", "docs.jsonl.xz", "docs.jsonl.zst", "docs.csv.zst",
                                  "docs.txt.xz"])
def test_compressed_text_inputs_read_as_the_plain_file(cli, st_model, tmp_path: Path, name: str) -> None:
    fmt = name.split(".")[1]
    if fmt == "jsonl":
        data = "".join(json.dumps(r) + "\n" for r in ROWS)
    elif fmt == "csv":
        data = "id,text\n" + "".join(f"{r['id']},{r['text']}\n" for r in ROWS)
    else:
        data = "".join(r["text"] + "\n" for r in ROWS)
    plain = tmp_path / f"plain.{fmt}"
    plain.write_text(data)
    packed = _compress(data.encode(), tmp_path / name)
    cli("embed", plain, "-m", st_model, "-o", tmp_path / "a.parquet", "-q")
    cli("embed", packed, "-m", st_model, "-o", tmp_path / "b.parquet", "-q")
    a, b = pq.read_table(tmp_path / "a.parquet"), pq.read_table(tmp_path / "b.parquet")
    assert a.column("embedding").equals(b.column("embedding"))


def test_compressed_parquet_names_the_fix(cli, st_model, tmp_path: Path) -> None:
    src = tmp_path / "docs.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), src)
    packed = _compress(src.read_bytes(), tmp_path / "docs.parquet.zst")
    result = cli("embed", packed, "-m", st_model, "-o", tmp_path / "v.parquet", code=1)
    assert "zstd-compressed Parquet" in result.stderr and "decompress it first, to docs.parquet" in result.stderr
