"""Errors raised by embedcli's input readers and result writers (defined in `embedcli.errors`)."""

from __future__ import annotations

from embedcli.errors import STDIN, InputError, OutputError, display_path

__all__ = ["STDIN", "InputError", "OutputError", "display_path"]
