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


def test_past_the_head_files_a_missing_column_is_said_by_the_run(cli, st_model, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """A glob past `HEAD_FILES` inputs: only the first are read before the model loads (10,000 small files
    spent twice the model's start there); a later file's missing column stops the run as it opens that file."""
    import embedcli.run.source as source

    monkeypatch.setattr(source, "HEAD_FILES", 2)
    for i in range(3):
        field = "text" if i < 2 else "body"
        (tmp_path / f"d{i}.jsonl").write_text(json.dumps({"id": f"r{i}", field: f"text {i}"}) + "\n")
    result = cli("embed", tmp_path / "d*.jsonl", "-m", st_model, "--dtype", "float32", "-o", tmp_path / "out.parquet",
                 code=1)
    assert "'text'" in result.stderr and "d2.jsonl" in result.stderr
    assert not (tmp_path / "out.parquet").exists()


@pytest.mark.parametrize("head_files,raises", [(2, False), (3, True)])
def test_the_head_check_reads_the_first_head_files_inputs(tmp_path, monkeypatch, head_files, raises):  # type: ignore[no-untyped-def]
    import embedcli.run.source as source
    from embedcli.errors import InputError

    monkeypatch.setattr(source, "HEAD_FILES", head_files)
    for i in range(4):
        field = "body" if i == 2 else "text"
        (tmp_path / f"d{i}.jsonl").write_text(json.dumps({"id": f"r{i}", field: f"text {i}"}) + "\n")
    check = lambda: source.check_head(source.BatchSource(source.InputOptions([str(tmp_path / "d*.jsonl")])))  # noqa: E731
    if raises:
        with pytest.raises(InputError, match=r"d2\.jsonl"):
            check()
    else:
        check()
