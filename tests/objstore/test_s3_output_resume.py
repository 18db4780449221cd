"""A run writing to S3 (moto on 127.0.0.1), killed with SIGKILL once the store holds a committed manifest, resumes
from the store on rerun: no committed row is computed again, and the output object equals an uninterrupted run's,
byte for byte. The killed run's lease names a process gone from this machine, so the rerun takes it over at once."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.objstore.test_s3_resume import WORDS, _env

ROWS = 800
SHARD_ROWS = 40


def _argv(source: str, model: Path, out: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "embedcli", "embed", source, "-m", str(model), "-o", out, "--shard-rows",
            str(SHARD_ROWS), "-q", *extra]


def _committed(bucket, key: str) -> int:  # type: ignore[no-untyped-def]
    try:
        body = bucket.client.get_object(Bucket=bucket.name, Key=f"{key}.embedcli-staging/_embedcli/manifest.json")
        return int(json.loads(body["Body"].read())["records_done"])
    except Exception:  # not there yet
        return -1


def test_a_killed_run_into_s3_resumes_from_the_store_to_the_uninterrupted_output(cli, st_model, bucket, s3_env,
                                                                                   tmp_path):
    rng = random.Random(5)
    data = "".join(json.dumps({"id": f"d{i}", "text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 25)))})
                   + "\n" for i in range(ROWS)).encode()
    url = bucket.put("in/corpus.jsonl", data)
    ref = tmp_path / "ref.parquet"
    cli(*_argv(url, st_model, str(ref))[3:], env=s3_env)  # in-process: only the killed run needs its own process

    out = bucket.url("out/v.parquet")
    proc = subprocess.Popen(_argv(url, st_model, out), env=_env(s3_env), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while _committed(bucket, "out/v.parquet") <= 0 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, f"the run ended before a kill ({proc.returncode}): {proc.stderr and proc.stderr.read()}"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    committed = _committed(bucket, "out/v.parquet")
    assert 0 < committed < ROWS
    bucket.put("out/v.parquet.embedcli-staging/part-999999.parquet", b"garbage of a killed run")

    stats = tmp_path / "stats.json"
    assert any(Path(tempfile.gettempdir()).glob(f"embedcli-out-{proc.pid}-*")), "the killed run's spool"
    cli(*_argv(url, st_model, out, "--stats", str(stats))[3:], env=s3_env)
    assert not any(Path(tempfile.gettempdir()).glob(f"embedcli-out-{proc.pid}-*")), "swept by the rerun"
    report = json.loads(stats.read_text())
    assert report["resumed_rows"] >= committed and report["resumed_rows"] + report["computed_rows"] == ROWS
    got = bucket.client.get_object(Bucket=bucket.name, Key="out/v.parquet")["Body"].read()
    assert got == ref.read_bytes()
    keys = [o["Key"] for o in bucket.client.list_objects_v2(Bucket=bucket.name, Prefix="out/")["Contents"]]
    assert sorted(k for k in keys if not k.endswith("/")) == ["out/v.parquet", "out/v.parquet.embedcli-index.parquet"]
