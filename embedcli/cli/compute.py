"""The compute commands: embed, rerank, score, classify, token-embed, token-classify (one thin function each).

Task modules are imported inside each command, so `embedcli --help` does not load torch.
"""

from __future__ import annotations

import inspect
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
    MODEL,
    OPT_ACTIVATION,
    OPT_DEVICE,
    OPT_DTYPE,
    OPT_EMBED_CALIBRATION,
    OPT_EMBED_DIMENSIONS,
    OPT_EMBED_LONG_INPUTS,
    OPT_EMBED_NORMALIZE,
    OPT_EMBED_PRECISION,
    OPT_EMBED_PROMPT,
    OPT_EMBED_PROMPT_NAME,
    OPT_EMBED_QUANTIZE,
    OPT_FORMAT,
    OPT_ID_COL,
    OPT_KEEP,
    OPT_KEEP_SPECIAL,
    OPT_LOGIT_MEAN,
    OPT_LOGIT_SIGMA,
    OPT_LONG_NO_CHUNK,
    OPT_MAX_LENGTH,
    OPT_MAX_TOKENS,
    OPT_METHOD,
    OPT_MODEL,
    OPT_OUT_FORMAT,
    OPT_OUTPUT,
    OPT_OVERWRITE,
    OPT_PICKLE,
    OPT_QUIET,
    OPT_RAW_SCORES,
    OPT_REMOTE,
    OPT_RETURNED_IDS,
    OPT_STATS,
    OPT_STEP_TAG,
    OPT_STRIP,
    OPT_TEXT_COL,
    OPT_THREADS,
    OPT_TRUNC_SIDE,
    OPT_WEIGHTS,
    OUTPUT,
    PAIR_NOTE,
    cols,
    env,
    floats,
    ids,
    inputs_opt,
)
from embedcli.cli.run_options import OPT_ERRORS_FILE, OPT_MAX_ERRORS, on_error_option, unattended
from embedcli.run.flags import RunFlags


@app.command(
    epilog="Example: [bold]embedcli embed corpus.parquet -o vectors.parquet --keep-cols title[/bold]",
)
@unattended
def embed(
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
    normalize: bool | None = OPT_EMBED_NORMALIZE,
    strip: bool = OPT_STRIP,
    dimensions: int | None = OPT_EMBED_DIMENSIONS,
    prompt: str | None = OPT_EMBED_PROMPT,
    prompt_name: str | None = OPT_EMBED_PROMPT_NAME,
    long_inputs: Literal["truncate", "error", "chunk"] = OPT_EMBED_LONG_INPUTS,
    truncation_side: Literal["right", "left"] | None = OPT_TRUNC_SIDE,
    precision: Literal["float32", "float16", "int8", "uint8", "binary", "ubinary"] = OPT_EMBED_PRECISION,
    calibration: str | None = OPT_EMBED_CALIBRATION,
    quantize: bool = OPT_EMBED_QUANTIZE,
    outputs: str = typer.Option(
        "dense", "--outputs", envvar=env("outputs"), rich_help_panel=OUTPUT,
        help="BGE-M3 outputs: dense,sparse,colbert", show_default=False,
    ),
    output_format: str | None = OPT_OUT_FORMAT,
    quiet: bool = OPT_QUIET,
    stats: str | None = OPT_STATS,
    flags: RunFlags | None = None,
) -> None:
    """Embed each row's text into a vector: id, embedding (fixed_size_list<float32>\\[d]) and kept columns; static models (model2vec, StaticEmbedding) run in numpy, without torch."""
    from embedcli.run.source import InputOptions
    from embedcli.tasks.common import ModelChoice, OutputOptions
    from embedcli.tasks.embed import EmbedOptions, run_embed
    from embedcli.tasks.m3_rules import parse_outputs

    run(
        lambda: run_embed(
            InputOptions(inputs, text_col, id_col, cols(keep_cols), fmt),
            ModelChoice(model, device, dtype, max_length, allow_pickle, trust_remote_code, quantize, threads=threads),
            EmbedOptions(
                normalize=normalize, max_batch_tokens=max_batch_tokens, strip=strip, dimensions=dimensions,
                prompt=prompt, prompt_name=prompt_name, long_inputs=long_inputs, truncation_side=truncation_side,
                precision=precision, calibration=calibration, outputs=parse_outputs(outputs),
            ),
            OutputOptions(output, output_format, quiet, stats),
            flags,
        )
    )


@app.command(
    epilog="Example: [bold]embedcli rerank docs.jsonl --query 'interest rates rise' --top-n 5 "
    "--return-documents -o -[/bold]",
)
def rerank(
    inputs: list[str] = inputs_opt(),
    output: str = OPT_OUTPUT,
    query: str | None = typer.Option(
        None, "--query", envvar=env("query"), rich_help_panel=INPUT, help="One query text (its query_id is 'query')."
    ),
    queries: str | None = typer.Option(
        None, "--queries", envvar=env("queries"), rich_help_panel=INPUT,
        help="A file of queries (JSONL, Parquet, CSV/TSV, .txt) with ids; every query is ranked against every document.",
    ),
    query_col: str = typer.Option(
        "text", "--query-col", envvar=env("query-col"), rich_help_panel=INPUT, help="Column of --queries holding the query."
    ),
    query_id_col: str | None = typer.Option(
        None, "--query-id-col", envvar=env("query-id-col"), rich_help_panel=INPUT,
        help="Column of --queries holding its id (default: 'id' if present, else file:line).",
    ),
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
    method: Literal["auto", "cross-encoder", "cosine", "maxsim", "sparse", "m3"] = OPT_METHOD,
    weights: str | None = OPT_WEIGHTS,
    max_batch_tokens: int | None = OPT_MAX_TOKENS,
    max_length: int | None = OPT_MAX_LENGTH,
    long_inputs: Literal["truncate", "error"] = OPT_LONG_NO_CHUNK,
    truncation_side: Literal["right", "left"] | None = OPT_TRUNC_SIDE,
    top_n: int = typer.Option(
        0, "--top-n", envvar=env("top-n"), rich_help_panel=OUTPUT, help="Keep the N best documents per query (0: all)."
    ),
    return_documents: bool = typer.Option(
        False, "--return-documents", envvar=env("return-documents"), rich_help_panel=OUTPUT,
        help="Add each document's text as a 'text' column.",
    ),
    group_col: str | None = typer.Option(
        None, "--group-col", envvar=env("group-col"), rich_help_panel=INPUT,
        help="Grouped candidates: each row is scored only against the query whose id is in this column, e.g. "
        "`embedcli search v.parquet --queries q.jsonl --keep-cols text -o - | embedcli rerank - --queries q.jsonl "
        "--group-col query_id ...`.",
    ),
    raw_scores: bool = OPT_RAW_SCORES,
    classifier_from_tokens: str | None = OPT_CLASSIFIER_TOKENS,
    pair_template: str | None = OPT_PAIR_TEMPLATE,
    instruction: str | None = OPT_INSTRUCTION,
    reranker_preset: str | None = OPT_PRESET,
    output_format: str | None = OPT_OUT_FORMAT,
    overwrite: bool = OPT_OVERWRITE,
    on_error: str = on_error_option(rows="malformed line, null text, bad UTF-8"),
    errors_file: str | None = OPT_ERRORS_FILE,
    max_errors: int | None = OPT_MAX_ERRORS,
    quiet: bool = OPT_QUIET,
    stats: str | None = OPT_STATS,
) -> None:
    """Rank documents against a query (or many): query_id, id, score, rank\\[, text] and kept columns.

    Per query, rows are sorted by score descending with a stable sort (ties keep input order), rank 1 first. Documents are streamed; the ids (and texts with --return-documents) of the documents are held in memory and the output is written once all are scored.
    """
    from embedcli.run.source import InputOptions
    from embedcli.tasks.common import ModelChoice, OutputOptions
    from embedcli.tasks.pairs import RerankOptions, run_rerank

    run(
        lambda: run_rerank(
            InputOptions(inputs, text_col, id_col, cols(keep_cols), fmt),
            ModelChoice(
                model, device, dtype, max_length, allow_pickle, trust_remote_code,
                reranker=reranker_flags(classifier_from_tokens, pair_template, instruction, reranker_preset), threads=threads,
            ),
            RerankOptions(
                method=method, raw_scores=raw_scores, max_batch_tokens=max_batch_tokens, long_inputs=long_inputs,
                truncation_side=truncation_side, weights=floats(weights, "--weights"), query=query, queries=queries,
                query_col=query_col,
                query_id_col=query_id_col, top_n=top_n, return_documents=return_documents, group_col=group_col,
            ),
            OutputOptions(output, output_format, quiet, stats),
            RunFlags(overwrite=overwrite, on_error=on_error, errors_file=errors_file, max_errors=max_errors),
        )
    )


rerank.__doc__ = inspect.cleandoc(rerank.__doc__ or "") + "\n\n" + PAIR_NOTE


@app.command(
    epilog="Example: [bold]embedcli score pairs.jsonl --left-col question --right-col answer -o scores.parquet[/bold]",
)
@unattended
def score(
    inputs: list[str] = inputs_opt(),
    output: str = OPT_OUTPUT,
    left_col: str = typer.Option(
        "left", "--left-col", envvar=env("left-col"), rich_help_panel=INPUT, help="Column holding the left (query) text."
    ),
    right_col: str = typer.Option(
        "right", "--right-col", envvar=env("right-col"), rich_help_panel=INPUT,
        help="Column holding the right (document) text.",
    ),
    left: str | None = typer.Option(
        None, "--left", envvar=env("left"), rich_help_panel=INPUT,
        help="One left text scored against every row's --right-col (1:N) instead of --left-col (1:1).",
    ),
    model: str | None = OPT_MODEL,
    id_col: str | None = OPT_ID_COL,
    keep_cols: str = OPT_KEEP,
    fmt: str | None = OPT_FORMAT,
    device: str = OPT_DEVICE,
    threads: int | None = OPT_THREADS,
    dtype: str = OPT_DTYPE,
    allow_pickle: bool = OPT_PICKLE,
    trust_remote_code: bool = OPT_REMOTE,
    method: Literal["auto", "cross-encoder", "cosine", "maxsim", "sparse", "m3"] = OPT_METHOD,
    weights: str | None = OPT_WEIGHTS,
    max_batch_tokens: int | None = OPT_MAX_TOKENS,
    max_length: int | None = OPT_MAX_LENGTH,
    long_inputs: Literal["truncate", "error"] = OPT_LONG_NO_CHUNK,
    truncation_side: Literal["right", "left"] | None = OPT_TRUNC_SIDE,
    raw_scores: bool = OPT_RAW_SCORES,
    classifier_from_tokens: str | None = OPT_CLASSIFIER_TOKENS,
    pair_template: str | None = OPT_PAIR_TEMPLATE,
    instruction: str | None = OPT_INSTRUCTION,
    reranker_preset: str | None = OPT_PRESET,
    output_format: str | None = OPT_OUT_FORMAT,
    quiet: bool = OPT_QUIET,
    stats: str | None = OPT_STATS,
    flags: RunFlags | None = None,
) -> None:
    """Score each row's (left, right) pair, or one --left text against every right: id, score and kept columns."""
    from embedcli.run.source import InputOptions
    from embedcli.tasks.common import ModelChoice, OutputOptions
    from embedcli.tasks.pairs import ScoreOptions, run_score

    run(
        lambda: run_score(
            InputOptions(inputs, right_col if left is not None else left_col, id_col, cols(keep_cols), fmt),
            ModelChoice(
                model, device, dtype, max_length, allow_pickle, trust_remote_code,
                reranker=reranker_flags(classifier_from_tokens, pair_template, instruction, reranker_preset), threads=threads,
            ),
            ScoreOptions(
                method=method, raw_scores=raw_scores, max_batch_tokens=max_batch_tokens, long_inputs=long_inputs,
                truncation_side=truncation_side, left_col=left_col, right_col=right_col, left=left,
                weights=floats(weights, "--weights"),
            ),
            OutputOptions(output, output_format, quiet, stats),
            flags,
        )
    )


score.__doc__ = inspect.cleandoc(score.__doc__ or "") + "\n\n" + PAIR_NOTE


@app.command(
    epilog="Example: [bold]embedcli classify news.jsonl -m ./topic-classifier --top-k 2 --all-scores "
    "-o labels.parquet[/bold]\n\nText pairs (NLI): [bold]embedcli classify pairs.jsonl -m "
    "cross-encoder/nli-deberta-v3-base --text-col premise --pair-col hypothesis --activation softmax "
    "--all-scores -o nli.parquet[/bold]",
)
@unattended
def classify(
    inputs: list[str] = inputs_opt(),
    output: str = OPT_OUTPUT,
    model: str | None = OPT_MODEL,
    text_col: str = OPT_TEXT_COL,
    pair_col: str | None = typer.Option(
        None, "--pair-col", envvar=env("pair-col"), rich_help_panel=INPUT,
        help="Classify text pairs: this column holds each row's second text (--text-col the first), tokenized "
        "as CrossEncoder tokenizes a pair (longest_first truncation), e.g. an NLI premise and hypothesis. "
        "A null second text is a bad row (--on-error).",
    ),
    id_col: str | None = OPT_ID_COL,
    keep_cols: str = OPT_KEEP,
    fmt: str | None = OPT_FORMAT,
    strip: bool = OPT_STRIP,
    device: str = OPT_DEVICE,
    threads: int | None = OPT_THREADS,
    dtype: str = OPT_DTYPE,
    allow_pickle: bool = OPT_PICKLE,
    trust_remote_code: bool = OPT_REMOTE,
    activation: Literal["auto", "softmax", "sigmoid", "none"] = OPT_ACTIVATION,
    logit_mean: float | None = OPT_LOGIT_MEAN,
    logit_sigma: float | None = OPT_LOGIT_SIGMA,
    max_batch_tokens: int | None = OPT_MAX_TOKENS,
    max_length: int | None = OPT_MAX_LENGTH,
    long_inputs: Literal["truncate", "error"] = OPT_LONG_NO_CHUNK,
    truncation_side: Literal["right", "left"] | None = OPT_TRUNC_SIDE,
    top_k: int = typer.Option(
        1, "--top-k", envvar=env("top-k"), rich_help_panel=OUTPUT,
        help="With K > 1, add top_labels and top_scores: the K best labels, best first (ties in label order).",
    ),
    all_scores: bool = typer.Option(
        False, "--all-scores", envvar=env("all-scores"), rich_help_panel=OUTPUT,
        help="Add 'scores': every label's probability in label-id order (names in the output metadata).",
    ),
    classifier_from_tokens: str | None = OPT_CLASSIFIER_TOKENS,
    output_format: str | None = OPT_OUT_FORMAT,
    quiet: bool = OPT_QUIET,
    stats: str | None = OPT_STATS,
    flags: RunFlags | None = None,
) -> None:
    """Classify each row: id, label (the argmax), score (its probability) and kept columns.

    A one-label model's label is that label whatever the score (vLLM); a multi-label model scores each label independently (sigmoid).

    With --pair-col each row is a text pair, scored as sentence-transformers' CrossEncoder.predict scores it: the checkpoint's activation (sentence-transformers 6 saves Identity for more than one label: raw logits), or --activation softmax for predict(apply_softmax=True).
    """
    from embedcli.run.source import InputOptions
    from embedcli.tasks.classify import ClassifyOptions, run_classify
    from embedcli.tasks.common import ModelChoice, OutputOptions

    run(
        lambda: run_classify(
            InputOptions(inputs, text_col, id_col, cols(keep_cols), fmt),
            ModelChoice(
                model, device, dtype, max_length, allow_pickle, trust_remote_code,
                reranker=reranker_flags(classifier_from_tokens, None, None, None), threads=threads,
            ),
            ClassifyOptions(
                activation=activation, top_k=top_k, all_scores=all_scores, logit_mean=logit_mean,
                logit_sigma=logit_sigma, max_batch_tokens=max_batch_tokens, long_inputs=long_inputs,
                truncation_side=truncation_side, strip=strip, pair_col=pair_col,
            ),
            OutputOptions(output, output_format, quiet, stats),
            flags,
        )
    )


@app.command(
    "token-embed",
    epilog="Example: [bold]embedcli token-embed docs.jsonl -o token-vectors.parquet[/bold]; a ColBERT index: "
    "[bold]embedcli token-embed docs.jsonl -m ./colbertv2.0 --role document -o doc-vectors.parquet[/bold]",
)
@unattended
def token_embed(
    inputs: list[str] = inputs_opt(),
    output: str = OPT_OUTPUT,
    model: str | None = OPT_MODEL,
    text_col: str = OPT_TEXT_COL,
    id_col: str | None = OPT_ID_COL,
    keep_cols: str = OPT_KEEP,
    fmt: str | None = OPT_FORMAT,
    strip: bool = OPT_STRIP,
    device: str = OPT_DEVICE,
    threads: int | None = OPT_THREADS,
    dtype: str = OPT_DTYPE,
    allow_pickle: bool = OPT_PICKLE,
    trust_remote_code: bool = OPT_REMOTE,
    dimensions: int | None = typer.Option(
        None, "--dimensions", envvar=env("dimensions"), rich_help_panel=MODEL,
        help="Matryoshka: keep the first N dims of each token vector, then normalize (Matryoshka models only).",
    ),
    step_tag_id: int | None = OPT_STEP_TAG,
    max_batch_tokens: int | None = OPT_MAX_TOKENS,
    max_length: int | None = OPT_MAX_LENGTH,
    long_inputs: Literal["truncate", "error"] = OPT_LONG_NO_CHUNK,
    truncation_side: Literal["right", "left"] | None = OPT_TRUNC_SIDE,
    normalize: bool | None = typer.Option(
        None, "--normalize/--no-normalize", envvar=env("normalize"), rich_help_panel=OUTPUT,
        help="L2-normalize each token vector (default: as the model says).", show_default=False,
    ),
    keep_special: bool = OPT_KEEP_SPECIAL,
    role: Literal["auto", "query", "document"] = typer.Option(
        "auto", "--role", envvar=env("role"), rich_help_panel=MODEL,
        help="Late-interaction (ColBERT) models: encode each text as a query (marker, [MASK] expansion to the "
        "query length) or a document (marker, cut to the document length, punctuation skiplist dropped); "
        "auto: document. Other models have no roles.",
    ),
    output_format: str | None = OPT_OUT_FORMAT,
    quiet: bool = OPT_QUIET,
    stats: str | None = OPT_STATS,
    flags: RunFlags | None = None,
) -> None:
    """Per-token vectors of each row: id, token_ids (list<int32>), embeddings (list<fixed_size_list<float32>\\[d]>).

    A ColBERT model (Stanford or PyLate layout) gives its own query or document vectors (`--role`), as
    sentence-transformers' MultiVectorEncoder.encode_query / encode_document."""
    from embedcli.run.source import InputOptions
    from embedcli.tasks.common import ModelChoice, OutputOptions
    from embedcli.tasks.tokens import TokenOptions, run_token_embed

    run(
        lambda: run_token_embed(
            InputOptions(inputs, text_col, id_col, cols(keep_cols), fmt),
            ModelChoice(model, device, dtype, max_length, allow_pickle, trust_remote_code, threads=threads),
            TokenOptions(
                keep_special=keep_special, step_tag_id=step_tag_id,
                dimensions=dimensions, normalize=normalize, max_batch_tokens=max_batch_tokens,
                long_inputs=long_inputs, truncation_side=truncation_side, strip=strip, role=role,
            ),
            OutputOptions(output, output_format, quiet, stats),
            flags,
        )
    )


@app.command(
    "token-classify",
    epilog="Example: [bold]embedcli token-classify docs.jsonl -m ./ner-model --all-scores -o tags.parquet[/bold]",
)
@unattended
def token_classify(
    inputs: list[str] = inputs_opt(),
    output: str = OPT_OUTPUT,
    model: str | None = OPT_MODEL,
    text_col: str = OPT_TEXT_COL,
    id_col: str | None = OPT_ID_COL,
    keep_cols: str = OPT_KEEP,
    fmt: str | None = OPT_FORMAT,
    strip: bool = OPT_STRIP,
    device: str = OPT_DEVICE,
    threads: int | None = OPT_THREADS,
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
    truncation_side: Literal["right", "left"] | None = OPT_TRUNC_SIDE,
    keep_special: bool = OPT_KEEP_SPECIAL,
    all_scores: bool = typer.Option(
        False, "--all-scores", envvar=env("all-scores"), rich_help_panel=OUTPUT,
        help="Add 'probs': every label's probability per token (list<fixed_size_list<float32>\\[labels]>).",
    ),
    output_format: str | None = OPT_OUT_FORMAT,
    quiet: bool = OPT_QUIET,
    stats: str | None = OPT_STATS,
    flags: RunFlags | None = None,
) -> None:
    """Label each token: id, token_ids, labels (list<string>), scores (list<float32>) and kept columns.

    With step pooling (--step-tag-id) only the step-tag tokens are kept, e.g. the per-step scores of a process reward model; --returned-token-ids keeps only those label columns.
    """
    from embedcli.run.source import InputOptions
    from embedcli.tasks.common import ModelChoice, OutputOptions
    from embedcli.tasks.tokens import TokenOptions, run_token_classify

    run(
        lambda: run_token_classify(
            InputOptions(inputs, text_col, id_col, cols(keep_cols), fmt),
            ModelChoice(model, device, dtype, max_length, allow_pickle, trust_remote_code, threads=threads),
            TokenOptions(
                keep_special=keep_special, step_tag_id=step_tag_id, returned_token_ids=ids(returned_token_ids),
                activation=activation, all_scores=all_scores, logit_mean=logit_mean, logit_sigma=logit_sigma,
                max_batch_tokens=max_batch_tokens, long_inputs=long_inputs, truncation_side=truncation_side,
                strip=strip,
            ),
            OutputOptions(output, output_format, quiet, stats),
            flags,
        )
    )
