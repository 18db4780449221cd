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
    "<|im_start|>user\nhi<|im_end|>",
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


def _decoder_in_config(extra: dict[str, dict] | None = None) -> Callable[[Path, Path], Path]:
    """tokenizer.json's added tokens written into tokenizer_config.json's added_tokens_decoder (as real Qwen
    checkpoints ship it), with `extra` ones transformers adds at load."""

    def build(src: Path, dst: Path) -> Path:
        folder = copy_model(src, dst)
        saved = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))["added_tokens"]
        decoder = {str(t["id"]): {k: v for k, v in t.items() if k != "id"} for t in saved}
        edit_json(folder / "tokenizer_config.json", lambda c: c.update(added_tokens_decoder={**decoder, **(extra or {})}))
        return folder

    return build


def _added(content: str) -> dict:
    return {"content": content, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False, "special": True}


# Qwen2Tokenizer, mirrored: (model kind, variant builder, whether embedcli's own tokenizer serves it).
QWEN2_VARIANTS: dict[str, tuple[str, Callable[[Path, Path], Path], bool]] = {
    "qwen3-declares-qwen2": ("qwen3", _variant(lambda c: c.update(tokenizer_class="Qwen2Tokenizer")), True),
    "prefix-space": ("qwen2", _variant(lambda c: c.update(add_prefix_space=True)), True),
    "decoder-in-config": ("qwen2", _decoder_in_config(), True),
    "new-token-in-config": ("qwen2", _decoder_in_config({"308": _added("<|im_start|>")}), True),
    "no-eos-declared": ("qwen2", _variant(lambda c: c.pop("eos_token")), True),  # the class default then
    "gap-in-ids": ("qwen2", _decoder_in_config({"400": _added("<|im_start|>")}), False),
    "extra-special": ("qwen2", _variant(lambda c: c.update(extra_special_tokens=["[MASK]"])), False),
    "model-specific-token": ("qwen2", _variant(lambda c: c.update(image_token="[MASK]")), False),
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
    assert isinstance(loaded.hf_tokenizer, SpecialTokens)
    _assert_same_as_transformers(loaded, folder)


@pytest.mark.parametrize("variant", list(FALLBACKS))
def test_rebuilt_tokenizers_keep_transformers(variant, tiny_model, tmp_path) -> None:
    folder = FALLBACKS[variant](tiny_model("llama"), tmp_path / f"llama-{variant}")
    loaded = _load(folder)
    assert not isinstance(loaded.hf_tokenizer, SpecialTokens)
    _assert_same_as_transformers(loaded, folder)


@pytest.mark.parametrize("variant", list(QWEN2_VARIANTS))
def test_qwen2_tokenizer_rebuild_matches_autotokenizer(variant, tiny_model, tmp_path) -> None:
    kind, build, own = QWEN2_VARIANTS[variant]
    folder = build(tiny_model(kind), tmp_path / f"{kind}-{variant}")
    loaded = _load(folder)
    assert isinstance(loaded.hf_tokenizer, SpecialTokens) == own
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
