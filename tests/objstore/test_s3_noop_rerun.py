"""A rerun that finds its store output complete (the nightly no-op of a cron job) reads the Parquet object's footer
alone: it fetches neither the object whole nor its sidecars, as the real S3 server's request log shows; a rerun
with work to do still fetches them (`--incremental` in place carries rows over from them)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

DOCS = ["Labour won the general election.", "Shares rose after the bank talks.", "The striker scored twice.",
        "A new phone with a folding screen.", "Rain is expected over the weekend.", "The bank raised its rate."]


def _requests(log: Path, start: int) -> list[str]:
    """The request lines (`GET /bucket/key`) the server logged past byte `start` of its log, once it stops growing
    (the server logs a request after answering it)."""
    size, deadline = -1, time.monotonic() + 5
    while log.stat().st_size != size and time.monotonic() < deadline:
        size = log.stat().st_size
        time.sleep(0.4)
    text = log.read_bytes()[start:].decode("utf-8", "replace")
    # werkzeug colours some lines (404, 206) with ANSI escapes after the opening quote
    return re.findall(r'"(?:\x1b\[[0-9;]*m)*((?:GET|HEAD|PUT|POST|DELETE) [^ "]+)', text)


def _sidecar_requests(lines: list[str], key: str) -> list[str]:
    """Reads of the output's sidecars (its row index, `.meta.json`, `.ids.jsonl`)."""
    names = tuple(key + s for s in (".embedcli-index.parquet", ".meta.json", ".ids.jsonl"))
    return [r for r in lines if r.startswith(("GET", "HEAD")) and r.split("?")[0].endswith(names)]


def test_a_complete_search_output_in_the_store_is_not_fetched_again(cli, st_model, bucket, s3_env, s3_server,
                                                                    tmp_path):
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(DOCS)))
    vectors = tmp_path / "v.parquet"
    cli("embed", docs, "-m", st_model, "-o", vectors, "-q")
    v_url = bucket.put("vectors/v.parquet", vectors.read_bytes())
    q_url = bucket.put("in/q.jsonl", json.dumps({"id": "q1", "text": "who won the election"}) + "\n")
    key = "out/hits.parquet"
    argv = ["search", v_url, "--queries", q_url, "--top-k", 2, "-m", st_model, "-o", bucket.url(key)]
    cli(*argv, "-q", env=s3_env)
    start = s3_server.log.stat().st_size
    assert "already complete" in cli(*argv, env=s3_env).stderr
    seen = _requests(s3_server.log, start)
    assert any(key in r for r in seen), seen
    assert _sidecar_requests(seen, key) == [], seen  # (none exists: a fetch asks for each and is told 404)


def test_a_complete_store_output_is_not_fetched_by_a_no_op_rerun(cli, st_model, bucket, s3_env, s3_server, tmp_path):
    docs = bucket.put("in/docs.jsonl", "".join(json.dumps({"id": f"d{i}", "text": t}) + "\n"
                                               for i, t in enumerate(DOCS)))
    key = "out/v.parquet"
    argv = ["embed", docs, "-m", st_model, "-o", bucket.url(key), "--shard-rows", 2]
    cli(*argv, "-q", env=s3_env)
    made = bucket.client.get_object(Bucket=bucket.name, Key=key)["Body"].read()
    start = s3_server.log.stat().st_size
    again = cli(*argv, env=s3_env)
    assert "already complete" in again.stderr
    seen = _requests(s3_server.log, start)
    assert any(key in r for r in seen), seen  # the log does show this run's requests
    assert _sidecar_requests(seen, key) == [], seen  # the index sidecar, .meta.json, ...: not fetched
    assert bucket.client.get_object(Bucket=bucket.name, Key=key)["Body"].read() == made

    # another input: the output is fetched, as a run with work to do needs it
    bucket.put("in/docs.jsonl", "".join(json.dumps({"id": f"d{i}", "text": t + " (new)" if i % 2 else t}) + "\n"
                                        for i, t in enumerate(DOCS)))
    start = s3_server.log.stat().st_size
    cli(*argv, "--incremental", "--stats", tmp_path / "stats.json", "-q", env=s3_env)
    assert _sidecar_requests(_requests(s3_server.log, start), key), "a rerun with work to do fetches the sidecars"
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert (stats["computed_rows"], stats["carried_rows"]) == (3, 3)  # carried over from the fetched output
