"""One test per bad input of issue 5: the exit code of the contract and the key words of the message
(file, line or row, id, what was wrong, the fix); `--on-error skip` records bad rows and exits 3."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from resume_helpers import write_jsonl

GOOD = [{"id": "a", "text": "hello world"}, {"id": "b", "text": "the quick brown fox"}, {"id": "c", "text": "market"}]


def _embed(cli, model: Path, inp: object, out: Path, *extra: object, code: int):  # type: ignore[no-untyped-def]
    return cli("embed", inp, "-m", model, "-o", out, "-q", *extra, code=code)


def test_malformed_json_line(cli, st_model: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "text": "hello"}\n{"id": "b", "text": "unterminated\n{"id": "c", "text": "ok"}\n')
    r = _embed(cli, st_model, bad, tmp_path / "o.parquet", code=1)
    assert "bad.jsonl line 2" in r.stderr and "(id 'b')" in r.stderr and "malformed JSON" in r.stderr
    assert "one complete JSON object" in r.stderr
    assert not (tmp_path / "o.parquet").exists()
    errors = tmp_path / "errors.jsonl"
    r = _embed(cli, st_model, bad, tmp_path / "o.parquet", "--on-error", "skip", "--errors-file", errors, code=3)
    [record] = [json.loads(line) for line in errors.read_text().splitlines()]
    assert record["location"] == "line 2" and record["id"] == "b" and "malformed JSON" in record["reason"]
    assert pq.read_table(tmp_path / "o.parquet").column("id").to_pylist() == ["a", "c"]


def test_missing_text_column_lists_the_columns(cli, st_model: Path, tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "c.jsonl", [{"id": "a", "body": "x", "title": "t"}])
    r = _embed(cli, st_model, src, tmp_path / "o.parquet", code=1)
    assert "'text'" in r.stderr and "'body'" in r.stderr and "'title'" in r.stderr and "--text-col" in r.stderr
    pq.write_table(pa.table({"doc_id": ["a"], "body": ["x"]}), tmp_path / "c.parquet")
    r = _embed(cli, st_model, tmp_path / "c.parquet", tmp_path / "o.parquet", code=1)
    assert "no text column 'text'" in r.stderr and "'doc_id', 'body'" in r.stderr


def test_missing_id_column_lists_the_columns(cli, st_model: Path, tmp_path: Path) -> None:
    pq.write_table(pa.table({"doc_id": ["a"], "text": ["x"]}), tmp_path / "c.parquet")
    r = _embed(cli, st_model, tmp_path / "c.parquet", tmp_path / "o.parquet", "--id-col", "uid", code=1)
    assert "no id column 'uid'" in r.stderr and "'doc_id', 'text'" in r.stderr and "--id-col" in r.stderr


def test_null_text(cli, st_model: Path, tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "c.jsonl", [GOOD[0], {"id": "n", "text": None}, GOOD[1]])
    r = _embed(cli, st_model, src, tmp_path / "o.parquet", code=1)
    assert "c.jsonl line 2 (id 'n'): text is null" in r.stderr and "fix:" in r.stderr
    r = cli("embed", src, "-m", st_model, "-o", tmp_path / "o.parquet", "--on-error", "skip", "--stats",
            tmp_path / "s.json", code=3)
    assert "skipped: " in r.stderr and "1 bad input rows were skipped" in r.stderr and "exit code 3" in r.stderr
    assert pq.read_table(tmp_path / "o.parquet").column("id").to_pylist() == ["a", "b"]
    assert json.loads((tmp_path / "s.json").read_text())["skipped_rows"] == 1


def test_non_utf8_bytes(cli, st_model: Path, tmp_path: Path) -> None:
    src = tmp_path / "latin.jsonl"
    src.write_bytes(b'{"id": "a", "text": "ok"}\n{"id": "b", "text": "caf\xe9"}\n')
    r = _embed(cli, st_model, src, tmp_path / "o.parquet", code=1)
    assert "latin.jsonl line 2" in r.stderr and "not valid UTF-8" in r.stderr and "iconv" in r.stderr


def test_duplicate_ids_name_both_locations(cli, st_model: Path, tmp_path: Path) -> None:
    first = write_jsonl(tmp_path / "one.jsonl", [GOOD[0], GOOD[1]])
    second = write_jsonl(tmp_path / "two.jsonl", [GOOD[2], {"id": "a", "text": "again"}])
    r = _embed(cli, st_model, first, tmp_path / "o.parquet", second, code=1)
    assert "two.jsonl line 2 (id 'a'): duplicate id 'a': first seen at" in r.stderr
    assert "one.jsonl line 1" in r.stderr and "unique id" in r.stderr
    errors = tmp_path / "e.jsonl"
    _embed(cli, st_model, first, tmp_path / "o.parquet", second, "--on-error", "skip", "--errors-file", errors, code=3)
    assert pq.read_table(tmp_path / "o.parquet").column("id").to_pylist() == ["a", "b", "c"]
    assert "duplicate id 'a'" in errors.read_text()


def test_truncated_parquet(cli, st_model: Path, tmp_path: Path) -> None:
    whole = tmp_path / "whole.parquet"
    pq.write_table(pa.table({"id": [str(i) for i in range(100)], "text": ["x y z"] * 100}), whole)
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    r = _embed(cli, st_model, cut, tmp_path / "o.parquet", code=1)
    assert "cut.parquet" in r.stderr and "not a readable Parquet file" in r.stderr and "truncated" in r.stderr


def test_missing_input(cli, st_model: Path, tmp_path: Path) -> None:
    r = _embed(cli, st_model, tmp_path / "nope.jsonl", tmp_path / "o.parquet", code=1)
    assert "nope.jsonl: no such file" in r.stderr and "check the path" in r.stderr
    r = _embed(cli, st_model, str(tmp_path / "*.parquet"), tmp_path / "o.parquet", code=1)
    assert "matched no files" in r.stderr


def test_unwritable_output(cli, st_model: Path, tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "c.jsonl", GOOD)
    r = _embed(cli, st_model, src, tmp_path / "missing" / "o.parquet", code=1)
    assert "does not exist" in r.stderr and "mkdir -p" in r.stderr
    r = _embed(cli, st_model, src, tmp_path, code=1)
    assert "is a directory" in r.stderr
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o555)
        r = _embed(cli, st_model, src, locked / "o.parquet", code=1)
        assert "permission denied" in r.stderr


def test_model_folder_missing_files(cli, st_model: Path, tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "c.jsonl", GOOD)
    broken = tmp_path / "broken"
    shutil.copytree(st_model, broken)
    (broken / "model.safetensors").unlink()
    r = _embed(cli, broken, src, tmp_path / "o.parquet", code=1)
    assert "no weights" in r.stderr and "incomplete" in r.stderr
    (broken / "config.json").unlink()
    r = _embed(cli, broken, src, tmp_path / "o.parquet", code=1)
    assert "config.json: missing" in r.stderr


def test_pickle_only_weights_need_allow_pickle(cli, tmp_path: Path) -> None:
    from tests.fixtures.tiny_models import build_tiny_model

    model = build_tiny_model("bert", tmp_path / "pickled", pickle_weights=True)
    src = write_jsonl(tmp_path / "c.jsonl", GOOD)
    r = _embed(cli, model, src, tmp_path / "o.parquet", code=1)
    assert "only pickle weights" in r.stderr and "--allow-pickle" in r.stderr and "safetensors" in r.stderr
    _embed(cli, model, src, tmp_path / "o.parquet", "--allow-pickle", code=0)
    assert pq.read_table(tmp_path / "o.parquet").num_rows == 3


def test_remote_code_is_refused_without_trust_remote_code(cli, st_model: Path, tmp_path: Path) -> None:
    model = tmp_path / "remote"
    shutil.copytree(st_model, model)
    config = json.loads((model / "config.json").read_text())
    config["auto_map"] = {"AutoModel": "modeling_custom.CustomModel"}
    (model / "config.json").write_text(json.dumps(config))
    src = write_jsonl(tmp_path / "c.jsonl", GOOD)
    r = _embed(cli, model, src, tmp_path / "o.parquet", code=1)
    assert "its own Python code" in r.stderr and "--trust-remote-code" in r.stderr


def test_max_errors_stops_the_run(cli, st_model: Path, tmp_path: Path) -> None:
    rows = [GOOD[0], {"id": "x", "text": None}, {"id": "y", "text": None}, GOOD[1]]
    src = write_jsonl(tmp_path / "c.jsonl", rows)
    r = _embed(cli, st_model, src, tmp_path / "o.parquet", "--on-error", "skip", "--max-errors", 1, code=1)
    assert "more than 1 bad rows (--max-errors 1)" in r.stderr and "line 3" in r.stderr
    _embed(cli, st_model, src, tmp_path / "o.parquet", "--on-error", "skip", "--max-errors", 2, code=3)


@pytest.mark.parametrize(
    ("files", "first"),
    [
        ({"a": ['{"id": "a", "text": "x"}', '{"id": "b", "text": null}', '{"id": "c", "text": "y"}', '{"id": "d",']},
         "a.jsonl line 2 (id 'b'): text is null"),
        ({"a": ['{"id": "a", "text": "x"}', '{"id": "b", "text": "y"}', '{"id": "a", "text": "z"}',
                '{"id": "c", "text": null}']}, "a.jsonl line 3 (id 'a'): duplicate id"),
        ({"a": ['{"id": "a", "text": "x"}', '{"id": "b", "text": null}'], "b": ['{"id": "c", "text": "y"}', "{"]},
         "a.jsonl line 2 (id 'b'): text is null"),
    ],
    ids=["null-then-malformed", "repeat-then-null", "next-file-malformed"],
)
def test_on_error_fail_names_the_first_bad_row(cli, st_model: Path, tmp_path: Path, files: dict, first: str) -> None:
    # a line that does not parse is found as the batch is read, a null text or a repeated id once it is
    # checked: the run stops at whichever comes first in the input
    for name, lines in files.items():
        (tmp_path / f"{name}.jsonl").write_text("".join(line + "\n" for line in lines))
    r = cli("embed", *(tmp_path / f"{n}.jsonl" for n in files), "-m", st_model, "-o", tmp_path / "o.parquet", "-q", code=1)
    assert first in r.stderr


@pytest.mark.parametrize(("limit", "line"), [(0, 2), (1, 4), (2, 6)])
def test_max_errors_names_the_bad_row_that_passes_it(cli, st_model: Path, tmp_path: Path, limit: int, line: int) -> None:
    # three bad rows of one batch, of the reader (malformed) and of the checks (null text, repeated id)
    src = tmp_path / "c.jsonl"
    src.write_text('{"id": "a", "text": "x"}\n{"id": "b", "text": null}\n{"id": "c", "text": "y"}\n'
                   '{"id": "d", "text": \n{"id": "e", "text": "z"}\n{"id": "a", "text": "again"}\n')
    errors = tmp_path / "errors.jsonl"
    r = _embed(cli, st_model, src, tmp_path / "o.parquet", "--on-error", "skip", "--max-errors", limit,
               "--errors-file", errors, code=1)
    assert f"c.jsonl line {line} " in r.stderr and f"more than {limit} bad rows" in r.stderr
    assert json.loads(errors.read_text().splitlines()[-1])["location"] == f"line {line}"


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (("--max-errors", "3"), "--max-errors only applies with --on-error skip"),
        (("--on-error", "ignore"), "--on-error 'ignore': choose fail or skip"),
        (("--previous", "old.parquet"), "--previous only applies with --incremental"),
    ],
)
def test_conflicting_flags_are_usage_errors(cli, st_model: Path, tmp_path: Path, flags: tuple, words: str) -> None:
    src = write_jsonl(tmp_path / "c.jsonl", GOOD)
    r = _embed(cli, st_model, src, tmp_path / "o.parquet", *flags, code=2)
    assert words in r.stderr
