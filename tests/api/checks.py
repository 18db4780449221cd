"""What the API tests compare: the CLI's output read back, and tables equal column by column (floats to 1e-6)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def write_rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    """`rows` as a JSONL file."""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def matrix(column: Any) -> np.ndarray:
    """A fixed-size-list column as a numpy matrix."""
    from embedcli.io.vectors import embedding_matrix

    return embedding_matrix(column)


def assert_rows_equal(got: pa.Table, want: pa.Table, close: tuple[str, ...] = ("score",), atol: float = 1e-6) -> None:
    """`got` has `want`'s columns, in order, of the same types; `close` columns within `atol` (float32), every
    other column equal."""
    assert got.column_names == want.column_names, (got.column_names, want.column_names)
    assert got.schema.equals(want.schema), (got.schema, want.schema)
    assert got.num_rows == want.num_rows
    for name in want.column_names:
        if name in close:
            a = _floats(got.column(name))
            b = _floats(want.column(name))
            assert len(a) == len(b)
            for x, y in zip(a, b, strict=True):
                assert x.shape == y.shape
                if x.size:
                    assert float(np.abs(x - y).max()) <= atol, f"{name}: max |delta| {np.abs(x - y).max():.2e}"
        else:
            assert got.column(name).to_pylist() == want.column(name).to_pylist(), name


def _floats(column: Any) -> list[np.ndarray]:
    """Per row, the float values of a score column: a number, a vector, a list of numbers or of vectors."""
    typ = column.type
    if pa.types.is_floating(typ):
        return [np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.float64)]
    if pa.types.is_fixed_size_list(typ):
        return [matrix(column).astype(np.float64)]
    from embedcli.api import ragged

    return [np.asarray(r, dtype=np.float64) for r in ragged(column)]


def read_output(path: Path) -> pa.Table:
    """The CLI's Parquet output, without its key-value metadata."""
    return pq.read_table(path).replace_schema_metadata(None)
