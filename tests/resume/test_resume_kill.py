"""Acceptance: a real `embedcli embed` killed (SIGKILL) or stopped (SIGTERM/SIGINT) at random moments resumes
to exactly the output of an uninterrupted run, byte for byte, with no row missing or repeated.

Each restart waits until the process has committed a new shard, then kills it after a random delay, so
every kill lands while work is in flight (mid-forward, mid-commit or mid-assembly), never in start-up.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from resume_helpers import (
    corpus_rows,
    embed_argv,
    leftovers,
    read_stats,
    run_embed_process,
    subprocess_env,
    write_jsonl,
)

ROWS = 16_000
SHARD_ROWS = 200
SEED = int(os.environ.get("EMBEDCLI_KILL_SEED", "20240605"))


def _committed(out: Path) -> int:
    manifest = Path(f"{out}.embedcli-staging") / "_embedcli" / "manifest.json"
    try:
        return int(json.loads(manifest.read_text())["records_done"])
    except (OSError, ValueError, KeyError):
        return -1 if not out.exists() else ROWS


def _start(corpus: Path, model: Path, out: Path) -> subprocess.Popen:
    return subprocess.Popen(
        embed_argv(corpus, "-m", model, "-o", out, "--shard-rows", SHARD_ROWS, "-q"),
        env=subprocess_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_progress(proc: subprocess.Popen, out: Path, before: int, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None or _committed(out) > before:
            return
        time.sleep(0.02)
    proc.kill()
    raise AssertionError(f"no progress in {timeout}s (committed {before})")


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, st_model: Path) -> dict:
    """The corpus and an uninterrupted run's output and stats."""
    root = tmp_path_factory.mktemp("kill")
    rows = corpus_rows(ROWS, seed=7)
    corpus = write_jsonl(root / "corpus.jsonl", rows)
    ref = root / "reference.parquet"
    started = time.monotonic()
    done = run_embed_process(corpus, "-m", st_model, "-o", ref, "--shard-rows", SHARD_ROWS, "-q", "--stats", root / "ref.json")
    assert done.returncode == 0, done.stderr
    stats = read_stats(root / "ref.json")
    return {
        "root": root,
        "corpus": corpus,
        "ids": [r["id"] for r in rows],
        "ref": ref,
        "wall": time.monotonic() - started,
        "work_seconds": stats["seconds"]["total"],
    }


def _assert_same_as_reference(out: Path, reference: dict) -> None:
    assert out.read_bytes() == reference["ref"].read_bytes(), "output differs from the uninterrupted run"
    index = Path(f"{out}.embedcli-index.parquet")
    assert index.read_bytes() == Path(f"{reference['ref']}.embedcli-index.parquet").read_bytes()
    ids = pq.read_table(out, columns=["id"]).column("id").to_pylist()
    assert ids == reference["ids"]  # every row once, in input order
    assert leftovers(out.parent) == []


def test_sigkill_at_random_moments_resumes_to_the_same_bytes(reference: dict, st_model: Path) -> None:
    rng = random.Random(SEED)
    out = reference["root"] / "killed.parquet"
    max_delay = max(0.05, reference["work_seconds"] / 10)
    kills: list[tuple[float, int, int]] = []
    while len(kills) < 5:
        before = _committed(out)
        proc = _start(reference["corpus"], st_model, out)
        _wait_for_progress(proc, out, before)
        delay = rng.uniform(0, max_delay)
        time.sleep(delay)
        if proc.poll() is not None:
            break
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
        kills.append((round(delay, 3), before, _committed(out)))
    print(f"\nSIGKILL moments (delay after a new commit, committed before, committed after): {kills}")
    assert len(kills) >= 5, f"the run finished after {len(kills)} kills; make the corpus bigger: {kills}"
    assert any(0 < k[2] < ROWS for k in kills), kills  # some kills left a partial run behind
    done = run_embed_process(reference["corpus"], "-m", st_model, "-o", out, "--shard-rows", SHARD_ROWS, "-q",
                             "--stats", reference["root"] / "killed.json")
    assert done.returncode == 0, done.stderr
    stats = read_stats(reference["root"] / "killed.json")
    assert stats["rows"] == ROWS
    assert stats["computed_rows"] + stats["resumed_rows"] == ROWS or stats["computed_rows"] == 0
    _assert_same_as_reference(out, reference)


def test_sigterm_and_sigint_commit_exit_130_and_resume(reference: dict, st_model: Path) -> None:
    rng = random.Random(SEED + 1)
    out = reference["root"] / "stopped.parquet"
    stops = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        before = _committed(out)
        proc = _start(reference["corpus"], st_model, out)
        _wait_for_progress(proc, out, before)
        time.sleep(rng.uniform(0, reference["work_seconds"] / 10))
        if proc.poll() is not None:
            break
        proc.send_signal(sig)
        code = proc.wait(timeout=60)
        stderr = proc.stderr.read() if proc.stderr else ""
        after = _committed(out)
        stops.append((sig.name, before, after, code))
        if after == ROWS:  # the signal arrived during the final assembly, which is not interrupted
            assert code in (0, 130), stderr
            break
        assert code == 130, stderr
        assert "interrupted" in stderr
        assert after > before  # what was done when the signal came was committed
        assert not out.exists()
    print(f"\nstops (signal, committed before, committed after, exit code): {stops}")
    assert stops
    done = run_embed_process(reference["corpus"], "-m", st_model, "-o", out, "--shard-rows", SHARD_ROWS, "-q")
    assert done.returncode == 0, done.stderr
    _assert_same_as_reference(out, reference)
