"""`--shard K/N` without Ray: every record exactly once, `inspect` checks the set, `merge` joins it in order."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from distributed_helpers import vectors, write_corpus

ROWS = 300


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("shard_corpus") / "corpus.jsonl", ROWS, seed=3)


def test_three_shards_cover_every_row_once_and_merge_to_the_unsharded_output(
    cli, st_model: Path, corpus: Path, tmp_path: Path
) -> None:
    full = tmp_path / "full.parquet"
    cli("embed", corpus, "-m", st_model, "-o", full, "--shard-rows", 100, "-q")
    parts = tmp_path / "parts"
    parts.mkdir()
    for k in range(3):
        cli("embed", corpus, "-m", st_model, "-o", parts / f"out-{k}.parquet", "--shard", f"{k}/3",
            "--shard-rows", 100, "-q")
    ids = []
    for k in range(3):
        part_ids, _, meta = vectors(parts / f"out-{k}.parquet")
        assert meta["embedcli.shard"] == f"{k}/3" and meta["embedcli.shard_total"] == str(ROWS)
        assert meta["embedcli.shard_range"] == f"{k * 100}:{(k + 1) * 100}"
        ids += part_ids
    full_ids, full_emb, full_meta = vectors(full)
    assert ids == full_ids and len(set(ids)) == ROWS  # every row exactly once, in input order

    members = [parts / f"out-{k}.parquet" for k in range(3)]
    r = cli("inspect", *members, "--check", "--json")
    report = json.loads(r.stdout)
    assert report["status"] == "complete" and report["rows"] == ROWS and report["shards"] == 3
    cli("inspect", parts, "--check")  # the directory of the outputs is the same set
    cli("inspect", f"{parts}/out-*.parquet", "--check")  # a quoted glob too (index sidecars are not members)
    r = cli("inspect", members[0], members[2], "--check", code=1)
    assert "shards 1/3 are missing" in r.stdout

    merged = tmp_path / "merged.parquet"
    cli("merge", *reversed(members), "-o", merged, "-q")  # argument order does not matter
    m_ids, m_emb, m_meta = vectors(merged)
    assert m_ids == full_ids
    assert np.abs(m_emb - full_emb).max() <= 1e-6
    for key in ("embedcli.model", "embedcli.model_hash", "embedcli.config", "embedcli.config_hash",
                "embedcli.dtype", "embedcli.version", "embedcli.inputs", "embedcli.input_options",
                "embedcli.rows", "embedcli.input_records", "embedcli.skipped_rows"):
        assert m_meta[key] == full_meta[key], key
    cli("merge", members[0], members[1], "-o", tmp_path / "no.parquet", code=2)
    assert not (tmp_path / "no.parquet").exists()


def test_shard_rerun_is_complete_and_another_slice_refuses_to_mix(cli, st_model: Path, corpus: Path,
                                                                  tmp_path: Path) -> None:
    out = tmp_path / "s.parquet"
    cli("embed", corpus, "-m", st_model, "-o", out, "--shard", "1/4", "-q")
    r = cli("embed", corpus, "-m", st_model, "-o", out, "--shard", "1/4")
    assert "already complete" in r.stderr
    r = cli("embed", corpus, "-m", st_model, "-o", out, "--shard", "2/4", code=2)
    assert "different config" in r.stderr


def test_shard_with_bad_rows_partitions_the_records(cli, st_model: Path, tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "bad.jsonl", 90, seed=4, bad_at=45)
    seen = []
    for k in range(2):
        out = tmp_path / f"o{k}.parquet"
        code = 3 if k == 1 else 0
        cli("embed", corpus, "-m", st_model, "-o", out, "--shard", f"{k}/2", "--on-error", "skip", "-q", code=code)
        seen += vectors(out)[0]
    assert seen == [f"d{i}" for i in range(90) if i != 45]
    r = cli("inspect", tmp_path / "o0.parquet", tmp_path / "o1.parquet", "--check", "--json")
    assert json.loads(r.stdout)["skipped_rows"] == 1


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--shard", "3/3"), "K must be in 0..N-1"),
        (("--shard", "x"), "expected K/N"),
        (("--workers", "2"), "need --engine ray"),
        (("--engine", "spark"), "choose local or ray"),
        (("--shard", "0/2", "--incremental"), "do not combine"),
    ],
)
def test_distributed_usage_errors(cli, st_model: Path, corpus: Path, tmp_path: Path, args, words) -> None:  # type: ignore[no-untyped-def]
    r = cli("embed", corpus, "-m", st_model, "-o", tmp_path / "o.parquet", *args, code=2)
    assert words in r.stderr


def test_engine_ray_without_ray_says_how_to_install(cli, st_model: Path, corpus: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    r = cli("embed", corpus, "-m", st_model, "-o", tmp_path / "o.parquet", "--engine", "ray", code=2)
    assert "pip install 'embedcli[ray]'" in r.stderr
    assert not (tmp_path / "o.parquet").exists()


@pytest.mark.parametrize("command", ["embed", "score", "classify", "token-embed"])
def test_every_compute_command_has_the_distributed_panel(cli, command: str) -> None:
    out = cli(command, "--help", env={"COLUMNS": "200"}).stdout
    assert "Distributed" in out
    # Env twins are named once for every flag (issue 15: help that fits a screen); EMBEDCLI_SHARD is run below.
    assert "Every flag can also be set as EMBEDCLI_<FLAG>" in out
    for flag in ("--engine", "--ray-address", "--workers", "--gpus-per-worker", "--shard"):
        assert flag in out


def test_env_twin_sets_the_shard(cli, st_model: Path, corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "e.parquet"
    cli("embed", corpus, "-m", st_model, "-o", out, "-q", env={"EMBEDCLI_SHARD": "2/3"})
    assert vectors(out)[2]["embedcli.shard"] == "2/3"
