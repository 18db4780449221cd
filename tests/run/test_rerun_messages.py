"""Issue 22, poor errors: a no-op rerun of a complete output whose run skipped rows exits 0 (README), and a
config refusal against interrupted work names only what changed (no false `input options: None → {…}`)."""

from __future__ import annotations

import json
from pathlib import Path


def _docs(path: Path, bad_at: int) -> Path:
    rows = [{"id": f"r{i}", "text": None if i == bad_at else f"text {i}"} for i in range(8)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_noop_rerun_of_an_output_that_skipped_rows_exits_0(cli, st_model, tmp_path):  # type: ignore[no-untyped-def]
    docs = _docs(tmp_path / "docs.jsonl", bad_at=2)
    args = ("embed", docs, "-m", st_model, "-o", tmp_path / "v.parquet", "--on-error", "skip")
    cli(*args, "-q", code=3)
    result = cli(*args, code=0)
    assert "already complete" in result.stderr and "1 bad rows were skipped" in result.stderr


def test_refusing_interrupted_work_names_only_what_changed(cli, st_model, tmp_path):  # type: ignore[no-untyped-def]
    docs = _docs(tmp_path / "docs.jsonl", bad_at=6)
    out = tmp_path / "v.parquet"
    cli("embed", docs, "-m", st_model, "-o", out, "--shard-rows", 2, "-q", code=1)  # rows 0-5 committed, staged
    assert Path(f"{out}.embedcli-staging/_embedcli/manifest.json").is_file()
    result = cli("embed", docs, "-m", st_model, "-o", out, "--shard-rows", 2, "--no-normalize", "-q", code=2)
    assert "--normalize/--no-normalize: true → false" in result.stderr
    assert "input options" not in result.stderr
