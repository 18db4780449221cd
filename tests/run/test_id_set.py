"""IdSet against a dict of first locations: repeats, their first locations, and `any_seen`, across filter rebuilds."""

from __future__ import annotations

import numpy as np
import pytest

from embedcli.run.ids import FILTER_BITS_PER_ID, MIN_FILTER_BITS, IdSet


def _reference_add(first: dict[int, int], h: np.ndarray, locs: np.ndarray) -> list[tuple[int, int]]:
    out = []
    for i, (x, loc) in enumerate(zip(h.tolist(), locs.tolist(), strict=True)):
        if x in first:
            out.append((i, first[x]))
        else:
            first[x] = loc
    return out


@pytest.mark.parametrize("low_bits_equal", [False, True])
@pytest.mark.parametrize("batch", [1, 97, 5000])
def test_repeats_and_first_locations_match_a_dict(batch: int, low_bits_equal: bool) -> None:
    rng = np.random.default_rng(batch)
    n = 3 * MIN_FILTER_BITS // FILTER_BITS_PER_ID + 11  # past two rebuilds of the prefilter
    pool = rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64)
    if low_bits_equal:  # every hash on one bit of the filter: each lookup goes on to the runs
        pool = (pool >> 24) << 24
    stream = np.concatenate([pool, rng.choice(pool, n // 3)])
    rng.shuffle(stream)
    ids, first = IdSet(), {}
    for at in range(0, len(stream), batch):
        h = stream[at:at + batch]
        locs = np.arange(at, at + len(h), dtype=np.int64)
        seen_before = any(x in first for x in h.tolist())
        assert ids.any_seen(h) == seen_before
        assert ids.add(h, locs) == _reference_add(first, h, locs)
        assert len(ids) == len(first)
    assert not ids.any_seen(np.array([x for x in range(1, 50) if x not in first], np.int64))
    assert ids.any_seen(pool[-1:])


def test_register_then_any_seen() -> None:
    ids = IdSet()
    h = np.arange(1, 20001, dtype=np.int64) * 7919
    ids.register(h[::2], np.arange(0, 20000, 2))
    assert ids.any_seen(h[::2][-3:]) and not ids.any_seen(h[1::2])
    assert ids.add(h[1:4], np.array([1, 2, 3])) == [(1, 2)]
