"""Issue 26 through `embedcli embed -o STORE` on real files, the tiny sentence-transformers model, a real LanceDB
folder and a real Postgres + pgvector: the store's vectors equal the Parquet output's; `--incremental` computes
exactly the rows changed or new, deletes the rows gone and leaves the store equal to a fresh full run; a kill -9
mid-run and a rerun leave no duplicate and no lost row; another model or a flag a store cannot honour: exit 2."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from embedcli.io.vectors import embedding_matrix
from tests.stores.store_helpers import killed_session_gone, read_back

REPO = Path(__file__).resolve().parents[2]
N = 40


def _rows(n: int = N) -> list[dict[str, Any]]:
    return [{"id": f"d{i}", "text": f"row {i} says {'x ' * (i % 7)}", "tag": i % 3} for i in range(n)]


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _edited(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """2 texts changed, 1 row deleted, 2 rows added."""
    out = [dict(r) for r in rows if r["id"] != "d7"]
    for r in out:
        if r["id"] in ("d3", "d11"):
            r["text"] += " (edited)"
    return [*out, {"id": "n1", "text": "a new row", "tag": 9}, {"id": "n2", "text": "another new row", "tag": 9}]


def _parquet_rows(path: Path) -> dict[str, dict[str, Any]]:
    t = pq.read_table(path)
    vecs = embedding_matrix(t.column("embedding"))
    return {rid: {"embedding": vecs[i], "tag": tag}
            for i, (rid, tag) in enumerate(zip(t.column("id").to_pylist(), t.column("tag").to_pylist(), strict=True))}


def _assert_store_equals(url: str, want: dict[str, dict[str, Any]]) -> None:
    got = read_back(url)  # asserts no duplicate id
    assert sorted(got) == sorted(want)
    for rid, w in want.items():
        assert got[rid]["tag"] == w["tag"] and type(got[rid]["tag"]) is type(w["tag"]), rid  # typed as the file
        np.testing.assert_allclose(np.asarray(got[rid]["embedding"], np.float64), w["embedding"], atol=1e-6, rtol=0)


@pytest.fixture(params=["lance", "postgres"])
def store_url(request: pytest.FixtureRequest) -> Callable[[], str]:
    if request.param == "lance":
        return request.getfixturevalue("lance_url")  # type: ignore[no-any-return]
    make = request.getfixturevalue("pg_url")
    return lambda: make()  # type: ignore[no-any-return]


def test_embed_into_a_store_then_incremental_then_another_model(
    cli: Callable[..., Any], st_model: Path, tiny_model: Callable[[str], Path], tmp_path: Path,
    store_url: Callable[[], str],
) -> None:
    url = store_url()
    corpus = _write(tmp_path / "c.jsonl", _rows())
    cli("embed", corpus, "-m", st_model, "-o", tmp_path / "full.parquet", "--keep-cols", "tag", "-q")
    cli("embed", corpus, "-m", st_model, "-o", url, "--keep-cols", "tag", "-q", "--shard-rows", "16")
    _assert_store_equals(url, _parquet_rows(tmp_path / "full.parquet"))

    again = cli("embed", corpus, "-m", st_model, "-o", url, "--keep-cols", "tag")
    assert "already complete" in again.stderr

    queries = _write(tmp_path / "q.jsonl", [{"id": "q1", "text": "row 5 says"}, {"id": "q2", "text": "row 12"}])
    search = ["search", "--queries", queries, "--top-k", "5", "--keep-cols", "tag", "-q"]
    cli(*search[:1], tmp_path / "full.parquet", *search[1:], "-o", tmp_path / "want.jsonl")
    if url.startswith("lancedb://"):  # search reads the table as it reads the vectors file
        cli(*search[:1], url, *search[1:], "-o", tmp_path / "got.jsonl")
        assert (tmp_path / "got.jsonl").read_text() == (tmp_path / "want.jsonl").read_text()
    else:
        refused = cli(*search[:1], url, *search[1:], "-o", tmp_path / "got.jsonl", code=2)
        assert "pgvector" in refused.stderr

    edited = _write(tmp_path / "c2.jsonl", _edited(_rows()))
    stats = tmp_path / "stats.json"
    cli("embed", edited, "-m", st_model, "-o", url, "--keep-cols", "tag", "--incremental", "-q", "--stats", stats)
    report = json.loads(stats.read_text())
    assert report["computed_rows"] == 4  # 2 changed + 2 new
    cli("embed", edited, "-m", st_model, "-o", tmp_path / "fresh.parquet", "--keep-cols", "tag", "-q")
    _assert_store_equals(url, _parquet_rows(tmp_path / "fresh.parquet"))

    other = cli("embed", edited, "-m", tiny_model("mpnet-st"), "-o", url, "--keep-cols", "tag", "--incremental", code=2)
    assert "different config" in other.stderr and "-m/--model" in other.stderr
    assert len(other.stderr.strip().splitlines()) == 1
    _assert_store_equals(url, _parquet_rows(tmp_path / "fresh.parquet"))  # untouched
    cli("embed", edited, "-m", tiny_model("mpnet-st"), "-o", url, "--keep-cols", "tag", "--overwrite", "-q")
    cli("embed", edited, "-m", tiny_model("mpnet-st"), "-o", tmp_path / "other.parquet", "--keep-cols", "tag", "-q")
    _assert_store_equals(url, _parquet_rows(tmp_path / "other.parquet"))  # --overwrite: the table replaced


@pytest.mark.parametrize(("flags", "says"), [
    (["--shard", "0/2"], "--shard"),
    (["--incremental", "--previous", "old.parquet"], "--previous"),
    (["--output-format", "jsonl"], "--output-format"),
    (["--shards-dir"], "--shards-dir"),
    (["--outputs", "dense,sparse"], "dense vectors only"),
    (["--precision", "int8"], "--calibration"),
])
def test_flags_a_store_cannot_honour_exit_2_in_one_line(
    cli: Callable[..., Any], st_model: Path, tmp_path: Path, flags: list[str], says: str
) -> None:
    corpus = _write(tmp_path / "c.jsonl", _rows(3))
    (tmp_path / "old.parquet").write_bytes(b"")
    url = f"lancedb://{tmp_path}/db/docs"
    result = cli("embed", corpus, "-m", st_model, "-o", url, *flags, code=2)
    assert says in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "db").exists()


PG = "embedcli.io.stores.postgres:PostgresStore"
LANCE = "embedcli.io.stores.lance:LanceStore"
KILLS = [
    ("postgres", f"after:{PG}._copy:3"),  # mid-batch: rows sent, not committed
    ("postgres", f"after:{PG}._save_point:2"),  # inside a commit: its resume point written, before COMMIT
    ("postgres", f"after:{PG}._index:1"),  # the final step
    ("lance", f"before:{LANCE}._merge:3"),  # mid-run: rows held, not written
    ("lance", f"after:{LANCE}._merge:2"),  # inside a commit: rows upserted, resume point not yet
    ("lance", "after:lancedb.table:LanceTable.optimize:1"),  # the final step
]


@pytest.mark.parametrize(("kind", "step"), KILLS, ids=[f"{k}-{s.split(':')[0]}-{s.split(':')[2]}" for k, s in KILLS])
def test_kill_9_mid_run_then_rerun_loses_and_repeats_nothing(
    cli: Callable[..., Any], st_model: Path, tmp_path: Path, kind: str, step: str,
    pg_url: Callable[..., str], lance_url: Callable[[], str],
) -> None:
    url = pg_url(index="hnsw") if kind == "postgres" else lance_url()
    corpus = _write(tmp_path / "c.jsonl", _rows())
    args = ["embed", str(corpus), "-m", str(st_model), "-o", url, "--keep-cols", "tag", "--shard-rows", "8", "-q"]
    env = {**os.environ, "EMBEDCLI_DTYPE": "float32",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    child = subprocess.run([sys.executable, str(Path(__file__).with_name("cli_child.py")), step, *args],
                           env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert child.returncode == -signal.SIGKILL, child.stderr[-3000:]
    if kind == "postgres":
        killed_session_gone(url)
    held = len(read_back(url))  # asserts no duplicate id

    rerun = cli(*args[:-1], "--stats", tmp_path / "stats.json")
    assert "resuming" in rerun.stderr
    assert json.loads((tmp_path / "stats.json").read_text())["computed_rows"] == N - held  # the rest, only
    cli("embed", corpus, "-m", st_model, "-o", tmp_path / "full.parquet", "--keep-cols", "tag", "-q")
    _assert_store_equals(url, _parquet_rows(tmp_path / "full.parquet"))
