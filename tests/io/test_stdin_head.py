"""stdin's first record is checked before the model loads, and the run still reads every byte of stdin.

The head read for the check is handed back to the run's reader first (`embedcli.io.stdin_head`); reading stops
at the end of the first non-blank line, so a stream that pauses is still answered line by line.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

_PROBE = """
import atexit, runpy, sys
sys.argv = ["embedcli", *sys.argv[1:]]
atexit.register(lambda: print("torch imported:", "torch" in sys.modules, file=sys.stderr))
runpy.run_module("embedcli", run_name="__main__")
"""


def _env(tmp: Path) -> dict[str, str]:
    return {**os.environ, "EMBEDCLI_CACHE_DIR": str(tmp / "cache"), "OMP_NUM_THREADS": "1"}


def fresh(tmp: Path, stdin: str, *args: object) -> subprocess.CompletedProcess[str]:
    """`embedcli ARGS < stdin` in a new interpreter that says whether it imported torch."""
    return subprocess.run(
        [sys.executable, "-c", _PROBE, *map(str, args)], input=stdin, capture_output=True, text=True,
        env=_env(tmp), timeout=300,
    )


def imported_torch(result: subprocess.CompletedProcess[str]) -> bool:
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("torch imported:"), result.stderr
    return last.endswith("True")


@pytest.mark.parametrize("command", ["embed", "token-embed"])
@pytest.mark.parametrize(
    ("stdin", "args", "said"),
    [
        ("hello world\nsecond line\n", [], "pass --format txt"),
        ('{"body": "x"}\n', [], "no text field 'text'"),
        ('\n\n{"id": "a", "text": "x"}\n', ["--text-col", "body"], "no text field 'body'"),
        ("id,body\na,x\n", ["--format", "csv"], "text"),
        ('[{"text": "x"}]\n', [], "JSON array"),
    ],
    ids=["plain-text", "missing-field", "missing-field-after-blank-lines", "csv-header", "json-array"],
)
def test_a_stdin_input_mistake_is_said_before_the_model_loads(
    st_model: Path, tmp_path: Path, command: str, stdin: str, args: list[str], said: str
) -> None:
    result = fresh(tmp_path, stdin, command, "-", "-m", st_model, "-o", tmp_path / "o.parquet", *args)
    assert result.returncode == 1, result.stderr
    assert "<stdin>" in result.stderr and said in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert not imported_torch(result)
    assert not (tmp_path / "o.parquet").exists()


def test_every_stdin_row_is_read_after_the_head_check(st_model: Path, tmp_path: Path) -> None:
    rows = [{"id": f"r{i}", "text": f"row number {i} " * (i + 1)} for i in range(7)]
    body = "\n\n" + "".join(json.dumps(r) + "\n" for r in rows)
    corpus = tmp_path / "in.jsonl"
    corpus.write_text(body)
    piped = fresh(tmp_path, body, "embed", "-", "-m", st_model, "-o", tmp_path / "piped.parquet", "-q")
    assert piped.returncode == 0, piped.stderr
    from_file = fresh(tmp_path, "", "embed", corpus, "-m", st_model, "-o", tmp_path / "file.parquet", "-q")
    assert from_file.returncode == 0, from_file.stderr
    a, b = pq.read_table(tmp_path / "piped.parquet"), pq.read_table(tmp_path / "file.parquet")
    assert a.column("id").to_pylist() == [r["id"] for r in rows]
    assert a.column("embedding").to_pylist() == b.column("embedding").to_pylist()


def test_a_bad_first_line_under_on_error_skip_is_left_to_the_run(st_model: Path, tmp_path: Path) -> None:
    body = 'not json\n{"id": "a", "text": "fine"}\n'
    result = fresh(
        tmp_path, body, "embed", "-", "-m", st_model, "-o", tmp_path / "o.parquet", "--on-error", "skip",
        "--errors-file", tmp_path / "errors.jsonl",
    )
    assert result.returncode == 3, result.stderr  # rows were skipped
    assert pq.read_table(tmp_path / "o.parquet").column("id").to_pylist() == ["a"]


def test_a_paused_stream_is_answered_line_by_line(st_model: Path, tmp_path: Path) -> None:
    """The check reads one line ahead, not a buffer: the first row's output comes before the second is written."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "embedcli", "embed", "-", "-m", str(st_model), "-o", "-", "--output-format", "jsonl",
         "-q"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(tmp_path),
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(b'{"id": "first", "text": "one"}\n')
        proc.stdin.flush()
        deadline = time.monotonic() + 120
        while not select.select([proc.stdout], [], [], 1)[0]:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "no output for the first line while stdin stayed open"
        assert json.loads(proc.stdout.readline())["id"] == "first"
        proc.stdin.write(b'{"id": "second", "text": "two"}\n')
        proc.stdin.close()
        assert json.loads(proc.stdout.readline())["id"] == "second"
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture
def piped_stdin(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]  # yields a writer function
    """stdin as a real pipe (a descriptor, as in a shell pipeline); yields a function that writes to it."""
    r, w = os.pipe()
    reader = os.fdopen(r, "rb", buffering=0)
    monkeypatch.setattr(sys, "stdin", type("S", (), {"buffer": reader})())
    try:
        yield lambda data: os.write(w, data) if data else os.close(w)
    finally:
        reader.close()
        try:
            os.close(w)
        except OSError:
            pass


def test_the_head_stops_at_the_first_non_blank_line_and_comes_back_first(piped_stdin) -> None:  # type: ignore[no-untyped-def]
    from embedcli.io import stdin_head
    from embedcli.io.reader_base import numbered_lines, open_binary

    piped_stdin(b"\n  \nfirst line\nsecond")
    assert stdin_head.read_head() == b"\n  \nfirst line\nsecond"  # one read: what the pipe held
    piped_stdin(b" line\nthird\n")
    piped_stdin(b"")
    with open_binary("-") as f:
        lines = [raw for _, raw in numbered_lines(f, "-", idle=True) if raw is not None]
    assert b"".join(lines) == b"\n  \nfirst line\nsecond line\nthird\n"


def test_the_head_read_does_not_wait_past_its_line(piped_stdin) -> None:  # type: ignore[no-untyped-def]
    from embedcli.io import stdin_head
    from embedcli.io.reader_base import open_binary

    piped_stdin(b'{"a": 1}\n')
    start = time.monotonic()
    assert stdin_head.read_head() == b'{"a": 1}\n'  # the writer is still open: no wait for more
    assert time.monotonic() - start < 5
    with stdin_head.checking_head(), open_binary("-") as f:
        assert f.read() == b'{"a": 1}\n'
