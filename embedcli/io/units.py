"""What each input file gave a run (`InputUnits`), kept with the output: a later `--incremental` run carries a
file or Parquet row group of the same identity over whole, without reading it.

Per file (by its index in the run's inputs): the records read and the rows written, the file's identity
(`embedcli.io.readers.InputReader.file_identity`), the readers' state after it, and the same counts and
identity per Parquet row group. A file or row group is carried over only where every record became a row.
The counts of `--shard` slices add up to those of the whole run, so a merged set keeps them too.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

KEY_UNITS = "embedcli.input_units"


class InputUnits:
    """Records, rows, identities and end states of a run's input files and row groups."""

    def __init__(self) -> None:
        self.files: dict[int, dict[str, Any]] = {}

    def _file(self, f: int) -> dict[str, Any]:
        entry = self.files.get(f)
        if entry is None:
            entry = self.files[f] = {"records": 0, "rows": 0, "id": None, "exit": None, "groups": {}}
        return entry

    def add(self, f: int, group: int, records: int, rows: int) -> None:
        """Count `records` read and `rows` written of file `f` (row group `group`, -1 for none)."""
        entry = self._file(f)
        entry["records"] += records
        entry["rows"] += rows
        if group >= 0:
            g = entry["groups"].setdefault(group, [None, 0, 0])
            g[1] += records
            g[2] += rows

    def identify(self, f: int, identity: bytes | None, group: int = -1) -> None:
        """The identity of file `f` (or of its row group `group`)."""
        if identity is None:
            return
        entry = self._file(f)
        if group >= 0:
            entry["groups"].setdefault(group, [None, 0, 0])[0] = identity.hex()
        else:
            entry["id"] = identity.hex()

    def copy_groups(self, f: int, entry: Mapping[str, Any]) -> None:
        """Take the row groups of a file carried over whole from its entry in the previous output's units."""
        self._file(f)["groups"] = {g: list(v) for g, v in entry["groups"].items()}

    def exit(self, f: int, state: Mapping[str, Any]) -> None:
        """The readers' state after file `f`."""
        self._file(f)["exit"] = dict(state)

    def merge(self, other: InputUnits) -> None:
        """Add another slice's counts (identities and end states where this one has none)."""
        for f, entry in other.files.items():
            mine = self._file(f)
            mine["records"] += entry["records"]
            mine["rows"] += entry["rows"]
            mine["id"] = mine["id"] or entry["id"]
            mine["exit"] = mine["exit"] or entry["exit"]
            for g, (ident, records, rows) in entry["groups"].items():
                cur = mine["groups"].setdefault(g, [None, 0, 0])
                cur[0] = cur[0] or ident
                cur[1] += records
                cur[2] += rows

    def to_json(self) -> str:
        """Canonical JSON (end states listed once)."""
        states: list[str] = []
        files = {}
        for f in sorted(self.files):
            entry = self.files[f]
            exit_index = None
            if entry["exit"] is not None:
                text = json.dumps(entry["exit"], sort_keys=True)
                if text not in states:
                    states.append(text)
                exit_index = states.index(text)
            files[str(f)] = [entry["records"], entry["rows"], entry["id"], exit_index,
                             {str(g): entry["groups"][g] for g in sorted(entry["groups"])}]
        return json.dumps({"files": files, "states": [json.loads(s) for s in states]}, sort_keys=True,
                          separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | None) -> InputUnits:
        """`to_json` back (empty when `text` is missing or not one)."""
        units = cls()
        try:
            data = json.loads(text) if text else {}
            states = data.get("states", [])
            for f, (records, rows, ident, exit_index, groups) in data.get("files", {}).items():
                units.files[int(f)] = {
                    "records": int(records), "rows": int(rows), "id": ident,
                    "exit": states[exit_index] if exit_index is not None else None,
                    "groups": {int(g): list(v) for g, v in groups.items()},
                }
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            return cls()
        return units

    def carry_map(self) -> dict[bytes, tuple[int, int, Any]]:
        """Identity -> (first row in the output, rows, readers' state after it or None) of every file and row
        group whose every record became a row."""
        out: dict[bytes, tuple[int, int, Any]] = {}
        row = 0
        for f in range(max(self.files, default=-1) + 1):
            entry = self.files.get(f)
            if entry is None:
                continue
            if entry["id"] and entry["records"] == entry["rows"] and entry["exit"] is not None:
                out[bytes.fromhex(entry["id"])] = (row, entry["rows"], entry["exit"])
            at = row
            for g in sorted(entry["groups"]):
                ident, records, rows = entry["groups"][g]
                if ident and records == rows:
                    out[bytes.fromhex(ident)] = (at, rows, None)
                at += rows
            row += entry["rows"]
        return out


def file_entry(units: InputUnits, identity: bytes) -> dict[str, Any] | None:
    """The entry of the file of `identity`, or None."""
    text = identity.hex()
    return next((e for e in units.files.values() if e["id"] == text), None)


def merged(parts: Iterable[InputUnits]) -> InputUnits:
    """The units of several slices of one run, added up."""
    out = InputUnits()
    for p in parts:
        out.merge(p)
    return out
