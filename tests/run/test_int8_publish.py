"""`embed --precision int8` publishes its quantized output through the one whole-output publisher (`run.whole`)."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

import pyarrow.parquet as pq

from embedcli.io.manifest import staging_dir


def _corpus(path: Path, n: int = 12) -> Path:
    path.write_text("".join(json.dumps({"id": f"d{i}", "text": f"row number {i}"}) + "\n" for i in range(n)))
    return path


def test_int8_does_not_publish_while_another_run_holds_the_output(cli, st_model: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    corpus, out = _corpus(tmp_path / "in.jsonl"), tmp_path / "out.parquet"
    root = staging_dir(str(out))
    os.mkdir(root)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a run writing this output holds it
    try:
        result = cli("embed", corpus, "-m", st_model, "-o", out, "--precision", "int8", code=1)
        assert "another embedcli run is writing this output" in result.stderr and not out.exists()
    finally:
        os.close(fd)
    cli("embed", corpus, "-m", st_model, "-o", out, "--precision", "int8", "-q")
    table = pq.read_table(out)
    assert table.num_rows == 12 and not Path(root).exists()
    meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
    assert meta["embedcli.complete"] == "true" and meta["embedcli.rows"] == "12"
    assert "ranges" in json.loads(meta["embedcli.quantization"])
    again = cli("embed", corpus, "-m", st_model, "-o", out, "--precision", "int8")
    assert "already complete" in again.stderr


def test_int8_over_a_file_embedcli_never_wrote_is_refused_even_beside_a_spool(cli, st_model: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    corpus, out = _corpus(tmp_path / "in.jsonl"), tmp_path / "out.jsonl"
    out.write_text("my own notes\n")
    (tmp_path / "out.jsonl.embedcli-float32.parquet").write_bytes(b"not a spool of this run")
    result = cli("embed", corpus, "-m", st_model, "-o", out, "--precision", "int8", code=2)
    assert "not written by embedcli" in result.stderr
    assert out.read_text() == "my own notes\n"
