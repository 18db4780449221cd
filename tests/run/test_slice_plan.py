"""The slice planner of `--engine ray` (no Ray): slices start only where a local run ends a batch (the run's
cuts), sized against --shard-rows and the workers, and a resumed plan cuts the rest as the first run did."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embedcli.io.positions import ReadPoint
from embedcli.io.readers import read_inputs
from embedcli.run.grid import Grid, grid_of, text_point
from embedcli.run.slices import FirstBatch, first_batch, line_points, plan_slices, slice_rows
from embedcli.run.source import BatchSource, InputOptions

CHARS = 256  # a batch's text cap: cells of 2 KiB, so small files have many cuts


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


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("block", [16, 4, 1])
def test_line_points_are_the_grids_text_points(tmp_path: Path, seed: int, block: int) -> None:
    """One scan finds, for every offset, the line a run's reader cuts at (`text_point`, one read per cut)."""
    rng = random.Random(seed)
    lines = [b"x" * rng.randint(0, 40) for _ in range(rng.randint(0, 300))]
    data = b"\n".join(lines) + (b"\n" if rng.random() < 0.5 else b"")
    path = tmp_path / "t.txt"
    path.write_bytes(data)
    offsets = sorted({rng.randint(1, max(1, len(data) + 2)) for _ in range(20)})
    found, count = line_points(str(path), offsets, block)
    assert found == [text_point(str(path), x, block) for x in offsets]
    assert count == len(data.splitlines())


def _corpus(path: Path, n: int, bad: int = 0) -> Path:
    with path.open("w", encoding="utf-8") as f:
        for i in range(n):
            f.write("{not json\n" if i < bad else json.dumps({"id": f"r{i}", "text": "word " * (i % 7 + 1)}) + "\n")
    return path


def _batch_ends(paths: list[str], grid: Grid) -> set[tuple[int, int, int]]:
    """Where a whole run's reader ends a batch at a cut (file, pos, line)."""
    ends = set()
    for batch in read_inputs(paths, batch_rows=1024, batch_chars=CHARS, cuts=grid.cuts, on_bad_row=lambda e: None):
        if batch.grid_end and batch.end is not None:
            ends.add(batch.end.order())
    return ends


def _plan(paths: list[str], rows: int, workers: int = 2, begin: ReadPoint | None = None) -> tuple[list, Grid]:
    source = BatchSource(InputOptions(paths))
    grid = grid_of(paths, None, CHARS)
    assert grid is not None
    first = first_batch(source, paths, 1024, CHARS, grid.cuts)
    return plan_slices(source, paths, rows, grid=grid, workers=workers, begin=begin, first=lambda: first), grid


@pytest.mark.parametrize(("n", "rows"), [(3_000, 100), (3_000, 1_000), (600, 50)])
def test_slices_start_where_a_whole_run_ends_a_batch(tmp_path: Path, n: int, rows: int) -> None:
    path = str(_corpus(tmp_path / "c.jsonl", n))
    plan, grid = _plan([path], rows)
    assert len(plan) > 1 and plan[0].start is None
    ends = _batch_ends([path], grid)
    for s in plan[1:]:
        assert s.start is not None and s.start.order() in ends and s.start.state
    assert [s.stop.order() for s in plan[:-1] if s.stop is not None] == [s.start.order() for s in plan[1:] if s.start]
    assert plan[-1].stop is None
    assert sum(s.records or 0 for s in plan) == n
    # --shard-rows: a slice closes at the first cut past it (cells of ~90 lines here)
    assert all((s.records or 0) < rows + 200 for s in plan[:-1])
    # Resumed from the end of the second slice: the rest as the first run cut it.
    rest, _ = _plan([path], rows, begin=plan[1].end)
    assert [(s.start.order() if s.start else None, s.stop) for s in rest] == \
        [(s.start.order() if s.start else None, s.stop) for s in plan[2:]]


def test_a_resume_point_between_cuts_starts_the_rest(tmp_path: Path) -> None:
    """A run staged by the local engine committed between this plan's cuts: the rest starts there."""
    path = str(_corpus(tmp_path / "c.jsonl", 3_000))
    data = Path(path).read_bytes()
    pos = len(b"".join(data.splitlines(keepends=True)[:130]))
    rest, grid = _plan([path], 100, begin=ReadPoint(0, pos, 130))
    assert rest[0].start is not None and (rest[0].start.pos, rest[0].start.line) == (pos, 130)
    ends = _batch_ends([path], grid)
    assert all(s.start is not None and s.start.order() in ends for s in rest[1:])


@pytest.mark.parametrize("bad", [0, 200])
def test_no_slice_starts_inside_the_first_batch(tmp_path: Path, bad: int) -> None:
    """A whole run fixes the types (and so the line identities of its row index) after its first batch: a
    slice starting inside it would give its rows identities a whole run does not."""
    path = str(_corpus(tmp_path / "c.jsonl", 3_000, bad))
    source = BatchSource(InputOptions([path]))
    grid = grid_of([path], None, CHARS)
    assert grid is not None
    first = first_batch(source, [path], 1024, CHARS, grid.cuts)
    assert first.end is not None and (first.end.line > bad)
    plan = plan_slices(source, [path], 50, grid=grid, workers=2, first=lambda: first)
    assert all(s.start.order() >= first.end.order() for s in plan[1:] if s.start is not None)
    assert sum(s.records or 0 for s in plan) == 3_000
    assert all(s.start.state for s in plan[1:] if s.start is not None)  # the types the first batch fixed


def test_files_cut_at_their_end_and_parquet_inside_its_row_groups(tmp_path: Path) -> None:
    """A CSV file's cuts move to its end, so the next file may start a slice; a Parquet file of one row group is
    cut inside it, at rows a whole run ends a batch at."""
    csv = tmp_path / "a.csv"
    csv.write_text("id,text\n" + "".join(f"c{i},csv row {i} words words\n" for i in range(400)), encoding="utf-8")
    texts = [f"parquet row {i} " + "word " * (i % 5) for i in range(2_000)]
    pq.write_table(pa.table({"id": [f"p{i}" for i in range(2_000)], "text": texts}), tmp_path / "b.parquet",
                   row_group_size=2_000)
    jsonl = str(_corpus(tmp_path / "c.jsonl", 500))
    paths = [str(csv), str(tmp_path / "b.parquet"), jsonl]
    plan, grid = _plan(paths, 100)
    starts = [s.start for s in plan[1:]]
    assert all(s is not None for s in starts)
    assert ReadPoint(1, 0, 0).order() in [s.order() for s in starts if s is not None]  # after the CSV file
    inside = [s for s in starts if s is not None and s.file == 1 and s.pos > 0]
    assert inside and all(s.pos % 16 == 0 for s in inside)
    ends = _batch_ends(paths, grid)
    assert all(s.order() in ends for s in starts if s is not None)
    assert sum(s.records or 0 for s in plan) == 400 + 2_000 + 500


def test_a_plan_without_cuts_inside_is_one_slice(tmp_path: Path) -> None:
    path = str(_corpus(tmp_path / "c.jsonl", 40))
    source = BatchSource(InputOptions([path]))
    grid = grid_of([path], None, None)  # no token budget: cells of 4 MiB
    assert grid is not None
    plan = plan_slices(source, [path], 10, grid=grid, workers=4, first=lambda: FirstBatch({}))
    assert [(s.start, s.stop, s.records) for s in plan] == [(None, None, 40)]
