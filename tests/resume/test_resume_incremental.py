"""Acceptance for `--incremental`: an unchanged corpus computes zero rows; with 1% of rows changed exactly those
are computed; the output equals a full recomputation. Also the cron case (yesterday's output + today's corpus)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from resume_helpers import corpus_rows, leftovers, read_stats, write_jsonl

from embedcli.io.writers import embedding_matrix

ROWS = 2000


def _run(cli, model: Path, corpus: Path, out: Path, stats: Path, *extra: object, code: int = 0) -> dict:  # type: ignore[no-untyped-def]
    cli("embed", corpus, "-m", model, "-o", out, "--shard-rows", 300, "-q", "--stats", stats, *extra, code=code)
    return read_stats(stats)


def _same_rows(a: Path, b: Path, exact: bool = False) -> None:
    """Same ids in the same order and the same vectors.

    A full recomputation is only reproducible to float32 rounding: a row's vector can move by an ulp when
    the rows packed into the same forward change (BLAS picks its blocking by the matrix size). So vectors
    are compared to 1e-6; carried-over rows are checked bit for bit against the previous output elsewhere.
    """
    ta, tb = pq.read_table(a), pq.read_table(b)
    assert ta.column_names == tb.column_names
    assert ta.column("id").equals(tb.column("id"))
    va, vb = embedding_matrix(ta.column("embedding")), embedding_matrix(tb.column("embedding"))
    if exact:
        assert np.array_equal(va, vb)
    else:
        np.testing.assert_allclose(va, vb, rtol=0, atol=1e-6)


def _carried_exactly(out: Path, previous: Path, ids: set[str]) -> None:
    """Rows `ids` of `out` hold exactly the vectors `previous` has for them."""
    def by_id(path: Path) -> dict[str, bytes]:
        t = pq.read_table(path)
        m = embedding_matrix(t.column("embedding"))
        return {i: m[k].tobytes() for k, i in enumerate(t.column("id").to_pylist()) if i in ids}

    assert by_id(out) == by_id(previous)


@pytest.fixture
def yesterday(cli, st_model: Path, tmp_path: Path) -> dict:
    rows = corpus_rows(ROWS, seed=11)
    corpus = write_jsonl(tmp_path / "corpus-day1.jsonl", rows)
    out = tmp_path / "day1.parquet"
    stats = _run(cli, st_model, corpus, out, tmp_path / "day1.json")
    assert stats["computed_rows"] == ROWS
    return {"rows": rows, "corpus": corpus, "out": out}


def test_unchanged_corpus_computes_zero_rows(cli, st_model: Path, tmp_path: Path, yesterday: dict) -> None:
    today = write_jsonl(tmp_path / "corpus-day2.jsonl", yesterday["rows"])  # same rows, another file
    out = tmp_path / "day2.parquet"
    stats = _run(cli, st_model, today, out, tmp_path / "s.json", "--incremental", "--previous", yesterday["out"])
    assert stats["computed_rows"] == 0 and stats["carried_rows"] == ROWS and stats["tokens"] == 0
    _same_rows(out, yesterday["out"], exact=True)


def test_one_percent_changed_computes_exactly_those(cli, st_model: Path, tmp_path: Path, yesterday: dict) -> None:
    rows = [dict(r) for r in yesterday["rows"]]
    changed = list(range(0, ROWS, 100))  # 1%: 20 rows
    for i in changed:
        rows[i]["text"] += " bank"
    today = write_jsonl(tmp_path / "corpus-day2.jsonl", rows)
    out = tmp_path / "day2.parquet"
    stats = _run(cli, st_model, today, out, tmp_path / "s.json", "--incremental", "--previous", yesterday["out"])
    assert stats["computed_rows"] == len(changed) and stats["carried_rows"] == ROWS - len(changed)
    full = tmp_path / "full.parquet"
    _run(cli, st_model, today, full, tmp_path / "full.json")
    _same_rows(out, full)
    _carried_exactly(out, yesterday["out"], {r["id"] for i, r in enumerate(rows) if i not in changed})


def test_cron_in_place_new_changed_and_removed_rows(cli, st_model: Path, tmp_path: Path, yesterday: dict) -> None:
    out = tmp_path / "vectors.parquet"
    out.write_bytes(yesterday["out"].read_bytes())
    Path(f"{out}.embedcli-index.parquet").write_bytes(Path(f"{yesterday['out']}.embedcli-index.parquet").read_bytes())
    rows = [dict(r) for r in yesterday["rows"][50:]]  # 50 rows removed
    rows[0]["text"] = "a changed text"
    rows += corpus_rows(30, seed=99, prefix="new")  # 30 new ids
    today = write_jsonl(tmp_path / "corpus-day2.jsonl", rows)
    stats = _run(cli, st_model, today, out, tmp_path / "s.json", "--incremental")
    assert stats["computed_rows"] == 31 and stats["carried_rows"] == len(rows) - 31
    assert pq.read_table(out, columns=["id"]).column("id").to_pylist() == [r["id"] for r in rows]
    full = tmp_path / "full.parquet"
    _run(cli, st_model, today, full, tmp_path / "full.json")
    _same_rows(out, full)
    assert leftovers(tmp_path) == []
    # the next day, nothing changed: the output is complete for these inputs, nothing is computed
    stats = _run(cli, st_model, today, out, tmp_path / "s2.json", "--incremental")
    assert stats["computed_rows"] == 0


def test_incremental_shard_directory_in_place(cli, st_model: Path, tmp_path: Path, yesterday: dict) -> None:
    out = tmp_path / "vectors"
    _run(cli, st_model, yesterday["corpus"], f"{out}/", tmp_path / "a.json")
    rows = [dict(r) for r in yesterday["rows"]]
    rows[5]["text"] = "changed"
    today = write_jsonl(tmp_path / "corpus-day2.jsonl", rows)
    stats = _run(cli, st_model, today, out, tmp_path / "b.json", "--incremental", "--shards-dir")
    assert stats["computed_rows"] == 1
    full = tmp_path / "full.parquet"
    _run(cli, st_model, today, full, tmp_path / "full.json")
    shards = pq.read_table(sorted(str(p) for p in out.glob("part-*.parquet")))
    assert shards.column("id").equals(pq.read_table(full).column("id"))
    np.testing.assert_allclose(
        embedding_matrix(shards.column("embedding")), embedding_matrix(pq.read_table(full).column("embedding")),
        rtol=0, atol=1e-6,
    )


def test_incremental_refuses_a_previous_output_of_another_config(cli, st_model: Path, tmp_path: Path,
                                                                 yesterday: dict) -> None:
    r = cli("embed", yesterday["corpus"], "-m", st_model, "-o", tmp_path / "x.parquet", "--no-normalize",
            "--incremental", "--previous", yesterday["out"], code=2)
    assert "different config" in r.stderr and "--overwrite" in r.stderr
    r = cli("embed", yesterday["corpus"], "-m", st_model, "-o", tmp_path / "x.parquet", "--incremental",
            "--previous", tmp_path / "missing.parquet", code=1)
    assert "no such previous output" in r.stderr


def test_carried_rows_take_kept_columns_from_todays_corpus(cli, st_model: Path, tmp_path: Path) -> None:
    rows = [{"id": f"k{i}", "text": f"hello world {i}", "title": f"old {i}"} for i in range(40)]
    day1 = write_jsonl(tmp_path / "day1.jsonl", rows)
    out = tmp_path / "out.parquet"
    _run(cli, st_model, day1, out, tmp_path / "a.json", "--keep-cols", "title")
    rows[3]["title"] = "new title"  # text unchanged: carried over, but with today's title
    day2 = write_jsonl(tmp_path / "day2.jsonl", rows)
    stats = _run(cli, st_model, day2, out, tmp_path / "b.json", "--keep-cols", "title", "--incremental")
    assert stats["computed_rows"] == 0 and stats["carried_rows"] == 40
    table = pq.read_table(out)
    assert table.column_names == ["id", "embedding", "title"]
    assert table.column("title").to_pylist()[3] == "new title"
