"""The console script's exit once torch is loaded: exit handlers run, stdout is whole, the code is kept,
and the interpreter's teardown (a third of a one-row run) is skipped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# `embedcli ARGS` as the console script runs it, with an exit handler and an object finalized only by teardown.
_SCRIPT = """
import atexit, os, sys
marker = sys.argv[1]

class Teardown:
    # names held by the object: module globals may be gone when teardown reaches it
    def __init__(self):
        self.fd, self.write = os.open(marker + ".teardown", os.O_WRONLY | os.O_CREAT), os.write

    def __del__(self):
        self.write(self.fd, b"t")

keep = Teardown()
atexit.register(lambda: open(marker + ".atexit", "w").close())
if sys.argv[2] == "torch":
    import torch  # noqa: F401
sys.argv = ["embedcli", *sys.argv[3:]]
from embedcli.cli import main
main()
"""


def _run(tmp_path: Path, torch_first: bool, *args: object) -> tuple[subprocess.CompletedProcess[str], Path]:
    marker = tmp_path / "marker"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "EMBEDCLI_CACHE_DIR": str(tmp_path / "cache")}
    result = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(marker), "torch" if torch_first else "-", *map(str, args)],
        capture_output=True, text=True, env=env, timeout=300,
    )
    return result, marker


@pytest.fixture()
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"id": f"r{i}", "text": f"row {i} " * (i % 7 + 1)}) + "\n" for i in range(300)))
    return path


def test_stdout_is_whole_and_exit_handlers_run(st_model: Path, corpus: Path, tmp_path: Path) -> None:
    result, marker = _run(tmp_path, False, "embed", corpus, "-m", st_model, "-o", "-", "--dtype", "float32", "-q")
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["id"] for r in rows] == [f"r{i}" for i in range(300)]
    assert Path(f"{marker}.atexit").exists()
    assert Path(f"{marker}.teardown").read_bytes() == b""  # torch was loaded: no teardown


@pytest.mark.parametrize("torch_first", [True, False])
def test_an_error_keeps_its_code_and_message(torch_first: bool, tmp_path: Path) -> None:
    missing = tmp_path / "missing.jsonl"
    # float32: planned without the model, so without torch_first nothing imports torch before the error
    result, marker = _run(tmp_path, torch_first, "embed", missing, "-o", tmp_path / "o.parquet", "--dtype", "float32")
    assert result.returncode == 1
    assert "missing.jsonl" in result.stderr and result.stderr.strip().startswith("embedcli:")
    assert Path(f"{marker}.atexit").exists()
    # without torch the ordinary exit, teardown included (it is fast then)
    assert Path(f"{marker}.teardown").read_bytes() == (b"" if torch_first else b"t")


def test_a_profiled_run_keeps_the_ordinary_exit(st_model: Path, corpus: Path, tmp_path: Path) -> None:
    """`python -m cProfile -o F -m embedcli ...` writes F when the run returns: no fast exit under a profiler."""
    stats = tmp_path / "run.prof"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "EMBEDCLI_CACHE_DIR": str(tmp_path / "cache")}
    args = ["embed", corpus, "-m", st_model, "-o", tmp_path / "o.parquet", "--dtype", "float32", "-q"]
    result = subprocess.run(
        [sys.executable, "-m", "cProfile", "-o", str(stats), "-m", "embedcli", *map(str, args)],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert stats.stat().st_size > 0
