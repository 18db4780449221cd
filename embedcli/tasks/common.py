"""What every compute command shares: model choice, output options, loading, provenance, and the `Job`.

A task module (`embed`, `classify`, `tokens`, `pairs`) turns a command's options into one `Job` with
`make_job` and runs it with `embedcli.run.run_job`; each returns the exit code.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from embedcli.compute.build import RunnerRecipe, build_engine, build_runner
from embedcli.compute.lazy import LazyEngine
from embedcli.compute.options import RunnerOptions
from embedcli.compute.plan import RunnerPlan, plan_runner
from embedcli.errors import UsageError, display_path
from embedcli.io.writers import LINES
from embedcli.models.llm_reranker import RerankerFlags
from embedcli.models.options import ModelOptions
from embedcli.models.spec import ModelSpec, load_model_spec
from embedcli.run.execute import run_job
from embedcli.run.flags import RunFlags
from embedcli.run.job import Engine, Job, Reporting, RowCodec, Target
from embedcli.version import __version__

if TYPE_CHECKING:  # torch: loaded with the model, only once a run has work to do
    from embedcli.compute.runner import Runner
    from embedcli.compute.static import StaticLoaded, StaticRunner
    from embedcli.models.loader import LoadedModel

ACTIVATIONS: tuple[str, ...] = ("auto", "softmax", "sigmoid", "none")


@dataclass(frozen=True)
class ModelChoice:
    """Which model, on which device and dtype."""

    model: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    max_length: int | None = None
    allow_pickle: bool = False
    trust_remote_code: bool = False
    quantize: bool = False
    reranker: RerankerFlags | None = None  # a causal LM as a yes/no reranker (--classifier-from-tokens, ...)
    threads: int | None = None  # --threads: how the run computes, not what; in no config hash

    def __post_init__(self) -> None:
        if self.threads is not None and self.threads < 1:
            raise UsageError(f"--threads {self.threads}: must be 1 or more (CPU threads of the forward passes)")

    def options(self, **task_options: Any) -> ModelOptions:
        """The load options, with a task's (activation, calibration, step tag); refused flag values are
        usage errors here (`ModelOptions` checks them)."""
        return ModelOptions(
            device=self.device,
            dtype=self.dtype,
            allow_pickle=self.allow_pickle,
            trust_remote_code=self.trust_remote_code,
            quantize=self.quantize,
            **task_options,
        )


@dataclass(frozen=True)
class OutputOptions:
    """Where results go and how progress is reported."""

    path: str
    fmt: str | None = None
    quiet: bool = False
    stats_file: str | None = None


@dataclass(frozen=True)
class Computation:
    """What a compute command runs, decided before any input is read: the runner's recipe, the codec of its
    rows, the provenance keys the command adds, and what the codec takes from the built runner (`loaded`).

    The command runs it as a `Job` over files; `embedcli.Embedder` runs the same over in-memory batches."""

    recipe: RunnerRecipe
    codec: Any
    extra: dict[str, Any]
    loaded: Callable[[Runner], None] | None = None


def load_spec(choice: ModelChoice) -> ModelSpec:
    """The model's resolved spec (reads configs and hashes the weight files once; loads no weights)."""
    return load_model_spec(
        choice.model,
        allow_pickle=choice.allow_pickle,
        trust_remote_code=choice.trust_remote_code,
        max_length=choice.max_length,
        reranker=choice.reranker,
    )


def runner_recipe(spec: ModelSpec, choice: ModelChoice, runner_options: RunnerOptions, **task_options: Any) -> RunnerRecipe:
    """The recipe of a runner of `spec` with the choice's device/dtype and task options."""
    return RunnerRecipe(spec, choice.options(**task_options), runner_options, choice.threads)


def build(spec: ModelSpec, choice: ModelChoice, runner_options: RunnerOptions, **task_options: Any) -> Runner:
    """Load `spec`'s weights with the choice's device/dtype and task options, and build the runner."""
    return build_runner(runner_recipe(spec, choice, runner_options, **task_options))


def activation(name: str) -> str | None:
    """`--activation`'s value for the model options (None: the model's own)."""
    if name not in ACTIVATIONS:
        raise UsageError(f"--activation {name!r}: choose one of {', '.join(ACTIVATIONS)}")
    return None if name == "auto" else name


def calibration(spec: ModelSpec, logit_mean: float | None = None, logit_sigma: float | None = None) -> tuple[Any, Any]:
    """(logit_mean, logit_sigma): the flags, else the model's config.json keys `logit_mean` / `logit_sigma`
    (vLLM's older names: `logit_bias` = mean, `logit_scale` = 1 / sigma), else none."""
    try:
        with open(Path(spec.path) / "config.json", encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, json.JSONDecodeError):
        config = {}
    mean = logit_mean if logit_mean is not None else config.get("logit_mean", config.get("logit_bias"))
    sigma = logit_sigma
    if sigma is None:
        sigma = config.get("logit_sigma")
        scale = config.get("logit_scale")
        if sigma is None and scale is not None:
            if float(scale) == 0:
                raise UsageError(f"{spec.path}/config.json: logit_scale 0 cannot calibrate logits")
            sigma = 1.0 / float(scale)
    # sigma is a spread: a negative one would reverse the labels' order (and a one-label reranker's ranking),
    # which no calibration means; vLLM refuses only 0. NaN or inf would make every score NaN at exit 0.
    if sigma is not None and not (math.isfinite(float(sigma)) and float(sigma) > 0):
        if logit_sigma is not None:
            where = "--logit-sigma"
        elif config.get("logit_sigma") is not None:
            where = f"{spec.path}/config.json: logit_sigma"
        else:
            where = f"{spec.path}/config.json: 1 / logit_scale"
        raise UsageError(f"{where} {sigma}: must be a positive number (it divides the logits; a negative one would "
                         "reverse the order of the scores)")
    if mean is not None and not math.isfinite(float(mean)):
        where = "--logit-mean" if logit_mean is not None else f"{spec.path}/config.json: logit_mean"
        raise UsageError(f"{where} {mean}: must be a finite number")
    return (None if mean is None else float(mean)), (None if sigma is None else float(sigma))


def provenance(
    model: LoadedModel | StaticLoaded, runner: Runner | StaticRunner, extra: dict[str, Any] | None = None
) -> dict[str, str]:
    """Key-value metadata every output carries: model, its content hash, resolved config and its hash."""
    return planned_provenance(model.spec, RunnerPlan.of(runner), runner.options, extra)


def planned_provenance(
    spec: ModelSpec, plan: RunnerPlan, options: RunnerOptions, extra: dict[str, Any] | None = None
) -> dict[str, str]:
    """`provenance` of the runner that `plan` describes, before it is built."""
    resolved = {
        "task": plan.task,
        "pooling": spec.seq_pooling_type,
        "normalize": plan.normalize,
        "dimensions": plan.dimensions,
        "projector": [asdict(d) for d in spec.projector],
        "max_length": plan.max_length,
        "long_inputs": options.long_inputs,
        "truncation_side": plan.truncation_side,
        "strip": options.strip,
        "prompt": options.prompt,
        "dtype": plan.dtype,
        "quantize": plan.quantize,
        "model_config_hash": spec.config_hash(),
        **(extra or {}),
    }
    config_json = json.dumps(resolved, sort_keys=True, default=str)
    return {
        "embedcli.version": __version__,
        "embedcli.model": spec.name,
        "embedcli.model_hash": spec.content_hash,
        "embedcli.config": config_json,
        "embedcli.config_hash": hashlib.sha256(config_json.encode()).hexdigest()[:16],
        "embedcli.dtype": resolved["dtype"],
        # Outside the config hash: how `auto` was resolved does not change what a resumed run must match.
        "embedcli.dtype_reason": plan.dtype_reason,
    }


def planned_engine(
    recipe: RunnerRecipe,
    flags: RunFlags,
    extra: dict[str, Any] | None = None,
    loaded: Callable[[Runner], None] | None = None,
) -> tuple[Engine, dict[str, str], RunnerPlan]:
    """The engine of `recipe`, the provenance its outputs carry, and what its runner resolves to.

    When the plan is decidable without the model (`embedcli.compute.plan`), the engine is built on first use
    (`LazyEngine`): a rerun whose output is complete or made otherwise ends before torch is imported. Else
    (an `auto` dtype not probed yet on this machine, or a GPU that may be there) the model loads now.
    `loaded(runner)` is called once the runner is built: a task makes there what needs the loaded model
    (its tokenizer's special ids, a pair scorer), so that too waits until there is work.
    """
    if flags.engine == "ray" and recipe.model_spec.head == "static":
        raise UsageError("--engine ray: a static embedding model runs in this process (numpy, no torch); drop --engine ray")
    plan = plan_runner(recipe)
    if plan is None:
        runner = build_runner(recipe)
        if loaded is not None:
            loaded(runner)
        return engine_for(runner, flags), provenance(runner.model, runner, extra), RunnerPlan.of(runner)
    meta = planned_provenance(recipe.model_spec, plan, recipe.runner_options, extra)

    def build() -> Engine:
        runner = build_engine(recipe)  # a static model: its numpy runner; else the torch Runner
        built = provenance(runner.model, runner, extra)
        if built != meta:  # the output was checked against the plan: a difference is a bug in the plan
            changed = sorted(k for k in meta if built.get(k) != meta[k])
            raise RuntimeError(f"embedcli: internal error: the loaded model differs from its plan in {changed}")
        if loaded is not None:
            loaded(runner)  # type: ignore[arg-type]  # only tasks whose models have a torch Runner pass `loaded`
        return runner if flags.engine != "ray" else engine_for(runner, flags)  # type: ignore[arg-type]  # ray: refused above for a static runner

    # A plan exists only for the CPU (`plan_runner`), so the budget is the CPU's unless given.
    return LazyEngine(build, plan.max_length, recipe.runner_options.token_budget("cpu")), meta, plan


class RowInputs(list[Any]):
    """Runner inputs made from one input batch; `locate(i)` names the file, line/row and id of input `i`."""

    def __init__(self, items: Iterable[Any], batch: Any, row_of: Callable[[int], int] | None = None) -> None:
        super().__init__(items)
        self.batch = batch
        self.row_of = row_of

    def locate(self, i: int) -> str:
        """`file line N (id 'x')` of the input row behind runner input `i`."""
        j = self.row_of(i) if self.row_of else i
        b = self.batch
        return f"{display_path(b.source)} {b.locations[j]} (id {b.ids[j]!r})"


def located(batch: Any) -> RowInputs:
    """A batch's texts as runner inputs that can name their rows."""
    return RowInputs(batch.texts, batch)


def engine_for(runner: Runner, flags: RunFlags) -> Engine:
    """The local runner, or (`--engine ray`) the same runner inside a pool of Ray actors."""
    if flags.engine == "ray":
        from embedcli.engines.ray_engine import ray_runner

        return ray_runner(
            runner, address=flags.ray_address, workers=flags.workers, gpus_per_worker=flags.gpus_per_worker
        )
    return runner


def job_engine(
    recipe: RunnerRecipe,
    flags: RunFlags,
    extra: dict[str, Any] | None = None,
    loaded: Callable[[Runner], None] | None = None,
) -> tuple[Engine, dict[str, str], RunnerPlan]:
    """The engine of a job over input files, its provenance and plan: `planned_engine`'s local runner, or under
    `--engine ray` the Ray Data engine (its workers read, compute and write slices of the inputs)."""
    if flags.engine != "ray":
        return planned_engine(recipe, flags, extra, loaded)
    if recipe.model_spec.head == "static":
        raise UsageError("--engine ray: a static embedding model runs in this process (numpy, no torch); drop --engine ray")
    from embedcli.engines.ray_data import RayDataEngine

    gpus = flags.gpus_per_worker
    cpus = 1.0
    device = "cuda" if gpus else "cpu"
    worker = RunnerRecipe(recipe.model_spec, replace(recipe.model_options, device=device), recipe.runner_options,
                          None if gpus else max(1, int(cpus)))
    engine = RayDataEngine(worker, address=flags.ray_address, workers=flags.workers, gpus_per_worker=gpus,
                           cpus_per_worker=cpus, max_length=0, max_batch_tokens=recipe.runner_options.token_budget(device),
                           loaded=loaded)
    plan = plan_runner(worker)
    if plan is None:  # only a worker can tell (its GPU, or `auto` not probed yet): it builds the model once to say
        plan, meta = engine.call(plan_on_worker, worker, extra)
    else:
        meta = planned_provenance(recipe.model_spec, plan, recipe.runner_options, extra)
    # Every worker computes in the dtype the provenance names, whatever its own machine would choose.
    engine.recipe = replace(worker, model_options=replace(worker.model_options, dtype=plan.dtype))
    engine.set_max_length(plan.max_length)
    return engine, meta, plan


def plan_on_worker(recipe: RunnerRecipe, extra: dict[str, Any] | None) -> tuple[RunnerPlan, dict[str, str]]:
    """What `recipe`'s runner resolves to where it is built (run on a Ray worker), and its provenance."""
    runner = build_runner(recipe)
    return RunnerPlan.of(runner), provenance(runner.model, runner, extra)


def run_computation(
    source: Iterable[Any], work: Computation, output: OutputOptions, flags: RunFlags
) -> int:
    """Run a command's computation over `source` as one `Job`; returns the exit code. The model loads once the
    output's state says there is work (unless only loading can settle the dtype)."""
    engine, meta, _ = job_engine(work.recipe, flags, work.extra, loaded=work.loaded)
    return run_job(make_job(source, engine, work.codec, meta, output, flags))


def check_npy_columns(codec: RowCodec, output: OutputOptions) -> None:
    """UsageError (before any work) for a .npy output of rows that are not one `embedding` vector and an id: the
    writer kept those two and dropped the rest (`--keep-cols`) at exit 0, or refused only once all was computed."""
    named = output.fmt if output.fmt is not None else os.path.splitext(output.path)[1]
    if named.strip().lower().lstrip(".") != "npy":
        return
    columns = list(codec.empty().column_names)
    if "embedding" in columns and set(columns) <= {"id", "embedding"}:
        return
    if "embedding" in columns:
        has = "also has " + ", ".join(repr(c) for c in columns if c not in ("id", "embedding"))
    else:
        has = "has " + ", ".join(repr(c) for c in columns)
    raise UsageError(
        f"-o {output.path}: .npy holds one 'embedding' vector (and the id) of each row, but this output {has}: "
        "write .parquet or .jsonl" + (" (or drop --keep-cols)" if "embedding" in columns else "")
    )


def make_job(
    source: Iterable[Any],
    engine: Engine,
    codec: RowCodec,
    meta: dict[str, str],
    output: OutputOptions,
    flags: RunFlags,
) -> Job:
    """The `Job` of a compute command (`engine`: `engine_for` a built runner, or `planned_engine`'s)."""
    if output.fmt is not None and output.fmt.strip().lower() == LINES:
        raise UsageError(f"--output-format {output.fmt}: run-batch's response lines; choose parquet, jsonl or npy")
    check_npy_columns(codec, output)
    return Job(
        source=source,
        engine=engine,
        codec=codec,
        provenance=meta,
        target=Target(output.path, output.fmt),
        flags=flags,
        reporting=Reporting(output.quiet, output.stats_file),
    )
