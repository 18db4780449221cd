"""Output formats: which one a name or `--output-format` asks for (a leaf, so the manifest can use it)."""

from __future__ import annotations

import os

from embedcli.io.errors import STDIN, OutputError, OutputFormatError

__all__ = ["LINES", "OUTPUT_FORMATS", "output_format"]

OUTPUT_FORMATS: tuple[str, ...] = ("parquet", "jsonl", "npy")
"""Output formats understood by `open_writer`."""
LINES = "lines"
"""A table of one string column written as is, one value per line (run-batch's response lines); a
command asks for it by name (`fmt="lines"`), it is not chosen by extension nor offered by `--output-format`."""

_OUT_EXTENSIONS = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".npy": "npy",
}
_OUT_ALIASES = {"pq": "parquet", "ndjson": "jsonl", "json": "jsonl"}


def output_format(path: str, fmt: str | None = None, *, reading: bool = False) -> str:
    """Return the output format for `path`: `fmt` if given, else by extension (none → parquet; `-` → jsonl).

    Any other extension (`.json`, `.csv`, `.txt`, ...) is refused (OutputFormatError, exit 2) rather than
    given Parquet bytes under a name that promises another format. `reading=True` (an existing output,
    e.g. for inspect or --previous) takes an unknown extension as Parquet instead.
    """
    if fmt is not None:
        name = fmt.strip().lower().lstrip(".")
        name = _OUT_ALIASES.get(name, name)
        if name == LINES:
            return name
        if name not in OUTPUT_FORMATS:
            raise ValueError(f"unknown output format {fmt!r}; choose one of: {', '.join(OUTPUT_FORMATS)}")
        if path == STDIN and name != "jsonl":
            raise OutputError(
                path,
                f"{name} cannot be written to stdout",
                fix="-o - writes JSONL; give a file name for other formats",
            )
        return name
    if path == STDIN:
        return "jsonl"
    ext = os.path.splitext(path)[1].lower()
    if not ext:
        return "parquet"
    if ext not in _OUT_EXTENSIONS:
        if reading:
            return "parquet"
        raise OutputFormatError(
            path,
            f"embedcli cannot write {ext!r} files",
            fix=f"name it {', '.join(sorted(_OUT_EXTENSIONS))}, or pass --output-format {{{','.join(OUTPUT_FORMATS)}}}",
        )
    return _OUT_EXTENSIONS[ext]
