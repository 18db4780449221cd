"""`--engine ray`: a run's slices read, computed and written on a Ray Data actor pool; the driver coordinates.

The driver (the embedcli process) plans the inputs into slices and commits the manifest
(`embedcli.run.sliced`); it reads no row, holds no model and writes no shard. `RayDataEngine.run_slices` turns
the plan into a Ray Data pipeline:

    ray.data.from_items(slices)                              one small item per slice
      .map_batches(SliceActor, compute=ActorPoolStrategy(size=--workers), batch_size=1,
                   num_cpus=1, num_gpus=--gpus-per-worker)   one model per actor, GPUs when asked
      .iter_batches()                                        results in plan order (preserve_order)

Each `SliceActor` builds the runner once from the run's `RunnerRecipe` (the model spec, load options with the
dtype the driver's provenance names, runner options: never weights), then for each slice calls
`SliceWork.run`: the slice is read from its start point to its stop (embedcli's own readers, so bad rows, ids
and types are the local engine's), tokenized and run through the forward (`Runner.map`, batches cut as a
local run cuts them) and written as one shard's files into the staging directory; the actor sends back names,
counts and the ids' hashes. Actors that die are restarted by Ray and their slice is retried (a retry replaces
its own files); a slice that keeps failing ends the run after the slices before it are committed, and the
rerun resumes from the manifest.

Ray is optional (`pip install 'embedcli[ray]'`) and imported only when a run starts.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import pickle
import re
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa

from embedcli.compute.build import RunnerRecipe, build_runner
from embedcli.compute.options import RunStats
from embedcli.errors import EmbedcliError, UsageError

INSTALL_HINT = "pip install 'embedcli[ray]'  (ray[data]==2.60.0)"

RETRIES = 3
"""How often a slice whose worker died is retried (on the restarted worker) before the run stops, resumable."""
FORWARDED_ENV = ("AWS_", "GOOGLE_", "GCS_", "STORAGE_EMULATOR_HOST", "HF_", "HUGGING_FACE_", "EMBEDCLI_")
"""Environment the workers get from the driver (object-store credentials and endpoints, embedcli settings)."""


def require_ray() -> Any:
    """`import ray`, or a UsageError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise UsageError(f"--engine ray needs Ray, which is not installed: {INSTALL_HINT}") from None
    return ray


def add_stats(stats: Any, delta: dict[str, Any]) -> None:
    """Add a worker's `stats_delta` to the driver's run stats (seconds per step, and the counters)."""
    for key, value in delta.items():
        if key == "seconds":
            for k, v in value.items():
                stats.seconds[k] = stats.seconds.get(k, 0.0) + v
        elif hasattr(stats, key) and isinstance(value, (int, float)):
            setattr(stats, key, getattr(stats, key) + value)


def stats_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """A runner's counters after a piece of work less those before it."""
    out: dict[str, Any] = {}
    for key, value in after.items():
        if isinstance(value, dict):
            out[key] = {k: v - before.get(key, {}).get(k, 0) for k, v in value.items()}
        elif isinstance(value, (int, float)):
            out[key] = value - before.get(key, 0)
    return out


class SliceActor:
    """One worker of the pool: a model copy (its runner built once) doing whole slices (a Ray Data callable
    class: a batch is a table of pickled `InputSlice`s, the result a table of pickled `SliceResult`s)."""

    def __init__(self, payload: bytes) -> None:
        # One pickle for the three: a codec and the `loaded` hook that fills it in stay one object.
        recipe, loaded, work = pickle.loads(payload)
        self.runner = build_runner(recipe)
        if loaded is not None:
            loaded(self.runner)
        work.enter()
        self.work = work

    def __call__(self, batch: pa.Table) -> pa.Table:
        out = []
        for raw in batch.column("slice").to_pylist():
            piece = pickle.loads(raw)
            before = self.runner.stats.to_dict()
            result = self.work.run(self.runner, piece)
            result.stats = stats_delta(before, self.runner.stats.to_dict())
            out.append(pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL))
        return pa.table({"result": pa.array(out, pa.binary())})


def _embedcli_cause(e: BaseException) -> BaseException | None:
    """The embedcli error behind a Ray error (a worker's), if any."""
    seen = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, EmbedcliError):
            return cur
        cause = getattr(cur, "cause", None)
        cur = cause if isinstance(cause, BaseException) else cur.__cause__
    return None


def worker_failure(e: BaseException) -> EmbedcliError:
    """A failure of the Ray side (a worker that cannot start or keeps dying) as one line: its last error."""
    lines = [line.strip() for line in str(e).splitlines()]
    cause = next((line for line in reversed(lines) if re.match(r"^[A-Za-z_.]*(Error|Exception|Exit)\b.*:", line)),
                 lines[0] if lines and lines[0] else type(e).__name__)
    hint = ""
    if "ModuleNotFoundError" in cause or "ImportError" in cause:
        hint = "; every node needs the same embedcli installed, with `pip install 'embedcli[ray]'`"
    return EmbedcliError(
        f"--engine ray: the workers failed ({cause}){hint}; the slices committed so far are kept: "
        "rerun the same command to resume"
    )


def quiet_ray_data() -> None:
    """Ray Data's notes (execution plans, progress bars) off the run's stderr; its warnings stay, and its
    errors come back as the run's one-line error (`worker_failure`)."""
    for name in ("ray.data", "ray.data._internal.execution.streaming_executor"):
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.getLogger("ray.data.exceptions").setLevel(logging.CRITICAL)
    logging.getLogger("ray.data._internal.progress").setLevel(logging.ERROR)  # "progress bars disabled": ours


class RayDataEngine:
    """The run's engine under `--engine ray` (see the module docstring); `embedcli.run` sees a `SliceEngine`."""

    def __init__(
        self,
        recipe: RunnerRecipe,
        *,
        address: str | None,
        workers: int,
        gpus_per_worker: float = 0.0,
        cpus_per_worker: float = 1.0,
        max_length: int,
        max_batch_tokens: int,
        loaded: Callable[[Any], None] | None = None,
    ) -> None:
        self.recipe = recipe
        self.address = address
        self.workers = workers
        self.gpus = gpus_per_worker
        self.cpus = cpus_per_worker
        self.loaded = loaded
        self.stats = RunStats()
        self._max_length = max_length
        self.max_batch_tokens = max_batch_tokens
        self._ray: Any = None
        self.room = workers

    @property
    def max_length(self) -> int:
        """The model's token limit per sequence."""
        return self._max_length

    def set_max_length(self, max_length: int) -> None:
        """The model's token limit, once the plan says it."""
        self._max_length = max_length

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` run once on the cluster with a worker's resources (e.g. to resolve what only its device
        can tell); its embedcli errors are raised here."""
        self.start()
        ray = self._ray
        task = ray.remote(num_cpus=self.cpus, num_gpus=self.gpus or None, max_retries=0)(fn)
        try:
            return ray.get(task.remote(*args))
        except Exception as e:
            cause = _embedcli_cause(e)
            if cause is not None:
                raise cause from None
            raise

    # -- the cluster -----------------------------------------------------------------------------------
    def start(self) -> None:
        """Join the cluster (`--ray-address`, `$RAY_ADDRESS`, else a local one) once there is work."""
        if self._ray is not None:
            return
        ray = require_ray()
        if not ray.is_initialized():
            # Ray's note that its local cluster uses token authentication is not the run's business.
            logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
            env = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_ENV)}
            ray.init(address=self.address, include_dashboard=False, logging_level=logging.WARNING,
                     log_to_driver=False, runtime_env={"env_vars": env} if env else None)
        self._ray = ray
        self._check_room()

    def _check_room(self) -> None:
        """UsageError when the cluster cannot hold one worker; fewer workers (noted) when it holds fewer."""
        total = self._ray.cluster_resources()
        fits = int(total.get("CPU", 0) // self.cpus) if self.cpus else self.workers
        if self.gpus:
            fits = min(fits, int(total.get("GPU", 0) // self.gpus))
        if fits < 1:
            need = f"{self.cpus:g} CPU" + (f" and {self.gpus:g} GPU" if self.gpus else "")
            have = f"{total.get('CPU', 0):g} CPUs and {total.get('GPU', 0):g} GPUs"
            raise UsageError(f"--engine ray: a worker needs {need}; the Ray cluster has {have}")
        self.room = min(self.workers, fits)

    @property
    def parallelism(self) -> int:
        """The workers a run gets: --workers, or as many as the cluster holds when it holds fewer."""
        self.start()
        return self.room

    # -- the Engine protocol ---------------------------------------------------------------------------
    def map(self, batches: Any) -> Iterator[Any]:
        """Not how this engine runs: it is handed whole slices (`run_slices`)."""
        raise UsageError("--engine ray runs whole slices of input files; this command's rows cannot be sliced")

    def run_slices(self, work: Any, slices: Sequence[Any]) -> Iterator[Any]:
        """The `SliceResult` of each slice, in plan order, as the pool finishes them."""
        self.start()
        ray = self._ray
        importlib.import_module("ray.data")  # `ray.data` is a subpackage Ray imports on first use
        quiet_ray_data()
        payload = ray.cloudpickle.dumps((self.recipe, self.loaded, work))  # `loaded` may be a closure
        items = [{"slice": pickle.dumps(s, protocol=pickle.HIGHEST_PROTOCOL)} for s in slices]
        ctx = ray.data.DataContext.get_current()
        saved = (ctx.execution_options.preserve_order, ctx.enable_progress_bars)
        ctx.execution_options.preserve_order = True  # results in plan order: commits stay a prefix
        ctx.enable_progress_bars = False
        try:
            with warnings.catch_warnings():
                # Ray Data names no parameter for task retries; its default (retry forever) would loop on a slice
                # that kills every worker it meets. A dead actor is still restarted, whatever the count.
                warnings.filterwarnings("ignore", message=".*ray_remote_args.* is deprecated")
                ds = ray.data.from_items(items, override_num_blocks=len(items)).map_batches(
                    SliceActor,
                    fn_constructor_args=(payload,),
                    batch_size=1,
                    batch_format="pyarrow",
                    compute=ray.data.ActorPoolStrategy(size=min(self.room, len(items))),
                    num_cpus=self.cpus,
                    num_gpus=self.gpus or None,
                    zero_copy_batch=True,
                    max_task_retries=RETRIES,
                )
            batches = ds.iter_batches(batch_size=None, batch_format="pyarrow", prefetch_batches=0)
        finally:
            ctx.execution_options.preserve_order, ctx.enable_progress_bars = saved
        try:
            for batch in batches:
                for raw in batch.column("result").to_pylist():
                    result = pickle.loads(raw)
                    self._add(result.stats)
                    yield result
        except Exception as e:
            cause = _embedcli_cause(e)
            raise (cause if cause is not None else worker_failure(e)) from None
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                with contextlib.suppress(Exception):
                    close()

    def _add(self, delta: dict[str, Any]) -> None:
        add_stats(self.stats, delta)
