"""In-memory inputs of the Python API: checked (usage errors naming the item), then made into the input batches
the CLI's readers make, so the commands' codecs run on them unchanged."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from embedcli.errors import UsageError
from embedcli.io.reader_base import InputBatch
from embedcli.run.source import InputOptions, slice_batch

BATCH_ROWS = InputOptions([]).batch_rows
"""Rows per batch handed to a runner: the CLI readers' batch size."""

SOURCE = "texts"
"""The name an in-memory input has in error messages (`texts row 3 (id 3): ...`)."""


def _items(values: Any, what: str) -> list[Any]:
    """`values` as a non-empty list (a plain string is one item); UsageError otherwise."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise UsageError(f"{what}: give a list, not {type(values).__name__}")
    items = list(values)
    if not items:
        raise UsageError(f"{what} is empty: give at least one")
    return items


def _check_str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise UsageError(f"{what} is {type(value).__name__}, not str: every text must be a string")
    return value


def texts_of(texts: str | Iterable[str], what: str = "texts") -> list[str]:
    """A text or a non-empty list of texts, checked: every item a `str` (UsageError naming the first that is not)."""
    if isinstance(texts, str):
        return [texts]
    return [_check_str(t, f"{what}[{i}]") for i, t in enumerate(_items(texts, what))]


def pairs_of(items: Iterable[Any], what: str = "texts") -> tuple[list[str], list[str] | None]:
    """Texts, or (first, second) text pairs, as (firsts, seconds or None); every item the same kind."""
    if isinstance(items, str):
        return [items], None
    values = _items(items, what)
    if all(isinstance(v, str) for v in values):
        return values, None
    firsts, seconds = [], []
    for i, v in enumerate(values):
        if not isinstance(v, (tuple, list)):
            _check_str(v, f"{what}[{i}]")  # a text among pairs, or not a text at all
            raise UsageError(f"{what}[{i}] is a text among text pairs: give texts (str) or text pairs "
                             "(2-tuples of str), not a mix")
        if len(v) != 2:
            raise UsageError(f"{what}[{i}] is a {type(v).__name__} of {len(v)}: a text pair is 2 texts (first, second)")
        firsts.append(_check_str(v[0], f"{what}[{i}][0]"))
        seconds.append(_check_str(v[1], f"{what}[{i}][1]"))
    return firsts, seconds


def ids_of(ids: Iterable[Any] | None, n: int, what: str = "ids") -> tuple[list[str], pa.DataType]:
    """Row ids as the readers keep them (their string form) and their Arrow type: `ids` (all int or all str,
    one per row), else the rows' positions 0..n-1 (int64)."""
    if ids is None:
        return [str(i) for i in range(n)], pa.int64()
    values = _items(ids, what)
    if len(values) != n:
        raise UsageError(f"{what}: {len(values)} ids for {n} rows; give one id per row")
    ints = [isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values]
    for i, (v, is_int) in enumerate(zip(values, ints, strict=True)):
        if not is_int and not isinstance(v, str):
            raise UsageError(f"{what}[{i}] is {type(v).__name__}: ids are str or int")
    if all(ints):
        return [str(int(v)) for v in values], pa.int64()
    if not any(ints):
        return values, pa.string()
    raise UsageError(f"{what}: a mix of str and int ids; give them one type")


def query_ids_of(queries: str | Sequence[str], query_ids: Iterable[str] | None, n: int) -> list[str]:
    """The ids of `n` queries: `query_ids` (one str each), else 'query' for one query text (as `--query`), else
    their positions."""
    if query_ids is None:
        return ["query"] if isinstance(queries, str) else [str(i) for i in range(n)]
    given = texts_of(query_ids, "query_ids")
    if len(given) != n:
        raise UsageError(f"query_ids: {len(given)} ids for {n} queries; give one id per query")
    return given


def memory_batch(
    texts: list[str], extra: Mapping[str, Sequence[str]] | None = None, ids: Iterable[Any] | None = None, what: str = "ids"
) -> InputBatch:
    """The rows `texts` (with `extra` text columns, e.g. a pair's second text) as one input batch."""
    for name, column in (extra or {}).items():
        if len(column) != len(texts):
            raise UsageError(f"{len(texts)} texts but {len(column)} {name} texts: give one {name} per text")
    row_ids, id_type = ids_of(ids, len(texts), what)
    return InputBatch(source=SOURCE, locations=[f"row {i}" for i in range(len(texts))], ids=row_ids,
                      texts=list(texts), extra_texts={k: list[str | None](v) for k, v in (extra or {}).items()},
                      id_type=id_type)


def batches(batch: InputBatch, rows: int = BATCH_ROWS) -> list[InputBatch]:
    """`batch` cut into batches of at most `rows` rows, in order."""
    return [slice_batch(batch, i, min(i + rows, len(batch))) for i in range(0, len(batch), rows)]
