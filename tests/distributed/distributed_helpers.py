"""Helpers of the distributed tests: corpora and reading outputs back."""

from __future__ import annotations

import json
import random
from pathlib import Path

WORDS = "the of and to in market shares rise bank film album award quick brown fox jumps lazy dog".split()


def write_corpus(path: Path, n: int, seed: int = 0, bad_at: int | None = None) -> Path:
    """`n` JSONL rows {"id", "text"}; with `bad_at`, the row there has a null text (id "bad")."""
    rng = random.Random(seed)
    with path.open("w", encoding="utf-8") as f:
        for i in range(n):
            row = {"id": f"d{i}", "text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 25)))}
            if i == bad_at:
                row = {"id": "bad", "text": None}
            f.write(json.dumps(row) + "\n")
    return path


def vectors(path: Path):  # type: ignore[no-untyped-def]
    """(ids, embedding matrix, metadata) of a Parquet output."""
    import numpy as np
    import pyarrow.parquet as pq

    t = pq.read_table(path)
    emb = np.asarray(t.column("embedding").combine_chunks().flatten()).reshape(t.num_rows, -1)
    meta = {k.decode(): v.decode() for k, v in (t.schema.metadata or {}).items()}
    return t.column("id").to_pylist(), emb, meta
