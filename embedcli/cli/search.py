"""The commands over stored vectors and the Hub: search (exact top-k of a vectors file) and download."""

from __future__ import annotations

import typer

from embedcli.cli.app import app, run
from embedcli.cli.options import (
    BATCHING,
    INPUT,
    MODEL,
    OPT_DEVICE,
    OPT_OVERWRITE,
    OPT_PICKLE,
    OPT_QUIET,
    OPT_REMOTE,
    OPT_THREADS,
    OUTPUT,
    cols,
    env,
)


@app.command(
    epilog="Example: [bold]embedcli search vectors.parquet --queries q.jsonl --top-k 100 --keep-cols text -o -[/bold]"
    "\n\nint8 vectors, 8 x top-k candidates rescored: [bold]embedcli search vectors-int8.parquet --queries q.jsonl "
    "--rescore 8 -o hits.parquet[/bold]",
)
def search(
    vectors: str = typer.Argument(..., help="A Parquet file written by embedcli embed (or its s3:// gs:// hf:// URL), or its lancedb://DIR/TABLE.", show_default=False),
    query: str | None = typer.Option(None, "--query", rich_help_panel=INPUT, help="One query text."),
    queries: str | None = typer.Option(
        None, "--queries", envvar=env("queries"), rich_help_panel=INPUT,
        help="A file of queries (JSONL, Parquet, CSV, .txt) with --query-col text and an id column.",
    ),
    query_col: str = typer.Option("text", "--query-col", rich_help_panel=INPUT, help="Column of the query text."),
    query_id_col: str | None = typer.Option(
        None, "--query-id-col", rich_help_panel=INPUT, help="Column of the query id (default: 'id', else file:line)."
    ),
    top_k: int = typer.Option(10, "--top-k", envvar=env("top-k"), rich_help_panel=OUTPUT, help="Hits per query."),
    keep_cols: str = typer.Option(
        "", "--keep-cols", envvar=env("keep-cols"), rich_help_panel=OUTPUT,
        help="Comma-separated columns of the vectors file to add to each hit (e.g. text, for rerank).",
    ),
    rescore: int = typer.Option(
        4, "--rescore", envvar=env("rescore"), rich_help_panel=OUTPUT,
        help="int8/uint8/binary/ubinary vectors: take the top-k x N candidates by the quantized score, then "
        "rescore them with the float query (query . dequantized codes; query . bits for binary), as "
        "sentence-transformers' rescore_multiplier. 0: off (the quantized score alone). Float vectors: no "
        "effect. E.g. --rescore 8.",
    ),
    block_rows: int = typer.Option(
        8192, "--block-rows", envvar=env("block-rows"), rich_help_panel=BATCHING,
        help="Vectors scored per step; memory follows this, not the file size.",
    ),
    model: str | None = typer.Option(
        None, "-m", "--model", envvar=env("model"), rich_help_panel=MODEL,
        help="The model that made the vectors (default: the one named in their provenance); another is refused.",
    ),
    device: str = OPT_DEVICE,
    threads: int | None = OPT_THREADS,
    dtype: str = typer.Option(
        "auto", "--dtype", envvar=env("dtype"), rich_help_panel=MODEL,
        help="auto: the dtype the vectors were made with; float32, bfloat16, float16.",
    ),
    allow_pickle: bool = OPT_PICKLE,
    trust_remote_code: bool = OPT_REMOTE,
    output: str = typer.Option(
        "-", "-o", "--output", envvar=env("output"), rich_help_panel=OUTPUT,
        help="Output path or s3:// gs:// object: .parquet or .jsonl; - (default) writes JSONL to stdout.",
    ),
    output_format: str | None = typer.Option(
        None, "--output-format", envvar=env("output-format"), rich_help_panel=OUTPUT,
        help="parquet or jsonl (default: from the extension).",
    ),
    overwrite: bool = OPT_OVERWRITE,
    quiet: bool = OPT_QUIET,
) -> None:
    """Exact top-k search of a vectors file: query_id, rank, id, score and kept columns, best first.

    Queries are embedded as the vectors were (model, prompt, normalization, dimensions, precision: read from
    the file's provenance; the model's 'query' prompt where it has one). Scores: cosine for float vectors,
    the dot product of codes for int8/uint8 (queries quantized with the stored ranges), agreeing bits for
    binary/ubinary; quantized vectors then have their top-k x --rescore candidates rescored with the float
    query (default 4; --rescore 0: off). Ties go to the earlier row.
    """
    from embedcli.run.flags import RunFlags
    from embedcli.tasks.common import ModelChoice, OutputOptions
    from embedcli.tasks.search import SearchOptions, run_search

    run(
        lambda: run_search(
            SearchOptions(vectors, query, queries, query_col, query_id_col, top_k, cols(keep_cols), rescore, block_rows),
            ModelChoice(model, device, dtype, None, allow_pickle, trust_remote_code, threads=threads),
            OutputOptions(output, output_format, quiet),
            RunFlags(overwrite=overwrite),
        )
    )


@app.command(epilog="Example: [bold]embedcli download BAAI/bge-small-en-v1.5 --revision COMMIT_SHA[/bold]")
def download(
    model: str = typer.Argument(..., help="A Hub model id: org/model (or org/model@revision).", show_default=False),
    revision: str | None = typer.Option(
        None, "--revision", envvar=env("revision"),
        help="Branch, tag or commit to fetch (default: main); pin a commit for reproducible runs.",
    ),
    allow_pickle: bool = OPT_PICKLE,
    quiet: bool = typer.Option(False, "-q", "--quiet", envvar=env("quiet"), help="No progress or notes on stderr."),
) -> None:
    """Fetch a Hub model into the standard Hugging Face cache ahead of an offline run (e.g. a cron job).

    Fetches configs, tokenizer and safetensors weights only (pickle weights only with --allow-pickle, where a
    folder has no safetensors); prints the snapshot folder. Later runs find it offline (HF_HUB_OFFLINE=1 works).
    Uses HF_ENDPOINT, HF_HOME / HF_HUB_CACHE and HF_TOKEN as huggingface_hub does; a model already cached is not
    fetched again.
    """
    from embedcli.tasks.download import fetch

    def go() -> int:
        typer.echo(str(fetch(model, revision, allow_pickle=allow_pickle, quiet=quiet)))
        return 0

    run(go)
