"""`--engine ray` survives its processes dying: a worker (its actor process) killed with SIGKILL mid-slice is
restarted and its slice redone; a driver killed mid-run leaves committed slices that the rerun resumes after;
`--incremental` on that output computes only the changed rows. Each run is its own `embedcli` process joining
the session's two-node cluster, as in production."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from distributed_helpers import vectors, write_corpus

pytest.importorskip("ray")

ROWS = 3000
SHARD_ROWS = 50
SMALL = ("--max-batch-tokens", "64")  # cuts every 8 KiB: ~19 slices, the run is still going when the test strikes
CHANGED = (7, 1234, 2999)


def _start(out: Path, corpus: Path, model: Path, cluster, stats: Path, *extra: str) -> subprocess.Popen[str]:  # type: ignore[no-untyped-def]
    env = {**os.environ, **cluster.env, "EMBEDCLI_DTYPE": "float32"}
    argv = [sys.executable, "-m", "embedcli", "embed", str(corpus), "-m", str(model), "-o", str(out), "-q",
            "--shard-rows", str(SHARD_ROWS), "--stats", str(stats), "--engine", "ray", "--workers", "2",
            "--ray-address", cluster.address, *SMALL, *extra]
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _committed(out: Path) -> int:
    try:
        manifest = json.loads((Path(f"{out}.embedcli-staging") / "_embedcli" / "manifest.json").read_text())
    except (OSError, ValueError):
        return 0
    return len(manifest["shards"])


def _wait_for_commits(proc: subprocess.Popen[str], out: Path, shards: int, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while _committed(out) < shards:
        if proc.poll() is not None:
            raise AssertionError(f"the run ended (exit {proc.returncode}) before {shards} commits:\n"
                                 f"{proc.stderr.read() if proc.stderr else ''}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"no {shards} commits in {timeout} s")
        time.sleep(0.02)


def _wait_for(seen: Callable[[], Any], proc: subprocess.Popen[str], what: str, timeout: float = 60) -> Any:
    """`seen()` once it is true, checked every millisecond while the run goes on."""
    deadline = time.monotonic() + timeout
    while not (found := seen()):
        assert proc.poll() is None and time.monotonic() < deadline, f"{what} not seen while the run went on"
        time.sleep(0.001)
    return found


def _same_as_local(out: Path, local: Path, exact: bool = True) -> None:
    """The local run's rows and vectors: bit for bit (a slice's forwards are the local run's), or to float
    rounding for a rerun's computed rows (packed together wherever they are)."""
    ids, emb, meta = vectors(out)
    l_ids, l_emb, l_meta = vectors(local)
    assert ids == l_ids == [f"d{i}" for i in range(ROWS)]
    assert np.array_equal(emb, l_emb) if exact else np.abs(emb - l_emb).max() <= 1e-6
    assert meta["embedcli.config_hash"] == l_meta["embedcli.config_hash"]


def test_a_killed_worker_or_driver_costs_only_its_slices(cli, st_model: Path, tmp_path: Path, ray_cluster) -> None:  # type: ignore[no-untyped-def]
    corpus = write_corpus(tmp_path / "corpus.jsonl", ROWS, seed=5)
    local = tmp_path / "local.parquet"
    cli("embed", corpus, "-m", st_model, "-o", local, "-q", "--shard-rows", SHARD_ROWS, *SMALL)

    # A worker (an actor's process) killed mid-run: Ray restarts it, its slice is done again, the run ends well.
    out = tmp_path / "worker.parquet"
    before = set(ray_cluster.worker_pids())  # actors of earlier in-process runs of the session may live on
    proc = _start(out, corpus, st_model, ray_cluster, tmp_path / "w.json")
    # this run's actors, found as they start (a scan of every process is slow beside a run of short slices)
    pids = _wait_for(lambda: (p if len(p := [x for x in ray_cluster.worker_pids() if x not in before]) == 2 else None),
                     proc, "two workers")
    _wait_for_commits(proc, out, 2)
    victim = _wait_for(lambda: ray_cluster.busy(pids), proc, "a worker doing a slice")[0]
    os.kill(victim, signal.SIGKILL)  # mid-slice: its task is lost with it
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert victim not in ray_cluster.worker_pids()
    stats = json.loads((tmp_path / "w.json").read_text())
    assert stats["computed_rows"] == ROWS and stats["resumed_rows"] == 0
    _same_as_local(out, local)

    # The driver killed mid-run: the committed slices stay staged, the rerun resumes after them.
    out = tmp_path / "driver.parquet"
    proc = _start(out, corpus, st_model, ray_cluster, tmp_path / "d1.json")
    _wait_for_commits(proc, out, 3)
    proc.kill()
    proc.wait(timeout=60)
    assert not out.exists() and _committed(out) >= 3
    proc = _start(out, corpus, st_model, ray_cluster, tmp_path / "d2.json")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    stats = json.loads((tmp_path / "d2.json").read_text())
    resumed = stats["resumed_rows"]
    assert resumed >= 3 * SHARD_ROWS and stats["computed_rows"] == ROWS - resumed
    _same_as_local(out, local)
    assert not Path(f"{out}.embedcli-staging").exists()

    # --incremental on the resumed output: three rows changed in three slices are computed, the rest carried.
    lines = corpus.read_text().splitlines()
    for i in CHANGED:
        lines[i] = json.dumps({"id": f"d{i}", "text": f"row {i} changed since the first run"})
    changed = tmp_path / "changed.jsonl"
    changed.write_text("\n".join(lines) + "\n")
    proc = _start(out, changed, st_model, ray_cluster, tmp_path / "i.json", "--incremental")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    stats = json.loads((tmp_path / "i.json").read_text())
    assert (stats["computed_rows"], stats["carried_rows"]) == (len(CHANGED), ROWS - len(CHANGED))
    local = tmp_path / "local-changed.parquet"
    cli("embed", changed, "-m", st_model, "-o", local, "-q", *SMALL)
    _same_as_local(out, local, exact=False)
