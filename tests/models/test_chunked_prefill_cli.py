"""`embedcli embed --stats` says how inputs over the token budget ran: sliced (decoders) or solo (encoders)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from embedcli.cli import app

LONG = " ".join(["the cat sat on the mat"] * 7)  # 84 tokens: over a budget of 24, under 128 positions
TEXTS = ["a dog", LONG, "the cat sat on the mat", "one two three"]


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.jsonl"
    with path.open("w", encoding="utf-8") as f:
        for i, text in enumerate(TEXTS):
            f.write(json.dumps({"id": f"doc{i}", "text": text}) + "\n")
    return path


def _embed(model: Path, corpus: Path, out: Path, budget: int | None) -> tuple[np.ndarray, dict]:
    stats = out.with_suffix(".stats.json")
    args = ["embed", str(corpus), "-o", str(out), "-m", str(model), "--dtype", "float32", "-q", "--stats", str(stats)]
    if budget is not None:
        args += ["--max-batch-tokens", str(budget)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    vectors = np.asarray(pq.read_table(out).column("embedding").to_pylist(), dtype=np.float32)
    return vectors, json.loads(stats.read_text())


@pytest.mark.parametrize("name, key", [("llama", "sliced_rows"), ("bert-st", "solo_rows")])
def test_stats_name_sliced_and_solo_rows(tiny_model, corpus: Path, tmp_path: Path, name: str, key: str) -> None:
    model = tiny_model(name)
    whole, whole_stats = _embed(model, corpus, tmp_path / "whole.parquet", None)
    small, small_stats = _embed(model, corpus, tmp_path / "small.parquet", 24)
    assert whole_stats["sliced_rows"] == whole_stats["solo_rows"] == 0
    assert small_stats[key] == 1, small_stats
    other = "solo_rows" if key == "sliced_rows" else "sliced_rows"
    assert small_stats[other] == 0
    assert small_stats["tokens"] == whole_stats["tokens"]
    np.testing.assert_allclose(small, whole, atol=1e-5)
