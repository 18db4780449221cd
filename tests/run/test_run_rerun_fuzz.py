"""Reruns under random edits (seeded): each `--incremental` rerun, killed part-way or not, is the bytes of a
full run of the same inputs, its row index and its bad rows included, generation after generation; and a full
run killed one to three times resumes to the bytes of an uninterrupted one.

Edits a nightly job meets: texts edited, rows put in, deleted, swapped and moved far (across the previous
output's row groups), ids repeated, bad rows and null texts, rows appended, in JSON Lines, CSV (quoted fields
with commas, quotes and line breaks), plain text and Parquet (row groups of several sizes). The fake engine of
`test_run_pools` stands in for a model. Each case found or guards a bug: a rerun that stopped on rows moved
between row groups, a Parquet row group re-read after its file was closed, bad rows committed with the batch
before theirs (listed twice after a resume), bad rows in another order, what a JSON Lines reader says of a
file's first record said again after lines carried over, and Parquet block identities that changed with where
a resume started decoding."""

from __future__ import annotations

import csv
import io
import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_run_pools import BudgetEngine, Engine, Stop, run, texts

Row = tuple[str, "str | None"]
BAD = "\x00bad"  # a row written as a bad record of its format


def _rows(fmt: str, file: int, n: int) -> list[Row]:
    out: list[Row] = []
    for i, t in enumerate(texts(n)):
        if i % 11 == 0:
            t += ", with a comma"
        if i % 13 == 0:
            t += ' and "quotes"'
        if fmt == "csv" and i % 17 == 0:
            t += "\non a second line"
        out.append((f"{file}-{i}", t))
    return out


def _edit(rows: list[Row], rng: random.Random, edits: int) -> list[Row]:
    rows = list(rows)
    for _ in range(edits):
        j = rng.randrange(len(rows))
        rid, text = rows[j]
        kind = rng.choice(["edit", "repeat_id", "delete", "insert", "swap", "bad", "null", "move", "append"])
        if kind == "edit":
            rows[j] = (rid, f"{text or ''} edited {rng.randrange(999)}")
        elif kind == "repeat_id":
            rows[j] = (rows[rng.randrange(len(rows))][0], text)
        elif kind == "delete" and len(rows) > 1:
            del rows[j]
        elif kind == "insert":
            rows.insert(j, (f"new{rng.randrange(10**6)}", f"put in {rng.randrange(999)}"))
        elif kind == "swap" and j + 1 < len(rows):
            rows[j], rows[j + 1] = rows[j + 1], rows[j]
        elif kind == "bad":
            rows[j] = (rid, BAD)
        elif kind == "null":
            rows[j] = (rid, None)
        elif kind == "move":
            rows.insert(rng.randrange(len(rows)), rows.pop(j))
        elif kind == "append":
            rows.append((f"end{rng.randrange(10**6)}", "appended"))
    return rows


def _csv_line(rid: str, text: str) -> str:
    out = io.StringIO()
    csv.writer(out, lineterminator="").writerow([rid, text])
    return out.getvalue()


def _write(path: Path, fmt: str, rows: list[Row], rng: random.Random) -> None:
    if fmt == "parquet":
        kept = [(i, t) for i, t in rows if t != BAD]
        pq.write_table(pa.table({"id": [i for i, _ in kept], "text": pa.array([t for _, t in kept], pa.string())}),
                       path, row_group_size=rng.choice([50, 128, 1000]))
        return
    if fmt == "jsonl":
        lines = ['{"id": "broken' if t == BAD else json.dumps({"id": i, "text": t}) for i, t in rows]
    elif fmt == "csv":
        lines = ["id,text"] + ["x,y,z,a field too many" if t == BAD else f"{i}," if t is None else _csv_line(i, t)
                               for i, t in rows]
    else:  # plain text: one text a line, ids file:line; a blank line is no row, a bad one is bad UTF-8
        lines = ["\udcff bad" if t == BAD else "" if t is None else t.replace("\n", " ") for _, t in rows]
    data = "\n".join(lines) + ("\n" if rng.random() < 0.9 else "")
    path.write_bytes(data.encode("utf-8", "surrogateescape"))


def _same_as_full(out: Path, full: Path) -> None:
    assert out.read_bytes() == full.read_bytes()
    assert Path(f"{out}.embedcli-index.parquet").read_bytes() == Path(f"{full}.embedcli-index.parquet").read_bytes()


# Seeds that each met one of the bugs above before its fix (csv: none did; two seeds all the same); every seed
# of 1-25 (1,500 rows) and 1-5 (9,000) passes now. With a token budget (`tokens`), batches are cut by their
# text and a full run's batches end at cuts every 8 batches of text, of which a rerun keeps the first alone
# (90 seeds of random formats and budgets passed).
@pytest.mark.parametrize(
    ("fmt", "n", "seed", "tokens"),
    [("jsonl", 1500, 4, None), ("jsonl", 1500, 5, None), ("csv", 1500, 1, None), ("csv", 1500, 2, None),
     ("txt", 1500, 19, None), ("txt", 1500, 20, None), ("parquet", 1500, 5, None), ("parquet", 1500, 21, None),
     ("jsonl", 9000, 2, None), ("jsonl", 1500, 3, 16), ("parquet", 1500, 7, 16), ("txt", 1500, 8, 64)],
)
def test_reruns_under_random_edits_are_the_bytes_of_full_runs(tmp_path: Path, fmt: str, n: int, seed: int,
                                                              tokens: int | None) -> None:
    def engine(die_at: int | None = None) -> Engine:
        return Engine(die_at) if tokens is None else BudgetEngine(die_at, max_batch_tokens=tokens)

    rng = random.Random(f"{fmt}-{n}-{seed}")
    files = [(tmp_path / f"in{k}.{fmt}", _rows(fmt, k, n)) for k in range(rng.choice([1, 2]))]
    for path, rows in files:
        _write(path, fmt, rows, rng)
    paths = [p for p, _ in files]
    flags = {"on_error": "skip", "shard_rows": 50}
    previous = tmp_path / "gen0.parquet"
    run(paths, previous, tmp_path, engine(), **flags)
    for gen in range(1, 4):
        for k, (path, rows) in enumerate(files):
            if rng.random() < 0.7:
                files[k] = (path, _edit(rows, rng, rng.choice([1, 3, 10, 40])))
                _write(path, fmt, files[k][1], rng)
        out, full = tmp_path / f"gen{gen}.parquet", tmp_path / f"full{gen}.parquet"
        die = rng.choice([None, 1, 2, 3])
        if die is not None:  # killed part-way (or done before the forward it would have died on)
            try:
                run(paths, out, tmp_path, engine(die), incremental=True, previous=str(previous), **flags)
            except Stop:
                pass
        again = run(paths, out, tmp_path, engine(), incremental=True, previous=str(previous), **flags)
        whole = run(paths, full, tmp_path, engine(), **flags)
        assert again["skipped_rows"] == whole["skipped_rows"]
        _same_as_full(out, full)
        previous = out


def _shard_dir(d: Path) -> tuple[pa.Table, pa.Table, str]:
    """A shard directory's rows, row index and bad rows, shard after shard (where commits fell left out)."""
    data = pa.concat_tables([pq.read_table(p).replace_schema_metadata(None) for p in sorted(d.glob("part-*.parquet"))])
    meta = d / "_embedcli"
    index = pa.concat_tables([pq.read_table(p).replace_schema_metadata(None) for p in sorted(meta.glob("index-*.parquet"))])
    return data, index, "".join(p.read_text(encoding="utf-8") for p in sorted(meta.glob("errors-*.jsonl")))


# Seed 12 met the Parquet identity bug before its fix (a resume inside a row group, a null text before it).
@pytest.mark.parametrize("seed", [12, 6, 31, 44])
def test_full_runs_killed_and_resumed_are_the_bytes_of_an_uninterrupted_one(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    fmt = rng.choice(["jsonl", "csv", "txt", "parquet"])
    n = rng.choice([300, 1500, 4000])
    paths = []
    for k in range(rng.choice([1, 2, 3])):
        path = tmp_path / f"in{k}.{fmt}"
        _write(path, fmt, _edit(_rows(fmt, k, n), rng, rng.choice([0, 5, 30])), rng)
        paths.append(path)
    flags: dict[str, object] = {"on_error": "skip", "shard_rows": rng.choice([50, 200, 1000])}
    as_dir = rng.random() < 0.25
    if as_dir:
        flags["shards_dir"] = True
    whole = tmp_path / ("whole" if as_dir else "whole.parquet")
    run(paths, whole, tmp_path, **flags)
    out = tmp_path / ("out" if as_dir else "out.parquet")
    for _ in range(rng.choice([1, 2, 3])):  # killed one to three times, resumed each time
        try:
            run(paths, out, tmp_path, Engine(die_at=rng.randint(1, 12)), **flags)
        except Stop:
            continue
    run(paths, out, tmp_path, **flags)
    if as_dir:  # a shard directory's shards end where its commits fell: its rows are an uninterrupted run's
        (a, ai, ae), (b, bi, be) = _shard_dir(out), _shard_dir(whole)
        assert a.equals(b) and ai.equals(bi) and ae == be
    else:
        _same_as_full(out, whole)
