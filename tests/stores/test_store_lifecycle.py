"""The store lifecycle against real stores (LanceDB on disk, Postgres + pgvector on a socket): a load, the
resume point, `--incremental` upserts and deletes, refusals, the writer lock."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pytest

from embedcli.errors import EXIT_USAGE, OutputError, UsageError
from embedcli.io.stores import ResumePoint, open_store
from embedcli.run.incremental import describe_config_change
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

KINDS = ["lance", "postgres"]


@pytest.fixture(params=KINDS)
def url(request: pytest.FixtureRequest) -> Callable[..., str]:
    """A maker of fresh table URLs of each store kind."""
    if request.param == "lance":
        return request.getfixturevalue("lance_url")  # type: ignore[no-any-return]
    return request.getfixturevalue("pg_url")  # type: ignore[no-any-return]


def edited(c: Corpus, changed: range, dropped: range, added: int) -> Corpus:
    """`c` with the texts of rows `changed` edited, rows `dropped` removed and `added` new rows at the end."""
    texts = [t + " (edited)" if i in changed else t for i, t in enumerate(c.texts)]
    keep = [i for i in range(len(c)) if i not in dropped]
    new = corpus(added, start=10_000, id_type=c.id_type)
    return Corpus([c.ids[i] for i in keep] + new.ids, [texts[i] for i in keep] + new.texts, pa.table({}), c.id_type)


def test_load_then_complete(url: Callable[..., str]) -> None:
    target, c = url(), corpus(95)
    report = sync(target, c, batch=10, commit_every=3)
    assert report.computed == 95 and report.deleted == 0
    assert_same(read_back(target), expected_rows(c))
    store = open_store(target)
    try:
        point = store.resume_point()
        assert point == ResumePoint(c.job(), 95, complete=True, run={})
        meta = store.metadata()
        assert meta is not None and meta["embedcli.model"] == "tiny-a" and meta["embedcli.complete"] == "true"
    finally:
        store.close()
    assert sync(target, c).nothing_to_do


def test_incremental_upserts_and_deletes_equal_a_fresh_write(url: Callable[..., str]) -> None:
    target, fresh, c = url(), url(), corpus(120, id_type=pa.string())
    sync(target, c)
    new = edited(c, changed=range(30, 50), dropped=range(80, 90), added=15)
    report = sync(target, new, batch=7)
    assert (report.computed, report.deleted) == (20 + 15, 10)
    sync(fresh, new)
    assert_same(read_back(target), read_back(fresh))
    assert_same(read_back(target), expected_rows(new))


def test_without_incremental_every_row_is_rewritten_and_gone_ids_deleted(url: Callable[..., str]) -> None:
    target, c = url(), corpus(40)
    sync(target, c)
    new = edited(c, changed=range(0, 5), dropped=range(10, 13), added=4)
    report = sync(target, new, incremental=False)
    assert (report.computed, report.deleted) == (len(new), 3)
    assert_same(read_back(target), expected_rows(new))


def test_another_config_is_refused_with_exit_2_naming_it(url: Callable[..., str]) -> None:
    target, c = url(), corpus(12)
    sync(target, c, model="tiny-a")
    store = open_store(target)
    try:
        existing = store.metadata()
        assert existing is not None
        assert "-m/--model: tiny-a → tiny-b" in describe_config_change(existing, provenance("tiny-b"))
        with pytest.raises(UsageError, match="different config") as e:
            store.begin(store_schema(c), provenance("tiny-b"))
        assert e.value.exit_code == EXIT_USAGE
    finally:
        store.close()
    assert_same(read_back(target), expected_rows(c))  # refused: untouched
    sync(target, corpus(5), model="tiny-b", replace=True)  # --overwrite: the table is replaced
    assert_same(read_back(target), expected_rows(corpus(5)))


def test_other_columns_are_refused(url: Callable[..., str]) -> None:
    target = url()
    sync(target, corpus(6))
    store = open_store(target)
    try:
        with pytest.raises(OutputError, match="its column embedding"):
            store.begin(store_schema(corpus(1), dims=16), provenance())
        with pytest.raises(OutputError, match="its column id"):
            store.begin(store_schema(corpus(1, id_type=pa.string())), provenance())
    finally:
        store.close()


def test_a_second_writer_is_refused_while_the_first_holds_the_table(url: Callable[..., str]) -> None:
    target = url()
    first = open_store(target)
    try:
        with pytest.raises(OutputError, match="another embedcli run is writing this table"):
            open_store(target)
    finally:
        first.close()
    open_store(target).close()  # released


def test_abort_drops_what_was_not_committed(url: Callable[..., str]) -> None:
    target, c = url(), corpus(10)
    store = open_store(target)
    try:
        store.begin(store_schema(c), provenance())
        from tests.stores.store_helpers import output_table

        store.write(output_table(c.slice(0, 4)), c.slice(0, 4).keys())
        store.commit(ResumePoint("job", 4))
        store.write(output_table(c.slice(4, 10)), c.slice(4, 10).keys())
        store.delete(pa.array([0, 1], pa.int64()))
        store.abort()
        store.commit(ResumePoint("job", 4))
    finally:
        store.close()
    assert_same(read_back(target), expected_rows(c.slice(0, 4)))


def test_keys_ending_in_zero_bytes_come_back_whole(url: Callable[..., str]) -> None:
    from tests.stores.store_helpers import output_table

    target, c = url(), corpus(3)
    keys = np.array([b"\x01" * 15 + b"\x00", b"\x02" * 8 + b"\x00" * 8, b"\x00" * 16], dtype="S16")
    store = open_store(target)
    try:
        store.begin(store_schema(c), provenance())
        store.write(output_table(c), keys)
        store.commit(ResumePoint("job", 3))
        (_ids, got), = list(store.present())
    finally:
        store.close()
    assert got.tobytes() == keys.tobytes()
    assert sorted(r["key"] for r in read_back(target).values()) == sorted(keys.tobytes()[i * 16 : (i + 1) * 16] for i in range(3))


def test_a_table_embedcli_did_not_make_is_refused_unless_replaced(url: Callable[..., str]) -> None:
    target = url()
    if target.startswith("lancedb://"):
        import lancedb

        from embedcli.io.stores.url import parse_lance

        t = parse_lance(target)
        lancedb.connect(t.directory).create_table(t.table, data=pa.table({"id": [1], "note": ["mine"]}))
    else:
        import psycopg

        from embedcli.io.stores.url import parse_postgres

        t2 = parse_postgres(target)
        with psycopg.connect(t2.conninfo, autocommit=True) as conn:
            conn.execute(f"CREATE TABLE {t2.table} (id bigint PRIMARY KEY, note text)")
    store = open_store(target)
    try:
        assert store.metadata() == {}
        with pytest.raises(UsageError, match="embedcli did not make it; pass --overwrite"):
            store.begin(store_schema(corpus(1)), provenance())
    finally:
        store.close()
    sync(target, corpus(4), replace=True)
    assert_same(read_back(target), expected_rows(corpus(4)))


def test_postgres_connection_from_the_pg_environment(pg_server, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("PGHOST", str(pg_server.socket))
    monkeypatch.setenv("PGUSER", "postgres")
    monkeypatch.setenv("PGDATABASE", "embedcli")
    target = "postgresql:///?table=from_env"
    sync(target, corpus(5))
    assert_same(read_back(target), expected_rows(corpus(5)))


def test_postgres_unreachable_is_an_output_error_without_the_password() -> None:
    pytest.importorskip("psycopg")
    with pytest.raises(OutputError, match="cannot connect to Postgres") as e:
        open_store("postgresql://me:hunter2@/db?host=/nonexistent-socket-dir&table=t")
    assert "hunter2" not in str(e.value) and "PGHOST" in str(e.value)
