"""The slice planner of `--engine ray` (no Ray): slice sizes against --shard-rows and the workers, cuts at
line starts, and a resumed plan that cuts the rest as the first run did."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from embedcli.io.positions import ReadPoint
from embedcli.run.slices import FirstBatch, first_batch, plan_slices, slice_rows
from embedcli.run.source import BatchSource, InputOptions


@pytest.mark.parametrize(("rows", "total", "workers", "expected"), [
    (100_000, 1_000_000, 2, 100_000),  # a big run: --shard-rows
    (100_000, 20_000, 2, 2_500),       # a small one: four slices a worker
    (100_000, 5_000, 2, 1_024),        # ... but none under 1,024 records
    (100_000, 5_000, 8, 1_024),
    (50, 3_000, 2, 50),                # --shard-rows under 1,024 is kept
    (500, 100, 1, 500),
])
def test_slice_rows(rows: int, total: int, workers: int, expected: int) -> None:
    assert slice_rows(rows, total, workers) == expected


def _corpus(path: Path, n: int) -> Path:
    with path.open("w", encoding="utf-8") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"r{i}", "text": "word " * (i % 7 + 1)}) + "\n")
    return path


@pytest.mark.parametrize(("n", "rows", "workers", "starts"), [
    (5_000, 100_000, 2, [0, 1024, 2048, 3072, 4096]),
    (20_000, 100_000, 2, [0, 3072, 6144, 9216, 12288, 15360, 18432]),  # 2,500 rounded up to whole 1,024-line cuts
    (300, 100, 2, [0, 112, 224]),  # --shard-rows rounded up to whole 16-line blocks
])
def test_slices_start_at_lines(tmp_path: Path, n: int, rows: int, workers: int, starts: list[int]) -> None:
    path = str(_corpus(tmp_path / "c.jsonl", n))
    source = BatchSource(InputOptions([path]))
    plan = plan_slices(source, [path], rows, workers=workers, first=lambda: FirstBatch({}))
    assert [0 if s.start is None else s.start.line for s in plan] == starts
    assert [s.records for s in plan] == [b - a for a, b in zip(starts, [*starts[1:], n], strict=True)]
    data = Path(path).read_bytes()
    for s in plan[1:]:
        assert s.start is not None and data[s.start.pos - 1:s.start.pos] == b"\n"  # a line's start
        assert data[:s.start.pos].count(b"\n") == s.start.line
    # Resumed from the end of the second slice: the rest as the first run cut it.
    rest = plan_slices(source, [path], rows, workers=workers, begin=plan[1].end, first=lambda: FirstBatch({}))
    assert [(s.start, s.stop) for s in rest] == [(s.start, s.stop) for s in plan[2:]]


def test_a_resume_point_between_cuts_starts_the_rest(tmp_path: Path) -> None:
    """A manifest written with another --shard-rows ends between this plan's cuts: the rest starts there."""
    path = str(_corpus(tmp_path / "c.jsonl", 300))
    source = BatchSource(InputOptions([path]))
    data = Path(path).read_bytes()
    pos = len(b"".join(data.splitlines(keepends=True)[:130]))
    rest = plan_slices(source, [path], 100, begin=ReadPoint(0, pos, 130), first=lambda: FirstBatch({}))
    assert rest[0].start is not None and (rest[0].start.pos, rest[0].start.line) == (pos, 130)
    assert [s.start.line for s in rest if s.start is not None] == [130, 224]


@pytest.mark.parametrize(("bad", "starts"), [
    (0, [0, 112, 224]),   # the first batch (100 rows) ends at line 112: a cut there stays
    (20, [0, 224]),       # 20 malformed lines first: it ends at line 128, past the cut at 112
])
def test_no_slice_starts_inside_the_first_batch(tmp_path: Path, bad: int, starts: list[int]) -> None:
    """A whole run fixes the types (and so the line identities of its row index) after its first batch: a
    slice starting inside it would give its rows identities a whole run does not."""
    path = tmp_path / "c.jsonl"
    with path.open("w", encoding="utf-8") as f:
        for i in range(300):
            f.write("{not json\n" if i < bad else json.dumps({"id": f"r{i}", "text": f"row {i}"}) + "\n")
    source = BatchSource(InputOptions([str(path)]))
    first = first_batch(source, [str(path)], 100, None)
    assert first.end is not None and first.end.line == (112 if bad == 0 else 128)
    plan = plan_slices(source, [str(path)], 100, workers=2, first=lambda: first)
    assert [0 if s.start is None else s.start.line for s in plan] == starts
    assert sum(s.records or 0 for s in plan) == 300
    assert all(s.start.state for s in plan[1:] if s.start is not None)  # the types the first batch fixed
