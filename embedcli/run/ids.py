"""Duplicate-id detection over a whole run in bounded memory."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from embedcli.io.positions import LOC_SHIFT

# Sorted runs stop merging at this many ids (4 MiB): memory stays 16 bytes an id with no merge of a
# corpus-sized run (which took ~3x that for a moment); a lookup searches a run per 262k ids.
RUN_CAP = 1 << 18
# The prefilter's bits per id: one bit per hash in a bitmap of >= 16 bits an id (2 bytes an id) passes ~6% of
# unseen ids on to the runs' binary searches, which cost ~18 cache misses an id and a run (a changed 1M-row
# rerun spent over a second in them); it is rebuilt at twice the size when the ids outgrow it.
FILTER_BITS_PER_ID = 16
MIN_FILTER_BITS = 1 << 16


def id_hashes(ids: Sequence[str]) -> np.ndarray:
    """Stable 64-bit hashes of ids (BLAKE2b-64 of their UTF-8), as int64: kept in the row index, so a resumed
    run and a rerun know the ids of rows they do not read again."""
    blake = hashlib.blake2b
    raw = b"".join(blake(i.encode("utf-8", "surrogatepass"), digest_size=8).digest() for i in ids)
    return np.frombuffer(raw, dtype="<i8").copy() if raw else np.zeros(0, np.int64)


def pack_locations(files: np.ndarray, numbers: np.ndarray) -> np.ndarray:
    """Packed locations (file index, line/row number) as int64."""
    return (np.asarray(files, np.int64) << LOC_SHIFT) | np.asarray(numbers, np.int64)


class IdSet:
    """The ids seen so far, as stable 64-bit hashes with the packed location of their first occurrence.

    16 bytes per row in sorted numpy runs (merged like an LSM tree, up to RUN_CAP ids a run), so a 10M-row
    corpus costs ~160 MB rather than a Python set's ~1 GB, and a bitmap of 2 bytes per id in front of them: an id
    whose bit is clear was never seen, with no search. A false duplicate among 10M ids has a probability of about
    3e-6.
    `names` and `words` name file `i` and what its numbers count ("line", "row").
    """

    def __init__(self, names: Sequence[str] = (), words: Sequence[str] = ()) -> None:
        self._runs: list[tuple[np.ndarray, np.ndarray]] = []
        self._count = 0
        self._bits = np.zeros(MIN_FILTER_BITS // 64, np.uint64)
        self.names = list(names)
        self.words = list(words)

    def __len__(self) -> int:
        return self._count

    def _maybe(self, h: np.ndarray) -> np.ndarray:
        """Per hash, whether it may have been seen (False: certainly not)."""
        bit = h.view(np.uint64) & np.uint64(len(self._bits) * 64 - 1)
        return ((self._bits[bit >> np.uint64(6)] >> (bit & np.uint64(63))) & np.uint64(1)).astype(bool)

    def _mark(self, h: np.ndarray) -> None:
        bit = h.view(np.uint64) & np.uint64(len(self._bits) * 64 - 1)
        np.bitwise_or.at(self._bits, bit >> np.uint64(6), np.uint64(1) << (bit & np.uint64(63)))

    def describe(self, packed: int) -> tuple[str, str]:
        """(file, 'line N' / 'row N') of a packed location."""
        idx = packed >> LOC_SHIFT
        name = self.names[idx] if idx < len(self.names) else f"input {idx}"
        word = self.words[idx] if idx < len(self.words) else "record"
        return name, f"{word} {packed & ((1 << LOC_SHIFT) - 1)}"

    def _first_seen(self, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(seen before, its packed first location) of each hash."""
        n = len(h)
        first = np.full(n, -1, dtype=np.int64)
        seen = np.zeros(n, dtype=bool)
        if not self._count:
            return seen, first
        maybe = np.flatnonzero(self._maybe(h))
        if not len(maybe):
            return seen, first
        hm, fm, sm = h[maybe], first[maybe], seen[maybe]
        for rh, rl in self._runs:
            pos = np.minimum(np.searchsorted(rh, hm), len(rh) - 1)
            hit = (rh[pos] == hm) & ~sm
            fm[hit] = rl[pos[hit]]
            sm |= hit
        first[maybe], seen[maybe] = fm, sm
        return seen, first

    def any_seen(self, hashes: np.ndarray) -> bool:
        """Whether any of `hashes` was seen already."""
        return bool(len(hashes)) and bool(self._first_seen(np.asarray(hashes, np.int64))[0].any())

    def register(self, hashes: np.ndarray, locations: np.ndarray) -> None:
        """Register ids known to be new (none seen, none repeated among them)."""
        h = np.asarray(hashes, np.int64)
        if len(h):
            o = np.argsort(h, kind="stable")
            self._push(h[o], np.asarray(locations, np.int64)[o])

    def _push(self, sorted_h: np.ndarray, sorted_locs: np.ndarray) -> None:
        runs = self._runs
        runs.append((sorted_h, sorted_locs))
        self._count += len(sorted_h)
        if self._count * FILTER_BITS_PER_ID > len(self._bits) * 64:
            size = len(self._bits) * 64
            while size < self._count * FILTER_BITS_PER_ID * 2:
                size *= 2
            self._bits = np.zeros(size // 64, np.uint64)
            for rh, _ in runs:
                self._mark(rh)
        else:
            self._mark(sorted_h)
        while (len(runs) > 1 and len(runs[-2][0]) <= 2 * len(runs[-1][0])
               and len(runs[-2][0]) + len(runs[-1][0]) <= RUN_CAP):
            (bh, bl), (ah, al) = runs.pop(), runs.pop()
            runs.append(_merge(ah, al, bh, bl))


    def add(self, hashes: np.ndarray, locations: np.ndarray) -> list[tuple[int, int]]:
        """Register ids (their hashes and packed locations); returns (index, packed first location) of every
        repeat, within the call or of an earlier one. The first occurrence wins; repeats are not registered."""
        h = np.asarray(hashes, np.int64)
        locs = np.asarray(locations, np.int64)
        n = len(h)
        if n == 0:
            return []
        seen, first = self._first_seen(h)
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
            self._push(kh[o], kl[o])
        return [(int(i), int(first[i])) for i in np.nonzero(repeat)[0]]


def _merge(ah: np.ndarray, al: np.ndarray, bh: np.ndarray, bl: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two sorted runs as one (a linear merge: no sort, no concatenated copy)."""
    at = np.searchsorted(ah, bh, side="right") + np.arange(len(bh))
    n = len(ah) + len(bh)
    h, loc = np.empty(n, np.int64), np.empty(n, np.int64)
    mine = np.ones(n, dtype=bool)
    mine[at] = False
    h[at], loc[at] = bh, bl
    h[mine], loc[mine] = ah, al
    return h, loc
