"""Issue 22, items 1-3: `search` and `rerank` write through the output checks every command has (`embedcli.run.whole`):
-o against every input, kept columns against result columns, a config check or --overwrite, and a file
embedcli never wrote left alone."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest

DOCS = ["the quick brown fox", "market shares rise", "labour won the election", "a new phone", "the film won"]


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("whole")
    (root / "docs.jsonl").write_text("".join(
        json.dumps({"id": f"d{i}", "text": t, "score": i * 1.5, "rank": 7, "query_id": "x"}) + "\n"
        for i, t in enumerate(DOCS)), encoding="utf-8")
    (root / "queries.jsonl").write_text(json.dumps({"id": "q1", "text": "who won"}) + "\n", encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def vectors(work: Path, st_model: Path) -> Path:
    from typer.testing import CliRunner

    from embedcli.cli import app

    out = work / "vectors.parquet"
    result = CliRunner().invoke(app, ["embed", str(work / "docs.jsonl"), "-m", str(st_model), "-o", str(out),
                                      "--keep-cols", "text,score,rank,query_id", "-q"],
                                env={"EMBEDCLI_DTYPE": "float32"})
    assert result.exit_code == 0, result.output
    return out


def _copy(src: Path, dst: Path) -> Path:
    dst.write_bytes(src.read_bytes())
    return dst


@pytest.mark.parametrize("target", ["vectors", "queries", "queries-symlink", "queries-hardlink"])
def test_search_refuses_an_input_as_its_output(cli, st_model, work, vectors, tmp_path, target):  # type: ignore[no-untyped-def]
    v = _copy(vectors, tmp_path / "v.parquet")
    q = _copy(work / "queries.jsonl", tmp_path / "q.jsonl")
    out = {"vectors": v, "queries": q, "queries-symlink": tmp_path / "link.jsonl",
           "queries-hardlink": tmp_path / "hard.jsonl"}[target]
    if target == "queries-symlink":
        os.symlink(q, out)
    if target == "queries-hardlink":
        os.link(q, out)
    before = {p: p.read_bytes() for p in (v, q)}
    result = cli("search", v, "--queries", q, "-m", st_model, "-o", out, "-q", code=2)
    assert "destroy the input" in result.stderr
    assert {p: p.read_bytes() for p in (v, q)} == before


@pytest.mark.parametrize("col", ["score", "rank", "query_id", "id"])
def test_search_keep_cols_may_not_replace_a_hit_column(cli, st_model, work, vectors, col):  # type: ignore[no-untyped-def]
    result = cli("search", vectors, "--queries", work / "queries.jsonl", "-m", st_model, "--keep-cols", col, "-q", code=2)
    assert f"--keep-cols {col}: the output has its own {col!r} column" in result.stderr


def test_search_output_is_config_checked_and_a_rerun_is_a_noop(cli, st_model, work, vectors, tmp_path):  # type: ignore[no-untyped-def]
    out = tmp_path / "hits.parquet"
    args = ("search", vectors, "--queries", work / "queries.jsonl", "-m", st_model, "-o", out)
    cli(*args, "--top-k", 3, "-q")
    first = out.read_bytes()
    assert "already complete" in cli(*args, "--top-k", 3).stderr
    assert out.read_bytes() == first
    result = cli(*args, "--top-k", 2, "-q", code=2)
    assert "top_k: 3 → 2" in result.stderr and "--overwrite" in result.stderr
    assert out.read_bytes() == first
    cli(*args, "--top-k", 2, "--overwrite", "-q")
    assert pq.read_table(out).num_rows == 2


@pytest.mark.parametrize("command", ["search", "rerank"])
@pytest.mark.parametrize("existing", ["foreign-file", "another-commands-output"])
def test_search_and_rerank_leave_an_output_made_otherwise_alone(
    cli, st_model, work, vectors, tmp_path, command, existing
):  # type: ignore[no-untyped-def]
    out = tmp_path / "out.parquet"
    if existing == "foreign-file":
        out.write_bytes(b"not embedcli's\n")
    else:
        cli("embed", work / "docs.jsonl", "-m", st_model, "-o", out, "-q")
    before = out.read_bytes()
    if command == "search":
        args: tuple[object, ...] = ("search", vectors, "--queries", work / "queries.jsonl", "-m", st_model, "-o", out)
    else:
        args = ("rerank", work / "docs.jsonl", "--query", "who won", "-m", st_model, "-o", out)
    result = cli(*args, "-q", code=2)
    assert "--overwrite" in result.stderr
    assert out.read_bytes() == before
    cli(*args, "-q", "--overwrite")
    assert pq.read_table(out).column_names[:2] == (["query_id", "rank"] if command == "search" else ["query_id", "id"])


def test_rerank_refuses_its_inputs_as_output_and_reruns_as_a_noop(cli, st_model, work, tmp_path):  # type: ignore[no-untyped-def]
    docs = _copy(work / "docs.jsonl", tmp_path / "docs.jsonl")
    queries = _copy(work / "queries.jsonl", tmp_path / "q.jsonl")
    for out in (docs, queries):
        result = cli("rerank", docs, "--queries", queries, "-m", st_model, "-o", out, "-q", code=2)
        assert "destroy the input" in result.stderr
    assert docs.read_bytes() == (work / "docs.jsonl").read_bytes()
    out = tmp_path / "ranked.jsonl"
    args = ("rerank", docs, "--queries", queries, "-m", st_model, "-o", out)
    cli(*args, "-q")
    first = out.read_bytes()
    assert "already complete" in cli(*args).stderr
    assert out.read_bytes() == first
    result = cli(*args, "--top-n", 2, "-q", code=2)
    assert "top_n: 0 → 2" in result.stderr
    assert not (tmp_path / "ranked.jsonl.embedcli-staging").exists()
