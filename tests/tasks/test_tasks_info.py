"""`embedcli info` lists each model's tasks and commands; every task command has a runnable example in --help."""

from __future__ import annotations

import json

import pytest


@pytest.mark.parametrize(
    ("name", "tasks", "commands"),
    [
        (None, ["embed", "token_embed"], ["embed", "token-embed", "rerank", "score"]),
        ("cross-encoder", ["classify"], ["rerank", "score", "classify"]),
        ("multi-label", ["classify"], ["classify"]),
        ("token-classifier", ["token_classify"], ["token-classify"]),
    ],
)
def test_info_lists_tasks_and_commands(cli, task_models, name, tasks, commands):  # type: ignore[no-untyped-def]
    args = ["info", "--json"] if name is None else ["info", task_models(name), "--json"]
    data = json.loads(cli(*args).stdout)
    assert data["tasks"] == tasks and data["commands"] == commands
    table = cli(*args[:-1]).stdout
    assert "tasks" in table and "commands" in table


@pytest.mark.parametrize("command", ["embed", "rerank", "score", "classify", "token-embed", "token-classify"])
def test_every_command_help_has_an_example_and_env_twins(cli, command):  # type: ignore[no-untyped-def]
    text = " ".join(cli(command, "--help").stdout.split())
    assert f"Example: embedcli {command} " in text
    assert "EMBEDCLI_MODEL" in text and "EMBEDCLI_OUTPUT" in text


def test_help_examples_run(cli, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """The default-model examples, run as written on small files."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "docs.jsonl").write_text(
        "".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(["rates rise", "cup final", "hi"]))
    )
    (tmp_path / "pairs.jsonl").write_text(json.dumps({"question": "who won?", "answer": "Labour won."}) + "\n")
    out = cli("rerank", "docs.jsonl", "--query", "interest rates rise", "--top-n", "5", "--return-documents", "-o", "-")
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["rank"] for r in rows] == [1, 2, 3] and rows[0]["text"] == "rates rise"
    cli("score", "pairs.jsonl", "--left-col", "question", "--right-col", "answer", "-o", "scores.parquet")
    cli("token-embed", "docs.jsonl", "-o", "token-vectors.parquet")
    assert (tmp_path / "scores.parquet").exists() and (tmp_path / "token-vectors.parquet").exists()
