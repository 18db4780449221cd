"""A truncated or corrupt model.safetensors is one line naming the file, never a SafetensorError traceback
(issue 13, errors contract)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.mark.parametrize(
    ("model", "weights", "cut"),
    [
        ("bert-st", "model.safetensors", lambda n: n - 100),  # the last tensor cut short
        ("bert-st", "model.safetensors", lambda n: n // 2),
        ("bert-st", "model.safetensors", lambda n: 5),  # not even a header
        ("bert-st6-dense", "2_Dense/model.safetensors", lambda n: n - 8),  # the Dense projector's weights
    ],
    ids=["tail", "half", "header", "dense"],
)
def test_truncated_safetensors_is_one_line_with_the_file(
    cli, tiny_model: Callable[[str], Path], tmp_path: Path, model: str, weights: str, cut: Callable[[int], int]
) -> None:
    folder = tmp_path / "model"
    shutil.copytree(tiny_model(model), folder)
    path = folder / weights
    os.truncate(path, cut(path.stat().st_size))
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"id": "a", "text": "hello"}) + "\n")
    r = cli("embed", corpus, "-m", folder, "-o", tmp_path / "o.parquet", code=1)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("embedcli: error: ") and str(path) in lines[0], r.stderr
    assert "fetch the model again" in lines[0]
