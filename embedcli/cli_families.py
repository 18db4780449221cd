"""CLI pieces of the LLM-reranker and sparse (SPLADE) families: the reranker flags shared by score, rerank,
classify and info, and the `sparse-embed` command (registered on the app by `register`)."""

from __future__ import annotations

from typing import Any, Literal

import typer

MODEL = "Model"

OPT_CLASSIFIER_TOKENS = typer.Option(
    None, "--classifier-from-tokens", envvar="EMBEDCLI_CLASSIFIER_FROM_TOKENS", rich_help_panel=MODEL,
    help="Score with a causal LM's logits for these vocabulary tokens at the last position (vLLM's conversion): "
    "two tokens FALSE,TRUE (e.g. no,yes) give sigmoid(logit_true - logit_false); one token gives "
    "sigmoid(logit). Only the LM head's rows for them are computed. Default: the checkpoint's LogitScore module.",
)
OPT_PAIR_TEMPLATE = typer.Option(
    None, "--pair-template", envvar="EMBEDCLI_PAIR_TEMPLATE", rich_help_panel=MODEL,
    help="LLM reranker prompt with {query}, {document} and optional {instruction}; a pair over --max-length "
    "has its document cut so the template's text after {document} always stays. Default: the preset's, else "
    "the checkpoint's (sentence-transformers 6 with the message modality: the tokenizer's chat template over "
    "messages [query, document]), else the tokenizer's text pair (query tokens then document tokens).",
)
OPT_INSTRUCTION = typer.Option(
    None, "--instruction", envvar="EMBEDCLI_INSTRUCTION", rich_help_panel=MODEL,
    help="Text for the template's {instruction} (default: the preset's, else empty).",
)
OPT_PRESET = typer.Option(
    None, "--reranker-preset", envvar="EMBEDCLI_RERANKER_PRESET", rich_help_panel=MODEL,
    help="A named LLM reranker recipe: qwen3-reranker (tokens no,yes; Qwen3-Reranker's prompt and default "
    "instruction).",
)


def reranker_flags(
    tokens: str | None, template: str | None, instruction: str | None, preset: str | None
) -> Any:
    """The `RerankerFlags` of the command line (None when no reranker flag was given)."""
    from embedcli.jobs import UsageError
    from embedcli.models.llm_reranker import PRESETS, RerankerFlags, check_template, parse_tokens

    if preset is not None and preset not in PRESETS:
        raise UsageError(f"--reranker-preset {preset!r}: choose one of {', '.join(PRESETS)}")
    parsed = parse_tokens(tokens)
    if tokens is not None and (not parsed or len(parsed) > 2):
        raise UsageError(f"--classifier-from-tokens {tokens!r}: give one token or two, FALSE,TRUE (e.g. no,yes)")
    if template is not None:
        try:
            check_template(template, "--pair-template")
        except ValueError as e:
            raise UsageError(str(e)) from None
    flags = RerankerFlags(parsed, template, instruction, preset)
    if not flags.given:
        if instruction is not None:
            raise UsageError("--instruction fills a pair template: give --pair-template or --reranker-preset too")
        return None
    return flags


def register(app: typer.Typer) -> None:
    """Add `sparse-embed` to `app` (called once, after the shared options of `embedcli.cli` exist)."""
    from embedcli import cli as c
    from embedcli.run_options import unattended

    @app.command(
        "sparse-embed",
        epilog="Example: [bold]embedcli sparse-embed corpus.parquet -m ./splade -o sparse.parquet --with-tokens[/bold]",
    )
    @unattended
    def sparse_embed(
        inputs: list[str] = c._inputs_opt(),
        output: str = c.OPT_OUTPUT,
        model: str | None = c.OPT_MODEL,
        text_col: str = c.OPT_TEXT_COL,
        id_col: str | None = c.OPT_ID_COL,
        keep_cols: str = c.OPT_KEEP,
        fmt: str | None = c.OPT_FORMAT,
        device: str = c.OPT_DEVICE,
        dtype: str = c.OPT_DTYPE,
        allow_pickle: bool = c.OPT_PICKLE,
        trust_remote_code: bool = c.OPT_REMOTE,
        max_batch_tokens: int | None = c.OPT_MAX_TOKENS,
        max_length: int | None = c.OPT_MAX_LENGTH,
        long_inputs: Literal["truncate", "error"] = c.OPT_LONG_NO_CHUNK,
        truncation_side: Literal["right", "left"] = c.OPT_TRUNC_SIDE,
        strip: bool = c.OPT_STRIP,
        prompt: str | None = typer.Option(
            None, "--prompt", envvar="EMBEDCLI_PROMPT", rich_help_panel=MODEL, help="Text prepended to every input."
        ),
        prompt_name: str | None = typer.Option(
            None, "--prompt-name", envvar="EMBEDCLI_PROMPT_NAME", rich_help_panel=MODEL,
            help="A prompt from the model's config_sentence_transformers.json (e.g. query, document).",
        ),
        top_k: int | None = typer.Option(
            None, "--sparse-top-k", envvar="EMBEDCLI_SPARSE_TOP_K", rich_help_panel="Output",
            help="Keep each vector's K largest entries (sentence-transformers' max_active_dims; default: the "
            "model's, else all non-zero entries).",
        ),
        with_tokens: bool = typer.Option(
            False, "--with-tokens", envvar="EMBEDCLI_WITH_TOKENS", rich_help_panel="Output",
            help="Add a 'tokens' column: the vocabulary entry of each index.",
        ),
        output_format: str | None = c.OPT_OUT_FORMAT,
        quiet: bool = c.OPT_QUIET,
        stats: str | None = c.OPT_STATS,
    ) -> None:
        """SPLADE sparse vectors of each row: id, indices (list<int32>, sorted), values (list<float32>)\\[, tokens]
        and kept columns. The masked-LM head runs over at most 128 tokens at a time, so the [tokens, vocab]
        logits of a whole batch are never held at once. --precision does not apply (values stay float32)."""
        from embedcli.jobs import InputOptions, ModelChoice, OutputOptions
        from embedcli.sparse_jobs import SparseOptions, run_sparse_embed

        c._run(
            lambda: run_sparse_embed(
                InputOptions(inputs, text_col, id_col, c._cols(keep_cols), fmt),
                ModelChoice(model, device, dtype, max_length, allow_pickle, trust_remote_code),
                SparseOptions(
                    top_k=top_k, with_tokens=with_tokens, max_batch_tokens=max_batch_tokens, long_inputs=long_inputs,
                    truncation_side=truncation_side, strip=strip, prompt=prompt, prompt_name=prompt_name,
                ),
                OutputOptions(output, output_format, quiet, stats),
            )
        )
