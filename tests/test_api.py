"""`embedcli.Embedder` builds its runner as the CLI does: same vectors, the model's default prompt included."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

TEXTS = ["The bank raised rates.", "a film award", "  shares rose  "]


@pytest.fixture(scope="module")
def prompted_model(tiny_model: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model saved by sentence-transformers with prompts and a default prompt name."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    torch.manual_seed(3)
    transformer = Transformer(str(tiny_model("bert")), max_seq_length=64)
    modules = [transformer, Pooling(transformer.get_embedding_dimension(), "mean"), Normalize()]
    model = SentenceTransformer(
        modules=modules, device="cpu", prompts={"query": "query: ", "doc": "passage: "}, default_prompt_name="query"
    )
    folder = tmp_path_factory.mktemp("prompted") / "model"
    model.save(str(folder))
    return folder


def test_embedder_applies_the_default_prompt_like_the_cli(cli, prompted_model: Path, tmp_path: Path) -> None:
    from sentence_transformers import SentenceTransformer

    from embedcli import Embedder

    src = tmp_path / "in.txt"
    src.write_text("".join(t + "\n" for t in TEXTS), encoding="utf-8")
    out = tmp_path / "out.parquet"
    cli("embed", src, "-m", prompted_model, "-o", out, "-q")
    table = pq.read_table(out)
    from_cli = np.asarray(table.column("embedding").to_pylist(), dtype=np.float32)
    got = Embedder(str(prompted_model), device="cpu", dtype="float32").embed(TEXTS)
    assert np.abs(got - from_cli).max() <= 1e-6
    # the oracle: sentence-transformers encodes with its default prompt too
    reference = SentenceTransformer(str(prompted_model), device="cpu").encode(TEXTS, convert_to_numpy=True)
    assert np.abs(got - reference).max() <= 1e-5
    unprompted = Embedder(str(prompted_model), device="cpu", dtype="float32", prompt="").embed(TEXTS)
    assert np.abs(unprompted - got).max() > 1e-3  # the prompt changes the vectors: the check above is not vacuous
