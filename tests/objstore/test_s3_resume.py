"""A run reading an S3 object (moto on 127.0.0.1), killed with SIGKILL once it has committed rows, resumes from its
manifest (the object's fingerprint unchanged) and ends equal to an uninterrupted run over the same bytes on disk."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

ROWS = 3_000
SHARD_ROWS = 100
WORDS = "the market shares rise after bank talks film won best album award quick brown fox jumps lazy dog".split()


def _env(extra: dict[str, str]) -> dict[str, str]:
    return {**os.environ, "EMBEDCLI_DTYPE": "float32", "EMBEDCLI_THREADS": "1", "OMP_NUM_THREADS": "1",
            "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **extra}


def _argv(source: str, model: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "embedcli", "embed", source, "-m", str(model), "-o", str(out), "--shard-rows",
            str(SHARD_ROWS), "-q", *extra]


def _committed(out: Path) -> int:
    manifest = Path(f"{out}.embedcli-staging") / "_embedcli" / "manifest.json"
    try:
        return int(json.loads(manifest.read_text())["records_done"])
    except (OSError, ValueError, KeyError):
        return -1


def test_a_killed_run_over_an_object_resumes_to_the_uninterrupted_output(st_model, bucket, s3_env, tmp_path):
    rng = random.Random(3)
    data = "".join(json.dumps({"id": f"d{i}", "text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 25)))})
                   + "\n" for i in range(ROWS)).encode()
    (tmp_path / "corpus.jsonl").write_bytes(data)
    url = bucket.put("in/corpus.jsonl", data)
    ref = tmp_path / "ref.parquet"
    done = subprocess.run(_argv(str(tmp_path / "corpus.jsonl"), st_model, ref), env=_env({}), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr

    out = tmp_path / "out.parquet"
    proc = subprocess.Popen(_argv(url, st_model, out), env=_env(s3_env), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while _committed(out) <= 0 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, f"the run ended before a kill ({proc.returncode}): {proc.stderr and proc.stderr.read()}"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert 0 < _committed(out) < ROWS and not out.exists()

    stats = tmp_path / "stats.json"
    done = subprocess.run(_argv(url, st_model, out, "--stats", str(stats)), env=_env(s3_env), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(stats.read_text())
    assert report["resumed_rows"] > 0 and report["resumed_rows"] + report["computed_rows"] == ROWS
    want, got = pq.read_table(ref), pq.read_table(out)
    assert got.column("id").equals(want.column("id")) and got.column("embedding").equals(want.column("embedding"))
