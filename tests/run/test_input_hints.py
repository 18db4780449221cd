"""Plain text piped into the JSONL default gets a hint to pass `--format txt`."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from embedcli.cli import app


def test_plain_text_on_stdin_suggests_format_txt(st_model: Path, tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["embed", "-", "-m", str(st_model), "-o", str(tmp_path / "v.parquet")],
                             input="first plain line\nsecond plain line\n")
    assert res.exit_code != 0
    assert "malformed JSON" in res.stderr and "--format txt" in res.stderr
    assert "Traceback" not in res.stderr
