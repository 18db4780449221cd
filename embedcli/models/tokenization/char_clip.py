"""Cutting over-long texts by characters before tokenizing, when truncating: same tokens, bounded cost.

Tokenizing a 50 MB text to keep its first 256 tokens costs gigabytes and minutes. Under truncation only
a prefix (or, truncating left, a suffix) of a text matters, so a text is first cut to `bound`
characters (well above max length x the longest token). The cut never changes the kept tokens: a cut
text is accepted only when it still overflows the max length and a pre-token boundary (whitespace)
lies between the last kept token and the cut; otherwise that row is tokenized whole, as before.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

# Only the four whitespace characters every normalizer keeps as (or turns into) a word break: Python's `\s` also
# matches \x0b, \x0c, \x1c-\x1f and \x85, which BERT's clean_text and SentencePiece's nmt_nfkc delete, joining
# the words either side (a cut there would change the word the last kept token belongs to).
_BOUNDARY_AFTER = re.compile(r"[ \t\n\r]+\S")
_BOUNDARY_BEFORE = re.compile(r"\S[ \t\n\r]+")
_MIN_TOKEN_CHARS = 16  # an [UNK] or a normalized token can stand for more text than its vocab string


def clip_bound(tokenizer: Any, max_length: int) -> int:
    """Characters kept of an over-long text: twice max length x the longest vocab token (at least 16)."""
    longest = max((len(t) for t in tokenizer.get_vocab()), default=0)
    return max(least_bound(max_length), 2 * max_length * longest + 1024)


def least_bound(max_length: int) -> int:
    """The smallest `clip_bound` of any tokenizer at `max_length`: no shorter text is ever cut."""
    return 2 * max_length * _MIN_TOKEN_CHARS + 1024


class ClipBound:
    """`clip_bound` of one tokenizer, read from its vocab only once a text is long enough to need it."""

    def __init__(self, tokenizer: Any, max_length: int) -> None:
        self._tokenizer = tokenizer
        self._max_length = max_length
        self._least = least_bound(max_length)
        self._value: int | None = None

    def needed(self, texts: Sequence[Any]) -> bool:
        """Whether any single text of `texts` is longer than the least bound (else none can be cut)."""
        # Building the vocab dict costs ~25 ms on a 30k-token vocab: a short-text run (a one-row start) skips it.
        least = self._least
        return any(isinstance(t, str) and len(t) > least for t in texts)

    @property
    def value(self) -> int:
        """The bound itself (`clip_bound`), computed once."""
        if self._value is None:
            self._value = clip_bound(self._tokenizer, self._max_length)
        return self._value


def clip_texts(texts: list[Any], bound: int, side: str) -> tuple[list[Any], list[int]]:
    """Single texts longer than `bound` cut to `bound` characters on the kept side; returns (texts, cut rows).

    Text pairs are left whole: longest-first truncation of a pair depends on both full lengths.
    """
    out = list(texts)
    cut: list[int] = []
    for i, t in enumerate(texts):
        if isinstance(t, str) and len(t) > bound:
            out[i] = t[:bound] if side == "right" else t[-bound:]
            cut.append(i)
    return out, cut


def unsafe_cuts(texts: Sequence[Any], encodings: Sequence[Any], cut: list[int], side: str) -> list[int]:
    """The cut rows whose kept tokens the cut may have changed (to be tokenized whole instead)."""
    redo = []
    for i in cut:
        enc, text = encodings[i], texts[i]
        spans = [o for o, special in zip(enc.offsets, enc.special_tokens_mask, strict=True) if not special]
        if not enc.overflowing or not spans:
            redo.append(i)  # the cut text fits: the whole one has more tokens to keep
        elif side == "right" and not _BOUNDARY_AFTER.search(text, max(e for _, e in spans)):
            redo.append(i)  # the last kept token's word may run into the cut
        elif side != "right" and not _BOUNDARY_BEFORE.search(text, 0, min(s for s, _ in spans)):
            redo.append(i)
    return redo
