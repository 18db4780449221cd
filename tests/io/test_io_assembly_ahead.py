"""The assembly's read-ahead thread and the previous output's validity bitmaps (`embedcli.io.shards._ahead`,
`embedcli.io.arrow_values.valid_mask`): the same items in order, errors raised in the consumer, no thread left."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pytest

from embedcli.io.arrow_values import valid_mask as _valid
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


def _corpus(path, prefix: str):  # type: ignore[no-untyped-def]
    import json

    path.write_text("".join(json.dumps({"id": f"{prefix}{i}", "text": f"{prefix} text {i}"}) + "\n" for i in range(6)))
    return path


@pytest.mark.parametrize("fails", ["sidecar", "data"])
def test_a_failed_assembly_keeps_the_old_output_and_leaves_no_temp_file(
    cli, st_model, tmp_path, monkeypatch: pytest.MonkeyPatch, fails: str  # type: ignore[no-untyped-def]
) -> None:
    """The index sidecar is written in a thread beside the data: whichever of the two fails, the run exits
    non-zero, the previous output and its sidecar keep their bytes, and neither side's temp file is left."""
    import embedcli.io.shards as shards

    corpus = _corpus(tmp_path / "corpus.jsonl", "old")
    out = tmp_path / "out.parquet"
    cli("embed", corpus, "-m", st_model, "-o", out, "-q")
    sidecar = tmp_path / "out.parquet.embedcli-index.parquet"
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    assert sidecar.name in before
    _corpus(corpus, "new")
    before[corpus.name] = corpus.read_bytes()

    def disk_full(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    if fails == "sidecar":
        monkeypatch.setattr(shards, "write_index_sidecar", disk_full)
    else:
        real = shards.rechunk
        calls = []

        def rechunk(tables, schema, rows):  # type: ignore[no-untyped-def]
            calls.append(rows)
            if rows == shards.FINAL_ROW_GROUP_ROWS:  # the data's, not the sidecar's
                disk_full()
            return real(tables, schema, rows)

        monkeypatch.setattr(shards, "rechunk", rechunk)
    r = cli("embed", corpus, "-m", st_model, "-o", out, "-q", code=None)
    assert r.exit_code != 0 and "No space left" in r.stderr
    after = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    assert after == before
    assert not [t for t in threading.enumerate() if t.name.startswith("embedcli-index")]

