"""A refused rerun names the settings that differ, by flag, instead of two hashes."""

from __future__ import annotations

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
