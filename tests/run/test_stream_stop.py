"""`-o -` streams each batch as it is done, and SIGTERM stops a run within seconds, even mid-batch.

Real `embedcli embed` processes reading a pipe that the test holds open: on a pipe the reader hands on
what has arrived when the writer pauses, the sink flushes each batch, and a signal that arrives while the
loop waits for a result stops it at once (the written batches are committed; the rest reruns).
"""

from __future__ import annotations

import json
import select
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.resume.resume_helpers import embed_argv, subprocess_env

START_S = 120  # process start-up (torch import, model load) on a loaded 2-core machine
STOP_S = 10  # from SIGTERM to exit, start-up excluded (teardown alone takes seconds under load)


def _first_line(proc: subprocess.Popen, timeout: float) -> bytes:
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, "no output line while the input stayed open"
    return proc.stdout.readline()


@pytest.fixture
def piped(st_model: Path, tmp_path: Path):  # type: ignore[no-untyped-def]
    """An `embedcli embed - -o -` process with 5 rows written to its stdin, which stays open."""
    err = (tmp_path / "stderr.txt").open("wb")
    proc = subprocess.Popen(
        embed_argv("-", "-m", st_model, "-o", "-", "--log-every", "0"),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=subprocess_env(),
    )
    assert proc.stdin is not None
    for i in range(5):
        proc.stdin.write((json.dumps({"id": f"r{i}", "text": f"hello world number {i}"}) + "\n").encode())
    proc.stdin.flush()
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    err.close()


def test_stdout_streams_rows_before_the_input_ends(piped: subprocess.Popen) -> None:
    line = json.loads(_first_line(piped, START_S))
    assert line["id"] == "r0" and len(line["embedding"]) == 32
    piped.stdin.close()
    assert piped.wait(timeout=START_S) == 0
    assert len(piped.stdout.read().splitlines()) == 4


def test_sigterm_stops_within_seconds_while_waiting_for_input(piped: subprocess.Popen, tmp_path: Path) -> None:
    _first_line(piped, START_S)  # started and computing; the input stays open
    t0 = time.monotonic()
    piped.send_signal(signal.SIGTERM)
    assert piped.wait(timeout=STOP_S + 50) == 130
    assert time.monotonic() - t0 < STOP_S
    assert "stopped by SIGTERM" in (tmp_path / "stderr.txt").read_text()
