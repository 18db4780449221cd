"""`embedcli.retrieval`: blocked exact top-k against a float64 / integer brute force written here."""

from __future__ import annotations

import numpy as np
import pytest

from embedcli.quantize import quantize, ranges_of
from embedcli.retrieval import SearchSpace, TopK, search_blocks


def _blocks(x: np.ndarray, size: int) -> list[np.ndarray]:
    return [x[i : i + size] for i in range(0, len(x), size)]


def _brute(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Best first, ties by row: Python's stable sort on -score."""
    rows, values = [], []
    for s in scores:
        order = sorted(range(len(s)), key=lambda j: -s[j])[:k]
        rows.append(order)
        values.append([s[j] for j in order])
    return np.asarray(values), np.asarray(rows)


def _corpus(n: int, dim: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, dim)).astype(np.float32)
    x[5] = x[2]  # exact duplicates: equal scores, the earlier row must come first
    x[n - 1] = x[2]
    return x


@pytest.mark.parametrize("block", [1, 3, 7, 1000])
@pytest.mark.parametrize("k", [1, 4, 50])  # 50 > n
@pytest.mark.parametrize("query_chunk", [3, 1024])
def test_float32_matches_float64_cosine(block: int, k: int, query_chunk: int) -> None:
    x = _corpus(23, 16, 0)
    q = np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)
    q[3] = x[2] * 3  # its best rows are the three copies of row 2, tied
    unit = lambda a: a.astype(np.float64) / np.linalg.norm(a.astype(np.float64), axis=1, keepdims=True)  # noqa: E731
    ref_scores, ref_rows = _brute(unit(q) @ unit(x).T, k)
    scores, rows = search_blocks(q, _blocks(x, block), k, query_chunk=query_chunk)
    assert rows.shape == (4, min(k, 23))
    assert np.array_equal(rows, ref_rows)
    np.testing.assert_allclose(scores, ref_scores, atol=1e-6)
    assert rows[3, :3].tolist() == [2, 5, 22][:k]


@pytest.mark.parametrize("precision", ["int8", "uint8"])
@pytest.mark.parametrize("block", [2, 5, 100])
def test_scalar_quantized_dot_products_and_ties(precision: str, block: int) -> None:
    x = _corpus(30, 12, 2)
    q = np.random.default_rng(3).standard_normal((5, 12)).astype(np.float32)
    ranges = ranges_of(x)
    codes = quantize(x, precision, ranges)
    qc = quantize(q, precision, ranges)
    ref_scores, ref_rows = _brute(qc.astype(np.int64) @ codes.astype(np.int64).T, 8)
    scores, rows = search_blocks(q, _blocks(codes, block), 8, SearchSpace(precision, 12, ranges))
    assert np.array_equal(rows, ref_rows)
    assert np.array_equal(scores, ref_scores.astype(np.float64))


@pytest.mark.parametrize("precision", ["binary", "ubinary"])
@pytest.mark.parametrize("dim", [16, 13])  # 13: padding bits must not count
def test_binary_agreeing_bits(precision: str, dim: int) -> None:
    x = _corpus(40, dim, 4)
    q = np.random.default_rng(5).standard_normal((3, dim)).astype(np.float32)
    codes = quantize(x, precision)
    hamming = np.array([[int(np.sum((a > 0) != (b > 0))) for b in x] for a in q])
    ref_scores, ref_rows = _brute(dim - hamming, 10)  # many ties: row order decides
    scores, rows = search_blocks(q, _blocks(codes, 6), 10, SearchSpace(precision, dim))
    assert np.array_equal(rows, ref_rows)
    assert np.array_equal(scores, ref_scores)


@pytest.mark.parametrize("precision", ["int8", "uint8", "binary", "ubinary"])
def test_rescoring_reranks_the_oversampled_candidates_with_the_float_query(precision: str) -> None:
    dim, k, mult = 12, 3, 4
    x = _corpus(50, dim, 6)
    q = np.random.default_rng(7).standard_normal((4, dim)).astype(np.float32)
    ranges = ranges_of(x) if precision in ("int8", "uint8") else None
    space = SearchSpace(precision, dim, ranges)
    codes = quantize(x, precision, ranges)
    # reference: quantized brute-force candidates, then float64 rescoring written from the recipe
    if ranges is not None:
        qc = quantize(q, precision, ranges).astype(np.int64)
        _, cand = _brute(qc @ codes.astype(np.int64).T, k * mult)
        step = (ranges[1].astype(np.float64) - ranges[0]) / 255
        deq = (codes.astype(np.float64) + (128 if precision == "int8" else 0)) * step + ranges[0]
    else:
        hamming = np.array([[int(np.sum((a > 0) != (b > 0))) for b in x] for a in q])
        _, cand = _brute(dim - hamming, k * mult)
        deq = (x > 0).astype(np.float64)
    exp_rows, exp_scores = [], []
    for i in range(len(q)):
        s = deq[cand[i]] @ q[i].astype(np.float64)
        order = sorted(range(len(s)), key=lambda j: (-s[j], cand[i][j]))[:k]
        exp_rows.append(cand[i][order])
        exp_scores.append(s[order])
    scores, rows = search_blocks(q, _blocks(codes, 7), k, space, rescore_multiplier=mult, query_chunk=3)
    assert np.array_equal(rows, np.asarray(exp_rows))
    np.testing.assert_allclose(scores, np.asarray(exp_scores), rtol=1e-5)


def test_topk_ignores_block_boundaries_for_ties() -> None:
    top = TopK(1, 2)
    top.add(np.array([[1.0, 0.5]]), 0)
    top.add(np.array([[1.0, 1.0]]), 2)
    scores, rows = top.result()
    assert rows.tolist() == [[0, 2]] and scores.tolist() == [[1.0, 1.0]]


def test_empty_corpus_gives_no_hits() -> None:
    scores, rows = search_blocks(np.ones((2, 4), np.float32), [], 5)
    assert scores.shape == (2, 0) and rows.shape == (2, 0)


@pytest.mark.parametrize("block", [97, 4096])
def test_float32_matches_faiss_index_flat_ip(block: int) -> None:
    """On unit vectors the exact search is faiss's IndexFlatIP: the same rows in the same order, the same scores."""
    faiss = pytest.importorskip("faiss")
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3000, 48)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    q = rng.standard_normal((40, 48)).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    index = faiss.IndexFlatIP(48)
    index.add(x)
    want_scores, want_rows = index.search(q, 10)
    scores, rows = search_blocks(q, _blocks(x, block), 10, SearchSpace("float32", 48))
    np.testing.assert_array_equal(rows, want_rows)
    np.testing.assert_allclose(scores, want_scores, atol=1e-5)


@pytest.mark.parametrize("block", [64, 1000])
def test_float32_near_ties_across_blocks_are_exact(block: int) -> None:
    """Rows whose cosines differ by less than a float32 GEMM's error: the float32 prefilter keeps every row that
    can enter the top k, so rows and scores are those of every row scored exactly, ties to the earlier row."""
    rng = np.random.default_rng(3)
    base = rng.standard_normal((40, 32)).astype(np.float32)
    x = np.repeat(base, 50, axis=0) + rng.standard_normal((2000, 32)).astype(np.float32) * 1e-6
    q = base[:5] + rng.standard_normal((5, 32)).astype(np.float32) * 1e-3
    # Every row scored exactly (SearchSpace.scores, the score's definition), then the brute force's order.
    space = SearchSpace("float32", 32)
    exact = space.scores(q, x)
    want_scores, want_rows = _brute(exact, 25)
    scores, rows = search_blocks(q, _blocks(x, block), 25, space)
    np.testing.assert_array_equal(rows, want_rows)
    np.testing.assert_array_equal(scores, want_scores)
