"""Refusing to mix configs, doing nothing on a complete output, stale leftovers, shard directories, stdout,
and `embedcli inspect` (--json, --check)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from resume_helpers import corpus_rows, leftovers, read_stats, write_jsonl

ROWS = 600


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "corpus.jsonl", corpus_rows(ROWS, seed=5))


def _embed(cli, model, corpus, out, *extra, code=0):  # type: ignore[no-untyped-def]
    return cli("embed", corpus, "-m", model, "-o", out, "--shard-rows", 100, *extra, code=code)


def test_complete_output_same_command_does_nothing(cli, st_model: Path, corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.parquet"
    _embed(cli, st_model, corpus, out, "-q")
    before = (out.stat().st_mtime_ns, out.read_bytes())
    r = _embed(cli, st_model, corpus, out, "--stats", tmp_path / "s.json")
    assert "already complete" in r.stderr and "nothing to do" in r.stderr
    assert (out.stat().st_mtime_ns, out.read_bytes()) == before
    assert read_stats(tmp_path / "s.json")["computed_rows"] == 0
    assert leftovers(tmp_path) == []


def test_other_config_refuses_to_mix_unless_overwrite(cli, st_model: Path, corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.parquet"
    _embed(cli, st_model, corpus, out, "-q")
    before = out.read_bytes()
    r = _embed(cli, st_model, corpus, out, "-q", "--no-normalize", code=2)
    assert "was made with a different config" in r.stderr and "--overwrite" in r.stderr
    assert "--normalize/--no-normalize: true → false" in r.stderr  # the setting by its flag, not two hashes
    assert out.read_bytes() == before and leftovers(tmp_path) == []
    _embed(cli, st_model, corpus, out, "-q", "--no-normalize", "--overwrite")
    assert out.read_bytes() != before


def test_staged_work_of_another_config_refuses_to_mix(cli, st_model: Path, corpus: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    out = tmp_path / "out.parquet"
    real = pq.ParquetWriter.write_table
    calls = [0]

    def full_disk(self, *a, **k):  # type: ignore[no-untyped-def]
        calls[0] += 1
        if calls[0] > 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, *a, **k)

    with monkeypatch.context() as m:
        m.setattr(pq.ParquetWriter, "write_table", full_disk)
        _embed(cli, st_model, corpus, out, "-q", code=1)
    r = _embed(cli, st_model, corpus, out, "-q", "--no-normalize", code=2)
    assert "holds the work of an interrupted run with a different config" in r.stderr and "--overwrite" in r.stderr
    # inspect sees the unfinished run
    r = cli("inspect", out, "--check", code=1)
    assert "staged" in r.stdout
    _embed(cli, st_model, corpus, out, "-q", "--no-normalize", "--overwrite")
    assert leftovers(tmp_path) == []


def test_changed_inputs_recompute_without_incremental(cli, st_model: Path, tmp_path: Path) -> None:
    rows = corpus_rows(300, seed=1)
    corpus = write_jsonl(tmp_path / "c.jsonl", rows)
    out = tmp_path / "out.parquet"
    _embed(cli, st_model, corpus, out, "-q")
    rows += corpus_rows(20, seed=2, prefix="n")
    write_jsonl(corpus, rows)
    _embed(cli, st_model, corpus, out, "-q", "--stats", tmp_path / "s.json")
    assert read_stats(tmp_path / "s.json")["computed_rows"] == 320
    assert pq.read_table(out).num_rows == 320


def test_stale_leftovers_of_a_killed_run_are_removed(cli, st_model: Path, corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.parquet"
    staging = tmp_path / "out.parquet.embedcli-staging"
    (staging / "_embedcli").mkdir(parents=True)
    (staging / ".part-000000.parquet.tmp-4242").write_bytes(b"half a shard")
    (staging / "part-000007.parquet").write_bytes(b"never committed")
    (tmp_path / ".out.parquet.tmp-4242").write_bytes(b"half an output")
    _embed(cli, st_model, corpus, out, "-q")
    assert leftovers(tmp_path) == [] and pq.read_table(out).num_rows == ROWS


def test_shard_directory_output(cli, st_model: Path, corpus: Path, tmp_path: Path) -> None:
    single = tmp_path / "single.parquet"
    _embed(cli, st_model, corpus, single, "-q")
    out = tmp_path / "shards"
    _embed(cli, st_model, corpus, f"{out}/", "-q")
    parts = sorted(out.glob("part-*.parquet"))
    assert len(parts) == ROWS // 100
    manifest = json.loads((out / "_embedcli" / "manifest.json").read_text())
    assert manifest["complete"] and manifest["rows_done"] == ROWS
    assert pq.read_table([str(p) for p in parts]).equals(pq.read_table(single))
    r = _embed(cli, st_model, corpus, out, "--shards-dir")
    assert "already complete" in r.stderr
    report = json.loads(cli("inspect", out, "--json", "--check").stdout)
    assert report["status"] == "complete" and report["rows"] == ROWS and report["shards"] == len(parts)
    parts[0].unlink()
    r = cli("inspect", out, "--check", code=1)
    assert "missing" in r.stdout


def test_stdout_output_skips_bad_rows(cli, st_model: Path, tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "c.jsonl", [{"id": "a", "text": "x"}, {"id": "b", "text": None}, {"id": "c", "text": "y"}])
    r = cli("embed", src, "-m", st_model, "-o", "-", "-q", "--on-error", "skip", code=3)
    assert [json.loads(line)["id"] for line in r.stdout.splitlines()] == ["a", "c"]


def test_inspect_reports_provenance_completeness_and_errors(cli, st_model: Path, tmp_path: Path) -> None:
    rows = corpus_rows(50, seed=4)
    rows[7]["text"] = None
    src = write_jsonl(tmp_path / "c.jsonl", rows)
    out = tmp_path / "out.parquet"
    cli("embed", src, "-m", st_model, "-o", out, "-q", "--on-error", "skip", code=3)
    report = json.loads(cli("inspect", out, "--json", "--check").stdout)
    assert report["status"] == "complete" and report["rows"] == 49 and report["input_rows"] == 50
    assert report["skipped_rows"] == 1 and report["errors"][0]["location"] == "line 8"
    assert report["provenance"]["model"] == str(st_model) and report["config_hash"] and report["model_hash"]
    assert report["inputs"][0]["path"] == os.path.abspath(src) and report["index"] == "valid"
    text = cli("inspect", out).stdout
    assert "complete" in text and "text is null" in text
    r = cli("inspect", tmp_path / "nothing.parquet", "--check", code=1)
    assert "no such output" in r.stdout
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(out.read_bytes()[:100])
    report = json.loads(cli("inspect", cut, "--json", "--check", code=1).stdout)
    assert report["status"] == "incomplete" and "not a readable Parquet file" in report["problems"][0]


def test_output_and_index_bytes_do_not_depend_on_where_commits_landed(cli, st_model: Path, corpus: Path,
                                                                       tmp_path: Path) -> None:
    # Batches cut by characters (--max-batch-tokens 64: ~1,000 characters) end between --shard-rows
    # boundaries, so a stop, or --commit-every, commits shards of other sizes than an uninterrupted run.
    outs = []
    for name, extra in (("steady", ()), ("every-batch", ("--commit-every", "0.000001"))):
        out = tmp_path / f"{name}.parquet"
        _embed(cli, st_model, corpus, out, "-q", "--max-batch-tokens", 64, *extra)
        outs.append(out)
    steady, every_batch = outs
    assert every_batch.read_bytes() == steady.read_bytes()
    index = ".embedcli-index.parquet"
    assert Path(f"{every_batch}{index}").read_bytes() == Path(f"{steady}{index}").read_bytes()
