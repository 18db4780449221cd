"""What a store keeps, by type: int64 / string ids, kept columns of many Arrow types, each precision a store
takes (and the ones it refuses), read back independently of the code under test."""

from __future__ import annotations

import datetime
import decimal
import itertools
from collections.abc import Callable

import pyarrow as pa
import pytest

from embedcli.errors import EXIT_USAGE, UsageError
from embedcli.io.stores import open_store
from tests.stores.pg_server import PgServer
from tests.stores.store_helpers import (
    Corpus,
    assert_same,
    corpus,
    expected_rows,
    provenance,
    read_back,
    store_schema,
    sync,
)


def kept_table(n: int) -> pa.Table:
    """Kept columns of several Arrow types, with nulls."""
    utc = datetime.timezone.utc
    return pa.table({
        "n32": pa.array([i if i % 5 else None for i in range(n)], pa.int32()),
        "x": pa.array([i / 7 for i in range(n)], pa.float64()),
        "half": pa.array([i / 4 for i in range(n)], pa.float16()),
        "flag": pa.array([i % 2 == 0 for i in range(n)]),
        "title": pa.array([f"tïtle '{i}'" if i % 3 else None for i in range(n)]),
        "day": pa.array([datetime.date(2024, 1, 1) + datetime.timedelta(days=i) for i in range(n)]),
        "at": pa.array([datetime.datetime(2024, 5, 1, 12, 0, i % 60, 123456, tzinfo=utc) for i in range(n)],
                       pa.timestamp("us", tz="UTC")),
        "tags": pa.array([[f"t{i}", "x"] if i % 4 else [] for i in range(n)], pa.list_(pa.string())),
        "price": pa.array([decimal.Decimal(f"{i}.25") for i in range(n)], pa.decimal128(10, 2)),
        "topic": pa.array([("business", "sport")[i % 2] for i in range(n)]).dictionary_encode(),
        "meta": pa.array([{"a": i, "b": f"v{i}"} for i in range(n)], pa.struct([("a", pa.int64()), ("b", pa.string())])),
        "big": pa.array([2**63 + i for i in range(n)], pa.uint64()),
        "blob": pa.array([bytes([i % 256, 0, 255]) for i in range(n)], pa.binary()),
    })


@pytest.mark.parametrize("kind", ["lance", "postgres"])
@pytest.mark.parametrize("id_type", [pa.int64(), pa.string()], ids=str)
def test_kept_columns_and_ids_round_trip(
    kind: str, id_type: pa.DataType, pg_url: Callable[..., str], lance_url: Callable[[], str]
) -> None:
    url = pg_url() if kind == "postgres" else lance_url()
    c = corpus(25, id_type=id_type, kept=kept_table(25))
    sync(url, c, batch=6)
    assert_same(read_back(url), expected_rows(c))


@pytest.mark.parametrize("kind", ["lance", "postgres"])
def test_a_changed_kept_value_is_written_again(kind: str, pg_url: Callable[..., str], lance_url: Callable[[], str]) -> None:
    url = pg_url() if kind == "postgres" else lance_url()
    c = corpus(20, kept=kept_table(20))
    sync(url, c)
    titles = c.kept.column("title").to_pylist()
    titles[3], titles[4], titles[11] = "new title", None, "another"
    changed = Corpus(c.ids, c.texts, c.kept.set_column(c.kept.column_names.index("title"), "title", pa.array(titles)))
    assert sync(url, changed).computed == 3
    assert_same(read_back(url), expected_rows(changed))


@pytest.mark.parametrize("kind", ["lance", "postgres"])
@pytest.mark.parametrize("precision", ["float32", "float16", "binary", "ubinary"])
def test_precisions(kind: str, precision: str, pg_url: Callable[..., str], lance_url: Callable[[], str]) -> None:
    url = pg_url(index="hnsw") if kind == "postgres" else lance_url()
    c = corpus(30)
    sync(url, c, precision=precision, dims=12)  # 12 bits: not a whole number of bytes
    assert_same(read_back(url), expected_rows(c, precision, dims=12), precision)
    new = corpus(30, start=5)  # 5 gone, 5 new, 25 unchanged
    report = sync(url, new, precision=precision, dims=12)
    assert (report.computed, report.deleted) == (5, 5)
    assert_same(read_back(url), expected_rows(new, precision, dims=12), precision)


@pytest.mark.parametrize("precision", ["int8", "uint8"])
def test_int8_vectors_in_lance(precision: str, lance_url: Callable[[], str]) -> None:
    url, c = lance_url(), corpus(20)
    sync(url, c, precision=precision)
    assert_same(read_back(url), expected_rows(c, precision), precision)


@pytest.mark.parametrize("precision", ["int8", "uint8"])
def test_postgres_refuses_int8_vectors(precision: str, pg_url: Callable[..., str]) -> None:
    store = open_store(pg_url())
    try:
        with pytest.raises(UsageError, match=f"--precision {precision}: pgvector has no {precision} vector type") as e:
            store.begin(store_schema(corpus(1), precision), provenance())
        assert e.value.exit_code == EXIT_USAGE
        assert store.metadata() is None  # nothing was created
    finally:
        store.close()


def test_postgres_hnsw_index_is_built_with_the_load(pg_url: Callable[..., str]) -> None:
    import psycopg

    from embedcli.io.stores.url import parse_postgres

    url = pg_url(index="hnsw", metric="ip")
    sync(url, corpus(40))
    target = parse_postgres(url)
    with psycopg.connect(target.conninfo) as conn:
        defs = [r[0] for r in conn.execute("SELECT indexdef FROM pg_indexes WHERE tablename = %s", [target.table])]
    assert any("USING hnsw (embedding vector_ip_ops)" in d for d in defs), defs


_fresh_dbs = itertools.count()


@pytest.mark.parametrize("precision", ["binary", "ubinary", "float32"])
def test_an_hnsw_index_in_a_database_without_pgvector_yet(precision: str, pg_server: PgServer) -> None:
    """`?index=hnsw` creates the pgvector extension whatever the column's type: a binary column is Postgres's own
    `bit`, but its HNSW index (bit_hamming_ops) is pgvector's (a fresh database has no extension yet)."""
    import psycopg

    name = f"fresh_{precision}_{next(_fresh_dbs)}"
    with psycopg.connect(pg_server.dsn("postgres"), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    url = f"{pg_server.dsn(name)}&table=t&index=hnsw"
    c = corpus(10)
    sync(url, c, precision=precision, dims=12)
    assert_same(read_back(url), expected_rows(c, precision, dims=12), precision)
    with psycopg.connect(pg_server.dsn(name)) as conn:
        assert conn.execute("SELECT count(*) FROM pg_indexes WHERE indexdef LIKE '%USING hnsw%'").fetchone() == (1,)
