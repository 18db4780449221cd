"""One builder per runner: a picklable `RunnerRecipe` (resolved spec, load options, runner options) and
`build_runner`, which the CLI's tasks, `embedcli.Embedder` and the Ray workers all call."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from embedcli.compute.choice import embed_prompt, require_task
from embedcli.compute.options import RunnerOptions
from embedcli.errors import UsageError
from embedcli.models.options import ModelOptions
from embedcli.models.spec import ModelSpec
from embedcli.startup import resume

if TYPE_CHECKING:
    from embedcli.compute.runner import Runner
    from embedcli.compute.static import StaticRunner
    from embedcli.models.loader import LoadedModel


@dataclass(frozen=True)
class RunnerRecipe:
    """Everything a process needs to rebuild a runner: small and picklable (no weights)."""

    model_spec: ModelSpec
    model_options: ModelOptions
    runner_options: RunnerOptions
    threads: int | None = None


# oneDNN (and its ideep wrapper in torch) keep every matmul kernel they build, keyed by shape, up to 1,024 each;
# a packed forward's row count changes from pack to pack, so a run of 100k rows through a tiny model grew by
# ~2.4 KB a row (474 -> 792 MB over 195k rows), native memory tracemalloc does not see. 64 of each keeps a
# forward's own shapes (every layer reuses them) and bounds the rest; both are read when oneDNN first builds
# a kernel, so they are set here, before the model loads (a value the caller set is kept).
ONEDNN_CACHES = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64", "LRU_CACHE_CAPACITY": "64"}


def bounded_kernel_caches() -> None:
    """Bound oneDNN's kernel caches (see `ONEDNN_CACHES`) unless the environment sets them."""
    for key, value in ONEDNN_CACHES.items():
        os.environ.setdefault(key, value)


# torch scans every installed distribution's entry points for out-of-tree device backends (`torch.backends`)
# when it is imported: 30-65 ms of a one-row start (more the more packages are installed). `cpu` and `cuda`
# are built in, so for them the scan finds nothing embedcli can use; any other device keeps it, and a value
# the caller set is kept.
BUILTIN_DEVICES = ("auto", "cpu", "cuda")


def skip_backend_autoload(device: str) -> None:
    """Skip torch's scan for out-of-tree device backends when `device` is built into torch."""
    if device.partition(":")[0] in BUILTIN_DEVICES:
        os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")


def tokenizer_threads(threads: int | None) -> None:
    """Size the tokenizers' (Rust) thread pool to `threads`; None leaves it at all cores."""
    # The pool reads RAYON_NUM_THREADS once, when a first batch is tokenized; the runner is built before that.
    if threads:
        os.environ["RAYON_NUM_THREADS"] = str(threads)


def build_engine(recipe: RunnerRecipe) -> Runner | StaticRunner:
    """The embed engine of `recipe`: a static model's numpy runner (no torch), else `build_runner`'s."""
    if recipe.model_spec.head == "static":
        from embedcli.compute.static import StaticRunner

        tokenizer_threads(recipe.threads)
        runner = StaticRunner(recipe.model_spec, recipe.model_options, recipe.runner_options)
        resume()  # the work starts: the collector back on (`embedcli.startup`)
        return runner
    return build_runner(recipe)


def build_runner(recipe: RunnerRecipe, model: LoadedModel | None = None) -> Runner:
    """The runner of `recipe` (loading its model unless `model` is that model already loaded)."""
    if recipe.model_spec.head == "static":  # a caller that needs the torch Runner's packing or token outputs
        raise UsageError(
            f"{recipe.model_spec.name}: a static embedding model serves `embed` and `search` only (numpy, no torch)"
        )
    # torch loads here, not at import: a task plans its run (and may find nothing to do) without it.
    bounded_kernel_caches()
    skip_backend_autoload(recipe.model_options.device)
    import torch

    from embedcli.compute.runner import Runner
    from embedcli.models.loader import LoadedModel

    if recipe.threads:
        tokenizer_threads(recipe.threads)
        torch.set_num_threads(recipe.threads)
    if model is None:
        model = LoadedModel(recipe.model_spec, recipe.model_options)
    runner = Runner(model, recipe.runner_options)
    resume()  # the work starts: the collector back on (`embedcli.startup`)
    return runner


def embed_recipe(
    spec: ModelSpec,
    model_options: ModelOptions,
    *,
    max_batch_tokens: int | None = None,
    normalize: bool | None = None,
    strip: bool = False,
    dimensions: int | None = None,
    prompt: str | None = None,
    prompt_name: str | None = None,
    long_inputs: str = "truncate",
    truncation_side: str | None = None,
    threads: int | None = None,
) -> RunnerRecipe:
    """The recipe of `embedcli embed`'s runner for a resolved model (the model's default prompt applies)."""
    require_task(spec, "embed", "embed")
    options = RunnerOptions(
        task="embed",
        max_batch_tokens=max_batch_tokens,
        normalize=normalize,
        strip=strip,
        dimensions=dimensions,
        prompt=embed_prompt(spec, prompt, prompt_name),
        long_inputs=long_inputs,  # type: ignore[arg-type]  # typer's Literal choices; RunnerOptions takes the same values
        truncation_side=truncation_side,  # type: ignore[arg-type]  # typer's Literal choices; RunnerOptions takes the same values
    )
    return RunnerRecipe(spec, model_options, options, threads)
