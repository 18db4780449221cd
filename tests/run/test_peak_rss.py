"""`--stats`' peak_rss_mb is the run's own peak, not its parent's (Linux keeps ru_maxrss across exec)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

PARENT_MB = 300


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="/proc: Linux")
def test_a_child_of_a_big_process_reports_its_own_peak() -> None:
    held = bytearray(PARENT_MB << 20)
    held[::4096] = b"\1" * len(held[::4096])  # resident, not just reserved
    code = "from embedcli.run.report import peak_rss_mb; print(peak_rss_mb())"
    peak = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    del held
    assert 0 < peak < PARENT_MB / 2
