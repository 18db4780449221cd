"""The unattended loop (`embedcli.run.run_job`) with a fake engine and no model: each test runs in well under
a second. The engine's "vector" of a text is its length and a checksum, so a row's result is known exactly."""

from __future__ import annotations

import json
import signal
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embedcli.errors import EXIT_SKIPPED, TooManyErrors, UsageError
from embedcli.io.manifest import Manifest, staging_dir
from embedcli.run import (
    BatchSource,
    Engine,
    InputOptions,
    Job,
    Reporting,
    RowCodec,
    RunFlags,
    Target,
    run_job,
)


@dataclass
class FakeStats:
    rows: int = 0
    tokens: int = 0
    forwards: int = 0
    truncated_rows: int = 0
    chunked_rows: int = 0
    sliced_rows: int = 0
    solo_rows: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"seconds": {"tokenize": 0.0, "compute": 0.0}}


@dataclass
class FakeEngine:
    """Results of a batch: [len(text), crc32(text) % 1000] per text; `on_batch(n)` runs after batch n is read."""

    on_batch: Callable[[int], None] | None = None
    seen: list[str] = field(default_factory=list)
    stats: FakeStats = field(default_factory=FakeStats)
    max_length: int = 512

    def map(self, batches: Iterable[Sequence[Any]]) -> Iterator[Any]:
        for n, texts in enumerate(batches, start=1):
            self.seen.extend(texts)
            self.stats.rows += len(texts)
            if self.on_batch is not None:
                self.on_batch(n)
            yield np.asarray([fake_vector(t) for t in texts], dtype=np.float32).reshape(len(texts), 2)


def fake_vector(text: str) -> list[float]:
    return [float(len(text)), float(zlib.crc32(text.encode()) % 1000)]


class FakeCodec:
    """id and a fixed_size_list<float32>[2] `embedding` column."""

    def inputs(self, batch: Any) -> Sequence[Any]:
        return list(batch.texts)

    def table(self, batch: Any, result: Any) -> Any:
        flat = pa.array(np.asarray(result, dtype=np.float32).reshape(-1), pa.float32())
        return pa.table({"id": pa.array(batch.ids, pa.string()), "embedding": pa.FixedSizeListArray.from_arrays(flat, 2)})

    def empty(self) -> Any:
        return self.table(type("B", (), {"ids": []})(), np.zeros((0, 2), np.float32))


META = {"embedcli.model": "fake", "embedcli.model_hash": "m1", "embedcli.config": "{}", "embedcli.config_hash": "c1"}


def write_rows(path: Path, rows: list[tuple[str, str | None]]) -> Path:
    path.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in rows), encoding="utf-8")
    return path


def make_job(src: Path, out: Path, engine: FakeEngine | None = None, **flags: Any) -> Job:
    return Job(
        source=BatchSource(InputOptions([str(src)], batch_rows=2)),
        engine=engine or FakeEngine(),
        codec=FakeCodec(),
        provenance=dict(META),
        target=Target(str(out)),
        flags=RunFlags(shard_rows=2, **flags),
        reporting=Reporting(quiet=True),
    )


def rows_of(path: Path) -> dict[str, list[float]]:
    t = pq.read_table(path)
    return dict(zip(t.column("id").to_pylist(), t.column("embedding").to_pylist(), strict=True))


ROWS = [(f"r{i}", f"text number {i}" + "!" * i) for i in range(10)]


def test_fakes_satisfy_the_protocols() -> None:
    assert isinstance(FakeEngine(), Engine) and isinstance(FakeCodec(), RowCodec)


def test_sigterm_mid_batch_commits_then_resume_from_the_manifest_computes_only_the_rest(tmp_path: Path) -> None:
    src = write_rows(tmp_path / "in.jsonl", ROWS)
    out = tmp_path / "out.parquet"

    def term(n: int) -> None:
        if n == 2:  # a real SIGTERM while batch 2 is being computed
            signal.raise_signal(signal.SIGTERM)

    first = FakeEngine(on_batch=term)
    with pytest.raises(KeyboardInterrupt):
        run_job(make_job(src, out, first))
    manifest = Manifest.load(staging_dir(str(out)))
    # The stop does not wait for the batch being computed (on a large model that takes minutes): the batch
    # written before the signal is committed, the one in hand is left for the rerun.
    assert manifest is not None and manifest.records_done == 2 and not out.exists()
    again = FakeEngine()
    assert run_job(make_job(src, out, again)) == 0
    assert again.seen == [t for _, t in ROWS[2:]]  # the committed records are read, never recomputed
    whole = tmp_path / "whole.parquet"
    run_job(make_job(src, whole))
    assert rows_of(out) == rows_of(whole) == {i: fake_vector(t) for i, t in ROWS}
    assert pq.read_table(out).equals(pq.read_table(whole))


def test_a_different_config_is_refused_with_exit_2_unless_overwrite(tmp_path: Path) -> None:
    src = write_rows(tmp_path / "in.jsonl", ROWS)
    out = tmp_path / "out.parquet"
    assert run_job(make_job(src, out)) == 0
    before = out.read_bytes()
    other = replace(make_job(src, out), provenance={**META, "embedcli.config_hash": "c2"})
    with pytest.raises(UsageError, match="different config") as err:
        run_job(other)
    assert err.value.exit_code == 2 and out.read_bytes() == before
    same = FakeEngine()
    assert run_job(make_job(src, out, same)) == 0 and same.seen == []  # complete: nothing to do
    assert run_job(replace(other, flags=replace(other.flags, overwrite=True))) == 0
    assert pq.read_schema(out).metadata[b"embedcli.config_hash"] == b"c2"


def test_on_error_skip_records_bad_rows_and_max_errors_stops(tmp_path: Path) -> None:
    rows = [*ROWS[:3], ("bad1", None), ROWS[3], ("bad2", None), ("r0", "a repeated id"), *ROWS[4:6]]
    src = write_rows(tmp_path / "in.jsonl", rows)
    errors = tmp_path / "errors.jsonl"
    code = run_job(make_job(src, tmp_path / "out.parquet", on_error="skip", errors_file=str(errors), max_errors=3))
    assert code == EXIT_SKIPPED
    assert list(rows_of(tmp_path / "out.parquet")) == ["r0", "r1", "r2", "r3", "r4", "r5"]
    bad = [json.loads(line) for line in errors.read_text().splitlines()]
    assert [(b["id"], b["reason"].split(":")[0]) for b in bad] == [
        ("bad1", "text is null"), ("bad2", "text is null"), ("r0", "duplicate id 'r0'")
    ]
    with pytest.raises(TooManyErrors, match="more than 2 bad rows") as err:
        run_job(make_job(src, tmp_path / "stop.parquet", on_error="skip", max_errors=2))
    assert err.value.exit_code == 1 and err.value.record_id == "r0"
    with pytest.raises(Exception, match="text is null") as fail:
        run_job(make_job(src, tmp_path / "fail.parquet"))
    assert getattr(fail.value, "record_id", None) == "bad1"


def test_incremental_computes_new_and_changed_rows_and_carries_the_rest(tmp_path: Path) -> None:
    src = write_rows(tmp_path / "in.jsonl", ROWS)
    out = tmp_path / "out.parquet"
    run_job(make_job(src, out))
    changed = [*ROWS[:3], ("r3", "a changed text"), *ROWS[4:], ("r10", "a new row")]
    write_rows(src, changed)
    engine = FakeEngine()
    assert run_job(make_job(src, out, engine, incremental=True)) == 0
    assert engine.seen == ["a changed text", "a new row"]
    assert rows_of(out) == {i: fake_vector(t) for i, t in changed}
    assert list(rows_of(out)) == [i for i, _ in changed]  # input order, carried rows in place


@dataclass
class DeferredEngine(FakeEngine):
    """A FakeEngine that, like `embedcli.compute.lazy.LazyEngine`, has a `start` (its model would load there)."""

    starts: list[bool] = field(default_factory=list)  # per start: whether a manifest was staged already
    out: Path | None = None

    def start(self) -> None:
        assert self.out is not None
        self.starts.append(Manifest.load(staging_dir(str(self.out))) is not None)


@pytest.mark.parametrize("stdout", [False, True])
def test_a_deferred_engine_starts_only_when_there_is_work_and_before_a_manifest_is_staged(
    tmp_path: Path, stdout: bool, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    src = write_rows(tmp_path / "in.jsonl", ROWS)
    out = tmp_path / "out.parquet"
    first = DeferredEngine(out=out)
    job = make_job(src, out, first)
    assert run_job(replace(job, target=Target("-", "jsonl")) if stdout else job) == 0
    assert first.starts == [False]
    if stdout:
        return
    done = DeferredEngine(out=out)
    assert run_job(make_job(src, out, done)) == 0 and done.starts == [] and done.seen == []  # complete
    refused = DeferredEngine(out=out)
    other = replace(make_job(src, out, refused), provenance={**META, "embedcli.config_hash": "c2"})
    with pytest.raises(UsageError, match="different config"):
        run_job(other)
    assert refused.starts == []
