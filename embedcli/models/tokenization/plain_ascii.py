"""Plain ASCII texts tokenized without the tokenizer's BertNormalizer: the same ids, a third less time.

On a text of printable ASCII, tabs and line breaks, BERT's normalizer only lowercases (`lowercase`) and turns
tabs and line breaks into spaces, which the pre-tokenizer drops as it drops spaces: no accents to strip, no
Chinese characters to pad, no control characters to remove. So `str.lower()` in Python, then the tokenizer with
no normalizer, gives the same ids; the normalizer's per-character alignment bookkeeping was ~30% of a static
model's tokenizing (2,000 news texts, WordPiece). Other texts, and texts that spell one of the tokenizer's added
tokens in any case (`[MASK]` is matched on the raw text, so lowering would hide it) or with a tab or line break
for a space, go the ordinary way.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

_NOT_PLAIN = re.compile(r"[^\t\n\r\x20-\x7e]")
_AS_SPACE = str.maketrans("\t\n\r", "   ")  # what BertNormalizer's clean_text makes of them


class PlainAscii:
    """Encodes a batch with the plain-ASCII shortcut where the tokenizer's normalizer allows it."""

    def __init__(self, tokenizer: Any) -> None:
        from tokenizers import normalizers, pre_tokenizers

        self.tokenizer = tokenizer
        normalizer = tokenizer.normalizer
        # The normalizer's tabs and line breaks become spaces: the same ids only where the pre-tokenizer splits on
        # all of them alike (a Metaspace or ByteLevel one keeps a tab a character of the word).
        splits_on_whitespace = type(tokenizer.pre_tokenizer) in (
            pre_tokenizers.BertPreTokenizer,
            pre_tokenizers.Whitespace,
            pre_tokenizers.WhitespaceSplit,
        )
        self.active = type(normalizer) is normalizers.BertNormalizer and splits_on_whitespace
        self.lowercase = bool(self.active and normalizer.lowercase)
        self.added = [token.content.lower() for token in tokenizer.get_added_tokens_decoder().values()]
        self.spaced = [token for token in self.added if " " in token]

    def plain(self, text: str) -> str | None:
        """`text` as the normalizer would leave it for the ids, or None when it must go through the normalizer."""
        if not text.isascii() or _NOT_PLAIN.search(text):
            return None
        low = text.lower()
        if any(token in low for token in self.added):
            return None
        # A normalized added token (model2vec's multi-word vocabulary, "new york") matches the normalized text,
        # where a tab or a line break between its words is a space.
        if (
            self.spaced
            and (normal := low.translate(_AS_SPACE)) != low
            and any(t in normal for t in self.spaced)
        ):
            return None
        return low if self.lowercase else text

    def encode(self, texts: Sequence[str], **kwargs: Any) -> list[Any]:
        """`encode_batch_fast(texts, **kwargs)`'s encodings, in order."""
        tk = self.tokenizer
        if not self.active:
            return list(tk.encode_batch_fast(texts, **kwargs))
        fast, slow, order = [], [], []
        for text in texts:
            p = self.plain(text)
            if p is None:
                order.append(False)
                slow.append(text)
            else:
                order.append(True)
                fast.append(p)
        done_slow = iter(tk.encode_batch_fast(slow, **kwargs) if slow else ())
        normalizer = tk.normalizer
        tk.normalizer = None
        try:
            done_fast = iter(tk.encode_batch_fast(fast, **kwargs) if fast else ())
        finally:
            tk.normalizer = normalizer
        return [next(done_fast) if f else next(done_slow) for f in order]
