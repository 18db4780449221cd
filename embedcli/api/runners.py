"""The runners of one `Embedder`: built by the CLI's builder from the same recipes, once each, sharing the loaded
weights between tasks; and a command's `Computation` run over in-memory batches."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa

from embedcli.api.inputs import batches
from embedcli.compute.build import RunnerRecipe, build_engine, build_runner
from embedcli.io.reader_base import InputBatch
from embedcli.tasks.common import Computation

if TYPE_CHECKING:  # torch: loaded with the first model, not on import
    from embedcli.compute.runner import Runner
    from embedcli.compute.static import StaticRunner
    from embedcli.models.loader import LoadedModel
    from embedcli.models.options import ModelOptions


class Runners:
    """Runners by recipe, built on first use; runners whose load options are equal share one loaded model."""

    def __init__(self) -> None:
        self._models: list[tuple[ModelOptions, LoadedModel]] = []
        self._runners: list[tuple[RunnerRecipe, Runner | StaticRunner]] = []

    def engine(self, recipe: RunnerRecipe) -> Runner | StaticRunner:
        """The runner of `recipe` (a static model's numpy runner, else the torch `Runner`)."""
        for known, runner in self._runners:
            if known == recipe:
                return runner
        built: Runner | StaticRunner
        if recipe.model_spec.head == "static":
            built = build_engine(recipe)
        else:
            model = next((m for options, m in self._models if options == recipe.model_options), None)
            built = build_runner(recipe, model)
            if model is None:
                self._models.append((recipe.model_options, built.model))
        self._runners.append((recipe, built))
        return built

    def runner(self, recipe: RunnerRecipe) -> Runner:
        """The torch `Runner` of `recipe` (a static model is refused by the builder: embed and search only)."""
        if recipe.model_spec.head == "static":
            return build_runner(recipe)  # raises the builder's usage error
        return self.engine(recipe)  # type: ignore[return-value]  # not static: build_runner's Runner

    def rows(self, work: Computation, batch: InputBatch) -> Any:
        """The command's output rows for `batch` (its `id` column dropped: rows are in input order)."""
        runner = self.runner(work.recipe)
        if work.loaded is not None:
            work.loaded(runner)
        parts = batches(batch)
        results = runner.map(work.codec.inputs(part) for part in parts)
        try:
            tables = [work.codec.table(part, result) for part, result in zip(parts, results, strict=True)]
        finally:
            results.close()  # type: ignore[attr-defined]  # a generator: join the runner's prefetch thread
        table = pa.concat_tables(tables) if tables else work.codec.empty()
        return table.drop_columns(["id"])
