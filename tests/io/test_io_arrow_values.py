"""`embedcli.io.arrow_values` gives what pyarrow gives (`pa.array`, `to_numpy`, `pq.read_table`), value by value,
error for error, and never imports pandas doing it."""

from __future__ import annotations

import math
import subprocess
import sys
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from embedcli.io.arrow_values import arrow_array, byte_lengths, read_parquet, scattered, to_numpy, value_type

TYPES = [None, pa.string(), pa.large_string(), pa.int64(), pa.int32(), pa.float64(), pa.float32(), pa.bool_(),
         pa.binary()]
VALUES = st.one_of(
    st.none(),
    st.text(max_size=8),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.binary(max_size=4),
)


def _same(got: Any, want: Any) -> None:
    assert got.type.equals(want.type), (got.type, want.type)
    assert len(got) == len(want) and got.null_count == want.null_count
    got.validate(full=True)
    for a, b in zip(got.to_pylist(), want.to_pylist(), strict=True):
        assert (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)) or a == b, (a, b)
        assert type(a) is type(b)


def _outcome(fn: Any) -> tuple[str, Any]:
    try:
        return "ok", fn()
    except Exception as e:  # the very error pa.array raises is part of the contract
        return "error", type(e)


def check(values: Any, type: pa.DataType | None) -> None:
    want = _outcome(lambda: pa.array(values, type=type))
    got = _outcome(lambda: arrow_array(values, type))
    assert got[0] == want[0], (got, want)
    if want[0] == "ok":
        _same(got[1], want[1])
    else:
        assert got[1] is want[1]


@settings(max_examples=300, deadline=None)
@given(values=st.lists(VALUES, max_size=6), type=st.sampled_from(TYPES))
def test_mixed_lists_are_built_as_pa_array_builds_them(values: list[Any], type: pa.DataType | None) -> None:
    check(values, type)


@settings(max_examples=200, deadline=None)
@given(kind=st.sampled_from(["text", "int", "float", "bool"]), data=st.data(), typed=st.booleans())
def test_lists_of_one_kind_with_nulls_are_built_as_pa_array_builds_them(kind: str, data: Any, typed: bool) -> None:
    strategy = {"text": st.text(), "int": st.integers(-(2**63), 2**63 - 1), "float": st.floats(), "bool": st.booleans()}
    values = data.draw(st.lists(st.one_of(st.none(), strategy[kind]), max_size=40))
    type = {"text": pa.string(), "int": pa.int64(), "float": pa.float64(), "bool": pa.bool_()}[kind] if typed else None
    check(values, type)


@pytest.mark.parametrize(
    "values",
    [[], [None], ["é", "日本", "", None, "a\x00b"], ["\ud800"], [2**63], [2**64], [-(2**63) - 1], [True, 1], [1, 1.5],
     ["a", b"b"], [np.str_("x")], [np.int64(3)], [float("nan"), None], [[1, 2]], [{"a": 1}]],
)
@pytest.mark.parametrize("type", TYPES)
def test_edge_lists(values: list[Any], type: pa.DataType | None) -> None:
    check(values, type)


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64", "int8", "uint8", "int64", "int32", "bool"])
@pytest.mark.parametrize("type", [None, pa.float32(), pa.int64()])
def test_numpy_arrays_are_built_as_pa_array_builds_them(dtype: str, type: pa.DataType | None) -> None:
    values = (np.arange(-5, 7) * 1.5).astype(dtype)
    check(values, type)
    check(values[::3], type)  # not contiguous
    check(values.astype(values.dtype.newbyteorder()), type)  # not native


@pytest.mark.parametrize("array", [
    pa.array([1.5, 2.0, float("nan")], pa.float32()),
    pa.array([1, 2, 3, 4], pa.int64()).slice(1, 2),
    pa.array([1, None, 3], pa.int32()),
    pa.array([], pa.float16()),
    pa.array([True, False]),
    pa.chunked_array([[1, 2], [3]], pa.uint8()),
    pa.chunked_array([], pa.float64()),
    pa.array([[1.0, 2.0], [3.0, 4.0]], pa.list_(pa.float32(), 2)).flatten(),
])
def test_to_numpy_is_pyarrows(array: Any) -> None:
    want = array.to_numpy() if isinstance(array, pa.ChunkedArray) else array.to_numpy(zero_copy_only=False)
    got = to_numpy(array)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_read_parquet_is_read_table(tmp_path: Any) -> None:
    table = pa.table({"id": ["a", "b"], "n": [1, 2], "v": [1.5, None]})
    path = tmp_path / "t.parquet"
    pq.write_table(table, path)
    assert read_parquet(str(path)).equals(pq.read_table(path))
    assert read_parquet(str(path), columns=["n"]).equals(pq.read_table(path, columns=["n"]))
    with open(path, "rb") as f:
        assert read_parquet(f).equals(table)


def test_value_type_is_the_inferred_type() -> None:
    for value in ["x", 1, 1.5, True, b"x", [1], None]:
        assert value_type(value).equals(pa.array([value]).type)
    with pytest.raises(OverflowError):
        value_type(2**65)


def test_none_of_it_imports_pandas(tmp_path: Any) -> None:
    code = f"""
import sys
import numpy as np, pyarrow as pa, pyarrow.parquet as pq
from embedcli.io.arrow_values import arrow_array, byte_lengths, read_parquet, scattered, to_numpy, value_type
arrow_array(["a", None]); arrow_array([1, None], pa.int64()); arrow_array([1.5]); arrow_array([True, None])
arrow_array([], pa.string()); arrow_array(np.zeros(3, np.float32)); value_type("x")
to_numpy(pa.chunked_array([arrow_array(np.arange(3))]))
pq.write_table(pa.table({{"a": arrow_array(["x"])}}), {str(tmp_path / "t.parquet")!r})
read_parquet({str(tmp_path / "t.parquet")!r})
print("pandas" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr


@pytest.mark.parametrize("array", [
    pa.array(["ab", None, "ééé", ""]),
    pa.array(["x", "yy", None, "zzzz"], pa.large_string()).slice(1),
    pa.array([b"a", None, b"\x00\x01"], pa.binary()),
    pa.array(["only"]),
    pa.array([], pa.string()),
])
def test_byte_lengths_are_binary_length_with_nulls_as_zero(array: pa.Array) -> None:
    want = [0 if v is None else len(v.encode() if isinstance(v, str) else v) for v in array.to_pylist()]
    assert byte_lengths(array).tolist() == want


@pytest.mark.parametrize(("values", "type"), [
    ([b"k" * 16, b"j" * 16], pa.binary(16)),
    ([3, 70000], pa.int32()),
    ([], pa.int32()),
])
def test_scattered_puts_values_among_nulls(values: list, type: pa.DataType) -> None:
    at = np.asarray([1, 4][: len(values)], np.int64)
    got = scattered(6, at, values, type)
    want = [None] * 6
    for i, v in zip(at, values, strict=True):
        want[int(i)] = v
    assert got.equals(pa.array(want, type))


def test_numpy_booleans_and_fixed_binary_lists_equal_pa_array() -> None:
    mask = np.asarray([True, False, True, True, False, False, False, True, True])
    assert arrow_array(mask).equals(pa.array(mask))
    keys = [b"a" * 16, None, b"b" * 16]
    assert arrow_array(keys, pa.binary(16)).equals(pa.array(keys, pa.binary(16)))
