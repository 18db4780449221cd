"""`--help` fits a screen per panel, common panels first, with words (FILE, COL, N) for values, not `<str>`."""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys

import pytest

COMMANDS = ["embed", "rerank", "score", "classify", "token-embed", "token-classify", "inspect", "merge", "info"]
PLACEHOLDER = re.compile(r"<(bool|str|int|float|list\[str\])>")


def _help(*args: str) -> str:
    env = {**os.environ, "COLUMNS": "120", "TERM": "dumb"}
    out = subprocess.run([sys.executable, "-m", "embedcli", *args, "--help"], env=env, capture_output=True,
                         text=True, timeout=120, check=True)
    return out.stdout


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_has_no_type_placeholders(command: str | None) -> None:
    text = _help(*([command] if command else []))
    assert not PLACEHOLDER.search(text), PLACEHOLDER.search(text)


def test_embed_help_panels_fit_a_screen_common_first() -> None:
    text = _help("embed")
    lines = text.splitlines()
    assert len(lines) <= 144  # 188 before: long texts moved to the README, one env-var note for all flags; +3: --threads; +1: input URLs
    panels = [m.group(1) for m in re.finditer(r"╭─ ([A-Za-z &]+) ─", text)]
    assert panels[:5] == ["Arguments", "Options", "Output", "Model", "Input"], panels
    starts = [i for i, line in enumerate(lines) if line.startswith("╭─")] + [len(lines)]
    assert max(b - a for a, b in itertools.pairwise(starts)) <= 50  # each panel fits a screen
    assert "embedcli-index.parquet" in text  # why the sidecar appears without --incremental
    assert "EMBEDCLI_<FLAG>" in text and "--output" in text and " FILE " in text
