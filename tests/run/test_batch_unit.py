"""The loop's unit of work is a few packed forwards, whatever the text length: progress, commits and stops
act between batches, so batches are cut by text size as well as by rows (the same records in every run)."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

from tests.resume.resume_helpers import corpus_rows, write_jsonl


def test_log_every_prints_a_line_per_batch_of_a_few_forwards(cli, st_model: Path, tmp_path: Path) -> None:
    corpus = write_jsonl(tmp_path / "c.jsonl", corpus_rows(600))
    chars = sum(len(r["text"]) for r in corpus_rows(600))
    # A budget of 256 tokens: a batch holds about 4 forwards, 4 * 256 tokens * 4 chars = 4,096 characters.
    res = cli("embed", corpus, "-m", st_model, "-o", tmp_path / "v.parquet", "--max-batch-tokens", 256,
              "--log-every", 0)
    done = [int(m.group(1).replace(",", "")) for m in re.finditer(r"embedcli: ([\d,]+)(?:/600)? rows ", res.stderr)]
    assert len(done) >= chars // 4096 >= 10, res.stderr
    assert done == sorted(done) and done[-1] == 600
    assert max(b - a for a, b in itertools.pairwise([0, *done])) < 1024


def test_jsonl_and_csv_inputs_have_a_total(cli, st_model: Path, tmp_path: Path) -> None:
    rows = corpus_rows(30)
    jsonl = write_jsonl(tmp_path / "c.jsonl", rows)
    csv = tmp_path / "c.csv"
    csv.write_text("id,text\n" + "".join(f'{r["id"]},"{r["text"]}"\n' for r in rows), encoding="utf-8")
    for src in (jsonl, csv):
        res = cli("embed", src, "-m", st_model, "-o", tmp_path / f"{src.suffix[1:]}.parquet", "--log-every", 0)
        assert "30/30 rows (100.0%)" in res.stderr, res.stderr
