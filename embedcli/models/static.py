"""A static embedding model loaded for embedding: its token table and tokenizer (numpy, no torch).

What each layout computes is said in `embedcli.models.checkpoint.static_layout`; this module does it:
`token_ids` tokenizes under the layout's rules, `mean_rows` is the embedding-bag mean, `normalize` the layout's
L2 normalization.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from embedcli.errors import ModelConfigError
from embedcli.models.checkpoint.content_hash import remembered
from embedcli.models.checkpoint.static_layout import M2V_MAPPING, M2V_TABLE, M2V_WEIGHTS, MODEL2VEC, ST_TABLE
from embedcli.models.spec import ModelSpec
from embedcli.models.tokenization.plain_ascii import PlainAscii

_GATHER_VALUES = 1 << 18  # table values gathered at once by `mean_rows` (1 MiB of float32)


@dataclass
class TokenBatch:
    """Token ids of a batch of texts, laid end to end: row i is `ids[starts[i] : starts[i] + lengths[i]]`."""

    ids: np.ndarray  # int64 [total]
    lengths: np.ndarray  # int64 [rows]
    truncated: int  # rows cut to the token limit


def fold_table(tensors: dict[str, np.ndarray], where: Path) -> np.ndarray:
    """One row per token id: `embeddings[mapping[t]] * weights[t]` (what model2vec averages over and
    sentence-transformers' StaticEmbedding.load folds), in the dtype model2vec computes in (a float16 table stays
    float16 unless weights promote it), or sentence-transformers' `embedding.weight` as float32."""
    if ST_TABLE in tensors:
        return np.ascontiguousarray(tensors[ST_TABLE], dtype=np.float32)
    if M2V_TABLE not in tensors:
        raise ModelConfigError(f"{where}: no {ST_TABLE} or {M2V_TABLE} tensor; is this a static embedding table?")
    table = tensors[M2V_TABLE]
    if table.dtype not in (np.float16, np.float32, np.float64):
        raise ModelConfigError(f"{where}: {table.dtype} embeddings (model2vec quantize_to) are not supported; "
                               "use a float32 or float16 export of the model")
    if M2V_MAPPING in tensors:
        table = table[np.asarray(tensors[M2V_MAPPING], dtype=np.int64)]
    if M2V_WEIGHTS in tensors:
        table = table * tensors[M2V_WEIGHTS][:, None]  # numpy's promotion, as model2vec multiplies
    return np.ascontiguousarray(table)


def _unk_id(tokenizer: Any) -> int | None:
    """The unknown token's id as model2vec finds it (`_get_unk_token_id`): WordPiece/BPE/WordLevel name it,
    Unigram numbers it."""
    model = tokenizer.model
    if hasattr(model, "unk_token"):
        token = model.unk_token
        return None if token is None else tokenizer.token_to_id(token)
    unk = json.loads(tokenizer.to_str())["model"].get("unk_id")
    return None if unk is None else int(unk)


class StaticModel:
    """A static model's table and tokenizer, with the token rules of its layout."""

    def __init__(self, spec: ModelSpec) -> None:
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        self.spec = spec
        folder = Path(spec.path) / (spec.static_folder or ".")
        table_path = folder / "model.safetensors"
        try:
            tensors = load_file(str(table_path))
            self.table = fold_table(tensors, table_path)
            self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        except (OSError, ValueError, RuntimeError) as e:  # safetensors and tokenizers raise these on a bad file
            raise ModelConfigError(f"{folder}: the static model could not be loaded ({e}); fetch it again") from e
        vocab = self.tokenizer.get_vocab_size(with_added_tokens=True)
        if self.table.shape[0] < vocab:
            raise ModelConfigError(f"{table_path}: {self.table.shape[0]} rows for a tokenizer of {vocab} tokens")
        self.tokenizer.no_padding()
        self.model2vec = spec.static_layout == MODEL2VEC
        # model2vec's output array has the stored table's dtype (float16 exports average into float16).
        self.out_dtype = np.dtype(tensors[M2V_TABLE].dtype) if self.model2vec else np.dtype(np.float32)
        self.unk_id = _unk_id(self.tokenizer) if self.model2vec else None
        # model2vec first cuts a text to max_length x the median token length in characters (a median: the
        # vocabulary's order, which model2vec sorts by id first, does not change it).
        # Remembered per tokenizer.json state: `get_vocab` builds a dict of every token (~40 ms of each start).
        self.median_token_length = (
            remembered("static-median-token", folder, ["tokenizer.json"], lambda _: self._median_token_length(), int)
            if self.model2vec else 0
        )
        self._file_truncation = self.tokenizer.truncation
        self._encoder = PlainAscii(self.tokenizer)

    def _median_token_length(self) -> int:
        return int(np.median(np.fromiter(map(len, self.tokenizer.get_vocab()), dtype=np.int64)))

    @property
    def dim(self) -> int:
        """Width of the table's rows."""
        return int(self.table.shape[1])

    def _set_truncation(self, max_tokens: int | None) -> None:
        if max_tokens is None:
            self.tokenizer.no_truncation()
            return
        saved = self._file_truncation or {}
        if saved.get("max_length") == max_tokens and not self.model2vec:
            self.tokenizer.enable_truncation(**saved)  # sentence-transformers keeps tokenizer.json's setting whole
        else:
            self.tokenizer.enable_truncation(max_tokens)

    def token_ids(self, texts: Sequence[str], max_tokens: int | None) -> TokenBatch:
        """Token ids of `texts` (no special tokens) cut to `max_tokens` (None: every token) by the layout's rule."""
        truncated = 0
        items = list(texts)
        if self.model2vec and max_tokens is not None:
            limit = max_tokens * self.median_token_length
            truncated = sum(len(t) > limit for t in items)
            items = [t[:limit] for t in items]
        self._set_truncation(max_tokens)
        encodings = self._encoder.encode(items, add_special_tokens=False)
        rows = [enc.ids for enc in encodings]
        if max_tokens is not None:
            truncated = max(truncated, sum(bool(enc.overflowing) for enc in encodings))
        lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
        flat = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64, count=int(lengths.sum()))
        if self.unk_id is not None:  # model2vec drops the unknown token (after truncation, as it does)
            keep = flat != self.unk_id
            if not keep.all():
                owner = np.repeat(np.arange(len(rows)), lengths)
                lengths = np.bincount(owner[keep], minlength=len(rows)).astype(np.int64)
                flat = flat[keep]
        return TokenBatch(flat, lengths, truncated)

    def mean_rows(self, batch: TokenBatch) -> np.ndarray:
        """The embedding-bag mean of each row's table rows `[rows, dim]` (`out_dtype`); a row of no tokens is zero."""
        out = np.zeros((len(batch.lengths), self.dim), dtype=self.out_dtype)
        full = np.flatnonzero(batch.lengths)
        if not len(full):
            return out
        starts = np.concatenate([[0], np.cumsum(batch.lengths)[:-1]])
        # Table rows are gathered a block of about _GATHER_VALUES at a time: a whole batch's gather (~300 MB for 2,000
        # mixed news texts) is fresh memory, page-faulted in on each batch (0.1-0.2 s of a short run); a block stays
        # in the cache and its memory is reused. Each row's arithmetic is the same either way.
        if self.model2vec:
            # model2vec's own arithmetic (rows of one length stacked, `embedding[ids].mean(axis=1)` in float32), so
            # long unnormalized rows agree to the bit rather than to ~1e-5.
            for length in sorted(set(batch.lengths[full].tolist())):  # not np.unique: it imports numpy.ma (~8 ms)
                rows = np.flatnonzero(batch.lengths == length)
                step = max(1, _GATHER_VALUES // (length * self.dim))
                for i in range(0, len(rows), step):
                    block = rows[i : i + step]
                    out[block] = self.table[batch.ids[starts[block, None] + np.arange(length)]].mean(axis=1)
            return out
        # torch's EmbeddingBag sums in float32 in its own order; the float64 sum is the exact mean.
        ends = np.cumsum(batch.lengths[full])
        budget = max(1, _GATHER_VALUES // self.dim)
        i = 0
        while i < len(full):
            j = max(i + 1, int(np.searchsorted(ends, (ends[i - 1] if i else 0) + budget, side="right")))
            block = full[i:j]
            first, last = int(starts[block[0]]), int(starts[block[-1]] + batch.lengths[block[-1]])
            sums = np.add.reduceat(self.table[batch.ids[first:last]], starts[block] - first, axis=0, dtype=np.float64)
            out[block] = sums / batch.lengths[block, None]
            i = j
        return out

    def normalize(self, vectors: np.ndarray) -> np.ndarray:
        """L2-normalized rows as the layout's library divides: model2vec by `norm + 1e-32` in float32 (back to
        its output dtype), sentence-transformers' Normalize by `max(norm, 1e-12)`; a zero row stays zero."""
        v32 = vectors.astype(np.float32)
        norms = np.linalg.norm(v32, axis=1, keepdims=True)
        norms = norms + 1e-32 if self.model2vec else np.maximum(norms, 1e-12)
        return (v32 / norms).astype(vectors.dtype)
