"""Query and document token ids of a late-interaction (ColBERT) model, as colbert-ai and PyLate build them.

The marker token goes right after the first token (`[CLS] [unused0] text [SEP]`; a marker that is no single
token is text before the text, as a sentence-transformers prompt), the text cut so the whole
sequence fits the role's length. A query with expansion is then padded to exactly the query length with the
mask token: every vector is kept, and the padding is a key of the attention only when the model says so.
A document keeps every vector but those of its skiplist tokens (punctuation). sentence-transformers'
`MultiVectorEncoder` gets the same ids by prepending the marker as a special token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from embedcli.errors import ConfigRefusedError, LongInputError
from embedcli.models.checkpoint.late_interaction import LateInteraction


@dataclass
class RoleSequence:
    """One text's sequence: its ids and token types, which tokens are attention keys, and whose vectors are kept."""

    ids: np.ndarray
    type_ids: np.ndarray
    keys: np.ndarray  # bool
    keep: np.ndarray  # bool
    truncated: bool


def _marker_id(tokenizer: Any, marker: str) -> int | None:
    """The id of a marker that is one vocabulary (or added) token, with or without its trailing space."""
    for token in dict.fromkeys((marker, marker.strip())):
        token_id = tokenizer.token_to_id(token) if token else None
        if token_id is not None:
            return int(token_id)
    return None


class RoleTokenizer:
    """Token ids of queries and documents under a model's `LateInteraction` settings."""

    def __init__(self, tokenizer: Any, late: LateInteraction, mask_id: int | None, where: str) -> None:
        self.tokenizer = tokenizer
        self.late = late
        # A marker that is one token is inserted by id (colbert-ai, PyLate); any other is text before the text,
        # as sentence-transformers prepends a prompt.
        self.markers = {"query": _marker_id(tokenizer, late.query_marker), "document": _marker_id(tokenizer, late.document_marker)}
        self.prefixes = {
            role: "" if self.markers[role] is not None else marker
            for role, marker in (("query", late.query_marker), ("document", late.document_marker))
        }
        if late.query_expansion and mask_id is None:
            raise ConfigRefusedError(f"{where}: query expansion needs a mask token, and the tokenizer has none")
        self.mask_id = mask_id
        # As sentence-transformers: skiplist words that are not one vocabulary token are left out.
        ids = (tokenizer.token_to_id(w) for w in late.skiplist)
        self.skip_ids = np.asarray(sorted({int(i) for i in ids if i is not None}), dtype=np.int64)

    def encode(
        self, texts: Sequence[str], role: str, *, truncate: bool, side: str = "right", first_row: int = 0,
        locate: Any = None,
    ) -> list[RoleSequence]:
        """The sequences of `texts` in `role`; without `truncate`, a text over the role's length is an error."""
        tok = self.tokenizer
        marker = self.markers[role]
        limit = self.late.length(role)
        room = limit - (marker is not None)
        if truncate:
            tok.enable_truncation(room, strategy="longest_first", direction=side)
        else:
            tok.no_truncation()
        out: list[RoleSequence] = []
        prefix = self.prefixes[role]
        for row, enc in enumerate(tok.encode_batch([prefix + t for t in texts])):
            ids = np.asarray(enc.ids, dtype=np.int64)
            types = np.asarray(enc.type_ids, dtype=np.int64)
            if marker is not None:
                at = min(1, len(ids))
                ids, types = np.insert(ids, at, marker), np.insert(types, at, 0)
            if not truncate and len(ids) > limit:
                raise LongInputError(first_row + row, len(ids), limit, locate(row) if locate else None)
            keys = np.ones(len(ids), dtype=bool)
            if role == "query":
                keep = np.ones(len(ids), dtype=bool)
                if self.late.query_expansion and len(ids) < limit:
                    pad = limit - len(ids)
                    ids = np.concatenate([ids, np.full(pad, self.mask_id, dtype=np.int64)])
                    types = np.concatenate([types, np.zeros(pad, dtype=np.int64)])
                    keys = np.concatenate([keys, np.full(pad, self.late.attend_expansion)])
                    keep = np.ones(len(ids), dtype=bool)
            else:
                keep = ~np.isin(ids, self.skip_ids)
            out.append(RoleSequence(ids, types, keys, keep, bool(enc.overflowing)))
        return out
