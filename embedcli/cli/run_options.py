"""The CLI flags of unattended runs (the "Resume & errors", "Progress" and "Distributed" panels).

`@unattended` (under `@app.command`) adds them to a compute command and hands the command one checked
`RunFlags` as its `flags` argument; the command's own signature stays as it is.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from typing import Any

import typer

from embedcli.errors import UsageError
from embedcli.run.flags import DISTRIBUTED, PROGRESS, RESUME, RunFlags
from embedcli.run.signals import terminate_as_interrupt


def _env(flag: str) -> str:
    return "EMBEDCLI_" + flag.upper().replace("-", "_")


def on_error_option(default: str = RunFlags.on_error,
                    rows: str = "malformed line, null text, duplicate id, bad UTF-8") -> Any:
    """`--on-error` with a command's own default (and the bad rows it can meet)."""
    return typer.Option(
        default, "--on-error", envvar=_env("on-error"), rich_help_panel=RESUME,
        help=f"Bad rows ({rows}): fail stops with exit 1; skip records them and goes on (exit 3).",
    )


OPT_ERRORS_FILE = typer.Option(
    None, "--errors-file", envvar=_env("errors-file"), rich_help_panel=RESUME,
    help="Write every bad row (file, location, id, reason, fix) to this JSONL file.",
)
OPT_MAX_ERRORS = typer.Option(
    None, "--max-errors", envvar=_env("max-errors"), rich_help_panel=RESUME,
    help="With --on-error skip: stop with exit 1 once more than this many rows were skipped.",
)


def _options(on_error: str | None = None) -> list[tuple[str, Any, Any]]:
    """(parameter name, annotation, typer.Option) of every flag the decorator adds (`on_error`: the
    command's own default for --on-error)."""
    d = RunFlags(on_error=on_error or RunFlags.on_error)
    return [
        ("overwrite", bool, typer.Option(
            False, "--overwrite", envvar=_env("overwrite"), rich_help_panel=RESUME,
            help="Replace an output (or discard an interrupted run's staged work) made with a different config; "
            "without it such a rerun stops with exit 2.",
        )),
        ("incremental", bool, typer.Option(
            False, "--incremental", envvar=_env("incremental"), rich_help_panel=RESUME,
            help="Compute only rows whose id is new or whose text changed since the previous output "
            "(the -o path itself, or --previous); carry the rest over. Every Parquet output gets its row keys in "
            "OUT.embedcli-index.parquet, so a first run without this flag can be carried over by the next.",
        )),
        ("previous", str | None, typer.Option(
            None, "--previous", envvar=_env("previous"), rich_help_panel=RESUME,
            help="With --incremental: the earlier output to carry rows over from (default: the -o path); a local path, "
            "s3://BUCKET/KEY or gs://BUCKET/KEY (fetched with its sidecars).",
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
        ("on_error", str, on_error_option(d.on_error)),
        ("errors_file", str | None, OPT_ERRORS_FILE),
        ("max_errors", int | None, OPT_MAX_ERRORS),
        ("log_every", float, typer.Option(
            d.log_every, "--log-every", envvar=_env("log-every"), rich_help_panel=PROGRESS,
            help="When stderr is not a terminal: one progress line every this many seconds.",
        )),
        *_distributed_options(),
    ]


def _distributed_options() -> list[tuple[str, Any, Any]]:
    """The "Distributed" panel: the Ray engine and static sharding (see `embedcli.run.sharding`)."""
    d = RunFlags()
    return [
        ("engine", str, typer.Option(
            d.engine, "--engine", envvar=_env("engine"), rich_help_panel=DISTRIBUTED,
            help="local: this process. ray: Ray Data workers (one model each) read, compute and write slices of "
            "the inputs; output, resume and errors are unchanged. Needs pip install 'embedcli\\[ray]'.",
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


def unattended(fn: Callable[..., Any] | None = None, *, on_error: str | None = None) -> Callable[..., Any]:
    """Decorator for compute commands: adds the resume/error/progress flags; the body gets them as `flags`.

    Put it under `@app.command(...)`; the body takes a keyword `flags: RunFlags` that typer does not see. SIGTERM is turned into KeyboardInterrupt for the whole command,
    so a run stopped before its loop starts still exits 130. `@unattended(on_error="skip")` gives a command
    its own --on-error default.
    """
    if fn is None:
        return lambda f: unattended(f, on_error=on_error)
    options = _options(on_error)
    names = {name for name, _, _ in options}
    signature = inspect.signature(fn)
    hints = typing.get_type_hints(fn)
    params = [p for p in signature.parameters.values() if p.name != "flags"]
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
        own = {name: kwargs.pop(name) for name in names}
        try:
            flags = RunFlags(**own)
        except UsageError as e:
            typer.echo(f"embedcli: usage error: {e}", err=True)
            raise typer.Exit(2) from None
        with terminate_as_interrupt():
            return fn(**kwargs, flags=flags)

    wrapper.__name__ = fn.__name__
    wrapper.__qualname__ = fn.__qualname__
    wrapper.__doc__ = fn.__doc__
    wrapper.__module__ = fn.__module__
    wrapper.__signature__ = new_signature  # type: ignore[attr-defined]  # typer reads a wrapper's __signature__
    wrapper.__annotations__ = {p.name: p.annotation for p in new_signature.parameters.values()}
    wrapper.__annotations__["return"] = new_signature.return_annotation
    return wrapper
