"""Fixtures of the Python API tests: tiny checkpoints of every family the API serves, saved as their libraries
save them, and helpers that run the CLI command on a real file and read what it wrote."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json")


def _classifier(base: Path, folder: Path, labels: list[str], seed: int, *, cross_encoder: bool = False,
                token: bool = False, **config: Any) -> Path:
    """A tiny BertFor(Sequence|Token)Classification on the tiny BERT's tokenizer; saved by sentence-transformers
    6's CrossEncoder (its layout: the activation in config_sentence_transformers.json) or by transformers."""
    import torch
    import transformers as tf

    from tests.fixtures.tiny_models import ENCODER_KW

    vocab = json.loads((base / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
    torch.manual_seed(seed)
    cfg = tf.BertConfig(vocab_size=len(vocab), **ENCODER_KW, num_labels=len(labels),
                        id2label=dict(enumerate(labels)), label2id={n: i for i, n in enumerate(labels)}, **config)
    plain = folder.with_name(folder.name + "-plain") if cross_encoder else folder
    model_class = tf.BertForTokenClassification if token else tf.BertForSequenceClassification
    model_class(cfg).eval().save_pretrained(str(plain))
    for name in TOKENIZER_FILES:
        if (base / name).is_file():
            (plain / name).write_bytes((base / name).read_bytes())
    if cross_encoder:
        from sentence_transformers import CrossEncoder

        CrossEncoder(str(plain), device="cpu").save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="session")
def api_model(tiny_model: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """`api_model(name) -> folder`, built once per session on first use.

    minilm: the packaged all-MiniLM-L6-v2; cross-encoder: one label (CrossEncoder layout, sigmoid); nli: three
    labels (CrossEncoder layout); ner: a five-label token classifier; topics: four labels (transformers layout, softmax); multi-label: three labels,
    sigmoid each; llm-reranker: a tiny Qwen3 saved by CrossEncoder (LogitScore, its pair prompt); qwen3: the plain
    causal LM (scored with the reranker flags); colbert: PyLate's layout; splade: a SparseEncoder (MLM + max
    pooling); prompted: a sentence-transformers model with query/document prompts; bge-m3: BAAI/bge-m3's layout
    (dense, lexical weights and colbert heads); static: a model2vec model.
    """
    root = tmp_path_factory.mktemp("api_models")
    built: dict[str, Path] = {}

    def build(name: str) -> Path:
        folder = root / name
        if name == "minilm":
            from embedcli.models.checkpoint.resolve import resolve_model_path

            return Path(resolve_model_path(None))
        if name == "cross-encoder":
            return _classifier(tiny_model("bert"), folder, ["relevance"], 11, cross_encoder=True)
        if name == "nli":
            return _classifier(tiny_model("bert"), folder, ["contradiction", "entailment", "neutral"], 12,
                               cross_encoder=True)
        if name == "topics":
            return _classifier(tiny_model("bert"), folder, ["world", "sports", "business", "tech"], 13)
        if name == "ner":
            return _classifier(tiny_model("bert"), folder, ["O", "B-PER", "I-PER", "B-ORG", "I-ORG"], 15, token=True)
        if name == "multi-label":
            return _classifier(tiny_model("bert"), folder, ["urgent", "finance", "people"], 14,
                               problem_type="multi_label_classification")
        if name in ("llm-reranker", "qwen3"):
            from tests.fixtures.tiny_families import build_llm_reranker

            plain, saved = build_llm_reranker("qwen3", root / "llm")
            built["qwen3"], built["llm-reranker"] = plain, saved
            return built[name]
        if name == "colbert":
            from tests.fixtures.colbert import build_pylate_colbert

            return build_pylate_colbert(folder)
        if name == "splade":
            from tests.fixtures.tiny_families import build_splade

            return build_splade(folder)
        if name == "prompted":
            return _prompted(tiny_model("bert"), folder)
        if name == "bge-m3":
            from tests.fixtures.bge_m3 import build_bge_m3

            return build_bge_m3(folder)
        if name == "static":
            from tests.fixtures.static_models import build_m2v

            return build_m2v(folder)
        raise KeyError(name)

    def get(name: str) -> Path:
        if name not in built:
            built[name] = build(name)
        return built[name]

    return get


def _prompted(base: Path, folder: Path) -> Path:
    """A tiny sentence-transformers model (mean pooling, Normalize) with query and document prompts."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    torch.manual_seed(3)
    transformer = Transformer(str(base), max_seq_length=64)
    modules = [transformer, Pooling(transformer.get_embedding_dimension(), "mean"), Normalize()]
    model = SentenceTransformer(modules=modules, device="cpu", prompts={"query": "query: ", "document": "passage: "})
    model.save(str(folder))
    return folder
