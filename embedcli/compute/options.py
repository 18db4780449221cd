"""A runner's options and counters: plain values, importable without torch (a no-op rerun never loads it)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from embedcli.errors import UsageError

if TYPE_CHECKING:
    from embedcli.models.spec import ModelSpec

# The token budget of one packed forward when `--max-batch-tokens` is not given, by device type.
DEFAULT_MAX_BATCH_TOKENS = {"cpu": 2048, "cuda": 65536}

LongInputs = Literal["truncate", "error", "chunk"]


@dataclass
class RunnerOptions:
    """How texts become packed forwards and what each sequence asks the pooler for."""

    task: str = "embed"
    max_batch_tokens: int | None = None
    max_length: int | None = None
    long_inputs: LongInputs = "truncate"
    truncation_side: Literal["right", "left"] | None = None  # None: the model's (its tokenizer's) side
    # Whitespace is kept, as sentence-transformers >= 5.4, vLLM and TEI do; `--strip` opts in to the old rule.
    strip: bool = False
    prompt: str = ""
    normalize: bool | None = None
    dimensions: int | None = None
    # Decoders: a sequence over max_batch_tokens runs in slices with a KV cache (embedcli.compute.prefill).
    chunked_prefill: bool = True
    # Token tasks: results carry each row's token ids too (`TokenRows`), for dropping special tokens.
    with_token_ids: bool = False
    # Late-interaction (ColBERT) models: encode texts as queries or documents (a `RoleText` input says per text).
    role: str | None = None

    def __post_init__(self) -> None:
        # Checked here, before the output's width is planned from it (a negative width is no usage error).
        if self.dimensions is not None and self.dimensions < 1:
            raise UsageError(f"--dimensions {self.dimensions}: must be at least 1 (or leave it out for the full size)")
        # 0 would silently mean the default (`or` in the runner); a negative budget packs nothing.
        if self.max_batch_tokens is not None and self.max_batch_tokens < 1:
            raise UsageError(f"--max-batch-tokens {self.max_batch_tokens}: must be at least 1 (or leave it out for the default)")

    def token_budget(self, device_type: str) -> int:
        """Tokens of one forward on a device of `device_type`: `--max-batch-tokens`, else the device's default."""
        return int(self.max_batch_tokens or DEFAULT_MAX_BATCH_TOKENS.get(device_type, DEFAULT_MAX_BATCH_TOKENS["cpu"]))



def resolved_side(options: RunnerOptions, spec: ModelSpec) -> Literal["right", "left"]:
    """The side a run cuts over-long inputs on: `--truncation-side`, else the model's tokenizer's."""
    return options.truncation_side or ("left" if spec.truncation_side == "left" else "right")


def run_dimensions(dimensions: int | None, truncate_dim: int | None, task: str) -> int | None:
    """The Matryoshka size a run keeps: `--dimensions`, else for sentence embeddings the checkpoint's
    `truncate_dim` (sentence-transformers' `encode` default), else none."""
    if dimensions is not None or task != "embed":
        return dimensions
    return truncate_dim


@dataclass
class RunStats:
    """Counters and per-phase seconds of a run."""

    rows: int = 0
    tokens: int = 0
    forwards: int = 0
    batches: int = 0  # input batches computed (a BGE-M3 run writing several outputs still takes one pass)
    truncated_rows: int = 0
    chunked_rows: int = 0
    sliced_rows: int = 0  # over the token budget on a decoder: chunked prefill in slices
    solo_rows: int = 0  # over the token budget on an encoder (or slicing off): a forward of its own
    seconds: dict[str, float] = field(default_factory=lambda: {"tokenize": 0.0, "compute": 0.0})

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view."""
        return {
            "rows": self.rows,
            "tokens": self.tokens,
            "forwards": self.forwards,
            "batches": self.batches,
            "truncated_rows": self.truncated_rows,
            "chunked_rows": self.chunked_rows,
            "sliced_rows": self.sliced_rows,
            "solo_rows": self.solo_rows,
            "seconds": {k: round(v, 4) for k, v in self.seconds.items()},
        }


@dataclass
class TokenRows:
    """A token task's result for one batch: each row's token ids and its per-token matrix.

    `template` marks, per row, the tokens the tokenizer's template added (`[CLS]`, `[SEP]`, `<s>`, `</s>`), by
    position: the same token spelled in the text itself is text, as in transformers' `special_tokens_mask`.
    """

    ids: list[np.ndarray]
    values: list[np.ndarray]
    template: list[np.ndarray] | None = None

    @classmethod
    def concat(cls, parts: Sequence[TokenRows]) -> TokenRows:
        """The rows of several batches' results, in order."""
        template = None if any(p.template is None for p in parts) else [t for p in parts for t in p.template or ()]
        return cls([i for p in parts for i in p.ids], [v for p in parts for v in p.values], template)
