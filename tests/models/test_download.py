"""`embedcli download` and `-m org/model` resolution against a fake Hub on 127.0.0.1 (never the network:
`tests/fixtures/hub_server.py`). Every request is counted and logged; each embedcli call runs with short timeouts.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.hub_server import SHA, FakeHub, serving

MAX_REQUESTS = 40  # per test (two downloads of the tiny repo); past it every request is refused (403, no retry)


def _model_files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def hub(tiny_model) -> Iterator[FakeHub]:  # type: ignore[no-untyped-def]
    import torch
    from safetensors.torch import load_file

    folder = tiny_model("bert-st")
    safe = _model_files(folder)
    # a real repo also ships pickle and ONNX copies of the weights: never fetched by default
    safe["pytorch_model.bin"] = b"not a pickle: must never be downloaded"
    safe["onnx/model.onnx"] = b"not onnx either"
    # a repo with pickle weights only
    pickled = {p: b for p, b in _model_files(folder).items() if not p.endswith(".safetensors")}
    tmp = folder.parent / "pickled-weights.bin"
    torch.save(load_file(str(folder / "model.safetensors")), tmp)
    pickled["pytorch_model.bin"] = tmp.read_bytes()
    with serving({"tiny-org/tiny-bert": safe, "tiny-org/pickled-bert": pickled}, limit=MAX_REQUESTS) as server:
        yield server


@pytest.fixture(autouse=True)
def request_budget(hub: FakeHub) -> None:
    """Each test may make MAX_REQUESTS requests."""
    hub.limit = len(hub.requests) + MAX_REQUESTS


def _embedcli(args: list[str], env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "embedcli", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=os.getcwd())


def _env(hub: FakeHub, home: Path, offline: bool = False) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "TRANSFORMERS_"))}
    env.update(HF_ENDPOINT=hub.url, HF_HOME=str(home), HF_HUB_ETAG_TIMEOUT="5", HF_HUB_DOWNLOAD_TIMEOUT="5",
               HF_HUB_DISABLE_TELEMETRY="1", OMP_NUM_THREADS="1", EMBEDCLI_DTYPE="float32")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH")]))
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    return env


def test_download_fetches_safetensors_only_into_the_standard_cache_then_runs_offline(hub, tmp_path):
    home = tmp_path / "hf"
    start = len(hub.requests)
    done = _embedcli(["download", "tiny-org/tiny-bert", "--revision", "main"], _env(hub, home))
    assert done.returncode == 0, done.stderr
    snapshot = Path(done.stdout.strip())
    assert snapshot == home / "hub" / "models--tiny-org--tiny-bert" / "snapshots" / SHA
    assert (home / "hub" / "models--tiny-org--tiny-bert" / "refs" / "main").read_text() == SHA
    assert (snapshot / "model.safetensors").is_file() and not (snapshot / "pytorch_model.bin").exists()
    fetched = hub.fetched()
    assert "model.safetensors" in fetched and "config.json" in fetched
    assert "pytorch_model.bin" not in fetched and "onnx/model.onnx" not in fetched
    assert f"downloading tiny-org/tiny-bert@{SHA}" in done.stderr
    assert len(hub.requests) - start <= 2 * len(hub.models["tiny-org/tiny-bert"]) + 6

    # a second download is a no-op; a run with the Hub switched off finds the snapshot in the cache
    before = len(hub.requests)
    again = _embedcli(["download", "tiny-org/tiny-bert"], _env(hub, home, offline=True))
    assert again.returncode == 0 and "already in the cache" in again.stderr, again.stderr
    docs = tmp_path / "docs.jsonl"
    docs.write_text('{"id": "a", "text": "hello"}\n{"id": "b", "text": "world"}\n', encoding="utf-8")
    out = tmp_path / "v.parquet"
    run = _embedcli(["embed", str(docs), "-m", "tiny-org/tiny-bert", "-o", str(out), "-q"], _env(hub, home, offline=True))
    assert run.returncode == 0, run.stderr
    assert len(hub.requests) == before  # offline: not one request


def test_model_id_downloads_on_first_use_when_the_hub_is_enabled(hub, tmp_path):
    import pyarrow.parquet as pq

    docs = tmp_path / "docs.jsonl"
    docs.write_text('{"id": "a", "text": "hello"}\n', encoding="utf-8")
    out = tmp_path / "v.parquet"
    run = _embedcli(["embed", str(docs), "-m", f"tiny-org/tiny-bert@{SHA}", "-o", str(out), "-q"], _env(hub, tmp_path / "hf"))
    assert run.returncode == 0, run.stderr
    assert pq.read_table(out).num_rows == 1
    # switched off and not cached: a one-line error naming the fix, no request
    before = len(hub.requests)
    miss = _embedcli(["embed", str(docs), "-m", "tiny-org/other", "-o", str(tmp_path / "w.parquet")],
                     _env(hub, tmp_path / "empty", offline=True))
    assert miss.returncode == 1 and "embedcli download tiny-org/other" in miss.stderr, miss.stderr
    assert "Traceback" not in miss.stderr and len(hub.requests) == before


def test_pickle_only_repo_needs_allow_pickle(hub, tmp_path):
    home = tmp_path / "hf"
    refused = _embedcli(["download", "tiny-org/pickled-bert"], _env(hub, home))
    assert refused.returncode == 1 and "only pickle weights" in refused.stderr and "--allow-pickle" in refused.stderr
    assert not (home / "hub" / "models--tiny-org--pickled-bert" / "snapshots").exists()  # refused before fetching
    allowed = _embedcli(["download", "tiny-org/pickled-bert", "--allow-pickle", "-q"], _env(hub, home))
    assert allowed.returncode == 0, allowed.stderr
    assert (Path(allowed.stdout.strip()) / "pytorch_model.bin").is_file()


def test_unknown_repo_and_revision_are_one_line_errors(hub, tmp_path):
    for args, words in ((["nobody/nothing"], "no such model"), (["tiny-org/tiny-bert", "--revision", "v9"], "no revision")):
        done = _embedcli(["download", *args], _env(hub, tmp_path / "hf"))
        assert done.returncode == 1 and words in done.stderr, done.stderr
        assert "Traceback" not in done.stderr


def test_selection_rules() -> None:
    from embedcli.models.checkpoint.download import select_files

    files = ["config.json", "model.safetensors", "pytorch_model.bin", "onnx/model.onnx", "2_Dense/pytorch_model.bin",
             "2_Dense/config.json", "openvino/x.xml", "tokenizer.json"]
    assert select_files(files) == ["config.json", "model.safetensors", "2_Dense/config.json", "tokenizer.json"]
    # with --allow-pickle, pickle only where a folder has no safetensors
    assert select_files(files, allow_pickle=True) == [
        "config.json", "model.safetensors", "2_Dense/pytorch_model.bin", "2_Dense/config.json", "tokenizer.json"]
