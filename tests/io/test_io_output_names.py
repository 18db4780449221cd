"""Output names: an extension that promises another format is refused before any work (issue 13, item 14)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def _corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"id": f"d{i}", "text": f"text {i}"}) + "\n" for i in range(3)))
    return path


@pytest.mark.parametrize("name", ["vectors.json", "vectors.csv", "vectors.txt"])
def test_output_extension_of_another_format_is_refused(cli, st_model: Path, tmp_path: Path, name: str) -> None:
    corpus = _corpus(tmp_path)
    r = cli("embed", corpus, "-m", st_model, "-o", tmp_path / name, code=2)
    assert ".jsonl" in r.stderr and ".npy" in r.stderr and ".parquet" in r.stderr and "--output-format" in r.stderr
    assert "Traceback" not in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.jsonl"]  # nothing written, nothing staged


def test_output_format_flag_writes_that_format_under_any_name(cli, st_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "vectors.json"
    cli("embed", _corpus(tmp_path), "-m", st_model, "-o", out, "--output-format", "jsonl", "-q")
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["d0", "d1", "d2"]
