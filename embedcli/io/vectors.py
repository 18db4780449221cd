"""Vector columns: numpy (rows, dim) arrays as Arrow `fixed_size_list` columns and back."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from embedcli.io.arrow_values import arrow_array, to_numpy

_VECTOR_TYPES: dict[np.dtype[Any], pa.DataType] = {
    np.dtype(np.float32): pa.float32(),
    np.dtype(np.float16): pa.float16(),
    np.dtype(np.float64): pa.float64(),
    np.dtype(np.int8): pa.int8(),
    np.dtype(np.uint8): pa.uint8(),
}


def embedding_type(dim: int, dtype: Any = np.float32) -> pa.DataType:
    """Return `fixed_size_list<dtype>[dim]` for float32/float16/float64/int8/uint8 vectors."""
    np_dtype = np.dtype(dtype)
    if np_dtype not in _VECTOR_TYPES:
        raise TypeError(
            f"unsupported vector dtype {np_dtype}; use one of {', '.join(map(str, _VECTOR_TYPES))}"
        )
    if dim < 1:
        raise ValueError("vector dimension must be at least 1")
    return pa.list_(_VECTOR_TYPES[np_dtype], dim)


def embedding_array(vectors: np.ndarray) -> pa.FixedSizeListArray:
    """Wrap a 2-D (rows, dim) numpy array as a `fixed_size_list<...>[dim]` array, without Python loops."""
    if vectors.ndim != 2:
        raise ValueError(f"expected a 2-D array (rows, dim), got shape {vectors.shape}")
    typ = embedding_type(vectors.shape[1], vectors.dtype)
    flat = np.ascontiguousarray(vectors).reshape(-1)
    return pa.FixedSizeListArray.from_arrays(arrow_array(flat, typ.value_type), type=typ)


def embedding_matrix(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Return a `fixed_size_list` column as a 2-D numpy array (rows, dim); the inverse of embedding_array."""
    t = column.type
    if not pa.types.is_fixed_size_list(t):
        raise TypeError(f"expected a fixed_size_list column, got {t}")
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    dtype = np.dtype(t.value_type.to_pandas_dtype())
    parts = [to_numpy(c.flatten()) for c in chunks if len(c)]
    flat = np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
    return flat.reshape(-1, t.list_size).astype(dtype, copy=False)
