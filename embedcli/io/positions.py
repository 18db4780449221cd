"""Where reading stands in a run's inputs: a `ReadPoint`, which a reader can start at or stop before.

A `ReadPoint` is a position between two records of the inputs: the file (its index in the run's inputs), the
byte offset of the next line (a text input) or the next row (Parquet), the lines read before it, and the
reader state a reader needs to go on from there (`state["spec"]`: the run's types so far; `state["file"]`: a
JSON Lines file's id field). The Ray Data engine cuts the inputs into slices between such points and every
worker reads its own slice (`embedcli.run.slices`); the manifest records where each committed shard ends, so a
resumed run seeks there instead of reading the committed records again.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa


@dataclass(frozen=True)
class ReadPoint:
    """A position between two records of a run's inputs (see the module docstring)."""

    file: int = 0
    pos: int = 0  # text: byte offset of the next line; Parquet: the next row
    line: int = 0  # text: lines before `pos` (the next line is line + 1); Parquet: = pos
    skip: int = 0  # records after `pos` already done (kept at 0 by the readers of this module)
    state: Mapping[str, Any] = field(default_factory=dict)  # the readers' state there (JSON values)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view."""
        return {"file": self.file, "pos": self.pos, "line": self.line, "skip": self.skip, "state": dict(self.state)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ReadPoint:
        """Parse `to_dict`'s view (ValueError when it is not one)."""
        try:
            return cls(int(data["file"]), int(data["pos"]), int(data["line"]), int(data.get("skip", 0)),
                       dict(data.get("state") or {}))
        except (KeyError, TypeError) as e:
            raise ValueError(f"not a read point: {e}") from None

    def order(self) -> tuple[int, int, int]:
        """Sort key: earlier points first."""
        return self.file, self.pos, self.skip


def type_state(id_type: pa.DataType | None, kept: Mapping[str, pa.DataType], null_kept: set[str]) -> dict[str, Any]:
    """The readers' types as JSON values (an Arrow schema, base64)."""
    fields = [pa.field("\x00id", id_type)] if id_type is not None else []
    fields += [pa.field(name, t) for name, t in kept.items()]
    raw = pa.schema(fields).serialize().to_pybytes()
    return {"types": base64.b64encode(raw).decode("ascii"), "null_kept": sorted(null_kept)}


def parse_type_state(state: Mapping[str, Any]) -> tuple[pa.DataType | None, dict[str, pa.DataType], set[str]]:
    """`type_state` back: (id type, kept column types, kept columns typed from nulls)."""
    schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(state["types"])))
    id_type = schema.field("\x00id").type if "\x00id" in schema.names else None
    kept = {f.name: f.type for f in schema if f.name != "\x00id"}
    return id_type, kept, set(state.get("null_kept", []))
