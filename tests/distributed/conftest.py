"""Fixtures of the distributed tests: the tiny sentence-transformers model and in-process runs."""

from __future__ import annotations

import traceback
from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def st_model(tiny_model: Callable[[str], Path]) -> Path:
    """The tiny sentence-transformers model (BERT 2x32, mean pooling, Normalize)."""
    return tiny_model("bert-st")


@pytest.fixture
def cli(torch_single_thread):  # type: ignore[no-untyped-def]
    """`cli(*args, code=0) -> Result`: `embedcli ARGS` in-process, float32; checks the exit code."""
    from typer.testing import CliRunner

    from embedcli.cli import app

    runner = CliRunner()

    def invoke(*args: object, code: int | None = 0, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
        result = runner.invoke(app, [str(a) for a in args], env={"EMBEDCLI_DTYPE": "float32", **(env or {})})
        if code is not None and result.exit_code != code:
            tb = ""
            if result.exc_info and not isinstance(result.exception, SystemExit):
                tb = "".join(traceback.format_exception(*result.exc_info))
            raise AssertionError(f"exit {result.exit_code} != {code}\nstdout: {result.stdout}\nstderr: {result.stderr}\n{tb}")
        return result

    return invoke
