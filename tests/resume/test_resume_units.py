"""Units of the unattended machinery: duplicate-id set, row keys, manifest, progress lines, previous outputs."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa

from embedcli.io.manifest import Manifest, ShardEntry
from embedcli.io.shards import keys_array, keys_numpy, row_keys
from embedcli.run.ids import IdSet, id_hashes, pack_locations
from embedcli.run.progress import Progress


def test_idset_finds_repeats_within_and_across_batches_with_the_first_location() -> None:
    ids = IdSet(["a.jsonl", "b.jsonl", "c.parquet", "d.jsonl", "e.jsonl"], ["line", "line", "row", "line", "line"])

    def add(f: int, values: list[str], numbers: list[int]) -> list[tuple[int, int]]:
        return ids.add(id_hashes(values), pack_locations(np.full(len(values), f), np.asarray(numbers)))

    assert add(0, ["x", "y", "x"], [1, 2, 3]) == [(2, int(pack_locations(np.array([0]), np.array([1]))[0]))]
    repeats = add(1, ["z", "y", "w", "w"], [1, 2, 3, 4])
    assert [i for i, _ in repeats] == [1, 3]
    assert [ids.describe(p) for _, p in repeats] == [("a.jsonl", "line 2"), ("b.jsonl", "line 3")]
    for k in range(50):  # many runs merge and stay searchable
        assert add(2, [f"k{k}-{j}" for j in range(10)], list(range(10))) == []
    assert [i for i, _ in add(3, ["k3-4", "fresh"], [1, 2])] == [0]
    assert ids.describe(add(4, ["k3-4"], [9])[0][1]) == ("c.parquet", "row 4")
    assert ids.any_seen(id_hashes(["fresh"])) and not ids.any_seen(id_hashes(["never"]))
    assert id_hashes(["x"])[0] == id_hashes(["x"])[0] != id_hashes(["y"])[0]  # stable: kept in the row index


def test_row_keys_depend_on_id_and_every_text() -> None:
    a = row_keys(["1", "2"], ["t", "t"])
    assert a[0] != a[1] and row_keys(["1"], ["t"])[0] == a[0]
    assert row_keys(["1"], ["t "])[0] != a[0]
    assert row_keys(["1"], ["t"], {"right": ["u"]})[0] != a[0]
    assert row_keys(["1a"], [""])[0] != row_keys(["1"], ["a"])[0]  # length-prefixed, no ambiguity
    assert np.array_equal(keys_numpy(keys_array(a)), a)
    assert np.array_equal(keys_numpy(pa.chunked_array([keys_array(a)[1:]])), a[1:])


def test_manifest_round_trip(tmp_path) -> None:  # type: ignore[no-untyped-def]
    m = Manifest("c", "j", {"embedcli.config_hash": "h"}, {"text_col": "text"}, None, "parquet")
    m.shards.append(ShardEntry(0, "part-000000.parquet", 10, [0, 11], errors=1, errors_file="_embedcli/errors-000000.jsonl"))
    m.records_done, m.rows_done, m.errors = 11, 10, 1
    m.save(str(tmp_path))
    assert Manifest.load(str(tmp_path)) == m
    (tmp_path / "_embedcli" / "manifest.json").write_text("{not json")
    assert Manifest.load(str(tmp_path)) is None


def test_progress_plain_lines_are_throttled_and_have_an_eta() -> None:
    out = io.StringIO()
    p = Progress(1000, initial=100, log_every=0, stream=out, tty=False)
    p.update(100, tokens=5000)
    line = out.getvalue()
    assert "200/1,000 rows (20.0%)" in line and "rows/s" in line and "tok/s" in line and "ETA" in line
    quiet_out = io.StringIO()
    q = Progress(10, stream=quiet_out, tty=False, log_every=3600)
    q.update(5)
    q.close("done")
    assert quiet_out.getvalue() == "embedcli: done\n"  # throttled: only the summary
    silent = io.StringIO()
    Progress(10, quiet=True, stream=silent, tty=False, log_every=0).update(5)
    assert silent.getvalue() == ""
