"""The plain-ASCII shortcut gives the ids (and cut) the tokenizer gives with its own normalizer, text by text."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, normalizers, pre_tokenizers

from embedcli.models.checkpoint.resolve import resolve_model_path
from embedcli.models.tokenization.plain_ascii import PlainAscii

WORDPIECE = Path(resolve_model_path(None)) / "tokenizer.json"  # all-MiniLM-L6-v2: BertNormalizer, lowercase

TEXTS = [
    "", " ", "Hello World", "THE CAT sat on the mat.", "tabs\tand\nline\r\nbreaks", "a\x0bb\x0cc",  # VT, FF: removed
    "nul\x00in", "del\x7fhere", "[MASK] and [mask] and [Mask]", "[CLS] x [SEP]", "##ing un##known", "don't 3.14 $5",
    "café naïve", "北京 city", "emoji 🙂 here", "\ufffdreplacement", "zero\u200bwidth", "x" * 300,
    "Antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis " * 40,  # past the cut
]


@cache
def loaded(which: str) -> Tokenizer:
    """One tokenizer per role, loaded once (`which` names the role)."""
    return Tokenizer.from_file(str(WORDPIECE))


def reference(texts: list[str], limit: int | None) -> list[tuple[list[int], bool]]:
    """Ids and whether each text was cut, from a tokenizer left as its file says."""
    tk = loaded("reference")
    tk.no_padding()
    tk.enable_truncation(limit) if limit else tk.no_truncation()
    return [(e.ids, bool(e.overflowing)) for e in tk.encode_batch_fast(texts, add_special_tokens=False)]


def shortcut(texts: list[str], limit: int | None, tk: Tokenizer | None = None) -> list[tuple[list[int], bool]]:
    """The same through `PlainAscii`."""
    tk = tk or loaded("shortcut")
    tk.no_padding()
    tk.enable_truncation(limit) if limit else tk.no_truncation()
    return [(e.ids, bool(e.overflowing)) for e in PlainAscii(tk).encode(texts, add_special_tokens=False)]


@pytest.mark.parametrize("limit", [None, 16, 512])
def test_same_ids_as_the_normalizer(limit: int | None) -> None:
    assert shortcut(TEXTS, limit) == reference(TEXTS, limit)


def test_which_texts_take_the_shortcut() -> None:
    plain = PlainAscii(Tokenizer.from_file(str(WORDPIECE)))
    assert plain.plain("Hello\tWorld") == "hello\tworld"
    for text in ("café", "a\x0bb", "nul\x00", "del\x7f", "a [Mask] b"):
        assert plain.plain(text) is None, text


def test_the_normalizer_is_kept_after_a_batch() -> None:
    tk = Tokenizer.from_file(str(WORDPIECE))
    shortcut(TEXTS, 512, tk)
    assert type(tk.normalizer) is normalizers.BertNormalizer
    assert tk.encode("HELLO", add_special_tokens=False).ids == tk.encode("hello", add_special_tokens=False).ids


def test_another_normalizer_goes_the_ordinary_way() -> None:
    tk = Tokenizer.from_file(str(WORDPIECE))
    tk.normalizer = normalizers.Sequence([normalizers.NFC()])  # keeps case: the shortcut must not lower
    plain = PlainAscii(tk)
    assert not plain.active
    ids = [e.ids for e in plain.encode(["Hello World"], add_special_tokens=False)]
    assert ids == [e.ids for e in tk.encode_batch_fast(["Hello World"], add_special_tokens=False)]


@pytest.mark.parametrize(
    "pre", [pre_tokenizers.Metaspace(), pre_tokenizers.ByteLevel(), pre_tokenizers.Split(" ", "removed")]
)
def test_a_pre_tokenizer_that_keeps_tabs_in_words_goes_the_ordinary_way(
    pre: pre_tokenizers.PreTokenizer,
) -> None:
    """BertNormalizer makes a tab or a line break a space; only a whitespace-splitting pre-tokenizer drops both."""
    texts = ["the\tcat", "a\nb", "hello\r\nworld", "plain words"]
    tk = Tokenizer.from_file(str(WORDPIECE))
    tk.pre_tokenizer = pre
    want = [e.ids for e in tk.encode_batch_fast(texts, add_special_tokens=False)]
    assert [e.ids for e in PlainAscii(tk).encode(texts, add_special_tokens=False)] == want


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(alphabet=st.sampled_from(list("aZ [MASK]#'.,-\t\n\r\x0b\x00\x7fé北🙂0")), max_size=40),
                min_size=1, max_size=8))
def test_same_ids_on_any_mix(texts: list[str]) -> None:
    assert shortcut(texts, 12) == reference(texts, 12)
