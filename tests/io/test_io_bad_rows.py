"""Rows that cannot vanish or crash (issue 13, items 3, 7, 8): a runaway CSV quote, a JSONL file whose ids
start late, lone surrogates and deep nesting are bad rows with their line, skipped by `--on-error skip`."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest


def _skip_run(cli, model: Path, src: Path, tmp_path: Path) -> tuple[list[str], list[dict]]:  # type: ignore[no-untyped-def]
    out, errors = tmp_path / "out.parquet", tmp_path / "errors.jsonl"
    r = cli("embed", src, "-m", model, "-o", out, "-q", "--on-error", "skip", "--errors-file", errors, code=3)
    assert "Traceback" not in r.stderr
    bad = [json.loads(line) for line in errors.read_text(encoding="utf-8").splitlines()]
    return pq.read_table(out).column("id").to_pylist(), bad


# -- item 3: CSV quotes ------------------------------------------------------------------------------


def _csv(tmp_path: Path, n: int, broken: dict[int, str]) -> Path:
    rows = ["id,text"] + [f"r{i},plain text {i}" for i in range(n)]
    for i, line in broken.items():
        rows[i + 1] = line
    path = tmp_path / "corpus.csv"
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "broken",
    [
        {1: 'r1,"an unterminated quote'},  # runs to the end of the file
        {1: 'r1,"an unterminated quote', 600: 'r600,"a stray" quote'},  # closed by a quote far below
    ],
    ids=["to-eof", "closed-later"],
)
def test_csv_runaway_quote_is_one_bad_row_not_a_merge(cli, st_model: Path, tmp_path: Path, broken: dict) -> None:
    ids, bad = _skip_run(cli, st_model, _csv(tmp_path, 1000, broken), tmp_path)
    assert len(ids) == 999 and "r1" not in ids and ids[:2] == ["r0", "r2"]
    assert [(e["location"], "quoted field" in e["reason"]) for e in bad] == [("line 3", True)]


@pytest.mark.parametrize("end", ["\n", ""], ids=["newline", "no-newline"])
def test_csv_quote_left_open_on_the_last_line_is_a_bad_row(cli, st_model: Path, tmp_path: Path, end: str) -> None:
    # csv's own parser takes `r2,"open` at the end of the file as the text `open` (and its line break):
    # pandas and Arrow refuse the file; a one-line field is no more closed than a longer one
    src = tmp_path / "corpus.csv"
    src.write_text(f'id,text\nr0,fine\nr1,"closed, with a comma"\nr2,"open{end}', encoding="utf-8")
    ids, bad = _skip_run(cli, st_model, src, tmp_path)
    assert ids == ["r0", "r1"]
    assert [(e["location"], "runs to the end of the file" in e["reason"]) for e in bad] == [("line 4", True)]


def test_csv_multiline_quoted_fields_still_read(cli, st_model: Path, tmp_path: Path) -> None:
    src = tmp_path / "ok.csv"
    src.write_text('id,text\na,"two\nlines, one comma"\nb,plain\nc,"at the\nend"\n', encoding="utf-8")
    out = tmp_path / "out.parquet"
    cli("embed", src, "-m", st_model, "-o", out, "-q")
    assert pq.read_table(out).column("id").to_pylist() == ["a", "b", "c"]


# -- item 7: JSONL ids decided per file ------------------------------------------------------------


def test_jsonl_ids_decided_from_the_whole_file(cli, st_model: Path, tmp_path: Path) -> None:
    src = tmp_path / "corpus.jsonl"
    lines = [{"text": "no id here"}] + [{"id": f"real{i}", "text": f"text {i}"} for i in range(5)]
    src.write_text("".join(json.dumps(r) + "\n" for r in lines), encoding="utf-8")
    ids, bad = _skip_run(cli, st_model, src, tmp_path)
    assert ids == [f"real{i}" for i in range(5)]
    assert [(e["location"], e["reason"]) for e in bad] == [("line 1", "no id field 'id'")]


# -- item 8: lone surrogates and deep nesting ---------------------------------------------------------


def test_lone_surrogates_and_deep_nesting_are_bad_rows(cli, st_model: Path, tmp_path: Path) -> None:
    src = tmp_path / "corpus.jsonl"
    lines = [
        '{"id": "a", "text": "fine"}',
        '{"id": "b", "text": "half an emoji \\ud83d here"}',
        '{"id": "c\\udc00", "text": "bad id"}',
        '{"id": "d", "text": "a real pair \\ud83d\\ude00 is fine"}',
        '{"id": "e", "text": "deep", "x": ' + "[" * 100_000 + "]" * 100_000 + "}",
        '{"id": "f", "text": "last"}',
    ]
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    ids, bad = _skip_run(cli, st_model, src, tmp_path)
    assert ids == ["a", "d", "f"]
    assert [e["location"] for e in bad] == ["line 2", "line 3", "line 5"]
    assert "surrogate" in bad[0]["reason"] and "nested too deeply" in bad[2]["reason"]


# -- item 11: an absolute size limit ------------------------------------------------------------------


def test_text_past_the_absolute_size_limit_is_a_bad_row(cli, st_model: Path, tmp_path: Path) -> None:
    from embedcli.io.reader_base import MAX_TEXT_CHARS

    src = tmp_path / "corpus.jsonl"
    with src.open("w", encoding="utf-8") as f:
        f.write(json.dumps({"id": "ok", "text": "fine"}) + "\n")
        f.write('{"id": "huge", "text": "' + "x" * (MAX_TEXT_CHARS + 1) + '"}\n')
    ids, bad = _skip_run(cli, st_model, src, tmp_path)
    assert ids == ["ok"]
    assert [(e["location"], e["id"]) for e in bad] == [("line 2", "huge")] and "past the" in bad[0]["reason"]


# -- --on-error fail: the first bad row in input order stops the run ---------------------------------


@pytest.mark.parametrize(("bad", "first"), [
    # a null text in one batch, a malformed line in the next (which the reader parses before it hands the
    # first batch on): the null text stops the run
    ({57: '{"id": "n57", "text": null}', 130: "{not json"}, "line 58"),
    # both in one batch, the malformed line first
    ({40: "{not json", 57: '{"id": "n57", "text": null}'}, "line 41"),
    # a repeated id before a null text in the same batch (two kinds of checks): the repeat first
    ({50: '{"id": "r3", "text": "again"}', 57: '{"id": "n57", "text": null}'}, "line 51"),
    # a malformed line after the last batch's rows
    ({159: "{not json"}, "line 160"),
], ids=["next-batch", "same-batch", "repeat-then-null", "last-line"])
def test_fail_stops_at_the_first_bad_row_in_input_order(cli, st_model: Path, tmp_path: Path, bad: dict, first: str) -> None:  # type: ignore[no-untyped-def]
    lines = [json.dumps({"id": f"r{i}", "text": f"row {i} text"}) for i in range(160)]
    for i, line in bad.items():
        lines[i] = line
    src = tmp_path / "c.jsonl"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out, errors = tmp_path / "out.parquet", tmp_path / "errors.jsonl"
    r = cli("embed", src, "-m", st_model, "-o", out, "-q", "--shard-rows", 40, "--errors-file", errors, code=1)
    assert f"{first}" in r.stderr and "Traceback" not in r.stderr
    assert [json.loads(x)["location"] for x in errors.read_text(encoding="utf-8").splitlines()] == [first]
    assert not out.exists()


# -- a UTF-16 file ---------------------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be"])
@pytest.mark.parametrize("name", ["c.txt", "c.jsonl", "c.csv", "c.tsv"])
def test_a_utf16_file_stops_the_run_even_under_skip(cli, st_model: Path, tmp_path: Path, name: str,
                                                     encoding: str) -> None:
    """Line 1 (the byte order mark) was a bad row, and under --on-error skip lines 2.. were embedded as text
    with a NUL between the letters (a txt file) at exit 3; the fix named latin1."""
    texts = ["the cat sat", "a dog", "three blind mice"]
    body = {
        ".txt": "\n".join(texts),
        ".jsonl": "\n".join(json.dumps({"text": t}) for t in texts),
        ".csv": "text\n" + "\n".join(texts),
        ".tsv": "text\n" + "\n".join(texts),
    }[Path(name).suffix] + "\n"
    src = tmp_path / name
    data = body.encode(encoding)
    src.write_bytes(data if encoding == "utf-16" else ("\ufeff" + body).encode(encoding))  # a BOM either way
    out = tmp_path / "out.parquet"
    r = cli("embed", src, "-m", st_model, "-o", out, "-q", "--on-error", "skip", code=1)
    assert f"{name} line 1: is UTF-16 (it starts with a UTF-16 byte order mark), not UTF-8" in r.stderr
    assert "iconv -f utf-16 -t utf-8" in r.stderr
    assert not out.exists()


# -- a Parquet text column of Arrow type null --------------------------------------------------------


def test_a_null_typed_parquet_text_column_is_null_text_rows(cli, st_model: Path, tmp_path: Path) -> None:
    """A text column with no value at all is written as Arrow type null: its rows are null texts (as in a
    string column), not "not a readable Parquet file ... truncated copy?" from a kernel that takes no null."""
    import pyarrow as pa

    src = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"id": ["a", "b"], "text": pa.array([None, None], pa.null())}), src)
    r = cli("embed", src, "-m", st_model, "-o", tmp_path / "fail.parquet", "-q", code=1)
    assert "docs.parquet row 0 (id 'a'): text is null" in r.stderr and "Parquet file" not in r.stderr
    ids, bad = _skip_run(cli, st_model, src, tmp_path)
    assert ids == [] and [(b["location"], b["id"], b["reason"]) for b in bad] == [
        ("row 0", "a", "text is null"), ("row 1", "b", "text is null")]


# -- a Parquet string column that is not UTF-8 -------------------------------------------------------


@pytest.mark.parametrize(("col", "rid"), [("text", "b"), ("k", "b"), ("id", None)])
def test_parquet_strings_that_are_not_utf8_are_bad_rows(cli, st_model: Path, tmp_path: Path, col: str,
                                                        rid: str | None) -> None:
    """A writer that does not check UTF-8 (pyarrow's `view`, some C++/Java writers) made a UnicodeDecodeError
    traceback; the row is a bad row naming the column and byte, as a bad line of a text file is."""
    import pyarrow as pa

    bad = pa.array([b"ok", b"caf\xe9", b"fine"], pa.binary()).view(pa.string())
    columns = {"id": ["a", "b", "c"], "text": ["x", "y", "z"], "k": ["p", "q", "r"]}
    src = tmp_path / "docs.parquet"
    pq.write_table(pa.table({**columns, col: bad}), src)
    where = f"docs.parquet row 1{'' if rid is None else f' (id {rid!r})'}: column {col!r} is not valid UTF-8"
    r = cli("embed", src, "-m", st_model, "-o", tmp_path / "fail.parquet", "--keep-cols", "k", "-q", code=1)
    assert f"{where} (byte 0xe9 at byte 4 of the value)" in r.stderr and "Traceback" not in r.stderr
    out, errors = tmp_path / "out.parquet", tmp_path / "errors.jsonl"
    cli("embed", src, "-m", st_model, "-o", out, "--keep-cols", "k", "-q", "--on-error", "skip", "--errors-file",
        errors, code=3)
    table = pq.read_table(out)
    assert table.column("id").to_pylist() == ([bad[0].as_py(), bad[2].as_py()] if col == "id" else ["a", "c"])
    (line,) = [json.loads(x) for x in errors.read_text().splitlines()]
    assert (line["location"], line["id"]) == ("row 1", rid)
