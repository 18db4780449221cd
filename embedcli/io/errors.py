"""Errors raised by embedcli's input readers and result writers."""

from __future__ import annotations

from typing import Any

__all__ = ["STDIN", "InputError", "OutputError", "OutputFormatError", "display_path"]

STDIN = "-"
"""The path that means stdin (for inputs) or stdout (for outputs)."""


def display_path(path: str, stream: str = "stdin") -> str:
    """Return the path as shown to users (`-` becomes `<stdin>` or `<stdout>`)."""
    return f"<{stream}>" if path == STDIN else path


class InputError(Exception):
    """A problem with an input file or one of its records, located to the file, line/row and id."""

    def __init__(
        self,
        path: str,
        reason: str,
        *,
        location: str | None = None,
        record_id: str | None = None,
        fix: str | None = None,
    ) -> None:
        self.path = path
        self.reason = reason
        self.location = location
        self.record_id = record_id
        self.fix = fix
        super().__init__(path, reason, location, record_id, fix)

    def __str__(self) -> str:
        where = display_path(self.path)
        if self.location:
            where += f" {self.location}"
        if self.record_id is not None:
            where += f" (id {self.record_id!r})"
        text = f"{where}: {self.reason}"
        if self.fix:
            text += f" — fix: {self.fix}"
        return text

    def to_record(self) -> dict[str, Any]:
        """Return a JSON-ready dict of this error, one line of an `--errors-file`."""
        return {
            "file": display_path(self.path),
            "location": self.location,
            "id": self.record_id,
            "reason": self.reason,
            "fix": self.fix,
        }


class OutputError(Exception):
    """An output location that cannot be written (missing directory, permissions, a directory path)."""

    def __init__(self, path: str, reason: str, *, fix: str | None = None) -> None:
        self.path = path
        self.reason = reason
        self.fix = fix
        super().__init__(path, reason, fix)

    def __str__(self) -> str:
        text = f"cannot write {display_path(self.path, 'stdout')}: {self.reason}"
        if self.fix:
            text += f" — fix: {self.fix}"
        return text


class OutputFormatError(OutputError):
    """An output name whose extension promises a format embedcli does not write (a usage error: exit 2)."""

    exit_code = 2
