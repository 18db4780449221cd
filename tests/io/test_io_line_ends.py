"""A carriage return (CR) that does not end a line: Python's universal newlines (`for line in open(...)`,
`str.splitlines`) take it as a line break, the readers' line machinery (read points, blocks, slice cuts) does
not, so such a text line is a bad row naming it, never one long text; run-batch's JSON lines keep it.
And a CSV/TSV header split by another delimiter is named as such."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

TEXTS = ["the cat sat", "a dog", "three blind mice"]


def _st(model: Path, texts: list[str]) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(model), device="cpu").encode(texts)


@pytest.mark.parametrize(("content", "line"), [
    (b"\r".join(t.encode() for t in TEXTS) + b"\r", 1),  # old Mac: the whole file is one LF-less line
    (b"the cat sat\na dog\rthree blind mice\n", 2),  # a stray CR in the middle of a line
])
def test_a_cr_inside_a_text_line_stops_the_run_naming_it(cli, st_model: Path, tmp_path: Path, content: bytes,
                                                         line: int) -> None:
    src = tmp_path / "corpus.txt"
    src.write_bytes(content)
    out = tmp_path / "v.parquet"
    result = cli("embed", src, "-m", st_model, "-o", out, "-q", code=1)
    assert f"corpus.txt line {line} (id 'corpus.txt:{line}'): holds a carriage return (CR)" in result.stderr
    assert "tr '\\r' '\\n'" in result.stderr
    assert not out.exists()


def test_a_cr_line_skipped_and_the_lf_and_crlf_lines_embedded(cli, st_model: Path, tmp_path: Path) -> None:
    src = tmp_path / "corpus.txt"
    src.write_bytes(b"the cat sat\r\nbad\rline\na dog\nthree blind mice")
    out, errors = tmp_path / "v.parquet", tmp_path / "bad.jsonl"
    cli("embed", src, "-m", st_model, "-o", out, "-q", "--on-error", "skip", "--errors-file", errors, code=3)
    table = pq.read_table(out)
    assert table.column("id").to_pylist() == ["corpus.txt:1", "corpus.txt:3", "corpus.txt:4"]
    got = np.asarray(table.column("embedding").to_pylist(), dtype=np.float32)
    np.testing.assert_allclose(got, _st(st_model, TEXTS), atol=1e-5)
    (bad,) = [json.loads(x) for x in errors.read_text().splitlines()]
    assert bad["location"] == "line 2" and "carriage return" in bad["reason"]


@pytest.mark.parametrize(("name", "content"), [
    ("c.csv", b"id,text\r0,a\r1,b\r"),
    ("c.tsv", b"id\ttext\r0\ta\r1\tb\r"),
])
def test_cr_line_breaks_in_csv_are_named_not_an_open_quote(cli, st_model: Path, tmp_path: Path, name: str,
                                                           content: bytes) -> None:
    src = tmp_path / name
    src.write_bytes(content)
    result = cli("embed", src, "-m", st_model, "-o", tmp_path / "v.parquet", "-q", code=1)
    assert f"{name} line 1: a carriage return (CR) inside an unquoted field" in result.stderr
    assert "close the quote" not in result.stderr


def test_a_quoted_csv_field_keeps_its_cr(cli, st_model: Path, tmp_path: Path) -> None:
    src = tmp_path / "c.csv"
    src.write_bytes(b'id,text\n0,"a\rb"\n1,c\n')
    out = tmp_path / "v.parquet"
    cli("embed", src, "-m", st_model, "-o", out, "-q")
    got = np.asarray(pq.read_table(out).column("embedding").to_pylist(), dtype=np.float32)
    np.testing.assert_allclose(got, _st(st_model, ["a\rb", "c"]), atol=1e-5)


def test_run_batch_takes_a_cr_in_a_request_line_as_json_whitespace(cli, st_model: Path, tmp_path: Path) -> None:
    """vLLM's run-batch splits the file on LF and parses each line as JSON, where a CR is whitespace."""
    line = '{"custom_id": "a", "method": "POST",\r"url": "/v1/embeddings", "body": {"input": "the cat sat"}}'
    src = tmp_path / "requests.jsonl"
    src.write_bytes(line.encode() + b"\n")
    out = tmp_path / "results.jsonl"
    cli("run-batch", src, "-m", st_model, "-o", out, "-q")
    (got,) = [json.loads(x) for x in out.read_text().splitlines()]
    assert got["response"]["status_code"] == 200
    vec = np.asarray(got["response"]["body"]["data"][0]["embedding"], dtype=np.float32)
    np.testing.assert_allclose(vec, _st(st_model, ["the cat sat"])[0], atol=1e-5)


def test_cr_line_breaks_in_jsonl_are_named_in_the_fix(cli, st_model: Path, tmp_path: Path) -> None:
    """Records on one CR-broken line read as malformed JSON ("Extra data"), whose fix said nothing of the CR."""
    src = tmp_path / "c.jsonl"
    src.write_bytes(b"\r".join(json.dumps({"id": i, "text": t}).encode() for i, t in enumerate(TEXTS)) + b"\r")
    result = cli("embed", src, "-m", st_model, "-o", tmp_path / "v.parquet", "-q", code=1)
    assert "c.jsonl line 1 (id '0'): malformed JSON" in result.stderr
    assert "holds a carriage return (CR): end lines with LF or CRLF" in result.stderr


@pytest.mark.parametrize(("name", "content", "said", "fix"), [
    ("c.csv", b"id;text\n0;hello, world\n", "separated by semicolons, but CSV fields by commas", "convert it"),
    ("c.csv", b"id\ttext\n0\thello\n", "separated by tabs, but CSV fields by commas", "pass --format tsv"),
    ("c.tsv", b"id,text\n0,hello\n", "separated by commas, but TSV fields by tabs", "pass --format csv"),
])
def test_a_header_of_another_delimiter_is_named(cli, st_model: Path, tmp_path: Path, name: str, content: bytes,
                                                said: str, fix: str) -> None:
    """It said "no text column 'text'; the columns are: 'id;text'", leaving the user to spot the delimiter."""
    src = tmp_path / name
    src.write_bytes(content)
    result = cli("embed", src, "-m", st_model, "-o", tmp_path / "v.parquet", "-q", code=1)
    assert f"{name} line 1: the header" in result.stderr and said in result.stderr and fix in result.stderr
