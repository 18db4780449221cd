"""The assembly's read-ahead thread and the previous output's validity bitmaps (`embedcli.io.shards._ahead`,
`embedcli.io.previous._valid`): the same items in order, errors raised in the consumer, no thread left."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pytest

from embedcli.io.previous import _valid
from embedcli.io.shards import _ahead


@pytest.mark.parametrize("n", [0, 1, 2, 3, 50])
@pytest.mark.parametrize("depth", [1, 2])
def test_ahead_gives_every_item_in_order(n: int, depth: int) -> None:
    assert list(_ahead(iter(range(n)), depth)) == list(range(n))


def test_ahead_raises_the_producers_error_after_its_items() -> None:
    def items() -> Iterator[int]:
        yield 1
        yield 2
        raise OSError("disk gone")

    got = []
    with pytest.raises(OSError, match="disk gone"):
        for x in _ahead(items()):
            got.append(x)
    assert got == [1, 2]


def test_ahead_stops_its_thread_when_the_consumer_stops_early() -> None:
    made = []

    def items() -> Iterator[int]:
        for i in range(10_000):
            made.append(i)
            yield i

    before = threading.active_count()
    gen = _ahead(items(), 2)
    assert next(gen) == 0
    gen.close()
    assert threading.active_count() == before
    assert len(made) < 10  # stopped a few items ahead, not run to the end


@pytest.mark.parametrize("values", [[b"a" * 16, None, b"b" * 16] * 5, [None] * 7, [b"c" * 16] * 9, []])
@pytest.mark.parametrize("offset", [0, 1, 3])
def test_valid_equals_arrows_is_valid(values: list[bytes | None], offset: int) -> None:
    array = pa.array(values, pa.binary(16)).slice(min(offset, len(values)))
    assert _valid(array).tolist() == np.asarray(array.is_valid().to_pylist(), bool).tolist()
