"""The Python API: `Embedder` runs each command over in-memory texts, on the same runner builder as the CLI."""

from __future__ import annotations

from embedcli.api.embedder import Embedder
from embedcli.api.rows import ragged

__all__ = ["Embedder", "ragged"]
