"""Reruns that cost what changed, with a fake engine and no model (each test runs in about a second): rows to
compute are pooled across batches and files before the engine packs them, unchanged blocks, files and row
groups are carried over without reading their text, and a resume reads none of the committed rows.

The engine's "vector" of a text is its length and a checksum; a forward is one engine batch with rows."""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embedcli.io.manifest import Manifest, staging_dir
from embedcli.run import BatchSource, InputOptions, Job, Reporting, RunFlags, Target, run_job
from embedcli.run.source import kept_columns


@dataclass
class Stats:
    rows: int = 0
    tokens: int = 0
    forwards: int = 0
    truncated_rows: int = 0
    chunked_rows: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"seconds": {"tokenize": 0.0, "compute": 0.0}}


class Stop(Exception):
    """The engine dies mid-run (as a killed process would, before the pool in hand is written)."""


@dataclass
class Engine:
    """One forward per batch with rows; `die_at` raises on that forward."""

    die_at: int | None = None
    seen: list[str] = field(default_factory=list)
    stats: Stats = field(default_factory=Stats)
    max_length: int = 512

    def map(self, batches: Iterable[Sequence[Any]]) -> Iterator[Any]:
        for texts in batches:
            if len(texts):
                self.stats.forwards += 1
                if self.die_at is not None and self.stats.forwards == self.die_at:
                    raise Stop
            self.seen.extend(texts)
            self.stats.rows += len(texts)
            yield np.asarray([[len(t), zlib.crc32(t.encode()) % 1000] for t in texts], np.float32).reshape(-1, 2)


class Codec:
    def inputs(self, batch: Any) -> Sequence[Any]:
        return list(batch.texts)

    def table(self, batch: Any, result: Any) -> Any:
        flat = pa.array(np.asarray(result, np.float32).reshape(-1), pa.float32())
        kept = kept_columns(batch, list(getattr(batch, "columns", {})))  # as the embed codec keeps them
        return pa.table({"id": pa.array(batch.ids, pa.string()), "embedding": pa.FixedSizeListArray.from_arrays(flat, 2),
                         **kept})

    def empty(self) -> Any:
        return self.table(type("B", (), {"ids": [], "columns": {}})(), np.zeros((0, 2), np.float32))


META = {"embedcli.model": "fake", "embedcli.model_hash": "m1", "embedcli.config": "{}", "embedcli.config_hash": "c1"}


def job(paths: list[Path], out: Path, engine: Engine, stats: Path, **flags: Any) -> Job:
    return Job(
        source=BatchSource(InputOptions([str(p) for p in paths], batch_rows=64, keep_cols=flags.pop("keep_cols", []))),
        engine=engine,
        codec=Codec(),
        provenance=dict(META),
        target=Target(str(out)),
        flags=RunFlags(shard_rows=flags.pop("shard_rows", 64), **flags),
        reporting=Reporting(quiet=True, stats_file=str(stats)),
    )


def run(paths: list[Path], out: Path, tmp: Path, engine: Engine | None = None, **flags: Any) -> dict[str, Any]:
    stats = tmp / f"stats-{len(list(tmp.glob('stats-*')))}.json"
    engine = engine or Engine()
    run_job(job(paths, out, engine, stats, **flags))
    report = json.loads(stats.read_text())
    report["seen"] = engine.seen
    return report


def texts(n: int, tag: str = "") -> list[str]:
    return [f"text {tag}{i} " + "word " * (i % 7) for i in range(n)]


def write_jsonl(path: Path, rows: list[tuple[str, str]]) -> Path:
    path.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in rows), encoding="utf-8")
    return path


def rows_of(n: int) -> list[tuple[str, str]]:
    return [(f"r{i}", t) for i, t in enumerate(texts(n))]


def test_scattered_changes_pack_like_appended_ones(tmp_path: Path) -> None:
    n, k = 4000, 40
    base = rows_of(n)
    src = write_jsonl(tmp_path / "in.jsonl", base)
    out = tmp_path / "out.parquet"
    run([src], out, tmp_path)
    appended = tmp_path / "app.parquet"
    write_jsonl(src, [*base, *[(f"new{i}", f"appended text {i}") for i in range(k)]])
    app = run([src], appended, tmp_path, incremental=True, previous=str(out))
    rng = np.random.default_rng(1)
    where = set(rng.choice(n, k, replace=False).tolist())
    write_jsonl(src, [(i, t + " changed" if j in where else t) for j, (i, t) in enumerate(base)])
    scattered = run([src], tmp_path / "sc.parquet", tmp_path, incremental=True, previous=str(out))
    assert app["computed_rows"] == scattered["computed_rows"] == k
    # 40 rows in 64-row pools: one forward or two, however far apart the rows are
    assert scattered["forwards"] <= 1.2 * app["forwards"] + 1 and scattered["forwards"] <= 2
    # the changed rows are read (and the first batch, whose rows fix a JSON input's types), the other rows
    # carried over unread: whole blocks, and the unchanged lines of a block that changed
    assert scattered["rows_read"] <= k + 64 and scattered["carried_unread_rows"] >= n - k - 64


def _edit(lines: list[str], kind: str) -> list[str]:
    """JSON lines with some changed the way `kind` says, at spread-out places past the first batch."""
    out = list(lines)
    at = [int(x) for x in np.random.default_rng(7).choice(np.arange(100, len(lines) - 40), 12, replace=False)]
    for j in at:
        rec = json.loads(lines[j])
        if kind == "edited":
            out[j] = json.dumps({**rec, "text": rec["text"] + " edited"})
        elif kind == "blank_or_bad":
            out[j] = "" if j % 2 else '{"id": "broken'
        elif kind == "repeated_id":  # a later row's id, in a block that changed too: that piece is read after all
            out[j] = json.dumps({**rec, "id": json.loads(lines[j + 20])["id"]})
            out[j + 21] = json.dumps({**json.loads(lines[j + 21]), "text": "edited too"})
        elif kind == "repeated_id_ahead":  # a later row's id, in a stretch of blocks carried over unread
            out[j] = json.dumps({**rec, "id": json.loads(lines[j + 35])["id"]})
        elif kind == "swapped":  # the same lines at other numbers
            out[j], out[j + 1] = lines[j + 1], lines[j]
        elif kind == "shifted":  # every line after the first change moves
            out[j] = lines[j] + "\n" + json.dumps({"id": f"new{j}", "text": "a line put in"})
    return "\n".join(out).split("\n")


@pytest.mark.parametrize("kind", ["edited", "blank_or_bad", "repeated_id", "repeated_id_ahead", "swapped", "shifted"])
def test_a_changed_block_carries_its_unchanged_lines_to_the_bytes_of_a_full_run(tmp_path: Path, kind: str) -> None:
    lines = [json.dumps({"id": i, "text": t}) for i, t in rows_of(1500)]
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    prev = tmp_path / "prev.parquet"
    run([src], prev, tmp_path, on_error="skip")
    src.write_text("\n".join(_edit(lines, kind)) + "\n", encoding="utf-8")
    out, full = tmp_path / "out.parquet", tmp_path / "full.parquet"
    again = run([src], out, tmp_path, incremental=True, previous=str(prev), on_error="skip")
    whole = run([src], full, tmp_path, on_error="skip")
    assert out.read_bytes() == full.read_bytes()  # (swapped, blank_or_bad: every row taken over, none computed)
    assert Path(f"{out}.embedcli-index.parquet").read_bytes() == Path(f"{full}.embedcli-index.parquet").read_bytes()
    assert again["skipped_rows"] == whole["skipped_rows"]
    if kind in ("edited", "blank_or_bad"):  # only the lines that changed are read (and the first batch)
        assert again["rows_read"] <= 64 + 12 and again["computed_rows"] == (12 if kind == "edited" else 0)
    if kind == "repeated_id":
        # (edits can meet); the piece holding a repeated id is read after all
        assert again["skipped_rows"] >= 10 and again["rows_read"] <= 64 + 12 * 16


def test_lines_moved_across_the_previous_output_s_row_groups_are_taken_back_in_their_new_order(tmp_path: Path) -> None:
    """Rows taken over from the previous output one way and the other across its row groups (8,192 rows each):
    the rerun assembles the bytes of a full run (it failed with an ArrowIndexError: rows taken as if sorted)."""
    lines = [json.dumps({"id": i, "text": t}) for i, t in rows_of(9000)]
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    prev = tmp_path / "prev.parquet"
    run([src], prev, tmp_path)
    moved = list(lines)
    moved.insert(300, moved.pop(8700))  # from the second row group into the first
    moved.insert(8600, moved.pop(120))  # and back
    src.write_text("\n".join(moved) + "\n", encoding="utf-8")
    out, full = tmp_path / "out.parquet", tmp_path / "full.parquet"
    again = run([src], out, tmp_path, incremental=True, previous=str(prev))
    run([src], full, tmp_path)
    assert again["computed_rows"] == 0 and again["carried_rows"] == 9000
    assert out.read_bytes() == full.read_bytes()


def test_a_carried_row_group_read_after_all_once_its_file_is_behind_the_reader(tmp_path: Path) -> None:
    """A Parquet file's last row group, carried over, holds an id met earlier (an edit above it), so the checks
    read it after all; by then the reader has cut the next file's first batch and closed this file. The rows
    are read from the file opened again (it failed: 'Invalid operation on closed file', exit 1)."""
    rows = rows_of(600)
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"

    def write(table_rows: list[tuple[str, str]]) -> None:
        pq.write_table(pa.table({"id": [i for i, _ in table_rows], "text": [t for _, t in table_rows]}), a,
                       row_group_size=300)

    write(rows)
    pq.write_table(pa.table({"id": [f"b{i}" for i in range(100)], "text": texts(100, "b")}), b)
    prev = tmp_path / "prev.parquet"
    run([a, b], prev, tmp_path)
    edited = list(rows)
    edited[10] = (rows[500][0], "an id the last row group has too")
    write(edited)
    out, full = tmp_path / "out.parquet", tmp_path / "full.parquet"
    again = run([a, b], out, tmp_path, incremental=True, previous=str(prev), on_error="skip")
    run([a, b], full, tmp_path, on_error="skip")
    assert again["skipped_rows"] == 1
    assert out.read_bytes() == full.read_bytes()


def test_a_text_file_s_repeated_lines_are_carried_only_at_their_own_numbers(tmp_path: Path) -> None:
    """A plain-text line's id is `file:line`: the same text at another number is another row."""
    lines = ["the same line" if i % 5 == 0 else f"line {i} of the file" for i in range(800)]
    src = tmp_path / "in.txt"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    prev = tmp_path / "prev.parquet"
    run([src], prev, tmp_path)
    edited = list(lines)
    for j in (101, 302, 603):
        edited[j] = "the same line"
    for j in (200, 455):
        edited[j] = lines[j] + " edited"
    src.write_text("\n".join(edited) + "\n", encoding="utf-8")
    out, full = tmp_path / "out.parquet", tmp_path / "full.parquet"
    again = run([src], out, tmp_path, incremental=True, previous=str(prev))
    run([src], full, tmp_path)
    assert again["rows_read"] == again["computed_rows"] == 5
    assert sorted(again["seen"]) == sorted(["the same line"] * 3 + [edited[200], edited[455]])
    assert out.read_bytes() == full.read_bytes()
    assert Path(f"{out}.embedcli-index.parquet").read_bytes() == Path(f"{full}.embedcli-index.parquet").read_bytes()


def test_a_previous_index_without_line_identities_reads_changed_blocks_whole(tmp_path: Path) -> None:
    """An output of an embedcli before the `line` column: its changed blocks are read whole, as they were."""
    base = rows_of(1000)
    src = write_jsonl(tmp_path / "in.jsonl", base)
    prev = tmp_path / "prev.parquet"
    run([src], prev, tmp_path)
    sidecar = Path(f"{prev}.embedcli-index.parquet")
    old = pq.read_table(sidecar)
    pq.write_table(old.drop_columns(["line"]).replace_schema_metadata(old.schema.metadata), sidecar)
    write_jsonl(src, [(i, t + " edited" if j in (300, 700) else t) for j, (i, t) in enumerate(base)])
    out, full = tmp_path / "out.parquet", tmp_path / "full.parquet"
    again = run([src], out, tmp_path, incremental=True, previous=str(prev))
    run([src], full, tmp_path)
    assert again["computed_rows"] == 2 and 64 + 2 < again["rows_read"] <= 64 + 2 * 16
    assert out.read_bytes() == full.read_bytes()
    got = pq.read_table(f"{out}.embedcli-index.parquet")
    assert got.drop_columns(["line"]).equals(pq.read_table(f"{full}.embedcli-index.parquet").drop_columns(["line"]))


def test_a_shard_directory_with_an_older_shard_index_carries_lines_where_it_can(tmp_path: Path) -> None:
    """A shard directory resumed across versions can hold a shard whose row index has no `line` column: its
    changed blocks are read whole, the other shards' lines are carried, the rows are those of a full run."""
    base = rows_of(1200)
    src = write_jsonl(tmp_path / "in.jsonl", base)
    prev = tmp_path / "prev"
    run([src], prev, tmp_path, shard_rows=400, shards_dir=True)
    indexes = sorted((prev / "_embedcli").glob("index-*.parquet"))
    assert len(indexes) == 3
    old = pq.read_table(indexes[1])
    pq.write_table(old.drop_columns(["line"]).replace_schema_metadata(old.schema.metadata), indexes[1])
    write_jsonl(src, [(i, t + " edited" if j in (500, 1000) else t) for j, (i, t) in enumerate(base)])
    again = run([src], tmp_path / "out.parquet", tmp_path, incremental=True, previous=str(prev))
    run([src], tmp_path / "full.parquet", tmp_path)
    assert again["computed_rows"] == 2 and 64 + 2 + 15 <= again["rows_read"] <= 64 + 2 + 16
    assert pq.read_table(tmp_path / "out.parquet").equals(pq.read_table(tmp_path / "full.parquet"))


@dataclass
class BudgetEngine(Engine):
    """An engine with a token budget: batches of at most 1 KiB of text, cuts every 8 KiB of input."""

    max_batch_tokens: int = 64


@pytest.mark.parametrize("previous", [False, True])
def test_the_first_batch_ends_at_the_first_cut_in_a_rerun_too(tmp_path: Path, previous: bool) -> None:
    """A full run ends a batch at the inputs' first cut (8 KiB in: rows with a big field not read); its first
    batch fixes the kept column's type (null so far: text). An `--incremental` rerun, which drops the other
    cuts, keeps that one: the same type and row index as a full run, not a column typed from more rows."""
    def write(changed: int) -> Path:
        return write_jsonl_records(tmp_path / "in.jsonl", [
            {"id": f"r{i}", "text": f"row {i}" + (" changed" if i == changed else ""), "meta": "m" * 500,
             "k": None if i < 40 else i} for i in range(120)])

    out, full = tmp_path / "out.parquet", tmp_path / "full.parquet"
    run([write(-1)], out, tmp_path, BudgetEngine(), keep_cols=["k"])
    src = write(90)
    flags: dict[str, Any] = {"incremental": True, **({"previous": str(out)} if previous else {})}
    rerun = tmp_path / "rerun.parquet" if previous else out
    run([src], rerun, tmp_path, BudgetEngine(), keep_cols=["k"], **flags)
    run([src], full, tmp_path, BudgetEngine(), keep_cols=["k"])
    assert pq.read_schema(full).field("k").type == pa.string()  # typed by the rows before the cut
    for suffix in ("", ".embedcli-index.parquet"):
        assert Path(f"{rerun}{suffix}").read_bytes() == Path(f"{full}{suffix}").read_bytes()


def write_jsonl_records(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_many_one_row_files_share_forwards(tmp_path: Path) -> None:
    folder = tmp_path / "many"
    folder.mkdir()
    rows = rows_of(240)
    for i, row in enumerate(rows):
        write_jsonl(folder / f"f{i:04d}.jsonl", [row])
    one = write_jsonl(tmp_path / "one.jsonl", rows)
    many = run(sorted(folder.glob("*.jsonl")), tmp_path / "many.parquet", tmp_path)
    single = run([one], tmp_path / "one.parquet", tmp_path)
    assert many["rows"] == single["rows"] == 240
    assert many["forwards"] <= 1.2 * single["forwards"] and many["forwards"] <= 4  # not one per file
    assert pq.read_table(tmp_path / "many.parquet").column("embedding").equals(
        pq.read_table(tmp_path / "one.parquet").column("embedding"))


@pytest.mark.parametrize("die_at", [2, 5, 9])
@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_a_resume_reads_no_committed_row_and_ends_byte_equal(tmp_path: Path, die_at: int, fmt: str) -> None:
    rows = rows_of(1000)
    if fmt == "jsonl":
        src = write_jsonl(tmp_path / "in.jsonl", rows)
    else:
        src = tmp_path / "in.parquet"
        pq.write_table(pa.table({"id": [i for i, _ in rows], "text": [t for _, t in rows]}), src, row_group_size=300)
    whole = tmp_path / "whole.parquet"
    run([src], whole, tmp_path, shard_rows=50)
    out = tmp_path / "out.parquet"
    with pytest.raises(Stop):
        run([src], out, tmp_path, Engine(die_at=die_at), shard_rows=50)
    manifest = Manifest.load(staging_dir(str(out)))
    assert manifest is not None and 0 < manifest.records_done < 1000
    done = manifest.records_done
    again = run([src], out, tmp_path, shard_rows=50)
    assert again["resumed_rows"] == done and again["rows_read"] == 1000 - done  # no committed row read again
    assert again["seen"] == [t for _, t in rows[done:]]
    assert out.read_bytes() == whole.read_bytes()
    assert Path(f"{out}.embedcli-index.parquet").read_bytes() == Path(f"{whole}.embedcli-index.parquet").read_bytes()


def test_a_resume_inside_a_row_group_with_a_null_text_gives_its_blocks_the_same_identities(tmp_path: Path) -> None:
    """A Parquet block's identity hashed the nulls of the whole decoded chunk it sat in; a resume starts decoding
    mid-group, so the blocks after it got other identities than an uninterrupted run's (its row index, and what
    a later --incremental can carry over, differed) when a null text was in the chunk before the resume point."""
    rows = rows_of(1000)
    texts_ = [None if i == 5 else t for i, (_, t) in enumerate(rows)]
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": [i for i, _ in rows], "text": pa.array(texts_, pa.string())}), src)
    whole = tmp_path / "whole.parquet"
    run([src], whole, tmp_path, shard_rows=50, on_error="skip")
    out = tmp_path / "out.parquet"
    with pytest.raises(Stop):
        run([src], out, tmp_path, Engine(die_at=5), shard_rows=50, on_error="skip")
    again = run([src], out, tmp_path, shard_rows=50, on_error="skip")
    assert 0 < again["resumed_rows"] < 999
    assert out.read_bytes() == whole.read_bytes()
    assert Path(f"{out}.embedcli-index.parquet").read_bytes() == Path(f"{whole}.embedcli-index.parquet").read_bytes()


def _bad_rows(out: Path) -> list[str]:
    return [e["location"] for e in json.loads(pq.read_schema(out).metadata[b"embedcli.errors"])]


@pytest.mark.parametrize("die_at", [3, 4, 5, 6, 7])
def test_a_resume_under_skip_reports_each_bad_row_once(tmp_path: Path, die_at: int) -> None:
    """A reader cuts the next batch before it hands one on: the bad rows of that next batch are reported by
    then, and were committed with the batch before. A kill between the two commits, and the resume read them
    again: one bad row twice in the metadata and the errors file, one more skipped row than there were."""
    lines = [json.dumps({"id": i, "text": t}) for i, t in rows_of(1000)]
    for j in range(30, 1000, 97):
        lines[j] = '{"id": "broken'
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    whole = tmp_path / "whole.parquet"
    full = run([src], whole, tmp_path, on_error="skip")
    out = tmp_path / "out.parquet"
    with pytest.raises(Stop):
        run([src], out, tmp_path, Engine(die_at=die_at), on_error="skip")
    again = run([src], out, tmp_path, on_error="skip")
    assert full["skipped_rows"] == again["skipped_rows"] == 10
    assert _bad_rows(out) == _bad_rows(whole) == [f"line {j + 1}" for j in range(30, 1000, 97)]
    assert out.read_bytes() == whole.read_bytes()


def test_bad_rows_are_reported_in_input_order(tmp_path: Path) -> None:
    """A batch's lines that do not parse are found as it is read and its repeated ids after: in input order
    all the same, so where batches end (a rerun's are not a full run's) does not show in the list."""
    rows = rows_of(300)
    lines = [json.dumps({"id": i, "text": t}) for i, t in rows]
    lines[200] = json.dumps({"id": rows[199][0], "text": "a repeated id"})
    lines[205] = lines[290] = '{"id": "broken'
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out.parquet"
    run([src], out, tmp_path, on_error="skip")
    assert _bad_rows(out) == ["line 201", "line 206", "line 291"]


@pytest.mark.parametrize("line", ["[1, 2]", "[not json", '{"id": "broken'])
def test_a_bad_line_after_lines_carried_over_is_the_bad_row_a_full_run_finds(tmp_path: Path, line: str) -> None:
    """What a JSON Lines reader says of a file's first record (a JSON array stops the run; a line that does not
    parse hints at --format txt) is said only where no record came before: carried over unread, lines before
    it were records all the same. The second file is carried from its first line (types are fixed by then)."""
    a = write_jsonl(tmp_path / "a.jsonl", rows_of(200))
    lines = [json.dumps({"id": f"b{i}", "text": t}) for i, t in enumerate(texts(400))]
    b = tmp_path / "b.jsonl"
    b.write_text("\n".join(lines) + "\n", encoding="utf-8")
    prev = tmp_path / "prev.parquet"
    run([a, b], prev, tmp_path)
    lines[250] = line
    b.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out, full = tmp_path / "out.parquet", tmp_path / "full.parquet"
    again = run([a, b], out, tmp_path, incremental=True, previous=str(prev), on_error="skip")
    run([a, b], full, tmp_path, on_error="skip")
    assert again["skipped_rows"] == 1 and again["rows_read"] <= 64 + 1
    assert out.read_bytes() == full.read_bytes()


def test_a_resume_over_shards_of_an_older_index_assembles_with_the_new_column_null(tmp_path: Path) -> None:
    """Shards committed by an embedcli before the `line` column, resumed by this one: the sidecar has it, null
    for their rows; the output is the uninterrupted run's."""
    src = write_jsonl(tmp_path / "in.jsonl", rows_of(1000))
    whole = tmp_path / "whole.parquet"
    run([src], whole, tmp_path, shard_rows=50)
    out = tmp_path / "out.parquet"
    with pytest.raises(Stop):
        run([src], out, tmp_path, Engine(die_at=5), shard_rows=50)
    staged = sorted(Path(staging_dir(str(out))).rglob("index-*.parquet"))
    assert staged
    for path in staged:
        old = pq.read_table(path)
        pq.write_table(old.drop_columns(["line"]), path)
    run([src], out, tmp_path, shard_rows=50)
    assert out.read_bytes() == whole.read_bytes()
    got, want = pq.read_table(f"{out}.embedcli-index.parquet"), pq.read_table(f"{whole}.embedcli-index.parquet")
    assert got.drop_columns(["line"]).equals(want.drop_columns(["line"]))
    assert got.column("line").null_count >= len(staged) * 50 - 64


def test_a_resume_still_finds_an_id_repeated_from_a_committed_row(tmp_path: Path) -> None:
    rows = [*rows_of(500), ("r3", "a repeat of an id committed before the stop")]
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.parquet"
    with pytest.raises(Stop):
        run([src], out, tmp_path, Engine(die_at=4), shard_rows=50, on_error="skip")
    again = run([src], out, tmp_path, shard_rows=50, on_error="skip")
    assert again["rows_read"] < 500 and again["skipped_rows"] == 1
    assert pq.read_table(out).num_rows == 500


def test_unchanged_files_and_row_groups_are_carried_without_reading_them(tmp_path: Path) -> None:
    a = write_jsonl(tmp_path / "a.jsonl", rows_of(300))
    b = write_jsonl(tmp_path / "b.jsonl", [(f"b{i}", t) for i, t in enumerate(texts(300, "b"))])
    c = tmp_path / "c.parquet"
    c_texts = texts(400, "c")
    pq.write_table(pa.table({"id": [f"c{i}" for i in range(400)], "text": c_texts}), c, row_group_size=100)
    out = tmp_path / "out.parquet"
    first = run([a, b, c], out, tmp_path)
    assert first["rows"] == 1000
    write_jsonl(b, [(f"b{i}", t + (" edited" if i == 7 else "")) for i, t in enumerate(texts(300, "b"))])
    c_texts[250] += " edited"  # one row group of four changes
    pq.write_table(pa.table({"id": [f"c{i}" for i in range(400)], "text": c_texts}), c, row_group_size=100)
    again = run([a, b, c], out, tmp_path, incremental=True)
    assert again["computed_rows"] == 2 and again["carried_rows"] == 998
    # a.jsonl and three row groups of c.parquet carried whole, unread; b.jsonl and c's third group: a block each
    assert again["rows_read"] <= 16 + 16
    assert again["carried_unread_rows"] >= 300 + 300 + 300 - 16
    assert sorted(again["seen"]) == sorted([texts(300, "b")[7] + " edited", c_texts[250]])
    full = run([a, b, c], tmp_path / "full.parquet", tmp_path)
    got, want = pq.read_table(out), pq.read_table(tmp_path / "full.parquet")
    assert got.column("id").equals(want.column("id")) and got.column("embedding").equals(want.column("embedding"))
    assert full["rows_read"] == 1000


def test_a_carried_block_whose_id_was_seen_is_read_and_the_repeat_reported(tmp_path: Path) -> None:
    a = write_jsonl(tmp_path / "a.jsonl", rows_of(100))
    b = write_jsonl(tmp_path / "b.jsonl", [(f"b{i}", t) for i, t in enumerate(texts(100, "b"))])
    out = tmp_path / "out.parquet"
    run([a, b], out, tmp_path, on_error="skip")
    write_jsonl(a, [*rows_of(100), ("b5", "now in a.jsonl first")])  # b.jsonl's b5 is a repeat now
    again = run([a, b], out, tmp_path, incremental=True, on_error="skip", errors_file=str(tmp_path / "bad.jsonl"))
    assert again["skipped_rows"] == 1
    bad = [json.loads(x) for x in (tmp_path / "bad.jsonl").read_text().splitlines()]
    assert [(r["id"], r["file"].endswith("b.jsonl"), r["location"]) for r in bad] == [("b5", True, "line 6")]
    ids = pq.read_table(out).column("id").to_pylist()
    assert ids.count("b5") == 1 and ids.index("b5") == 100
    # the blocks read after all are marked in the row index as a full run marks them
    full = tmp_path / "full.parquet"
    run([a, b], full, tmp_path, on_error="skip")
    assert out.read_bytes() == full.read_bytes()
    assert Path(f"{out}.embedcli-index.parquet").read_bytes() == Path(f"{full}.embedcli-index.parquet").read_bytes()


def test_merge_of_a_previous_incremental_carries_everything_over(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", rows_of(700))
    out = tmp_path / "out.parquet"
    run([src], out, tmp_path)
    copy = write_jsonl(tmp_path / "copy.jsonl", rows_of(700))  # another file, the same rows
    again = run([copy], tmp_path / "again.parquet", tmp_path, incremental=True, previous=str(out))
    assert again["computed_rows"] == 0 and again["carried_rows"] == 700
    assert pq.read_table(tmp_path / "again.parquet").column("embedding").equals(pq.read_table(out).column("embedding"))


def test_a_stop_between_pools_commits_what_was_written(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", rows_of(600))
    out = tmp_path / "out.parquet"
    with pytest.raises(Stop):
        run([src], out, tmp_path, Engine(die_at=3), shard_rows=10_000, commit_every=1e9)
    manifest = Manifest.load(staging_dir(str(out)))
    assert manifest is not None and manifest.records_done > 0  # the two pools written before the failure
    assert manifest.shards[-1].end is not None  # with where reading goes on


@pytest.mark.parametrize("in_place", [False, True])
def test_a_killed_incremental_run_resumes_to_the_bytes_of_an_uninterrupted_one(tmp_path: Path, in_place: bool) -> None:
    """Rows taken over from the previous output are staged as references: a resume reads them from the same
    previous output (in place: the output file itself, replaced only at the very end)."""
    base = rows_of(2000)
    src = write_jsonl(tmp_path / "in.jsonl", base)
    prev = tmp_path / "prev.parquet"
    run([src], prev, tmp_path, shard_rows=50)
    changed = [(i, t + " edited" if j % 20 == 0 else t) for j, (i, t) in enumerate(base)]
    write_jsonl(src, [*changed, *[(f"n{i}", f"new row {i}") for i in range(30)]])
    want = tmp_path / "want.parquet"
    run([src], want, tmp_path, shard_rows=50, incremental=True, previous=str(prev))
    out = prev if in_place else tmp_path / "out.parquet"
    flags = {} if in_place else {"previous": str(prev)}
    with pytest.raises(Stop):
        run([src], out, tmp_path, Engine(die_at=2), shard_rows=50, incremental=True, **flags)
    manifest = Manifest.load(staging_dir(str(out)))
    assert manifest is not None and manifest.records_done and any(s.refs for s in manifest.shards)
    again = run([src], out, tmp_path, shard_rows=50, incremental=True, **flags)
    assert again["resumed_rows"] == manifest.records_done
    assert out.read_bytes() == want.read_bytes()
    assert Path(f"{out}.embedcli-index.parquet").read_bytes() == Path(f"{want}.embedcli-index.parquet").read_bytes()


def test_rows_taken_over_reach_stdout_too(tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", rows_of(300))
    prev = tmp_path / "prev.parquet"
    run([src], prev, tmp_path)
    write_jsonl(src, [*rows_of(300), ("extra", "one more row")])
    capsysbinary.readouterr()
    stats = tmp_path / "stdout.json"
    engine = Engine()
    j = job([src], tmp_path / "unused.parquet", engine, stats, incremental=True, previous=str(prev))
    run_job(Job(j.source, engine, j.codec, j.provenance, Target("-", "jsonl"), j.flags, j.reporting))
    lines = [json.loads(x) for x in capsysbinary.readouterr().out.decode().splitlines()]
    assert [r["id"] for r in lines] == [*(f"r{i}" for i in range(300)), "extra"]
    want = pq.read_table(prev).column("embedding").to_pylist()
    assert [r["embedding"] for r in lines[:300]] == [[float(v) for v in e] for e in want]
    assert engine.seen == ["one more row"]
