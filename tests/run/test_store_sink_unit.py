"""The run loop's store lifecycle (`embedcli.run.store_run`) with a fake engine and an in-memory fake store, no
model and no database: each loop commit is one store commit with its resume point, a stop commits what is
written and the rerun computes only what no commit wrote, `--incremental` upserts changed/new rows and deletes
ids gone, another config and flags a store cannot honour are refused (exit 2) before anything is written."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from embedcli.errors import UsageError
from embedcli.io.stores import ResumePoint, StoreSchema
from embedcli.run import run_job
from tests.run.test_run_loop import ROWS, FakeEngine, fake_vector, make_job, write_rows

URL = "lancedb:///nowhere/db/docs"


class FakeStore:
    """A store in memory, with the lifecycle's order checked: rows and deletes staged, then applied together
    with the resume point at each commit."""

    display = URL

    def __init__(self) -> None:
        self.rows: dict[str, tuple[list[float], bytes]] = {}
        self.meta: dict[str, str] | None = None
        self.point: ResumePoint | None = None
        self.staged: list[tuple[str, list[float], bytes]] = []
        self.gone: list[str] = []
        self.commits: list[ResumePoint] = []
        self.events: list[str] = []

    def metadata(self) -> dict[str, str] | None:
        return None if self.meta is None else {**self.meta, **(self.point.metadata() if self.point else {})}

    def resume_point(self) -> ResumePoint | None:
        return self.point

    def begin(self, schema: StoreSchema, provenance: dict[str, str], *, replace: bool = False) -> None:
        self.events.append(f"begin replace={replace}")
        if self.meta is None or replace:
            self.rows, self.point = {}, None
            self.meta = {k: v for k, v in provenance.items() if k.startswith("embedcli.")}

    def present(self, block_rows: int = 65536) -> Iterator[tuple[pa.Array, np.ndarray]]:
        ids = list(self.rows)
        if ids:
            yield pa.array(ids), np.asarray([self.rows[i][1] for i in ids], dtype="S16")

    def write(self, table: pa.Table, keys: np.ndarray) -> None:
        for rid, vec, key in zip(table.column("id").to_pylist(), table.column("embedding").to_pylist(), keys,
                                 strict=True):
            self.staged.append((rid, vec, bytes(key)))

    def delete(self, ids: pa.Array) -> None:
        self.gone.extend(ids.to_pylist())

    def commit(self, point: ResumePoint) -> None:
        for rid, vec, key in self.staged:
            self.rows[rid] = (vec, key)
        for rid in self.gone:
            self.rows.pop(rid, None)
        self.staged, self.gone = [], []
        self.point = point
        self.commits.append(point)

    def abort(self) -> None:
        self.events.append("abort")
        self.staged, self.gone = [], []

    def finish(self, point: ResumePoint) -> None:
        self.events.append("finish")
        self.commit(point)

    def close(self) -> None:
        self.staged, self.gone = [], []
        self.events.append("close")


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> FakeStore:
    fake = FakeStore()
    opened: list[str] = []

    def open_store(url: str) -> FakeStore:
        opened.append(url)
        return fake

    monkeypatch.setattr("embedcli.run.store_run.open_store", open_store)
    fake.opened = opened  # type: ignore[attr-defined]
    return fake


def _vectors(rows: list[tuple[str, str]]) -> dict[str, list[float]]:
    return {i: fake_vector(t) for i, t in rows}


def _held(store: FakeStore) -> dict[str, list[float]]:
    return {rid: vec for rid, (vec, _) in store.rows.items()}


def test_each_loop_commit_is_a_store_commit_with_its_resume_point(tmp_path: Path, store: FakeStore) -> None:
    src = write_rows(tmp_path / "in.jsonl", ROWS)
    assert run_job(make_job(src, URL)) == 0
    points = [(p.records_done, p.complete) for p in store.commits]
    assert points[-1] == (len(ROWS), True) and all(not c for _, c in points[:-1])
    done = [r for r, _ in points]
    assert done == sorted(done) and len(set(done)) == len(ROWS) // 2  # a commit every --shard-rows 2 records
    assert len({p.job_key for p in store.commits}) == 1 and store.commits[0].job_key
    assert _held(store) == _vectors(ROWS)
    assert store.events[-2:] == ["finish", "close"]

    again = FakeEngine()
    assert run_job(make_job(src, URL, again)) == 0  # complete for this job: nothing computed
    assert again.seen == []


def test_a_stop_commits_what_is_written_and_the_rerun_computes_only_the_rest(tmp_path: Path, store: FakeStore) -> None:
    src = write_rows(tmp_path / "in.jsonl", ROWS)

    def term(n: int) -> None:
        if n == 2:
            signal.raise_signal(signal.SIGTERM)

    with pytest.raises(KeyboardInterrupt):
        run_job(make_job(src, URL, FakeEngine(on_batch=term)))
    assert store.point is not None and store.point.records_done == 2 and not store.point.complete
    assert _held(store) == _vectors(ROWS[:2]) and "finish" not in store.events
    again = FakeEngine()
    assert run_job(make_job(src, URL, again)) == 0
    assert again.seen == [t for _, t in ROWS[2:]]  # rows a commit wrote are not computed again
    assert _held(store) == _vectors(ROWS) and store.point is not None and store.point.complete


def test_a_failure_mid_write_drops_the_staged_rows(tmp_path: Path, store: FakeStore) -> None:
    src = write_rows(tmp_path / "in.jsonl", ROWS)

    def fail(n: int) -> None:
        if n == 3:
            raise OSError("disk gone")

    with pytest.raises(OSError):
        run_job(make_job(src, URL, FakeEngine(on_batch=fail)))
    assert store.point is not None and not store.point.complete
    assert len(store.rows) == store.point.records_done and not store.staged  # nothing beyond the last commit


def test_incremental_upserts_changed_and_new_deletes_gone_and_leaves_the_rest(tmp_path: Path, store: FakeStore) -> None:
    run_job(make_job(write_rows(tmp_path / "in.jsonl", ROWS), URL))
    before = dict(store.rows)
    edited = [(i, t + " (edited)" if i == "r3" else t) for i, t in ROWS if i != "r5"] + [("n1", "new row")]
    engine = FakeEngine()
    assert run_job(make_job(write_rows(tmp_path / "in2.jsonl", edited), URL, engine, incremental=True)) == 0
    assert sorted(engine.seen) == sorted(["new row", dict(edited)["r3"]])
    assert _held(store) == _vectors(edited)
    assert all(store.rows[i] == before[i] for i, _ in edited if i not in ("r3", "n1"))


def test_another_config_is_refused_naming_it_and_the_store_left_alone(tmp_path: Path, store: FakeStore) -> None:
    src = write_rows(tmp_path / "in.jsonl", ROWS)
    run_job(make_job(src, URL))
    rows, commits = dict(store.rows), len(store.commits)
    job = make_job(src, URL)
    other = type(job)(**{**job.__dict__, "provenance": {**job.provenance, "embedcli.model": "other",
                                                               "embedcli.model_hash": "m2"}})
    with pytest.raises(UsageError, match=r"different config \(-m/--model: fake → other\)") as err:
        run_job(other)
    assert err.value.exit_code == 2
    assert store.rows == rows and len(store.commits) == commits


@pytest.mark.parametrize(("flags", "says"), [({"shard": "0/2"}, "--shard"), ({"shards_dir": True}, "--shards-dir")])
def test_flags_a_store_cannot_honour_are_refused_before_it_is_opened(
    tmp_path: Path, store: FakeStore, flags: dict[str, Any], says: str
) -> None:
    src = write_rows(tmp_path / "in.jsonl", ROWS)
    with pytest.raises(UsageError, match=says):
        run_job(make_job(src, URL, **flags))
    assert store.opened == []  # type: ignore[attr-defined]
