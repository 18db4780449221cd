"""More object-store places (moto on 127.0.0.1): `--previous s3://...` for `--incremental`, `run-batch -o s3://`,
the whole outputs of `search` and `rerank --queries`, and `embed --precision int8` without `--calibration`. Each
equals the same command's local output byte for byte and leaves nothing else in the bucket."""

from __future__ import annotations

import json
from pathlib import Path

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
