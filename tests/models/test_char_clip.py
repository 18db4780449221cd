"""Truncation cuts huge texts by characters before tokenizing (issue 13, item 11): the kept tokens are exactly
those of the whole text, and a 16 MB text no longer costs gigabytes."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from embedcli.models.tokenization.char_clip import ClipBound, clip_bound, clip_texts, least_bound, unsafe_cuts

WORDS = "the quick brown fox jumps over a lazy dog naïve café 東京 emoji 😀 punctuation, ok! x".split()


def _texts(bound: int) -> list[str]:
    rng = random.Random(0)
    words = " ".join(rng.choice(WORDS) for _ in range(bound))  # far past the bound
    return [
        words,
        "short text",
        "a" * (3 * bound),  # one giant word: no boundary, tokenized whole
        "word " * 10 + " " * (3 * bound) + "tail",  # a whitespace run: the cut text fits, tokenized whole
        words[: bound - 1] + "supercalifragilistic" * 50,  # a long word straddling the cut
        ("the", words),  # a pair is never cut
    ]


@pytest.mark.parametrize("model", ["bert-st", "qwen2", "xlm-roberta"])
@pytest.mark.parametrize("side", ["right", "left"])
def test_cut_texts_keep_exactly_the_tokens_of_whole_texts(
    tiny_model: Callable[[str], Path], model: str, side: str
) -> None:
    tok = Tokenizer.from_file(str(tiny_model(model) / "tokenizer.json"))
    max_length = 16
    tok.enable_truncation(max_length, strategy="longest_first", direction=side)
    bound = clip_bound(tok, max_length)
    texts = _texts(bound)
    whole = tok.encode_batch(texts)
    clipped, cut = clip_texts(texts, bound, side)
    assert cut == [0, 2, 3, 4] and all(len(clipped[i]) == bound for i in cut)
    got = tok.encode_batch(clipped)
    redo = unsafe_cuts(clipped, got, cut, side)
    assert 2 in redo and 3 in redo and 0 not in redo
    for i in redo:
        got[i] = tok.encode(texts[i])
    assert [e.ids for e in got] == [e.ids for e in whole]
    assert [bool(e.overflowing) for e in got] == [bool(e.overflowing) for e in whole]


# Python's `\s` matches these, but BERT's normalizer (and SentencePiece's nmt_nfkc, most of them) deletes them:
# "un\x0cbelievable" is the word "unbelievable", not a break between "un" and "believable".
DELETED_SPACES = ["\x0b", "\x0c", "\x1c", "\x1f", "\x85"]


def _straddling(bound: int, sep: str, side: str, filler: int, word: tuple[str, str, str]) -> str:
    """`filler` one-token words, then `word` spelled across the cut with runs of `sep` (mirrored for left)."""
    first, middle, last = word
    if side == "right":
        return "a " * filler + first + sep * (bound - 2 * filler - 100) + middle + sep * bound + last
    return first + sep * bound + middle + sep * (bound - 2 * filler - 100) + last + " a" * filler


@pytest.mark.parametrize("sep", DELETED_SPACES)
@pytest.mark.parametrize("side", ["right", "left"])
def test_a_character_the_normalizer_deletes_is_no_word_break(sep: str, side: str) -> None:
    from embedcli.models.checkpoint.resolve import resolve_model_path

    tok = Tokenizer.from_file(str(Path(resolve_model_path(None)) / "tokenizer.json"))  # all-MiniLM-L6-v2
    tok.no_padding()
    max_length = 16
    tok.enable_truncation(max_length, strategy="longest_first", direction=side)
    bound = clip_bound(tok, max_length)
    text = _straddling(bound, sep, side, max_length - 3, ("un", "bel", "ievable"))
    whole = tok.encode(text)
    assert "unbelievable" in whole.tokens
    clipped, cut = clip_texts([text], bound, side)
    got = tok.encode_batch(clipped)
    for i in unsafe_cuts(clipped, got, cut, side):
        got[i] = tok.encode(text)
    assert got[0].tokens == whole.tokens


def test_cli_embed_of_a_word_joined_across_the_cut_matches_sentence_transformers(
    st_model: Path, tmp_path: Path, cli: Callable[..., object]
) -> None:
    import numpy as np
    import pyarrow.parquet as pq
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(st_model), device="cpu")
    bound = clip_bound(Tokenizer.from_file(str(st_model / "tokenizer.json")), model.max_seq_length)
    # The tiny vocabulary has "market" but not "mark": the cut text's "mar…k" is 4 pieces (m ##a ##r ##k).
    texts = [
        _straddling(bound, sep, "right", model.max_seq_length - 3, ("mar", "k", "et"))
        for sep in DELETED_SPACES[:2]
    ]
    corpus, out = tmp_path / "in.jsonl", tmp_path / "out.parquet"
    corpus.write_text("".join(json.dumps({"id": str(i), "text": t}) + "\n" for i, t in enumerate(texts)))
    cli("embed", corpus, "-m", st_model, "-o", out, "-q")
    got = np.asarray(pq.read_table(out).column("embedding").to_pylist())
    np.testing.assert_allclose(got, model.encode(texts), atol=1e-5)


class _CountingVocab:
    """A tokenizer whose vocab (one 40-character token) counts its reads."""

    def __init__(self) -> None:
        self.reads = 0

    def get_vocab(self) -> dict[str, int]:
        self.reads += 1
        return {"x" * 40: 0, "a": 1}


@pytest.mark.parametrize("max_length", [8, 512])
def test_clip_bound_reads_the_vocab_only_for_a_text_over_the_least_bound(max_length: int) -> None:
    tok = _CountingVocab()
    clip = ClipBound(tok, max_length)
    least = least_bound(max_length)
    assert least == 2 * max_length * 16 + 1024
    assert not clip.needed(["a" * least, ("a" * (least + 1), "b"), 7])  # pairs are never cut
    assert tok.reads == 0
    assert clip.needed(["short", "a" * (least + 1)])
    assert clip.value == clip.value == clip_bound(tok, max_length) == 2 * max_length * 40 + 1024
    assert tok.reads == 2  # one for the cached value, one for the direct call


@pytest.mark.parametrize("model", ["bert-st", "qwen2", "xlm-roberta"])
def test_least_bound_is_below_every_tokenizers_bound(tiny_model: Callable[[str], Path], model: str) -> None:
    tok = Tokenizer.from_file(str(tiny_model(model) / "tokenizer.json"))
    assert least_bound(16) <= clip_bound(tok, 16)


def _peak_rss_mb(model: Path, corpus: Path, out: Path) -> float:
    code = (
        "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True);"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    argv = [sys.executable, "-c", code, sys.executable, "-m", "embedcli", "embed", str(corpus), "-m", str(model),
            "-o", str(out), "-q"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "EMBEDCLI_DTYPE": "float32", "HF_HUB_OFFLINE": "1"}
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300, check=True)
    return int(r.stdout.split()[-1]) / 1024


def test_huge_text_costs_no_more_memory_than_a_short_one(st_model: Path, tmp_path: Path) -> None:
    small, huge = tmp_path / "small.jsonl", tmp_path / "huge.jsonl"
    small.write_text(json.dumps({"id": "a", "text": "a short text"}) + "\n")
    words = ("lorem ipsum dolor sit amet " * ((16 << 20) // 27 + 1))[: 16 << 20]
    huge.write_text(json.dumps({"id": "a", "text": words}) + "\n")
    base = _peak_rss_mb(st_model, small, tmp_path / "s.parquet")
    peak = _peak_rss_mb(st_model, huge, tmp_path / "h.parquet")
    assert peak - base < 400, f"a 16 MB text took {peak - base:.0f} MB more than a short one"
