"""The README's DuckDB query and nightly cron script, run as written against a tiny model."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.resume.resume_helpers import corpus_rows, subprocess_env, write_jsonl

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_block(lang: str, contains: str) -> str:
    """The README's fenced `lang` block that contains `contains`."""
    blocks = re.findall(rf"```{lang}\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)
    found = [b for b in blocks if contains in b]
    assert len(found) == 1, f"no single {lang} block with {contains!r} in README.md"
    return found[0]


def test_duckdb_query_ranks_by_cosine(cli, st_model: Path, tmp_path: Path, monkeypatch) -> None:
    duckdb = pytest.importorskip("duckdb")
    rows = [{**r, "id": f"doc-{i}"} for i, r in enumerate(corpus_rows(60))]
    corpus = write_jsonl(tmp_path / "c.jsonl", rows)
    cli("embed", corpus, "-m", st_model, "-o", tmp_path / "vectors.parquet", "-q")
    # As written, but for the tiny model's 32 dimensions instead of all-MiniLM-L6-v2's 384.
    sql = readme_block("sql", "array_cosine_similarity").replace("FLOAT[384]", "FLOAT[32]")
    monkeypatch.chdir(tmp_path)
    got = duckdb.sql(sql).fetchall()

    table = pq.read_table(tmp_path / "vectors.parquet")
    ids = table.column("id").to_pylist()
    v = np.asarray(table.column("embedding").to_pylist(), dtype=np.float64)
    q = v[ids.index("doc-42")]
    cos = v @ q / (np.linalg.norm(v, axis=1) * np.linalg.norm(q))
    top = np.argsort(-cos, kind="stable")[:5]
    assert [r[0] for r in got] == [ids[i] for i in top]
    np.testing.assert_allclose([r[1] for r in got], cos[top], rtol=1e-5)


def test_nightly_cron_script_runs_as_written(st_model: Path, tmp_path: Path) -> None:
    script = tmp_path / "nightly.sh"
    script.write_text(readme_block("sh", "nightly.sh"), encoding="utf-8")
    script.chmod(0o755)
    (tmp_path / "corpus").mkdir()
    write_jsonl(tmp_path / "corpus" / "a.jsonl", corpus_rows(20))
    # `embedcli` on PATH is this interpreter's module; the model comes from the crontab's environment.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "embedcli").write_text(f'#!/bin/sh\nexec {shutil.which(sys.executable) or sys.executable} -m embedcli "$@"\n')
    (bindir / "embedcli").chmod(0o755)
    env = {**subprocess_env(), "EMBEDCLI_MODEL": str(st_model), "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}

    def night() -> dict:
        done = subprocess.run(["/bin/sh", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=300, check=False)
        assert done.returncode == 0, done.stderr
        return json.loads((tmp_path / "stats.json").read_text())

    first = night()
    assert pq.read_table(tmp_path / "vectors.parquet").num_rows == 20
    # Tomorrow: two new rows and one bad line; the 20 others are carried over, the bad one listed.
    with (tmp_path / "corpus" / "a.jsonl").open("a", encoding="utf-8") as f:
        f.write('{"id": "new1", "text": "fresh news"}\n{"id": "new2", "text": "more news"}\n{not json\n')
    second = night()
    assert pq.read_table(tmp_path / "vectors.parquet").num_rows == 22
    assert first["computed_rows"] == 20 and second["computed_rows"] == 2
    assert (tmp_path / "bad-rows.jsonl").read_text().count("\n") == 1
    assert second["carried_rows"] == 20


def test_nightly_store_script_runs_as_written(st_model: Path, tmp_path: Path) -> None:
    pytest.importorskip("lancedb", reason="lancedb is not installed: pip install -e '.[test,lancedb]'")
    from tests.stores.store_helpers import read_back

    script = tmp_path / "nightly-store.sh"
    script.write_text(readme_block("sh", "nightly-store.sh"), encoding="utf-8")
    script.chmod(0o755)
    (tmp_path / "corpus").mkdir()
    rows = [{**r, "id": f"doc-{i}"} for i, r in enumerate(corpus_rows(20))]
    write_jsonl(tmp_path / "corpus" / "a.jsonl", rows)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "embedcli").write_text(f'#!/bin/sh\nexec {shutil.which(sys.executable) or sys.executable} -m embedcli "$@"\n')
    (bindir / "embedcli").chmod(0o755)
    env = {**subprocess_env(), "EMBEDCLI_MODEL": str(st_model), "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}
    url = f"lancedb://{tmp_path}/index/docs"

    def night() -> dict:
        done = subprocess.run(["/bin/sh", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=300, check=False)
        assert done.returncode == 0, done.stderr
        assert (tmp_path / "top5.jsonl").read_text().count("\n") == 5
        return json.loads((tmp_path / "stats.json").read_text())

    first = night()
    assert sorted(read_back(url)) == sorted(r["id"] for r in rows)
    # Tomorrow: one row gone, one edited, two new rows and one bad line.
    rows = [r for r in rows if r["id"] != "doc-4"]
    rows[0] = {**rows[0], "text": rows[0]["text"] + " (updated)"}
    write_jsonl(tmp_path / "corpus" / "a.jsonl", rows)
    with (tmp_path / "corpus" / "a.jsonl").open("a", encoding="utf-8") as f:
        f.write('{"id": "new1", "text": "fresh news"}\n{"id": "new2", "text": "more news"}\n{not json\n')
    second = night()
    assert sorted(read_back(url)) == sorted([r["id"] for r in rows] + ["new1", "new2"])
    assert first["computed_rows"] == 20 and second["computed_rows"] == 3 and second["carried_rows"] == 18
    assert (tmp_path / "bad-rows.jsonl").read_text().count("\n") == 1
