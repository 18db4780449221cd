"""`embedcli classify` against transformers' AutoModelForSequenceClassification + the activation, and a real
5-topic BBC classifier (head trained in a session fixture on frozen MiniLM)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

BBC_MAX_LENGTH = 96  # as the fixture that trained the head (tests/tasks/conftest.py)
TEXTS = [
    "Labour won the general election with a reduced majority.",
    "  The striker scored twice as United beat Chelsea.  ",
    "Shares in the bank fell 5% after profits dropped.",
    "hello",
    " ".join(["The new phone runs software from the internet giant."] * 40),  # > 256 tokens: truncated
]


def _reference(folder, texts, max_length=512):  # type: ignore[no-untyped-def]
    """transformers' logits for `texts` (one at a time, no padding)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForSequenceClassification.from_pretrained(str(folder)).eval()
    rows = []
    with torch.inference_mode():
        for t in texts:
            enc = tok(t, return_tensors="pt", truncation=True, max_length=max_length)
            rows.append(model(**enc).logits[0].numpy())
    return np.stack(rows), model.config


def _classify(cli, folder, tmp_path, *flags):  # type: ignore[no-untyped-def]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": f"r{i}", "text": t}) + "\n" for i, t in enumerate(TEXTS)))
    out = tmp_path / "out.parquet"
    cli("classify", src, "-m", folder, "--max-length", 256, "--all-scores", "-o", out, "-q", *flags)
    return pq.read_table(out)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.mark.parametrize(
    ("name", "flags", "expect"),
    [
        ("cross-encoder", (), lambda z: _sigmoid(z)),  # one label: sigmoid
        ("multi-class", (), lambda z: _softmax(z)),  # several labels: softmax
        ("multi-label", (), lambda z: _sigmoid(z)),  # problem_type multi_label_classification: sigmoid per label
        ("calibrated", (), lambda z: _softmax((z - 0.5) / 2.0)),  # logit_mean / logit_sigma from config.json
        ("multi-class", ("--logit-mean", "-1", "--logit-sigma", "0.5"), lambda z: _softmax((z + 1) / 0.5)),
        ("multi-label", ("--logit-mean", "0.25"), lambda z: _sigmoid(z - 0.25)),
        ("multi-class", ("--activation", "sigmoid"), lambda z: _sigmoid(z)),
        ("multi-class", ("--activation", "none"), lambda z: z),
    ],
    ids=["one-label", "multi-class", "multi-label", "config-calibration", "flag-calibration",
         "multi-label-calibrated", "activation-sigmoid", "activation-none"],
)
def test_probabilities_equal_transformers_plus_activation(cli, task_models, tmp_path, two_threads, name, flags, expect):
    folder = task_models(name)
    table = _classify(cli, folder, tmp_path, *flags)
    logits, config = _reference(folder, TEXTS, max_length=256)
    expected = expect(logits.astype(np.float64))
    scores = np.stack(table.column("scores").to_numpy(zero_copy_only=False)).astype(np.float64)
    delta = np.abs(scores - expected).max()
    print(f"classify {name} {' '.join(flags)}: max |delta| {delta:.2e}")
    assert delta <= 1e-5, delta
    best = expected.argmax(axis=1)
    assert table.column("label").to_pylist() == [config.id2label[int(i)] for i in best]
    assert np.abs(table.column("score").to_numpy() - expected[np.arange(len(best)), best]).max() <= 1e-5
    assert table.column("id").to_pylist() == [f"r{i}" for i in range(len(TEXTS))]
    meta = json.loads(pq.read_schema(tmp_path / "out.parquet").metadata[b"embedcli.config"])
    assert meta["labels"] == [config.id2label[i] for i in range(len(config.id2label))]


def test_top_k_and_usage_errors(cli, task_models, tmp_path, two_threads):
    table = _classify(cli, task_models("multi-class"), tmp_path, "--top-k", "3")
    scores = np.stack(table.column("scores").to_numpy(zero_copy_only=False))
    for row, top_labels, top_scores in zip(
        scores, table.column("top_labels").to_pylist(), table.column("top_scores").to_pylist(), strict=True
    ):
        order = np.argsort(-row, kind="stable")[:3]
        assert top_scores == pytest.approx(row[order].tolist())
        assert top_labels == [["world", "sports", "business", "sci"][i] for i in order]
    src = tmp_path / "in.jsonl"
    err = cli("classify", src, "-m", task_models("multi-class"), "--top-k", "9", "-o", tmp_path / "x.parquet", code=2)
    assert "4 labels" in err.stderr
    # an embedding model cannot classify: usage error naming what it can do
    err = cli("classify", src, "-o", tmp_path / "x.parquet", code=2)
    assert "cannot do 'classify'" in err.stderr and "embed, token_embed" in err.stderr and "rerank" in err.stderr
    # and a classifier cannot embed
    err = cli("embed", src, "-m", task_models("multi-class"), "-o", tmp_path / "x.parquet", code=2)
    assert "cannot do 'embed'" in err.stderr and "commands: classify" in err.stderr
    assert not (tmp_path / "x.parquet").exists()


@pytest.mark.parametrize("id2label", [{"0": "world", "1": "sports", "3": "sci"}, {"0": "a", "1": "b", "2": "c", "x": "d"}])
def test_id2label_ids_off_the_label_count_are_refused_at_load(cli, task_models, tmp_path, two_threads, id2label):  # type: ignore[no-untyped-def]
    """A gap in id2label ({0, 1, 3}) made 3 labels of a 4-output head: a reshape traceback mid-run, exit 1."""
    import shutil

    folder = shutil.copytree(task_models("multi-class"), tmp_path / "gap")
    config = json.loads((folder / "config.json").read_text())
    config.pop("num_labels", None)
    config["id2label"] = id2label
    config["label2id"] = {v: k for k, v in id2label.items()}
    (folder / "config.json").write_text(json.dumps(config))
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"id": 1, "text": "a b"}) + "\n")
    err = cli("classify", src, "-m", folder, "-o", tmp_path / "x.parquet", code=1)
    assert "Traceback" not in err.stderr and "config.json: id2label ids" in err.stderr
    assert not (tmp_path / "x.parquet").exists()


def test_real_bbc_topic_classifier_reaches_085_held_out(cli, bbc_classifier, bbc_split, tmp_path, two_threads):
    test = bbc_split["test"]
    src = tmp_path / "held_out.jsonl"
    src.write_text("".join(json.dumps({"id": i, "text": x, "topic": t}) + "\n" for i, t, x in test))
    out = tmp_path / "topics.parquet"
    cli("classify", src, "-m", bbc_classifier, "--max-length", BBC_MAX_LENGTH, "--keep-cols", "topic", "-o", out, "-q",
        env={"EMBEDCLI_DTYPE": "auto"})
    table = pq.read_table(out)
    accuracy = float(np.mean(np.array(table.column("label").to_pylist()) == np.array(table.column("topic").to_pylist())))
    print(f"BBC held-out accuracy through embedcli classify: {accuracy:.3f} on {len(test)} articles")
    assert accuracy >= 0.85, accuracy


@pytest.mark.parametrize(("name", "flags"), [("multi-class", ("--activation", "sigmoid")), ("calibrated", ())])
def test_rerun_of_a_complete_classify_output_imports_no_torch(cli, task_models, tmp_path, name, flags):  # type: ignore[no-untyped-def]
    from tests.test_start_lazily import fresh, imported_torch

    _classify(cli, task_models(name), tmp_path, *flags)
    out = tmp_path / "out.parquet"
    before = out.read_bytes()
    args = ["classify", tmp_path / "in.jsonl", "-m", task_models(name), "--max-length", 256, "--all-scores",
            "-o", out, "--dtype", "float32", *flags]
    done = fresh(tmp_path / "cache", *args)
    assert done.returncode == 0 and "nothing to do" in done.stderr, done.stderr
    assert not imported_torch(done)
    refused = fresh(tmp_path / "cache", *args, "--top-k", 2)  # another config: refused, still without torch
    assert refused.returncode == 2 and "different config" in refused.stderr, refused.stderr
    assert not imported_torch(refused)
    assert out.read_bytes() == before


@pytest.mark.parametrize(
    ("command", "flags", "config", "said"),
    [
        ("classify", ("--logit-sigma", "-2"), {}, "--logit-sigma -2.0: must be a positive number"),
        ("classify", ("--logit-sigma", "nan"), {}, "--logit-sigma nan: must be a positive number"),
        ("classify", ("--logit-sigma", "inf"), {}, "--logit-sigma inf: must be a positive number"),
        ("classify", ("--logit-mean", "nan"), {}, "--logit-mean nan: must be a finite number"),
        ("classify", (), {"logit_sigma": -0.5}, "config.json: logit_sigma -0.5: must be a positive number"),
        ("classify", (), {"logit_scale": -4}, "config.json: 1 / logit_scale -0.25: must be a positive number"),
        ("rerank", ("--query", "q"), {"logit_sigma": -1.0}, "config.json: logit_sigma -1.0: must be a positive number"),
    ],
    ids=["flag-negative", "flag-nan", "flag-inf", "mean-nan", "config-negative", "config-scale-negative", "rerank"],
)
def test_a_calibration_that_reverses_or_voids_the_scores_is_refused(cli, task_models, tmp_path, command, flags, config,
                                                                    said):  # type: ignore[no-untyped-def]
    """(x - mean) / sigma with sigma < 0 ranked the least likely label first (and a reranker's worst document
    first), at exit 0; NaN or inf made every score NaN (or equal). vLLM refuses only sigma 0: a spread is positive."""
    import shutil

    base = task_models("multi-class" if command == "classify" else "cross-encoder")
    folder = base
    if config:
        folder = shutil.copytree(base, tmp_path / "model")
        cfg = json.loads((folder / "config.json").read_text())
        cfg.update(config)
        (folder / "config.json").write_text(json.dumps(cfg))
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": f"r{i}", "text": t}) + "\n" for i, t in enumerate(TEXTS)))
    out = tmp_path / "out.parquet"
    err = cli(command, src, "-m", folder, "-o", out, *flags, code=2)
    assert said in err.stderr and "Traceback" not in err.stderr, err.stderr
    assert not out.exists()


@pytest.mark.parametrize("pair", [False, True], ids=["text", "pair"])
def test_softmax_over_one_label_is_refused(cli, task_models, tmp_path, two_threads, pair):  # type: ignore[no-untyped-def]
    """`--activation softmax` on a one-label model wrote 1.0 for every row at exit 0; CrossEncoder.predict
    (apply_softmax=True) applies softmax only to more than one label and gives the sigmoid there."""
    from sentence_transformers import CrossEncoder

    folder = task_models("cross-encoder")
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": f"r{i}", "text": t, "other": "a reply"}) + "\n"
                           for i, t in enumerate(TEXTS[:3])))
    out = tmp_path / "out.parquet"
    pair_flags = ("--pair-col", "other") if pair else ()
    err = cli("classify", src, "-m", folder, "--activation", "softmax", *pair_flags, "-o", out, code=2)
    assert "--activation softmax" in err.stderr and "one label" in err.stderr and "Traceback" not in err.stderr
    assert not out.exists()
    reference = CrossEncoder(str(folder), device="cpu").predict([(TEXTS[0], "a reply")], apply_softmax=True)
    assert 0 < float(reference[0]) < 1  # not the constant 1.0 a softmax over one logit gives
    cli("classify", src, "-m", folder, "--activation", "sigmoid", *pair_flags, "-o", out, "-q")
    assert pq.read_table(out).num_rows == 3
