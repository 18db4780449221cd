"""The run's cuts (`embedcli.run.grid`) size the inputs by their fingerprints where the run has them: no second
stat (a store request per object) for what the fingerprints already say."""

from __future__ import annotations

from pathlib import Path

from embedcli.io.fingerprint import input_fingerprints
from embedcli.run.grid import grid_of


def _text(path: Path, lines: int) -> Path:
    path.write_text("".join(f"line {i} " + "word " * (i % 9) + "\n" for i in range(lines)), encoding="utf-8")
    return path


def test_cuts_from_fingerprint_sizes_are_those_from_the_files(tmp_path: Path) -> None:
    paths = [str(_text(tmp_path / "a.txt", 3000)), str(_text(tmp_path / "b.txt", 500))]
    fingerprints = input_fingerprints(paths)
    by_stat = grid_of(paths, None, 1024, 16)
    by_fp = grid_of(paths, None, 1024, 16, fingerprints=fingerprints)
    assert by_stat is not None and by_fp is not None and by_stat.cuts
    assert (by_fp.sizes, by_fp.cuts) == (by_stat.sizes, by_stat.cuts)
    first = grid_of(paths, None, 1024, 16, first_only=True, fingerprints=fingerprints)
    assert first is not None and first.cuts == {0: [min(by_stat.cuts[0])]}


def test_sizes_come_from_the_fingerprints_not_a_stat(tmp_path: Path) -> None:
    path = tmp_path / "gone.parquet"  # sized by its fingerprint alone: a stat would fail
    grid = grid_of([str(path)], "jsonl", None, fingerprints=[{"path": str(path), "size": 123}])
    assert grid is not None and grid.sizes == [123]
    assert grid_of([str(path)], "jsonl", None) is None
    # a fingerprint without a size (or too few of them): the files are sized as before
    assert grid_of([str(path)], "jsonl", None, fingerprints=[{"path": str(path)}]) is None
