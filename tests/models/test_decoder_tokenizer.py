"""Decoder tokenizers read from tokenizer.json without transformers give AutoTokenizer's ids and special ids."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from embedcli.errors import ModelConfigError
from embedcli.models.loader import LoadedModel, ModelOptions
from embedcli.models.spec import load_model_spec
from embedcli.models.tokenization.tokenizer import SpecialTokens
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
    "[cls] lower-cased [sep]",
    "hello[SEP]world",
    "[PAD][PAD]",
    "[MASK] is special",
    "a" * 200,
    "market shares rise after bank talks " * 20,
    "zzz qqq xxx",
    "mixed\u00a0non-breaking\u2009spaces",
    "Zero\u200bwidth",
    "<|im_start|>user\nhi<|im_end|>",
    "cafe\u0301 decomposed, café composed",
    "I'm sure they'll say it's 2024 or 12345678",
)
PAIRS = (("a question", "an answer"), ("", "document"), ("query", ""), (" q ", "Ünï d\n"))


def _variant(
    edit_config: Callable[[dict], object] | None = None,
    edit_json_file: Callable[[dict], object] | None = None,
):
    def build(src: Path, dst: Path) -> Path:
        folder = copy_model(src, dst)
        if edit_config is not None:
            edit_json(folder / "tokenizer_config.json", edit_config)
        if edit_json_file is not None:
            edit_json(folder / "tokenizer.json", edit_json_file)
        return folder

    return build


def _with_junk_sentencepiece(folder: Path) -> Path:
    """A tokenizer.model beside tokenizer.json (as Llama-2 / Mistral ship): neither route may read it."""
    (folder / "tokenizer.model").write_bytes(b"not a sentencepiece model")
    return folder


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
    "no-post-processor": _variant(
        lambda c: c.update(add_bos_token=True), lambda t: t.update(post_processor=None)
    ),
    "bos-template": _variant(lambda c: c.update(add_eos_token=True), _bos_template),
    "preTrainedTokenizerFast": _variant(lambda c: c.update(tokenizer_class="PreTrainedTokenizerFast")),
    "sentencepiece-file-beside": lambda src, dst: _with_junk_sentencepiece(copy_model(src, dst)),
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
        edit_json(
            folder / "tokenizer_config.json",
            lambda c: c.update(added_tokens_decoder={**decoder, **(extra or {})}),
        )
        return folder

    return build


def _added(content: str) -> dict:
    return {
        "content": content,
        "lstrip": False,
        "normalized": False,
        "rstrip": False,
        "single_word": False,
        "special": True,
    }


QWEN_CORPUS = [
    *TEXTS,
    "the year 2024 and 1999 and 12345678 and 42",
    "I'm sure they'll say it's fine, don't worry, we've seen it",
    "café résumé naïve über straße",
    "hello world the quick brown fox jumps over the lazy dog " * 3,
]


def _qwen_style() -> Callable[[Path, Path], Path]:
    """A byte-level BPE tokenizer saved the way Qwen2.5 / Qwen3 checkpoints ship theirs (NFC, Qwen's split
    regex, Qwen2Tokenizer, added_tokens_decoder and additional_special_tokens), over a tiny body.
    Trained with GPT-2's split (digits grouped), so dropping Qwen's own split changes the ids."""

    def build(src: Path, dst: Path) -> Path:
        from tokenizers import (
            Regex,
            Tokenizer,
            decoders,
            models,
            normalizers,
            pre_tokenizers,
            processors,
            trainers,
        )
        from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

        folder = copy_model(src, dst)
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        alphabet = pre_tokenizers.ByteLevel.alphabet()
        trainer = trainers.BpeTrainer(
            vocab_size=300, special_tokens=specials, initial_alphabet=alphabet, show_progress=False
        )
        tok.train_from_iterator(QWEN_CORPUS, trainer)
        assert tok.get_vocab_size() <= 308  # the tiny body's embedding rows
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        tok.decoder = decoders.ByteLevel()
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        tok.save(str(folder / "tokenizer.json"))
        decoder = {str(tok.token_to_id(t)): _added(t) for t in specials}
        config = {
            "tokenizer_class": "Qwen2Tokenizer",
            "added_tokens_decoder": decoder,
            "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
            "bos_token": None,
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "unk_token": None,
            "errors": "replace",
            "split_special_tokens": False,
            "add_prefix_space": False,
            "model_max_length": 32768,
        }
        (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
        for stale in ("vocab.txt", "special_tokens_map.json"):
            (folder / stale).unlink(missing_ok=True)
        return folder

    return build


def _then(
    first: Callable[[Path, Path], Path], change: Callable[[dict], object]
) -> Callable[[Path, Path], Path]:
    def build(src: Path, dst: Path) -> Path:
        folder = first(src, dst)
        edit_json(folder / "tokenizer_config.json", change)
        return folder

    return build


# Class routes AutoTokenizer takes (Qwen2Tokenizer mirrored, LlamaTokenizer swapped for TokenizersBackend):
# (model kind, variant builder, whether embedcli's own tokenizer serves it).
ROUTED_VARIANTS: dict[str, tuple[str, Callable[[Path, Path], Path], bool]] = {
    "qwen3-declares-qwen2": ("qwen3", _variant(lambda c: c.update(tokenizer_class="Qwen2Tokenizer")), True),
    "prefix-space": ("qwen2", _variant(lambda c: c.update(add_prefix_space=True)), True),
    "decoder-in-config": ("qwen2", _decoder_in_config(), True),
    "new-token-in-config": ("qwen2", _decoder_in_config({"308": _added("<|im_start|>")}), True),
    "no-eos-declared": ("qwen2", _variant(lambda c: c.pop("eos_token")), True),  # the class default then
    "qwen-style": ("qwen2", _qwen_style(), True),
    "qwen-style-qwen3": ("qwen3", _qwen_style(), True),
    "qwen-style-prefix-space": (
        "qwen2",
        _then(_qwen_style(), lambda c: c.update(add_prefix_space=True)),
        True,
    ),
    "qwen-style-legacy": (
        "qwen2",
        _then(_qwen_style(), lambda c: c.pop("added_tokens_decoder")),
        True,
    ),
    "llama3-declares-llama": (
        "llama",
        _then(_qwen_style(), lambda c: c.update(tokenizer_class="LlamaTokenizerFast")),
        True,
    ),
    "mistral-declares-llama": (
        "mistral",
        _variant(lambda c: c.update(tokenizer_class="LlamaTokenizerFast")),
        True,
    ),
    "gap-in-ids": ("qwen2", _decoder_in_config({"400": _added("<|im_start|>")}), False),
    "extra-special": ("qwen2", _variant(lambda c: c.update(extra_special_tokens=["[MASK]", "zzz"])), True),
    "additional-special": (
        "qwen2",
        _variant(lambda c: c.update(additional_special_tokens=["<|im_end|>"])),
        True,
    ),
    "extra-special-dict": (
        "qwen2",
        _variant(lambda c: c.update(extra_special_tokens={"image_token": "[MASK]"})),
        False,
    ),
    "model-specific-token": ("qwen2", _variant(lambda c: c.update(image_token="[MASK]")), False),
}


def _stale_special_map(src: Path, dst: Path) -> Path:
    """added_tokens_decoder in the config and a special_tokens_map.json naming one more token: transformers
    ignores the map then (mask_token stays unset)."""
    folder = _decoder_in_config()(src, dst)
    edit_json(folder / "tokenizer_config.json", lambda c: c.pop("mask_token", None))
    (folder / "special_tokens_map.json").write_text(json.dumps({"mask_token": "[MASK]"}), encoding="utf-8")
    return folder


FALLBACKS["stale-special-map"] = _stale_special_map
# transformers re-adds every added_tokens_decoder entry: flags unlike tokenizer.json's replace them there
# ([CLS] normalized, so the lowercasing normalizer makes "[cls]" match it too).
FALLBACKS["other-flags-in-config"] = _decoder_in_config(
    {"0": {**_added("[CLS]"), "normalized": True, "special": False}}
)


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


@pytest.mark.parametrize("variant", list(ROUTED_VARIANTS))
def test_routed_tokenizer_matches_autotokenizer(variant, tiny_model, tmp_path) -> None:
    kind, build, own = ROUTED_VARIANTS[variant]
    folder = build(tiny_model(kind), tmp_path / f"{kind}-{variant}")
    loaded = _load(folder)
    assert isinstance(loaded.hf_tokenizer, SpecialTokens) == own
    _assert_same_as_transformers(loaded, folder)


def test_decoder_hot_path_never_imports_transformers(tiny_model) -> None:
    """Loading a tiny Llama on its own backbone and embedding (LAST pooling) leaves transformers unimported."""
    folder = tiny_model("llama")
    code = f"""
import sys
from embedcli.errors import ModelConfigError
from embedcli.models.loader import LoadedModel, ModelOptions
from embedcli.models.spec import load_model_spec
from embedcli.compute.runner import Runner
loaded = LoadedModel(load_model_spec({str(folder)!r}), ModelOptions(device="cpu", dtype="float32"))
assert loaded.own_backbone
vectors = Runner(loaded).embed(["hello world", "the fox", ""])
assert vectors.shape == (3, 32), vectors.shape
print(sorted(m for m in sys.modules if m.split(".")[0] in ("transformers", "sentence_transformers")))
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert json.loads(out.stdout.strip().replace("'", '"')) == []


def test_a_tokenizer_json_the_mirror_cannot_read_goes_to_transformers(tiny_model, tmp_path, monkeypatch) -> None:
    """A bug or an unforeseen shape in the mirror costs start-up time, never a refused model."""
    import embedcli.models.loader as loader

    def broken(path: Path) -> None:
        raise KeyError("model")

    monkeypatch.setattr(loader, "load_decoder_tokenizer_json", broken)
    folder = copy_model(tiny_model("llama"), tmp_path / "llama")
    _assert_same_as_transformers(_load(folder), folder)


def test_a_corrupt_decoder_tokenizer_json_is_one_config_error(tiny_model, tmp_path) -> None:
    folder = copy_model(tiny_model("qwen2"), tmp_path / "qwen2")
    (folder / "tokenizer.json").write_text('{"version": "1.0", "model": {', encoding="utf-8")
    with pytest.raises(ModelConfigError, match="tokenizer"):
        _load(folder)
