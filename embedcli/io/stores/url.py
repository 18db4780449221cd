"""Store targets named by URL: `lancedb://DIR/TABLE` and `postgresql://USER@HOST:PORT/DB?table=NAME`."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from embedcli.errors import UsageError

LANCE_SCHEME = "lancedb://"
POSTGRES_SCHEMES = ("postgresql://", "postgres://")
# Query parameters of a Postgres target that are embedcli's, not libpq's.
PG_OWN_PARAMS = ("table", "index", "metric")
INDEX_KINDS = ("hnsw",)
METRICS = ("cosine", "l2", "ip")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]*$")


def is_store_url(target: str) -> bool:
    """Whether `-o target` names a store rather than a file."""
    return target.startswith((LANCE_SCHEME, *POSTGRES_SCHEMES))


@dataclass(frozen=True)
class LanceTarget:
    """`lancedb://DIR/TABLE`: the database folder and the table name."""

    url: str
    directory: str
    table: str

    @property
    def display(self) -> str:
        """As shown to people."""
        return self.url


@dataclass(frozen=True)
class PostgresTarget:
    """`postgresql://...?table=[SCHEMA.]NAME[&index=hnsw][&metric=cosine]`: the libpq connection string (the URL
    without embedcli's parameters; what it leaves out comes from the PG* environment), the table, options."""

    url: str
    conninfo: str
    schema: str | None
    table: str
    index: str | None = None
    metric: str = "cosine"

    @property
    def display(self) -> str:
        """The URL without a password."""
        return redact(self.url)

    @property
    def qualified(self) -> str:
        """`schema.table` or `table` as written."""
        return f"{self.schema}.{self.table}" if self.schema else self.table


def redact(url: str) -> str:
    """`url` with any password replaced by `***` (in the authority and in a `password=` parameter)."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        user, _, host = netloc.rpartition("@")
        if ":" in user:
            netloc = f"{user.split(':', 1)[0]}:***@{host}"
    query = urlencode(
        [(k, "***" if k == "password" else v) for k, v in parse_qsl(parts.query, keep_blank_values=True)],
        quote_via=quote, safe="/:",
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def parse_lance(url: str) -> LanceTarget:
    """`lancedb://DIR/TABLE` (DIR relative to the working directory, or absolute as `lancedb:///abs/DIR/TABLE`)."""
    rest = url[len(LANCE_SCHEME):]
    if "://" in rest:
        raise UsageError(
            f"-o {url}: LanceDB tables in object storage are not supported yet; name a local folder "
            "(lancedb://DIR/TABLE)"
        )
    directory, _, table = rest.rstrip("/").rpartition("/")
    if table.endswith(".lance"):
        table = table[: -len(".lance")]
    if not directory or not table or not _NAME.match(table):
        raise UsageError(
            f"-o {url}: expected lancedb://DIR/TABLE, a folder and a table name of letters, digits and _ "
            "(for example lancedb://./vectors/docs)"
        )
    return LanceTarget(url, os.path.abspath(directory), table)


def parse_postgres(url: str) -> PostgresTarget:
    """`postgresql://USER@HOST:PORT/DB?table=[SCHEMA.]NAME` (libpq's URI; missing parts from PG* variables)."""
    parts = urlsplit(url)
    params = parse_qsl(parts.query, keep_blank_values=True)
    own = {k: v for k, v in params if k in PG_OWN_PARAMS}
    rest = [(k, v) for k, v in params if k not in PG_OWN_PARAMS]
    shown = redact(url)
    name = own.get("table", "")
    schema, _, table = name.rpartition(".")
    if not table or not _NAME.match(table) or (schema and not _NAME.match(schema)):
        raise UsageError(
            f"-o {shown}: name the table with ?table=NAME (or ?table=SCHEMA.NAME): letters, digits and _, "
            "for example postgresql://me@localhost:5432/search?table=docs"
        )
    index = own.get("index") or None
    if index is not None and index not in INDEX_KINDS:
        raise UsageError(f"-o {shown}: index={index} is not one of {', '.join(INDEX_KINDS)}")
    metric = own.get("metric") or "cosine"
    if metric not in METRICS:
        raise UsageError(f"-o {shown}: metric={metric} is not one of {', '.join(METRICS)}")
    query = urlencode(rest, quote_via=quote, safe="/:")
    conninfo = f"postgresql://{parts.netloc}{parts.path or '/'}" + (f"?{query}" if query else "")
    return PostgresTarget(url, conninfo, schema or None, table, index, metric)
