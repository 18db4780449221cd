"""A URL where embedcli cannot take one yet (a directory of shards, `hf://` outputs or `--previous`, `--calibration`;
merge and inspect, which read an output's structure) or a scheme it does not read: refused in
one line, exit 2, and nothing local named `s3:` made. An object output whose bucket does not exist: exit 1, one line,
before the model loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# {corpus} is a local JSONL corpus; the command runs in an empty folder.
OUTPUT_PLACES = [
    ("-o s3 dir", ["embed", "{corpus}", "-o", "s3://corpus/out/", "--shards-dir"]),
    ("-o s3 prefix", ["embed", "{corpus}", "-o", "s3://corpus/out/"]),
    ("-o s3 bucket", ["embed", "{corpus}", "-o", "s3://corpus"]),
    ("--stats hf", ["embed", "{corpus}", "-o", "v.parquet", "--stats", "hf://datasets/o/n/stats.json"]),
    ("-o hf", ["embed", "{corpus}", "-o", "hf://datasets/org/name/vectors.parquet"]),
    ("-o file", ["embed", "{corpus}", "-o", "file:///tmp/vectors.parquet"]),
    ("--previous dir", ["embed", "{corpus}", "-o", "v.parquet", "--incremental", "--previous", "s3://corpus/out/"]),
    ("--previous hf", ["embed", "{corpus}", "-o", "v.parquet", "--incremental", "--previous",
                       "hf://datasets/o/n/v.parquet"]),
    ("--calibration", ["embed", "{corpus}", "-o", "v.parquet", "--precision", "int8", "--calibration",
                       "s3://corpus/calibration.npy"]),
    ("search -o dir", ["search", "s3://corpus/v.parquet", "--query", "q", "-o", "s3://corpus/hits/"]),
    ("merge inputs", ["merge", "s3://corpus/out/", "-o", "m.parquet"]),
    ("merge -o", ["merge", "{corpus}", "-o", "s3://corpus/m.parquet"]),
    ("inspect", ["inspect", "s3://corpus/v.parquet"]),
    ("inspect set", ["inspect", "{corpus}", "s3://corpus/b.parquet"]),
    ("run-batch", ["run-batch", "s3://corpus/requests.jsonl", "-o", "responses.jsonl"]),
]
UNSUPPORTED_SCHEMES = [
    ("azure input", ["embed", "azure://container/in.jsonl", "-o", "v.parquet"]),
    ("http input", ["embed", "http://example.invalid/in.jsonl", "-o", "v.parquet"]),
    ("ftp input", ["embed", "ftp://example.invalid/in.jsonl", "-o", "v.parquet"]),
    ("abfs glob", ["embed", "abfs://c/in/*.jsonl", "-o", "v.parquet"]),
    ("ftp -o", ["embed", "{corpus}", "-o", "ftp://example.invalid/v.parquet"]),
    ("azure search", ["search", "azure://c/v.parquet", "--query", "q"]),
    ("azure queries", ["search", "{corpus}", "--queries", "azure://c/q.jsonl"]),
    ("file host", ["embed", "file://host/in.jsonl", "-o", "v.parquet"]),
]


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"id": i, "text": f"row {i}"}) + "\n" for i in range(3)))
    return path


def _argv(args: list[str], corpus: Path) -> list[str]:
    return [a.format(corpus=corpus) for a in args]


@pytest.mark.parametrize("case, args", OUTPUT_PLACES + UNSUPPORTED_SCHEMES, ids=[c for c, _ in OUTPUT_PLACES + UNSUPPORTED_SCHEMES])
def test_a_url_that_cannot_be_taken_is_refused_in_one_line_and_nothing_is_written(
    cli, st_model, s3_env, corpus, tmp_path, monkeypatch, case, args
):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    argv = _argv(args, corpus)
    url = [a for a in argv if "://" in a][-1]  # the refused one
    model = ["-m", str(st_model)] if argv[0] not in ("merge", "inspect") else []
    result = cli(*argv, *model, code=2, env=s3_env)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("embedcli: usage error: ") and url in lines[0]
    scheme = url.split("://")[0]
    assert f"{scheme}://" in lines[0]
    assert os.listdir(cwd) == []
    assert not any(p.name.endswith(":") for p in tmp_path.rglob("*"))


def test_o_to_a_missing_bucket_from_a_shell_is_refused_and_makes_no_s3_folder(s3_env, corpus, tmp_path):
    """The issue's own case, as a user runs it: `-o s3://corpus/x` with no bucket `corpus` exits 1 in one line,
    before the model loads (there is none), and leaves no `./s3:/corpus/`."""
    env = {**os.environ, **s3_env, "EMBEDCLI_DTYPE": "float32"}
    done = subprocess.run([sys.executable, "-m", "embedcli", "embed", str(corpus), "-m", str(tmp_path / "none"), "-o",
                           "s3://corpus/x"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().count("\n") == 0
    assert "mkdir" not in done.stderr and "s3://corpus/x" in done.stderr and "'corpus' does not exist" in done.stderr
    assert not (tmp_path / "s3:").exists()


@pytest.mark.parametrize("path, local", [("file:///data/in.jsonl", "/data/in.jsonl"),
                                         ("file://localhost/data/a%20b.jsonl", "/data/a b.jsonl"),
                                         ("/data/in.jsonl", "/data/in.jsonl"), ("s3://b/k", "s3://b/k")])
def test_file_urls_are_local_paths(path, local):
    from embedcli.io.location import local_path

    assert local_path(path) == local


def test_a_file_url_input_reads_the_local_file_as_its_path_does(cli, st_model, corpus, tmp_path):
    cli("embed", corpus, "-m", st_model, "-o", tmp_path / "a.parquet", "-q")
    cli("embed", f"file://{corpus}", "-m", st_model, "-o", tmp_path / "b.parquet", "-q")
    import pyarrow.parquet as pq

    assert pq.read_table(tmp_path / "a.parquet").equals(pq.read_table(tmp_path / "b.parquet"))
    clobber = cli("embed", f"file://{corpus}", "-m", st_model, "-o", corpus, code=2)
    assert "would destroy the input" in clobber.stderr


def test_a_scheme_whose_library_is_missing_here_is_refused_in_one_line(cli, st_model, tmp_path, monkeypatch):
    from embedcli.io import location

    def missing(scheme: str) -> None:
        raise ImportError(f"no {scheme} here")

    monkeypatch.setattr(location, "_filesystem_class", missing)
    monkeypatch.chdir(tmp_path)
    result = cli("embed", "gs://bucket/in.jsonl", "-m", st_model, "-o", "v.parquet", code=2)
    assert result.stderr.strip() == ("embedcli: usage error: gs://bucket/in.jsonl: reading gs:// needs pyarrow built "
                                     "with GCS support, which is not installed here")
    assert os.listdir(tmp_path) == []
