"""The LLM-reranker and sparse (SPLADE) families on the command line: the reranker flags that score, rerank,
classify and info share, and the `sparse-embed` command."""

from __future__ import annotations

from typing import Literal

import typer

from embedcli.cli.app import app, run
from embedcli.cli.options import (
    MODEL,
    OPT_DEVICE,
    OPT_DTYPE,
    OPT_EMBED_PROMPT,
    OPT_EMBED_PROMPT_NAME,
    OPT_FORMAT,
    OPT_ID_COL,
    OPT_KEEP,
    OPT_LONG_NO_CHUNK,
    OPT_MAX_LENGTH,
    OPT_MAX_TOKENS,
    OPT_MODEL,
    OPT_OUT_FORMAT,
    OPT_OUTPUT,
    OPT_PICKLE,
    OPT_QUIET,
    OPT_REMOTE,
    OPT_STATS,
    OPT_STRIP,
    OPT_TEXT_COL,
    OPT_THREADS,
    OPT_TRUNC_SIDE,
    OUTPUT,
    cols,
    env,
    inputs_opt,
)
from embedcli.cli.run_options import unattended
from embedcli.models.llm_reranker import reranker_flags as reranker_flags
from embedcli.run.flags import RunFlags

OPT_CLASSIFIER_TOKENS = typer.Option(
    None, "--classifier-from-tokens", envvar=env("classifier-from-tokens"), rich_help_panel=MODEL,
    help="Score with a causal LM's logits for these vocabulary tokens at the last position (vLLM's conversion): "
    "two tokens FALSE,TRUE (e.g. no,yes) give sigmoid(logit_true - logit_false); one token gives "
    "sigmoid(logit). Only the LM head's rows for them are computed. Default: the checkpoint's LogitScore module.",
)
OPT_PAIR_TEMPLATE = typer.Option(
    None, "--pair-template", envvar=env("pair-template"), rich_help_panel=MODEL,
    help="LLM reranker prompt with {query}, {document} and optional {instruction}; a pair over --max-length "
    "has its document cut so the template's text after {document} always stays. Default: the preset's, else "
    "the checkpoint's (sentence-transformers 6 with the message modality: the tokenizer's chat template over "
    "messages [query, document]), else the tokenizer's text pair (query tokens then document tokens).",
)
OPT_INSTRUCTION = typer.Option(
    None, "--instruction", envvar=env("instruction"), rich_help_panel=MODEL,
    help="Text for the template's {instruction} (default: the preset's, else empty).",
)
OPT_PRESET = typer.Option(
    None, "--reranker-preset", envvar=env("reranker-preset"), rich_help_panel=MODEL,
    help="A named LLM reranker recipe: qwen3-reranker (tokens no,yes; Qwen3-Reranker's prompt and default "
    "instruction).",
)


@app.command(
    "sparse-embed",
    epilog="Example: [bold]embedcli sparse-embed corpus.parquet -m ./splade -o sparse.parquet --with-tokens[/bold]",
)
@unattended
def sparse_embed(
    inputs: list[str] = inputs_opt(),
    output: str = OPT_OUTPUT,
    model: str | None = OPT_MODEL,
    text_col: str = OPT_TEXT_COL,
    id_col: str | None = OPT_ID_COL,
    keep_cols: str = OPT_KEEP,
    fmt: str | None = OPT_FORMAT,
    device: str = OPT_DEVICE,
    threads: int | None = OPT_THREADS,
    dtype: str = OPT_DTYPE,
    allow_pickle: bool = OPT_PICKLE,
    trust_remote_code: bool = OPT_REMOTE,
    max_batch_tokens: int | None = OPT_MAX_TOKENS,
    max_length: int | None = OPT_MAX_LENGTH,
    long_inputs: Literal["truncate", "error"] = OPT_LONG_NO_CHUNK,
    truncation_side: Literal["right", "left"] | None = OPT_TRUNC_SIDE,
    strip: bool = OPT_STRIP,
    prompt: str | None = OPT_EMBED_PROMPT,
    prompt_name: str | None = OPT_EMBED_PROMPT_NAME,
    top_k: int | None = typer.Option(
        None, "--sparse-top-k", envvar=env("sparse-top-k"), rich_help_panel=OUTPUT,
        help="Keep each vector's K largest entries (sentence-transformers' max_active_dims; default: the "
        "model's, else all non-zero entries).",
    ),
    with_tokens: bool = typer.Option(
        False, "--with-tokens", envvar=env("with-tokens"), rich_help_panel=OUTPUT,
        help="Add a 'tokens' column: the vocabulary entry of each index.",
    ),
    output_format: str | None = OPT_OUT_FORMAT,
    quiet: bool = OPT_QUIET,
    stats: str | None = OPT_STATS,
    flags: RunFlags | None = None,
) -> None:
    """SPLADE sparse vectors of each row: id, indices (list<int32>, sorted), values (list<float32>)\\[, tokens]
    and kept columns. The masked-LM head runs over at most 128 tokens at a time, so the [tokens, vocab]
    logits of a whole batch are never held at once. --precision does not apply (values stay float32)."""
    from embedcli.run.source import InputOptions
    from embedcli.tasks.common import ModelChoice, OutputOptions
    from embedcli.tasks.sparse import SparseOptions, run_sparse_embed

    run(
        lambda: run_sparse_embed(
            InputOptions(inputs, text_col, id_col, cols(keep_cols), fmt),
            ModelChoice(model, device, dtype, max_length, allow_pickle, trust_remote_code, threads=threads),
            SparseOptions(
                top_k=top_k, with_tokens=with_tokens, max_batch_tokens=max_batch_tokens, long_inputs=long_inputs,
                truncation_side=truncation_side, strip=strip, prompt=prompt, prompt_name=prompt_name,
            ),
            OutputOptions(output, output_format, quiet, stats),
            flags,
        )
    )
