"""A model's fast tokenizer read straight from tokenizer.json, and its special tokens, without transformers.

transformers' tokenizer classes are needed only for checkpoints without a tokenizer.json, for decoder
tokenizers that transformers rebuilds at load in ways not mirrored here (and as a lazy fallback for
attributes this light view does not have).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tokenizers import Tokenizer

SPECIAL_NAMES = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    with path.open(encoding="utf-8") as f:
        data = json.load(f)
    return data if isinstance(data, dict) else {}


def _content(token: object) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    if isinstance(token, str):
        return token
    if isinstance(token, dict) and isinstance(token.get("content"), str):
        return token["content"]
    return None


def _bert_normalizer(tokenizer: Tokenizer, config: dict[str, Any]) -> None:
    """Align a BertNormalizer with tokenizer_config.json, as transformers' BERT tokenizer does at load."""
    normalizer = json.loads(tokenizer.to_str()).get("normalizer") or {}
    if normalizer.get("type") != "BertNormalizer":
        return
    wanted = {
        "lowercase": config.get("do_lower_case", normalizer.get("lowercase")),
        "strip_accents": config.get("strip_accents", normalizer.get("strip_accents")),
        "handle_chinese_chars": config.get("tokenize_chinese_chars", normalizer.get("handle_chinese_chars")),
    }
    if all(normalizer.get(k) == v for k, v in wanted.items()):
        return
    from tokenizers.normalizers import BertNormalizer

    tokenizer.normalizer = BertNormalizer(
        clean_text=bool(normalizer.get("clean_text", True)),
        handle_chinese_chars=bool(wanted["handle_chinese_chars"]),
        strip_accents=wanted["strip_accents"],
        lowercase=bool(wanted["lowercase"]),
    )


class SpecialTokens:
    """The special tokens of a tokenizer.json + tokenizer_config.json pair, as transformers names them.

    Gives `cls_token_id`, `sep_token_id`, ... and `all_special_ids`; calling it encodes one text like a
    transformers tokenizer (`.input_ids`). Anything else falls back to transformers' tokenizer, loaded
    on first use.
    """

    def __init__(self, folder: Path, tokenizer: Tokenizer) -> None:
        self._folder = folder
        self._encoder = Tokenizer.from_str(tokenizer.to_str())
        self._hf: Any = None
        config = {**_read_json(folder / "special_tokens_map.json"), **_read_json(folder / "tokenizer_config.json")}
        ids: list[int] = []
        for name in SPECIAL_NAMES:
            content = _content(config.get(f"{name}_token"))
            token_id = tokenizer.token_to_id(content) if content is not None else None
            setattr(self, f"{name}_token", content if token_id is not None else None)
            setattr(self, f"{name}_token_id", token_id)
            if token_id is not None and token_id not in ids:
                ids.append(token_id)
        extra = config.get("additional_special_tokens") or config.get("extra_special_tokens") or []
        for token in extra if isinstance(extra, list) else []:
            content = _content(token)
            token_id = tokenizer.token_to_id(content) if content is not None else None
            if token_id is not None and token_id not in ids:
                ids.append(token_id)
        self.all_special_ids = ids

    def __call__(self, text: str, pair: str | None = None) -> SimpleNamespace:
        """`text` (and `pair`) encoded with special tokens, untruncated: `.input_ids`, `.token_type_ids`."""
        enc = self._encoder.encode(text, pair)
        return SimpleNamespace(input_ids=enc.ids, token_type_ids=enc.type_ids, attention_mask=enc.attention_mask)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if self._hf is None:
            from transformers import AutoTokenizer

            self._hf = AutoTokenizer.from_pretrained(str(self._folder), local_files_only=True, trust_remote_code=False)
        return getattr(self._hf, name)


def load_tokenizer_json(folder: str | Path) -> tuple[Tokenizer, SpecialTokens]:
    """The packing tokenizer (no padding, no truncation) from `folder/tokenizer.json`, and its special tokens."""
    folder = Path(folder)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    _bert_normalizer(tokenizer, _read_json(folder / "tokenizer_config.json"))
    # The runner packs without padding and truncates per call.
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer, SpecialTokens(folder, tokenizer)


# The decoder families whose tokenizer_class transformers 5 loads as a plain TokenizersBackend (tokenizer.json
# as it is) when the checkpoint declares one of BACKEND_CLASSES. qwen2 is absent: transformers 5 lists it in
# MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS and always rebuilds it as Qwen2Tokenizer.
BACKEND_DECODER_TYPES = frozenset({"llama", "mistral", "qwen3"})
BACKEND_CLASSES = frozenset({"TokenizersBackend", "PreTrainedTokenizerFast"})
# transformers 5's MODEL_IDS_TO_TOKENIZERS_BACKEND prefixes: a config naming one takes another route there.
_BACKEND_MODEL_IDS = ("deepseek-ai/", "allenai/dolma2", "google/umt5", "naver-clova-ix/", "salesforce/", "stepfun-ai/")
# tokenizer_config.json keys under which transformers 5 changes the backend at load in ways not mirrored here.
_REBUILDING_KEYS = ("auto_map", "split_special_tokens", "fix_mistral_regex", "tokenizer_file", "vocab_file")
_STANDARD_TOKEN_KEYS = frozenset(f"{name}_token" for name in SPECIAL_NAMES)


def _declared_special_contents(config: dict[str, Any]) -> list[str] | None:
    """Contents of every special token tokenizer_config.json names, or None where one is not a plain token."""
    contents: list[str] = []
    for key, value in config.items():
        if not key.endswith("_token") or value is None or isinstance(value, bool):  # add_bos_token, ...
            continue
        if key not in _STANDARD_TOKEN_KEYS:
            return None  # a model-specific special token (image_token, ...) joins all_special_ids there
        content = _content(value)
        if content is None:
            return None
        contents.append(content)
    for key in ("additional_special_tokens", "extra_special_tokens"):
        extra = config.get(key)
        if extra in (None, []):
            continue
        if not isinstance(extra, list):
            return None
        for token in extra:
            content = _content(token)
            if content is None:
                return None
            contents.append(content)
    return contents


def backend_as_is(folder: Path, model_config: dict[str, Any], config: dict[str, Any]) -> bool:
    """Whether transformers 5's AutoTokenizer loads this decoder's tokenizer.json as it is (TokenizersBackend),
    adding no token: then the only change it makes at load is the empty template where no post-processor is set."""
    if model_config.get("model_type") not in BACKEND_DECODER_TYPES:
        return False
    declared = config.get("tokenizer_class") or model_config.get("tokenizer_class")
    if declared not in BACKEND_CLASSES or any(config.get(key) for key in _REBUILDING_KEYS):
        return False
    name = str(model_config.get("_name_or_path") or "").lower()
    if name.startswith(_BACKEND_MODEL_IDS) or "auto_map" in model_config:
        return False
    # A Mistral tekken vocabulary or legacy files route to other backends or merge more tokens in.
    if any((folder / f).exists() for f in ("tekken.json", "added_tokens.json", "tokenizer.model")):
        return False
    return True


def _as_contents(value: object) -> object:
    """A special token (or a list of them) reduced to its content(s), for comparing two declarations."""
    if isinstance(value, list):
        return [_content(v) for v in value]
    return _content(value)


def _adds_no_token(tokenizer: Tokenizer, folder: Path, config: dict[str, Any]) -> bool:
    """Whether every token transformers would add at load (tokenizer_config.json's added_tokens_decoder, the
    named special tokens) is already an added token of tokenizer.json, so that adding it changes nothing."""
    added = {token.content: token_id for token_id, token in tokenizer.get_added_tokens_decoder().items()}
    decoder = config.get("added_tokens_decoder") or {}
    if not isinstance(decoder, dict):
        return False
    for token_id, token in decoder.items():
        content = _content(token)
        if content is None or added.get(content) != int(token_id):
            return False
    # Without added_tokens_decoder, transformers reads the special tokens from special_tokens_map.json too;
    # with it, that file is ignored there but not by SpecialTokens, so the two must agree.
    token_map = _read_json(folder / "special_tokens_map.json")
    if decoder and any(_as_contents(config.get(key)) != _as_contents(value) for key, value in token_map.items()):
        return False
    specials = {**token_map, **config} if not decoder else config
    contents = _declared_special_contents(specials)
    return contents is not None and all(content in added for content in contents)


def load_decoder_tokenizer_json(folder: str | Path) -> tuple[Tokenizer, SpecialTokens] | None:
    """A decoder's packing tokenizer and special tokens as transformers 5's AutoTokenizer builds them, from
    tokenizer.json alone; None where transformers would rebuild it in a way not mirrored here."""
    folder = Path(folder)
    config = _read_json(folder / "tokenizer_config.json")
    model_config = _read_json(folder / "config.json")
    if not (folder / "tokenizer.json").is_file() or not backend_as_is(folder, model_config, config):
        return None
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    if not _adds_no_token(tokenizer, folder, config):
        return None
    # transformers 5 drops add_bos_token/add_eos_token when a tokenizer.json exists (`_from_pretrained`), so a
    # missing post-processor becomes TokenizersBackend.update_post_processor's template with neither BOS nor EOS
    # ("$A:0" / "$A:0 $B:1"): the same ids and type ids as no post-processor, so nothing is set here.
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer, SpecialTokens(folder, tokenizer)
