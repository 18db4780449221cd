"""Errors raised by embedcli's input readers and result writers."""

from __future__ import annotations

from typing import Any

__all__ = ["STDIN", "InputError", "OutputError", "OutputFormatError", "display_path", "printable"]

STDIN = "-"
"""The path that means stdin (for inputs) or stdout (for outputs)."""


def printable(text: str) -> str:
    """`text` as valid UTF-8: undecodable file-name bytes as `\\xff`, lone surrogates as `\\udc00`."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    try:  # a non-UTF-8 file name, decoded by Python with surrogateescape
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def display_path(path: str, stream: str = "stdin") -> str:
    """Return the path as shown to users (`-` becomes `<stdin>` or `<stdout>`), always valid UTF-8."""
    return f"<{stream}>" if path == STDIN else printable(path)


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
        self.reason = printable(reason)
        self.location = location
        self.record_id = None if record_id is None else printable(record_id)
        self.fix = None if fix is None else printable(fix)
        super().__init__(path, self.reason, location, self.record_id, self.fix)

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
        self.reason = printable(reason)
        self.fix = None if fix is None else printable(fix)
        super().__init__(path, self.reason, self.fix)

    def __str__(self) -> str:
        text = f"cannot write {display_path(self.path, 'stdout')}: {self.reason}"
        if self.fix:
            text += f" — fix: {self.fix}"
        return text


class OutputFormatError(OutputError):
    """An output name whose extension promises a format embedcli does not write (a usage error: exit 2)."""

    exit_code = 2
