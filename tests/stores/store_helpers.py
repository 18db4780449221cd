"""Synthetic corpora and a small driver that runs a store through its lifecycle the way the run loop will:
resume point, `--incremental` by row keys, commits every few batches, deletes of ids gone, finish."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from embedcli.io.manifest import KEY_CONFIG_KEY
from embedcli.io.shards import row_keys
from embedcli.io.stores import ResumePoint, StoreSchema, open_store
from embedcli.io.stores.present import PresentRows, store_keys
from embedcli.io.vectors import embedding_array

DIMS = 12


@dataclass
class Corpus:
    """Rows of a synthetic input: ids, texts, kept columns (an Arrow table of them)."""

    ids: list[Any]
    texts: list[str]
    kept: pa.Table = field(default_factory=pa.table)
    id_type: pa.DataType = field(default_factory=pa.int64)

    def __len__(self) -> int:
        return len(self.ids)

    def slice(self, start: int, stop: int) -> Corpus:
        return Corpus(self.ids[start:stop], self.texts[start:stop], self.kept.slice(start, stop - start), self.id_type)

    def keys(self) -> np.ndarray:
        return store_keys(row_keys([str(i) for i in self.ids], self.texts), self.kept)

    def job(self) -> str:
        """The job key: the whole input (as a run's input fingerprints are)."""
        payload = [list(map(str, self.ids)), self.texts, self.kept.to_pylist()]
        return hashlib.sha256(json.dumps(payload, default=repr).encode()).hexdigest()[:16]


def corpus(n: int, start: int = 0, id_type: pa.DataType | None = None, kept: pa.Table | None = None) -> Corpus:
    id_type = id_type or pa.int64()
    ids: list[Any] = list(range(start, start + n))
    if pa.types.is_string(id_type):
        ids = [f"doc-{i}" for i in ids]
    return Corpus(ids, [f"text of {i}" for i in ids], kept if kept is not None else pa.table({}), id_type)


def vectors(texts: Sequence[str], precision: str = "float32", dims: int = DIMS) -> np.ndarray:
    """What a model would give for each text (seeded by the text), in `precision`."""
    out = np.empty((len(texts), dims), dtype=np.float32)
    for i, t in enumerate(texts):
        rng = np.random.default_rng(int.from_bytes(hashlib.blake2b(t.encode(), digest_size=8).digest(), "little"))
        v = rng.standard_normal(dims)
        out[i] = v / np.linalg.norm(v)
    if precision == "float16":
        return out.astype(np.float16)
    if precision in ("binary", "ubinary"):
        packed = np.packbits(out > 0, axis=1)
        return (packed.astype(np.int16) - 128).astype(np.int8) if precision == "binary" else packed
    if precision in ("int8", "uint8"):
        q = np.clip(np.round((out + 1) * 127.5), 0, 255).astype(np.uint8)
        return (q.astype(np.int16) - 128).astype(np.int8) if precision == "int8" else q
    return out


def output_table(c: Corpus, precision: str = "float32", dims: int = DIMS) -> pa.Table:
    """The output rows of a corpus as the embed codec writes them: id, embedding, kept columns."""
    columns: dict[str, Any] = {
        "id": pa.array(c.ids, c.id_type),
        "embedding": embedding_array(vectors(c.texts, precision, dims)),
    }
    for name in c.kept.column_names:
        columns[name] = c.kept.column(name)
    return pa.table(columns)


def store_schema(c: Corpus, precision: str = "float32", dims: int = DIMS) -> StoreSchema:
    return StoreSchema.of(output_table(c.slice(0, 0), precision, dims).schema, precision, dims)


def provenance(model: str = "tiny-a", config: str | None = None) -> dict[str, str]:
    return {
        "embedcli.model": model,
        "embedcli.model_hash": hashlib.sha256(model.encode()).hexdigest()[:16],
        "embedcli.config": json.dumps({"command": "embed", "pooling": "mean", "normalize": True}),
        KEY_CONFIG_KEY: config or hashlib.sha256(model.encode()).hexdigest()[:16],
    }


@dataclass
class SyncReport:
    computed: int = 0
    deleted: int = 0
    resumed_from: int = 0
    nothing_to_do: bool = False


def sync(
    url: str,
    c: Corpus,
    *,
    precision: str = "float32",
    dims: int = DIMS,
    incremental: bool = True,
    batch: int = 10,
    commit_every: int = 2,
    model: str = "tiny-a",
    replace: bool = False,
) -> SyncReport:
    """Keep the store at `url` in step with corpus `c` (the loop's part, in phase B)."""
    report = SyncReport()
    store = open_store(url)
    try:
        job = c.job()
        store.begin(store_schema(c, precision, dims), provenance(model), replace=replace)
        point = store.resume_point()
        if point is not None and point.job_key == job and point.complete:
            report.nothing_to_do = True
            return report
        skip = point.records_done if point is not None and point.job_key == job else 0
        report.resumed_from = skip
        present = PresentRows(store.present(), c.id_type)
        done = batches = 0
        for start in range(0, len(c), batch):
            part = c.slice(start, min(start + batch, len(c)))
            ids = pa.array(part.ids, c.id_type)
            if start + len(part) <= skip:  # committed by the run this one resumes: read, not computed
                present.match(ids, None)
                done += len(part)
                continue
            keys = part.keys()
            unchanged = present.match(ids, keys)  # always: it marks the ids still in the input
            if not incremental:
                unchanged[:] = False
            todo = np.nonzero(~unchanged)[0]
            if len(todo):
                table = output_table(part, precision, dims).take(pa.array(todo))
                store.write(table, keys[todo])
                report.computed += len(todo)
            done += len(part)
            batches += 1
            if batches % commit_every == 0:
                store.commit(ResumePoint(job, done))
        gone = present.gone()
        store.delete(gone)
        report.deleted = len(gone)
        store.finish(ResumePoint(job, done, complete=True))
        return report
    finally:
        store.close()


# -- reading a store back, independently of the code under test ------------------------------------


def _parse_vector(text: str) -> np.ndarray:
    return np.asarray(json.loads(text), dtype=np.float32)  # pgvector prints float4s in their shortest form


def read_back(url: str) -> dict[Any, dict[str, Any]]:
    """Every row of a store by id: `embedding` (float64 values or packed bytes), `key` (bytes), kept columns."""
    if url.startswith("lancedb://"):
        import lancedb

        from embedcli.io.stores.url import parse_lance

        t = parse_lance(url)
        table = lancedb.connect(t.directory).open_table(t.table).to_arrow()
        rows: dict[Any, dict[str, Any]] = {}
        for r in table.to_pylist():
            rid = r.pop("id")
            assert rid not in rows, f"duplicate id {rid!r}"
            r["key"] = r.pop("_embedcli_key")
            rows[rid] = r
        return rows
    import psycopg
    from psycopg import sql

    from embedcli.io.stores.url import parse_postgres

    t = parse_postgres(url)
    with psycopg.connect(t.conninfo) as conn:
        cur = conn.execute(sql.SQL("SELECT * FROM {}").format(sql.Identifier(t.table)))
        names = [d.name for d in cur.description]
        rows = {}
        for values in cur.fetchall():
            r = dict(zip(names, values, strict=True))
            rid = r.pop("id")
            assert rid not in rows, f"duplicate id {rid!r}"
            r["key"] = bytes(r.pop("_embedcli_key"))
            emb = r["embedding"]
            r["embedding"] = _parse_vector(emb) if isinstance(emb, str) and emb.startswith("[") else emb
            rows[rid] = r
        return rows


def expected_rows(c: Corpus, precision: str = "float32", dims: int = DIMS) -> dict[Any, dict[str, Any]]:
    """What a store holding corpus `c` reads back as (see `read_back`), computed without the store."""
    vecs = vectors(c.texts, precision, dims)
    raw = c.keys().tobytes()  # bytes(key) of a numpy S16 would drop trailing NULs
    keys = [raw[i * 16 : (i + 1) * 16] for i in range(len(c))]
    kept = c.kept.to_pylist() if c.kept.num_columns else [{} for _ in c.ids]
    return {
        rid: {"embedding": vecs[i], "key": keys[i], **kept[i]}
        for i, rid in enumerate(c.ids)
    }


def assert_same(got: dict[Any, dict[str, Any]], want: dict[Any, dict[str, Any]], precision: str = "float32") -> None:
    """Same ids, keys, kept values and vectors (bit strings for the binary precisions on Postgres)."""
    assert sorted(got, key=str) == sorted(want, key=str)
    for rid, w in want.items():
        g = got[rid]
        assert g["key"] == w["key"], rid
        for name, value in w.items():
            if name in ("embedding", "key"):
                continue
            assert g[name] == value, (rid, name, g[name], value)
        _assert_vector(g["embedding"], w["embedding"], precision)


def _assert_vector(got: Any, want: Any, precision: str) -> None:
    if isinstance(got, str) and isinstance(want, str):
        assert got == want
        return
    want = np.asarray(want)
    if isinstance(got, str):  # Postgres bit(n) as text: '0101...'
        bits = np.unpackbits((want.astype(np.int16) + 128).astype(np.uint8) if precision == "binary" else want)
        assert got == "".join(map(str, bits[: len(got)])), (got, bits)
        return
    np.testing.assert_array_equal(np.asarray(got, dtype=np.float64), want.astype(np.float64))


def killed_session_gone(url: str, timeout: float = 20.0) -> None:
    """Wait until the server has noticed the killed child's connection and ended its session (its table lock goes
    with it): on a loaded machine that takes a moment, and a run opened before is refused as "another run"."""
    import psycopg

    from embedcli.io.stores.url import parse_postgres

    deadline = time.monotonic() + timeout
    with psycopg.connect(parse_postgres(url).conninfo, autocommit=True) as conn:
        while conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'").fetchone() != (0,):
            assert time.monotonic() < deadline, "the killed child's session still holds its lock"
            time.sleep(0.05)
