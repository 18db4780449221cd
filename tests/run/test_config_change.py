"""A refused rerun names the settings that differ, by flag, instead of two hashes."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.resume.resume_helpers import write_jsonl


def test_config_mismatch_names_the_flags(cli, st_model: Path, tmp_path: Path) -> None:
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"id": f"r{i}", "text": f"a {i}", "body": f"b {i}"} for i in range(4)])
    out = tmp_path / "v.parquet"
    cli("embed", corpus, "-m", st_model, "-o", out, "-q")
    res = cli("embed", corpus, "-m", st_model, "-o", out, "-q", "--dtype", "bfloat16", "--text-col", "body", code=2)
    assert "--dtype: float32 → bfloat16" in res.stderr
    assert "--text-col: text → body" in res.stderr
    assert "hash" not in res.stderr
    res = cli("embed", corpus, "-m", st_model, "-o", out, "-q", "--incremental", "--no-normalize", code=2)
    assert "--normalize/--no-normalize: true → false" in res.stderr


def test_regenerated_or_moved_input_is_not_recomputed(cli, st_model: Path, tmp_path: Path) -> None:
    rows = [{"id": f"r{i}", "text": f"text number {i}"} for i in range(6)]
    corpus = write_jsonl(tmp_path / "c.jsonl", rows)
    out = tmp_path / "v.parquet"
    cli("embed", corpus, "-m", st_model, "-o", out)
    before = out.read_bytes()
    write_jsonl(corpus, rows)  # regenerated: same bytes, new mtime
    os.utime(corpus, ns=(10**18, 10**18))
    res = cli("embed", corpus, "-m", st_model, "-o", out)
    assert "already complete" in res.stderr and out.read_bytes() == before
    moved = tmp_path / "sub"
    moved.mkdir()
    corpus.rename(moved / "c.jsonl")
    res = cli("embed", moved / "c.jsonl", "-m", st_model, "-o", out)
    assert "already complete" in res.stderr and out.read_bytes() == before
    write_jsonl(moved / "c.jsonl", [*rows, {"id": "r6", "text": "one more"}])
    res = cli("embed", moved / "c.jsonl", "-m", st_model, "-o", out)
    assert "c.jsonl changed size (" in res.stderr, res.stderr


def test_incremental_carries_over_a_first_run_made_without_it(cli, st_model: Path, tmp_path: Path) -> None:
    rows = [{"id": f"r{i}", "text": f"text number {i}"} for i in range(5)]
    corpus = write_jsonl(tmp_path / "c.jsonl", rows)
    out = tmp_path / "v.parquet"
    cli("embed", corpus, "-m", st_model, "-o", out, "-q")
    assert Path(f"{out}.embedcli-index.parquet").exists()  # written without --incremental: this is why
    write_jsonl(corpus, [*rows, {"id": "r5", "text": "a new row"}])
    stats = tmp_path / "s.json"
    cli("embed", corpus, "-m", st_model, "-o", out, "-q", "--incremental", "--stats", stats)
    report = json.loads(stats.read_text())
    assert (report["carried_rows"], report["computed_rows"]) == (5, 1)
