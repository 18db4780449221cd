"""Staging areas and temp files are never followed through a planted symlink (issue 13, item 2), and an
output name too long for the names embedcli keeps beside it is refused up front, with the limit."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from embedcli.io.manifest import Manifest, write_atomic
from embedcli.io.shards import RowsOut, ShardStore
from embedcli.io.writers import embedding_array, open_writer


def _corpus(tmp_path: Path, n: int = 5) -> Path:
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"id": f"d{i}", "text": f"text number {i}"}) + "\n" for i in range(n)))
    return path


def _table(n: int = 3) -> pa.Table:
    vectors = np.arange(n * 4, dtype=np.float32).reshape(n, 4)
    return pa.table({"id": [f"r{i}" for i in range(n)], "embedding": embedding_array(vectors)})


def test_symlinked_staging_dir_is_refused_and_its_target_untouched(cli, st_model: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep me")
    out = tmp_path / "out.parquet"
    os.symlink(victim, tmp_path / "out.parquet.embedcli-staging")
    r = cli("embed", _corpus(tmp_path), "-m", st_model, "-o", out, code=1)
    assert "symbolic link" in r.stderr and "Traceback" not in r.stderr
    assert sorted(os.listdir(victim)) == ["precious.txt"]
    assert (victim / "precious.txt").read_text() == "keep me"
    assert not out.exists()


def _write_parquet(out: Path) -> None:
    t = _table()
    with open_writer(str(out), t.schema, {"k": "v"}) as w:
        w.write(t)


def _write_jsonl(out: Path) -> None:
    t = _table()
    with open_writer(str(out), t.schema, {"k": "v"}) as w:
        w.write(t)


def _write_npy(out: Path) -> None:
    t = _table()
    with open_writer(str(out), t.schema, {"k": "v"}) as w:
        w.write(t)


def _write_atomic(out: Path) -> None:
    write_atomic(str(out), b"new bytes")


def _commit_shard(out: Path) -> None:
    root = out.parent
    manifest = Manifest(config_key="c", job_key="j", config={}, input_options={}, inputs=None, output_format="parquet")
    store = ShardStore(str(root), manifest, {"k": "v"}, str(out))
    store.write(RowsOut(_table()))
    store.commit(3)


# (output name, the names a planted link could take in the old predictable scheme, how it is written)
CASES: list[tuple[str, list[str], Callable[[Path], None]]] = [
    ("o.parquet", [".o.parquet.tmp-{pid}"], _write_parquet),
    ("o.jsonl", [".o.jsonl.tmp-{pid}", ".o.jsonl.meta.json.tmp-{pid}"], _write_jsonl),
    ("o.npy", [".o.npy.tmp-{pid}", ".o.npy.ids.jsonl.tmp-{pid}", ".o.npy.meta.json.tmp-{pid}"], _write_npy),
    ("o.bin", [".o.bin.tmp-{pid}"], _write_atomic),
    ("part-000000.parquet", [".part-000000.parquet.tmp-{pid}"], _commit_shard),
]


@pytest.mark.parametrize(("name", "links", "write"), CASES, ids=[c[0] for c in CASES])
def test_temp_files_never_write_through_a_planted_symlink(
    tmp_path: Path, name: str, links: list[str], write: Callable[[Path], None]
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    for link in links:
        os.symlink(victim, work / link.format(pid=os.getpid()))
    write(work / name)
    assert victim.read_text() == "keep me"
    assert (work / name).is_file() and not (work / name).is_symlink()


def test_output_name_too_long_for_its_sidecars_is_refused_with_the_limit(cli, st_model: Path, tmp_path: Path) -> None:
    out = tmp_path / ("v" * 240 + ".parquet")  # 248 bytes: legal, but OUT.embedcli-index.parquet is not
    r = cli("embed", _corpus(tmp_path), "-m", st_model, "-o", out, code=1)
    assert "248 bytes" in r.stderr and "at most 232 bytes" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["corpus.jsonl"]


def test_a_resumed_shard_store_writes_the_schema_a_fresh_one_writes(tmp_path: Path) -> None:
    """Parquet reads a list column back with `element` children; a resumed run must not write that."""
    import pyarrow.parquet as pq

    def shards(root: Path, resume: bool) -> bytes:
        root.mkdir()
        manifest = Manifest(config_key="c", job_key="j", config={}, input_options={}, inputs=None,
                            output_format="parquet")
        store = ShardStore(str(root), manifest, {"k": "v"}, str(root / "out"))
        store.write(RowsOut(_table()))
        store.commit(3)
        if resume:  # a new process picks the staged work up
            store = ShardStore(str(root), manifest, {"k": "v"}, str(root / "out"))
        store.write(RowsOut(_table()))
        store.commit(6)
        return pq.read_metadata(root / manifest.shards[1].file).metadata[b"ARROW:schema"]

    assert shards(tmp_path / "resumed", True) == shards(tmp_path / "fresh", False)
