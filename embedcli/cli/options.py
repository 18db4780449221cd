"""The options of the compute commands, shared: one typer.Option per flag, with its panel and env var."""

from __future__ import annotations

import math
from typing import Any

import typer

from embedcli.errors import UsageError

INPUT, MODEL, BATCHING, OUTPUT, PROGRESS = "Input", "Model", "Batching", "Output", "Progress"


def env(flag: str) -> str:
    """The environment variable of a flag: EMBEDCLI_ and its name."""
    return "EMBEDCLI_" + flag.upper().replace("-", "_")


# Options shared by compute commands -------------------------------------------------------------------
def inputs_opt() -> Any:
    """The INPUTS argument."""
    return typer.Argument(
        ..., help="Files, globs or s3:// gs:// hf:// URLs (JSONL, Parquet, CSV/TSV, .txt); - for stdin.", show_default=False
    )


OPT_TEXT_COL = typer.Option("text", "--text-col", envvar=env("text-col"), rich_help_panel=INPUT, help="Column holding the text.")
OPT_ID_COL = typer.Option(
    None, "--id-col", envvar=env("id-col"), rich_help_panel=INPUT,
    help="Column holding the row id (default: 'id' if present, else file:line / file:row).",
)
OPT_KEEP = typer.Option(
    "", "--keep-cols", envvar=env("keep-cols"), rich_help_panel=INPUT, help="Comma-separated input columns to carry to the output."
)
OPT_FORMAT = typer.Option(
    None, "--format", envvar=env("format"), rich_help_panel=INPUT, help="Input format: jsonl, parquet, csv, tsv, txt (default: from the extension)."
)
OPT_MODEL = typer.Option(
    None, "-m", "--model", envvar=env("model"), rich_help_panel=MODEL,
    help="Local model folder or Hub id (org/model[@revision]): a folder, the hub cache or an installed package "
    "first; else downloaded (safetensors only) unless HF_HUB_OFFLINE is set. Default: sentence-transformers/all-MiniLM-L6-v2.",
)
OPT_DEVICE = typer.Option("auto", "--device", envvar=env("device"), rich_help_panel=MODEL, help="auto, cpu, cuda or cuda:N.")
OPT_THREADS = typer.Option(
    None, "--threads", envvar=env("threads"), rich_help_panel=MODEL, metavar="N",
    help="Torch and tokenizer CPU threads, e.g. --threads 1 (EMBEDCLI_THREADS=1) beside other work. Default: one "
    "per core, waiting passively. Last bits may differ by count; in no config hash (README: Threads).",
)
OPT_DTYPE = typer.Option(
    "auto", "--dtype", envvar=env("dtype"), rich_help_panel=MODEL,
    help="auto, float32, bfloat16, float16 (auto: bfloat16 on CUDA and on CPUs with native bf16 matmuls (AVX-512 BF16/AMX) where the model passes its parity probe against float32 (decided once per model and cached; `embedcli info` shows it), else float32). Use float32 for bit-level parity with sentence-transformers.",
)
OPT_PICKLE = typer.Option(
    False, "--allow-pickle", envvar=env("allow-pickle"), rich_help_panel=MODEL, help="Allow loading pickle (.bin) weights; off: safetensors only."
)
OPT_REMOTE = typer.Option(
    False, "--trust-remote-code", envvar=env("trust-remote-code"), rich_help_panel=MODEL, help="Allow a model's own Python code (off by default)."
)
OPT_MAX_TOKENS = typer.Option(
    None, "--max-batch-tokens", envvar=env("max-batch-tokens"), rich_help_panel=BATCHING,
    help="Token budget of one packed forward (default: 2048 on CPU, 65536 on CUDA). A longer input runs "
    "in slices with a KV cache on a decoder (sliced_rows in --stats), alone in its own forward on an "
    "encoder (solo_rows).",
)
OPT_MAX_LENGTH = typer.Option(
    None, "--max-length", envvar=env("max-length"), rich_help_panel=BATCHING, help="Truncate inputs to this many tokens (default: the model's max length)."
)
OPT_OUTPUT = typer.Option(
    ..., "-o", "--output", envvar=env("output"), rich_help_panel=OUTPUT,
    help="File or s3:// gs:// object: .parquet (default), .jsonl, .npy; - is JSONL on stdout (embed: or "
    "lancedb://D/T).",
)
OPT_OUT_FORMAT = typer.Option(
    None, "--output-format", envvar=env("output-format"), rich_help_panel=OUTPUT, help="parquet, jsonl or npy (default: from the extension)."
)
OPT_QUIET = typer.Option(False, "-q", "--quiet", envvar=env("quiet"), rich_help_panel=PROGRESS, help="No progress bar or notes on stderr.")
OPT_OVERWRITE = typer.Option(
    False, "--overwrite", envvar=env("overwrite"), rich_help_panel=OUTPUT,
    help="Replace an output made otherwise (another config or command, or a file embedcli did not write); "
    "without it such a run stops with exit 2.",
)
OPT_STATS = typer.Option(
    None, "--stats", envvar=env("stats"), rich_help_panel=PROGRESS,
    help="Write a JSON report (rows, tokens, seconds per phase, peak memory) to this file.",
)


def cols(value: str) -> list[str]:
    """A comma-separated list."""
    return [c.strip() for c in value.split(",") if c.strip()]


# Options of the task commands (rerank, score, classify, token-embed, token-classify) ----------------------
OPT_TRUNC_SIDE = typer.Option(
    None, "--truncation-side", envvar=env("truncation-side"), rich_help_panel=BATCHING,
    help="Which end of an over-long input is cut: right keeps the start, left keeps the end (default: the "
    "model's tokenizer's truncation_side; right when it names none).",
    show_default=False,
)
OPT_LONG_NO_CHUNK = typer.Option(
    "truncate", "--long-inputs", envvar=env("long-inputs"), rich_help_panel=BATCHING,
    help="Inputs longer than the max length: truncate (cut to --max-length; the count goes to stderr and "
    "--stats) or error (exit 1 naming the row, its file/line and id, and its token count).",
)
OPT_STRIP = typer.Option(
    False, "--strip/--no-strip", envvar=env("strip"), rich_help_panel=INPUT,
    help="Strip surrounding whitespace before tokenizing (off by default: whitespace is kept, as "
    "sentence-transformers >= 5.4, vLLM and TEI do; --strip restores the old sentence-transformers rule). "
    "A text with no tokens (empty, or whitespace-only on a tokenizer that adds no special tokens) is not a bad "
    "row: it gets sentence-transformers' value, the zero pooled vector through the model's head (Dense, "
    "normalize: a zero vector stays zero).",
)
OPT_ACTIVATION = typer.Option(
    "auto", "--activation", envvar=env("activation"), rich_help_panel=MODEL,
    help="Activation on the (calibrated) logits. auto: the model config's problem_type (regression: none, "
    "single-label: softmax, multi-label: sigmoid per label), else its sentence-transformers activation_fn, "
    "else sigmoid for one label and softmax for more (vLLM's rule).",
)
OPT_LOGIT_MEAN = typer.Option(
    None, "--logit-mean", envvar=env("logit-mean"), rich_help_panel=MODEL,
    help="Calibration: subtract from the logits before the activation (default: config.json's logit_mean, "
    "or its legacy logit_bias, else none).",
)
OPT_LOGIT_SIGMA = typer.Option(
    None, "--logit-sigma", envvar=env("logit-sigma"), rich_help_panel=MODEL,
    help="Calibration: divide the logits by this positive number after --logit-mean (default: config.json's "
    "logit_sigma, or 1/logit_scale, else none); act((logit - mean) / sigma).",
)
OPT_KEEP_SPECIAL = typer.Option(
    False, "--keep-special", envvar=env("keep-special"), rich_help_panel=OUTPUT,
    help="Keep the tokens the tokenizer adds (CLS/SEP/BOS/EOS/PAD); dropped by default.",
)
OPT_STEP_TAG = typer.Option(
    None, "--step-tag-id", envvar=env("step-tag-id"), rich_help_panel=MODEL,
    help="Step pooling (process reward models): keep only the tokens whose id is this one.",
)
OPT_RETURNED_IDS = typer.Option(
    "", "--returned-token-ids", envvar=env("returned-token-ids"), rich_help_panel=MODEL,
    help="Step pooling: comma-separated label ids (output columns) to keep, e.g. 0,1; the activation then runs "
    "over the kept columns only (vLLM).",
)
OPT_METHOD = typer.Option(
    "auto", "--method", envvar=env("method"), rich_help_panel=MODEL,
    help="How pairs are scored. auto: cross-encoder for a one-label classifier or an LLM reranker, cosine for "
    "an embedding model, sparse for a SPLADE model, maxsim for a ColBERT model; maxsim: late interaction over "
    "per-token vectors (a ColBERT model's own query and document vectors; any other model's hidden states); "
    "sparse: the dot product of sparse vectors (a BGE-M3 model: its lexical weights); m3: BGE-M3's "
    "dense, sparse and colbert scores combined as FlagEmbedding's compute_score (see --weights).",
)
OPT_WEIGHTS = typer.Option(
    None, "--weights", envvar=env("weights"), rich_help_panel=MODEL,
    help="--method m3: DENSE,SPARSE,COLBERT weights, e.g. 0.4,0.2,0.4; score = (w_d*dense + w_s*sparse + "
    "w_c*colbert) / (w_d + w_s + w_c), FlagEmbedding's colbert+sparse+dense (default 1,1,1; 1,0,0 is dense "
    "alone). colbert is the MaxSim divided by the query's token count.",
)
OPT_RAW_SCORES = typer.Option(
    False, "--raw-scores", envvar=env("raw-scores"), rich_help_panel=OUTPUT,
    help="Cross-encoder: the calibrated logit instead of its sigmoid; maxsim: un-normalized token vectors; "
    "cosine: no effect.",
)
PAIR_NOTE = (
    "A cross-encoder reads each pair as a text pair ([CLS] query [SEP] document [SEP], token types from the "
    "tokenizer); a pair over --max-length is cut longest_first, as sentence-transformers' CrossEncoder: one "
    "token at a time from whichever side is longer, so a short query stays whole and the document is cut "
    "first; special tokens count toward the limit. An embedding model scores by cosine (query prompt "
    "'query', document prompt 'document'/'passage'/'corpus' when the model has them). Whitespace is kept."
)


def ids(value: str) -> tuple[int, ...] | None:
    """Comma-separated integers (None when empty)."""
    try:
        parsed = tuple(int(x) for x in cols(value))
    except ValueError:
        raise typer.BadParameter(f"{value!r}: expected comma-separated integers") from None
    return parsed or None


def floats(value: str | None, flag: str) -> tuple[float, ...] | None:
    """Comma-separated numbers (None when not given); a usage error names `flag` otherwise."""
    if value is None:
        return None
    try:
        parsed = tuple(float(x) for x in cols(value))
    except ValueError:
        raise UsageError(f"{flag} {value!r}: expected comma-separated numbers, e.g. 0.4,0.2,0.4") from None
    if not parsed or not all(math.isfinite(x) for x in parsed):
        raise UsageError(f"{flag} {value!r}: expected comma-separated finite numbers, e.g. 0.4,0.2,0.4")
    return parsed


# Options of embed ----------------------------------------------------------------------------------------
OPT_EMBED_NORMALIZE = typer.Option(
    None, "--normalize/--no-normalize", envvar=env("normalize"), rich_help_panel=OUTPUT,
    help="L2-normalize vectors (default: as the model says; a sentence-transformers model: only with a "
    "Normalize module).",
    show_default=False,
)
OPT_EMBED_DIMENSIONS = typer.Option(
    None, "--dimensions", envvar=env("dimensions"), rich_help_panel=MODEL,
    help="Matryoshka: keep the first N dims (after any Dense projector), then normalize. N <= the embedding "
    "size, one of the model's matryoshka_dimensions if listed, else exit 2; a model without Matryoshka "
    "support is cut anyway (as sentence-transformers, TEI), with a note. Static models: truncate_dim.",
)
OPT_EMBED_PROMPT = typer.Option(
    None, "--prompt", envvar=env("prompt"), rich_help_panel=MODEL,
    help="Text prepended to every input (--prompt '' disables the model's default prompt).",
)
OPT_EMBED_PROMPT_NAME = typer.Option(
    None, "--prompt-name", envvar=env("prompt-name"), rich_help_panel=MODEL,
    help="A prompt from the model's config_sentence_transformers.json (e.g. query, document). Default: its "
    "default_prompt_name, if any, as sentence-transformers does.",
)
OPT_EMBED_LONG_INPUTS = typer.Option(
    "truncate", "--long-inputs", envvar=env("long-inputs"), rich_help_panel=BATCHING,
    help="Inputs over the max length. truncate: cut to --max-length (counted in --stats); error: exit 1 "
    "naming the row; chunk: pool max-length slices, token-weighted mean, re-normalized (README: Long inputs).",
)
OPT_EMBED_PRECISION = typer.Option(
    "float32", "--precision", envvar=env("precision"), rich_help_panel=OUTPUT,
    help="Vector type, as sentence-transformers' quantize_embeddings: float16 a cast; int8/uint8 per-dim "
    "ranges (--calibration, else the whole output); binary/ubinary 8 dims per byte (README: Precision).",
)
OPT_EMBED_CALIBRATION = typer.Option(
    None, "--calibration", envvar=env("calibration"), rich_help_panel=OUTPUT,
    help="int8/uint8 ranges from this file, not the whole output: the per-dim min/max of float vectors "
    "(.npy, or a .parquet/.jsonl embedding column), or the ranges stored in an earlier int8/uint8 output "
    "(quantize queries like their corpus).",
)
OPT_EMBED_QUANTIZE = typer.Option(
    False, "--quantize", envvar=env("quantize"), rich_help_panel=MODEL,
    help="Opt-in int8 dynamic quantization (per output channel) of the model's Linear layers, CPU and "
    "--dtype float32 only: ~2.2x faster on this CPU but lossy (all-MiniLM-L6-v2 on BBC text: min cosine "
    "0.961 against float32). Not the same as --precision, which quantizes the output vectors.",
)
