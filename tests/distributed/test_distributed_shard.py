"""`--shard K/N` without Ray: every record exactly once, `inspect` checks the set, `merge` joins it in order."""

from __future__ import annotations

import itertools
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


# A small token budget: the cuts of the run (every 8 batches of text) fall inside this small corpus.
SMALL = ("--max-batch-tokens", 16)


def test_three_shards_cover_every_row_once_and_merge_to_the_unsharded_output(
    cli, st_model: Path, corpus: Path, tmp_path: Path
) -> None:
    full = tmp_path / "full.parquet"
    cli("embed", corpus, "-m", st_model, "-o", full, "--shard-rows", 100, *SMALL, "-q")
    parts = tmp_path / "parts"
    parts.mkdir()
    for k in range(3):
        cli("embed", corpus, "-m", st_model, "-o", parts / f"out-{k}.parquet", "--shard", f"{k}/3",
            "--shard-rows", 100, *SMALL, "-q")
    ids = []
    ranges = []
    for k in range(3):
        part_ids, _, meta = vectors(parts / f"out-{k}.parquet")
        assert meta["embedcli.shard"] == f"{k}/3"
        ranges.append(tuple(map(int, meta["embedcli.shard_range"].split(":"))))
        total = int(meta["embedcli.shard_total"])
        assert part_ids, "every slice holds rows"
        ids += part_ids
    assert ranges[0][0] == 0 and ranges[-1][1] == total and all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
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
    # the unsharded run's output, byte for byte, and its row index (a later --incremental carries it over)
    assert merged.read_bytes() == full.read_bytes()
    index = Path(f"{merged}.embedcli-index.parquet")
    assert index.read_bytes() == Path(f"{full}.embedcli-index.parquet").read_bytes()
    m_ids, m_emb, m_meta = vectors(merged)
    assert m_ids == full_ids and np.array_equal(m_emb, full_emb) and m_meta == full_meta
    r = cli("embed", corpus, "-m", st_model, "-o", merged, "--shard-rows", 100, *SMALL)
    assert "already complete" in r.stderr  # the merged output is the whole run's
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
    codes = []
    for k in range(2):
        out = tmp_path / f"o{k}.parquet"
        r = cli("embed", corpus, "-m", st_model, "-o", out, "--shard", f"{k}/2", "--on-error", "skip", *SMALL, "-q",
                code=None)
        codes.append(r.exit_code)
        seen += vectors(out)[0]
    assert seen == [f"d{i}" for i in range(90) if i != 45]
    assert sorted(codes) == [0, 3]  # the slice holding the bad row says so
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


def test_an_int8_shard_cuts_its_slice_once(cli, st_model: Path, corpus: Path, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """`--precision int8 --shard K/N` spools its slice and keys its output by the same, once-cut slice."""
    import embedcli.run.execute as execute
    import embedcli.tasks.embed as embed

    calls: list[str] = []
    for module in (execute, embed):  # wherever a slice is cut
        real = getattr(module, "shard_source", None)
        if real is not None:
            monkeypatch.setattr(module, "shard_source",
                                lambda *a, _real=real, _name=module.__name__, **k: calls.append(_name) or _real(*a, **k))
    out = tmp_path / "q.parquet"
    cli("embed", corpus, "-m", st_model, "-o", out, "--shard", "1/2", "--precision", "int8", *SMALL, "-q")
    assert len(calls) == 1
    ids, _, meta = vectors(out)
    assert meta["embedcli.shard"] == "1/2" and 0 < len(ids) < ROWS


@pytest.mark.parametrize("groups", [1, 7])
def test_parquet_shards_merge_to_the_bytes_of_one_run(cli, st_model: Path, tmp_path: Path, groups: int) -> None:
    """Parquet slices are cut by the footer's row groups (one group: by rows within it), never by reading."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [json.loads(line) for line in write_corpus(tmp_path / "c.jsonl", ROWS, seed=9).read_text().splitlines()]
    corpus = tmp_path / "c.parquet"
    table = pa.table({"id": [r["id"] for r in rows], "text": [r["text"] for r in rows]})
    pq.write_table(table, corpus, row_group_size=-(-ROWS // groups))
    full = tmp_path / "full.parquet"
    cli("embed", corpus, "-m", st_model, "-o", full, *SMALL, "-q")
    parts = [tmp_path / f"p{k}.parquet" for k in range(3)]
    for k, part in enumerate(parts):
        cli("embed", corpus, "-m", st_model, "-o", part, "--shard", f"{k}/3", *SMALL, "-q")
    assert all(vectors(p)[0] for p in parts)  # every slice holds rows
    merged = tmp_path / "merged.parquet"
    cli("merge", *parts, "-o", merged, "-q")
    assert merged.read_bytes() == full.read_bytes()
    assert Path(f"{merged}.embedcli-index.parquet").read_bytes() == Path(f"{full}.embedcli-index.parquet").read_bytes()
