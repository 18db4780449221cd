"""How InputError and OutputError render."""

from __future__ import annotations

from embedcli.io.errors import InputError, OutputError


def test_input_error_renders_one_line_with_location_id_and_fix() -> None:
    err = InputError(
        "corpus.jsonl",
        "malformed JSON: Expecting ',' delimiter (column 15)",
        location="line 12",
        record_id="a7",
        fix="each line must be one complete JSON object",
    )
    assert str(err) == (
        "corpus.jsonl line 12 (id 'a7'): malformed JSON: Expecting ',' delimiter (column 15)"
        " — fix: each line must be one complete JSON object"
    )
    assert "\n" not in str(err)
    assert (err.path, err.location, err.record_id) == ("corpus.jsonl", "line 12", "a7")


def test_input_error_minimal_and_stdin() -> None:
    assert str(InputError("data.parquet", "no such file")) == "data.parquet: no such file"
    assert str(InputError("-", "bad", location="line 3")) == "<stdin> line 3: bad"


def test_input_error_record_for_errors_file() -> None:
    rec = InputError("a.csv", "text is null", location="line 4", record_id="x").to_record()
    assert rec == {"file": "a.csv", "location": "line 4", "id": "x", "reason": "text is null", "fix": None}


def test_output_error_renders() -> None:
    err = OutputError(
        "out/emb.parquet", "directory 'out' does not exist", fix="create it first: mkdir -p out"
    )
    assert (
        str(err)
        == "cannot write out/emb.parquet: directory 'out' does not exist — fix: create it first: mkdir -p out"
    )
    assert str(OutputError("-", "broken pipe")) == "cannot write <stdout>: broken pipe"
