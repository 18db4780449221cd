"""The README's "From Python" block, run as written in a folder holding what it names (tiny checkpoints as
./cross-encoder, ./topic-classifier, ./nli, ./colbert, ./splade, ./ner, ./bge-m3, and vectors.parquet from
`embedcli embed`)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.api.checks import write_rows

REPO = Path(__file__).resolve().parents[2]
MARKER = "<!-- test: api"


def readme_python_block() -> str:
    """The fenced python block right after the marker in README.md, verbatim."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    fence = re.compile(r"[^\n]*\n```python\n(.*?)\n```", re.S).match(text, text.index(MARKER))
    assert fence is not None, f"no ```python block right after {MARKER!r} in README.md"
    return fence.group(1)


def test_readme_python_block_runs(api_model: Callable[[str], Path], cli, tmp_path: Path,  # type: ignore[no-untyped-def]
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    for link, name in (("cross-encoder", "cross-encoder"), ("topic-classifier", "topics"), ("nli", "nli"),
                       ("colbert", "colbert"), ("splade", "splade"), ("ner", "ner"), ("bge-m3", "bge-m3")):
        (tmp_path / link).symlink_to(api_model(name), target_is_directory=True)
    docs = write_rows(tmp_path / "docs.jsonl", [{"id": f"d{i}", "text": t} for i, t in
                                                enumerate(["The striker scored.", "Bank shares fell.", "Rain."])])
    cli("embed", docs, "-o", tmp_path / "vectors.parquet", "--keep-cols", "text", "-q")
    monkeypatch.chdir(tmp_path)
    scope: dict[str, object] = {}
    exec(compile(readme_python_block(), "README.md", "exec"), scope)
    vectors, codes, scores = scope["vectors"], scope["codes"], scope["scores"]
    assert isinstance(vectors, np.ndarray) and vectors.shape == (3, 384) and vectors.dtype == np.float32
    assert isinstance(codes, np.ndarray) and codes.dtype == np.int8 and codes.shape == (3, 384)
    assert isinstance(scores, np.ndarray) and scores.shape == (3,)
    assert scope["hits"].column_names == ["query_id", "rank", "id", "score", "text"]  # type: ignore[attr-defined]
    assert scope["ranked"].column_names == ["query_id", "id", "score", "rank", "text"]  # type: ignore[attr-defined]
    assert scope["ranked"].num_rows == 2  # type: ignore[attr-defined]
    assert scope["labels"].column_names == ["label", "score", "top_labels", "top_scores"]  # type: ignore[attr-defined]
    assert scope["nli"].column_names == ["label", "score", "scores"]  # type: ignore[attr-defined]
    assert scope["sparse"].column_names == ["indices", "values", "tokens"]  # type: ignore[attr-defined]
    assert scope["tags"].column_names == ["token_ids", "labels", "scores"]  # type: ignore[attr-defined]
    assert scope["m3"].column_names == ["embedding", "indices", "values", "token_ids", "embeddings"]  # type: ignore[attr-defined]
    query_vectors = scope["query_vectors"]
    assert isinstance(query_vectors, list) and query_vectors[0].ndim == 2 and query_vectors[0].shape[1] == 12
