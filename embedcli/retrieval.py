"""Exact top-k search over stored vectors, streamed in blocks: memory follows the block, not the corpus.

Scores (higher is better), per stored precision, as sentence-transformers' `semantic_search` and its
quantized-search recipe (`semantic_search_usearch` / `_faiss` with `quantize_embeddings`):

- float32 / float16: cosine of the float32 vectors (`util.semantic_search`'s default `cos_sim`);
- int8 / uint8: the dot product of the quantized query and the quantized corpus vectors (the query is
  quantized with the corpus's stored ranges), as an exact inner-product index over int8 codes;
- binary / ubinary: the number of agreeing bits over `dim` bits, i.e. `dim - hamming` (the recipe's Hamming
  distance turned into a similarity).

Rescoring (`rescore_multiplier` M > 0, quantized precisions only): the best `k * M` candidates by the
quantized score are rescored with the float query: `query · dequantized(candidate)` for int8/uint8
(`(code [+128]) * step + min`, the recipe's `_dequantize_embeddings`) and `query · bits(candidate)` (0/1,
padding bits trimmed) for binary/ubinary, then the best `k` of those are kept.

Ties are broken by corpus row (the earlier row first), so results do not depend on the block size.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from embedcli.io.parquet_source import open_parquet
from embedcli.io.writers import embedding_matrix
from embedcli.quantize import quantize

FLOAT_PRECISIONS = ("float32", "float16")
SCALAR_PRECISIONS = ("int8", "uint8")
BINARY_PRECISIONS = ("binary", "ubinary")
DEFAULT_BLOCK_ROWS = 8192


@dataclass(frozen=True)
class SearchSpace:
    """How stored vectors are compared: their precision, float dimension and (int8/uint8) ranges."""

    precision: str = "float32"
    dim: int | None = None  # float dimension; binary vectors hold ceil(dim / 8) bytes
    ranges: np.ndarray | None = None  # [2, dim] min row, max row (int8/uint8)

    def __post_init__(self) -> None:
        if self.precision not in FLOAT_PRECISIONS + SCALAR_PRECISIONS + BINARY_PRECISIONS:
            raise ValueError(f"unknown precision {self.precision!r}")
        if self.precision in SCALAR_PRECISIONS and self.ranges is None:
            raise ValueError(f"{self.precision} vectors need their calibration ranges to be searched")

    @property
    def quantized(self) -> bool:
        """Whether the stored vectors are int8/uint8/binary/ubinary codes."""
        return self.precision not in FLOAT_PRECISIONS

    def encode_queries(self, queries: np.ndarray) -> np.ndarray:
        """Float queries in the stored precision (int8/uint8 with the stored ranges)."""
        q = np.asarray(queries, dtype=np.float32)
        if self.precision in FLOAT_PRECISIONS:
            return q
        return quantize(q, self.precision, self.ranges)

    def scores(self, queries: np.ndarray, block: np.ndarray) -> np.ndarray:
        """`[q, b]` float64 scores of encoded queries against a block of stored vectors."""
        if self.precision in FLOAT_PRECISIONS:
            return unit_scores(_unit(queries), _unit(block))
        if self.precision in SCALAR_PRECISIONS:
            return _int_dot(queries, block)
        bits = self.dim or block.shape[1] * 8
        qb = _bits(queries, bits)
        cb = _bits(block, bits)
        # agreeing bits = bits - hamming, hamming = |q| + |c| - 2 q·c (exact: 0/1 sums below 2^24)
        both = (qb @ cb.T).astype(np.float64)
        return bits - qb.sum(axis=1, dtype=np.float64)[:, None] - cb.sum(axis=1, dtype=np.float64)[None, :] + 2 * both

    def rescore(self, float_queries: np.ndarray, candidates: np.ndarray) -> np.ndarray:
        """`[q, m]` float scores of float queries against their own `[q, m, width]` stored candidates."""
        q = np.asarray(float_queries, dtype=np.float64)
        if self.precision in SCALAR_PRECISIONS:
            r = np.asarray(self.ranges, dtype=np.float32)
            steps = (r[1] - r[0]) / 255
            steps = np.where(steps == 0, 1, steps)
            codes = candidates.astype(np.float64) + (128 if self.precision == "int8" else 0)
            vectors = codes * steps + r[0]
        elif self.precision in BINARY_PRECISIONS:
            vectors = _bits(candidates.reshape(-1, candidates.shape[-1]), q.shape[-1])
            vectors = vectors.reshape(*candidates.shape[:2], -1).astype(np.float64)
        else:
            vectors = candidates.astype(np.float64)
        return np.einsum("ij,ikj->ik", q, vectors).astype(np.float32).astype(np.float64)


def unit_scores(unit_queries: np.ndarray, unit_rows: np.ndarray) -> np.ndarray:
    """`[q, b]` cosines of unit float32 vectors, exactly rounded to float32 (as float64)."""
    # float64 products of float32 values are exact and the float64 sum is far below a float32 ulp, so
    # rounded to the float32 that is written, a row's score does not depend on its block: equal rows tie.
    cos = unit_queries.astype(np.float64) @ unit_rows.astype(np.float64).T
    return cos.astype(np.float32).astype(np.float64)


def float32_margin(dim: int) -> float:
    """A bound on |float32 GEMM cosine - exactly rounded cosine| for unit vectors of `dim` floats.

    Any float32 summation order of a dot product errs by at most gamma_n * sum |q_i x_i| (gamma_n = n u / (1 - n u),
    u = 2^-24), and sum |q_i x_i| <= |q| |x| <= 1 (+ rounding of the unit vectors); the exact score adds half an
    ulp. Twice that and 1e-6 to spare."""
    u = 2.0**-24
    n = max(dim, 1) + 2
    return 2 * (n * u / (1 - n * u)) * 1.001 + 1e-6


def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.maximum(norms, np.float32(1e-12))


def usable_rows(block: np.ndarray, valid: np.ndarray | None = None) -> np.ndarray:
    """Which rows of a block can be scored: present (`valid`, False for a null vector) and finite."""
    ok = np.ones(len(block), dtype=bool) if valid is None else np.asarray(valid, dtype=bool).copy()
    if block.dtype.kind == "f":
        ok &= np.isfinite(block).all(axis=1)
    return ok


def _int_dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    # float32 sums of integer products are exact below 2^24; past that (wide uint8 vectors) use float64.
    peak = 128 * 128 if a.dtype == np.int8 else 255 * 255
    dtype: type[np.floating[Any]] = np.float32 if peak * a.shape[-1] <= 2**24 else np.float64
    return (a.astype(dtype) @ b.astype(dtype).T).astype(np.float64)


def _bits(packed: np.ndarray, bits: int) -> np.ndarray:
    """0/1 float32 bits of packed binary (int8 = byte - 128) or ubinary (uint8) rows, cut to `bits`."""
    raw = packed.view(np.uint8) ^ np.uint8(0x80) if packed.dtype == np.int8 else packed.astype(np.uint8, copy=False)
    return np.unpackbits(raw, axis=-1)[:, :bits].astype(np.float32)


class TopK:
    """The best `k` (score, row) pairs per query seen so far; ties go to the earlier row."""

    def __init__(self, num_queries: int, k: int) -> None:
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        self.k = k
        self.scores = np.zeros((num_queries, 0), dtype=np.float64)
        self.rows = np.zeros((num_queries, 0), dtype=np.int64)
        self.payload: np.ndarray | None = None  # per query, the stored vector of each kept row

    def floor(self) -> np.ndarray:
        """Per query, the k-th best score held (-inf while fewer than k are held): a row below it cannot enter."""
        if self.scores.shape[1] < self.k:
            return np.full(len(self.scores), -np.inf)
        return self.scores[:, self.k - 1]

    def add(self, scores: np.ndarray, first_row: int, block: np.ndarray | None = None,
            row_numbers: np.ndarray | None = None) -> None:
        """Offer a block's `[q, b]` scores for rows `first_row ...` (or the increasing `row_numbers`);
        `block` keeps the candidates' vectors."""
        nq, b = scores.shape
        numbers = np.arange(first_row, first_row + b, dtype=np.int64) if row_numbers is None else row_numbers
        rows = np.broadcast_to(numbers, (nq, b))
        all_scores = np.concatenate([self.scores, scores], axis=1)
        all_rows = np.concatenate([self.rows, rows], axis=1)
        keep = best_positions(all_scores, all_rows, self.k)
        take = np.arange(nq)[:, None]
        if block is not None:
            # Gather only the kept vectors: from the block, or from the candidates kept so far.
            held = self.scores.shape[1]
            fresh = block[np.clip(keep - held, 0, b - 1)]
            if self.payload is None or held == 0:
                self.payload = fresh
            else:
                kept = self.payload[take, np.clip(keep, 0, held - 1)]
                self.payload = np.where((keep >= held)[..., None], fresh, kept)
        self.scores, self.rows = all_scores[take, keep], all_rows[take, keep]

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """(scores, rows), each `[q, min(k, rows seen)]`, best first."""
        return self.scores, self.rows


def best_positions(scores: np.ndarray, rows: np.ndarray, k: int) -> np.ndarray:
    """Per query, positions of the `k` best scores, best first; equal scores in row order."""
    nq, m = scores.shape
    if m <= k:
        return np.stack([np.lexsort((rows[i], -scores[i])) for i in range(nq)]) if nq else np.zeros((0, m), np.int64)
    # Everything at or above the k-th best score (ties at the cut included), then an exact stable sort.
    kth = -np.partition(-scores, k - 1, axis=1)[:, k - 1]
    out = np.empty((nq, k), dtype=np.int64)
    for i in range(nq):
        pool = np.flatnonzero(scores[i] >= kth[i])
        out[i] = pool[np.lexsort((rows[i, pool], -scores[i, pool]))[:k]]
    return out


def search_blocks(
    queries: np.ndarray,
    blocks: Iterable[np.ndarray | tuple[np.ndarray, np.ndarray | None]],
    k: int,
    space: SearchSpace | None = None,
    rescore_multiplier: int = 0,
    query_chunk: int = 1024,
) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-`k` of float `queries` `[q, dim]` over stored vectors given block by block.

    A block is an array, or `(array, valid)` where `valid[i]` is False for a null row. Rows that cannot be
    scored (null, NaN or infinite) keep their place in the numbering and are never hits. Returns (scores,
    rows), `[q, min(k, usable rows)]`, best first; rows count from 0 across blocks. Working memory is about
    `query_chunk x block rows` scores (float64) plus one block of vectors.
    """
    space = space or SearchSpace()
    queries = np.asarray(queries, dtype=np.float32)
    encoded = space.encode_queries(queries)
    rescoring = rescore_multiplier > 0 and space.quantized
    chunks = [slice(i, min(i + query_chunk, len(queries))) for i in range(0, len(queries), query_chunk)]
    tops = [TopK(c.stop - c.start, k * rescore_multiplier if rescoring else k) for c in chunks]
    # Float vectors: a float32 GEMM (half a float64 one's time) picks the rows that can still enter each query's
    # top k, within a proven error bound of the exact score; only those rows get the exact (float64) score. The
    # same rows, scores and order as scoring every row exactly.
    prefilter = space.precision in FLOAT_PRECISIONS and len(queries) > 0
    unit_queries = _unit(encoded) if prefilter else encoded
    margin = float32_margin(queries.shape[-1]) if prefilter else 0.0
    first = usable = 0
    for item in blocks:
        block, valid = item if isinstance(item, tuple) else (item, None)
        if len(block):
            ok = usable_rows(block, valid)
            usable += int(ok.sum())
            if not ok.all():
                block = np.where(ok[:, None], block, np.zeros((), block.dtype))
            if prefilter:
                unit_block = _unit(block)
                for c, top in zip(chunks, tops, strict=True):
                    approx = unit_queries[c] @ unit_block.T
                    cand = (approx >= (top.floor() - margin).astype(np.float32)[:, None]) & ok
                    cols = np.flatnonzero(cand.any(axis=0))
                    if len(cols):
                        top.add(unit_scores(unit_queries[c], unit_block[cols]), first, row_numbers=cols + first)
                first += len(block)
                continue
            for c, top in zip(chunks, tops, strict=True):
                scores = space.scores(encoded[c], block)
                scores[:, ~ok] = -np.inf
                top.add(scores, first, block if rescoring else None)
        first += len(block)
    found = min(usable, k)
    scores = np.zeros((len(queries), found), dtype=np.float64)
    rows = np.zeros((len(queries), found), dtype=np.int64)
    for c, top in zip(chunks, tops, strict=True):
        s, r = top.result()
        if rescoring and top.payload is not None:
            rescored = np.where(np.isneginf(s), -np.inf, space.rescore(queries[c], top.payload))
            keep = best_positions(rescored, r, k)
            take = np.arange(len(r))[:, None]
            s, r = rescored[take, keep], r[take, keep]
        scores[c], rows[c] = s[:, :found], r[:, :found]
    return scores, rows


def vector_block(column: pa.Array) -> tuple[np.ndarray, np.ndarray | None]:
    """A vector column as `([b, width] array, valid)`: a null row stays in its place (zeros, not valid), so
    the rows after it keep their numbers; `valid` is None when no row is null."""
    if not column.null_count:
        return embedding_matrix(column), None
    valid = np.asarray(column.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    present = embedding_matrix(column.filter(pa.array(valid)))
    full = np.zeros((len(column), column.type.list_size), dtype=present.dtype)
    full[valid] = present
    return full, valid


def parquet_vector_blocks(
    path: str, block_rows: int = DEFAULT_BLOCK_ROWS, column: str = "embedding"
) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
    """`([b, width], valid)` blocks of a Parquet file's vector column (see `vector_block`), a row group at a time."""
    # pre_buffer=False and use_threads=False: by default pyarrow fetches every row group's column chunk up
    # front and decodes ahead, so memory grows with the file (measured on 100k x 384 float32 in 1,024-row
    # row groups: peak +298 MiB by default; see benchmarks/bench_search.py for the figures without).
    with open_parquet(path, pre_buffer=False) as pf:
        for batch in pf.iter_batches(batch_size=block_rows, columns=[column], use_threads=False):
            yield vector_block(batch.column(0))


def take_rows(path: str, rows: np.ndarray, columns: list[str], block_rows: int = DEFAULT_BLOCK_ROWS) -> pa.Table:
    """A pyarrow table of `columns` for the given row numbers (in that order), read in one streamed pass."""
    wanted = np.unique(rows)
    pieces = []
    first = 0
    with open_parquet(path, pre_buffer=False) as pf:
        schema = pf.schema_arrow
        for batch in pf.iter_batches(batch_size=block_rows, columns=columns, use_threads=False):
            lo, hi = np.searchsorted(wanted, [first, first + batch.num_rows])
            if hi > lo:
                pieces.append(batch.take(pa.array(wanted[lo:hi] - first)))
            first += batch.num_rows
    fields = [schema.field(c) for c in columns]
    table = pa.Table.from_batches(pieces, schema=pa.schema(fields)) if pieces else pa.schema(fields).empty_table()
    return table.take(pa.array(np.searchsorted(wanted, rows), pa.int64()))
