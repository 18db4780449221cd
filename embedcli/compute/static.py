"""The engine of a static embedding model: tokenize, embedding-bag mean, Matryoshka slice, normalize; no torch.

It stands where `Runner` stands (built by `build_runner`, run by the same `Job` machinery), so resume,
`--incremental`, `--shard` and the exit codes are the embed command's own.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from embedcli.compute.options import RunnerOptions, RunStats, resolved_side, run_dimensions
from embedcli.errors import LongInputError, PoolingConfigError, UsageError
from embedcli.models.options import ModelOptions
from embedcli.models.spec import ModelSpec

if TYPE_CHECKING:
    from embedcli.models.static import StaticModel

# A mean of rows costs next to nothing per token: batches as large as a packed forward on a GPU keep the run
# loop's per-batch work (commit, progress) small beside it.
STATIC_MAX_BATCH_TOKENS = 65536
STATIC_DTYPE = ("float32", "static embeddings: a float32 table and a mean of rows (no forward, no dtype choice)")


def static_dtype(options: ModelOptions) -> tuple[str, str]:
    """(dtype, reason) of a static model's run; flags that choose how a forward runs are refused (exit 2)."""
    if options.dtype not in ("auto", "float32"):
        raise UsageError(f"--dtype {options.dtype}: a static embedding model computes in float32; drop --dtype")
    if options.quantize:
        raise UsageError("--quantize: a static embedding model has no Linear layers to quantize; drop --quantize")
    if options.device not in ("auto", "cpu"):
        raise UsageError(f"--device {options.device}: a static embedding model runs on the CPU (numpy); drop --device")
    return STATIC_DTYPE


@dataclass(frozen=True)
class StaticParams:
    """What each row is asked for (the fields `RunnerPlan.of` reads from a runner's pooling params)."""

    task: str
    use_activation: bool
    dimensions: int | None


@dataclass(frozen=True)
class StaticLoaded:
    """The loaded model as a runner's provenance reads it: spec, dtype and why, load options."""

    spec: ModelSpec
    options: ModelOptions
    static: StaticModel
    dtype: str = STATIC_DTYPE[0]
    dtype_reason: str = STATIC_DTYPE[1]


def static_dimensions(spec: ModelSpec, dimensions: int | None) -> int | None:
    """The Matryoshka size of a run: `--dimensions`, else the checkpoint's `truncate_dim`, else none."""
    dims = run_dimensions(dimensions, spec.truncate_dim, "embed")
    if dims is not None and dims > spec.embedding_size:
        raise UsageError(f"--dimensions {dims}: the model has {spec.embedding_size} dims")
    return dims


class StaticRunner:
    """Embeds streamed batches of texts with a static model, in input order (the `Engine` protocol)."""

    def __init__(self, spec: ModelSpec, model_options: ModelOptions, options: RunnerOptions) -> None:
        from embedcli.models.static import StaticModel

        if options.task != "embed":
            raise PoolingConfigError(f"Model {spec.name!r} cannot do {options.task!r}; it supports embed")
        if options.truncation_side == "left":
            raise UsageError("--truncation-side left: static models cut long texts as their library does (the end)")
        options = dataclasses.replace(options, truncation_side=resolved_side(options, spec))
        static_dtype(model_options)
        self.options = options
        self.model = StaticLoaded(spec, model_options, StaticModel(spec))
        self._static = self.model.static
        self.max_length = options.max_length or spec.max_length
        self.max_batch_tokens = int(options.max_batch_tokens or STATIC_MAX_BATCH_TOKENS)
        normalize = spec.normalize if options.normalize is None else options.normalize
        self.params = StaticParams("embed", bool(normalize), static_dimensions(spec, options.dimensions))
        self.stats = RunStats()
        if options.dimensions is not None and not spec.is_matryoshka:
            print(
                f"embedcli: note: {spec.name} declares no Matryoshka dimensions (not trained for truncation); "
                f"keeping its first {options.dimensions} of {spec.embedding_size} dims anyway",
                file=sys.stderr,
            )

    @property
    def width(self) -> int:
        """Width of the vectors this runner returns."""
        return self.params.dimensions or self._static.dim

    def _prepare(self, text: str) -> str:
        if self.options.strip:
            text = text.strip()
        return self.options.prompt + text if self.options.prompt else text

    def embed_batch(self, texts: Sequence[str], first_row: int = 0) -> np.ndarray:
        """float32 vectors `[len(texts), width]` of one batch; `first_row` numbers a too-long row's error."""
        start = time.perf_counter()
        mode = self.options.long_inputs
        limit = self.max_length or None
        # chunk: a token-weighted mean of chunk means is the mean of every token, so no limit at all.
        tokens = self._static.token_ids([self._prepare(t) for t in texts], limit if mode == "truncate" else None)
        if mode == "error" and limit is not None and len(tokens.lengths) and int(tokens.lengths.max()) > limit:
            row = int(np.flatnonzero(tokens.lengths > limit)[0])
            locate = getattr(texts, "locate", None)
            raise LongInputError(first_row + row, int(tokens.lengths[row]), limit, locate(row) if locate else None)
        self.stats.seconds["tokenize"] += time.perf_counter() - start
        start = time.perf_counter()
        vectors = self._static.mean_rows(tokens)
        if self.params.dimensions is not None:
            vectors = np.ascontiguousarray(vectors[:, : self.params.dimensions])
        if self.params.use_activation:
            vectors = self._static.normalize(vectors)
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        self.stats.rows += len(texts)
        self.stats.tokens += int(tokens.lengths.sum())
        self.stats.truncated_rows += tokens.truncated
        self.stats.seconds["compute"] += time.perf_counter() - start
        return vectors

    def map(self, batches: Iterable[Sequence[str]]) -> Iterator[np.ndarray]:
        """One `[rows, width]` float32 result per input batch, in order."""
        first_row = 0
        for texts in batches:
            yield self.embed_batch(texts, first_row)
            first_row += len(texts)

    def embed(self, texts: Sequence[str], batch_rows: int = 4096) -> np.ndarray:
        """All vectors of `texts` at once."""
        parts = [self.embed_batch(texts[i : i + batch_rows], i) for i in range(0, len(texts), batch_rows)]
        return np.concatenate(parts) if parts else np.zeros((0, self.width), dtype=np.float32)
