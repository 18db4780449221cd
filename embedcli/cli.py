"""The `embedcli` command line: one thin typer function per command."""

from __future__ import annotations

import typer

from embedcli import __version__

app = typer.Typer(
    name="embedcli",
    help="Turn corpora on disk into vectors and scores: embed, rerank, score, classify, token tasks.",
    no_args_is_help=True,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
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
    """embedcli: vLLM's pooling tasks over files (JSONL, Parquet, CSV, stdin) on CPU or CUDA."""


def main() -> None:
    """Console entry point."""
    app()
