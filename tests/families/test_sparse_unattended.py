"""`sparse-embed` goes through the shared unattended loop: `--shard K/N` + `merge`, and `--incremental`."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

ROWS = 60
WORDS = "the film won best album award market shares rise after bank talks hello world quick brown fox".split()


def _corpus(path: Path, changed: int | None = None) -> Path:
    rows = []
    for i in range(ROWS):
        text = " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(3 + i % 11))
        rows.append({"id": f"r{i}", "text": text + (" zzz" if i == changed else "")})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def splade(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.fixtures.tiny_families import build_splade

    return build_splade(tmp_path_factory.mktemp("splade_unattended"), "max")


def _sparse(path: Path) -> list[tuple[str, list[int], list[float]]]:
    t = pq.read_table(path)
    return list(zip(t.column("id").to_pylist(), t.column("indices").to_pylist(), t.column("values").to_pylist(),
                    strict=True))


def _same(a: Path, b: Path) -> None:
    ra, rb = _sparse(a), _sparse(b)
    assert [r[0] for r in ra] == [r[0] for r in rb]
    for (_, ia, va), (_, ib, vb) in zip(ra, rb, strict=True):
        assert ia == ib
        assert max((abs(x - y) for x, y in zip(va, vb, strict=True)), default=0.0) <= 1e-6


def test_shards_merge_to_the_unsharded_output(cli, splade, tmp_path) -> None:
    corpus = _corpus(tmp_path / "c.jsonl")
    full = tmp_path / "full.parquet"
    cli("sparse-embed", corpus, "-m", splade, "-o", full, "--shard-rows", 20, "-q")
    parts = [tmp_path / f"out-{k}.parquet" for k in range(3)]
    for k, part in enumerate(parts):
        cli("sparse-embed", corpus, "-m", splade, "-o", part, "--shard", f"{k}/3", "--shard-rows", 20, "-q")
    merged = tmp_path / "merged.parquet"
    cli("merge", *parts, "-o", merged, "-q")
    _same(merged, full)


def test_incremental_recomputes_only_the_changed_row(cli, splade, tmp_path) -> None:
    day1 = tmp_path / "day1.parquet"
    cli("sparse-embed", _corpus(tmp_path / "c1.jsonl"), "-m", splade, "-o", day1, "--shard-rows", 20, "-q")
    corpus2 = _corpus(tmp_path / "c2.jsonl", changed=17)
    day2, stats = tmp_path / "day2.parquet", tmp_path / "stats.json"
    cli("sparse-embed", corpus2, "-m", splade, "-o", day2, "--shard-rows", 20, "--incremental", "--previous", day1,
        "--stats", stats, "-q")
    assert json.loads(stats.read_text())["computed_rows"] == 1
    full = tmp_path / "full.parquet"
    cli("sparse-embed", corpus2, "-m", splade, "-o", full, "--shard-rows", 20, "-q")
    _same(day2, full)


def test_ray_engine_output_equals_local_output(cli, splade, tmp_path) -> None:
    ray = pytest.importorskip("ray")
    import logging

    corpus = _corpus(tmp_path / "c.jsonl")
    local, remote = tmp_path / "local.parquet", tmp_path / "ray.parquet"
    cli("sparse-embed", corpus, "-m", splade, "-o", local, "--shard-rows", 20, "-q")
    ray.init(num_cpus=1, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
    try:
        cli("sparse-embed", corpus, "-m", splade, "-o", remote, "--shard-rows", 20, "--engine", "ray",
            "--workers", 1, "-q")
    finally:
        ray.shutdown()
    _same(remote, local)
    assert pq.read_metadata(remote).metadata[b"embedcli.config"] == pq.read_metadata(local).metadata[b"embedcli.config"]
