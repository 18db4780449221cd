"""The engine of `run-batch`: request units run with one loaded model, locally or in Ray actors.

`UnitEngine` groups a block's units by task and pooling parameters and runs each group as one packed batch
(`Runner.tokenize` + `Runner.run_encoded`, as every command), so many small requests share forwards.
`RayUnitEngine` is the `--engine ray` drop-in: the block's units are cut into pieces and each piece runs in
a `UnitWorker` actor (the same `UnitEngine` around the recipe's model), results back in order.
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict, deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from embedcli.batchapi import Chunk, Unit, UnitParams, UnitResult
from embedcli.compute.build import RunnerRecipe, build_runner
from embedcli.compute.runner import Encoded, Runner, RunnerOptions, RunStats, prefetch
from embedcli.engines.ray_engine import RayRunner, require_ray
from embedcli.errors import UsageError
from embedcli.models.llm_reranker import pair_formatter
from embedcli.models.loader import LoadedModel
from embedcli.scoring import PairScorer
from embedcli.tasks.pairs import PAIR_TASK

# -- the engine -----------------------------------------------------------------------------------


@dataclass
class ChunkResult:
    """A block's parsed lines and the result of each of its units, in unit order."""

    chunk: Chunk | None
    results: list[UnitResult]


@dataclass
class _Group:
    """Units of one block that share a runner: their positions, the runner and its tokenized inputs."""

    task: str
    positions: list[int]
    runner: Runner
    encoded: Encoded
    scorer: PairScorer | None = None


def _is_token_ids(value: Any) -> bool:
    return isinstance(value, tuple) and (not value or isinstance(value[0], int))


class UnitEngine:
    """Runs the units of request blocks with one loaded model: one runner per (task, pooling params)."""

    def __init__(self, model: LoadedModel, base: RunnerOptions, score_method: str | None) -> None:
        self.model = model
        self.base = base
        self.score_method = score_method
        self.prompts = dict(model.spec.prompts)
        self.stats = RunStats()
        self.max_length = int(base.max_length or model.spec.max_length)
        self._runners: dict[tuple[str, UnitParams], Runner] = {}
        self._pair_formats: dict[int, Any] = {}

    # -- runners -------------------------------------------------------------------------------------
    def runner(self, task: str, params: UnitParams) -> Runner:
        """The runner of a pooling task under a unit's params (made once, sharing the model and the stats)."""
        key = (task, params)
        runner = self._runners.get(key)
        if runner is not None:
            return runner
        limit = params.truncate_prompt_tokens
        max_length = self.max_length if limit is None or limit < 0 else min(limit, self.max_length)
        embeds = task in ("embed", "token_embed")
        options = dataclasses.replace(
            self.base, task=task, max_length=max_length, dimensions=params.dimensions,
            normalize=params.use_activation if embeds else None,
            truncation_side=params.truncation_side or self.base.truncation_side,  # type: ignore[arg-type]  # typer's Literal choices; RunnerOptions takes the same values
        )
        runner = Runner(self.model, options)
        if task in ("classify", "token_classify") and params.use_activation is not None:
            runner.params.use_activation = params.use_activation  # the classifier's activation, per request
        runner.stats = self.stats
        self._runners[key] = runner
        return runner

    def _pair_format(self, runner: Runner) -> Any:
        """`render(query, document)` of an LLM reranker at the runner's max length (made once), else None."""
        key = runner.max_length
        if key not in self._pair_formats:
            self._pair_formats[key] = pair_formatter(self.model, runner.max_length)
        return self._pair_formats[key]

    def _encode(self, runner: Runner, inputs: Sequence[Any]) -> Encoded:
        """Texts (and pairs) tokenized by the runner; token-id inputs taken as they are, cut to its max length."""
        n = len(inputs)
        ids: list[Any] = [None] * n
        types: list[Any] = [None] * n
        text_at = [i for i, x in enumerate(inputs) if not _is_token_ids(x)]
        if runner.model.spec.late_interaction is not None:
            if len(text_at) != n:
                raise UsageError("run-batch: a late-interaction (ColBERT) model takes texts, not token ids")
            return runner.tokenize(list(inputs))  # its markers, expansion and skiplist ride on the encoding
        if text_at:
            enc = runner.tokenize([inputs[i] for i in text_at])  # truncation: no chunks, one sequence per input
            for j, i in enumerate(text_at):
                ids[i] = enc.ids[j]
                types[i] = enc.type_ids[j] if enc.type_ids is not None else np.zeros(len(enc.ids[j]), np.int64)
        limit = runner.max_length
        for i, x in enumerate(inputs):
            if ids[i] is not None:
                continue
            seq = np.asarray(x, dtype=np.int64)
            if len(seq) > limit:
                self.stats.truncated_rows += 1
                seq = seq[-limit:] if runner.options.truncation_side == "left" else seq[:limit]
            ids[i], types[i] = seq, np.zeros(len(seq), np.int64)
        return Encoded(ids=ids, type_ids=types, owner=np.arange(n, dtype=np.int64), num_rows=n)

    # -- one block -------------------------------------------------------------------------------------
    def prepare(self, units: Sequence[Unit]) -> list[_Group]:
        """The block's units grouped by (task, params), in first-seen order, each group tokenized."""
        by_group: dict[tuple[str, UnitParams], list[int]] = defaultdict(list)
        for i, unit in enumerate(units):
            by_group[unit.group].append(i)
        groups = []
        for (task, params), positions in by_group.items():
            if task == "score":
                method = self.score_method
                assert method is not None  # requests were refused when the model cannot score
                runner = self.runner(PAIR_TASK[method], params)
                # An LLM reranker's pair is one templated prompt, cut on the document side as `score` cuts it.
                scorer = PairScorer(runner, method, self.prompts, pair_format=self._pair_format(runner))
                pairs = [cast(tuple[str, str], units[i].input) for i in positions]  # score units are (left, right)
                inputs = scorer.pair_inputs([p[0] for p in pairs], [p[1] for p in pairs])
                groups.append(_Group(task, positions, runner, self._encode(runner, inputs), scorer))
            else:
                runner = self.runner(task, params)
                groups.append(_Group(task, positions, runner, self._encode(runner, [units[i].input for i in positions])))
        return groups

    def compute(self, n: int, groups: list[_Group]) -> list[UnitResult]:
        """Every unit's result, in unit order."""
        out: list[UnitResult | None] = [None] * n
        for g in groups:
            result = g.runner.run_encoded(g.encoded)
            lengths = g.encoded.lengths
            m = len(g.positions)
            if g.scorer is not None:
                scores = g.scorer.pair_scores(result, m)
                tokens = lengths if g.scorer.method == "cross-encoder" else lengths[:m] + lengths[m:]
                values: Any = scores
            else:
                tokens, values = lengths, result
            for k, i in enumerate(g.positions):
                out[i] = UnitResult(values[k], int(tokens[k]))
        return out  # type: ignore[return-value]  # every position belongs to exactly one group

    def map(self, batches: Iterable[Any]) -> Iterator[ChunkResult]:
        """One `ChunkResult` per block, in order; the next block is parsed and tokenized while this one runs."""

        def prepared() -> Iterator[tuple[Any, list[_Group]]]:
            for chunk in batches:
                if not isinstance(chunk, Chunk):  # the loop's empty input of a batch with no rows to compute
                    yield None, []
                    continue
                t0 = time.perf_counter()
                groups = self.prepare(chunk.flat.units)
                self.stats.seconds["tokenize"] += time.perf_counter() - t0
                yield chunk, groups

        for chunk, groups in prefetch(prepared(), depth=2):
            if chunk is None:
                yield ChunkResult(None, [])
            else:
                yield ChunkResult(chunk, self.compute(len(chunk.flat.units), groups))


# -- Ray ---------------------------------------------------------------------------------------------


def _counters(stats: RunStats) -> dict[str, Any]:
    return {"rows": stats.rows, "tokens": stats.tokens, "forwards": stats.forwards,
            "truncated_rows": stats.truncated_rows, "seconds": dict(stats.seconds)}


def _delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {k: after[k] - before[k] for k in after if k != "seconds"}
    out["seconds"] = {k: v - before["seconds"].get(k, 0.0) for k, v in after["seconds"].items()}
    return out


class UnitWorker:
    """A Ray actor holding one copy of the model: runs pieces of blocks' units."""

    def __init__(self, recipe: RunnerRecipe, score_method: str | None) -> None:
        runner = build_runner(recipe)
        self.engine = UnitEngine(runner.model, runner.options, score_method)

    def run(self, units: list[Unit]) -> tuple[list[UnitResult], dict[str, Any]]:
        """The results of a piece of units and the counters it added."""
        before = _counters(self.engine.stats)
        t0 = time.perf_counter()
        groups = self.engine.prepare(units)
        self.engine.stats.seconds["tokenize"] += time.perf_counter() - t0
        results = self.engine.compute(len(units), groups)
        return results, _delta(before, _counters(self.engine.stats))

    def ready(self) -> bool:
        return True


class RayUnitEngine(RayRunner):
    """`--engine ray` for run-batch: each block's units cut into pieces over `--workers` `UnitWorker` actors."""

    def __init__(self, local: Runner, score_method: str | None, **options: Any) -> None:
        super().__init__(local, **options)
        self.score_method = score_method

    def _actors(self, ray: Any) -> list[Any]:
        actor = ray.remote(num_cpus=self.cpus, num_gpus=self.gpus or None)(UnitWorker)
        recipe = ray.put(self.spec)
        actors = [actor.remote(recipe, self.score_method) for _ in range(self.workers)]
        ray.get([a.ready.remote() for a in actors])
        return actors

    def map(self, batches: Iterable[Any]) -> Iterator[ChunkResult]:
        """One `ChunkResult` per block, in order."""
        held: deque[Chunk | None] = deque()

        def units() -> Iterator[list[Unit]]:
            for chunk in batches:
                is_chunk = isinstance(chunk, Chunk)
                held.append(chunk if is_chunk else None)
                yield list(chunk.flat.units) if is_chunk else []

        for results in super().map(units()):
            chunk = held.popleft()
            yield ChunkResult(chunk, list(results) if chunk is not None else [])


def unit_engine(runner: Runner, score_method: str | None, *, engine: str = "local", address: str | None = None,
                workers: int = 1, gpus_per_worker: float = 0.0) -> UnitEngine | RayUnitEngine:
    """The local engine around `runner`'s model, or (`engine="ray"`) the same in a pool of Ray actors."""
    if engine == "ray":
        require_ray()
        return RayUnitEngine(runner, score_method, address=address, workers=workers, gpus_per_worker=gpus_per_worker)
    return UnitEngine(runner.model, runner.options, score_method)
