"""kill -9 at named steps of a run into a real store, then a rerun: no duplicate id, no lost row, the resume point
no further than what is committed (Postgres: exactly the committed rows), the final table a fresh run's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest

from embedcli.io.stores import open_store
from tests.stores.store_helpers import (
    Corpus,
    assert_same,
    corpus,
    expected_rows,
    killed_session_gone,
    read_back,
    sync,
)

REPO = Path(__file__).resolve().parents[2]
BASE = 60  # records; batches of 10, a commit every 2 batches: commits at 20, 40, 60 (the finish)


def scenario_corpus(name: str) -> Corpus:
    """`load`: 60 fresh rows. `incremental`: those with 20 texts changed, 10 rows gone, 15 new."""
    c = corpus(BASE)
    if name == "load":
        return c
    keep = [i for i in range(BASE) if not 40 <= i < 50]
    texts = [t + " (edited)" if 5 <= i < 25 else t for i, t in enumerate(c.texts)]
    new = corpus(15, start=1000)
    return Corpus([c.ids[i] for i in keep] + new.ids, [texts[i] for i in keep] + new.texts, pa.table({}))


PG = "embedcli.io.stores.postgres:PostgresStore"
LANCE = "embedcli.io.stores.lance:LanceStore"
STEPS = {
    "postgres": [
        ("load", f"after:{PG}._copy:3"),  # mid-batch: rows sent, not committed
        ("load", f"after:{PG}._upsert:2"),  # inside the second commit's transaction
        ("load", f"after:{PG}._save_point:2"),  # inside it, the resume point written, before COMMIT
        ("load", f"after:{PG}._transaction:2"),  # just after the second commit
        ("incremental", f"after:{PG}._delete_gone:1"),  # inside the final transaction, after the deletes
        ("incremental", f"after:{PG}._index:1"),  # the final step
    ],
    "lance": [
        ("load", f"before:{LANCE}._merge:2"),  # mid-run: rows held, not written
        ("load", f"after:{LANCE}._merge:2"),  # between a commit's upsert and its resume point
        ("load", f"after:{LANCE}._save_point:2"),  # just after the second commit
        ("incremental", f"after:{LANCE}._delete:1"),  # the final step: deletes done, nothing else
        ("incremental", "after:lancedb.table:LanceTable.optimize:1"),  # the final step: before the last point
    ],
}


def _cases() -> list[object]:
    return [
        pytest.param(kind, scenario, step, id=f"{kind}-{scenario}-{step.split(':')[0]}-{step.split(':')[2]}")
        for kind, steps in STEPS.items()
        for scenario, step in steps
    ]


@pytest.mark.parametrize(("kind", "scenario", "step"), _cases())
def test_kill_then_rerun(
    kind: str, scenario: str, step: str, pg_url: Callable[..., str], lance_url: Callable[[], str]
) -> None:
    url = pg_url(index="hnsw") if kind == "postgres" else lance_url()
    if scenario == "incremental":
        sync(url, scenario_corpus("load"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    child = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("store_child.py")), url, scenario, step],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr[-3000:]
    if kind == "postgres":
        killed_session_gone(url)

    rows = read_back(url)  # asserts no duplicate id
    store = open_store(url)
    try:
        point = store.resume_point()
    finally:
        store.close()
    if scenario == "load":
        done = point.records_done if point is not None else 0
        if kind == "postgres":
            assert len(rows) == done  # one transaction: rows and resume point together
        else:
            assert done <= len(rows) <= done + 20  # at most one commit's upsert ahead of its resume point
        assert_same(rows, expected_rows(scenario_corpus("load").slice(0, len(rows))))

    report = sync(url, scenario_corpus(scenario))
    final = scenario_corpus(scenario)
    assert_same(read_back(url), expected_rows(final))
    store = open_store(url)
    try:
        point = store.resume_point()
    finally:
        store.close()
    assert point is not None and point.complete and point.records_done == len(final)
    assert not report.nothing_to_do
