"""The parity-guarded `auto` dtype: bf16 only where the probe stays within the bar, decided once and cached."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from embedcli.models import precision
from embedcli.models.loader import LoadedModel, ModelOptions
from embedcli.models.precision import ParityBar, compare
from embedcli.models.spec import load_model_spec
from tests.fixtures.tiny_models import copy_model, edit_json


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh user cache, and a CPU that claims native bf16 so `auto` has a bf16 candidate on any machine."""
    root = tmp_path / "cache"
    monkeypatch.setenv("EMBEDCLI_CACHE_DIR", str(root))
    monkeypatch.setattr("embedcli.models.loader.cpu_has_native_bf16", lambda: True)
    monkeypatch.setattr("embedcli.models.precision.cpu_has_native_bf16", lambda: True)
    return root


@pytest.fixture(scope="module")
def drifting_model(tiny_model: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """bert-st with its query projections scaled 40x: attention scores in the hundreds, where bf16's rounding of
    q and k moves the softmax (a model whose bf16 output leaves the bar; unscaled it stays within it)."""
    from safetensors.torch import load_file, save_file

    folder = tmp_path_factory.mktemp("drift") / "bert-st-drift"
    shutil.copytree(tiny_model("bert-st"), folder)
    state = load_file(str(folder / "model.safetensors"))
    for name in state:
        if name.endswith("attention.self.query.weight"):
            state[name] = state[name] * 40
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def _load(path: Path, **options: object) -> LoadedModel:
    return LoadedModel(load_model_spec(str(path)), ModelOptions(device="cpu", dtype="auto", **options))  # type: ignore[arg-type]


def test_auto_keeps_bf16_within_the_bar(tiny_model, cache: Path, torch_single_thread) -> None:
    import torch

    model = _load(tiny_model("bert-st"))
    assert model.dtype == torch.bfloat16 and model.autocast
    assert "within the bar" in model.dtype_reason
    assert model.dtype_decision.metrics["min_cosine"] >= 0.9999
    [entry] = (cache / "precision").glob("*.json")
    assert json.loads(entry.read_text())["dtype"] == "bfloat16"


def test_auto_falls_back_to_float32_when_bf16_drifts(drifting_model: Path, cache: Path, torch_single_thread) -> None:
    import torch

    model = _load(drifting_model)
    assert model.dtype == torch.float32 and not model.autocast
    assert model.dtype_decision.metrics["min_cosine"] < 0.9999
    assert "outside the bar, float32 kept" in model.dtype_reason


def test_auto_falls_back_under_a_stricter_bar(tiny_model, cache: Path, torch_single_thread) -> None:
    import torch

    model = _load(tiny_model("bert-st"), parity_bar=ParityBar(min_cosine=0.99999999))
    assert model.dtype == torch.float32 and not model.autocast


def test_cached_decision_is_not_probed_again(tiny_model, cache: Path, monkeypatch, torch_single_thread) -> None:
    import torch

    first = _load(tiny_model("bert-st"))
    assert not first.dtype_decision.cached

    def no_probe(*args: object, **kwargs: object) -> None:
        raise AssertionError("probed again despite a cached decision")

    monkeypatch.setattr(precision, "probe_outputs", no_probe)
    again = _load(tiny_model("bert-st"))
    assert again.dtype_decision.cached and again.dtype == first.dtype
    # The cache is what decides: a planted entry is obeyed as it stands.
    [entry] = (cache / "precision").glob("*.json")
    planted = {**json.loads(entry.read_text()), "dtype": "float32", "reason": "planted"}
    entry.write_text(json.dumps(planted))
    obeyed = _load(tiny_model("bert-st"))
    assert obeyed.dtype == torch.float32 and obeyed.dtype_reason == "planted"
    # A decision made under another bar (or another task) is not reused.
    with pytest.raises(AssertionError, match="probed again"):
        _load(tiny_model("bert-st"), parity_bar=ParityBar(min_cosine=0.999))
    with pytest.raises(AssertionError, match="probed again"):
        _load(tiny_model("bert-st"), task="token_embed")
    # Nor one probed at another length (`--max-length` cuts the probe too; bf16 drift grows with length).
    short = load_model_spec(str(tiny_model("bert-st")), max_length=16)
    with pytest.raises(AssertionError, match="probed again"):
        LoadedModel(short, ModelOptions(device="cpu", dtype="auto"))


def _cls_pooled(data: dict) -> None:
    data.update(pooling_mode_mean_tokens=False, pooling_mode_cls_token=True)


def test_decision_is_keyed_by_the_pooling_config_too(tiny_model, cache: Path, tmp_path: Path, monkeypatch, torch_single_thread) -> None:
    first = _load(tiny_model("bert-st"))
    assert not first.dtype_decision.cached
    # Same weights, config.json and tokenizer (so the same content hash), another sentence-transformers pooling.
    folder = copy_model(tiny_model("bert-st"), tmp_path / "bert-st-cls-pooled")
    edit_json(folder / "1_Pooling" / "config.json", _cls_pooled)
    spec = load_model_spec(str(folder))
    assert spec.content_hash == first.spec.content_hash and spec.seq_pooling_type == "CLS"

    def no_probe(*args: object, **kwargs: object) -> None:
        raise AssertionError("probed again despite a cached decision")

    monkeypatch.setattr(precision, "probe_outputs", no_probe)
    with pytest.raises(AssertionError, match="probed again"):
        LoadedModel(spec, ModelOptions(device="cpu", dtype="auto"))


def test_classifier_is_probed_on_its_scores(tiny_model, cache: Path, tmp_path: Path, torch_single_thread) -> None:
    import torch
    from transformers import AutoConfig, BertForSequenceClassification

    folder = tmp_path / "tiny-cross-encoder"
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(str(tiny_model("bert")), num_labels=1)
    BertForSequenceClassification(config).save_pretrained(str(folder))
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt"):
        shutil.copy(tiny_model("bert") / name, folder / name)
    model = _load(folder)
    decision = model.dtype_decision
    assert decision.task == "classify" and "max_abs_diff" in decision.metrics
    passed = decision.metrics["max_abs_diff"] <= 1e-3 and decision.metrics["order_changes"] == 0
    assert decision.dtype == ("bfloat16" if passed else "float32")


def _rows(*values: float) -> list[np.ndarray]:
    return [np.asarray([v]) for v in values]


@pytest.mark.parametrize(
    ("reference", "candidate", "passed", "order_changes"),
    [
        (_rows(0.1, 0.5, 0.9), _rows(0.1004, 0.5, 0.8995), True, 0),
        (_rows(0.1, 0.5, 0.9), _rows(0.1, 0.5, 0.9 + 2e-3), False, 0),  # |delta| over 1e-3
        (_rows(0.5000, 0.5004, 0.9), _rows(0.5005, 0.5002, 0.9), False, 1),  # within 1e-3 but swapped
        (_rows(0.1, 0.2, 0.3, 0.4), _rows(0.1, 0.3, 0.2, 0.4), False, 1),  # a swap within 1e-1
        (_rows(0.1, 0.2, 0.3, 0.4), _rows(0.4, 0.3, 0.2, 0.1), False, 3),  # reversed: three breaks
    ],
)
def test_scores_must_stay_close_and_in_order(reference, candidate, passed, order_changes) -> None:
    ok, metrics = compare("classify", reference, candidate, ParityBar(max_abs_diff=1e-3 if order_changes < 1 else 1.0))
    assert ok is passed
    assert metrics["order_changes"] == order_changes


def test_top_label_change_fails_multi_label_scores() -> None:
    ref = [np.asarray([0.5002, 0.4998])]
    cand = [np.asarray([0.4999, 0.5001])]
    ok, metrics = compare("classify", ref, cand, ParityBar())
    assert not ok and metrics["order_changes"] == 1


def test_embedding_bar_is_min_cosine_in_float64() -> None:
    rng = np.random.default_rng(0)
    ref = [rng.standard_normal(64) for _ in range(5)]
    cand = [r.copy() for r in ref]
    cand[3] = cand[3] + 0.02 * rng.standard_normal(64)
    expected = float(ref[3] @ cand[3] / np.linalg.norm(ref[3]) / np.linalg.norm(cand[3]))
    ok, metrics = compare("embed", ref, cand, ParityBar(min_cosine=0.9999))
    assert metrics["min_cosine"] == pytest.approx(expected, abs=1e-12)
    assert ok is (expected >= 0.9999)


def test_cli_output_and_info_say_which_dtype_and_why(drifting_model: Path, tiny_model, cache: Path, cli, tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    corpus = tmp_path / "in.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "text": t}) + "\n" for i, t in enumerate(["a cat", "the dog ran"])))
    shown = json.loads(cli("info", str(drifting_model), "--json").stdout)["dtype_auto"]
    assert shown.startswith("not probed yet")
    for model, dtype, words in ((drifting_model, "float32", "outside the bar"), (tiny_model("bert-st"), "bfloat16", "within the bar")):
        out = tmp_path / f"{dtype}.parquet"
        cli("embed", corpus, "-o", out, "-m", model, "--dtype", "auto", "-q")
        meta = {k.decode(): v.decode() for k, v in pq.read_schema(out).metadata.items()}
        assert meta["embedcli.dtype"] == dtype and words in meta["embedcli.dtype_reason"]
        shown = json.loads(cli("info", str(model), "--json").stdout)["dtype_auto"]
        assert shown.startswith(f"{dtype} on this CPU") and words in shown
    report = json.loads(cli("inspect", tmp_path / "float32.parquet", "--json").stdout)
    assert "outside the bar" in report["provenance"]["dtype_reason"]
    # token-embed is probed on token vectors, a decision of its own.
    out = tmp_path / "tokens.parquet"
    cli("token-embed", corpus, "-o", out, "-m", tiny_model("bert-st"), "--dtype", "auto", "-q")
    meta = {k.decode(): v.decode() for k, v in pq.read_schema(out).metadata.items()}
    assert "(token_embed)" in meta["embedcli.dtype_reason"]
