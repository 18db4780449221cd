"""Issue 13, the run loop's own paths, with the fake engine: an output, `--stats` or `--errors-file` that is an
input (or another written path) is refused before any work; `--errors-file` is written only when there is
a bad row; unwritable side files, a read-only file system and a disk full before the start are reported
with their path; an empty output keeps its `--keep-cols` columns."""

from __future__ import annotations

import errno
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_run_loop import ROWS, FakeEngine, make_job, write_rows

from embedcli.errors import OutputError, UsageError
from embedcli.io.manifest import Manifest
from embedcli.run import BatchSource, InputOptions, Reporting, run_job


def _link(kind: str, src: Path, at: Path) -> Path:
    if kind == "symlink":
        at.symlink_to(src)
    elif kind == "hardlink":
        os.link(src, at)
    return at if kind != "same" else src


@pytest.mark.parametrize("kind", ["same", "symlink", "hardlink"])
@pytest.mark.parametrize("which", ["-o", "--stats", "--errors-file"])
def test_a_written_path_that_is_an_input_is_refused_before_any_work(tmp_path: Path, kind: str, which: str) -> None:
    src = write_rows(tmp_path / "in.jsonl", ROWS)
    before = src.read_bytes()
    clash = _link(kind, src, tmp_path / "clash.jsonl")
    out = clash if which == "-o" else tmp_path / "out.parquet"
    engine = FakeEngine()
    job = make_job(src, out, engine, errors_file=str(clash) if which == "--errors-file" else None)
    if which == "--stats":
        job = replace(job, reporting=Reporting(quiet=True, stats_file=str(clash)))
    with pytest.raises(UsageError, match=f"{which} .* is the input") as err:
        run_job(job)
    assert err.value.exit_code == 2 and engine.seen == [] and src.read_bytes() == before
    assert not (tmp_path / "out.parquet").exists()


@pytest.mark.parametrize("kind", ["absent", "dangling", "other", "symlink", "symlinked_dir"])
def test_the_output_is_compared_with_every_input_by_inode_or_resolved_name(tmp_path: Path, kind: str) -> None:
    """`check_no_clobber` over many inputs: an output that is not there yet (or a dangling link) is no input;
    one that is there is an input exactly when it is one of the inputs' files, through whatever links."""
    from embedcli.run.paths import check_no_clobber

    inputs = [write_rows(tmp_path / f"in{i}.jsonl", ROWS) for i in range(5)]
    out = tmp_path / "out.parquet"
    if kind == "dangling":
        out.symlink_to(tmp_path / "nowhere.parquet")
    elif kind == "other":
        out.write_bytes(b"x")
    elif kind == "symlink":
        out.symlink_to(inputs[3])
    elif kind == "symlinked_dir":
        (tmp_path / "alias").symlink_to(tmp_path)
        out = tmp_path / "alias" / "in4.jsonl"
    if kind in ("symlink", "symlinked_dir"):
        with pytest.raises(UsageError, match="is the input"):
            check_no_clobber([str(p) for p in inputs], str(out))
    else:
        check_no_clobber([str(p) for p in inputs], str(out))


def test_stats_or_errors_file_that_is_the_output_is_refused(tmp_path: Path) -> None:
    src = write_rows(tmp_path / "in.jsonl", ROWS)
    out = tmp_path / "out.parquet"
    with pytest.raises(UsageError, match=r"--errors-file .* is also -o"):
        run_job(make_job(src, out, errors_file=str(out)))
    job = make_job(src, out, errors_file=str(tmp_path / "e.jsonl"))
    with pytest.raises(UsageError, match=r"--errors-file .* is also --stats"):
        run_job(replace(job, reporting=Reporting(quiet=True, stats_file=str(tmp_path / "e.jsonl"))))
    assert not out.exists()


def test_a_shard_directory_holding_an_input_is_refused(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    src = write_rows(tmp_path / "out" / "in.jsonl", ROWS)
    with pytest.raises(UsageError, match="is the input"):
        run_job(make_job(src, tmp_path / "out", shards_dir=True))
    assert src.exists()


def test_an_unrelated_errors_file_is_left_alone_on_a_clean_run(tmp_path: Path) -> None:
    src = write_rows(tmp_path / "in.jsonl", ROWS)
    notes = tmp_path / "notes.txt"
    notes.write_text("precious\n")
    assert run_job(make_job(src, tmp_path / "out.parquet", on_error="skip", errors_file=str(notes))) == 0
    assert notes.read_text() == "precious\n"


@pytest.mark.parametrize("which", ["--stats", "--errors-file"])
def test_an_unwritable_side_file_stops_the_run_before_the_compute(tmp_path: Path, which: str) -> None:
    src = write_rows(tmp_path / "in.jsonl", ROWS)
    bad = str(tmp_path / "missing" / "f.json")
    engine = FakeEngine()
    job = make_job(src, tmp_path / "out.parquet", engine, errors_file=bad if which == "--errors-file" else None)
    if which == "--stats":
        job = replace(job, reporting=Reporting(quiet=True, stats_file=bad))
    with pytest.raises(OutputError, match=f"{which} .*does not exist") as err:
        run_job(job)
    assert err.value.exit_code == 1 and engine.seen == [] and not (tmp_path / "out.parquet").exists()


@pytest.mark.parametrize("which", ["--stats", "--errors-file"])
def test_a_side_file_named_dash_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, which: str) -> None:
    monkeypatch.chdir(tmp_path)
    src = write_rows(tmp_path / "in.jsonl", ROWS)
    job = make_job(src, tmp_path / "out.parquet", errors_file="-" if which == "--errors-file" else None)
    if which == "--stats":
        job = replace(job, reporting=Reporting(quiet=True, stats_file="-"))
    with pytest.raises(UsageError, match=f"{which} -: .* not stdout"):
        run_job(job)
    assert not (tmp_path / "-").exists() and not (tmp_path / "out.parquet").exists()


def _read_only_fs(monkeypatch: pytest.MonkeyPatch, directory: Path) -> None:
    """What the kernel answers for a directory on a file system mounted read-only (EROFS)."""
    real_statvfs, real_access = os.statvfs, os.access
    ro = str(directory)

    class ReadOnly:
        def __init__(self, real: Any) -> None:
            self.real = real

        def __getattr__(self, name: str) -> Any:
            return os.ST_RDONLY | self.real.f_flag if name == "f_flag" else getattr(self.real, name)

    def statvfs(path: Any) -> Any:
        st = real_statvfs(path)
        return ReadOnly(st) if os.path.abspath(path) == ro else st

    def access(path: Any, mode: int, *args: Any, **kwargs: Any) -> bool:
        if mode & os.W_OK and os.path.abspath(path) == ro:
            return False
        return real_access(path, mode, *args, **kwargs)

    monkeypatch.setattr(os, "statvfs", statvfs)
    monkeypatch.setattr(os, "access", access)


@pytest.mark.parametrize("which", ["-o", "--stats", "--errors-file"])
def test_a_read_only_file_system_is_reported_as_read_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          which: str) -> None:
    src = write_rows(tmp_path / "in.jsonl", ROWS)
    ro = tmp_path / "ro"
    ro.mkdir()
    target = ro / "f.parquet"
    out = target if which == "-o" else tmp_path / "out.parquet"
    engine = FakeEngine()
    job = make_job(src, out, engine, errors_file=str(target) if which == "--errors-file" else None)
    if which == "--stats":
        job = replace(job, reporting=Reporting(quiet=True, stats_file=str(target)))
    _read_only_fs(monkeypatch, ro)
    with pytest.raises(OutputError) as err:
        run_job(job)
    assert "read-only file system" in str(err.value) and "permission denied" not in str(err.value)
    assert str(target) in str(err.value) and engine.seen == []


def test_a_disk_full_before_the_start_names_the_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = write_rows(tmp_path / "in.jsonl", ROWS)
    out = tmp_path / "out.parquet"

    def full(self: Manifest, root: str) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Manifest, "save", full)
    engine = FakeEngine()
    with pytest.raises(OutputError) as err:
        run_job(make_job(src, out, engine))
    assert str(out) in str(err.value) and "No space left on device" in str(err.value)
    assert "free some space" in str(err.value) and engine.seen == []


def test_an_empty_output_keeps_the_kept_columns_typed_as_the_parquet_input(tmp_path: Path) -> None:
    src = tmp_path / "in.parquet"
    schema = pa.schema([("id", pa.string()), ("text", pa.string()), ("n", pa.int32()), ("when", pa.timestamp("ms"))])
    pq.write_table(schema.empty_table(), src)
    out = tmp_path / "out.parquet"
    job = make_job(src, out)
    job = replace(job, source=BatchSource(InputOptions([str(src)], keep_cols=["n", "when"], batch_rows=2)))
    assert run_job(job) == 0
    got = pq.read_schema(out)
    assert got.names == ["id", "embedding", "n", "when"]
    assert got.field("n").type == pa.int32() and got.field("when").type == pa.timestamp("ms")


def test_an_empty_jsonl_input_keeps_the_kept_columns_as_strings(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text("")
    out = tmp_path / "out.parquet"
    job = replace(make_job(src, out), source=BatchSource(InputOptions([str(src)], keep_cols=["title"], batch_rows=2)))
    assert run_job(job) == 0
    assert pq.read_schema(out).field("title").type == pa.string()


def test_merging_a_shard_set_into_one_of_its_members_is_refused(tmp_path: Path) -> None:
    from embedcli.tasks.merge import merge_outputs

    src = write_rows(tmp_path / "in.jsonl", ROWS)
    parts = [tmp_path / f"part-{k}.parquet" for k in range(2)]
    for k, part in enumerate(parts):
        assert run_job(make_job(src, part, shard=f"{k}/2")) == 0
    before = parts[0].read_bytes()
    with pytest.raises(UsageError, match="is the input"):
        merge_outputs([str(p) for p in parts], str(parts[0]))
    assert parts[0].read_bytes() == before
    merge_outputs([str(p) for p in parts], str(tmp_path / "all.parquet"))
    assert pq.read_table(tmp_path / "all.parquet").num_rows == len(ROWS)
