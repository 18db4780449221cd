"""Outputs in S3 (moto on 127.0.0.1) and GCS (the emulator): `-o s3://...`, `--stats` and `--errors-file` to objects,
`--incremental` against the output in the store, the lease that keeps two runs apart. Each output equals the same
command's local output, byte for byte, and leaves no staging objects behind."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

DOCS = ["Labour won the general election.", "The film won best album at the awards.",
        "Shares rose after the bank talks.", "Kyrgyz elections use invisible ink.",
        "The striker scored twice in the final.", "A new phone with a folding screen.",
        "Rain is expected over the weekend.", "The bank raised its interest rate."]


def _jsonl(rows: list[dict[str, object]]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def _corpus(n: int = len(DOCS), prefix: str = "d") -> bytes:
    return _jsonl([{"id": f"{prefix}{i}", "text": DOCS[i % len(DOCS)] + f" #{i}"} for i in range(n)])


def _keys(bucket, prefix: str = "") -> list[str]:  # type: ignore[no-untyped-def]
    """The objects under `prefix`, less the empty folder markers (`out/`) pyarrow's S3 client leaves on a delete."""
    listed = bucket.client.list_objects_v2(Bucket=bucket.name, Prefix=prefix)
    return sorted(o["Key"] for o in listed.get("Contents", []) if not o["Key"].endswith("/"))


def _get(bucket, key: str) -> bytes:  # type: ignore[no-untyped-def]
    return bytes(bucket.client.get_object(Bucket=bucket.name, Key=key)["Body"].read())


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_embed_s3_to_s3_equals_the_local_run_byte_for_byte(cli, st_model, bucket, s3_env, tmp_path, fmt):
    data = _corpus(20)
    (tmp_path / "corpus.jsonl").write_bytes(data)
    url = bucket.put("in/corpus.jsonl", data)
    # the same inputs for both: the input's fingerprint is in the metadata, so the local run reads the object too
    local = tmp_path / f"vectors.{fmt}"
    cli("embed", url, "-m", st_model, "-o", local, "--shard-rows", 6, "-q", env=s3_env)
    out = bucket.url(f"out/vectors.{fmt}")
    cli("embed", url, "-m", st_model, "-o", out, "--shard-rows", 6, "-q", env=s3_env)
    assert _get(bucket, f"out/vectors.{fmt}") == local.read_bytes()
    index = Path(f"{local}.embedcli-index.parquet")
    assert _get(bucket, f"out/vectors.{fmt}.embedcli-index.parquet") == index.read_bytes()
    siblings = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("vectors."))
    assert _keys(bucket, "out/") == [f"out/{name}" for name in siblings]  # no staging prefix left behind
    again = cli("embed", url, "-m", st_model, "-o", out, "--shard-rows", 6, env=s3_env)
    assert "is already complete" in again.stderr and out in again.stderr


def test_stats_and_errors_file_to_s3(cli, st_model, bucket, s3_env, tmp_path):
    rows = _corpus(6) + b'{"id": "bad", "text": null}\n'
    url = bucket.put("in/corpus.jsonl", rows)
    stats, errors = bucket.url("run/stats.json"), bucket.url("run/errors.jsonl")
    cli("embed", url, "-m", st_model, "-o", bucket.url("out/v.parquet"), "--on-error", "skip", "--stats", stats,
        "--errors-file", errors, "-q", code=3, env=s3_env)
    report = json.loads(_get(bucket, "run/stats.json"))
    assert report["rows"] == 6 and report["skipped_rows"] == 1
    bad = [json.loads(line) for line in _get(bucket, "run/errors.jsonl").splitlines()]
    assert [b["id"] for b in bad] == ["bad"]


def test_embed_to_gcs_equals_the_local_run(cli, st_model, gcs_env, gcs_put, tmp_path):
    import datetime

    import pyarrow.fs as pafs

    data = _corpus(9)
    url = gcs_put("in/gcorpus.jsonl", data)
    local = tmp_path / "v.parquet"
    cli("embed", url, "-m", st_model, "-o", local, "--shard-rows", 4, "-q", env=gcs_env)
    out = url.replace("in/gcorpus.jsonl", "out/v.parquet")
    cli("embed", url, "-m", st_model, "-o", out, "--shard-rows", 4, "-q", env=gcs_env)
    host = gcs_env["STORAGE_EMULATOR_HOST"].split("://")[1]
    fs = pafs.GcsFileSystem(anonymous=True, scheme="http", endpoint_override=host,
                            retry_time_limit=datetime.timedelta(seconds=5))
    with fs.open_input_stream(out[len("gs://"):]) as f:
        assert f.read() == local.read_bytes()
    listed = fs.get_file_info(pafs.FileSelector(out[len("gs://"):].rsplit("/", 1)[0], recursive=True))
    assert sorted(i.base_name for i in listed if i.type == pafs.FileType.File) == [
        "v.parquet", "v.parquet.embedcli-index.parquet"]


def test_incremental_against_the_output_in_the_store(cli, st_model, bucket, s3_env, tmp_path):
    parts = [_corpus(5, prefix=f"p{k}-") for k in range(3)]
    for k, data in enumerate(parts):
        bucket.put(f"in/part-{k}.jsonl", data)
    glob = bucket.url("in/*.jsonl")
    out = bucket.url("out/v.parquet")
    cli("embed", glob, "-m", st_model, "-o", out, "-q", env=s3_env)
    changed = _jsonl([{"id": f"p1-{i}", "text": f"changed text {i}"} for i in range(5)])
    bucket.put("in/part-1.jsonl", changed)
    stats = tmp_path / "stats.json"
    cli("embed", glob, "-m", st_model, "-o", out, "--incremental", "--stats", stats, "-q", env=s3_env)
    report = json.loads(stats.read_text())
    assert report["computed_rows"] == 5 and report["carried_rows"] == 10
    full = tmp_path / "full.parquet"
    cli("embed", glob, "-m", st_model, "-o", full, "-q", env=s3_env)
    got = pq.read_table(io.BytesIO(_get(bucket, "out/v.parquet")))
    want = pq.read_table(full)
    assert got.column("id").equals(want.column("id"))
    assert got.column("embedding").equals(want.column("embedding"))
    assert _keys(bucket, "out/") == ["out/v.parquet", "out/v.parquet.embedcli-index.parquet"]


def _lease(bucket, key: str, expires: float, host: str = "elsewhere") -> None:  # type: ignore[no-untyped-def]
    lease = {"owner": "someone", "host": host, "boot": "b", "pid": 1, "expires": expires}
    bucket.put(f"{key}.embedcli-staging/_embedcli/lock.json", json.dumps(lease))


def test_a_held_lease_refuses_a_second_run_and_an_expired_one_is_taken_over(cli, st_model, bucket, s3_env):
    url = bucket.put("in/corpus.jsonl", _corpus(4))
    out = bucket.url("out/v.parquet")
    _lease(bucket, "out/v.parquet", time.time() + 3600)
    refused = cli("embed", url, "-m", st_model, "-o", out, "-q", code=1, env=s3_env)
    assert "another embedcli run is writing this output right now" in refused.stderr
    assert "elsewhere" in refused.stderr and _keys(bucket, "out/") == ["out/v.parquet.embedcli-staging/_embedcli/lock.json"]
    _lease(bucket, "out/v.parquet", time.time() - 1)
    cli("embed", url, "-m", st_model, "-o", out, "-q", env=s3_env)
    assert _keys(bucket, "out/") == ["out/v.parquet", "out/v.parquet.embedcli-index.parquet"]


def test_search_over_embeds_s3_output_equals_the_local_search(cli, st_model, bucket, s3_env, tmp_path):
    url = bucket.put("in/corpus.jsonl", _corpus(8))
    queries = _jsonl([{"id": "q1", "text": "who won the election"}, {"id": "q2", "text": "bank rates"}])
    (tmp_path / "q.jsonl").write_bytes(queries)
    q_url = bucket.put("in/q.jsonl", queries)
    local, out = tmp_path / "v.parquet", bucket.url("out/v.parquet")
    cli("embed", url, "-m", st_model, "-o", local, "-q", env=s3_env)
    cli("embed", url, "-m", st_model, "-o", out, "-q", env=s3_env)
    args = ("--top-k", 3, "-m", st_model, "-q", "-o", "-")
    want = cli("search", local, "--queries", tmp_path / "q.jsonl", *args, env=s3_env).stdout
    got = cli("search", out, "--queries", q_url, *args, env=s3_env).stdout
    assert got == want and len(got.splitlines()) == 6


def test_score_to_s3_equals_the_local_run(cli, st_model, bucket, s3_env, tmp_path):
    pairs = _jsonl([{"id": i, "a": DOCS[i], "b": DOCS[-1 - i]} for i in range(len(DOCS))])
    url = bucket.put("in/pairs.jsonl", pairs)
    args = ("score", url, "--left-col", "a", "--right-col", "b", "-m", st_model, "-q")
    local = tmp_path / "s.jsonl"
    cli(*args, "-o", local, env=s3_env)
    cli(*args, "-o", bucket.url("out/s.jsonl"), env=s3_env)
    assert _get(bucket, "out/s.jsonl") == local.read_bytes()


@pytest.mark.parametrize("args, says", [
    (("embed", "{c}", "--precision", "int8", "--incremental", "-o", "{out}"), "--precision int8 takes its ranges"),
])
def test_whole_outputs_to_an_object_are_refused_in_one_line(cli, st_model, bucket, s3_env, tmp_path, args, says):
    corpus = bucket.put("in/c.jsonl", _corpus(3))
    out = bucket.url("out/x.parquet")
    argv = [a.format(v=bucket.url("v.parquet"), c=corpus, out=out) for a in args]
    result = cli(*argv, "-m", st_model, code=2, env=s3_env)
    assert [line for line in result.stderr.splitlines() if line.strip()] == [result.stderr.strip()]
    assert says in result.stderr and _keys(bucket, "out/") == []


def test_a_lease_lost_to_a_racing_run_is_found_at_the_next_commit(bucket, s3_env, monkeypatch):
    from embedcli.errors import OutputError
    from embedcli.io.store_area import Lease

    for k, v in s3_env.items():
        monkeypatch.setenv(k, v)
    url = bucket.url("out/v.parquet.embedcli-staging/_embedcli/lock.json")
    a, b = Lease(url, "s3://x", 600), Lease(url, "s3://x", 600)
    a.acquire()
    with pytest.raises(OutputError, match="another embedcli run is writing this output"):
        b.acquire()
    b._write()  # b raced past its read in the same instant and wrote over a's lease
    with pytest.raises(OutputError, match="took over its lock"):
        a.renew()
    a.release()  # not a's any more: left for b
    assert _keys(bucket, "out/") == ["out/v.parquet.embedcli-staging/_embedcli/lock.json"]
    b.held = True
    b.release()
    assert _keys(bucket, "out/") == []


def _lease_read(bucket, key: str) -> dict[str, object]:  # type: ignore[no-untyped-def]
    return json.loads(_get(bucket, key))  # type: ignore[no-any-return]


def test_a_kept_lease_outlives_its_length_while_the_block_runs(bucket, s3_env, monkeypatch):
    """An assembly or an upload longer than the lease: renewed in a thread, the lease never expires meanwhile,
    and the thread is gone once the block is left."""
    import threading

    from embedcli.io.store_area import Lease

    for k, v in s3_env.items():
        monkeypatch.setenv(k, v)
    key = "out/v.parquet.embedcli-staging/_embedcli/lock.json"
    lease = Lease(bucket.url(key), "s3://x", 1.0)
    lease.acquire()
    with lease.kept(every=0.2):
        time.sleep(1.6)
        assert float(_lease_read(bucket, key)["expires"]) > time.time()  # 1.6 s into a 1 s lease
    assert not [t for t in threading.enumerate() if t.name == "embedcli-lease"]
    time.sleep(1.2)
    assert float(_lease_read(bucket, key)["expires"]) < time.time()  # no renewal once the block is left
    lease.release()
    assert _keys(bucket, "out/") == []


def test_a_kept_lease_taken_over_stops_renewing_and_the_next_renewal_says_so(bucket, s3_env, monkeypatch):
    from embedcli.errors import OutputError
    from embedcli.io.store_area import Lease

    for k, v in s3_env.items():
        monkeypatch.setenv(k, v)
    key = "out/v.parquet.embedcli-staging/_embedcli/lock.json"
    a, b = Lease(bucket.url(key), "s3://x", 600), Lease(bucket.url(key), "s3://x", 600)
    a.acquire()
    with a.kept(every=0.1):
        b._write()  # another run took the lease over (it had expired)
        time.sleep(0.5)
        assert _lease_read(bucket, key)["owner"] == b.owner  # the thread did not write over it
    with pytest.raises(OutputError, match="took over its lock"):
        a.renew()
