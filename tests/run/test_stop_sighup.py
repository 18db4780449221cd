"""Issue 22, poor errors: SIGHUP (the terminal or ssh session went away) commits and exits 130, as SIGTERM does."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

from tests.run.test_stream_stop import START_S, STOP_S, _first_line, piped

__all__ = ["piped"]  # the fixture, shared with test_stream_stop


def test_sighup_stops_within_seconds_and_exits_130(piped: subprocess.Popen, tmp_path: Path) -> None:
    _first_line(piped, START_S)
    t0 = time.monotonic()
    piped.send_signal(signal.SIGHUP)
    assert piped.wait(timeout=STOP_S + 50) == 130
    assert time.monotonic() - t0 < STOP_S
    assert "stopped by SIGHUP" in (tmp_path / "stderr.txt").read_text()
