"""The `embedcli` command line: one thin typer function per command, no logic.

`app` (the typer app and the one error → exit-code mapping), `options` (shared flags), `run_options`
(the unattended-run flags → `RunFlags`), `compute` (embed, rerank, score, classify, token tasks),
`batch` (run-batch: OpenAI batch files of vLLM's pooling requests), `families` (sparse-embed, and the LLM-reranker flags), `search` (search, download) and `tools` (info, bench,
inspect, merge). Heavy imports happen inside the commands, so `--help` stays fast.
"""

from __future__ import annotations

import atexit
import os
import sys

from embedcli.cli import batch, compute, families, search, tools
from embedcli.cli.app import app, narrowed
from embedcli.startup import pause

__all__ = ["app", "batch", "compute", "families", "main", "search", "tools"]


# OpenMP threads that wait for work sleep instead of spinning, unless the caller's environment says
# otherwise: beside a process busy on both of 2 cores, all-MiniLM-L6-v2 on 20 rows with torch's default
# 2 threads took 5.2-5.4 s wall (1.6-1.8 s CPU) spinning and 1.5-1.6 s (0.5 s CPU) passive, against
# 2.2-2.5 s for --threads 1 (README: Threads). It is read when torch's OpenMP runtime starts, so it is set
# here, before any command imports torch.
PASSIVE_WAIT = {"OMP_WAIT_POLICY": "PASSIVE"}


def main() -> None:
    """Console entry point."""
    for key, value in PASSIVE_WAIT.items():
        os.environ.setdefault(key, value)
    pause()  # the collector, until the work starts (`embedcli.startup`)
    try:
        narrowed(sys.argv[1:])()
    except SystemExit as stop:
        _exit(stop.code)


def _exit(code: object) -> None:
    """Leave with `code`; once torch is loaded, without tearing the interpreter down.

    Every output is committed (renamed, fsynced) before this point, so what is left is the
    interpreter's teardown of its modules, which with torch loaded takes ~0.4 s (`python -c
    "import torch"` 1.2 s vs 0.85 s with `os._exit`), a third of a one-row run. Exit handlers
    (atexit, weakref finalizers: temp dirs, logging, Ray) still run and stdio is flushed first.
    """
    if "torch" not in sys.modules or sys.getprofile() is not None or sys.gettrace() is not None:
        # A profiler, coverage or a debugger writes its results on the ordinary exit: keep it for them.
        raise SystemExit(code)
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe, a closed stream: nothing left to deliver
            pass
    os._exit(code or 0)
