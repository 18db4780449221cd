"""SPLADE sparse vectors: `sparse-embed`, sparse `score` / `rerank`, and the chunked pooler.

Oracle: sentence-transformers 6's SparseEncoder loading the checkpoint it saved itself (MLMTransformer +
SpladePooling); the pooler's own tests use an independent float64 computation per sequence.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

TEXTS = [
    "hello",
    "the quick brown fox jumps over the lazy dog",
    "market shares rise after bank talks",
    " ".join(["the film won best album award in the uk chart"] * 3),
    "zzz",
    "a b c d e f g h i j k l m n o p q r s t u v w x y z 1 2 3 4 5 6 7 8 9 0",
]


@pytest.fixture(scope="module")
def splade_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tests.fixtures.tiny_families import build_splade

    root = tmp_path_factory.mktemp("splade")
    return {
        "max": build_splade(root, "max"),
        "sum": build_splade(root, "sum"),
        "max-log1p_relu": build_splade(root, "max", "log1p_relu"),
    }


@pytest.fixture(scope="module")
def texts_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("splade_in") / "texts.jsonl"
    path.write_text("".join(json.dumps({"id": f"t{i}", "text": t}) + "\n" for i, t in enumerate(TEXTS)), encoding="utf-8")
    return path


def _oracle(folder: Path, texts: list[str], top_k: int | None = None) -> np.ndarray:
    from sentence_transformers import SparseEncoder

    encoder = SparseEncoder(str(folder), device="cpu")
    dense = encoder.encode(texts, convert_to_tensor=True, max_active_dims=top_k)
    return dense.to_dense().double().numpy()


def _rows(path: Path) -> list[dict]:
    return pq.read_table(path).to_pylist()


def _assert_matches(rows: list[dict], want: np.ndarray) -> None:
    assert len(rows) == len(want)
    for row, ref in zip(rows, want, strict=True):
        indices = np.asarray(row["indices"])
        assert np.all(np.diff(indices) > 0), "indices must be sorted and unique"
        np.testing.assert_array_equal(indices, np.flatnonzero(ref))  # the same non-zero set
        np.testing.assert_allclose(row["values"], ref[indices], rtol=0, atol=1e-5)


@pytest.mark.parametrize("variant", ["max", "sum", "max-log1p_relu"])
@pytest.mark.parametrize("budget", [1, 4096])  # 1: every row in a forward of its own; 4096: all rows packed
def test_sparse_embed_equals_sparse_encoder(cli, splade_models, texts_file, tmp_path, variant, budget) -> None:
    out = tmp_path / "s.parquet"
    cli("sparse-embed", texts_file, "-m", splade_models[variant], "--max-batch-tokens", budget, "-o", out, "-q")
    _assert_matches(_rows(out), _oracle(splade_models[variant], TEXTS))


@pytest.mark.parametrize("budget", [1, 4096])
def test_sparse_top_k_equals_max_active_dims(cli, splade_models, texts_file, tmp_path, budget) -> None:
    out = tmp_path / "k.parquet"
    cli("sparse-embed", texts_file, "-m", splade_models["max"], "--sparse-top-k", 7, "--max-batch-tokens", budget,
        "-o", out, "-q")
    rows = _rows(out)
    assert all(len(r["indices"]) == 7 for r in rows)
    _assert_matches(rows, _oracle(splade_models["max"], TEXTS, top_k=7))


def test_output_types_tokens_and_duckdb(cli, splade_models, texts_file, tmp_path) -> None:
    out = tmp_path / "t.parquet"
    cli("sparse-embed", texts_file, "-m", splade_models["max"], "--with-tokens", "-o", out, "-q")
    schema = pq.read_schema(out)
    assert schema.field("indices").type == pa.list_(pa.int32())
    assert schema.field("values").type == pa.list_(pa.float32())
    assert schema.field("tokens").type == pa.list_(pa.string())
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(splade_models["max"]))
    for row in _rows(out):
        assert row["tokens"] == tok.convert_ids_to_tokens(row["indices"])
    duckdb = pytest.importorskip("duckdb")
    ((n, total, typ),) = duckdb.sql(
        f"select count(*), sum(len(indices)), any_value(typeof(indices)) from '{out}'"
    ).fetchall()
    assert n == len(TEXTS) and total == sum(len(r["indices"]) for r in _rows(out)) and typ == "INTEGER[]"


def test_precision_and_embed_are_refused(cli, splade_models, texts_file, tmp_path) -> None:
    result = cli("sparse-embed", texts_file, "-m", splade_models["max"], "--precision", "int8",
                 "-o", tmp_path / "p.parquet", code=2)
    assert "--precision" in result.stderr
    result = cli("embed", texts_file, "-m", splade_models["max"], "-o", tmp_path / "e.parquet", code=2)
    assert "sparse-embed" in result.stderr
    result = cli("sparse-embed", texts_file, "-m", splade_models["max"], "-o", tmp_path / "e.npy", code=2)
    assert ".npy" in result.stderr


def test_score_and_rerank_use_the_sparse_dot_product(cli, splade_models, tmp_path) -> None:
    from sentence_transformers import SparseEncoder

    folder = splade_models["max"]
    pairs = [(TEXTS[i], TEXTS[(i + 1) % len(TEXTS)]) for i in range(len(TEXTS))]
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps({"id": str(i), "left": a, "right": b}) + "\n" for i, (a, b) in enumerate(pairs)),
                    encoding="utf-8")
    cli("score", path, "-m", folder, "-o", tmp_path / "s.parquet", "-q")
    encoder = SparseEncoder(str(folder), device="cpu")
    q = encoder.encode_query([a for a, _ in pairs], convert_to_tensor=True)
    d = encoder.encode_document([b for _, b in pairs], convert_to_tensor=True)
    want = encoder.similarity_pairwise(q, d).double().numpy()
    got = [r["score"] for r in _rows(tmp_path / "s.parquet")]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)

    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(TEXTS)), encoding="utf-8")
    cli("rerank", docs, "-m", folder, "--query", "the film won", "-o", tmp_path / "r.parquet", "-q")
    sims = encoder.similarity(encoder.encode_query(["the film won"], convert_to_tensor=True),
                              encoder.encode_document(TEXTS, convert_to_tensor=True))[0].double().numpy()
    rows = _rows(tmp_path / "r.parquet")
    assert [r["id"] for r in rows] == [f"d{i}" for i in np.argsort(-sims, kind="stable")]
    np.testing.assert_allclose([r["score"] for r in rows], np.sort(sims)[::-1], rtol=1e-5, atol=1e-4)


# -- the pooler on its own ------------------------------------------------------------------------------
def _reference(hidden: torch.Tensor, head: torch.nn.Module, lengths: list[int], reduce: str) -> list[np.ndarray]:
    """Per sequence, float64: log1p(relu(head(h))) reduced over its tokens — no chunks, no packing."""
    import copy

    out, start = [], 0
    head64 = copy.deepcopy(head).double()
    for n in lengths:
        act = torch.log1p(torch.relu(head64(hidden[start : start + n].double())))
        out.append((act.amax(0) if reduce == "max" else act.sum(0)).numpy() if n else np.zeros(act.shape[-1]))
        start += n
    return out


@pytest.mark.parametrize("reduce", ["max", "sum"])
@pytest.mark.parametrize("chunk", [1, 3, 7, 128, 10_000])
@torch.inference_mode()
def test_pooler_chunks_straddling_sequences_equal_the_unchunked_reference(reduce, chunk) -> None:
    from embedcli.pooling import PoolingMetadata, PoolingParams, SpladePooler

    torch.manual_seed(0)
    lengths = [5, 1, 12, 0, 9, 3]
    head = torch.nn.Linear(16, 50)
    hidden = torch.randn(sum(lengths), 16)
    pooler = SpladePooler(head, reduce=reduce, chunk_tokens=chunk)  # type: ignore[arg-type]
    cu = np.concatenate([[0], np.cumsum(lengths)])
    params = [PoolingParams().verify("sparse_embed") for _ in lengths]
    got = pooler(hidden, PoolingMetadata.from_cu_seqlens(torch.from_numpy(cu), params))
    want = _reference(hidden, head, lengths, reduce)
    assert len(got) == len(lengths)
    for (indices, values), ref in zip(got, want, strict=True):
        np.testing.assert_array_equal(indices.numpy(), np.flatnonzero(ref))
        np.testing.assert_allclose(values.numpy(), ref[indices.numpy()], rtol=0, atol=1e-5)


def test_a_256_token_batch_never_holds_tokens_by_vocab_logits_at_once(splade_models) -> None:
    """The MLM head (the only producer of [tokens, vocab] tensors) sees at most the chunk size per call."""
    from embedcli.compute.runner import Runner, RunnerOptions
    from embedcli.models.loader import LoadedModel, ModelOptions
    from embedcli.models.spec import load_model_spec
    from embedcli.pooling.splade import DEFAULT_CHUNK_TOKENS

    model = LoadedModel(load_model_spec(str(splade_models["max"])), ModelOptions(device="cpu", dtype="float32"))
    runner = Runner(model, RunnerOptions(task="sparse_embed", max_batch_tokens=4096))
    pooler = model.pooler.pooler_for("sparse_embed")
    calls: list[tuple[int, ...]] = []
    hook = pooler.mlm_head.register_forward_hook(lambda mod, args, out: calls.append(tuple(out.shape)))
    texts = [" ".join(["the film won best album award"] * 6)] * 7  # 7 x 38 tokens: 266 tokens in one forward
    try:
        (results,) = list(runner.map([texts]))
    finally:
        hook.remove()
    tokens = runner.stats.tokens
    vocab = model.spec.embedding_size
    assert runner.stats.forwards == 1 and tokens >= 256
    assert sum(c[0] for c in calls) == tokens  # every token went through the head exactly once
    assert max(c[0] for c in calls) <= DEFAULT_CHUNK_TOKENS < tokens
    peak_logits_bytes = max(c[0] for c in calls) * vocab * 4
    assert peak_logits_bytes < tokens * vocab * 4
    assert len(results) == len(texts)


def test_info_shows_splade_pooling_and_dot_similarity(cli, splade_models) -> None:
    data = json.loads(cli("info", splade_models["sum"], "--json").stdout)
    assert data["head"] == "sparse" and "sparse-embed" in data["commands"]
    assert data["choices"] == {
        "pooling": "SPLADE sum of relu (modules.json: SpladePooling)",
        "similarity": "dot (default (dot, as SparseEncoder))",
        "truncation side": "right (default (right: the tokenizer names no side); --truncation-side overrides)",
    }


def test_a_bare_masked_lm_is_refused_with_the_way_to_a_sparse_encoder(cli, splade_models, texts_file, tmp_path) -> None:
    # naver's first SPLADE checkpoints ship as a bare BertForMaskedLM: the refusal says how to get the folder
    # sentence-transformers' SparseEncoder would use, and that folder then gives SparseEncoder's numbers.
    from sentence_transformers import SparseEncoder

    bare = splade_models["max"].parent / "mlm"  # the plain masked LM the fixture saved before wrapping it
    result = cli("sparse-embed", texts_file, "-m", bare, "-o", tmp_path / "b.parquet", code=2)
    assert "BertForMaskedLM without a SpladePooling module" in result.stderr
    assert "SparseEncoder(folder).save_pretrained(out)" in result.stderr
    saved = tmp_path / "saved"
    SparseEncoder(str(bare), device="cpu").save_pretrained(str(saved))
    out = tmp_path / "s.parquet"
    cli("sparse-embed", texts_file, "-m", saved, "-o", out, "-q")
    _assert_matches(_rows(out), _oracle(saved, TEXTS))
