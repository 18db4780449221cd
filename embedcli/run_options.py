"""Settings of unattended runs (resume, incremental, bad rows, progress) and the CLI flags that set them.

Every compute command shares one loop (`embedcli.jobs.run_rows`); it reads these settings from a
context variable, so a command only needs the `@unattended` decorator (under `@app.command`) to gain
the flags of the "Resume & errors" panel and `--log-every`; its own signature stays as it is.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

ON_ERROR = ("fail", "skip")
RESUME = "Resume & errors"
PROGRESS = "Progress"
DISTRIBUTED = "Distributed"
ENGINES = ("local", "ray")


@dataclass(frozen=True)
class RunSettings:
    """How a run commits, resumes, treats bad rows and reports progress."""

    on_error: str = "fail"
    errors_file: str | None = None
    max_errors: int | None = None
    overwrite: bool = False
    incremental: bool = False
    previous: str | None = None
    shards_dir: bool = False
    shard_rows: int = 20_000
    commit_every: float = 60.0
    log_every: float = 30.0
    engine: str = "local"
    ray_address: str | None = None
    workers: int = 1
    gpus_per_worker: float = 0.0
    shard: str | None = None

    def check(self) -> RunSettings:
        """Raise UsageError for bad or conflicting values."""
        from embedcli.jobs import UsageError

        if self.on_error not in ON_ERROR:
            raise UsageError(f"--on-error {self.on_error!r}: choose fail or skip")
        if self.max_errors is not None:
            if self.max_errors < 0:
                raise UsageError("--max-errors must be 0 or more")
            if self.on_error != "skip":
                raise UsageError("--max-errors only applies with --on-error skip")
        if self.previous and not self.incremental:
            raise UsageError("--previous only applies with --incremental")
        if self.shard_rows < 1:
            raise UsageError("--shard-rows must be at least 1")
        if self.commit_every <= 0:
            raise UsageError("--commit-every must be more than 0 seconds")
        if self.log_every < 0:
            raise UsageError("--log-every must be 0 or more seconds")
        from embedcli.sharding import check_distributed

        check_distributed(self)
        return self


_CURRENT: contextvars.ContextVar[RunSettings | None] = contextvars.ContextVar("embedcli_run_settings", default=None)


def current_settings() -> RunSettings:
    """The settings of the command being run (defaults outside the CLI)."""
    return _CURRENT.get() or RunSettings()


@contextlib.contextmanager
def use_settings(settings: RunSettings | None = None, **changes: Any) -> Iterator[RunSettings]:
    """Run a block with these settings (from Python: `with use_settings(on_error="skip"): run_embed(...)`)."""
    value = replace(settings or current_settings(), **changes)
    token = _CURRENT.set(value)
    try:
        yield value
    finally:
        _CURRENT.reset(token)


def _env(flag: str) -> str:
    return "EMBEDCLI_" + flag.upper().replace("-", "_")


def _options() -> list[tuple[str, Any, Any]]:
    """(parameter name, annotation, typer.Option) of every flag the decorator adds."""
    import typer

    d = RunSettings()
    return [
        ("overwrite", bool, typer.Option(
            False, "--overwrite", envvar=_env("overwrite"), rich_help_panel=RESUME,
            help="Replace an output (or discard an interrupted run's staged work) made with a different config; "
            "without it such a rerun stops with exit 2.",
        )),
        ("incremental", bool, typer.Option(
            False, "--incremental", envvar=_env("incremental"), rich_help_panel=RESUME,
            help="Compute only rows whose id is new or whose text changed since the previous output "
            "(the -o path itself, or --previous); carry the rest over.",
        )),
        ("previous", str | None, typer.Option(
            None, "--previous", envvar=_env("previous"), rich_help_panel=RESUME,
            help="With --incremental: the earlier output to carry rows over from (default: the -o path).",
        )),
        ("shards_dir", bool, typer.Option(
            False, "--shards-dir", envvar=_env("shards-dir"), rich_help_panel=RESUME,
            help="Write a directory of Parquet shards (part-NNNNNN.parquet + _embedcli/manifest.json) "
            "instead of one file; also chosen by an -o path ending in /.",
        )),
        ("shard_rows", int, typer.Option(
            d.shard_rows, "--shard-rows", envvar=_env("shard-rows"), rich_help_panel=RESUME,
            help="Commit work every this many input rows (a killed run loses at most one shard).",
        )),
        ("commit_every", float, typer.Option(
            d.commit_every, "--commit-every", envvar=_env("commit-every"), rich_help_panel=RESUME,
            help="Also commit when this many seconds passed since the last commit.",
        )),
        ("on_error", str, typer.Option(
            d.on_error, "--on-error", envvar=_env("on-error"), rich_help_panel=RESUME,
            help="Bad rows (malformed line, null text, duplicate id, bad UTF-8): fail stops with exit 1; "
            "skip records them and goes on (exit 3).",
        )),
        ("errors_file", str | None, typer.Option(
            None, "--errors-file", envvar=_env("errors-file"), rich_help_panel=RESUME,
            help="Write every bad row (file, location, id, reason, fix) to this JSONL file.",
        )),
        ("max_errors", int | None, typer.Option(
            None, "--max-errors", envvar=_env("max-errors"), rich_help_panel=RESUME,
            help="With --on-error skip: stop with exit 1 once more than this many rows were skipped.",
        )),
        ("log_every", float, typer.Option(
            d.log_every, "--log-every", envvar=_env("log-every"), rich_help_panel=PROGRESS,
            help="When stderr is not a terminal: one progress line every this many seconds.",
        )),
        *_distributed_options(),
    ]


def _distributed_options() -> list[tuple[str, Any, Any]]:
    """The "Distributed" panel: the Ray engine and static sharding (see `embedcli.sharding`)."""
    import typer

    d = RunSettings()
    return [
        ("engine", str, typer.Option(
            d.engine, "--engine", envvar=_env("engine"), rich_help_panel=DISTRIBUTED,
            help="local: this process. ray: a pool of Ray actors (each loads the model once and runs the same "
            "runner); output, resume and errors are unchanged. Needs pip install 'embedcli\\[ray]'.",
        )),
        ("ray_address", str | None, typer.Option(
            None, "--ray-address", envvar=_env("ray-address"), rich_help_panel=DISTRIBUTED,
            help="With --engine ray: the cluster to join (auto, or ray://HOST:10001); default: $RAY_ADDRESS, "
            "else a local cluster started for the run.",
        )),
        ("workers", int, typer.Option(
            d.workers, "--workers", envvar=_env("workers"), rich_help_panel=DISTRIBUTED,
            help="With --engine ray: number of model actors (each holds one copy of the model).",
        )),
        ("gpus_per_worker", float, typer.Option(
            d.gpus_per_worker, "--gpus-per-worker", envvar=_env("gpus-per-worker"), rich_help_panel=DISTRIBUTED,
            help="With --engine ray: GPUs each actor reserves (0: CPU actors; 0.5: two actors share a GPU).",
        )),
        ("shard", str | None, typer.Option(
            None, "--shard", envvar=_env("shard"), rich_help_panel=DISTRIBUTED,
            help="K/N: compute only the K-th of N contiguous slices of the input records (0-based), for N "
            "independent runs without Ray (Slurm arrays, cron); check the set with embedcli inspect OUT-* "
            "--check and join it with embedcli merge OUT-* -o ALL.parquet.",
        )),
    ]


def unattended(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator for compute commands: adds the resume/error/progress flags and runs the body with them.

    Put it under `@app.command(...)`. SIGTERM is turned into KeyboardInterrupt for the whole command,
    so a run stopped before its loop starts still exits 130.
    """
    from embedcli.signals import terminate_as_interrupt

    options = _options()
    names = {name for name, _, _ in options}
    signature = inspect.signature(fn)
    hints = typing.get_type_hints(fn)
    params = list(signature.parameters.values())
    clash = names & {p.name for p in params}
    if clash:
        raise TypeError(f"{fn.__name__} already has parameters {sorted(clash)}")
    added = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=annotation)
        for name, annotation, option in options
    ]
    params = [p.replace(annotation=hints.get(p.name, p.annotation)) for p in params]
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    keyword = [p for p in params if p.kind == p.KEYWORD_ONLY]
    new_signature = signature.replace(
        parameters=[*(p.replace(kind=p.KEYWORD_ONLY) for p in positional), *keyword, *added],
        return_annotation=hints.get("return", signature.return_annotation),
    )

    def wrapper(**kwargs: Any) -> Any:
        from embedcli.jobs import UsageError

        own = {name: kwargs.pop(name) for name in names}
        try:
            settings = RunSettings(**own).check()
        except UsageError as e:
            import typer

            typer.echo(f"embedcli: usage error: {e}", err=True)
            raise typer.Exit(2) from None
        with use_settings(settings), terminate_as_interrupt():
            return fn(**kwargs)

    wrapper.__name__ = fn.__name__
    wrapper.__qualname__ = fn.__qualname__
    wrapper.__doc__ = fn.__doc__
    wrapper.__module__ = fn.__module__
    wrapper.__signature__ = new_signature  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in new_signature.parameters.values()}
    wrapper.__annotations__["return"] = new_signature.return_annotation
    return wrapper
