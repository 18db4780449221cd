"""Inputs in GCS (gcp-storage-emulator on 127.0.0.1, through STORAGE_EMULATOR_HOST) and on the Hub (a dataset Hub
on 127.0.0.1, through HF_ENDPOINT, read by huggingface_hub's HfFileSystem): the local run's ids and vectors."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.objstore.conftest import hub_env

ROWS = [{"id": f"d{i}", "text": f"document {i} is about {('rates', 'films', 'football')[i % 3]}", "topic": f"t{i % 3}"}
        for i in range(17)]


def jsonl(rows: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def parquet(rows: list[dict[str, Any]]) -> bytes:
    sink = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), sink, row_group_size=4)
    return sink.getvalue()


def _columns(path: Path) -> dict[str, list[Any]]:
    table = pq.read_table(path)
    return {name: table.column(name).to_pylist() for name in table.column_names}


@pytest.mark.parametrize("name, data", [("corpus.jsonl", jsonl(ROWS)), ("corpus.parquet", parquet(ROWS))])
def test_a_gcs_object_input_gives_the_local_runs_ids_and_vectors(
    cli, st_model, gcs_env, gcs_put, tmp_path, name, data
):
    local = tmp_path / name
    local.write_bytes(data)
    url = gcs_put(f"{tmp_path.name}/{name}", data)
    cli("embed", local, "-m", st_model, "--keep-cols", "topic", "-o", tmp_path / "local.parquet", "-q")
    cli("embed", url, "-m", st_model, "--keep-cols", "topic", "-o", tmp_path / "gs.parquet", "-q", env=gcs_env)
    assert _columns(tmp_path / "gs.parquet") == _columns(tmp_path / "local.parquet")
    (fp,) = json.loads(pq.read_schema(tmp_path / "gs.parquet").metadata[b"embedcli.inputs"])
    assert fp["path"] == url and fp["size"] == len(data) and fp["generation"]


def test_a_gcs_glob_and_a_rewritten_gcs_object(cli, st_model, gcs_env, gcs_put, tmp_path):
    prefix = tmp_path.name
    gcs_put(f"{prefix}/in/a.jsonl", jsonl(ROWS[:6]))
    gcs_put(f"{prefix}/in/b.jsonl", jsonl(ROWS[6:]))
    gcs_put(f"{prefix}/in/notes.txt", b"not read\n")
    out, stats = tmp_path / "v.parquet", tmp_path / "stats.json"
    run = ("embed", f"gs://gbucket/{prefix}/in/*.jsonl", "-m", st_model, "-o", out, "--stats", stats, "-q")
    cli(*run, env=gcs_env)
    assert _columns(out)["id"] == [r["id"] for r in ROWS]
    changed = [dict(r) for r in ROWS[6:]]
    changed[0]["text"] = changed[0]["text"].upper()
    gcs_put(f"{prefix}/in/b.jsonl", jsonl(changed))  # a new generation of the object
    cli(*run, "--incremental", env=gcs_env)
    assert json.loads(stats.read_text())["computed_rows"] == 1


def _embedcli(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "embedcli", *args], env={**env, "EMBEDCLI_DTYPE": "float32", "EMBEDCLI_THREADS": "1"},
                          cwd=cwd, capture_output=True, text=True, timeout=300)


def test_a_hub_dataset_file_and_glob_read_through_hf_urls(cli, st_model, dataset_hub, tmp_path):
    """huggingface_hub reads HF_ENDPOINT when it is imported: the runs are processes of their own, as a user's."""
    dataset_hub.datasets["tiny-org/corpus"] = {
        "data/train.jsonl": jsonl(ROWS[:9]), "data/test.jsonl": jsonl(ROWS[9:]), "data/rows.parquet": parquet(ROWS),
        "README.md": b"# a dataset\n",
    }
    for name, rows in (("train.jsonl", ROWS[:9]), ("test.jsonl", ROWS[9:])):
        (tmp_path / name).write_bytes(jsonl(rows))
    (tmp_path / "rows.parquet").write_bytes(parquet(ROWS))
    env = hub_env(dataset_hub)
    for inputs, local in ((["hf://datasets/tiny-org/corpus/data/*.jsonl"], [tmp_path / "test.jsonl", tmp_path / "train.jsonl"]),
                          (["hf://datasets/tiny-org/corpus/data/rows.parquet"], [tmp_path / "rows.parquet"])):
        out = tmp_path / "hf.parquet"
        done = _embedcli(["embed", *inputs, "-m", str(st_model), "--keep-cols", "topic", "-o", str(out), "-q"], env,
                         tmp_path)
        assert done.returncode == 0, done.stderr
        cli("embed", *local, "-m", st_model, "--keep-cols", "topic", "-o", tmp_path / "local.parquet", "-q")
        assert _columns(out) == _columns(tmp_path / "local.parquet")
        fps = json.loads(pq.read_schema(out).metadata[b"embedcli.inputs"])
        assert all(fp["path"].startswith("hf://datasets/tiny-org/corpus/data/") and len(fp["etag"]) == 40 for fp in fps)
        out.unlink()
    missing = _embedcli(["embed", "hf://datasets/tiny-org/corpus/data/none.jsonl", "-m", str(st_model), "-o",
                         "x.parquet"], env, tmp_path)
    assert missing.returncode == 1 and "hf://datasets/tiny-org/corpus/data/none.jsonl: no such object" in missing.stderr
    assert not any(r.startswith(("PUT", "DELETE")) for r in dataset_hub.requests)
    assert os.listdir(tmp_path).count("x.parquet") == 0
