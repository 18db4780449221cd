"""Issue 22, poor errors: input mistakes (`--text-col body`, a missing `--keep-cols` column) in a file are said
before the model loads, not after the whole start (stdin is not peeked at: that would consume it)."""

from __future__ import annotations

import json

import pytest


@pytest.fixture
def no_model_load(monkeypatch):  # type: ignore[no-untyped-def]
    import embedcli.tasks.common as common

    def refuse(*_a: object, **_k: object) -> None:
        raise AssertionError("the model was loaded before the input was checked")

    monkeypatch.setattr(common, "build_runner", refuse)


@pytest.mark.parametrize("command,flags,missing", [
    ("embed", ("--text-col", "body"), "body"),
    ("embed", ("--keep-cols", "title"), "title"),
    ("classify", ("--text-col", "body"), "body"),
    ("score", ("--left-col", "question", "--right-col", "text"), "question"),
])
@pytest.mark.parametrize("dtype", ["float32", "auto"])
def test_a_missing_column_is_said_before_the_model_loads(cli, st_model, tmp_path, no_model_load, command, flags,
                                                         missing, dtype):  # type: ignore[no-untyped-def]
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"id": i, "text": f"text {i}"}) + "\n" for i in range(3)))
    result = cli(command, docs, "-m", st_model, *flags, "--dtype", dtype, "-o", tmp_path / "out.parquet", code=1)
    assert f"'{missing}'" in result.stderr and "model was loaded" not in result.output
