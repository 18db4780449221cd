"""Streaming input readers: formats, globs, stdin, default ids, kept columns and every error case."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embedcli.io.errors import InputError
from embedcli.io.readers import (
    InputBatch,
    describe_input_change,
    detect_format,
    expand_paths,
    fingerprint_identity,
    input_fingerprint,
    read_inputs,
)


def collect(batches: Any) -> list[dict[str, Any]]:
    """Flatten batches into one dict per record."""
    rows = []
    for b in batches:
        assert isinstance(b, InputBatch)
        for i in range(len(b)):
            row = {"source": b.source, "loc": b.locations[i], "id": b.ids[i], "text": b.texts[i]}
            row.update({c: v[i] for c, v in b.columns.items()})
            row.update({f"extra:{c}": v[i] for c, v in b.extra_texts.items()})
            rows.append(row)
    return rows


def write_jsonl(path: Path, records: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def fake_stdin(monkeypatch: pytest.MonkeyPatch, data: bytes) -> io.BytesIO:
    raw = io.BytesIO(data)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(raw, encoding="utf-8"))
    return raw


# --------------------------------------------------------------------------------------------------
# Formats


def test_jsonl_round_trip(tmp_path: Path) -> None:
    p = tmp_path / "corpus.jsonl"
    p.write_text(
        '{"id": "a", "text": "hello", "lang": "en", "n": 1}\n'
        "\n"
        '{"id": 7, "text": "héllo wörld", "lang": "de"}\n'
        "   \n"
        '{"id": "c", "text": null, "lang": "fr", "n": 3}\n',
        encoding="utf-8",
    )
    rows = collect(read_inputs([str(p)], keep_cols=["lang", "n"]))
    assert [r["loc"] for r in rows] == ["line 1", "line 3", "line 5"]
    assert [r["id"] for r in rows] == ["a", "7", "c"]  # ids always strings
    assert [r["text"] for r in rows] == [
        "hello",
        "héllo wörld",
        None,
    ]  # null text is not the reader's business
    assert [r["lang"] for r in rows] == ["en", "de", "fr"]
    assert [r["n"] for r in rows] == [1, None, 3]  # a kept field missing from a later record is None


def test_jsonl_batches_and_extensions(tmp_path: Path) -> None:
    recs = [{"id": str(i), "text": f"t{i}"} for i in range(10)]
    for ext in (".jsonl", ".ndjson", ".json"):
        p = write_jsonl(tmp_path / f"c{ext}", recs)
        batches = list(read_inputs([str(p)], batch_rows=4))
        assert [len(b) for b in batches] == [4, 4, 2]
        assert [i for b in batches for i in b.ids] == [str(i) for i in range(10)]


def test_jsonl_default_ids_and_bom(tmp_path: Path) -> None:
    p = tmp_path / "notes.jsonl"
    p.write_bytes(b'\xef\xbb\xbf{"text": "a"}\n\n{"text": "b"}\n')
    rows = collect(read_inputs([str(p)]))
    assert [r["id"] for r in rows] == ["notes.jsonl:1", "notes.jsonl:3"]


def test_jsonl_extra_text_cols(tmp_path: Path) -> None:
    p = write_jsonl(tmp_path / "pairs.jsonl", [{"id": 1, "q": "query", "text": "doc"}])
    rows = collect(read_inputs([str(p)], extra_text_cols=["q"]))
    assert rows[0]["extra:q"] == "query" and rows[0]["text"] == "doc"


def test_gzip_jsonl(tmp_path: Path) -> None:
    p = tmp_path / "c.jsonl.gz"
    with gzip.open(p, "wt", encoding="utf-8") as f:
        f.write('{"id": "x", "text": "zipped"}\n')
    assert collect(read_inputs([str(p)]))[0]["text"] == "zipped"


def test_parquet_several_row_groups(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "docs.parquet"
    table = pa.table(
        {
            "id": pa.array(range(100, 110), pa.int64()),
            "text": [f"doc {i}" if i != 4 else None for i in range(10)],
            "lang": ["en"] * 10,
            "unused": [b"x" * 10] * 10,
        }
    )
    pq.write_table(table, p, row_group_size=3)
    assert pq.ParquetFile(p).num_row_groups == 4

    seen_columns = []
    original = pq.ParquetFile.iter_batches

    def spy(self: pq.ParquetFile, *args: Any, **kwargs: Any) -> Any:
        seen_columns.append(kwargs.get("columns"))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", spy)
    batches = list(read_inputs([str(p)], keep_cols=["lang"], batch_rows=4))
    # blocks of 4 rows from each row group's start (groups of 3: a block per group); a batch ends at the
    # first block boundary past 4 rows
    assert [len(b) for b in batches] == [6, 4]
    rows = collect(batches)
    assert [r["loc"] for r in rows] == [f"row {i}" for i in range(10)]
    assert [r["id"] for r in rows] == [str(i) for i in range(100, 110)]
    assert rows[4]["text"] is None and rows[5]["text"] == "doc 5"
    assert {r["lang"] for r in rows} == {"en"}
    assert sorted(seen_columns[0]) == ["id", "lang", "text"]  # "unused" is never read


def test_parquet_default_ids(tmp_path: Path) -> None:
    p = tmp_path / "t.pq"
    pq.write_table(pa.table({"text": ["a", "b", "c"]}), p, row_group_size=2)
    assert [r["id"] for r in collect(read_inputs([str(p)]))] == ["t.pq:0", "t.pq:1", "t.pq:2"]


@pytest.mark.parametrize(
    "text_type",
    [pa.string(), pa.large_string(), pa.string_view(), pa.dictionary(pa.int32(), pa.string())],
    ids=["string", "large_string", "string_view", "dictionary"],
)
def test_parquet_text_column_of_any_string_type(tmp_path: Path, text_type: pa.DataType) -> None:
    # Polars and DuckDB write string views; the text sizes read offsets, which a view array has none of
    p = tmp_path / "docs.parquet"
    texts = pa.array(["doc a", None, "doc c"]).cast(text_type)
    pq.write_table(pa.table({"id": texts.cast(pa.string()).fill_null("b").cast(text_type), "text": texts}), p)
    rows = collect(read_inputs([str(p)]))
    assert [(r["id"], r["text"]) for r in rows] == [("doc a", "doc a"), ("b", None), ("doc c", "doc c")]


def test_csv_quoting_multiline_and_strings(tmp_path: Path) -> None:
    p = tmp_path / "c.csv"
    p.write_text('id,text,score\n1,"a, b",0.5\n2,"line one\nline two",7\n\n3,plain,\n', encoding="utf-8")
    rows = collect(read_inputs([str(p)], keep_cols=["score"]))
    assert [r["id"] for r in rows] == ["1", "2", "3"]
    assert [r["text"] for r in rows] == ["a, b", "line one\nline two", "plain"]
    assert [r["score"] for r in rows] == ["0.5", "7", ""]  # every column is a string
    assert [r["loc"] for r in rows] == ["line 2", "line 3", "line 6"]  # where each record starts


def test_csv_default_ids_crlf_and_long_field(tmp_path: Path) -> None:
    long_text = "x" * 300_000  # over the csv module's default 128 KiB field limit
    p = tmp_path / "d.csv"
    p.write_bytes(f"text\r\nfirst\r\n{long_text}\r\n".encode())
    rows = collect(read_inputs([str(p)]))
    assert [r["id"] for r in rows] == ["d.csv:2", "d.csv:3"]
    assert rows[0]["text"] == "first" and rows[1]["text"] == long_text


def test_tsv_keeps_quotes_literally(tmp_path: Path) -> None:
    p = tmp_path / "c.tsv"
    p.write_text('id\ttext\nq1\t"quoted" start, with comma\nq2\tsecond\n', encoding="utf-8")
    rows = collect(read_inputs([str(p)]))
    assert [r["text"] for r in rows] == ['"quoted" start, with comma', "second"]
    assert [r["id"] for r in rows] == ["q1", "q2"]


def test_txt_one_record_per_line(tmp_path: Path) -> None:
    p = tmp_path / "lines.txt"
    p.write_bytes(b"first line\r\n\n  second, with spaces  \nthird")
    rows = collect(read_inputs([str(p)], text_col="ignored"))
    assert [r["text"] for r in rows] == ["first line", "  second, with spaces  ", "third"]
    assert [r["id"] for r in rows] == ["lines.txt:1", "lines.txt:3", "lines.txt:4"]
    assert [r["loc"] for r in rows] == ["line 1", "line 3", "line 4"]


def test_stdin_jsonl_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_stdin(monkeypatch, b'{"text": "from stdin"}\n{"id": "ignored", "text": "two"}\n')
    bad: list[InputError] = []
    rows = collect(read_inputs(["-"], on_bad_row=bad.append))
    assert [r["text"] for r in rows] == ["from stdin"]
    assert [r["id"] for r in rows] == ["stdin:1"]  # a stream cannot be read ahead: the first record decides
    assert [e.location for e in bad] == ["line 2"]  # ... and a later id is a bad row, never silently dropped
    assert rows[0]["source"] == "-"


def test_stdin_with_format(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_stdin(monkeypatch, b"id,text\nk,v\n")
    assert collect(read_inputs(["-"], fmt="csv"))[0]["id"] == "k"
    buf = io.BytesIO()
    pq.write_table(pa.table({"id": ["p"], "text": ["parquet on stdin"]}), buf)
    fake_stdin(monkeypatch, buf.getvalue())
    assert collect(read_inputs(["-"], fmt="parquet"))[0]["text"] == "parquet on stdin"


def test_globs_and_several_inputs_keep_order(tmp_path: Path) -> None:
    d = tmp_path / "shards"
    d.mkdir()
    for name in ("b", "a", "c"):
        write_jsonl(d / f"{name}.jsonl", [{"id": name, "text": name}])
    (d / "sub.jsonl").mkdir()  # a directory matching the glob is dropped
    extra = tmp_path / "z.txt"
    extra.write_text("last\n")
    first = write_jsonl(tmp_path / "first.jsonl", [{"id": "0", "text": "first"}])
    rows = collect(read_inputs([str(first), str(d / "*.jsonl"), str(extra)]))
    assert [r["text"] for r in rows] == ["first", "a", "b", "c", "last"]
    assert [os.path.basename(r["source"]) for r in rows] == [
        "first.jsonl",
        "a.jsonl",
        "b.jsonl",
        "c.jsonl",
        "z.txt",
    ]


def test_default_ids_use_path_when_basenames_collide(tmp_path: Path) -> None:
    for sub in ("x", "y"):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "part.txt").write_text("row\n")
    rows = collect(read_inputs([str(tmp_path / "*" / "part.txt")]))
    assert [r["id"] for r in rows] == [
        str(tmp_path / "x" / "part.txt") + ":1",
        str(tmp_path / "y" / "part.txt") + ":1",
    ]


def test_detect_format() -> None:
    assert detect_format("a.JSONL") == "jsonl"
    assert detect_format("a.csv.gz") == "csv"
    assert detect_format("-") == "jsonl"
    assert detect_format("a.weird", "ndjson") == "jsonl"
    with pytest.raises(ValueError, match="--format"):
        detect_format("a.jsonl", "xml")


# --------------------------------------------------------------------------------------------------
# Streaming


def test_jsonl_is_streamed_not_loaded(tmp_path: Path) -> None:
    p = tmp_path / "big.jsonl"
    with open(p, "w", encoding="utf-8") as f:
        for i in range(200_000):
            f.write(f'{{"id": "{i}", "text": "row {i}"}}\n')
        f.write("{broken\n")  # a reader that parsed the whole file first would fail before yielding
    it = read_inputs([str(p)], batch_rows=1000)
    first = next(it)
    assert first.ids[0] == "0" and len(first) == 1008  # whole 16-line blocks
    with pytest.raises(InputError, match="line 200001"):
        for _ in it:
            pass


def test_stdin_is_streamed(monkeypatch: pytest.MonkeyPatch) -> None:
    data = b"".join(b'{"text": "row %d"}\n' % i for i in range(200_000))
    raw = fake_stdin(monkeypatch, data)
    it = read_inputs(["-"], batch_rows=100)
    assert len(next(it)) == 100
    assert raw.tell() < len(data) // 10  # only a buffer's worth was read


# --------------------------------------------------------------------------------------------------
# Errors


def test_missing_file_and_unmatched_glob(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file") as e:
        read_inputs([str(tmp_path / "nope.jsonl")])
    assert str(tmp_path / "nope.jsonl") in str(e.value)
    with pytest.raises(InputError, match="matched no files"):
        read_inputs([str(tmp_path / "*.parquet")])
    with pytest.raises(InputError, match="is a directory"):
        expand_paths([str(tmp_path)])


def test_stdin_named_twice_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """`embed - -` read stdin's rows once and ended at exit 0: the second `-` added nothing."""
    fake_stdin(monkeypatch, b'{"text": "from stdin"}\n')
    with pytest.raises(InputError, match="stdin is named twice, but it is read once") as e:
        collect(read_inputs(["-", "-"]))
    assert "name - once" in str(e.value)


def test_unknown_extension(tmp_path: Path) -> None:
    p = tmp_path / "data.xml"
    p.write_text("<x/>")
    with pytest.raises(InputError, match=r"unknown input format '\.xml'.*--format"):
        read_inputs([str(p)])


def test_malformed_json_names_line_and_id(tmp_path: Path) -> None:
    p = tmp_path / "corpus.jsonl"
    p.write_text('{"id": "a1", "text": "ok"}\n\n{"id": "a7", "text": "x" "y"}\n')
    with pytest.raises(InputError) as e:
        collect(read_inputs([str(p)]))
    msg = str(e.value)
    assert "corpus.jsonl line 3 (id 'a7'): malformed JSON: Expecting ',' delimiter" in msg
    assert e.value.location == "line 3" and e.value.record_id == "a7"


def test_line_that_is_not_an_object(tmp_path: Path) -> None:
    p = tmp_path / "c.jsonl"
    p.write_text('{"text": "ok"}\n"just a string"\n')
    with pytest.raises(InputError, match="line 2: expected a JSON object, got str"):
        collect(read_inputs([str(p)]))


def test_json_array_file(tmp_path: Path) -> None:
    p = tmp_path / "arr.json"
    p.write_text('[\n  {"text": "a"},\n  {"text": "b"}\n]\n')
    with pytest.raises(InputError, match="JSON array, not JSON Lines") as e:
        collect(read_inputs([str(p)]))
    assert "jq -c" in str(e.value)


@pytest.mark.parametrize(
    ("name", "content", "line"),
    [
        ("c.jsonl", b'{"text": "ok"}\n{"text": "caf\xe9"}\n', 2),
        ("c.txt", b"ok\ncaf\xe9\n", 2),
        ("c.csv", b"text\nok\ncaf\xe9\n", 3),
        ("c.tsv", b"text\nok\ncaf\xe9\n", 3),
    ],
)
def test_invalid_utf8_names_the_line(tmp_path: Path, name: str, content: bytes, line: int) -> None:
    p = tmp_path / name
    p.write_bytes(content)
    with pytest.raises(
        InputError, match=rf"{name} line {line}( \(id [^)]*\))?: not valid UTF-8 \(byte 0xe9"
    ) as e:
        collect(read_inputs([str(p)]))
    assert "iconv" in str(e.value)


def test_missing_text_column_lists_columns(tmp_path: Path) -> None:
    j = write_jsonl(tmp_path / "c.jsonl", [{"id": "1", "body": "x"}])
    with pytest.raises(
        InputError, match=r"line 1: no text field 'text'; the fields are: 'id', 'body'.*--text-col"
    ):
        collect(read_inputs([str(j)]))
    pqf = tmp_path / "c.parquet"
    pq.write_table(pa.table({"id": ["1"], "body": ["x"]}), pqf)
    with pytest.raises(InputError, match=r"no text column 'text'; the columns are: 'id', 'body'"):
        collect(read_inputs([str(pqf)]))
    c = tmp_path / "c.csv"
    c.write_text("id,body\n1,x\n")
    with pytest.raises(InputError, match=r"no text column 'text'; the columns are: 'id', 'body'"):
        collect(read_inputs([str(c)]))


def test_missing_kept_column(tmp_path: Path) -> None:
    c = tmp_path / "c.csv"
    c.write_text("id,text\n1,x\n")
    with pytest.raises(InputError, match=r"no kept column 'lang'.*--keep-cols"):
        collect(read_inputs([str(c)], keep_cols=["lang"]))


def test_explicit_id_column_must_exist(tmp_path: Path) -> None:
    j = write_jsonl(tmp_path / "c.jsonl", [{"text": "x"}])
    assert collect(read_inputs([str(j)]))[0]["id"] == "c.jsonl:1"  # default "id" absent: not an error
    with pytest.raises(InputError, match=r"no id field 'id'.*--id-col"):
        collect(read_inputs([str(j)], id_col="id"))
    pqf = tmp_path / "c.parquet"
    pq.write_table(pa.table({"text": ["x"]}), pqf)
    with pytest.raises(InputError, match=r"no id column 'doc_id'; the columns are: 'text'"):
        collect(read_inputs([str(pqf)], id_col="doc_id"))


def test_txt_rejects_named_columns(tmp_path: Path) -> None:
    p = tmp_path / "l.txt"
    p.write_text("a\n")
    with pytest.raises(InputError, match="plain-text input has no named columns"):
        read_inputs([str(p)], keep_cols=["lang"])


def test_bad_ids(tmp_path: Path) -> None:
    j = write_jsonl(tmp_path / "c.jsonl", [{"id": "1", "text": "a"}, {"id": None, "text": "b"}])
    with pytest.raises(InputError, match="line 2: id field 'id' is null"):
        collect(read_inputs([str(j)]))
    j2 = write_jsonl(tmp_path / "d.jsonl", [{"id": "1", "text": "a"}, {"id": [1], "text": "b"}])
    with pytest.raises(InputError, match="is an array; ids must be strings or integers"):
        collect(read_inputs([str(j2)]))
    pqf = tmp_path / "c.parquet"
    pq.write_table(pa.table({"id": ["a", None], "text": ["x", "y"]}), pqf)
    with pytest.raises(InputError, match="row 1: id column 'id' is null"):
        collect(read_inputs([str(pqf)]))


def test_non_string_text(tmp_path: Path) -> None:
    j = write_jsonl(tmp_path / "c.jsonl", [{"id": "n", "text": 5}])
    with pytest.raises(InputError, match=r"line 1 \(id 'n'\): text field 'text' is a number"):
        collect(read_inputs([str(j)]))
    pqf = tmp_path / "c.parquet"
    pq.write_table(pa.table({"text": [1.5]}), pqf)
    with pytest.raises(InputError, match="text column 'text' has type double"):
        collect(read_inputs([str(pqf)]))


def test_csv_wrong_field_count(tmp_path: Path) -> None:
    p = tmp_path / "c.csv"
    p.write_text("id,text\n1,fine\n2,not, quoted\n")
    with pytest.raises(InputError, match="line 3: 3 fields, but the header has 2"):
        collect(read_inputs([str(p)]))


def test_on_bad_row_collects_and_skips(tmp_path: Path) -> None:
    p = tmp_path / "c.jsonl"
    p.write_bytes(
        b'{"id": "1", "text": "a"}\n{oops\n{"id": "3", "text": "caf\xe9"}\n[1]\n{"id": "5", "text": "e"}\n'
    )
    errors: list[InputError] = []
    rows = collect(read_inputs([str(p)], on_bad_row=errors.append))
    assert [r["id"] for r in rows] == ["1", "5"]
    assert [e.location for e in errors] == ["line 2", "line 3", "line 4"]
    c = tmp_path / "c.csv"
    c.write_bytes(b"id,text\n1,a\n2,b,extra\n3,caf\xe9\n4,d\n")
    errors.clear()
    rows = collect(read_inputs([str(c)], on_bad_row=errors.append))
    assert [r["id"] for r in rows] == ["1", "4"]
    assert [e.location for e in errors] == ["line 3", "line 4"]


def test_truncated_parquet(tmp_path: Path) -> None:
    p = tmp_path / "t.parquet"
    pq.write_table(pa.table({"id": [str(i) for i in range(1000)], "text": ["x" * 50] * 1000}), p)
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match="not a readable Parquet file") as e:
        collect(read_inputs([str(p)]))
    assert str(p) in str(e.value) and "truncated" in str(e.value)


def test_not_parquet_at_all(tmp_path: Path) -> None:
    p = tmp_path / "fake.parquet"
    p.write_text('{"text": "this is JSON"}\n')
    with pytest.raises(InputError, match="not a readable Parquet file"):
        collect(read_inputs([str(p)]))
    empty = tmp_path / "empty.parquet"
    empty.write_bytes(b"")
    with pytest.raises(InputError, match="not a readable Parquet file"):
        collect(read_inputs([str(empty)]))


def test_empty_text_files_yield_nothing(tmp_path: Path) -> None:
    for name in ("e.jsonl", "e.csv", "e.txt"):
        (tmp_path / name).write_text("")
        assert list(read_inputs([str(tmp_path / name)])) == []


# --------------------------------------------------------------------------------------------------
# Fingerprints


def test_input_fingerprint(tmp_path: Path) -> None:
    small = tmp_path / "s.jsonl"
    small.write_text('{"text": "a"}\n')
    fp = input_fingerprint(str(small))
    assert set(fp) == {"path", "size", "blake2b"}  # by content: mtime and place do not matter
    assert fp["size"] == small.stat().st_size
    assert fp["blake2b"] == hashlib.blake2b(small.read_bytes(), digest_size=16).hexdigest()
    moved = tmp_path / "moved.jsonl"
    small.rename(moved)
    os.utime(moved, ns=(1, 1))
    assert fingerprint_identity(input_fingerprint(str(moved))) == fingerprint_identity(fp)

    big = tmp_path / "b.bin"
    big.write_bytes(b"a" * (3 << 20))
    before = input_fingerprint(str(big), content_limit=1 << 20)  # past the limit: size, mtime, head and tail
    assert set(before) >= {"size", "mtime_ns", "head_sha256", "tail_sha256"}
    with open(big, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        f.write(b"b")
    after = input_fingerprint(str(big), content_limit=1 << 20)
    assert before["head_sha256"] == after["head_sha256"] and before["tail_sha256"] != after["tail_sha256"]
    assert "b.bin changed" in describe_input_change([before], [after])

    with pytest.raises(InputError, match="no such file"):
        input_fingerprint(str(tmp_path / "missing"))
    with pytest.raises(InputError, match="stdin"):
        input_fingerprint("-")


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "csv", "txt"])
def test_batch_chars_cuts_the_same_records_in_every_format(tmp_path: Path, fmt: str) -> None:
    texts = ["x" * (i % 50 + 1) for i in range(500)]
    path = tmp_path / f"a.{fmt}"
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"text": texts}), path, row_group_size=77)  # groups not on batch cuts
    elif fmt == "csv":
        path.write_text("text\n" + "".join(f"{t}\n" for t in texts))
    elif fmt == "txt":
        path.write_text("".join(f"{t}\n" for t in texts))
    else:
        path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    batches = list(read_inputs([str(path)], batch_rows=64, batch_chars=1000))
    # A batch ends at the first block boundary where it holds 1,000 characters of text or 64 rows (blocks:
    # 16 records, from each row group's start in Parquet, cut sooner after 1,000 / 8 bytes of text).
    for b in batches[:-1]:
        chars = [len(t) for t in b.texts]
        assert sum(chars) >= 1000 or len(b) >= 64
        before = b.blocks[-1].first  # without its last block it would not have been full
        assert sum(chars[:before]) < 1000 and before < 64
    assert [t for b in batches for t in b.texts] == texts
