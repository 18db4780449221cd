"""Output names: an extension that promises another format is refused before any work (issue 13, item 14)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def _corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"id": f"d{i}", "text": f"text {i}"}) + "\n" for i in range(3)))
    return path


@pytest.mark.parametrize("name", ["vectors.json", "vectors.csv", "vectors.txt"])
def test_output_extension_of_another_format_is_refused(cli, st_model: Path, tmp_path: Path, name: str) -> None:
    corpus = _corpus(tmp_path)
    r = cli("embed", corpus, "-m", st_model, "-o", tmp_path / name, code=2)
    assert ".jsonl" in r.stderr and ".npy" in r.stderr and ".parquet" in r.stderr and "--output-format" in r.stderr
    assert "Traceback" not in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.jsonl"]  # nothing written, nothing staged


def test_output_format_flag_writes_that_format_under_any_name(cli, st_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "vectors.json"
    cli("embed", _corpus(tmp_path), "-m", st_model, "-o", out, "--output-format", "jsonl", "-q")
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["d0", "d1", "d2"]


@pytest.mark.parametrize("ext", [b".parquet", b".npy"])
def test_non_utf8_input_and_output_names(st_model: Path, tmp_path: Path, ext: bytes) -> None:
    """Issue 13, item 13: file names that are not UTF-8 never crash (UnicodeEncodeError) any step."""
    import os
    import subprocess
    import sys

    d = os.fsencode(tmp_path)
    with open(d + b"/caf\xe9.jsonl", "wb") as f:
        f.write(b'{"id": "a", "text": "hello"}\n')
    with open(d + b"/noid\xe9.jsonl", "wb") as f:
        f.write(b'{"text": "no id: the id is file:line"}\n')
    out = d + b"/out\xe9" + ext
    env = {**os.environ, "OMP_NUM_THREADS": "1", "EMBEDCLI_DTYPE": "float32", "HF_HUB_OFFLINE": "1"}
    embed = [sys.executable.encode(), b"-m", b"embedcli", b"embed", d + b"/caf\xe9.jsonl", d + b"/noid\xe9.jsonl",
             b"-m", os.fsencode(st_model), b"-o", out, b"--stats", d + b"/s\xe9.json"]
    r = subprocess.run(embed, capture_output=True, env=env, timeout=120, check=False)
    assert r.returncode == 0 and b"Traceback" not in r.stderr, r.stderr.decode(errors="replace")
    assert os.path.isfile(out)
    check = [sys.executable.encode(), b"-m", b"embedcli", b"inspect", out, b"--check"]
    r = subprocess.run(check, capture_output=True, env=env, timeout=120, check=False)
    assert r.returncode == 0 and b"Traceback" not in r.stderr, (r.stdout + r.stderr).decode(errors="replace")


@pytest.mark.parametrize(("args", "has"), [
    (("embed", "--keep-cols", "topic"), "also has 'topic'"),
    (("token-embed",), "has 'id', 'token_ids', 'embeddings'"),
    (("score", "--left-col", "text", "--right-col", "topic"), "has 'id', 'score'"),
])
def test_npy_of_more_than_ids_and_vectors_is_refused_before_any_work(cli, st_model: Path, tmp_path: Path,
                                                                     args: tuple[str, ...], has: str) -> None:
    """`embed --keep-cols -o x.npy` dropped the kept columns at exit 0; token-embed / score wrote nothing only
    after computing every row, with a fix (rerun the same command) that failed again."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"d{i}", "text": f"text {i}", "topic": "t"}) + "\n" for i in range(3)))
    out = tmp_path / "v.npy"
    r = cli(args[0], corpus, *args[1:], "-m", st_model, "-o", out, code=2)
    assert f"-o {out}: .npy holds one 'embedding' vector (and the id) of each row, but this output {has}" in r.stderr
    assert "write .parquet or .jsonl" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.jsonl"]  # nothing written, nothing staged
