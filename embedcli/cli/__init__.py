"""The `embedcli` command line: one thin typer function per command, no logic.

`app` (the typer app and the one error → exit-code mapping), `options` (shared flags), `run_options`
(the unattended-run flags → `RunFlags`), `compute` (embed, rerank, score, classify, token tasks),
`batch` (run-batch: OpenAI batch files of vLLM's pooling requests), `families` (sparse-embed, and the LLM-reranker flags), `search` (search, download) and `tools` (info, bench,
inspect, merge). Heavy imports happen inside the commands, so `--help` stays fast.
"""

from __future__ import annotations

from embedcli.cli import batch, compute, families, search, tools
from embedcli.cli.app import app

__all__ = ["app", "batch", "compute", "families", "main", "search", "tools"]


def main() -> None:
    """Console entry point."""
    app()
