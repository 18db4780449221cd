"""`token-embed` / `token-classify` under `--engine ray --workers 2` give the local engine's rows."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from distributed_helpers import write_corpus

ray = pytest.importorskip("ray")

RAY = ("--engine", "ray", "--workers", 2)


@pytest.fixture(scope="module", autouse=True)
def driver(ray_driver):  # type: ignore[no-untyped-def]
    """The in-process CLI runs of this module drive the session's two-node cluster."""
    return ray_driver


@pytest.fixture(scope="module")
def token_classifier(tiny_model, tmp_path_factory: pytest.TempPathFactory) -> Path:  # type: ignore[no-untyped-def]
    """A tiny BertForTokenClassification (3 labels) around the tiny BERT body, with its tokenizer."""
    import torch
    from transformers import BertConfig, BertForTokenClassification

    base = tiny_model("bert")
    config = BertConfig.from_pretrained(str(base), num_labels=3, id2label={0: "O", 1: "B", 2: "I"},
                                        label2id={"O": 0, "B": 1, "I": 2})
    torch.manual_seed(5)
    folder = tmp_path_factory.mktemp("tokcls") / "model"
    BertForTokenClassification(config).eval().save_pretrained(str(folder))
    for f in base.iterdir():
        if f.name.startswith(("tokenizer", "vocab", "special_tokens")):
            shutil.copy(f, folder / f.name)
    return folder


def _lists(table, name):  # type: ignore[no-untyped-def]
    return [np.asarray(v, dtype=np.float64) for v in table.column(name).to_pylist()]


@pytest.mark.parametrize("command", ["token-embed", "token-classify"])
def test_token_tasks_under_ray_equal_the_local_engine(cli, st_model, token_classifier, tmp_path, command):  # type: ignore[no-untyped-def]
    corpus = write_corpus(tmp_path / "corpus.jsonl", 80, seed=3)
    model = st_model if command == "token-embed" else token_classifier
    extra = ("--all-scores",) if command == "token-classify" else ()
    local, remote = tmp_path / "local.parquet", tmp_path / "ray.parquet"
    cli(command, corpus, "-m", model, "-o", local, "--shard-rows", 64, "-q", *extra)
    cli(command, corpus, "-m", model, "-o", remote, "--shard-rows", 64, "-q", *extra, *RAY)
    a, b = pq.read_table(local), pq.read_table(remote)
    assert a.column("id").to_pylist() == b.column("id").to_pylist()
    assert a.column("token_ids").to_pylist() == b.column("token_ids").to_pylist()
    value_cols = ["embeddings"] if command == "token-embed" else ["scores", "probs"]
    for col in value_cols:
        for x, y in zip(_lists(a, col), _lists(b, col), strict=True):
            assert x.shape == y.shape and (not x.size or np.abs(x - y).max() <= 1e-6)
    if command == "token-classify":
        assert a.column("labels").to_pylist() == b.column("labels").to_pylist()
