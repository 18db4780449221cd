"""Issue 22, items 8-9: run-batch answers a bad line with its own 400 whatever is in it (token ids past the
vocabulary or int64, JSON nested 100,000 deep, a lone surrogate) and a resumed run keeps one `created`."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def req(custom_id: str, body: dict[str, Any], url: str = "/v1/embeddings") -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]


def test_each_hostile_line_is_its_own_400_and_the_rest_are_answered(cli, st_model, tmp_path):  # type: ignore[no-untyped-def]
    deep = '{"custom_id": "deep", "method": "POST", "url": "/v1/embeddings", "body": {"input": ' \
        + "[" * 100_000 + "]" * 100_000 + "}}"
    lines = [
        req("ok-1", {"input": "hello there"}),
        req("vocab", {"input": [5, 10**6]}),
        req("int64", {"input": [[5], [2**70]]}),
        deep,
        '{"custom_id": "lone", "method": "POST", "url": "/v1/embeddings", "body": {"input": "a \\ud83d b"}}',
        req("pool-vocab", {"input": [7, 99999], "task": "token_embed"}, "/pooling"),
        req("ok-2", {"input": [5, 6, 7]}),
    ]
    src = tmp_path / "requests.jsonl"
    src.write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    out = tmp_path / "results.jsonl"
    for code in (3, 0):  # and the rerun finds it complete (exit 0, README), no traceback either time
        result = cli("run-batch", src, "-m", st_model, "-o", out, "-q", code=code)
        assert "Traceback" not in result.stderr
    got = {line["custom_id"]: line for line in _lines(out)}
    assert len(_lines(out)) == len(lines)
    assert got["ok-1"]["response"]["status_code"] == 200 and got["ok-2"]["response"]["status_code"] == 200
    for cid, what in [("vocab", "token id 1000000 is out of range"), ("int64", "token id 1180591620717411303424"),
                      ("pool-vocab", "token id 99999 is out of range"), (None, "nested too deeply"),
                      (None, "lone UTF-16 surrogate")]:
        line = next(x for x in _lines(out) if x["custom_id"] == cid and what in (x["error"] or {}).get("message", ""))
        assert line["response"]["status_code"] == 400


def test_a_resumed_run_keeps_one_created_after_the_file_is_rewritten_with_the_same_bytes(cli, st_model, tmp_path):  # type: ignore[no-untyped-def]
    lines = [req(f"r{i}", {"input": f"text number {i}"}) for i in range(6)] + ["not json", req("r6", {"input": "x"})]
    src = tmp_path / "requests.jsonl"
    src.write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    os.utime(src, (1_700_000_000, 1_700_000_000))
    out = tmp_path / "results.jsonl"
    cli("run-batch", src, "-m", st_model, "-o", out, "--shard-rows", 2, "--on-error", "fail", "-q", code=1)
    assert Path(f"{out}.embedcli-staging/_embedcli/manifest.json").is_file()  # lines 1-6 committed, staged
    src.write_bytes(src.read_bytes())  # the same bytes, written again: a new modification time
    os.utime(src, (1_800_000_000, 1_800_000_000))
    cli("run-batch", src, "-m", st_model, "-o", out, "--shard-rows", 2, "-q", code=3)
    created = {line["response"]["body"]["created"] for line in _lines(out) if line["response"]["status_code"] == 200}
    assert created == {1_700_000_000}


def test_run_batch_refuses_its_request_file_as_output_before_loading(cli, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    src = tmp_path / "requests.jsonl"
    src.write_text(req("a", {"input": "x"}) + "\n")
    before = src.read_bytes()
    # no model at all: the refusal comes first
    result = cli("run-batch", src, "-m", tmp_path / "no-model", "-o", src, "-q", code=2)
    assert "destroy the input" in result.stderr and src.read_bytes() == before


def test_a_carriage_return_inside_a_line_is_no_line_break_for_the_duplicate_pre_pass(cli, st_model, tmp_path):  # type: ignore[no-untyped-def]
    """A lone CR (JSON whitespace) does not end a request line for the reader; the custom_id pre-pass counted
    lines with Python's universal newlines, so every later id was 'first on' another line: a false duplicate."""
    lines = [req("a", {"input": "one"}).replace(', "url"', ',\r"url"'), req("b", {"input": "two"}),
             req("c", {"input": "three"}), req("b", {"input": "again"})]
    src = tmp_path / "requests.jsonl"
    src.write_bytes("".join(x + "\n" for x in lines).encode("utf-8"))
    out = tmp_path / "results.jsonl"
    cli("run-batch", src, "-m", st_model, "-o", out, "-q", code=3)
    got = _lines(out)
    assert [x["custom_id"] for x in got] == ["a", "b", "c", "b"]
    assert [x["response"]["status_code"] for x in got] == [200, 200, 200, 400]
    assert "first on line 2" in got[3]["error"]["message"]


def test_a_leading_bom_does_not_hide_line_one_from_the_duplicate_pre_pass(cli, st_model, tmp_path):  # type: ignore[no-untyped-def]
    """The reader drops a leading UTF-8 BOM; the pre-pass did not, so line 1's custom_id went unclaimed and a
    later line with the same id was taken as its first: line 1 got the duplicate 400, the later line the 200."""
    lines = [req("a", {"input": "one"}), req("b", {"input": "two"}), req("a", {"input": "again"})]
    src = tmp_path / "requests.jsonl"
    src.write_bytes(b"\xef\xbb\xbf" + "".join(x + "\n" for x in lines).encode("utf-8"))
    out = tmp_path / "results.jsonl"
    cli("run-batch", src, "-m", st_model, "-o", out, "-q", code=3)
    assert [x["response"]["status_code"] for x in _lines(out)] == [200, 200, 400]
    assert "first on line 1" in _lines(out)[2]["error"]["message"]
