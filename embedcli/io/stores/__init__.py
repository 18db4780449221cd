"""Stores as outputs: LanceDB tables (`lancedb://DIR/TABLE`) and Postgres + pgvector tables
(`postgresql://USER@HOST:PORT/DB?table=NAME`), driven through one lifecycle (`embedcli.io.stores.base.Store`).

LanceDB and psycopg are optional (`pip install 'embedcli[lancedb]'` / `'embedcli[postgres]'`): they are
imported when a store of theirs is opened, and a missing one is a one-line usage error.
"""

from __future__ import annotations

from embedcli.io.stores.base import KEY_COLUMN, ResumePoint, Store, StoreSchema
from embedcli.io.stores.url import LANCE_SCHEME, is_store_url, parse_lance, parse_postgres, redact

__all__ = [
    "KEY_COLUMN",
    "ResumePoint",
    "Store",
    "StoreSchema",
    "is_store_url",
    "open_store",
    "redact",
]


def open_store(url: str) -> Store:
    """Open the store `url` names: connect and take its writer lock (nothing is written until `begin`)."""
    if url.startswith(LANCE_SCHEME):
        from embedcli.io.stores.lance import LanceStore

        return LanceStore(parse_lance(url))
    from embedcli.io.stores.postgres import PostgresStore

    if not is_store_url(url):
        raise ValueError(f"not a store URL: {redact(url)}")
    return PostgresStore(parse_postgres(url))
