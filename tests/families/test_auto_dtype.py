"""`--dtype auto` on the LLM-reranker and SPLADE heads: the parity probe runs the head's own task.

The probe (`embedcli.models.precision`) compares bf16 with float32 on the head's default task; a sparse
vector is compared as the dense vocabulary-sized vector it stands for. Oracles: sentence-transformers 6's
SparseEncoder for SPLADE, the float32 runner for the reranker's score.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

TEXTS = ["the film won best album", "market shares rise after bank talks", "zzz"]


@pytest.fixture(scope="module")
def splade(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.fixtures.tiny_families import build_splade

    return build_splade(tmp_path_factory.mktemp("splade_auto"), "max")


@pytest.fixture(scope="module")
def reranker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.fixtures.tiny_families import build_llm_reranker

    return build_llm_reranker("qwen3", tmp_path_factory.mktemp("reranker_auto"))[1]


def _load(folder: Path):  # type: ignore[no-untyped-def]
    from embedcli.models.loader import LoadedModel, ModelOptions
    from embedcli.models.spec import load_model_spec

    return LoadedModel(load_model_spec(str(folder)), ModelOptions(device="cpu", dtype="float32"))


def test_splade_probe_is_the_dense_vocabulary_vector(splade, torch_single_thread) -> None:
    from sentence_transformers import SparseEncoder

    from embedcli.models.precision import ParityBar, compare, probe_outputs, task_for_head

    model = _load(splade)
    task = task_for_head(model.spec.head)
    assert task == "sparse_embed"
    got = probe_outputs(model, task, TEXTS)
    want = SparseEncoder(str(splade), device="cpu").encode(TEXTS, convert_to_tensor=True).to_dense().double().numpy()
    for g, w in zip(got, want, strict=True):
        assert g.shape == (model.spec.embedding_size,)
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-5)
    passed, figures = compare(task, got, got, ParityBar())
    assert passed and figures["min_cosine"] > 1 - 1e-9


def test_reranker_probe_is_its_score(reranker, torch_single_thread) -> None:
    from embedcli.compute.runner import Runner, RunnerOptions
    from embedcli.models.precision import probe_outputs, task_for_head

    model = _load(reranker)
    task = task_for_head(model.spec.head)
    assert task == "classify"
    got = probe_outputs(model, task, TEXTS)
    (want,) = list(Runner(model, RunnerOptions(task="classify")).map([TEXTS]))
    np.testing.assert_allclose(np.concatenate(got), np.asarray(want, np.float64).reshape(-1), rtol=0, atol=1e-5)


@torch.inference_mode()
def test_splade_pooler_takes_bf16_hidden_states_into_a_float32_head() -> None:
    """`auto` on CUDA settles on a bf16 backbone while the masked-LM head keeps float32 weights."""
    from embedcli.pooling import SpladePooler

    torch.manual_seed(0)
    head = torch.nn.Linear(16, 40)
    hidden = torch.randn(7, 16)
    pooler = SpladePooler(head, chunk_tokens=3)
    (want_i, want_v), = pooler.pool_packed(hidden.bfloat16().float(), [0, 7])
    (got_i, got_v), = pooler.pool_packed(hidden.bfloat16(), [0, 7])
    assert torch.equal(got_i, want_i)
    torch.testing.assert_close(got_v, want_v, rtol=0, atol=0)


def test_sparse_embed_and_score_under_dtype_auto(cli, splade, reranker, tmp_path) -> None:
    """The CLI under `--dtype auto`: the run finishes, and stays within the probe's bar of float32."""
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"id": str(i), "text": t}) + "\n" for i, t in enumerate(TEXTS)), encoding="utf-8")
    outs = {}
    for dtype in ("float32", "auto"):
        outs[dtype] = tmp_path / f"{dtype}.parquet"
        cli("sparse-embed", path, "-m", splade, "-o", outs[dtype], "-q", env={"EMBEDCLI_DTYPE": dtype})
    width = 1 + max(max(r["indices"]) for r in pq.read_table(outs["float32"]).to_pylist())

    def dense(p: Path) -> np.ndarray:
        rows = pq.read_table(p).to_pylist()
        out = np.zeros((len(rows), width + 1000))
        for k, r in enumerate(rows):
            out[k, r["indices"]] = r["values"]
        return out

    a, b = dense(outs["float32"]), dense(outs["auto"])
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    assert cos.min() >= 0.9999
    pairs = tmp_path / "p.jsonl"
    pairs.write_text(json.dumps({"id": "a", "left": "hello", "right": "world"}) + "\n", encoding="utf-8")
    cli("score", pairs, "-m", reranker, "-o", tmp_path / "s.parquet", "-q", env={"EMBEDCLI_DTYPE": "auto"})
    assert pq.read_table(tmp_path / "s.parquet").num_rows == 1
