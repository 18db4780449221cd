"""The result-writer protocol: write batches to a temp file, `commit()` renames it into place."""

from __future__ import annotations

import abc
import json
from collections.abc import Mapping
from types import TracebackType
from typing import Any, TypeAlias

import pyarrow as pa

from embedcli.io.commit import (
    os_error,
)

BatchLike: TypeAlias = "pa.RecordBatch | pa.Table"


def _str_metadata(metadata: Mapping[str, Any] | None) -> dict[str, str]:
    """Metadata values as strings: strings as-is, anything else JSON-encoded."""
    return {
        str(k): v if isinstance(v, str) else json.dumps(v, sort_keys=True)
        for k, v in (metadata or {}).items()
    }


def _as_table(batch: BatchLike) -> pa.Table:
    if isinstance(batch, pa.Table):
        return batch
    if isinstance(batch, pa.RecordBatch):
        return pa.Table.from_batches([batch])
    raise TypeError(f"expected a pyarrow RecordBatch or Table, got {type(batch).__name__}")


# --------------------------------------------------------------------------------------------------
# Base class


class ResultWriter(abc.ABC):
    """Writes result batches to a staging file; `commit()` renames it into place, `abort()` deletes it."""

    format: str = ""

    def __init__(self, path: str, metadata: Mapping[str, Any] | None) -> None:
        self.path = path
        self.metadata = _str_metadata(metadata)
        self.rows_written = 0
        self._state = "open"

    @property
    def state(self) -> str:
        """Return "open", "committed" or "aborted"."""
        return self._state

    def write(self, batch: BatchLike) -> None:
        """Append the rows of a RecordBatch or Table."""
        if self._state != "open":
            raise ValueError(f"the writer for {self.path} is {self._state}")
        table = _as_table(batch)
        try:
            self._write(table)
        except OSError as e:
            raise os_error(self.path, e) from None
        self.rows_written += table.num_rows

    def commit(self) -> None:
        """Finish the file and move it onto its final path atomically (idempotent)."""
        if self._state == "committed":
            return
        if self._state == "aborted":
            raise ValueError(f"the writer for {self.path} was aborted")
        try:
            self._commit()
        except OSError as e:
            self.abort()
            raise os_error(self.path, e) from None
        except BaseException:
            self.abort()
            raise
        self._state = "committed"

    def close(self) -> None:
        """Same as commit()."""
        self.commit()

    def abort(self) -> None:
        """Drop everything written so far; the final path is left as it was (idempotent)."""
        if self._state != "open":
            return
        self._state = "aborted"
        self._abort()

    def __enter__(self) -> ResultWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()

    @abc.abstractmethod
    def _write(self, table: pa.Table) -> None: ...

    @abc.abstractmethod
    def _commit(self) -> None: ...

    @abc.abstractmethod
    def _abort(self) -> None: ...

