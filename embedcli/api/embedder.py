"""`Embedder`: one model and every command it serves, over in-memory texts."""

from __future__ import annotations

from embedcli.api.labels import ClassifyMethods
from embedcli.api.pairs import PairMethods
from embedcli.api.search import SearchMethods
from embedcli.api.vectors import VectorMethods


class Embedder(VectorMethods, ClassifyMethods, PairMethods, SearchMethods):
    """One model, resolved offline, and what `embedcli` does with it, over lists of texts in memory.

    `Embedder(model)` takes the model flags every command shares (`device`, `dtype`, `threads`,
    `max_batch_tokens`, `max_length`, `allow_pickle`, `trust_remote_code`, and an LLM reranker's
    `classifier_from_tokens`, `pair_template`, `instruction`, `reranker_preset`), with the CLI's defaults:
    `dtype="auto"` (bfloat16 where the model passes its parity probe on a CPU with native bf16 matmuls, else
    float32); prompts, activation, normalization and max length from the checkpoint. Each method takes its
    command's flags as keyword arguments, builds (once) the runner the command builds, by the same builder and
    recipe, and returns what the command writes: vectors as numpy; rows as a pyarrow Table with the command's
    columns, without `id` where rows are in input order (`embedcli.api.ragged` turns a list column into numpy
    arrays). Bad inputs and refused flags raise `embedcli.errors` exceptions (`UsageError`) with the command's
    messages. `normalize`, `dimensions`, `prompt` and `prompt_name` given here are `embed`'s defaults (and how
    `search` embeds queries against an in-memory matrix); `quantize` applies to `embed` only, as
    `embedcli embed --quantize`.
    """
