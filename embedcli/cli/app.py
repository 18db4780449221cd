"""The typer app, and the one place embedcli's errors become exit codes and one-line messages."""

from __future__ import annotations

from collections.abc import Callable

import typer

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
