"""Shard repair writes only through the run's own checks: a fresh scratch name, the output's lock, nothing else touched."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

import pytest

from embedcli.io.manifest import staging_dir

ROWS, SHARD_ROWS = 6, 2


@pytest.fixture
def sharded(cli, st_model: Path, tmp_path: Path) -> tuple[Path, Path, bytes]:  # type: ignore[no-untyped-def]
    """A finished three-shard directory with its middle shard deleted: (corpus, directory, the lost bytes)."""
    corpus = tmp_path / "in.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"d{i}", "text": f"row number {i}"}) + "\n" for i in range(ROWS)))
    out = tmp_path / "dir"
    cli("embed", corpus, "-m", st_model, "-o", f"{out}/", "--shard-rows", SHARD_ROWS, "-q")
    lost = (out / "part-000001.parquet").read_bytes()
    (out / "part-000001.parquet").unlink()
    return corpus, out, lost


def _rerun(cli, st_model: Path, corpus: Path, out: Path, code: int = 0):  # type: ignore[no-untyped-def]
    return cli("embed", corpus, "-m", st_model, "-o", f"{out}/", "--shard-rows", SHARD_ROWS, code=code)


def test_a_link_or_folder_beside_the_output_is_never_used_as_scratch(
    cli, st_model: Path, sharded: tuple[Path, Path, bytes], tmp_path: Path  # type: ignore[no-untyped-def]
) -> None:
    corpus, out, lost = sharded
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("mine")
    os.symlink(victim, tmp_path / "dir.embedcli-repair")  # the scratch name repair used to empty and fill
    users = tmp_path / "dir.embedcli-repair.d"
    users.mkdir()
    (users / "notes.txt").write_text("also mine")
    result = _rerun(cli, st_model, corpus, out)
    assert "repaired part-000001.parquet" in result.stderr
    assert (out / "part-000001.parquet").read_bytes() == lost
    assert sorted(p.name for p in victim.iterdir()) == ["keep.txt"] and (victim / "keep.txt").read_text() == "mine"
    assert (users / "notes.txt").read_text() == "also mine"
    leftovers = {p.name for p in tmp_path.iterdir()} - {"in.jsonl", "dir", "victim", "dir.embedcli-repair",
                                                        "dir.embedcli-repair.d"}
    assert leftovers == set(), leftovers  # no scratch, no staging left behind


def test_a_killed_repairs_scratch_is_cleared_by_the_next(
    cli, st_model: Path, sharded: tuple[Path, Path, bytes], tmp_path: Path  # type: ignore[no-untyped-def]
) -> None:
    corpus, out, lost = sharded
    stale = tmp_path / "dir.embedcli-repair-abc123"
    (stale / "shard").mkdir(parents=True)
    (stale / "shard" / "part-000000.parquet").write_bytes(b"half written")
    _rerun(cli, st_model, corpus, out)
    assert (out / "part-000001.parquet").read_bytes() == lost and not stale.exists()


def test_repair_waits_for_no_one_while_another_run_holds_the_output(
    cli, st_model: Path, sharded: tuple[Path, Path, bytes]  # type: ignore[no-untyped-def]
) -> None:
    corpus, out, _ = sharded
    root = staging_dir(str(out))
    os.mkdir(root)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a run writing this output holds it
    try:
        result = _rerun(cli, st_model, corpus, out, code=1)
        assert "another embedcli run is writing this output" in result.stderr
        assert not (out / "part-000001.parquet").exists()
    finally:
        os.close(fd)
    _rerun(cli, st_model, corpus, out)
    assert (out / "part-000001.parquet").exists()
