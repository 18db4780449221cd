"""More object-store places (moto on 127.0.0.1): `--previous s3://...` for `--incremental`, `run-batch -o s3://`,
the whole outputs of `search` and `rerank --queries`, and `embed --precision int8` without `--calibration`. Each
equals the same command's local output byte for byte and leaves nothing else in the bucket."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.objstore.test_s3_outputs import _corpus, _get, _jsonl, _keys


def test_previous_from_s3_carries_rows_over_as_the_local_previous_does(cli, st_model, bucket, s3_env, tmp_path):
    old = tmp_path / "old.parquet"
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_bytes(_corpus(8))
    cli("embed", corpus, "-m", st_model, "-o", old, "-q")
    bucket.put("prev/old.parquet", old.read_bytes())
    bucket.put("prev/old.parquet.embedcli-index.parquet", Path(f"{old}.embedcli-index.parquet").read_bytes())
    corpus.write_bytes(_corpus(8)[: -1] + b"\n" + _jsonl([{"id": "new", "text": "a new row"}]))
    outs = {}
    for name, previous in (("local", str(old)), ("s3", bucket.url("prev/old.parquet"))):
        out, stats = tmp_path / f"{name}.parquet", tmp_path / f"{name}.json"
        cli("embed", corpus, "-m", st_model, "-o", out, "--incremental", "--previous", previous, "--stats", stats, "-q",
            env=s3_env)
        report = json.loads(stats.read_text())
        assert (report["computed_rows"], report["carried_rows"]) == (1, 8)
        outs[name] = out.read_bytes()
    assert outs["s3"] == outs["local"]
    assert _keys(bucket) == ["prev/old.parquet", "prev/old.parquet.embedcli-index.parquet"]


def test_previous_that_names_no_object_is_an_input_error(cli, st_model, bucket, s3_env, tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_bytes(_corpus(3))
    missing = bucket.url("prev/none.parquet")
    result = cli("embed", corpus, "-m", st_model, "-o", tmp_path / "v.parquet", "--incremental", "--previous", missing,
                 code=1, env=s3_env)
    assert missing in result.stderr and "no such object" in result.stderr
    assert not (tmp_path / "v.parquet").exists()


def test_run_batch_to_s3_equals_the_local_run(cli, st_model, bucket, s3_env, tmp_path):
    src = tmp_path / "requests.jsonl"
    src.write_text("".join(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/embeddings",
                                       "body": {"input": [f"text {i}", f"more {i}"]}}) + "\n" for i in range(5)))
    local = tmp_path / "responses.jsonl"
    cli("run-batch", src, "-m", st_model, "-o", local, "-q", env=s3_env)
    cli("run-batch", src, "-m", st_model, "-o", bucket.url("out/responses.jsonl"), "-q", env=s3_env)
    assert _get(bucket, "out/responses.jsonl") == local.read_bytes()
    siblings = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("responses."))
    assert _keys(bucket) == [f"out/{name}" for name in siblings]


def _whole_args(kind: str, tmp_path: Path, model: Path, out: object) -> list[object]:
    docs = tmp_path / "docs.jsonl"
    if not docs.exists():
        docs.write_bytes(_corpus(8))
        (tmp_path / "queries.jsonl").write_bytes(_jsonl([{"id": "q1", "text": "who won the election"},
                                                          {"id": "q2", "text": "stock market news"}]))
    queries = tmp_path / "queries.jsonl"
    if kind.startswith("search"):
        vectors = tmp_path / "vectors.parquet"
        if not vectors.exists():
            return ["embed", docs, "-m", model, "-o", vectors, "-q"]
        return ["search", vectors, "--queries", queries, "--top-k", 3, "-m", model, "-o", out, "-q"]
    return ["rerank", docs, "--queries", queries, "--top-n", 3, "-m", model, "-o", out, "-q"]


@pytest.mark.parametrize("kind, ext", [("search", "parquet"), ("search", "jsonl"), ("rerank", "parquet"),
                                       ("rerank", "jsonl")])
def test_a_whole_output_to_s3_is_put_once_and_equals_the_local_run(cli, st_model, bucket, s3_env, tmp_path, kind,
                                                                   ext):
    if kind == "search":
        cli(*_whole_args(kind, tmp_path, st_model, None))  # the vectors searched
    local, url = tmp_path / f"hits.{ext}", bucket.url(f"out/hits.{ext}")
    cli(*_whole_args(kind, tmp_path, st_model, local), env=s3_env)
    cli(*_whole_args(kind, tmp_path, st_model, url), env=s3_env)
    assert _get(bucket, f"out/hits.{ext}") == local.read_bytes()
    siblings = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("hits."))
    assert _keys(bucket) == [f"out/{name}" for name in siblings]  # no staging prefix, no lease left behind
    again = cli(*[a for a in _whole_args(kind, tmp_path, st_model, url) if a != "-q"], env=s3_env)
    assert f"embedcli: {url} is already complete" in again.stderr


def test_a_whole_output_over_an_object_embedcli_did_not_write_is_refused(cli, st_model, bucket, s3_env, tmp_path):
    url = bucket.put("out/hits.parquet", b"not embedcli's")
    result = cli(*_whole_args("rerank", tmp_path, st_model, url), code=2, env=s3_env)
    assert f"{url} exists and was not written by embedcli" in result.stderr
    assert _get(bucket, "out/hits.parquet") == b"not embedcli's"
    cli(*_whole_args("rerank", tmp_path, st_model, url), "--overwrite", env=s3_env)
    assert _get(bucket, "out/hits.parquet")[:4] == b"PAR1"
    assert _keys(bucket) == ["out/hits.parquet"]


@pytest.mark.parametrize("precision", ["int8", "uint8"])
def test_int8_without_calibration_to_s3_equals_the_local_run(cli, st_model, bucket, s3_env, tmp_path, precision):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_bytes(_corpus(12))
    args = ("embed", corpus, "-m", st_model, "--precision", precision, "--shard-rows", 5)
    local, url = tmp_path / "v.parquet", bucket.url("out/v.parquet")
    cli(*args, "-o", local, "-q", env=s3_env)
    cli(*args, "-o", url, "-q", env=s3_env)
    assert _get(bucket, "out/v.parquet") == local.read_bytes()
    siblings = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("v."))
    assert _keys(bucket) == [f"out/{name}" for name in siblings]  # the float32 spool object is gone with its index
    again = cli(*args, "-o", url, env=s3_env)
    assert f"embedcli: {url} is already complete" in again.stderr


def test_a_whole_output_interrupted_while_written_leaves_no_object(cli, st_model, bucket, s3_env, tmp_path,
                                                                  monkeypatch):
    from embedcli.run.whole import WholeOutput

    def interrupted(writer, tables, schema):  # type: ignore[no-untyped-def]
        for table in tables:
            writer.write(table.cast(schema))
        writer.abort()
        raise KeyboardInterrupt  # as Ctrl-C between the last row and the commit

    monkeypatch.setattr(WholeOutput, "write", staticmethod(interrupted))
    url = bucket.url("out/hits.parquet")
    cli(*_whole_args("rerank", tmp_path, st_model, url), code=130, env=s3_env)
    assert _keys(bucket) == []  # no output object, no lease
