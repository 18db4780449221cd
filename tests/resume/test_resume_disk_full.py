"""Acceptance: a full disk (ENOSPC at the write call) mid-run exits 1 with nothing half-written visible, and a
later run with space completes from the committed shards to the same output."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from resume_helpers import corpus_rows, leftovers, read_stats, write_jsonl

ROWS = 3000


def _enospc_after(monkeypatch: pytest.MonkeyPatch, target: object, name: str, calls: int) -> list[int]:
    """Make `target.name` raise ENOSPC from its `calls`-th call on; returns the call counter."""
    real = getattr(target, name)
    count = [0]

    def failing(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        count[0] += 1
        if count[0] >= calls:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(target, name, failing)
    return count


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "corpus.jsonl", corpus_rows(ROWS, seed=3))


def test_enospc_while_writing_a_shard_exits_1_then_resumes(cli, st_model: Path, corpus: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    ref = tmp_path / "ref.parquet"
    cli("embed", corpus, "-m", st_model, "-o", ref, "--shard-rows", 250, "-q")
    out = tmp_path / "out.parquet"
    with monkeypatch.context() as m:
        calls = _enospc_after(m, pq.ParquetWriter, "write_table", 6)
        result = cli("embed", corpus, "-m", st_model, "-o", out, "--shard-rows", 250, "-q", code=1)
    assert calls[0] >= 6
    assert "No space left on device" in result.stderr
    assert "free some space and rerun the same command" in result.stderr
    assert not out.exists() and not Path(f"{out}.embedcli-index.parquet").exists()
    staging = Path(f"{out}.embedcli-staging")
    parts = sorted(p.name for p in staging.iterdir() if p.name.startswith("part-"))
    assert parts and not [p for p in staging.iterdir() if ".tmp-" in p.name]  # committed shards only
    committed = json.loads((staging / "_embedcli" / "manifest.json").read_text())["records_done"]
    cli("embed", corpus, "-m", st_model, "-o", out, "--shard-rows", 250, "-q", "--stats", tmp_path / "s.json")
    stats = read_stats(tmp_path / "s.json")
    # commits fall between pools (whole 16-line blocks) once 250 rows are written
    assert stats["resumed_rows"] == committed >= 250 * len(parts)
    assert stats["computed_rows"] == ROWS - stats["resumed_rows"] and stats["rows_read"] == ROWS - committed
    assert out.read_bytes() == ref.read_bytes()
    assert leftovers(tmp_path) == []


def test_enospc_while_assembling_the_output_keeps_every_shard(cli, st_model: Path, corpus: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from embedcli.io.writers import ParquetResultWriter

    out = tmp_path / "out.parquet"
    with monkeypatch.context() as m:
        _enospc_after(m, ParquetResultWriter, "_write", 1)
        result = cli("embed", corpus, "-m", st_model, "-o", out, "--shard-rows", 1000, "-q", code=1)
    assert "No space left on device" in result.stderr
    assert not out.exists() and [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []
    cli("embed", corpus, "-m", st_model, "-o", out, "--shard-rows", 1000, "-q", "--stats", tmp_path / "s.json")
    stats = read_stats(tmp_path / "s.json")
    assert stats["computed_rows"] == 0 and stats["resumed_rows"] == ROWS  # only assembled, nothing recomputed
    assert pq.read_table(out).num_rows == ROWS
