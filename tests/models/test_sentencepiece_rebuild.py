"""XLM-R checkpoints whose tokenizer_config.json declares XLMRobertaTokenizer (multilingual-e5, bge-m3, the bge
rerankers): transformers 5 rebuilds that tokenizer at load (the Precompiled normalizer alone, WhitespaceSplit before
Metaspace, its own special tokens), so sentence-transformers' ids differ from tokenizer.json read as it is for texts
ending in a zero-width character, holding \\x85, or spelling <mask>. embedcli's vectors must be the rebuilt ones."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.fixtures.tiny_models import build_legacy_st_model, build_spm_xlmr, edit_json

TEXTS = [
    "the market rose\u200b",  # zero-width space at the end: a ▁ of its own read as the file is
    "data science\ufeff",
    "naïve café\u200f",
    "hello\x85world",
    "<mask> the fox",
    "the fox <mask>",
    "plain words of the market",
    "東京 \uff12\uff13 \ufb01",  # NFKC: fullwidth digits, a ligature
]


@pytest.fixture(scope="module")
def xlmr_st(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("spm-xlmr")
    return build_legacy_st_model(build_spm_xlmr(root / "base"), root / "st")


def test_the_rebuilt_tokenizer_differs_from_the_file_on_these_texts(xlmr_st: Path) -> None:
    """The premise: without the rebuild these texts tokenize otherwise (else the test below guards nothing)."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    as_is = Tokenizer.from_file(str(xlmr_st / "tokenizer.json"))
    rebuilt = AutoTokenizer.from_pretrained(str(xlmr_st))
    differ = [t for t in TEXTS if as_is.encode(t).ids != rebuilt(t)["input_ids"]]
    assert len(differ) >= 4


@pytest.mark.parametrize("declared", ["XLMRobertaTokenizer", "XLMRobertaTokenizerFast", None])
def test_xlmr_vectors_follow_the_tokenizer_transformers_builds(declared, xlmr_st, cli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import shutil

    from sentence_transformers import SentenceTransformer

    folder = xlmr_st
    if declared != "XLMRobertaTokenizer":  # another spelling, or none: AutoTokenizer takes the model type's class
        folder = Path(shutil.copytree(xlmr_st, tmp_path / "st"))
        edit_json(folder / "tokenizer_config.json",
                  lambda c: c.update(tokenizer_class=declared) if declared else c.pop("tokenizer_class"))
    src = tmp_path / "t.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS), encoding="utf-8")
    out = tmp_path / "v.jsonl"
    cli("embed", src, "-m", folder, "-o", out, "-q")
    got = np.array([json.loads(line)["embedding"] for line in out.read_text().splitlines()])
    want = SentenceTransformer(str(folder), device="cpu").encode(TEXTS)
    assert np.abs(got - want).max() <= 1e-5
