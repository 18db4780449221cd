"""Float64 reference maths for the pooling tests.

Everything that computes an *expected* value lives here and is written with plain Python floats
(float64) and loops, never with embedcli, so a bug in the code under test cannot leak into the
expectation. `make_metadata`/`cu_from_lens` only build inputs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from embedcli.pooling import PoolingMetadata, PoolingParams

Rows = list[list[float]]

# Tolerances for comparing an output computed in `dtype` against a float64 reference.
TOL: dict[torch.dtype, dict[str, float]] = {
    torch.float32: {"atol": 1e-5, "rtol": 1e-5},
    torch.bfloat16: {"atol": 1e-2, "rtol": 1e-2},
    torch.float16: {"atol": 2e-3, "rtol": 2e-3},
    torch.float64: {"atol": 1e-12, "rtol": 1e-12},
}

DTYPES = [torch.float32, torch.bfloat16]


# ---------------------------------------------------------------- inputs


def cu_from_lens(lens: Sequence[int]) -> list[int]:
    """`[0, n0, n0+n1, ...]` from per-sequence lengths."""
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    return cu


def make_metadata(
    lens: Sequence[int],
    params: list[PoolingParams] | None = None,
    *,
    task: str | None = None,
    **kwargs,
) -> PoolingMetadata:
    """Metadata for sequences of `lens` scheduled tokens, one `PoolingParams(task=task)` each by default."""
    if params is None:
        params = [PoolingParams(task=task) for _ in lens]  # type: ignore[arg-type]
    return PoolingMetadata.from_cu_seqlens(cu_from_lens(lens), params, **kwargs)


def rand(rows: int, cols: int, dtype: torch.dtype = torch.float32, scale: float = 1.0) -> torch.Tensor:
    """A random `[rows, cols]` tensor of `dtype` (values are rounded to `dtype` once, then fixed)."""
    return (torch.randn(rows, cols, dtype=torch.float64) * scale).to(dtype)


# ---------------------------------------------------------------- conversions


def to_rows(t: torch.Tensor) -> Rows:
    """The values of a 2-D tensor *as stored*, as float64 Python lists."""
    return [[float(v) for v in row] for row in t.detach().to(torch.float64).tolist()]


def to_vec(t: torch.Tensor) -> list[float]:
    return [float(v) for v in t.detach().to(torch.float64).tolist()]


def split_rows(rows: Rows, lens: Sequence[int]) -> list[Rows]:
    """Consecutive groups of `lens[i]` rows."""
    out, start = [], 0
    for n in lens:
        out.append(rows[start : start + n])
        start += n
    return out


# ---------------------------------------------------------------- maths


def ref_mean(rows: Rows) -> list[float]:
    """Column-wise arithmetic mean of `rows`, accumulated over rows in float64."""
    hidden = len(rows[0])
    acc = [0.0] * hidden
    for row in rows:
        for j in range(hidden):
            acc[j] += row[j]
    return [a / len(rows) for a in acc]


def ref_sum(rows: Rows, hidden: int) -> list[float]:
    acc = [0.0] * hidden
    for row in rows:
        for j in range(hidden):
            acc[j] += row[j]
    return acc


def ref_norm(vec: Sequence[float]) -> float:
    return math.sqrt(sum(v * v for v in vec))


def ref_normalize(vec: Sequence[float], eps: float = 1e-12) -> list[float]:
    """L2 normalization with torch's `max(norm, eps)` denominator (a zero vector stays zero)."""
    denom = max(ref_norm(vec), eps)
    return [v / denom for v in vec]


def ref_sigmoid_scalar(v: float) -> float:
    if v >= 0:
        return 1.0 / (1.0 + math.exp(-v))
    e = math.exp(v)
    return e / (1.0 + e)


def ref_sigmoid(vec: Sequence[float]) -> list[float]:
    return [ref_sigmoid_scalar(v) for v in vec]


def ref_softmax(vec: Sequence[float]) -> list[float]:
    m = max(vec)
    exps = [math.exp(v - m) for v in vec]
    total = sum(exps)
    return [e / total for e in exps]


def ref_linear(rows: Rows, weight: torch.Tensor, bias: torch.Tensor | None) -> Rows:
    """`x @ W.T + b` row by row, in float64."""
    w = to_rows(weight)
    b = to_vec(bias) if bias is not None else [0.0] * len(w)
    out = []
    for row in rows:
        out.append(
            [
                sum(wi * xi for wi, xi in zip(w_row, row, strict=True)) + bj
                for w_row, bj in zip(w, b, strict=True)
            ]
        )
    return out


def ref_calibrate(vec: Sequence[float], mean: float | None, sigma: float | None) -> list[float]:
    out = list(vec)
    if mean is not None:
        out = [v - mean for v in out]
    if sigma is not None:
        out = [v / sigma for v in out]
    return out


# ---------------------------------------------------------------- assertions


def assert_matches(
    actual: torch.Tensor,
    expected: Sequence,
    *,
    atol: float,
    rtol: float = 0.0,
) -> None:
    """`actual` has the shape of `expected` and its values within tolerance of it (compared in float64)."""
    exp = torch.tensor(expected, dtype=torch.float64)
    if exp.numel() == 0:
        assert actual.numel() == 0, f"expected an empty result, got shape {tuple(actual.shape)}"
        return
    assert tuple(actual.shape) == tuple(exp.shape), f"shape {tuple(actual.shape)} != {tuple(exp.shape)}"
    assert not torch.isnan(actual).any(), "result contains NaN"
    torch.testing.assert_close(actual.detach().to(torch.float64), exp, atol=atol, rtol=rtol)


def assert_rows_equal(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Bit-for-bit equality (same dtype, shape and values), for methods that only select rows."""
    assert actual.dtype == expected.dtype
    assert tuple(actual.shape) == tuple(expected.shape)
    assert torch.equal(actual, expected)


def ref_st_pool(rows: Rows, modes: Sequence[str], skip: int = 0) -> list[float]:
    """sentence-transformers' Pooling of one sequence's token rows, its first `skip` (prompt) tokens masked out.

    Written from its documented semantics (attention mask zeroed over the prompt): cls = first kept token
    (position 0 when none is kept), max / mean / mean_sqrt_len / weightedmean (weights = position + 1) over
    the kept tokens, an empty kept set giving zeros; lasttoken = the last token unless all tokens are masked.
    """
    hidden = len(rows[0])
    kept = [(pos, row) for pos, row in enumerate(rows) if pos >= skip]
    out: list[float] = []
    for mode in modes:
        if mode == "cls":
            out += list(kept[0][1] if kept else rows[0])
        elif mode == "lasttoken":
            out += list(rows[-1]) if kept else [0.0] * hidden
        elif mode == "max":
            out += [max(r[j] for _, r in kept) if kept else 0.0 for j in range(hidden)]
        elif mode in ("mean", "mean_sqrt_len_tokens"):
            count = max(len(kept), 1e-9)
            denom = count if mode == "mean" else math.sqrt(count)
            out += [sum(r[j] for _, r in kept) / denom for j in range(hidden)]
        elif mode == "weightedmean":
            total_w = max(sum(p + 1 for p, _ in kept), 1e-9)
            out += [sum((p + 1) * r[j] for p, r in kept) / total_w for j in range(hidden)]
        else:
            raise KeyError(mode)
    return out
