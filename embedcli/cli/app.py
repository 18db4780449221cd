"""The typer app, and the one place embedcli's errors become exit codes and one-line messages."""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Sequence

import typer
from typer.main import get_command_name

from embedcli.cli.coercion import install
from embedcli.cli.help import PlainHelpGroup
from embedcli.errors import EXIT_FATAL, EXIT_INTERRUPTED, EmbedcliError
from embedcli.version import __version__

install()  # flag values that need no coercion skip pydantic (`embedcli.cli.coercion`)

app = typer.Typer(
    name="embedcli",
    help="Turn corpora on disk into vectors and scores: embed, rerank, score, classify, token tasks.",
    no_args_is_help=True,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
    pretty_exceptions_enable=False,
    cls=PlainHelpGroup,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"embedcli {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """embedcli: vLLM's pooling tasks over files (JSONL, Parquet, CSV, text, stdin) on CPU or CUDA."""


def run(fn: Callable[[], int]) -> None:
    """Call a job and turn its known failures into the contract's exit codes and one-line messages."""
    try:
        code = fn()
    except KeyboardInterrupt:
        typer.echo("embedcli: interrupted", err=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except EmbedcliError as e:
        typer.echo(f"embedcli: {e.label}: {e}", err=True)
        raise typer.Exit(e.exit_code) from None
    except OSError as e:
        typer.echo(f"embedcli: error: {e}", err=True)
        raise typer.Exit(EXIT_FATAL) from None
    raise typer.Exit(code)


def narrowed(args: Sequence[str]) -> typer.Typer:
    """`app` holding only the command `args` name, or the whole `app` when they name none.

    typer builds the click command of every registered command on each start (their flags' signatures
    and type hints): ~18 ms for the 14 commands against ~2 ms for one, paid before any work starts. A
    command's own help, parsing and errors need only that command; the root's help, `--version`, an
    unknown name (click suggests the near ones) and shell completion need them all, and get them all.
    """
    if not args or args[0].startswith("-") or any(k.startswith("_") and k.endswith("_COMPLETE") for k in os.environ):
        return app
    only = [c for c in app.registered_commands if _name(c) == args[0]]
    if len(only) != 1 or app.registered_groups:
        return app
    view = copy.copy(app)
    view.registered_commands = only
    return view


def _name(command: typer.models.CommandInfo) -> str | None:
    """The name typer gives a registered command."""
    if command.name:
        return command.name
    return get_command_name(command.callback.__name__) if command.callback else None
