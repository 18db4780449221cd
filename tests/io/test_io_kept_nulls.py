"""Issue 22, item 12: a JSONL `--keep-cols` field null in the first batch and an object later is kept (as the
JSON text of the value: the null batch already made it a text column), never a pyarrow traceback."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest


@pytest.mark.parametrize("out_name", ["v.parquet", "v.jsonl", "-"])
def test_a_kept_field_null_first_then_an_object_is_kept_as_text(cli, st_model, tmp_path, out_name):  # type: ignore[no-untyped-def]
    values = [None, None, None, {"a": 3, "b": [1, "x"]}, [1, 2], 7, "plain"]
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"id": i, "text": f"text {i}", "meta": v}) + "\n" for i, v in enumerate(values)))
    out = tmp_path / out_name if out_name != "-" else "-"
    result = cli("embed", docs, "-m", st_model, "--keep-cols", "meta", "-o", out, "--shard-rows", 2, "-q")
    if out_name == "-":
        got = [json.loads(line)["meta"] for line in result.stdout.splitlines()]
    elif out_name.endswith(".jsonl"):
        got = [json.loads(line)["meta"] for line in (tmp_path / out_name).read_text().splitlines()]
    else:
        got = pq.read_table(tmp_path / out_name).column("meta").to_pylist()
    assert got == [None, None, None, '{"a": 3, "b": [1, "x"]}', "[1, 2]", "7", "plain"]
