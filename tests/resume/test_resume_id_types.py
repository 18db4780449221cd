"""Integer ids survive the run machinery (issue 15, section 2): a run killed and resumed, and `--shard` parts
joined by `merge`, give the int64 `id` column of an uninterrupted run."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from resume_helpers import corpus_rows, embed_argv, run_embed_process, subprocess_env, write_jsonl

ROWS = 3000
SHARD_ROWS = 100


def _int_corpus(path: Path) -> Path:
    return write_jsonl(path, [{"id": 10 * i, "text": r["text"]} for i, r in enumerate(corpus_rows(ROWS, seed=5))])


def _committed(out: Path) -> int:
    manifest = Path(f"{out}.embedcli-staging") / "_embedcli" / "manifest.json"
    try:
        return int(json.loads(manifest.read_text())["records_done"])
    except (OSError, ValueError, KeyError):
        return -1


def test_killed_and_resumed_run_keeps_int_ids(st_model: Path, tmp_path: Path) -> None:
    corpus = _int_corpus(tmp_path / "corpus.jsonl")
    out = tmp_path / "out.parquet"
    argv = embed_argv(corpus, "-m", st_model, "-o", out, "--shard-rows", SHARD_ROWS, "-q")
    proc = subprocess.Popen(argv, env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 90
    while proc.poll() is None and _committed(out) < 2 * SHARD_ROWS and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert 0 < _committed(out) < ROWS, "the kill must land mid-run, with shards staged"
    done = run_embed_process(corpus, "-m", st_model, "-o", out, "--shard-rows", SHARD_ROWS, "-q")
    assert done.returncode == 0, done.stderr
    got = pq.read_table(out)
    assert got.schema.field("id").type == pa.int64()
    assert got.column("id").to_pylist() == [10 * i for i in range(ROWS)]


def test_shards_of_int_ids_merge_to_int_ids(cli, st_model: Path, tmp_path: Path) -> None:
    corpus = _int_corpus(tmp_path / "corpus.jsonl")
    parts = [tmp_path / f"part-{k}.parquet" for k in range(2)]
    for k, part in enumerate(parts):
        cli("embed", corpus, "-m", st_model, "-o", part, "--shard", f"{k}/2", "--shard-rows", 1000, "-q")
        assert pq.read_schema(part).field("id").type == pa.int64()
    merged = tmp_path / "merged.parquet"
    cli("merge", *parts, "-o", merged, "-q")
    got = pq.read_table(merged)
    assert got.schema.field("id").type == pa.int64()
    assert got.column("id").to_pylist() == [10 * i for i in range(ROWS)]
