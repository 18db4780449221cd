"""Where a run's rows come from: `InputOptions`, the re-readable `BatchSource`, and row helpers."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from embedcli.errors import STDIN, InputError, UsageError
from embedcli.io.fingerprint import rereadable
from embedcli.io.parquet_reader import id_type as parquet_id_type
from embedcli.io.parquet_source import read_schema
from embedcli.io.reader_base import id_array, kept_arrays
from embedcli.io.readers import (
    InputBatch,
    count_records,
    detect_format,
    expand_paths,
    input_fingerprints,
    normalize_format,
    read_inputs,
)
from embedcli.io.stdin_head import checking_head
from embedcli.run.flags import RunFlags


@dataclass(frozen=True)
class InputOptions:
    """Where rows come from and which columns matter."""

    paths: list[str]
    text_col: str = "text"
    id_col: str | None = None
    keep_cols: list[str] = field(default_factory=list)
    fmt: str | None = None
    batch_rows: int = 1024
    cr_in_lines: bool = False  # plain text: keep a CR inside a line (run-batch's JSON lines), not a bad row


def null_text_error(batch: Any, i: int, fix: str = "fill or drop the row", text_col: str = "text") -> InputError:
    """The error of row `i`, whose text (`text_col`, or one of its extra text columns) is null, naming the
    column: the one null-text check."""
    col = text_col if batch.texts[i] is None else next(c for c, v in batch.extra_texts.items() if v[i] is None)
    reason = "text is null" if col == "text" else f"text field {col!r} is null"
    return InputError(batch.source, reason, location=batch.locations[i], record_id=batch.ids[i], fix=fix)


def check_texts(batch: Any, text_col: str = "text") -> None:
    """InputError naming the batch's first row with a null text (read from column `text_col`)."""
    for i, text in enumerate(batch.texts):
        if text is None:
            raise null_text_error(batch, i, text_col=text_col)


def subset(batch: Any, idx: np.ndarray) -> Any:
    """The rows `idx` of an input batch, as a batch."""
    if len(idx) == len(batch):
        return batch
    il = idx.tolist()
    numbers = getattr(batch, "numbers", None)
    sources = getattr(batch, "sources", None)
    lines = getattr(batch, "lines", None)
    return InputBatch(
        source=batch.source,
        locations=[batch.locations[i] for i in il],
        ids=[batch.ids[i] for i in il],
        texts=[batch.texts[i] for i in il],
        columns={c: [v[i] for i in il] for c, v in batch.columns.items()},
        extra_texts={c: [v[i] for i in il] for c, v in batch.extra_texts.items()},
        column_types=batch.column_types,  # the reader's types, or kept columns are re-guessed from the rows left
        id_type=id_type_of(batch),
        numbers=[numbers[i] for i in il] if numbers else None,
        lines=[lines[i] for i in il] if lines else None,
        sources=[sources[i] for i in il] if sources else None,
    )


def concat_batches(batches: Sequence[Any]) -> Any:
    """Input batches one after the other, as one batch (rows of several files name each their own)."""
    first = batches[0]
    same = all(b.source == first.source and getattr(b, "sources", None) is None for b in batches)
    sources = None if same else [b.source_of(i) for b in batches for i in range(len(b))]
    numbers = [n for b in batches for n in (b.numbers or [0] * len(b))]
    lines = [n for b in batches for n in (getattr(b, "lines", None) or [0] * len(b))]
    return InputBatch(
        source=first.source,
        locations=[x for b in batches for x in b.locations],
        ids=[x for b in batches for x in b.ids],
        texts=[x for b in batches for x in b.texts],
        columns={c: [x for b in batches for x in b.columns[c]] for c in first.columns},
        extra_texts={c: [x for b in batches for x in b.extra_texts[c]] for c in first.extra_texts},
        column_types={k: v for b in batches for k, v in b.column_types.items()},
        id_type=id_type_of(first),
        numbers=numbers,
        lines=lines,
        sources=sources,
    )


def slice_batch(batch: Any, start: int, stop: int | None = None) -> Any:
    """Rows `[start, stop)` of an input batch."""
    return subset(batch, np.arange(start, len(batch) if stop is None else stop))


def kept_columns(batch: Any, names: Sequence[str]) -> dict[str, Any]:
    """The `--keep-cols` columns of a batch as Arrow arrays."""
    # typed by the reader: a Parquet input's own types, JSONL's first seen (mixed types are bad rows)
    return kept_arrays(batch.columns, names, getattr(batch, "column_types", None))


def id_type_of(batch: Any) -> pa.DataType:
    """The input's id type of a batch (string for batches that carry none)."""
    return getattr(batch, "id_type", None) or pa.string()


def id_column(batch: Any) -> pa.Array:
    """The output's `id` column of a batch: its ids as the input typed them (strings where it has no types)."""
    return id_array(batch.ids, id_type_of(batch))


def refuse_shadowing(columns: Sequence[str], keep_cols: Sequence[str]) -> None:
    """UsageError (exit 2) when a `--keep-cols` column has the name of a column the command writes itself, or is
    named twice (an output cannot hold two columns of one name)."""
    for name in keep_cols:
        if list(keep_cols).count(name) > 1:
            raise UsageError(f"--keep-cols {','.join(keep_cols)}: {name!r} is named twice; name each column once")
        if name in columns:
            raise UsageError(
                f"--keep-cols {name}: the output has its own {name!r} column (it writes {', '.join(columns)}); "
                "a kept column may not replace it: drop it from --keep-cols or rename it in the input"
            )


def with_kept(columns: dict[str, Any], batch: Any, names: Sequence[str]) -> dict[str, Any]:
    """A command's result `columns` of a batch followed by its `--keep-cols` columns (never replacing one)."""
    refuse_shadowing(list(columns), names)
    columns.update(kept_columns(batch, names))
    return columns


def empty_batch(keep_cols: Sequence[str], id_type: pa.DataType | None = None) -> InputBatch:
    """A batch of no rows with the `--keep-cols` columns (for an output's empty shape)."""
    return InputBatch(
        source="",
        locations=[],
        ids=[],
        texts=[],
        columns={c: [] for c in keep_cols},
        extra_texts={},
        id_type=id_type or pa.string(),
    )


@dataclass(frozen=True)
class BatchSource:
    """The inputs of a command, re-readable: the run opens it to fingerprint the inputs, skip committed
    records, collect bad rows and carry rows over (`--incremental`); iterating it yields checked batches."""

    inputs: InputOptions
    extra_text_cols: tuple[str, ...] = ()

    def paths(self) -> list[str]:
        """The input files after glob expansion (InputError when one is missing)."""
        paths = expand_paths(self.inputs.paths)
        fmt = normalize_format(self.inputs.fmt) if self.inputs.fmt else None
        for p in paths:
            detect_format(p, fmt)
        return paths

    def open(
        self,
        paths: Sequence[str] | None = None,
        *,
        batch_rows: int | None = None,
        on_bad_row: Callable[[InputError], None] | None = None,
        batch_chars: int | None = None,
        **run: Any,
    ) -> Any:
        """The raw reader over `paths` (default: all inputs), no row checks; `run`: `read_inputs`' keywords
        of a run (start, stop, cuts, fingerprints, carry_blocks, carry_units)."""
        return read_inputs(
            list(paths) if paths is not None else self.inputs.paths,
            text_col=self.inputs.text_col,
            id_col=self.inputs.id_col,
            keep_cols=self.inputs.keep_cols,
            extra_text_cols=self.extra_text_cols,
            fmt=self.inputs.fmt,
            batch_rows=batch_rows or self.inputs.batch_rows,
            on_bad_row=on_bad_row,
            batch_chars=batch_chars,
            cr_in_lines=self.inputs.cr_in_lines,
            **run,
        )

    def __iter__(self) -> Iterator[Any]:
        for batch in self.open():
            check_texts(batch, self.inputs.text_col)
            yield batch

    def options(self) -> dict[str, Any]:
        """The input options that decide what the output holds."""
        return {
            "text_col": self.inputs.text_col,
            "id_col": self.inputs.id_col,
            "keep_cols": list(self.inputs.keep_cols),
            "extra_text_cols": list(self.extra_text_cols),
            "format": self.inputs.fmt,
        }

    def fingerprints(self, paths: Sequence[str]) -> list[dict[str, Any]] | None:
        """Fingerprints of every input (None when one is stdin: such a run cannot resume)."""
        return input_fingerprints(paths)  # None for stdin, a pipe or a FIFO: never read to fingerprint it

    def kept_types(self, paths: Sequence[str]) -> dict[str, pa.DataType]:
        """The types of the `--keep-cols` columns as the first Parquet input holding each declares them."""
        types: dict[str, pa.DataType] = {}
        for p in paths:
            if p == STDIN or detect_format(p, self.inputs.fmt) != "parquet":
                continue
            try:
                schema = read_schema(p)
            except Exception:  # an unreadable input is the reader's to report, with its row
                continue
            for name in self.inputs.keep_cols:
                if name not in types and name in schema.names and not pa.types.is_null(schema.field(name).type):
                    types[name] = schema.field(name).type
        return types

    def id_type(self, paths: Sequence[str]) -> pa.DataType | None:
        """The run's id type as the first input declares it (a Parquet id column's type, string for CSV, TSV
        and text), or None where only the rows tell (JSONL) or the input cannot be read."""
        if not paths:
            return None
        first = paths[0]
        fmt = detect_format(first, self.inputs.fmt)
        if fmt in ("csv", "tsv", "txt"):
            return pa.string()
        if first == STDIN or fmt != "parquet":
            return None
        try:
            schema = read_schema(first)
        except Exception:  # an unreadable input is the reader's to report
            return None
        name = self.inputs.id_col or "id"
        if name not in schema.names:
            return pa.string()  # default ids, file:row
        return parquet_id_type(schema.field(name).type)

    def total_rows(self, paths: Sequence[str]) -> int | None:
        """Row count of the inputs for an ETA (Parquet metadata, a line count of text files), else None."""
        total = 0
        for p in paths:
            n = count_records(p, self.inputs.fmt)
            if n is None:
                return None
            total += n
        return total


HEAD_FILES = 256
"""Inputs whose heads are read before the model loads; a glob of more leaves the rest to the run, which checks
each file as it opens it (10,000 one-row files spent 2.5 s here, twice the model's start)."""


def check_head(source: BatchSource, flags: RunFlags | None = None) -> None:
    """Before the model loads: read each input (the first `HEAD_FILES`) up to its first record, so a missing
    column, a wrong format or an unreadable file is said now, not after the whole start (~500 MB of model).
    stdin is read up to its first line, kept for the run (`io.stdin_head`); Parquet on stdin is left to the run
    (it is read whole). When the run stops at a bad row (`--on-error fail`, the default) a bad first record is
    said now too; other bad rows are the run's."""
    strict = flags is not None and flags.on_error != "skip"
    for i, path in enumerate(source.paths()):
        if i >= HEAD_FILES and path != STDIN:
            continue
        if path == STDIN:
            if detect_format(path, source.inputs.fmt) == "parquet":
                continue
        elif not rereadable(path):
            continue
        bad: list[InputError] = []
        with checking_head():
            reader = source.open([path], batch_rows=1, on_bad_row=bad.append)
            try:
                first = next(reader, None)
            finally:
                close = getattr(reader, "close", None)
                if close is not None:
                    close()
        if strict and bad and (first is None or not len(first) or _before(bad[0], first)):
            raise bad[0]


def _before(error: InputError, batch: Any) -> bool:
    """Whether a bad row comes before the batch's first record (both located by `line N` / `row N`)."""
    def number(location: str | None) -> int | None:
        parts = (location or "").split()
        return int(parts[1]) if len(parts) == 2 and parts[1].isdigit() else None

    bad_at, first_at = number(error.location), number(batch.locations[0] if batch.locations else None)
    return bad_at is not None and first_at is not None and bad_at < first_at
