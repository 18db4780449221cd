"""ColBERT in its two layouts (Stanford `HF_ColBERT` + artifact.metadata; PyLate's MaxSim sentence-transformers
folder): query / document token vectors and MaxSim scores against sentence-transformers 6's MultiVectorEncoder.

Oracle: `MultiVectorEncoder(folder).encode_query` / `encode_document` / `similarity` (it reads both layouts
itself); float32, three token budgets, the own backbone and the transformers fallback.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.fixtures.colbert import (
    COLBERT_QUERIES,
    COLBERT_TEXTS,
    build_native_colbert,
    build_pylate_colbert,
    build_stanford_colbert,
)

LAYOUTS = {
    "stanford": lambda p: build_stanford_colbert(p),
    "pylate": lambda p: build_pylate_colbert(p),
    # attend_to_mask_tokens / attend_to_expansion_tokens true: the [MASK] expansion is attended
    "stanford-attend": lambda p: build_stanford_colbert(p, metadata={"attend_to_mask_tokens": True, "doc_maxlen": 40}),
    # no query expansion, a short skiplist, another length
    "pylate-plain": lambda p: build_pylate_colbert(
        p, config={"do_query_expansion": False, "skiplist_words": [".", ","], "query_length": 8}
    ),
    # lightonai's GTE-ModernColBERT shape: ModernBERT (local windows), added "[Q] " / "[D] " tokens
    "pylate-modernbert": lambda p: build_pylate_colbert(p, body="modernbert"),
    # sentence-transformers 6's own save of each (MultiVectorMask module, prompts, query_expansion dict)
    "native": lambda p: build_native_colbert(p),
    "native-stanford": lambda p: build_native_colbert(p, stanford=True),
}
BUDGETS = (16, 40, 4096)


@pytest.fixture(scope="module")
def colbert(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("colbert")
    return {name: build(root / name) for name, build in LAYOUTS.items()}


@pytest.fixture(scope="module")
def oracle(colbert):  # type: ignore[no-untyped-def]
    from sentence_transformers import MultiVectorEncoder

    cache: dict[str, object] = {}

    def get(name: str):  # type: ignore[no-untyped-def]
        if name not in cache:
            cache[name] = MultiVectorEncoder(str(colbert[name]), device="cpu")
        return cache[name]

    return get


def _runner(folder: Path, role: str, budget: int, backbone: str):  # type: ignore[no-untyped-def]
    from embedcli.compute.options import RunnerOptions
    from embedcli.compute.runner import Runner
    from embedcli.models.loader import LoadedModel
    from embedcli.models.options import ModelOptions
    from embedcli.models.spec import load_model_spec

    model = LoadedModel(load_model_spec(str(folder)), ModelOptions(dtype="float32", backbone=backbone))
    return Runner(model, RunnerOptions(task="token_embed", role=role, max_batch_tokens=budget, with_token_ids=True))


@pytest.mark.parametrize("backbone", ["own", "transformers"])
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_query_and_document_vectors_equal_multivectorencoder(colbert, oracle, name, backbone, torch_single_thread) -> None:
    mve = oracle(name)
    want = {
        "query": mve.encode_query(list(COLBERT_QUERIES), convert_to_numpy=True),
        "document": mve.encode_document(list(COLBERT_TEXTS), convert_to_numpy=True),
    }
    deltas = []
    for budget in BUDGETS:
        for role, texts in (("query", COLBERT_QUERIES), ("document", COLBERT_TEXTS)):
            got = next(iter(_runner(colbert[name], role, budget, backbone).map([list(texts)])))
            for g, w, ids in zip(got.values, want[role], got.ids, strict=True):
                assert g.shape == w.shape, (role, budget, g.shape, w.shape)
                assert len(ids) == len(g)
                deltas.append(float(np.abs(g - w).max()))
    print(f"{name} ({backbone}): max |delta| vs MultiVectorEncoder {max(deltas):.2e}")
    assert max(deltas) <= 1e-5


def test_unattended_expansion_is_not_a_key(colbert, torch_single_thread) -> None:
    """The [MASK] expansion of colbertv2.0 (attend_to_mask_tokens false) changes no real token's vector: as keys
    they would (guards the key flags through the packed attention)."""
    runner = _runner(colbert["stanford"], "query", 4096, "own")
    enc = runner.tokenize(["quick fox"])
    assert enc.keys is not None and (~enc.keys[0]).sum() == 16 - 5  # [CLS] [unused0] quick fox [SEP] + 11 [MASK]
    import torch

    flat = torch.from_numpy(enc.ids[0])
    masked = runner.model.forward_packed(flat, [len(flat)], None, torch.from_numpy(enc.keys[0]))
    attended = runner.model.forward_packed(flat, [len(flat)], None, None)
    short = runner.model.forward_packed(flat[:5], [5], None, None)
    assert torch.allclose(masked[:5], short, atol=1e-5)
    assert not torch.allclose(attended[:5], short, atol=1e-3)


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.mark.parametrize("name", ["stanford", "pylate"])
def test_rerank_and_score_maxsim_equal_multivectorencoder(cli, colbert, oracle, name, tmp_path) -> None:
    mve = oracle(name)
    q = mve.encode_query(list(COLBERT_QUERIES))
    d = mve.encode_document(list(COLBERT_TEXTS))
    want = mve.similarity(q, d).numpy()
    docs = _jsonl(tmp_path / "docs.jsonl", [{"id": f"d{i}", "text": t} for i, t in enumerate(COLBERT_TEXTS)])
    queries = _jsonl(tmp_path / "q.jsonl", [{"id": f"q{i}", "text": t} for i, t in enumerate(COLBERT_QUERIES)])
    for budget in BUDGETS:
        out = tmp_path / f"rr{budget}.parquet"
        method = ("--method", "maxsim") if budget == 16 else ()  # auto is MaxSim for a ColBERT model
        cli("rerank", docs, "-m", colbert[name], "--queries", queries, *method, "--max-batch-tokens", budget, "-o", out, "-q")
        rows = pq.read_table(out).to_pylist()
        for qi in range(len(COLBERT_QUERIES)):
            got = [r for r in rows if r["query_id"] == f"q{qi}"]
            order = np.lexsort((np.arange(len(COLBERT_TEXTS)), -want[qi].astype(np.float64)))
            assert [r["id"] for r in got] == [f"d{j}" for j in order]
            assert np.abs(np.array([r["score"] for r in got]) - want[qi][order]).max() <= 1e-5
    pairs = _jsonl(tmp_path / "pairs.jsonl", [
        {"id": f"p{i}", "left": COLBERT_QUERIES[i % 3], "right": t} for i, t in enumerate(COLBERT_TEXTS)
    ])
    out = tmp_path / "score.parquet"
    cli("score", pairs, "-m", colbert[name], "-o", out, "-q")
    scores = pq.read_table(out).column("score").to_numpy()
    expected = [want[i % 3, i] for i in range(len(COLBERT_TEXTS))]
    assert np.abs(scores - expected).max() <= 1e-5


@pytest.mark.parametrize("role", ["query", "document"])
def test_token_embed_role_through_the_cli(cli, colbert, oracle, role, tmp_path) -> None:
    mve = oracle("pylate")
    want = (mve.encode_query if role == "query" else mve.encode_document)(list(COLBERT_TEXTS), convert_to_numpy=True)
    docs = _jsonl(tmp_path / "docs.jsonl", [{"id": f"d{i}", "text": t} for i, t in enumerate(COLBERT_TEXTS)])
    out = tmp_path / "tok.parquet"
    cli("token-embed", docs, "-m", colbert["pylate"], "--role", role, "-o", out, "-q")
    rows = pq.read_table(out).to_pylist()
    for row, w in zip(rows, want, strict=True):
        got = np.asarray(row["embeddings"], dtype=np.float32)
        assert got.shape == w.shape and np.abs(got - w).max() <= 1e-5
        assert len(row["token_ids"]) == len(got)
    if role == "document":  # the default role is document
        auto = tmp_path / "auto.parquet"
        cli("token-embed", docs, "-m", colbert["pylate"], "-o", auto, "-q")
        assert pq.read_table(auto).column("embeddings").to_pylist() == pq.read_table(out).column("embeddings").to_pylist()
    else:  # a query is [CLS] [Q] ... [SEP] then [MASK] up to the query length, every vector kept
        assert all(len(r["token_ids"]) == 12 for r in rows)
        assert rows[3]["token_ids"][1] == 7 and rows[3]["token_ids"][-1] == 4


def test_refusals(cli, colbert, tiny_model, tmp_path) -> None:
    docs = _jsonl(tmp_path / "docs.jsonl", [{"id": "d0", "text": "hello"}])
    result = cli("embed", docs, "-m", colbert["stanford"], "-o", tmp_path / "e.parquet", code=2)
    assert "late-interaction (ColBERT)" in result.stderr and "token-embed --role" in result.stderr
    result = cli("rerank", docs, "-m", colbert["pylate"], "--query", "x", "--method", "cosine",
                 "-o", tmp_path / "r.parquet", code=2)
    assert "MaxSim" in result.stderr
    result = cli("token-embed", docs, "-m", tiny_model("bert"), "--role", "query", "-o", tmp_path / "t.parquet", code=2)
    assert "--role query applies to late-interaction" in result.stderr
    result = cli("token-embed", docs, "-m", colbert["pylate"], "--keep-special", "-o", tmp_path / "k.parquet", code=2)
    assert "--keep-special does not apply" in result.stderr
    long = _jsonl(tmp_path / "long.jsonl", [{"id": "d0", "text": COLBERT_TEXTS[4]}])
    result = cli("token-embed", long, "-m", colbert["pylate"], "--long-inputs", "error", "-o", tmp_path / "l.parquet",
                 code=1)
    assert "more than the model's max length 20" in result.stderr


def test_info_names_the_late_interaction_head(cli, colbert) -> None:
    result = cli("info", colbert["stanford"], "--json")
    info = json.loads(result.stdout)
    assert info["tasks"] == ["token_embed"] and info["score_type"] == "late-interaction"
    assert "ColBERT (stanford, artifact.metadata)" in info["late_interaction_head"]


def test_run_batch_score_and_rerank_use_the_roles(cli, colbert, oracle, tmp_path) -> None:
    mve = oracle("stanford")
    want = mve.similarity(mve.encode_query([COLBERT_QUERIES[0]]), mve.encode_document(list(COLBERT_TEXTS))).numpy()[0]
    lines = [
        {"custom_id": "s", "method": "POST", "url": "/v1/score",
         "body": {"queries": COLBERT_QUERIES[0], "documents": list(COLBERT_TEXTS)}},
        {"custom_id": "r", "method": "POST", "url": "/v1/rerank",
         "body": {"query": COLBERT_QUERIES[0], "documents": list(COLBERT_TEXTS)}},
    ]
    src = _jsonl(tmp_path / "b.requests.jsonl", lines)
    out = tmp_path / "b.results.jsonl"
    cli("run-batch", src, "-m", colbert["stanford"], "-o", out, "-q")
    got = {r["custom_id"]: r["response"]["body"] for r in map(json.loads, out.read_text().splitlines())}
    scores = np.array([d["score"] for d in got["s"]["data"]], dtype=np.float32)
    assert np.abs(scores - want).max() <= 1e-5
    order = np.lexsort((np.arange(len(want)), -want.astype(np.float64)))
    assert [r["index"] for r in got["r"]["results"]] == order.tolist()


def test_query_and_document_outputs_do_not_mix(cli, colbert, tmp_path) -> None:
    docs = _jsonl(tmp_path / "docs.jsonl", [{"id": f"d{i}", "text": t} for i, t in enumerate(COLBERT_TEXTS[:2])])
    out = tmp_path / "tok.parquet"
    cli("token-embed", docs, "-m", colbert["stanford"], "-o", out, "-q")
    result = cli("token-embed", docs, "-m", colbert["stanford"], "--role", "query", "-o", out, "-q", code=2)
    assert "role: document → query" in result.stderr
    cli("token-embed", docs, "-m", colbert["stanford"], "--role", "document", "-o", out, "-q")  # same: complete
