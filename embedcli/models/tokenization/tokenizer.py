"""A model's fast tokenizer read straight from tokenizer.json, and its special tokens, without transformers.

transformers' tokenizer classes are needed only for checkpoints without a tokenizer.json, for tokenizers that
transformers rebuilds at load into other ids (decoders not mirrored in `decoder_tokenizer`, XLM-R's SentencePiece:
`rebuilt_at_load`), and as a lazy fallback for attributes this light view does not have.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tokenizers import Tokenizer

SPECIAL_NAMES = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")


def read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    with path.open(encoding="utf-8") as f:
        data = json.load(f)
    return data if isinstance(data, dict) else {}


def token_content(token: object) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    if isinstance(token, str):
        return token
    if isinstance(token, dict) and isinstance(token.get("content"), str):
        return token["content"]
    return None


def _bert_normalizer(tokenizer: Tokenizer, config: dict[str, Any]) -> None:
    """Align a BertNormalizer with tokenizer_config.json, as transformers' BERT tokenizer does at load."""
    from tokenizers.normalizers import BertNormalizer

    # The normalizer's own getters, not a parse of the whole tokenizer.json (~20 ms of every model load).
    current = tokenizer.normalizer
    if not isinstance(current, BertNormalizer):
        return
    normalizer = {k: getattr(current, k) for k in ("lowercase", "strip_accents", "handle_chinese_chars", "clean_text")}
    wanted = {
        "lowercase": config.get("do_lower_case", normalizer.get("lowercase")),
        "strip_accents": config.get("strip_accents", normalizer.get("strip_accents")),
        "handle_chinese_chars": config.get("tokenize_chinese_chars", normalizer.get("handle_chinese_chars")),
    }
    if all(normalizer.get(k) == v for k, v in wanted.items()):
        return
    tokenizer.normalizer = BertNormalizer(
        clean_text=bool(normalizer.get("clean_text", True)),
        handle_chinese_chars=bool(wanted["handle_chinese_chars"]),
        strip_accents=wanted["strip_accents"],
        lowercase=bool(wanted["lowercase"]),
    )


def lowercase_inside(tokenizer: Tokenizer) -> None:
    """Lowercase texts inside `tokenizer`, as sentence-transformers applies `do_lower_case`: a Lowercase normalizer
    first, unless one is there already.

    A normalizer runs after added and special tokens are split off, so a text's `[SEP]` stays the special token
    (lowering the text in Python first would make it `[sep]`, plain word pieces), and a prompt is lowercased too.
    """
    from tokenizers.normalizers import Lowercase
    from tokenizers.normalizers import Sequence as NormalizerSequence

    current = tokenizer.normalizer
    steps: list[Any] = [current] if current is not None else []
    if isinstance(current, NormalizerSequence):
        steps = list(current)  # type: ignore[call-overload]  # tokenizers' stubs omit a Sequence's len and indexing
    if any(isinstance(step, Lowercase) for step in steps):
        return
    tokenizer.normalizer = NormalizerSequence([Lowercase(), *steps])


class SpecialTokens:
    """The special tokens of a tokenizer.json + tokenizer_config.json pair, as transformers names them.

    Gives `cls_token_id`, `sep_token_id`, ... and `all_special_ids`; calling it encodes one text like a
    transformers tokenizer (`.input_ids`). Anything else falls back to transformers' tokenizer, loaded
    on first use.
    """

    def __init__(self, folder: Path, tokenizer: Tokenizer, declared: dict[str, Any] | None = None) -> None:
        self._folder = folder
        self._tokenizer = tokenizer
        self._copy: Tokenizer | None = None  # made on the first call: most runs never encode this way (~50 ms)
        self._hf: Any = None
        # `declared`: the special tokens a tokenizer class resolved (its defaults included), instead of the files'.
        files = {**read_json(folder / "special_tokens_map.json"), **read_json(folder / "tokenizer_config.json")}
        config = files if declared is None else declared
        ids: list[int] = []
        for name in SPECIAL_NAMES:
            content = token_content(config.get(f"{name}_token"))
            token_id = tokenizer.token_to_id(content) if content is not None else None
            setattr(self, f"{name}_token", content if token_id is not None else None)
            setattr(self, f"{name}_token_id", token_id)
            if token_id is not None and token_id not in ids:
                ids.append(token_id)
        extra = config.get("additional_special_tokens") or config.get("extra_special_tokens") or []
        for token in extra if isinstance(extra, list) else []:
            content = token_content(token)
            token_id = tokenizer.token_to_id(content) if content is not None else None
            if token_id is not None and token_id not in ids:
                ids.append(token_id)
        self.all_special_ids = ids

    def __call__(self, text: str, pair: str | None = None) -> SimpleNamespace:
        """`text` (and `pair`) encoded with special tokens, untruncated: `.input_ids`, `.token_type_ids`."""
        if self._copy is None:  # a copy as loaded: the packing tokenizer's truncation changes per call
            self._copy = Tokenizer.from_str(self._tokenizer.to_str())
            self._copy.no_truncation()
            self._copy.no_padding()
        enc = self._copy.encode(text, pair)
        return SimpleNamespace(input_ids=enc.ids, token_type_ids=enc.type_ids, attention_mask=enc.attention_mask)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if self._hf is None:
            from transformers import AutoTokenizer

            self._hf = AutoTokenizer.from_pretrained(str(self._folder), local_files_only=True, trust_remote_code=False)
        return getattr(self._hf, name)


# SentencePiece classes transformers 5 rebuilds at load from tokenizer.json's vocabulary: the Precompiled normalizer
# alone (its Replace(" {2,}") dropped), WhitespaceSplit before Metaspace, its own special tokens. Their ids differ
# from the file read as it is (a text ending in a zero-width space or a BOM, \x85 inside a word, a literal <mask>),
# and sentence-transformers and vLLM tokenize with transformers' class.
REBUILT_ENCODER_CLASSES = frozenset({
    "XLMRobertaTokenizer", "XLMRobertaTokenizerFast", "CamembertTokenizer", "CamembertTokenizerFast",
})
_REBUILT_MODEL_TYPES = {"xlm-roberta": "XLMRobertaTokenizer", "camembert": "CamembertTokenizer"}


def rebuilt_at_load(folder: str | Path) -> bool:
    """Whether transformers' AutoTokenizer rebuilds this encoder's tokenizer.json into other ids
    (`REBUILT_ENCODER_CLASSES`, declared or, with none declared, its model type's class)."""
    folder = Path(folder)
    config = read_json(folder / "tokenizer_config.json")
    model_config = read_json(folder / "config.json")
    declared = config.get("tokenizer_class") or model_config.get("tokenizer_class")
    if declared is None:
        declared = _REBUILT_MODEL_TYPES.get(str(model_config.get("model_type")))
    return declared in REBUILT_ENCODER_CLASSES


def load_tokenizer_json(folder: str | Path) -> tuple[Tokenizer, SpecialTokens]:
    """The packing tokenizer (no padding, no truncation) from `folder/tokenizer.json`, and its special tokens."""
    folder = Path(folder)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    _bert_normalizer(tokenizer, read_json(folder / "tokenizer_config.json"))
    # The runner packs without padding and truncates per call.
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer, SpecialTokens(folder, tokenizer)

