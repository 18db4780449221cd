"""A decoder's tokenizer built from tokenizer.json as transformers 5's AutoTokenizer builds it, without transformers.

AutoTokenizer does not always take tokenizer.json as it is: it picks a class from tokenizer_config.json and
config.json (`models/auto/tokenization_auto.py`), and some classes rebuild the backend at load. Two routes
are mirrored here, for the decoder families embedcli runs on its own backbones:

- `TokenizersBackend` (declared as such or as `PreTrainedTokenizerFast`, on llama / mistral / qwen3):
  tokenizer.json as it is, when every token transformers adds at load is already one of its added tokens.
- `Qwen2Tokenizer` (every qwen2 checkpoint, and qwen3 ones declaring it): the BPE vocabulary and merges of
  tokenizer.json under the class's own normalizer and pre-tokenizer, its post-processor, and the added
  tokens re-added in transformers' order (`tokenization_qwen2.py`, `tokenization_utils_tokenizers.py`).

Anything else returns None, and the caller keeps transformers' AutoTokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE

from embedcli.models.tokenization.tokenizer import SPECIAL_NAMES, SpecialTokens, read_json, token_content

BACKEND_DECODER_TYPES = frozenset({"llama", "mistral", "qwen3"})
"""Families whose declared TokenizersBackend transformers 5 keeps. qwen2 is not one: transformers lists it in
MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS and always loads Qwen2Tokenizer for it."""
BACKEND_CLASSES = frozenset({"TokenizersBackend", "PreTrainedTokenizerFast"})
QWEN2_CLASSES = frozenset({"Qwen2Tokenizer", "Qwen2TokenizerFast"})
# transformers 5's MODEL_IDS_TO_TOKENIZERS_BACKEND prefixes: a config naming one takes another route there.
_BACKEND_MODEL_IDS = (
    "deepseek-ai/",
    "allenai/dolma2",
    "google/umt5",
    "naver-clova-ix/",
    "salesforce/",
    "stepfun-ai/",
)
# tokenizer_config.json keys under which transformers changes the backend at load in ways not mirrored here.
_REBUILDING_KEYS = ("auto_map", "split_special_tokens", "fix_mistral_regex", "tokenizer_file", "vocab_file")
# Files that route to another backend (tekken: MistralCommonBackend) or merge more tokens in at load.
_REROUTING_FILES = ("tekken.json", "added_tokens.json")
_STANDARD_TOKEN_KEYS = frozenset(f"{name}_token" for name in SPECIAL_NAMES)
# Qwen2Tokenizer's own pre-tokenizer split and its special-token defaults (transformers' tokenization_qwen2.py).
QWEN2_PRETOKENIZE_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
QWEN2_DEFAULTS = {
    "unk_token": "<|endoftext|>",
    "bos_token": None,
    "eos_token": "<|endoftext|>",
    "pad_token": "<|endoftext|>",
}


def _as_contents(value: object) -> object:
    """A special token (or a list of them) reduced to its content(s), for comparing two declarations."""
    if isinstance(value, list):
        return [token_content(v) for v in value]
    return token_content(value)


def _declared_special_contents(config: dict[str, Any]) -> list[str] | None:
    """Contents of every special token tokenizer_config.json names, or None where one is not a plain token."""
    contents: list[str] = []
    for key, value in config.items():
        if not key.endswith("_token") or value is None or isinstance(value, bool):  # add_bos_token, ...
            continue
        if key not in _STANDARD_TOKEN_KEYS:
            return None  # a model-specific special token (image_token, ...) joins all_special_ids there
        content = token_content(value)
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
            content = token_content(token)
            if content is None:
                return None
            contents.append(content)
    return contents


def tokenizer_route(folder: Path, model_config: dict[str, Any], config: dict[str, Any]) -> str | None:
    """The class transformers 5's AutoTokenizer would load for this decoder, where mirrored here
    ("backend" or "qwen2"); None for any other route."""
    if any(config.get(key) for key in _REBUILDING_KEYS) or "auto_map" in model_config:
        return None
    if any((folder / name).exists() for name in _REROUTING_FILES):
        return None
    if str(model_config.get("_name_or_path") or "").lower().startswith(_BACKEND_MODEL_IDS):
        return None
    declared = config.get("tokenizer_class") or model_config.get("tokenizer_class")
    model_type = model_config.get("model_type")
    if declared is None:
        return None  # AutoTokenizer guesses from the model type then
    if model_type == "qwen2" or (model_type == "qwen3" and declared in QWEN2_CLASSES):
        return "qwen2"
    if model_type in BACKEND_DECODER_TYPES and declared in BACKEND_CLASSES:
        return "backend"
    # A declared LlamaTokenizer would rebuild a SentencePiece-style backend, except where AutoTokenizer swaps in
    # TokenizersBackend: on a ByteLevel tokenizer.json (Llama-3 style), and on mistral always (its registered
    # class is TokenizersBackend, or MistralCommonBackend without a tekken.json).
    if model_type in BACKEND_DECODER_TYPES and declared.removesuffix("Fast") == "LlamaTokenizer":
        if model_type == "mistral" or '"ByteLevel"' in (folder / "tokenizer.json").read_text(
            encoding="utf-8"
        ):
            return "backend"
    return None


def _added_tokens_decoder(folder: Path, config: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """The added tokens transformers re-adds at load: tokenizer_config.json's added_tokens_decoder or, where it
    has none, tokenizer.json's added_tokens (`_from_pretrained`'s legacy branch)."""
    declared = config.get("added_tokens_decoder")
    if isinstance(declared, dict) and declared:
        return {int(i): {k: v for k, v in token.items() if k != "__type"} for i, token in declared.items()}
    saved = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8")).get("added_tokens") or []
    return {int(token["id"]): {k: v for k, v in token.items() if k != "id"} for token in saved}


def _adds_no_token(tokenizer: Tokenizer, folder: Path, config: dict[str, Any]) -> bool:
    """Whether every token transformers would add at load (tokenizer_config.json's added_tokens_decoder, the
    named special tokens) is already an added token of tokenizer.json, so that adding it changes nothing."""
    current = tokenizer.get_added_tokens_decoder()
    added = {token.content: token_id for token_id, token in current.items()}
    decoder = config.get("added_tokens_decoder") or {}
    if not isinstance(decoder, dict):
        return False
    contents = _declared_special_contents(_special_declarations(folder, config))
    if contents is None:
        return False
    for token_id, token in decoder.items():
        content = token_content(token) if isinstance(token, dict) else None
        if content is None or added.get(content) != int(token_id):
            return False
        # Re-adding a token replaces its flags (lstrip, normalized, ...): they must be tokenizer.json's already,
        # after transformers marks the named special tokens special.
        wanted = AddedToken(**{k: v for k, v in token.items() if k != "__type"})
        if wanted.content in contents:
            wanted.special = True
        if _flags(wanted) != _flags(current[int(token_id)]):
            return False
    return all(content in added for content in contents)


def _flags(token: AddedToken) -> tuple[object, ...]:
    return (token.content, token.single_word, token.lstrip, token.rstrip, token.normalized, token.special)


def _special_declarations(folder: Path, config: dict[str, Any]) -> dict[str, Any]:
    """tokenizer_config.json with special_tokens_map.json under it, as transformers reads them: the map only
    where the config has no added_tokens_decoder (`_from_pretrained`)."""
    return (
        config
        if config.get("added_tokens_decoder")
        else {**read_json(folder / "special_tokens_map.json"), **config}
    )


def _special_map_agrees(folder: Path, config: dict[str, Any]) -> bool:
    """special_tokens_map.json, which transformers ignores beside an added_tokens_decoder but SpecialTokens
    reads, names the same tokens as tokenizer_config.json."""
    if not config.get("added_tokens_decoder"):
        return True
    token_map = read_json(folder / "special_tokens_map.json")
    return all(_as_contents(config.get(key)) == _as_contents(value) for key, value in token_map.items())


def _qwen2_backend(folder: Path, config: dict[str, Any]) -> Tokenizer | None:
    """Qwen2Tokenizer's backend as its __init__ and TokenizersBackend.__init__ build it from tokenizer.json."""
    data = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    model = data.get("model") or {}
    # transformers takes the vocabulary of any model type but Unigram (a list) and builds a BPE from it, with
    # the merges where there are some (a WordPiece vocabulary becomes a BPE without merges).
    if model.get("type") in (None, "Unigram") or not isinstance(model.get("vocab"), dict):
        return None
    merges = [cast("tuple[str, str]", tuple(m.split(" ") if isinstance(m, str) else m)) for m in model.get("merges") or []]
    tokenizer = Tokenizer(
        BPE(
            vocab=model["vocab"],
            merges=merges,
            dropout=None,
            unk_token=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    add_prefix_space = config.get("add_prefix_space")
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=bool(add_prefix_space), use_regex=False),
        ]
    )
    # transformers keeps tokenizer.json's post-processor (read from a copy without vocabulary).
    processor = data.get("post_processor")
    if processor is not None:
        empty = {k: None for k in ("truncation", "padding", "normalizer", "pre_tokenizer", "decoder")}
        only_processor = {"version": "1.0", **empty, "added_tokens": [], "post_processor": processor}
        only_processor["model"] = {"type": "BPE", "vocab": {}, "merges": []}
        tokenizer.post_processor = Tokenizer.from_str(json.dumps(only_processor)).post_processor
    return tokenizer


def _qwen2_special_tokens(
    config: dict[str, Any], decoder: dict[int, dict[str, Any]]
) -> dict[str, Any] | None:
    """The named special tokens Qwen2Tokenizer holds: the config's (as AddedToken dicts where added_tokens_decoder
    names the same content), else the class defaults; None where one is not a plain token."""
    by_content = {token.get("content"): token for token in decoder.values()}
    values: dict[str, Any] = {}
    for name in SPECIAL_NAMES:
        key = f"{name}_token"
        value = config[key] if key in config else QWEN2_DEFAULTS.get(key)
        if value is None:
            continue
        content = token_content(value)
        if content is None:
            return None
        if isinstance(value, dict):
            value = {k: v for k, v in value.items() if k != "__type"}
        values[key] = by_content.get(content, value)
    return values


def _qwen2_extra_tokens(config: dict[str, Any]) -> list[str] | None:
    """The extra special tokens (additional_special_tokens in older configs), or None where not plain strings."""
    extra = config.get("extra_special_tokens")
    if not extra and "additional_special_tokens" in config:
        extra = config["additional_special_tokens"]
    extra = extra or []
    if not isinstance(extra, list) or not all(isinstance(token, str) for token in extra):
        return (
            None  # a dict names model-specific tokens; AddedToken dicts would need transformers' conversion
        )
    return extra


def _to_added_token(value: Any) -> AddedToken:
    return AddedToken(**value) if isinstance(value, dict) else AddedToken(value, special=True)


def _qwen2_add_tokens(
    tokenizer: Tokenizer, decoder: dict[int, dict[str, Any]], specials: dict[str, Any], extra: list[str]
) -> None:
    """The two rounds of add_tokens transformers runs at load (TokenizersBackend.__init__, then Qwen2Tokenizer)."""
    tokens = [AddedToken(**token) for _, token in sorted(decoder.items())]
    encoder = [t.content for t in tokens]
    for value in [*specials.values(), *extra]:
        content = str(token_content(value))
        if content not in encoder:
            tokens.append(_to_added_token(value))
            encoder.append(content)
    named = {token_content(v) for v in specials.values()}
    for token in tokens:
        if not token.special and token.content in named:
            token.special = True
    if tokens:
        tokenizer.add_tokens(tokens)
    all_special: list[str] = []  # PreTrainedTokenizerBase.all_special_tokens: named, then extra, each once
    for value in [*specials.values(), *extra]:
        content = str(token_content(value))
        if content not in all_special:
            all_special.append(content)
    tokenizer.add_tokens([AddedToken(content, special=True) for content in all_special])


def _load_qwen2(folder: Path, config: dict[str, Any]) -> tuple[Tokenizer, dict[str, Any]] | None:
    """Qwen2Tokenizer's backend mirrored and its special tokens, or None where its result would not match
    the declared token ids."""
    extra = _qwen2_extra_tokens(config)
    standard = {
        k: v for k, v in config.items() if k not in ("additional_special_tokens", "extra_special_tokens")
    }
    if extra is None or _declared_special_contents(standard) is None:
        return None
    if not config.get("added_tokens_decoder") and (folder / "special_tokens_map.json").exists():
        return None  # transformers merges that file's tokens in as AddedTokens then
    decoder = _added_tokens_decoder(folder, config)
    specials = _qwen2_special_tokens(config, decoder)
    tokenizer = _qwen2_backend(folder, config)
    if tokenizer is None or specials is None:
        return None
    _qwen2_add_tokens(tokenizer, decoder, specials, extra)
    # Checkpoints whose added tokens do not land on their declared ids (gaps, clashes) keep transformers.
    if any(
        tokenizer.token_to_id(str(token.get("content"))) != token_id for token_id, token in decoder.items()
    ):
        return None
    return tokenizer, {**specials, "extra_special_tokens": extra}


def load_decoder_tokenizer_json(folder: str | Path) -> tuple[Tokenizer, SpecialTokens] | None:
    """A decoder's packing tokenizer and special tokens as transformers 5's AutoTokenizer builds them, from
    tokenizer.json alone; None where transformers would build it in a way not mirrored here."""
    folder = Path(folder)
    if not (folder / "tokenizer.json").is_file():
        return None
    config = read_json(folder / "tokenizer_config.json")
    route = tokenizer_route(folder, read_json(folder / "config.json"), config)
    if route is None or not _special_map_agrees(folder, config):
        return None
    declared: dict[str, Any] | None = None  # the backend route reads the special tokens from the files
    if route == "backend":
        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        if not _adds_no_token(tokenizer, folder, config):
            return None
        # transformers 5 drops add_bos_token/add_eos_token when a tokenizer.json exists (`_from_pretrained`), so
        # a missing post-processor becomes update_post_processor's template without BOS or EOS ("$A:0" /
        # "$A:0 $B:1"): the same ids and type ids as none, so nothing is set here.
    else:
        try:
            qwen2 = _load_qwen2(folder, config)
        except (TypeError, ValueError, KeyError, AttributeError):
            return None  # an added_tokens_decoder or vocabulary of a shape not mirrored: transformers decides
        if qwen2 is None:
            return None
        tokenizer, declared = qwen2
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer, SpecialTokens(folder, tokenizer, declared)
