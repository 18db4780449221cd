"""Issue 26's acceptance at its size: the 2,225 BBC articles into each store equal the Parquet output; 20 changed,
10 deleted and 15 added rows rerun with --incremental compute exactly those 35, and the store then equals a fresh
full run (tiny model: the store path, not the model, is under test)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from embedcli.bench import bbc_texts
from tests.stores.test_store_cli import _assert_store_equals, _parquet_rows, _write


@pytest.mark.parametrize("kind", ["lance", "postgres"])
def test_bbc_articles_into_a_store_then_incremental(
    cli: Callable[..., Any], st_model: Path, tmp_path: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    url = request.getfixturevalue("lance_url")() if kind == "lance" else request.getfixturevalue("pg_url")()
    texts = bbc_texts()
    assert len(texts) == 2225
    rows = [{"id": f"a{i}", "text": t, "tag": i % 7} for i, t in enumerate(texts)]
    first = _write(tmp_path / "c.jsonl", rows)
    cli("embed", first, "-m", st_model, "-o", tmp_path / "full.parquet", "--keep-cols", "tag", "-q")
    cli("embed", first, "-m", st_model, "-o", url, "--keep-cols", "tag", "-q")
    _assert_store_equals(url, _parquet_rows(tmp_path / "full.parquet"))

    order = np.random.default_rng(0).permutation(len(rows)).tolist()
    changed, deleted = set(order[:20]), set(order[20:30])
    later = [dict(r, text=r["text"] + " (edited)") if k in changed else r for k, r in enumerate(rows) if k not in deleted]
    later += [{"id": f"n{j}", "text": texts[j] + " (new)", "tag": 1} for j in range(15)]
    second = _write(tmp_path / "c2.jsonl", later)
    stats = tmp_path / "stats.json"
    cli("embed", second, "-m", st_model, "-o", url, "--keep-cols", "tag", "--incremental", "-q", "--stats", stats)
    assert json.loads(stats.read_text())["computed_rows"] == 35
    cli("embed", second, "-m", st_model, "-o", tmp_path / "fresh.parquet", "--keep-cols", "tag", "-q")
    _assert_store_equals(url, _parquet_rows(tmp_path / "fresh.parquet"))
