"""`embedcli run-batch`: an OpenAI Batch file of vLLM pooling requests in, one response line per request out."""

from __future__ import annotations

from typing import Literal

import typer

from embedcli.cli.app import app, run
from embedcli.cli.families import (
    OPT_CLASSIFIER_TOKENS,
    OPT_INSTRUCTION,
    OPT_PAIR_TEMPLATE,
    OPT_PRESET,
    reranker_flags,
)
from embedcli.cli.options import (
    INPUT,
    OPT_DEVICE,
    OPT_DTYPE,
    OPT_EMBED_QUANTIZE,
    OPT_MAX_LENGTH,
    OPT_MAX_TOKENS,
    OPT_METHOD,
    OPT_MODEL,
    OPT_PICKLE,
    OPT_QUIET,
    OPT_REMOTE,
    OPT_STATS,
    OPT_THREADS,
    OPT_TRUNC_SIDE,
    OUTPUT,
    env,
)
from embedcli.cli.run_options import unattended
from embedcli.run.flags import RunFlags

EXAMPLE = (
    "Example (the packaged model):\n\n"
    "[bold]echo '{\"custom_id\": \"a\", \"method\": \"POST\", \"url\": \"/v1/embeddings\", "
    "\"body\": {\"input\": \"hello\"}}' > requests.jsonl[/bold]\n\n"
    "[bold]embedcli run-batch requests.jsonl -o results.jsonl[/bold]"
)


@app.command("run-batch", epilog=EXAMPLE)
@unattended(on_error="skip")
def run_batch(
    requests: str = typer.Argument(..., help="The request file: one OpenAI Batch request object per line.",
                                   rich_help_panel=INPUT),
    output: str = typer.Option(
        ..., "-o", "--output", envvar=env("output"), rich_help_panel=OUTPUT,
        help="The response file (JSONL, one line per request line, in input order); - writes to stdout.",
    ),
    model: str | None = OPT_MODEL,
    device: str = OPT_DEVICE,
    threads: int | None = OPT_THREADS,
    dtype: str = OPT_DTYPE,
    allow_pickle: bool = OPT_PICKLE,
    trust_remote_code: bool = OPT_REMOTE,
    quantize: bool = OPT_EMBED_QUANTIZE,
    method: Literal["auto", "cross-encoder", "cosine", "maxsim", "sparse"] = OPT_METHOD,
    max_batch_tokens: int | None = OPT_MAX_TOKENS,
    max_length: int | None = OPT_MAX_LENGTH,
    truncation_side: Literal["right", "left"] | None = OPT_TRUNC_SIDE,
    classifier_from_tokens: str | None = OPT_CLASSIFIER_TOKENS,
    pair_template: str | None = OPT_PAIR_TEMPLATE,
    instruction: str | None = OPT_INSTRUCTION,
    reranker_preset: str | None = OPT_PRESET,
    calibration: str | None = typer.Option(
        None, "--calibration", envvar=env("calibration"), rich_help_panel=OUTPUT,
        help="/v2/embed int8/uint8: ranges from this file (as embed --calibration) instead of each request's "
        "own texts.",
    ),
    quiet: bool = OPT_QUIET,
    stats: str | None = OPT_STATS,
    flags: RunFlags | None = None,
) -> None:
    """Run an OpenAI Batch file of vLLM pooling requests offline: /v1/embeddings, /v2/embed, /score, /v1/score,
    /rerank, /v1/rerank, /v2/rerank, /classify and /pooling, as vLLM's run-batch answers them.

    Requests are flattened into texts and pairs, packed together across requests under --max-batch-tokens,
    and answered in input order. A bad line (malformed JSON, unknown route, missing or wrong field, another
    model, a duplicate custom_id) gets a status 400 line with an error object naming the line and field; the
    run goes on and exits 3 (--on-error fail: stops at the first, exit 1). Resume after a kill, --shard K/N,
    progress and --stats work as for every command.

    Fields vLLM accepts that embedcli cannot honour are 400 lines too, never other numbers: chat `messages`,
    multimodal inputs, `add_special_tokens: false`, and `embed_dtype` other than float32 / float16
    (bfloat16, fp8).
    """
    from embedcli.tasks.batch import BatchOptions
    from embedcli.tasks.batch import run_batch as run_batch_task
    from embedcli.tasks.common import ModelChoice, OutputOptions

    run(
        lambda: run_batch_task(
            requests,
            ModelChoice(model, device, dtype, max_length, allow_pickle, trust_remote_code, quantize,
                        reranker=reranker_flags(classifier_from_tokens, pair_template, instruction, reranker_preset), threads=threads),
            BatchOptions(method=method, max_batch_tokens=max_batch_tokens, truncation_side=truncation_side,
                         calibration=calibration),
            OutputOptions(output, None, quiet, stats),
            flags,
        )
    )
