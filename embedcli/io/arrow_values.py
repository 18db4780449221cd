"""Arrow arrays from Python values and numpy arrays, and Parquet files as tables, without importing pandas.

pyarrow asks "is this a pandas object?" on every `pa.array(...)` (lists and numpy arrays alike, typed or not),
on `pa.scalar` and on `Array.to_numpy`, and the first such question imports pandas wherever it is installed
(`pyarrow.lib._is_array_like` -> `_PandasAPIShim._check_import`): 0.25-0.5 s of a run that never touches
pandas. `Array.from_buffers` asks nothing, so the common cases are built from buffers here: lists of str,
int, float or bool (None as null) and 1-D numeric numpy arrays; anything else goes to `pa.array` unchanged.
The result equals `pa.array`'s (tests/io/test_io_arrow_values.py checks it value by value). `pq.read_table`
goes through `pyarrow.dataset`, whose import imports pandas too: one file is read with `pq.ParquetFile`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

_STRING_MAX_BYTES = 2**31 - 1  # past this `pa.array` gives a chunked array; it still does so

# Python type -> (the Arrow type pa.array infers for it, the numpy dtype holding it).
_SCALARS: dict[type, tuple[pa.DataType, Any]] = {
    int: (pa.int64(), np.int64),
    float: (pa.float64(), np.float64),
    bool: (pa.bool_(), np.bool_),
}


def arrow_array(values: Sequence[Any] | np.ndarray, type: pa.DataType | None = None) -> Any:
    """`pa.array(values, type)`, built from buffers where that gives the same array (see the module docstring)."""
    if isinstance(values, np.ndarray):
        built = _from_numpy(values, type)
    else:
        built = _from_list(values, type)
    return built if built is not None else pa.array(values, type=type)


def read_parquet(source: Any, columns: Sequence[str] | None = None) -> Any:
    """One Parquet file (a path or an open binary file) as a table: `pq.read_table` of a file."""
    with pq.ParquetFile(source) as file:
        return file.read(columns=columns)


def value_type(value: Any) -> pa.DataType:
    """The Arrow type `pa.array([value])` infers (raising as it does for a value Arrow cannot hold)."""
    return arrow_array([value]).type


def to_numpy(array: Any) -> np.ndarray:
    """The values of a numeric Arrow array or chunked array with no nulls as numpy (`to_numpy(zero_copy_only=False)`
    otherwise)."""
    chunks = array.chunks if isinstance(array, pa.ChunkedArray) else [array]
    if all(_plain_numeric(c) for c in chunks):
        parts = [_buffer_view(c) for c in chunks]
        if len(parts) == 1:
            return parts[0]
        if parts:
            return np.concatenate(parts)
        return np.zeros(0, dtype=array.type.to_pandas_dtype())
    return np.asarray(array.to_numpy(zero_copy_only=False))


def _plain_numeric(array: Any) -> bool:
    t = array.type
    return bool(array.null_count == 0 and (pa.types.is_integer(t) or pa.types.is_floating(t)))


def _buffer_view(array: Any) -> np.ndarray:
    dtype = np.dtype(array.type.to_pandas_dtype())
    data = array.buffers()[1]
    if data is None:  # an empty array may carry no data buffer
        return np.zeros(0, dtype=dtype)
    return np.frombuffer(data, dtype=dtype, count=len(array), offset=array.offset * dtype.itemsize)


def _from_numpy(values: np.ndarray, type: pa.DataType | None) -> Any:
    if values.ndim != 1 or values.dtype.kind not in "iuf" or not values.dtype.isnative:
        return None
    arrow_type = pa.from_numpy_dtype(values.dtype)
    if type is not None and not type.equals(arrow_type):
        return None  # a cast: pa.array's rules (safe, overflow) apply
    data = np.ascontiguousarray(values)
    return pa.Array.from_buffers(arrow_type, len(data), [None, pa.py_buffer(data)])


def _from_list(values: Sequence[Any], type: pa.DataType | None) -> Any:
    present = [v for v in values if v is not None]
    if not present:  # pa.array's nulls: of `type`, else of the null type
        return pa.nulls(len(values), type if type is not None else pa.null())
    if isinstance(present[0], str):
        return _strings(values, present) if type is None or pa.types.is_string(type) else None
    kind = present[0].__class__
    if kind not in _SCALARS or any(v.__class__ is not kind for v in present):
        return None  # mixed kinds (int and float, str and bytes...): pa.array's inference and errors decide
    arrow_type, dtype = _SCALARS[kind]
    if type is not None and not type.equals(arrow_type):
        return None
    valid = _validity(values, len(present))
    try:
        data = np.fromiter((0 if v is None else v for v in values), dtype=dtype, count=len(values))
    except OverflowError:
        return None  # an int past int64: pa.array infers uint64 or refuses
    if kind is bool:
        buffer = pa.py_buffer(np.packbits(data, bitorder="little"))
    else:
        buffer = pa.py_buffer(data)
    return pa.Array.from_buffers(arrow_type, len(values), [_bitmap(valid), buffer])


def _strings(values: Sequence[Any], present: list[Any]) -> Any:
    if any(not isinstance(v, str) for v in present):
        return None
    try:
        encoded = [b"" if v is None else v.encode("utf-8") for v in values]
    except UnicodeEncodeError:  # a lone surrogate: pa.array raises its own error
        return None
    lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] > _STRING_MAX_BYTES:
        return None
    buffers = [_bitmap(_validity(values, len(present))), pa.py_buffer(offsets.astype(np.int32)),
               pa.py_buffer(b"".join(encoded))]
    return pa.Array.from_buffers(pa.string(), len(values), buffers)


def _validity(values: Sequence[Any], present: int) -> np.ndarray | None:
    if present == len(values):
        return None
    return np.fromiter((v is not None for v in values), dtype=np.bool_, count=len(values))


def _bitmap(valid: np.ndarray | None) -> Any:
    return None if valid is None else pa.py_buffer(np.packbits(valid, bitorder="little"))
