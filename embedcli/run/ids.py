"""Duplicate-id detection over a whole run in bounded memory."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class IdSet:
    """The ids seen so far, as 64-bit hashes with the packed location of their first occurrence.

    16 bytes per row in sorted numpy runs (merged like an LSM tree), so a 10M-row corpus costs ~160 MB
    rather than a Python set's ~1 GB. Python's string hash is 64-bit: a false duplicate among 10M ids
    has a probability of about 3e-6.
    """

    SHIFT = 40

    def __init__(self) -> None:
        self._runs: list[tuple[np.ndarray, np.ndarray]] = []
        self._files: dict[str, int] = {}
        self._names: list[str] = []
        self._words: dict[int, str] = {}

    def _loc(self, source: str, location: str) -> int:
        idx = self._files.get(source)
        if idx is None:
            idx = self._files[source] = len(self._names)
            self._names.append(source)
        word, _, number = location.rpartition(" ")
        self._words.setdefault(idx, word or "record")
        try:
            n = int(number)
        except ValueError:
            n = 0
        return (idx << self.SHIFT) | n

    def describe(self, packed: int) -> tuple[str, str]:
        """(file, 'line N' / 'row N') of a packed location."""
        idx = packed >> self.SHIFT
        return self._names[idx], f"{self._words.get(idx, 'record')} {packed & ((1 << self.SHIFT) - 1)}"

    def add(self, source: str, ids: Sequence[str], locations: Sequence[str]) -> list[tuple[int, int]]:
        """Register a batch's ids; returns (index in batch, packed first location) of every repeat.

        The first occurrence wins; repeats are not registered.
        """
        n = len(ids)
        if n == 0:
            return []
        h = np.fromiter(map(hash, ids), dtype=np.int64, count=n)
        locs = np.fromiter((self._loc(source, loc) for loc in locations), dtype=np.int64, count=n)
        first = np.full(n, -1, dtype=np.int64)
        seen = np.zeros(n, dtype=bool)
        for rh, rl in self._runs:
            pos = np.minimum(np.searchsorted(rh, h), len(rh) - 1)
            hit = (rh[pos] == h) & ~seen
            first[hit] = rl[pos[hit]]
            seen |= hit
        order = np.argsort(h, kind="stable")
        hs = h[order]
        starts = np.ones(n, dtype=bool)
        starts[1:] = hs[1:] != hs[:-1]
        group_first = order[np.maximum.accumulate(np.where(starts, np.arange(n), 0))]
        first_index = np.empty(n, dtype=np.int64)
        first_index[order] = group_first
        within = first_index != np.arange(n)
        newly = within & ~seen
        first[newly] = locs[first_index[newly]]
        repeat = seen | within
        keep = ~repeat
        if keep.any():
            kh, kl = h[keep], locs[keep]
            o = np.argsort(kh, kind="stable")
            self._runs.append((kh[o], kl[o]))
            while len(self._runs) > 1 and len(self._runs[-2][0]) <= 2 * len(self._runs[-1][0]):
                (ah, al), (bh, bl) = self._runs.pop(), self._runs.pop()
                mh, ml = np.concatenate([bh, ah]), np.concatenate([bl, al])
                o = np.argsort(mh, kind="stable")
                self._runs.append((mh[o], ml[o]))
        return [(int(i), int(first[i])) for i in np.nonzero(repeat)[0]]
