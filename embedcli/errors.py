"""Every exception embedcli raises on purpose, each carrying the exit code and label the CLI prints.

The CLI maps them in one place (`embedcli.cli._run`): `embedcli: {label}: {message}` on stderr, then
`exit_code`. The leaves re-export the ones they raise under their old names (`embedcli.io.errors.InputError`,
`embedcli.models.spec.ModelConfigError`, `embedcli.pooling.PoolingConfigError`, ...).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "EXIT_FATAL",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_SKIPPED",
    "EXIT_USAGE",
    "STDIN",
    "ConfigRefusedError",
    "EmbedcliError",
    "InputError",
    "LongInputError",
    "ModelConfigError",
    "ModelNotFoundError",
    "OutputError",
    "OutputFormatError",
    "PoolingConfigError",
    "TooManyErrors",
    "UsageError",
    "display_path",
    "printable",
]

EXIT_OK, EXIT_FATAL, EXIT_USAGE, EXIT_SKIPPED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130

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


class EmbedcliError(Exception):
    """Base of embedcli's own errors: a one-line message, the exit code and the label the CLI prints."""

    exit_code: int = EXIT_FATAL
    label: str = "error"


class UsageError(EmbedcliError, ValueError):
    """Bad or conflicting flags, or a task the model cannot do (exit 2)."""

    exit_code = EXIT_USAGE
    label = "usage error"


class PoolingConfigError(EmbedcliError, ValueError):
    """A pooling configuration or request that cannot be served (exit 2)."""

    exit_code = EXIT_USAGE
    label = "usage error"


class ModelConfigError(EmbedcliError, ValueError):
    """A model folder embedcli cannot serve, with the file at fault and the fix (exit 1)."""


class ConfigRefusedError(ModelConfigError):
    """A model file or flag value embedcli refuses on purpose, naming the file and key (exit 2)."""

    exit_code = EXIT_USAGE


class ModelNotFoundError(EmbedcliError, FileNotFoundError):
    """A model that is neither a folder, in the local hub cache, nor shipped by an installed package (exit 1)."""


class LongInputError(EmbedcliError, ValueError):
    """An input longer than the model's max length under `--long-inputs error` (exit 1)."""

    def __init__(self, index: int, length: int, max_length: int, where: str | None = None) -> None:
        row = where or f"input row {index}"
        super().__init__(
            f"{row} has {length} tokens, more than the model's max length {max_length}; "
            "use --long-inputs truncate or chunk, or shorten it"
        )
        self.where = where
        self.index = index
        self.length = length
        self.max_length = max_length


class InputError(EmbedcliError):
    """A problem with an input file or one of its records, located to the file, line/row and id (exit 1)."""

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


class TooManyErrors(InputError):
    """More bad rows than `--max-errors` allows (exit 1)."""


class OutputError(EmbedcliError):
    """An output location that cannot be written (missing directory, permissions, a directory path) (exit 1)."""

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
    """An output name whose extension promises a format embedcli does not write (a refused flag: exit 2)."""

    exit_code = EXIT_USAGE
