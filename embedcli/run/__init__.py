"""The unattended run loop: one `Job` in, committed output and an exit code out.

Knows `embedcli.io` and `embedcli.errors` only (no torch, models, pooling, compute or engines): a `Job`
brings its engine and row codec (`embedcli.run.job`). `run_job` (`execute`) applies `--shard` (`sharding`, cut at
the run's cut points, `grid`) and shard repair, then the loop (`loop`) reads and checks rows (`source`,
`checks`, `ids`), splits them for `--incremental` (`incremental`), pools rows to compute across batches,
stages, commits and resumes (`staging`, `sinks`, `target`), reports (`report`, `progress`) and stops
cleanly on signals (`signals`). `flags` holds `RunFlags`.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "run_job": "execute",
    "RunFlags": "flags",
    "Engine": "job",
    "Job": "job",
    "Reporting": "job",
    "RowCodec": "job",
    "Target": "job",
    "BatchSource": "source",
    "InputOptions": "source",
}
__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    # `embedcli --help` imports `embedcli.run.flags`: keep the package itself free of pyarrow's start-up cost.
    if name in _LAZY:
        return getattr(importlib.import_module(f"embedcli.run.{_LAZY[name]}"), name)
    raise AttributeError(name)
