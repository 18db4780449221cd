"""Issue 22, item 10: a cache dir that cannot be created or written is an optimisation lost, said once, never a
failed run (containers and cron often have a read-only or missing home)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def test_an_uncreatable_cache_dir_stands_in_a_throwaway_one_said_once(tmp_path, monkeypatch, capsys):  # type: ignore[no-untyped-def]
    from embedcli.io.user_cache import read_json, user_cache_dir, write_json

    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    monkeypatch.setenv("EMBEDCLI_CACHE_DIR", str(blocker / "cache"))  # below a file: mkdir fails, even as root
    first = user_cache_dir("precision")
    again = user_cache_dir("precision")
    assert first == again and first.is_dir() and not str(first).startswith(str(blocker))
    write_json(first / "entry.json", {"dtype": "float32"})
    assert read_json(first / "entry.json") == {"dtype": "float32"}
    err = capsys.readouterr().err
    assert err.count("cannot be used") == 1 and str(blocker / "cache") in err


@pytest.mark.parametrize("variable", ["EMBEDCLI_CACHE_DIR", "XDG_CACHE_HOME"])
def test_auto_dtype_runs_without_a_usable_cache(cli, st_model, tmp_path, monkeypatch, variable):  # type: ignore[no-untyped-def]
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    monkeypatch.delenv("EMBEDCLI_CACHE_DIR", raising=False)
    monkeypatch.setenv(variable, str(blocker / "cache"))
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"id": i, "text": f"text {i}"}) + "\n" for i in range(3)))
    out = tmp_path / "v.parquet"
    result = cli("embed", docs, "-m", st_model, "--dtype", "auto", "-o", out)
    assert out.is_file() and "Traceback" not in result.stderr
    assert Path(blocker).read_text() == "x"
