"""The ONNX Runtime float32 contender of `embedcli bench`: the same vectors as embedcli's float32, export cached."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from embedcli import bench_onnx
from embedcli.bench_onnx import OrtEmbedder, export_dir
from embedcli.models.spec import load_model_spec
from tests.fixtures.tiny_models import LONG_TEXT, SAMPLE_TEXTS, copy_model, edit_json

TEXTS = [*SAMPLE_TEXTS, LONG_TEXT]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("EMBEDCLI_CACHE_DIR", str(root))
    return root


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.mark.parametrize("name", ["bert-st", "bert-st-cls", "mpnet-st"])
def test_onnx_contender_matches_embedcli_float32(name: str, tiny_model, tiny_loaded, cache: Path, torch_single_thread) -> None:
    from embedcli.compute.runner import Runner

    spec = load_model_spec(str(tiny_model(name)))
    ours = Runner(tiny_loaded(name)).embed(TEXTS)
    theirs = OrtEmbedder(export_dir(spec), threads=1).embed(TEXTS)
    assert theirs.shape == ours.shape
    assert _cosines(theirs, ours).min() >= 0.99999
    # Normalized exactly when the model says so (bert-st-cls has no Normalize module).
    np.testing.assert_allclose(np.linalg.norm(theirs, axis=1), np.linalg.norm(ours, axis=1), rtol=1e-4)


def test_export_is_made_once_per_model(tiny_model, cache: Path, monkeypatch, tmp_path: Path, torch_single_thread) -> None:
    spec = load_model_spec(str(tiny_model("bert-st")))
    folder = export_dir(spec)
    assert folder.parent == cache / "onnx" and folder.name == f"{spec.content_hash}-{spec.config_hash()}"

    def no_export(*args: object) -> None:
        raise AssertionError("exported again")

    monkeypatch.setattr(bench_onnx, "_export", no_export)
    assert export_dir(spec) == folder
    # The stand-alone runner (what the start-up figure times) reads only the export folder.
    source = tmp_path / "one.jsonl"
    source.write_text(json.dumps({"id": "0", "text": TEXTS[1]}) + "\n")
    bench_onnx.main([str(folder), str(source), str(tmp_path / "v.npy"), "1"])
    expected = OrtEmbedder(folder, threads=1).embed([TEXTS[1]])
    np.testing.assert_array_equal(np.load(tmp_path / "v.npy"), expected)


def test_export_is_keyed_by_the_pooling_config_too(tiny_model, cache: Path, tmp_path: Path, torch_single_thread) -> None:
    mean = load_model_spec(str(tiny_model("bert-st")))
    # Same weights, config.json and tokenizer (so the same content hash), CLS instead of MEAN pooling.
    folder = copy_model(tiny_model("bert-st"), tmp_path / "bert-st-cls-pooled")
    edit_json(folder / "1_Pooling" / "config.json",
              lambda d: d.update(pooling_mode_mean_tokens=False, pooling_mode_cls_token=True))
    cls = load_model_spec(str(folder))
    assert cls.content_hash == mean.content_hash and cls.seq_pooling_type == "CLS"
    assert export_dir(mean) != export_dir(cls)
    assert json.loads((export_dir(cls) / "embedcli-onnx.json").read_text())["pooling"] == "CLS"
