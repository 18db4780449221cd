"""The console script builds only the command it runs (`embedcli.cli.app.narrowed`), and that command behaves
exactly as it does inside the whole app: the same help, the same parsing errors, the same exit codes."""

from __future__ import annotations

import pytest
import typer.main
from typer.testing import CliRunner

from embedcli.cli import app
from embedcli.cli.app import narrowed

NAMES = sorted(
    typer.main.get_command(app).commands  # type: ignore[attr-defined]  # the root is a group
)


def test_every_command_narrows_to_itself_alone() -> None:
    assert len(NAMES) >= 14
    for name in NAMES:
        built = typer.main.get_command(narrowed([name, "x"]))
        assert list(built.commands) == [name]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "args",
    [[], ["--help"], ["--version"], ["-h"], ["embd"], ["nosuch", "--help"], ["--install-completion"]],
)
def test_the_root_and_unknown_names_keep_every_command(args: list[str]) -> None:
    assert narrowed(args) is app


def test_shell_completion_keeps_every_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("_EMBEDCLI_COMPLETE", "bash_complete")
    assert narrowed(["embed"]) is app


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("tail", [["--help"], ["--no-such-flag"]])
def test_a_narrowed_command_answers_as_the_whole_app(name: str, tail: list[str]) -> None:
    runner = CliRunner()
    whole = runner.invoke(app, [name, *tail], env={"COLUMNS": "100", "TERM": "dumb"}, prog_name="embedcli")
    alone = runner.invoke(narrowed([name, *tail]), [name, *tail], env={"COLUMNS": "100", "TERM": "dumb"},
                          prog_name="embedcli")
    assert (alone.exit_code, alone.output) == (whole.exit_code, whole.output)
    assert whole.output  # a help or an error, never silence
