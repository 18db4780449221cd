"""The Ray engine on a local cluster (2 CPUs): same output, provenance and resume contract as the local engine."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from distributed_helpers import vectors, write_corpus

ray = pytest.importorskip("ray")

ROWS = 300


@pytest.fixture(scope="module", autouse=True)
def ray_cluster():  # type: ignore[no-untyped-def]
    """One local Ray cluster for the module (start-up takes seconds); the CLI joins it."""
    import logging

    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("ray_corpus") / "corpus.jsonl", ROWS, seed=7)


RAY = ("--engine", "ray", "--workers", 2)


def test_ray_output_equals_local_output(cli, st_model: Path, corpus: Path, tmp_path: Path) -> None:
    local, remote = tmp_path / "local.parquet", tmp_path / "ray.parquet"
    cli("embed", corpus, "-m", st_model, "-o", local, "--shard-rows", 64, "-q")
    cli("embed", corpus, "-m", st_model, "-o", remote, "--shard-rows", 64, "-q", "--stats", tmp_path / "s.json", *RAY)
    l_ids, l_emb, l_meta = vectors(local)
    r_ids, r_emb, r_meta = vectors(remote)
    assert r_ids == l_ids == [f"d{i}" for i in range(ROWS)]
    assert np.abs(r_emb - l_emb).max() <= 1e-6
    assert r_meta == l_meta  # provenance, config hash, inputs, row counts: all the same
    stats = json.loads((tmp_path / "s.json").read_text())
    assert stats["computed_rows"] == ROWS and stats["tokens"] > 0 and stats["exit_code"] == 0
    cli("inspect", remote, "--check")


def test_deleted_shard_is_recomputed_alone(cli, st_model: Path, corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "dir"
    cli("embed", corpus, "-m", st_model, "-o", f"{out}/", "--shard-rows", 100, "-q", *RAY)
    parts = sorted(p.name for p in out.glob("part-*.parquet"))
    assert parts == ["part-000000.parquet", "part-000001.parquet", "part-000002.parquet"]
    before = {p: (out / p).stat().st_mtime_ns for p in parts}
    saved = (out / "part-000001.parquet").read_bytes()
    (out / "part-000001.parquet").unlink()
    cli("inspect", out, "--check", code=1)
    r = cli("embed", corpus, "-m", st_model, "-o", f"{out}/", "--shard-rows", 100, *RAY)
    lo, hi = json.loads((out / "_embedcli" / "manifest.json").read_text())["shards"][1]["records"]
    assert f"repaired part-000001.parquet: recomputed input records {lo}-{hi} ({hi - lo} rows)" in r.stderr
    assert "repaired part-000000" not in r.stderr and "repaired part-000002" not in r.stderr
    assert (out / "part-000001.parquet").read_bytes() == saved  # the same shard, bit for bit
    for p in ("part-000000.parquet", "part-000002.parquet"):
        assert (out / p).stat().st_mtime_ns == before[p]  # untouched
    cli("inspect", out, "--check")
    assert not list(tmp_path.glob("*.embedcli-repair*")) and not list(tmp_path.glob("*staging*"))


def test_bad_row_is_an_error_record_and_exit_3(cli, st_model: Path, tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "bad.jsonl", 120, seed=8, bad_at=57)
    out, errors = tmp_path / "o.parquet", tmp_path / "errors.jsonl"
    r = cli("embed", corpus, "-m", st_model, "-o", out, "--on-error", "skip", "--errors-file", errors, *RAY, code=3)
    assert "skipped" in r.stderr
    records = [json.loads(line) for line in errors.read_text().splitlines()]
    assert [(e["id"], e["location"], e["reason"]) for e in records] == [("bad", "line 58", "text is null")]
    ids, _, meta = vectors(out)
    assert ids == [f"d{i}" for i in range(120) if i != 57] and meta["embedcli.skipped_rows"] == "1"
    cli("embed", corpus, "-m", st_model, "-o", tmp_path / "f.parquet", *RAY, code=1)  # --on-error fail


def test_killed_ray_run_resumes_from_the_manifest(cli, st_model: Path, corpus: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A run stopped part-way leaves its commits staged; the rerun computes only the rest."""
    from embedcli.engines import ray_engine

    out = tmp_path / "o.parquet"
    real = ray_engine.RayRunner._get
    calls = [0]

    def stop_after_two(self, ray_mod, ref):  # type: ignore[no-untyped-def]
        calls[0] += 1
        if calls[0] > 4:  # two batches of two pieces
            raise KeyboardInterrupt
        return real(self, ray_mod, ref)

    monkeypatch.setattr(ray_engine.RayRunner, "_get", stop_after_two)
    cli("embed", corpus, "-m", st_model, "-o", out, "--shard-rows", 50, "-q", *RAY, code=130)
    monkeypatch.setattr(ray_engine.RayRunner, "_get", real)
    assert not out.exists()
    manifest = json.loads((tmp_path / "o.parquet.embedcli-staging" / "_embedcli" / "manifest.json").read_text())
    cli("embed", corpus, "-m", st_model, "-o", out, "--shard-rows", 50, "-q", "--stats", tmp_path / "s.json", *RAY)
    stats = json.loads((tmp_path / "s.json").read_text())
    resumed = stats["resumed_rows"]  # whole commits (of 50 rows or more: pools of whole blocks), from the manifest
    assert resumed == manifest["records_done"] >= 50 and stats["computed_rows"] == ROWS - resumed
    assert stats["rows_read"] == ROWS - resumed  # the committed rows are not read again
    local = tmp_path / "local.parquet"
    cli("embed", corpus, "-m", st_model, "-o", local, "--shard-rows", 50, "-q")
    assert vectors(out)[0] == vectors(local)[0]
    assert np.abs(vectors(out)[1] - vectors(local)[1]).max() <= 1e-6


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # Ray Data's own context fields
def test_embed_dataset_keeps_bad_rows_as_error_records(st_model: Path, tiny_loaded) -> None:  # type: ignore[no-untyped-def]
    from embedcli.compute.runner import Runner
    from embedcli.engines.ray_engine import ERROR_COL, embed_dataset

    texts = [f"row {i} about the market" for i in range(40)]
    items = [{"id": f"d{i}", "text": t} for i, t in enumerate(texts)]
    items[5]["text"] = None
    ctx = ray.data.DataContext.get_current()
    before = ctx.execution_options.preserve_order
    ctx.execution_options.preserve_order = True
    try:
        ds = embed_dataset(ray.data.from_items(items), str(st_model), workers=2, batch_size=16, dtype="float32")
        rows = ds.take_all()
    finally:
        ctx.execution_options.preserve_order = before
    assert [r["id"] for r in rows] == [f"d{i}" for i in range(40)]
    assert rows[5]["embedding"] is None and rows[5][ERROR_COL] == "text is null"
    good = [i for i in range(40) if i != 5]
    expected = Runner(tiny_loaded("bert-st")).embed([texts[i] for i in good])
    got = np.stack([np.asarray(rows[i]["embedding"], dtype=np.float32) for i in good])
    assert np.abs(got - expected).max() <= 1e-6
    assert all(rows[i][ERROR_COL] is None for i in good)

