"""`RunFlags`: how an unattended run commits, resumes, treats bad rows, reports progress and scales out.

One frozen value, checked once when it is made and passed explicitly: the CLI builds it from the flags
of the "Resume & errors", "Progress" and "Distributed" panels (`embedcli.cli.run_options`); a Python
caller builds it directly.
"""

from __future__ import annotations

from dataclasses import dataclass

from embedcli.errors import UsageError

ON_ERROR = ("fail", "skip")
RESUME = "Resume & errors"
PROGRESS = "Progress"
DISTRIBUTED = "Distributed"
ENGINES = ("local", "ray")


@dataclass(frozen=True)
class RunFlags:
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

    def __post_init__(self) -> None:
        """Validated once, when made (a `dataclasses.replace` validates its copy): UsageError for bad or
        conflicting values."""
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
        self._check_distributed()

    def _check_distributed(self) -> None:
        if self.engine not in ENGINES:
            raise UsageError(f"--engine {self.engine!r}: choose local or ray")
        if self.workers < 1:
            raise UsageError("--workers must be at least 1")
        if self.gpus_per_worker < 0:
            raise UsageError("--gpus-per-worker must be 0 or more")
        if self.engine == "local" and (self.ray_address or self.workers != 1 or self.gpus_per_worker):
            raise UsageError("--ray-address, --workers and --gpus-per-worker need --engine ray")
        if self.shard is not None:
            parse_shard(self.shard)
            if self.incremental:
                raise UsageError("--shard and --incremental do not combine: run --incremental on the merged output")


def parse_shard(value: str) -> tuple[int, int]:
    """`"K/N"` → (K, N) with 0 <= K < N; UsageError otherwise."""
    try:
        k_text, n_text = value.split("/")
        k, n = int(k_text), int(n_text)
    except ValueError:
        raise UsageError(f"--shard {value!r}: expected K/N, e.g. 0/4 (K counts from 0)") from None
    if n < 1 or not 0 <= k < n:
        raise UsageError(f"--shard {value!r}: K must be in 0..N-1 and N at least 1")
    return k, n
