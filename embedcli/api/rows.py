"""Numpy views of the list columns the API's tables carry (token vectors, sparse indices and values)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from embedcli.io.vectors import embedding_matrix


def ragged(column: Any) -> list[np.ndarray]:
    """One numpy array per row of a list column: `[n_i, d]` for `list<fixed_size_list>` (token vectors), `[n_i]`
    for `list<int32>` / `list<float32>` (token ids, sparse indices and values); a null row gives an empty array."""
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    typ = column.type
    if not (pa.types.is_list(typ) or pa.types.is_large_list(typ)):
        raise TypeError(f"expected a list column, got {typ}")
    out: list[np.ndarray] = []
    for chunk in chunks:
        values = chunk.values  # offsets index into the whole child array, even for a sliced chunk
        flat = embedding_matrix(values) if pa.types.is_fixed_size_list(values.type) else values.to_numpy(zero_copy_only=False)
        offsets = chunk.offsets.to_numpy()
        out.extend(flat[offsets[i] : offsets[i + 1]] for i in range(len(chunk)))
    return out
