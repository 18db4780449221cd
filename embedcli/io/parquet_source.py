"""A Parquet file or object opened for reading: local paths as pyarrow opens them, object URLs through their store."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pyarrow.parquet as pq

from embedcli.io.location import is_url, open_random_access


def read_schema(path: str) -> Any:
    """The Arrow schema of a Parquet file or object (pyarrow's `read_schema`; its errors as they come)."""
    if not is_url(path):
        return pq.read_schema(path)
    with open_random_access(path) as f:
        return pq.read_schema(f)


def schema_metadata(schema: Any) -> dict[str, str] | None:
    """A Parquet schema's embedcli key-value metadata as text (None when it has no `embedcli.` key), as
    `manifest.output_metadata` reads a local output's."""
    raw = schema.metadata or {}
    meta = {k.decode("utf-8", "replace"): v.decode("utf-8", "replace") for k, v in raw.items()}
    return meta if any(k.startswith("embedcli.") for k in meta) else None


@contextlib.contextmanager
def open_parquet(path: str, **options: Any) -> Iterator[pq.ParquetFile]:
    """`pq.ParquetFile(path, **options)`, an object read by ranged requests (its footer, then the column chunks
    asked for), closed on exit."""
    if not is_url(path):
        with pq.ParquetFile(path, **options) as pf:
            yield pf
        return
    with open_random_access(path) as f, pq.ParquetFile(f, **options) as pf:
        yield pf
