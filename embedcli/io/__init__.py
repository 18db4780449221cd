"""File I/O for embedcli: streaming input readers, atomic result writers, the resume manifest and shard
store, and their errors. Files only: never imports torch, a model or a run flag (the layer contracts in
pyproject.toml check it); a caller decides what a path is (`check_output_path(path, as_dir=...)`)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from embedcli.io.errors import InputError, OutputError

if TYPE_CHECKING:
    from embedcli.io.readers import InputBatch, input_fingerprint, read_inputs
    from embedcli.io.writers import (
        JsonlResultWriter,
        NpyResultWriter,
        ParquetResultWriter,
        ResultWriter,
        embedding_array,
        embedding_matrix,
        embedding_type,
        open_writer,
    )

__all__ = [
    "InputBatch",
    "InputError",
    "JsonlResultWriter",
    "NpyResultWriter",
    "OutputError",
    "ParquetResultWriter",
    "ResultWriter",
    "embedding_array",
    "embedding_matrix",
    "embedding_type",
    "input_fingerprint",
    "open_writer",
    "read_inputs",
]

_LAZY = {
    "InputBatch": "readers",
    "input_fingerprint": "readers",
    "read_inputs": "readers",
    "JsonlResultWriter": "writers",
    "NpyResultWriter": "writers",
    "ParquetResultWriter": "writers",
    "ResultWriter": "writers",
    "embedding_array": "writers",
    "embedding_matrix": "writers",
    "embedding_type": "writers",
    "open_writer": "writers",
}


def __getattr__(name: str) -> Any:
    # Keep `import embedcli.io` (errors only) free of pyarrow's start-up cost until a reader/writer is used.
    if name in _LAZY:
        return getattr(importlib.import_module(f"embedcli.io.{_LAZY[name]}"), name)
    raise AttributeError(name)
