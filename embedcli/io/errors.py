"""Errors raised by embedcli's input readers and result writers (defined in `embedcli.errors`)."""

from __future__ import annotations

from embedcli.errors import STDIN, InputError, OutputError, OutputFormatError, display_path, printable

__all__ = ["STDIN", "InputError", "OutputError", "OutputFormatError", "display_path", "printable"]
