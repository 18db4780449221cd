"""What a store already holds, for a run that keeps it in step: which input rows are unchanged (their key is
there), and which stored ids the input no longer has (to delete)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable

import numpy as np
import pyarrow as pa

from embedcli.io.shards import KEY_WIDTH


class PresentRows:
    """The (id, key) pairs of a store's rows; `match` marks the ids a run reads, `gone` lists the rest."""

    def __init__(self, blocks: Iterable[tuple[pa.Array, np.ndarray]], id_type: pa.DataType | None = None) -> None:
        ids: list[pa.Array] = []
        keys: list[np.ndarray] = []
        for block_ids, block_keys in blocks:
            ids.append(block_ids if id_type is None else block_ids.cast(id_type))
            keys.append(np.asarray(block_keys, dtype=f"S{KEY_WIDTH}"))
        self.id_type = id_type or (ids[0].type if ids else pa.string())
        self.ids = pa.concat_arrays(ids) if ids else pa.array([], self.id_type)
        self.keys = np.concatenate(keys) if keys else np.zeros(0, f"S{KEY_WIDTH}")
        self.seen = np.zeros(len(self.ids), dtype=bool)

    def __len__(self) -> int:
        return len(self.ids)

    def match(self, ids: pa.Array, keys: np.ndarray | None) -> np.ndarray:
        """Mark `ids` as still in the input; True for each row whose (id, key) the store holds already (unchanged:
        nothing to compute or write). `keys` None: mark only (rows an earlier run of this job committed)."""
        n = len(ids)
        if not len(self.ids) or not n:
            return np.zeros(n, dtype=bool)
        import pyarrow.compute as pc  # here: a run writing files imports this module but never matches

        pos = pc.index_in(ids.cast(self.id_type), value_set=self.ids).to_numpy(zero_copy_only=False)
        found = ~np.isnan(pos) if pos.dtype.kind == "f" else np.ones(n, dtype=bool)
        at = np.where(found, np.nan_to_num(pos, nan=0), 0).astype(np.int64)
        self.seen[at[found]] = True
        if keys is None:
            return np.zeros(n, dtype=bool)
        return found & (self.keys[at] == np.asarray(keys, dtype=f"S{KEY_WIDTH}"))

    def gone(self) -> pa.Array:
        """The stored ids no `match` call has named: rows the input no longer has."""
        return self.ids.filter(pa.array(~self.seen))


def store_keys(keys: np.ndarray, kept: pa.Table | None) -> np.ndarray:
    """The key a store keeps per row: the row key (id and texts, `embedcli.io.shards.row_keys`) with the kept
    columns' values folded in, so a row whose kept value changed is written again (a store cannot carry a
    vector over the way a file output does: the row is recomputed). No kept columns: the row keys as they are."""
    if kept is None or not kept.num_columns:
        return keys
    raw = np.ascontiguousarray(keys, dtype=f"S{KEY_WIDTH}").tobytes()
    out = np.empty(len(keys), dtype=f"S{KEY_WIDTH}")
    for i, row in enumerate(kept.to_pylist()):
        h = hashlib.blake2b(raw[i * KEY_WIDTH : (i + 1) * KEY_WIDTH], digest_size=KEY_WIDTH)
        h.update(json.dumps(row, sort_keys=True, default=repr, ensure_ascii=False).encode("utf-8", "surrogatepass"))
        out[i] = h.digest()
    return out
