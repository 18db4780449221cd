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


def byte_lengths(array: Any) -> np.ndarray:
    """The byte length of each value of a string or binary array (0 for a null), from its offsets."""
    t = array.type
    if pa.types.is_null(t):  # a column of nulls only (a text column none of whose rows has one): no kernel takes it
        return np.zeros(len(array), np.int64)
    if not (pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t) or pa.types.is_large_binary(t)):
        import pyarrow.compute as pc

        return np.nan_to_num(np.asarray(pc.binary_length(array).to_numpy(zero_copy_only=False), np.float64)).astype(np.int64)
    n = len(array)
    wide = pa.types.is_large_string(t) or pa.types.is_large_binary(t)
    offsets = np.frombuffer(array.buffers()[1], np.int64 if wide else np.int32, count=n + 1, offset=array.offset * (8 if wide else 4))
    lengths = np.diff(offsets).astype(np.int64)
    if array.null_count:
        valid = np.unpackbits(np.frombuffer(array.buffers()[0], np.uint8), bitorder="little")[array.offset : array.offset + n]
        lengths[valid == 0] = 0
    return lengths


def _plain_numeric(array: Any) -> bool:
    t = array.type
    return bool(array.null_count == 0 and (pa.types.is_integer(t) or pa.types.is_floating(t)))


def _buffer_view(array: Any) -> np.ndarray:
    dtype = np.dtype(array.type.to_pandas_dtype())
    data = array.buffers()[1]
    if data is None:  # an empty array may carry no data buffer
        return np.zeros(0, dtype=dtype)
    return np.frombuffer(data, dtype=dtype, count=len(array), offset=array.offset * dtype.itemsize)


def valid_mask(array: pa.Array) -> np.ndarray:
    """Which values of `array` are not null (from its validity bitmap)."""
    n = len(array)
    bitmap = array.buffers()[0]
    if bitmap is None or array.null_count == 0:
        return np.ones(n, np.bool_)
    if array.null_count == n:
        return np.zeros(n, np.bool_)
    bits = np.unpackbits(np.frombuffer(bitmap, np.uint8), bitorder="little")
    return bits[array.offset : array.offset + n].astype(np.bool_)


def scattered(n: int, at: np.ndarray, values: Sequence[Any], type: pa.DataType) -> Any:
    """An array of `n` nulls of `type` (fixed-size binary or integer) with `values` at rows `at`."""
    valid = np.zeros(n, np.bool_)
    valid[at] = True
    if pa.types.is_fixed_size_binary(type):
        width = type.byte_width
        data = np.zeros((n, width), np.uint8)
        if len(at):
            data[at] = np.frombuffer(b"".join(values), np.uint8).reshape(len(at), width)
    else:
        data = np.zeros(n, np.dtype(type.to_pandas_dtype()))
        data[at] = np.asarray(values, data.dtype)
    return pa.Array.from_buffers(type, n, [_bitmap(valid), pa.py_buffer(np.ascontiguousarray(data))])


def _from_numpy(values: np.ndarray, type: pa.DataType | None) -> Any:
    if values.ndim == 1 and values.dtype.kind == "b" and (type is None or pa.types.is_boolean(type)):
        return pa.Array.from_buffers(pa.bool_(), len(values), [None, pa.py_buffer(np.packbits(values, bitorder="little"))])
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
    if isinstance(present[0], bytes) and type is not None and pa.types.is_fixed_size_binary(type):
        return _fixed_binary(values, present, type)
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


def _fixed_binary(values: Sequence[Any], present: list[Any], type: pa.DataType) -> Any:
    width = type.byte_width
    if any(v.__class__ is not bytes or len(v) != width for v in present):
        return None  # pa.array's error
    data = b"".join(b"\0" * width if v is None else v for v in values)
    return pa.Array.from_buffers(type, len(values), [_bitmap(_validity(values, len(present))), pa.py_buffer(data)])


def _validity(values: Sequence[Any], present: int) -> np.ndarray | None:
    if present == len(values):
        return None
    return np.fromiter((v is not None for v in values), dtype=np.bool_, count=len(values))


def _bitmap(valid: np.ndarray | None) -> Any:
    return None if valid is None else pa.py_buffer(np.packbits(valid, bitorder="little"))
