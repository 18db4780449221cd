"""A Postgres + pgvector table as an output: `postgresql://USER@HOST:PORT/DB?table=NAME` (`Store`).

Layout: the table (`id` primary key, the vector as `vector(N)` / `halfvec(N)` / `bit(N)` by `--precision`, the kept
columns typed from the input, `_embedcli_key bytea`), and one row per table in `embedcli_state` (same schema):
provenance, config key, the resume point (job key, input records committed, complete).

Rows are sent with COPY (binary) into a session-local temp table as they are written; a commit is one
transaction that upserts them into the table (INSERT ... ON CONFLICT (id) DO UPDATE, only rows that
differ), deletes the staged ids and records the resume point. A killed process loses its session, and
with it the temp table and any open transaction: a commit is all or nothing. A session-level advisory lock
keeps a second run off the same table.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from embedcli.errors import OutputError, UsageError
from embedcli.io.manifest import KEY_CONFIG_KEY
from embedcli.io.shards import KEY_WIDTH
from embedcli.io.stores.base import KEY_COLUMN, ResumePoint, StoreSchema
from embedcli.io.stores.pgtypes import OID, PgColumn, encode_vectors, pg_column, vector_ddl
from embedcli.io.stores.url import PostgresTarget

STATE_TABLE = "embedcli_state"
STAGE_TABLE = "embedcli_stage"
GONE_TABLE = "embedcli_gone"
INDEX_OPS = {
    ("vector", "cosine"): "vector_cosine_ops", ("vector", "l2"): "vector_l2_ops", ("vector", "ip"): "vector_ip_ops",
    ("halfvec", "cosine"): "halfvec_cosine_ops", ("halfvec", "l2"): "halfvec_l2_ops",
    ("halfvec", "ip"): "halfvec_ip_ops",
}
CONNECT_FIX = "check the URL, or the PGHOST / PGPORT / PGUSER / PGPASSWORD / PGDATABASE environment"


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError:
        raise UsageError(
            "postgresql:// outputs need psycopg: pip install 'embedcli[postgres]'"
        ) from None
    return psycopg


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


class PostgresStore:
    """See the module docstring."""

    def __init__(self, target: PostgresTarget, connect_timeout: int = 10) -> None:
        psycopg = _psycopg()
        self.target = target
        self._psycopg = psycopg
        self.conn: Any = None
        try:
            self.conn = psycopg.connect(target.conninfo, autocommit=True, connect_timeout=connect_timeout)
        except psycopg.Error as e:
            raise OutputError(self.display, f"cannot connect to Postgres: {_first_line(e)}", fix=CONNECT_FIX) from None
        try:
            schema = target.schema or self.conn.execute("SELECT current_schema()").fetchone()[0]
            if schema is None:
                raise OutputError(
                    self.display, "the connection's search_path names no schema",
                    fix="name one: ?table=SCHEMA.NAME",
                )
            self.schema_name: str = schema
            self._lock()
        except BaseException:
            self.close()
            raise
        self.schema: StoreSchema | None = None
        self._columns: list[PgColumn] = []
        self._vector_oid = 0
        self._vector_kind = ""
        self._staged = 0
        self._gone = 0
        self._temp_made: set[str] = set()

    # -- names ------------------------------------------------------------------------------------
    @property
    def display(self) -> str:
        """The target URL without a password."""
        return self.target.display

    def _ident(self, *names: str) -> Any:
        return self._psycopg.sql.Identifier(*names)

    @property
    def _table(self) -> Any:
        return self._ident(self.schema_name, self.target.table)

    @property
    def _state(self) -> Any:
        return self._ident(self.schema_name, STATE_TABLE)

    def _sql(self, text: str, **parts: Any) -> Any:
        return self._psycopg.sql.SQL(text).format(**parts)

    def _error(self, what: str, error: BaseException, fix: str | None = None) -> OutputError:
        return OutputError(self.display, f"{what}: {_first_line(error)}", fix=fix)

    # -- opening ----------------------------------------------------------------------------------
    def _lock(self) -> None:
        key = f"embedcli:{self.schema_name}.{self.target.table}"
        got = self.conn.execute("SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", [key]).fetchone()[0]
        if not got:
            raise OutputError(
                self.display, "another embedcli run is writing this table right now",
                fix="wait for it to finish (or stop it), then rerun",
            )
        self._lock_key: str | None = key

    def _regclass(self, name: str) -> int | None:
        ident = self._ident(self.schema_name, name).as_string(self.conn)
        row = self.conn.execute("SELECT to_regclass(%s)::oid", [ident]).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def _state_row(self) -> tuple[dict[str, str], ResumePoint | None] | None:
        if self._regclass(STATE_TABLE) is None:
            return None
        row = self.conn.execute(
            self._sql("SELECT provenance, resume FROM {state} WHERE table_name = %s", state=self._state),
            [self.target.table],
        ).fetchone()
        if row is None:
            return None
        provenance = {str(k): str(v) for k, v in (row[0] or {}).items()}
        point = ResumePoint.from_metadata({str(k): str(v) for k, v in row[1].items()}) if row[1] else None
        return provenance, point

    def metadata(self) -> dict[str, str] | None:
        """Provenance and resume point; None when the table does not exist, {} when embedcli did not make it."""
        if self._regclass(self.target.table) is None:
            return None
        state = self._state_row()
        if state is None:
            return {}
        provenance, point = state
        return {**provenance, **(point.metadata() if point else {})}

    def resume_point(self) -> ResumePoint | None:
        """The last committed resume point."""
        if self._regclass(self.target.table) is None:
            return None
        state = self._state_row()
        return None if state is None else state[1]

    # -- begin ------------------------------------------------------------------------------------
    def _vector_schema(self) -> str | None:
        """The schema of the pgvector extension (CREATE EXTENSION when it is not there yet)."""
        row = self.conn.execute(
            "SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace "
            "WHERE e.extname = 'vector'"
        ).fetchone()
        if row is not None:
            return str(row[0])
        try:
            self.conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        except self._psycopg.errors.InsufficientPrivilege as e:
            raise self._error(
                "the pgvector extension is not installed in this database and this user may not install it", e,
                fix="ask the database owner to run CREATE EXTENSION vector",
            ) from None
        except self._psycopg.errors.FeatureNotSupported as e:
            raise self._error("the pgvector extension is not available on this server", e,
                              fix="install pgvector on the server (https://github.com/pgvector/pgvector)") from None
        except self._psycopg.errors.UndefinedFile as e:
            raise self._error("the pgvector extension is not available on this server", e,
                              fix="install pgvector on the server (https://github.com/pgvector/pgvector)") from None
        return self._vector_schema()

    def _plan(self, schema: StoreSchema) -> list[PgColumn]:
        id_col = pg_column(pa.field("id", schema.id_type))
        if id_col.ddl not in ("bigint", "integer", "smallint", "text", "numeric"):
            raise UsageError(f"{self.display}: ids of type {schema.id_type} cannot be a Postgres primary key here")
        type_schema = self._vector_schema() if schema.precision in ("float32", "float16") else None
        if type_schema is None and self.target.index is not None:
            # the HNSW access method and bit_hamming_ops are pgvector's too, whatever the column's type (`bit`)
            self._vector_schema()
        ddl, kind = vector_ddl(schema.precision, schema.dims, type_schema)
        self._vector_kind = kind
        if kind == "bit":
            self._vector_oid = OID["bit"]
        else:
            self._vector_oid = int(self.conn.execute(
                "SELECT t.oid FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace "
                "WHERE t.typname = %s AND n.nspname = %s", [kind, type_schema],
            ).fetchone()[0])
        self._register_raw_dumper(self._vector_oid)
        vector = PgColumn(schema.vector_column, ddl, self._vector_oid, lambda column: [])
        key = PgColumn(KEY_COLUMN, "bytea", OID["bytea"], lambda column: [])
        return [id_col, vector, *(pg_column(f) for f in schema.kept), key]

    def _register_raw_dumper(self, oid: int) -> None:
        """Vectors go out pre-encoded (`encode_vectors`): a binary dumper for their oid that sends bytes as they are."""
        from psycopg.adapt import Dumper
        from psycopg.pq import Format

        class RawDumper(Dumper):
            format = Format.BINARY

            def dump(self, obj: Any) -> Any:
                return obj

        RawDumper.oid = oid
        self.conn.adapters.register_dumper(None, RawDumper)

    def begin(self, schema: StoreSchema, provenance: Mapping[str, str], *, replace: bool = False) -> None:
        """Create the table and its state row (`replace`: drop the table there first), or check the table there:
        made by embedcli with this config (UsageError, exit 2, otherwise) and with these columns (OutputError)."""
        columns = self._plan(schema)
        config = provenance.get(KEY_CONFIG_KEY, "")
        try:
            with self.conn.transaction():
                self.conn.execute(self._sql(
                    "CREATE TABLE IF NOT EXISTS {state} (table_name text PRIMARY KEY, provenance jsonb NOT NULL, "
                    "config_key text NOT NULL, resume jsonb, job_key text, records_done bigint NOT NULL DEFAULT 0, "
                    "complete boolean NOT NULL DEFAULT false, updated_at timestamptz NOT NULL DEFAULT now())",
                    state=self._state,
                ))
                exists = self._regclass(self.target.table) is not None
                if exists and replace:
                    self.conn.execute(self._sql("DROP TABLE {table}", table=self._table))
                    exists = False
                if exists:
                    self._check_existing(columns, config)
                else:
                    self._create(columns, provenance, config)
        except self._psycopg.Error as e:
            raise self._error("cannot create the table", e) from None
        self.schema = schema
        self._columns = columns

    def _check_existing(self, columns: list[PgColumn], config: str) -> None:
        row = self.conn.execute(
            self._sql("SELECT config_key FROM {state} WHERE table_name = %s", state=self._state), [self.target.table]
        ).fetchone()
        if row is None:
            raise UsageError(
                f"{self.display}: the table exists and embedcli did not make it; pass --overwrite to replace it, "
                "or choose another table"
            )
        if row[0] != config:
            raise UsageError(
                f"{self.display} was made with a different config (config key {row[0]} → {config}); "
                "pass --overwrite to replace it, or choose another table"
            )
        have = dict(self.conn.execute(
            "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
            "WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped",
            [self._regclass(self.target.table)],
        ).fetchall())
        for c in columns:
            want, got = _bare(c.ddl), have.get(c.name)
            if got is None or _bare(got) != want:
                raise OutputError(
                    self.display,
                    f"its column {c.name} is {got or 'missing'}, this run writes {want}",
                    fix="pass --overwrite to replace the table, or choose another table",
                )

    def _create(self, columns: list[PgColumn], provenance: Mapping[str, str], config: str) -> None:
        sql = self._psycopg.sql
        defs = [
            sql.SQL("{} {}{}").format(
                self._ident(c.name), sql.SQL(c.ddl),
                sql.SQL(" PRIMARY KEY" if c.name == "id" else (" NOT NULL" if i in (1, len(columns) - 1) else "")),
            )
            for i, c in enumerate(columns)
        ]
        self.conn.execute(sql.SQL("CREATE TABLE {} ({})").format(self._table, sql.SQL(", ").join(defs)))
        self.conn.execute(
            self._sql(
                "INSERT INTO {state} (table_name, provenance, config_key) VALUES (%s, %s, %s) "
                "ON CONFLICT (table_name) DO UPDATE SET provenance = EXCLUDED.provenance, "
                "config_key = EXCLUDED.config_key, resume = NULL, job_key = NULL, records_done = 0, "
                "complete = false, updated_at = now()",
                state=self._state,
            ),
            [self.target.table, json.dumps(dict(provenance), sort_keys=True), config],
        )

    # -- reading ----------------------------------------------------------------------------------
    def present(self, block_rows: int = 65536) -> Iterator[tuple[pa.Array, np.ndarray]]:
        """(ids, keys) of the committed rows, block by block, read on a connection of their own."""
        if self._regclass(self.target.table) is None:
            return
        id_type = self.schema.id_type if self.schema else None
        with self._psycopg.connect(self.target.conninfo) as conn, conn.cursor(name="embedcli_present") as cur:
            cur.itersize = block_rows
            cur.execute(self._sql("SELECT id, {key} FROM {table}", key=self._ident(KEY_COLUMN), table=self._table))
            while rows := cur.fetchmany(block_rows):
                ids = pa.array([r[0] for r in rows], type=id_type)
                keys = np.frombuffer(b"".join(bytes(r[1]) for r in rows), dtype=f"S{KEY_WIDTH}").copy()
                yield ids, keys

    # -- writing ----------------------------------------------------------------------------------
    def _temp(self, name: str, columns: list[PgColumn]) -> None:
        if name in self._temp_made:
            return
        sql = self._psycopg.sql
        defs = sql.SQL(", ").join(sql.SQL("{} {}").format(self._ident(c.name), sql.SQL(c.ddl)) for c in columns)
        self.conn.execute(sql.SQL("CREATE TEMP TABLE IF NOT EXISTS {} ({})").format(self._ident(name), defs))
        self.conn.execute(sql.SQL("TRUNCATE {}").format(self._ident(name)))
        self._temp_made.add(name)

    def _copy(self, name: str, columns: list[PgColumn], values: list[list[Any]]) -> None:
        sql = self._psycopg.sql
        statement = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(
            self._ident(name), sql.SQL(", ").join(self._ident(c.name) for c in columns)
        )
        with self.conn.cursor() as cur, cur.copy(statement) as copy:
            copy.set_types([c.oid for c in columns])
            for row in zip(*values, strict=True):
                copy.write_row(row)

    def write(self, table: pa.Table, keys: np.ndarray) -> None:
        """COPY rows (binary) into the session's staging table; the next commit upserts them."""
        schema = self.schema
        if schema is None:
            raise RuntimeError("write() before begin()")
        if not table.num_rows:
            return
        rows = schema.rows(table, keys)
        from embedcli.io.vectors import embedding_matrix

        matrix = embedding_matrix(rows.column(schema.vector_column))
        try:
            vectors = encode_vectors(matrix, schema.precision, schema.dims)
        except ValueError:
            bad = np.nonzero(~np.isfinite(matrix.astype(np.float32)).all(axis=1))[0][0]
            raise OutputError(
                self.display, f"row id {rows.column('id')[int(bad)].as_py()!r}: its vector has NaN or infinite "
                "values, which pgvector does not store",
            ) from None
        raw = np.ascontiguousarray(keys, dtype=f"S{KEY_WIDTH}").tobytes()  # bytes(k) would drop trailing NULs
        key_values = [raw[i * KEY_WIDTH : (i + 1) * KEY_WIDTH] for i in range(len(keys))]
        values: list[list[Any]] = []
        for c in self._columns:
            if c.name == schema.vector_column:
                values.append(vectors)  # pre-encoded memoryviews: the raw dumper sends them as they are
            elif c.name == KEY_COLUMN:
                values.append(key_values)
            else:
                values.append(c.values(rows.column(c.name).combine_chunks()))
        try:
            self._temp(STAGE_TABLE, self._columns)
            self._copy(STAGE_TABLE, self._columns, values)
        except self._psycopg.Error as e:
            raise self._error("cannot send rows", e) from None
        self._staged += table.num_rows

    def delete(self, ids: pa.Array) -> None:
        """COPY ids into the session's staging table of deletes; the next commit deletes them."""
        if not len(ids) or not self._columns:
            return
        id_col = self._columns[0]
        try:
            self._temp(GONE_TABLE, [id_col])
            self._copy(GONE_TABLE, [id_col], [id_col.values(ids.cast(self.schema.id_type if self.schema else ids.type))])
        except self._psycopg.Error as e:
            raise self._error("cannot send ids to delete", e) from None
        self._gone += len(ids)

    def _upsert(self) -> None:
        sql = self._psycopg.sql
        names = [self._ident(c.name) for c in self._columns]
        rest = names[1:]
        target = self._table
        self.conn.execute(sql.SQL(
            "INSERT INTO {target} AS t ({cols}) SELECT {cols} FROM {stage} "
            "ON CONFLICT (id) DO UPDATE SET ({rest}) = ROW({excluded}) "
            "WHERE ({current}) IS DISTINCT FROM ({excluded})"
        ).format(
            target=target, cols=sql.SQL(", ").join(names), stage=self._ident(STAGE_TABLE),
            rest=sql.SQL(", ").join(rest),
            excluded=sql.SQL(", ").join(sql.SQL("EXCLUDED.{}").format(n) for n in rest),
            current=sql.SQL(", ").join(sql.SQL("t.{}").format(n) for n in rest),
        ))

    def _delete_gone(self) -> None:
        self.conn.execute(self._sql(
            "DELETE FROM {target} t USING {gone} g WHERE t.id = g.id", target=self._table, gone=self._ident(GONE_TABLE)
        ))

    def _save_point(self, point: ResumePoint) -> None:
        self.conn.execute(
            self._sql(
                "UPDATE {state} SET resume = %s, job_key = %s, records_done = %s, complete = %s, updated_at = now() "
                "WHERE table_name = %s",
                state=self._state,
            ),
            [point.to_json(), point.job_key, point.records_done, point.complete, self.target.table],
        )

    def _index(self) -> None:
        if self.target.index is None:
            return
        kind = self._vector_kind
        ops = "bit_hamming_ops" if kind == "bit" else INDEX_OPS[(kind, self.target.metric)]
        name = f"{self.target.table[:40]}_{self.schema.vector_column if self.schema else 'embedding'}_hnsw"
        self.conn.execute(self._sql(
            "CREATE INDEX IF NOT EXISTS {name} ON {table} USING hnsw ({column} {ops})",
            name=self._ident(name), table=self._table,
            column=self._ident(self.schema.vector_column if self.schema else "embedding"),
            ops=self._psycopg.sql.SQL(ops),
        ))

    def _transaction(self, point: ResumePoint, index: bool) -> None:
        if not self._columns:
            raise RuntimeError("commit() before begin()")
        try:
            with self.conn.transaction():
                if self._staged:
                    self._upsert()
                if self._gone:
                    self._delete_gone()
                if index:
                    self._index()
                self._save_point(point)
                for name in sorted(self._temp_made):
                    self.conn.execute(self._psycopg.sql.SQL("TRUNCATE {}").format(self._ident(name)))
        except self._psycopg.errors.ProgramLimitExceeded as e:
            raise self._error("cannot build the index", e,
                              fix="HNSW indexes vector up to 2,000 dims: --precision float16 (halfvec) takes 4,000") from None
        except self._psycopg.Error as e:
            raise self._error("the commit failed (nothing of it was applied)", e) from None
        self._staged = self._gone = 0

    def commit(self, point: ResumePoint) -> None:
        """One transaction: upsert the staged rows, delete the staged ids, record `point`."""
        self._transaction(point, index=False)

    def finish(self, point: ResumePoint) -> None:
        """The last commit, with the HNSW index (`?index=hnsw`) created in the same transaction."""
        self._transaction(point, index=True)

    def abort(self) -> None:
        """Drop the staged rows and ids."""
        self._staged = self._gone = 0
        if self.conn is None or self.conn.closed:
            return
        try:
            for name in sorted(self._temp_made):
                self.conn.execute(self._psycopg.sql.SQL("TRUNCATE {}").format(self._ident(name)))
        except self._psycopg.Error:
            self.close()  # the session is gone or broken: closing drops its temp tables and lock

    def close(self) -> None:
        """Close the session: its temp tables, uncommitted work and advisory lock go with it."""
        if self.conn is None:
            return
        key = getattr(self, "_lock_key", None)
        if key is not None and not self.conn.broken:
            # Released here, not left to the session's end: the server ends a closed session's backend (and its
            # locks) a moment after the client has gone, so a run started right after this one was refused
            # as "another run is writing this table".
            with contextlib.suppress(self._psycopg.Error):
                if self.conn.info.transaction_status != self._psycopg.pq.TransactionStatus.IDLE:
                    self.conn.rollback()
                self.conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", [key])
        self._lock_key = None
        self.conn.close()
        self.conn = None

    def row_count(self) -> int:
        """Rows in the table (0 when it does not exist)."""
        if self._regclass(self.target.table) is None:
            return 0
        return int(self.conn.execute(self._sql("SELECT count(*) FROM {table}", table=self._table)).fetchone()[0])


def _bare(type_name: str) -> str:
    """A type as `format_type()` prints it, without a schema (`public.vector(4)` → `vector(4)`)."""
    head, paren, tail = type_name.partition("(")
    return head.rpartition(".")[2] + paren + tail
