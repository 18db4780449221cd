"""Where committed rows go when there is nothing to stage: `-o -` (stdout)."""

from __future__ import annotations

import sys
from typing import Any

from embedcli.errors import STDIN
from embedcli.io.shards import RowsOut, resolve_rows
from embedcli.io.writers import open_writer


class StdoutSink:
    """Rows straight to stdout (`-o -`): no staging, nothing to resume; the `ShardStore` interface."""

    def __init__(self, fmt: str | None, meta: dict[str, str]) -> None:
        self.fmt = fmt
        self.meta = meta
        self.writer: Any = None
        self.schema: Any = None
        self.errors: list[dict[str, Any]] = []
        self.rows = 0
        self.pending_rows = 0
        self.previous: Any = None  # embedcli.io.previous.PreviousOutput: rows taken over from it

    def write(self, out: RowsOut) -> None:
        """Write rows (rows of the previous output read there; no index: stdout keeps none)."""
        table = resolve_rows(out, self.previous, self.schema)
        if table is None:
            return
        if self.writer is None:
            self.schema = table.schema
            self.writer = open_writer(STDIN, table.schema, self.meta, fmt=self.fmt)
        elif not table.schema.equals(self.schema, check_metadata=False):
            table = table.select(self.schema.names).cast(self.schema)
        self.writer.write(table)
        self.rows += table.num_rows
        sys.stdout.flush()  # a pipe reader (`| head`) gets each batch as it is done, not at the end

    def add_errors(self, records: list[dict[str, Any]]) -> None:
        """Keep bad rows for `--errors-file`."""
        self.errors.extend(records)

    @property
    def pending_errors(self) -> list[dict[str, Any]]:
        """Bad rows not yet committed (none: stdout commits nothing)."""
        return []

    def commit(self, records_end: int, end: Any = None, units: str | None = None) -> None:
        """Flush stdout."""
        sys.stdout.flush()

    def abort(self) -> None:
        """Nothing to undo on stdout."""

    def finish(self, empty: Any) -> None:
        """Close the stream (an empty output still gets its header)."""
        if self.writer is None:
            self.writer = open_writer(STDIN, empty.schema, self.meta, fmt=self.fmt)
        self.writer.commit()
