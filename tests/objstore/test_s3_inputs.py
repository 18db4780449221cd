"""Inputs in S3 (moto's server on 127.0.0.1, reached through AWS_ENDPOINT_URL): the same rows, ids and vectors as
the local run of the same bytes, for every input format; fingerprints that see a rewritten object; bad rows and
first-record checks that name the URL."""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ROWS = [{"id": f"d{i}", "text": f"document {i} is about {('rates', 'films', 'football')[i % 3]}", "topic": f"t{i % 3}"}
        for i in range(23)]


def jsonl(rows: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def _parquet(rows: list[dict[str, Any]]) -> bytes:
    sink = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), sink, row_group_size=5)  # several row groups
    return sink.getvalue()


def _csv(rows: list[dict[str, Any]], delimiter: str = ",") -> bytes:
    lines = [delimiter.join(rows[0])] + [delimiter.join(str(v) for v in r.values()) for r in rows]
    return "".join(line + "\n" for line in lines).encode()


def _zstd(data: bytes) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.CompressedOutputStream(sink, "zstd") as f:
        f.write(data)
    return sink.getvalue().to_pybytes()


# name -> (bytes, --keep-cols)
FORMATS = {
    "corpus.jsonl": (jsonl(ROWS), "topic"),
    "corpus.jsonl.gz": (gzip.compress(jsonl(ROWS)), "topic"),
    "corpus.jsonl.bz2": (bz2.compress(jsonl(ROWS)), "topic"),
    "corpus.jsonl.xz": (lzma.compress(jsonl(ROWS)), "topic"),
    "corpus.jsonl.zst": (_zstd(jsonl(ROWS)), "topic"),
    "corpus.parquet": (_parquet(ROWS), "topic"),
    "corpus.csv": (_csv(ROWS), "topic"),
    "corpus.tsv": (_csv(ROWS, "\t"), "topic"),
    "corpus.txt": ("".join(r["text"] + "\n" for r in ROWS).encode(), ""),
}


def _columns(path: Path) -> dict[str, list[Any]]:
    table = pq.read_table(path)
    return {name: table.column(name).to_pylist() for name in table.column_names}


def _stats(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


@pytest.mark.parametrize("name", list(FORMATS))
def test_an_object_input_gives_the_local_runs_ids_and_vectors(cli, st_model, bucket, s3_env, tmp_path, name):
    data, keep = FORMATS[name]
    local = tmp_path / name
    local.write_bytes(data)
    url = bucket.put(f"in/{name}", data)
    keep_args = ["--keep-cols", keep] if keep else []
    cli("embed", local, "-m", st_model, *keep_args, "-o", tmp_path / "local.parquet", "-q")
    cli("embed", url, "-m", st_model, *keep_args, "-o", tmp_path / "s3.parquet", "-q", env=s3_env)
    expected, got = _columns(tmp_path / "local.parquet"), _columns(tmp_path / "s3.parquet")
    assert got == expected
    assert len(got["id"]) == len(ROWS)


GLOB_KEYS = ["in/b.jsonl", "in/a.jsonl", "in/sub/c.jsonl", "in/sub/deep/d.jsonl", "in/.hidden.jsonl",
             "in/.dot/e.jsonl", "in/x.txt", "in/a1.jsonl", "other/f.jsonl"]
PATTERNS = ["in/*.jsonl", "in/**/*.jsonl", "in/**", "in/[ab].jsonl", "in/?.jsonl", "in/*/*.jsonl", "in/[!a]*.jsonl",
            "**/*.jsonl", "in/.*.jsonl", "in/sub/**/*.jsonl"]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_an_object_glob_matches_what_the_same_local_glob_matches_in_the_same_order(
    bucket, s3_env, tmp_path, monkeypatch, pattern
):
    from embedcli.io.readers import expand_paths

    for key in GLOB_KEYS:
        bucket.put(key, b'{"text": "x"}\n')
        (tmp_path / key).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / key).write_bytes(b'{"text": "x"}\n')
    for k, v in s3_env.items():
        monkeypatch.setenv(k, v)
    local = [str(Path(p).relative_to(tmp_path)) for p in expand_paths([f"{tmp_path}/{pattern}"])]
    objects = [u.removeprefix(f"s3://{bucket.name}/") for u in expand_paths([bucket.url(pattern)])]
    assert local  # every pattern matches something
    assert objects == local


def test_a_glob_of_objects_embeds_as_the_local_glob_default_ids_included(cli, st_model, bucket, s3_env, tmp_path):
    rows = [{"text": r["text"]} for r in ROWS]  # no id column: ids are file:line, from the object's name
    parts = {"in/a.jsonl": rows[:7], "in/b.jsonl": rows[7:15], "in/sub/c.jsonl": rows[15:]}
    for key, part in parts.items():
        bucket.put(key, jsonl(part))
        (tmp_path / key).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / key).write_bytes(jsonl(part))
    cli("embed", f"{tmp_path}/in/**/*.jsonl", "-m", st_model, "-o", tmp_path / "local.parquet", "-q")
    cli("embed", bucket.url("in/**/*.jsonl"), "-m", st_model, "-o", tmp_path / "s3.parquet", "-q", env=s3_env)
    got = _columns(tmp_path / "s3.parquet")
    assert got == _columns(tmp_path / "local.parquet")
    assert got["id"][:2] == ["a.jsonl:1", "a.jsonl:2"] and got["id"][-1] == "c.jsonl:8"


def test_a_rewritten_object_is_another_input_and_incremental_recomputes_only_its_changed_rows(
    cli, st_model, bucket, s3_env, tmp_path
):
    rows = [dict(r) for r in ROWS]
    url = bucket.put("in/corpus.jsonl", jsonl(rows))
    out, stats = tmp_path / "v.parquet", tmp_path / "stats.json"
    run = ("embed", url, "-m", st_model, "-o", out, "--stats", stats, "-q")
    cli(*run, env=s3_env)
    assert _stats(stats)["computed_rows"] == len(rows)
    cli(*run, env=s3_env)
    assert _stats(stats)["computed_rows"] == 0  # the same object: nothing to do
    rows[5]["text"] = rows[5]["text"].upper()  # the same size: only the ETag tells the bytes changed
    bucket.put("in/corpus.jsonl", jsonl(rows))
    cli(*run, env=s3_env)
    assert _stats(stats)["computed_rows"] == len(rows)  # without --incremental: every row again
    rows[7]["text"] = rows[7]["text"].upper()
    bucket.put("in/corpus.jsonl", jsonl(rows))
    cli(*run, "--incremental", env=s3_env)
    assert (_stats(stats)["computed_rows"], _stats(stats)["carried_rows"]) == (1, len(rows) - 1)
    fresh = tmp_path / "fresh.jsonl"
    fresh.write_bytes(jsonl(rows))
    cli("embed", fresh, "-m", st_model, "-o", tmp_path / "fresh.parquet", "-q")
    got, want = _columns(out), _columns(tmp_path / "fresh.parquet")
    assert got["id"] == want["id"]
    # the changed row was packed alone: equal to a fresh run's up to the last bits
    np.testing.assert_allclose(np.asarray(got["embedding"]), np.asarray(want["embedding"]), atol=1e-6)
    inputs = json.loads(pq.read_schema(out).metadata[b"embedcli.inputs"])
    assert inputs[0]["path"] == url and inputs[0]["size"] == len(jsonl(rows)) and inputs[0]["etag"]


BAD = b'{"id": "a", "text": "fine"}\n{"id": "b", "text": "broken"\n{"id": "c", "text": "fine too"}\n'


def test_a_bad_row_of_an_object_is_named_by_its_url_and_line(cli, st_model, bucket, s3_env, tmp_path):
    url = bucket.put("in/bad.jsonl", BAD)
    failed = cli("embed", url, "-m", st_model, "-o", tmp_path / "v.parquet", code=1, env=s3_env)
    assert f"{url} line 2 (id 'b')" in failed.stderr
    errors = tmp_path / "errors.jsonl"
    cli("embed", url, "-m", st_model, "-o", tmp_path / "v.parquet", "--on-error", "skip", "--errors-file", errors,
        "-q", code=3, env=s3_env)
    (entry,) = [json.loads(line) for line in errors.read_text().splitlines()]
    assert (entry["file"], entry["location"], entry["id"]) == (url, "line 2", "b")
    assert _columns(tmp_path / "v.parquet")["id"] == ["a", "c"]


def test_the_first_record_of_an_object_is_checked_before_the_model_is_looked_for(cli, bucket, s3_env, tmp_path):
    url = bucket.put("in/corpus.jsonl", jsonl(ROWS))
    result = cli("embed", url, "--text-col", "body", "-m", str(tmp_path / "no-such-model"), "-o",
                 tmp_path / "v.parquet", code=1, env=s3_env)
    assert url in result.stderr and "'body'" in result.stderr and "no-such-model" not in result.stderr


@pytest.mark.parametrize("key, reason", [
    ("in/missing.jsonl", "no such object"), ("in", "is a folder"),
    ("in/*.csv", "no such object: the pattern matched no objects"),
    ("../bucket-*/in/*.jsonl", "a pattern matches objects, not buckets"),
])
def test_a_missing_object_a_prefix_or_an_empty_glob_is_an_input_error_naming_the_url(
    cli, st_model, bucket, s3_env, tmp_path, key, reason
):
    bucket.put("in/corpus.jsonl", jsonl(ROWS))
    url = bucket.url(key) if not key.startswith("../") else f"s3://{key[3:]}"
    result = cli("embed", url, "-m", st_model, "-o", tmp_path / "v.parquet", code=1, env=s3_env)
    assert f"{url}: {reason}" in result.stderr
    assert not (tmp_path / "v.parquet").exists()
