"""A model's content hash is remembered per file state: the same value as reading the files, a rerun reads no
file, and any change to a file (even with its size and mtime put back), a re-pointed symlink or a file changed
within the last 2 s is read again."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Any

import pytest

import embedcli.models.checkpoint.content_hash as content_hash

NAMES = ["config.json", "missing.json", "model.safetensors"]


def reference(folder: Path, names: list[str]) -> str:
    h = hashlib.sha256()
    for name in names:
        if (folder / name).is_file():
            h.update(name.encode() + (folder / name).read_bytes())
    return h.hexdigest()[:16]


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[list[str]]:
    """Each file read, by call; the cache in tmp_path; the files' changes seen as 10 s old unless a test says."""
    monkeypatch.setenv("EMBEDCLI_CACHE_DIR", str(tmp_path / "cache"))
    seen: list[list[str]] = []
    real = content_hash._read

    def counting(folder: Path, names: Any) -> str:
        seen.append(list(names))
        return real(folder, names)

    monkeypatch.setattr(content_hash, "_read", counting)
    monkeypatch.setattr(content_hash, "_clock", lambda: time.time_ns() + 10_000_000_000)
    return seen


def model(folder: Path) -> Path:
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "bert"}')
    (folder / "model.safetensors").write_bytes(os.urandom(4096))
    return folder


def test_the_hash_is_the_files_and_a_rerun_reads_none(reads: list[list[str]], tmp_path: Path) -> None:
    folder = model(tmp_path / "m")
    assert content_hash.hash_files(folder, NAMES) == reference(folder, NAMES)
    assert content_hash.hash_files(folder, NAMES) == reference(folder, NAMES)
    assert reads == [["config.json", "model.safetensors"]]
    assert content_hash.hash_files(folder, NAMES[:1]) == reference(folder, NAMES[:1])  # another set of files
    assert len(reads) == 2


def test_a_changed_file_is_read_again_even_with_its_size_and_mtime_put_back(reads: list[list[str]], tmp_path: Path) -> None:
    folder = model(tmp_path / "m")
    before = content_hash.hash_files(folder, NAMES)
    weights = folder / "model.safetensors"
    st = weights.stat()
    weights.write_bytes(os.urandom(4096))
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))  # the ctime cannot be put back
    after = content_hash.hash_files(folder, NAMES)
    assert after == reference(folder, NAMES) != before
    assert len(reads) == 2


def test_a_repointed_symlink_is_read_again(reads: list[list[str]], tmp_path: Path) -> None:
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    for name in ("a", "b"):
        (blobs / name).write_bytes(name.encode() * 100)
    folder = model(tmp_path / "m")
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors").symlink_to(blobs / "a")
    first = content_hash.hash_files(folder, NAMES)
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors").symlink_to(blobs / "b")
    assert content_hash.hash_files(folder, NAMES) == reference(folder, NAMES) != first


def test_files_changed_in_the_last_2_s_are_not_remembered(
    reads: list[list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(content_hash, "_clock", time.time_ns)
    folder = model(tmp_path / "m")
    content_hash.hash_files(folder, NAMES)
    content_hash.hash_files(folder, NAMES)
    assert len(reads) == 2


def test_an_unusable_cache_still_hashes_and_says_nothing(
    reads: list[list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "not-a-dir").write_text("")
    monkeypatch.setenv("EMBEDCLI_CACHE_DIR", str(tmp_path / "not-a-dir"))
    folder = model(tmp_path / "m")
    assert content_hash.hash_files(folder, NAMES) == content_hash.hash_files(folder, NAMES) == reference(folder, NAMES)
    assert len(reads) == 2
    assert capsys.readouterr().err == ""


def test_a_static_models_median_token_length_is_remembered_per_tokenizer_state(
    reads: list[list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from embedcli.models.spec import load_model_spec
    from embedcli.models.static import StaticModel
    from tests.fixtures.static_models import build_m2v

    folder = build_m2v(tmp_path / "m2v")
    computed: list[int] = []
    real = StaticModel._median_token_length

    def counting(self: StaticModel) -> int:
        computed.append(real(self))
        return computed[-1]

    monkeypatch.setattr(StaticModel, "_median_token_length", counting)
    vocab = json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"]
    import numpy as np

    want = int(np.median([len(token) for token in vocab]))  # the file's own vocabulary (its added tokens are in it)
    first = StaticModel(load_model_spec(str(folder))).median_token_length
    assert StaticModel(load_model_spec(str(folder))).median_token_length == first
    assert len(computed) == 1 and first == want
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    tokenizer["model"]["vocab"] = {f"{t}{'x' * 30}" if i % 2 else t: i for i, t in enumerate(tokenizer["model"]["vocab"])}
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))  # longer tokens: another median
    assert StaticModel(load_model_spec(str(folder))).median_token_length != first
    assert len(computed) == 2
