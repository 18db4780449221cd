"""What a recipe's runner will resolve to, decided from the spec and options alone (no torch, no weights).

A task plans its run to name the output's config (its provenance) before anything loads: a rerun that finds
its output complete, or made with another config, then ends without importing torch. `plan_runner` mirrors
what `Runner` and `LoadedModel` resolve; a task checks the built runner against its plan (`RunnerPlan.of`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from embedcli.compute.options import resolved_side, run_dimensions
from embedcli.compute.static import static_dimensions, static_dtype
from embedcli.models.precision import planned_dtype

if TYPE_CHECKING:
    from embedcli.compute.build import RunnerRecipe
    from embedcli.compute.runner import Runner
    from embedcli.compute.static import StaticRunner


@dataclass(frozen=True)
class RunnerPlan:
    """The resolved values of a runner that its output's provenance records."""

    task: str
    normalize: bool
    dimensions: int | None
    max_length: int
    dtype: str
    dtype_reason: str
    quantize: bool
    truncation_side: str

    @classmethod
    def of(cls, runner: Runner | StaticRunner) -> RunnerPlan:
        """What a built runner resolved to."""
        model = runner.model
        assert runner.params.task is not None  # a runner is built for one task
        return cls(
            task=runner.params.task,
            normalize=bool(runner.params.use_activation),
            dimensions=runner.params.dimensions,
            max_length=runner.max_length,
            dtype=str(model.dtype).removeprefix("torch."),
            dtype_reason=getattr(model, "dtype_reason", ""),
            quantize=bool(model.options.quantize),
            truncation_side=str(runner.options.truncation_side),
        )


def plan_runner(recipe: RunnerRecipe) -> RunnerPlan | None:
    """What `build_runner(recipe)` will resolve to, or None when only loading the model can tell (the dtype:
    see `embedcli.models.precision.planned_dtype`)."""
    spec, options = recipe.model_spec, recipe.runner_options
    if spec.head == "static":  # the static kind: float32, its own Matryoshka default (`embedcli.compute.static`)
        dtype: tuple[str, str] | None = static_dtype(recipe.model_options)
        dimensions = static_dimensions(spec, options.dimensions)
    else:
        dtype = planned_dtype(spec, recipe.model_options)
        dimensions = run_dimensions(options.dimensions, spec.truncate_dim, options.task)
    if dtype is None or options.task not in spec.tasks:
        return None
    # PoolingParams.verify: the request's value, else the model's (a base model's Normalize), else True.
    normalize = options.normalize if options.task in ("embed", "token_embed") else None
    if normalize is None and spec.head in ("base", "static"):
        normalize = spec.normalize
    return RunnerPlan(
        task=options.task,
        normalize=True if normalize is None else bool(normalize),
        dimensions=dimensions,
        max_length=options.max_length or spec.max_length,
        dtype=dtype[0],
        dtype_reason=dtype[1],
        quantize=bool(recipe.model_options.quantize),
        truncation_side=resolved_side(options, spec),
    )
