"""Decoder tokenizers read from tokenizer.json without transformers give AutoTokenizer's ids and special ids."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from embedcli.models.loader import LoadedModel, ModelOptions
from embedcli.models.spec import load_model_spec
from embedcli.models.tokenizer import SpecialTokens
from tests.fixtures.tiny_models import DECODERS, copy_model, edit_json

TEXTS = (
    "",
    " ",
    "   ",
    "\n",
    "\t\n  \r\n",
    "hello",
    "Hello",
    "HELLO WORLD",
    "hello world",
    " hello world ",
    "  leading and trailing spaces  ",
    "the quick brown fox jumps over the lazy dog",
    "The Quick Brown Fox, 2 dogs & 3 cats!",
    "line one\nline two\n\nline four",
    "tabs\tbetween\twords",
    "Ünïcödé Café naïve résumé",
    "東京 北京 서울",
    "emoji 🙂🚀 and symbols ∑ ∞ ≠",
    "£5 $10 %20 (a) [b] {c}",
    "don't can't won't it's",
    "1234567890 3.14159 -42",
    "[CLS] hello [SEP]",
    "hello[SEP]world",
    "[PAD][PAD]",
    "[MASK] is special",
    "a" * 200,
    "market shares rise after bank talks " * 20,
    "zzz qqq xxx",
    "mixed\u00a0non-breaking\u2009spaces",
    "Zero\u200bwidth",
)
PAIRS = (("a question", "an answer"), ("", "document"), ("query", ""), (" q ", "Ünï d\n"))


def _variant(edit_config: Callable[[dict], object] | None = None, edit_json_file: Callable[[dict], object] | None = None):
    def build(src: Path, dst: Path) -> Path:
        folder = copy_model(src, dst)
        if edit_config is not None:
            edit_json(folder / "tokenizer_config.json", edit_config)
        if edit_json_file is not None:
            edit_json(folder / "tokenizer.json", edit_json_file)
        return folder

    return build


def _bos_template(tokenizer: dict) -> None:
    """A Llama-3 style post-processor: BOS ([CLS], id 0) before each sequence, saved in tokenizer.json."""
    cls = {"id": "[CLS]", "type_id": 0}
    tokenizer["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": cls}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [
            {"SpecialToken": cls},
            {"Sequence": {"id": "A", "type_id": 0}},
            {"SpecialToken": {"id": "[CLS]", "type_id": 1}},
            {"Sequence": {"id": "B", "type_id": 1}},
        ],
        "special_tokens": {"[CLS]": {"id": "[CLS]", "ids": [0], "tokens": ["[CLS]"]}},
    }


VARIANTS: dict[str, Callable[[Path, Path], Path] | None] = {
    "saved": None,
    "bos-true-eos-false": _variant(lambda c: c.update(add_bos_token=True, add_eos_token=False)),
    "bos-false-eos-true": _variant(lambda c: c.update(add_bos_token=False, add_eos_token=True)),
    "bos-true-eos-true": _variant(lambda c: c.update(add_bos_token=True, add_eos_token=True)),
    "bos-false-eos-false": _variant(lambda c: c.update(add_bos_token=False, add_eos_token=False)),
    "no-post-processor": _variant(lambda c: c.update(add_bos_token=True), lambda t: t.update(post_processor=None)),
    "bos-template": _variant(lambda c: c.update(add_eos_token=True), _bos_template),
    "preTrainedTokenizerFast": _variant(lambda c: c.update(tokenizer_class="PreTrainedTokenizerFast")),
}
# Variants transformers rebuilds or extends at load: embedcli must keep its tokenizer there.
FALLBACKS: dict[str, Callable[[Path, Path], Path]] = {
    "unknown-class": _variant(lambda c: c.update(tokenizer_class="MysteryTokenizer")),
    "llama-class": _variant(lambda c: c.update(tokenizer_class="LlamaTokenizerFast")),
    "qwen2-class": _variant(lambda c: c.update(tokenizer_class="Qwen2Tokenizer")),
    "special-not-added": _variant(lambda c: c.update(bos_token="the")),  # transformers adds "the" as special
    "split-special-tokens": _variant(lambda c: c.update(split_special_tokens=True)),
    "model-specific-token": _variant(lambda c: c.update(image_token="[MASK]")),
}


def _load(folder: Path) -> LoadedModel:
    return LoadedModel(load_model_spec(str(folder)), ModelOptions(device="cpu", dtype="float32"))


def _assert_same_as_transformers(loaded: LoadedModel, folder: Path) -> None:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    tok = loaded.tokenizer
    assert [tok.encode(t).ids for t in TEXTS] == [hf(t).input_ids for t in TEXTS]
    # Pairs against transformers' backend, as the runner encodes them: `hf(q, "")` would drop an empty pair.
    backend = hf.backend_tokenizer
    for a, b in PAIRS:
        got, want = tok.encode(a, b), backend.encode(a, b)
        assert (got.ids, got.type_ids) == (want.ids, want.type_ids), (a, b)
    special = loaded.hf_tokenizer
    for kind in ("bos", "eos", "pad", "unk", "cls", "sep", "mask"):
        assert getattr(special, f"{kind}_token_id") == getattr(hf, f"{kind}_token_id"), kind
    assert sorted(special.all_special_ids) == sorted(hf.all_special_ids)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("kind", DECODERS)
def test_decoder_tokenizer_matches_autotokenizer(kind, variant, tiny_model, tmp_path) -> None:
    build = VARIANTS[variant]
    folder = tiny_model(kind) if build is None else build(tiny_model(kind), tmp_path / f"{kind}-{variant}")
    loaded = _load(folder)
    assert loaded.own_backbone
    # transformers 5 always rebuilds qwen2 checkpoints as Qwen2Tokenizer: that one keeps the transformers path.
    assert isinstance(loaded.hf_tokenizer, SpecialTokens) == (kind != "qwen2")
    _assert_same_as_transformers(loaded, folder)


@pytest.mark.parametrize("variant", list(FALLBACKS))
def test_rebuilt_tokenizers_keep_transformers(variant, tiny_model, tmp_path) -> None:
    folder = FALLBACKS[variant](tiny_model("llama"), tmp_path / f"llama-{variant}")
    loaded = _load(folder)
    assert not isinstance(loaded.hf_tokenizer, SpecialTokens)
    _assert_same_as_transformers(loaded, folder)


def test_decoder_hot_path_never_imports_transformers(tiny_model) -> None:
    """Loading a tiny Llama on its own backbone and embedding (LAST pooling) leaves transformers unimported."""
    folder = tiny_model("llama")
    code = f"""
import sys
from embedcli.models.loader import LoadedModel, ModelOptions
from embedcli.models.spec import load_model_spec
from embedcli.compute.runner import Runner
loaded = LoadedModel(load_model_spec({str(folder)!r}), ModelOptions(device="cpu", dtype="float32"))
assert loaded.own_backbone
vectors = Runner(loaded).embed(["hello world", "the fox", ""])
assert vectors.shape == (3, 32), vectors.shape
print(sorted(m for m in sys.modules if m.split(".")[0] in ("transformers", "sentence_transformers")))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert json.loads(out.stdout.strip().replace("'", '"')) == []
