"""The Ray engine: embedcli's own runner inside Ray actors.

What travels to the workers is a `RunnerRecipe` (`embedcli.compute.build`): the resolved `ModelSpec` (a
small frozen dataclass: paths, architecture, pooling, heads; no weights), the `ModelOptions` with the
driver's resolved dtype, and the `RunnerOptions` (which also say what kind of runner: a token runner's
results carry token ids). Each actor (`EmbedWorker`) builds its runner with `build_runner`, the builder the
CLI and `embedcli.Embedder` use, and runs every batch it is handed through `Runner.tokenize` +
`Runner.run_encoded`, the same functions `Runner.map` runs in the local engine.

Two ways in:

- **The CLI** (`--engine ray`): `RayRunner` stands in for the local `Runner` inside the shared loop
  (`embedcli.run`). The loop still reads, checks bad rows, commits shards through the staging area
  and the manifest, resumes and writes provenance; only the forward passes go to a pool of `--workers`
  actors: each batch is cut into up to `--workers` contiguous pieces, at most two pieces are queued per
  actor, and results are taken back in submission order, so output order, shard cuts, metadata and
  resume are those of the local engine (vectors agree to float rounding: packing differs per piece).
- **Python** (`embed_dataset(ds, ...)`): `ds.map_batches(EmbedWorker, concurrency=workers, ...)` on a
  `ray.data.Dataset`; bad rows (null or non-string text, a row the model rejects) get a null embedding and
  an `embedcli_error` message instead of failing the batch.

Ray is optional (`pip install 'embedcli[ray]'`); nothing here imports it before it is needed.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa

from embedcli.compute.build import RunnerRecipe, build_runner, embed_recipe
from embedcli.compute.runner import Runner, RunStats, TokenRows
from embedcli.engines.ray_data import INSTALL_HINT as INSTALL_HINT
from embedcli.engines.ray_data import add_stats, stats_delta
from embedcli.engines.ray_data import require_ray as require_ray
from embedcli.models.options import ModelOptions
from embedcli.models.spec import load_model_spec

ERROR_COL = "embedcli_error"
WorkerSpec = RunnerRecipe  # the name this module used before the builder was shared


def recipe_of(runner: Runner, *, gpus: float = 0.0, threads: int | None = None) -> RunnerRecipe:
    """The recipe of a driver-side runner, with its resolved dtype so workers compute what provenance says."""
    model = runner.model
    dtype = str(model.dtype).removeprefix("torch.")
    device = "cuda" if gpus > 0 else "cpu"
    options = replace(model.options, device=device, dtype="float32" if model.options.quantize else dtype)
    return RunnerRecipe(model.spec, options, runner.options, threads)


class EmbedWorker:
    """One model copy: a Ray actor (CLI engine) and a `map_batches` callable class (Ray Data)."""

    def __init__(self, spec: RunnerRecipe, text_col: str = "text", output_col: str = "embedding") -> None:
        self.runner = build_runner(spec)
        self.text_col = text_col
        self.output_col = output_col

    def _run(self, texts: Sequence[Any]) -> Any:
        # The local engine's path: Runner.map = tokenize, then run_encoded, per batch.
        runner = self.runner
        t0 = time.perf_counter()
        enc = runner.tokenize(texts)
        runner.stats.seconds["tokenize"] += time.perf_counter() - t0
        return runner.run_encoded(enc)

    # -- the CLI engine ------------------------------------------------------------------------------
    def run(self, texts: list[Any]) -> tuple[Any, dict[str, Any]]:
        """Results of one batch and the runner's stats for it."""
        before = self.runner.stats.to_dict()
        result = self._run(texts)
        return result, stats_delta(before, self.runner.stats.to_dict())

    def ready(self) -> bool:
        return True

    # -- Ray Data ------------------------------------------------------------------------------------
    def __call__(self, batch: Any) -> Any:
        """A pyarrow batch with `output_col` (fixed_size_list<float32>) and `embedcli_error` added."""
        texts = batch.column(self.text_col).to_pylist()
        n = len(texts)
        errors: list[str | None] = [
            None if isinstance(t, str) else f"{self.text_col} is {'null' if t is None else type(t).__name__}"
            for t in texts
        ]
        good = [i for i in range(n) if errors[i] is None]
        width = self.runner.params.dimensions or self.runner.model.spec.embedding_size
        vectors = np.zeros((n, width), dtype=np.float32)
        if good:
            try:
                vectors[good] = np.asarray(self._run([texts[i] for i in good]))
            except Exception:
                for i in good:  # one bad row must not fail the batch: find it
                    try:
                        vectors[i] = np.asarray(self._run([texts[i]]))[0]
                    except Exception as e:
                        errors[i] = f"{type(e).__name__}: {e}"
        bad = np.asarray([e is not None for e in errors], dtype=bool)
        values = pa.array(vectors.reshape(-1), type=pa.float32())
        column = pa.FixedSizeListArray.from_arrays(values, width, mask=pa.array(bad))
        return batch.append_column(self.output_col, column).append_column(ERROR_COL, pa.array(errors, pa.string()))


# --------------------------------------------------------------------------------------------------
# The CLI engine: a drop-in for Runner inside the shared loop


def _init_ray(address: str | None) -> Any:
    ray = require_ray()
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
    return ray


def _concat(parts: list[Any]) -> Any:
    """The results of a batch's pieces as the result of the batch (row matrices or per-row lists)."""
    if len(parts) == 1:
        return parts[0]
    if all(isinstance(p, TokenRows) for p in parts):
        return TokenRows.concat(parts)
    if all(isinstance(p, np.ndarray) for p in parts):
        return np.concatenate(parts)
    out: list[Any] = []
    for p in parts:
        out.extend(p)
    return out


class RayRunner:
    """A `Runner` look-alike whose `map` runs batches on a pool of Ray actors, results in input order."""

    def __init__(
        self, local: Any, *, address: str | None = None, workers: int = 1, gpus_per_worker: float = 0.0,
        cpus_per_worker: float = 1.0, in_flight_per_worker: int = 2, min_piece_rows: int = 16,
    ) -> None:
        self.local = local
        self.model = local.model
        self.options = local.options
        self.params = local.params
        self.max_length = local.max_length
        self.max_batch_tokens = local.max_batch_tokens
        self.stats = RunStats()
        self.address = address
        self.workers = workers
        self.gpus = gpus_per_worker
        self.cpus = cpus_per_worker
        self.depth = max(1, in_flight_per_worker) * workers
        self.min_piece_rows = min_piece_rows
        threads = None if gpus_per_worker else max(1, int(cpus_per_worker))
        self.spec = recipe_of(local, gpus=gpus_per_worker, threads=threads)

    def __getattr__(self, name: str) -> Any:  # anything else a command reads from its runner
        return getattr(self.__dict__["local"], name)

    def _add(self, delta: dict[str, Any]) -> None:
        add_stats(self.stats, delta)

    def _actors(self, ray: Any) -> list[Any]:
        actor = ray.remote(num_cpus=self.cpus, num_gpus=self.gpus or None)(EmbedWorker)
        spec_ref = ray.put(self.spec)
        actors = [actor.remote(spec_ref) for _ in range(self.workers)]
        ray.get([a.ready.remote() for a in actors])  # model load errors surface here, once
        return actors

    def _get(self, ray: Any, ref: Any) -> Any:
        try:
            result, delta = ray.get(ref)
        except ray.exceptions.RayTaskError as e:
            cause = getattr(e, "cause", None)
            if isinstance(cause, BaseException):
                raise cause from None
            raise
        self._add(delta)
        return result

    def _pieces(self, texts: Sequence[Any]) -> list[list[Any]]:
        """A batch cut into up to `workers` contiguous pieces (at least `min_piece_rows` rows each)."""
        n = len(texts)
        count = max(1, min(self.workers, n // self.min_piece_rows))
        bounds = [n * i // count for i in range(count + 1)]
        return [list(texts[bounds[i] : bounds[i + 1]]) for i in range(count)]

    def map(self, batches: Iterable[Sequence[Any]]) -> Iterator[Any]:
        """One result per batch, in order. Each batch is cut into pieces spread over the actors (so one big
        batch still uses every worker); at most `in_flight_per_worker` pieces are queued per actor."""
        ray = _init_ray(self.address)
        actors: list[Any] | None = None
        pending: deque[list[Any]] = deque()  # per batch, the refs of its pieces
        queued = 0
        turn = 0

        def take() -> Any:
            nonlocal queued
            refs = pending.popleft()
            queued -= len(refs)
            parts = [self._get(ray, ref) for ref in refs]
            return _concat(parts)

        try:
            for texts in batches:
                if actors is None:
                    actors = self._actors(ray)
                refs = []
                for piece in self._pieces(texts):
                    refs.append(actors[turn % len(actors)].run.remote(piece))
                    turn += 1
                pending.append(refs)
                queued += len(refs)
                while pending and queued >= self.depth:
                    yield take()
            while pending:
                yield take()
        finally:
            for refs in pending:
                for ref in refs:
                    try:
                        ray.cancel(ref, force=True)
                    except Exception:
                        pass
            for a in actors or []:
                try:
                    ray.kill(a)
                except Exception:
                    pass

    def embed(self, texts: Sequence[Any], batch_rows: int = 4096) -> np.ndarray:
        chunks = [texts[i : i + batch_rows] for i in range(0, len(texts), batch_rows)]
        parts = [np.asarray(r) for r in self.map(chunks)]
        return np.concatenate(parts) if parts else self.local.embed([])


def ray_runner(local: Runner, *, address: str | None, workers: int, gpus_per_worker: float) -> RayRunner:
    """The Ray engine for the CLI's `--engine ray` flags."""
    require_ray()
    return RayRunner(local, address=address, workers=workers, gpus_per_worker=gpus_per_worker)


# --------------------------------------------------------------------------------------------------
# Python entry point: a ray.data.Dataset in, a ray.data.Dataset out


def embed_spec(
    model: str | None = None,
    *,
    device: str = "auto",
    dtype: str = "auto",
    max_length: int | None = None,
    normalize: bool | None = None,
    max_batch_tokens: int | None = None,
    strip: bool = False,
    dimensions: int | None = None,
    prompt: str | None = None,
    prompt_name: str | None = None,
    long_inputs: str = "truncate",
    truncation_side: str | None = None,
    allow_pickle: bool = False,
    trust_remote_code: bool = False,
    threads: int | None = None,
) -> RunnerRecipe:
    """The recipe `embedcli embed` would run with these options (resolved here, no weights loaded)."""
    spec = load_model_spec(model, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code, max_length=max_length)
    load = ModelOptions(device=device, dtype=dtype, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code)
    return embed_recipe(
        spec, load, max_batch_tokens=max_batch_tokens, normalize=normalize, strip=strip, dimensions=dimensions,
        prompt=prompt, prompt_name=prompt_name, long_inputs=long_inputs, truncation_side=truncation_side,
        threads=threads,
    )


def embed_dataset(
    ds: Any,
    model: str | None = None,
    *,
    text_col: str = "text",
    output_col: str = "embedding",
    workers: int = 1,
    gpus_per_worker: float = 0.0,
    cpus_per_worker: float = 1.0,
    batch_size: int = 256,
    **options: Any,
) -> Any:
    """`ds` with an `output_col` embedding column (and `embedcli_error`, null unless the row was bad).

    `options` are `embed_spec`'s (device, dtype, normalize, max_batch_tokens, prompt, …). Lazy, like every
    Ray Data transform: write it with `ds.write_parquet(...)` or iterate it. Rows keep their order when
    `ray.data.DataContext.get_current().execution_options.preserve_order` is set.
    """
    require_ray()
    if gpus_per_worker and "device" not in options:
        options["device"] = "cuda"
    options.setdefault("threads", None if gpus_per_worker else max(1, int(cpus_per_worker)))
    spec = embed_spec(model, **options)
    return ds.map_batches(
        EmbedWorker,
        fn_constructor_args=(spec, text_col, output_col),
        batch_format="pyarrow",
        batch_size=batch_size,
        concurrency=workers,
        num_cpus=cpus_per_worker,
        num_gpus=gpus_per_worker or None,
        zero_copy_batch=True,
    )
