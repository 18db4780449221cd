"""Arrow columns as Postgres columns: the column type a kept column gets, and its values for a binary COPY; the
vector column as pgvector's `vector` / `halfvec` or Postgres's `bit`, encoded in bulk with numpy."""

from __future__ import annotations

import datetime
import decimal
import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from embedcli.errors import UsageError

# Postgres's builtin type oids (pg_type.dat), for COPY ... (FORMAT BINARY).
OID = {
    "boolean": 16, "bytea": 17, "bigint": 20, "smallint": 21, "integer": 23, "text": 25, "jsonb": 3802,
    "real": 700, "double precision": 701, "date": 1082, "time without time zone": 1083,
    "timestamp without time zone": 1114, "timestamp with time zone": 1184, "interval": 1186, "numeric": 1700,
    "bit": 1560,
}
ARRAY_OID = {
    "boolean": 1000, "bytea": 1001, "bigint": 1016, "smallint": 1005, "integer": 1007, "text": 1009,
    "real": 1021, "double precision": 1022, "date": 1182, "timestamp without time zone": 1115,
    "timestamp with time zone": 1185, "numeric": 1231,
}
VECTOR_TYPES = {"float32": "vector", "float16": "halfvec", "binary": "bit", "ubinary": "bit"}
"""The Postgres type of each `--precision` a store takes (pgvector has no int8 vector type)."""


@dataclass(frozen=True)
class PgColumn:
    """A column as created (`ddl`, as `format_type()` prints it back), its COPY type oid, and how an Arrow
    column becomes the Python values psycopg dumps for it."""

    name: str
    ddl: str
    oid: int
    values: Callable[[pa.Array], list[Any]]


def _plain(column: pa.Array) -> list[Any]:
    return column.to_pylist()


def _cast_then(to: pa.DataType) -> Callable[[pa.Array], list[Any]]:
    def values(column: pa.Array) -> list[Any]:
        return pc.cast(column, to, safe=False).to_pylist()

    return values


def _decimals(column: pa.Array) -> list[Any]:
    return [None if v is None else decimal.Decimal(v) for v in column.to_pylist()]


def _json_default(value: Any) -> Any:
    if isinstance(value, (datetime.date, datetime.time, datetime.datetime, datetime.timedelta, decimal.Decimal)):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _jsonb(column: pa.Array) -> list[Any]:
    from psycopg.types.json import Jsonb

    dumps = functools.partial(json.dumps, default=_json_default, ensure_ascii=False)
    return [None if v is None else Jsonb(v, dumps=dumps) for v in column.to_pylist()]


def _scalar(t: pa.DataType) -> tuple[str, Callable[[pa.Array], list[Any]]] | None:
    """The Postgres type of a scalar Arrow type and its values, or None when it has none."""
    if pa.types.is_boolean(t):
        return "boolean", _plain
    if pa.types.is_int8(t) or pa.types.is_int16(t) or pa.types.is_uint8(t):
        return "smallint", _plain
    if pa.types.is_int32(t) or pa.types.is_uint16(t):
        return "integer", _plain
    if pa.types.is_int64(t) or pa.types.is_uint32(t):
        return "bigint", _plain
    if pa.types.is_uint64(t):
        return "numeric", _decimals
    if pa.types.is_float16(t):
        return "real", _cast_then(pa.float32())
    if pa.types.is_float32(t):
        return "real", _plain
    if pa.types.is_float64(t):
        return "double precision", _plain
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "text", _plain
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return "bytea", _plain
    if pa.types.is_date(t):
        return "date", _plain
    if pa.types.is_timestamp(t):
        kind = "timestamp with time zone" if t.tz else "timestamp without time zone"
        return kind, _cast_then(pa.timestamp("us", t.tz))  # Postgres keeps microseconds
    if pa.types.is_time(t):
        return "time without time zone", _cast_then(pa.time64("us"))
    if pa.types.is_duration(t):
        return "interval", _cast_then(pa.duration("us"))
    if pa.types.is_decimal(t):
        return f"numeric({t.precision},{t.scale})", _plain
    return None


def pg_column(field: pa.Field) -> PgColumn:
    """The Postgres column of a kept Arrow column: scalars by type, lists of scalars as arrays, anything else
    (structs, maps, nested lists) as jsonb."""
    t = field.type
    if pa.types.is_dictionary(t):
        inner = pg_column(pa.field(field.name, t.value_type))

        def decoded(column: pa.Array) -> list[Any]:
            return inner.values(column.dictionary_decode())

        return PgColumn(field.name, inner.ddl, inner.oid, decoded)
    if pa.types.is_null(t):
        return PgColumn(field.name, "text", OID["text"], _plain)
    scalar = _scalar(t)
    if scalar is not None:
        ddl, values = scalar
        return PgColumn(field.name, ddl, OID[ddl.split("(")[0]], values)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        element = _scalar(t.value_type)
        if element is not None and element[0] in ARRAY_OID:
            ddl, _ = element
            to = pa.list_(pa.float32()) if pa.types.is_float16(t.value_type) else None
            return PgColumn(field.name, f"{ddl}[]", ARRAY_OID[ddl], _cast_then(to) if to else _plain)
    return PgColumn(field.name, "jsonb", OID["jsonb"], _jsonb)


def vector_ddl(precision: str, dims: int, type_schema: str | None) -> tuple[str, str]:
    """(the column's type as created, its bare type name) for `--precision` and the model's dims."""
    kind = VECTOR_TYPES.get(precision)
    if kind is None:
        raise UsageError(
            f"--precision {precision}: pgvector has no {precision} vector type; a Postgres store takes "
            f"{', '.join(VECTOR_TYPES)} (vector, halfvec, bit)"
        )
    qualified = kind if kind == "bit" or not type_schema else f"{type_schema}.{kind}"
    return f"{qualified}({dims})", kind


def encode_vectors(vectors: np.ndarray, precision: str, dims: int) -> list[memoryview]:
    """The binary COPY values of a `[rows, width]` vector matrix: pgvector's `vector` (int16 dims, int16 0,
    float4s) / `halfvec` (float2s), or `bit(dims)` (int32 bit count, the packed bytes, MSB first)."""
    n = len(vectors)
    if precision in ("float32", "float16"):
        body = np.ascontiguousarray(vectors, dtype=">f4" if precision == "float32" else ">f2")
        if not np.isfinite(body).all():
            raise ValueError("NaN or infinite values")
        header = np.array([dims, 0], dtype=">i2").tobytes()
    else:
        packed = vectors.astype(np.int16) + 128 if precision == "binary" else vectors
        body = np.ascontiguousarray(packed, dtype=np.uint8)
        header = np.array([dims], dtype=">i4").tobytes()
    raw = body.reshape(n, -1).view(np.uint8)
    width = len(header) + raw.shape[1]
    rows = np.empty((n, width), dtype=np.uint8)
    rows[:, : len(header)] = np.frombuffer(header, dtype=np.uint8)
    rows[:, len(header) :] = raw
    flat = memoryview(rows.reshape(-1).tobytes())
    return [flat[i * width : (i + 1) * width] for i in range(n)]
