"""The README's embed → search → rerank pipeline, run as written by bash, checked against sentence-transformers.

The block is read from README.md (the fenced block after the `<!-- test: pipeline` marker) and run unchanged
in a folder holding the files it names: docs.jsonl, queries.jsonl and ./cross-encoder (a tiny random BERT saved
by sentence-transformers 6's CrossEncoder). `embed` uses the packaged default model, as a user's run would.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

REPO = Path(__file__).resolve().parents[2]
MARKER = "<!-- test: pipeline"
TOP_K = 20  # the block's --top-k; the test's corpus is larger, so search's choice matters
DOCS = [
    "Labour won the general election with a big majority.",
    "The Tory party plans tax cuts before the election.",
    "The minister told the court the new law rules out the deal.",
    "Police said the city house prices rise again this year.",
    "Shares in the bank fell after the market report.",
    "Oil prices rise as the economy shows growth.",
    "The firm said sales were up two per cent this month.",
    "Company profits fall as the bank cuts jobs.",
    "The film won best picture at the awards show.",
    "The band had a top ten album in the UK chart.",
    "The star said the new song was her best work.",
    "A TV show about a young man and his dog.",
    "The team won the match with a late goal.",
    "The club said the player will be back next week.",
    "Players from the home team were told to rest.",
    "The striker scored two goals in the cup final.",
    "A new mobile phone with a digital camera.",
    "Internet users went online to play games.",
    "The software firm has a new computer chip.",
    "Technology news: net users and online music.",
    "The quick brown fox jumps over the lazy dog.",
    "Children at home watched the game on TV.",
    "The government said public jobs would go in the city.",
    "Private firms win talks on a tax deal.",
    "Women and men in the country want more work.",
    "The old man went back to his home town.",
    "Music sales online rose a million in a week.",
    "The game has a million players in the world.",
    "The party said its plans would cut the tax on oil.",
    "The court told the firm to pay the bank back.",
]
QUERIES = [("q1", "who won the election"), ("q2", "stock market and bank shares"), ("q3", "football match goals")]


def readme_block(marker: str) -> str:
    """The fenced code block that follows `marker` in README.md, verbatim."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    start = text.index(marker)
    fence = re.compile(r"[^\n]*\n```(?:bash|sh)\n(.*?)\n```", re.S).match(text, start)
    assert fence is not None, f"no ```bash block right after {marker!r} in README.md"
    return fence.group(1)


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def _cross_encoder(tiny_model, folder: Path) -> None:  # type: ignore[no-untyped-def]
    import torch
    from sentence_transformers import CrossEncoder

    torch.manual_seed(5)
    ce = CrossEncoder(str(tiny_model("bert")), num_labels=1, device="cpu")
    with torch.no_grad():  # a head wide enough that the candidates' scores spread (no near-ties to reorder)
        ce.model.classifier.weight.normal_(0.0, 2.0)
        ce.model.classifier.bias.normal_(0.0, 1.0)
    ce.save_pretrained(str(folder))


def _embedcli_on_path(bin_dir: Path) -> dict[str, str]:
    """An environment whose `embedcli` is this tree's, run by the test's own interpreter."""
    bin_dir.mkdir()
    shim = bin_dir / "embedcli"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m embedcli "$@"\n', encoding="utf-8")
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(bin_dir), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["EMBEDCLI_DTYPE"] = "float32"  # `auto` may pick bfloat16 on this CPU; the oracles below are float32
    env["EMBEDCLI_QUIET"] = "1"
    return env


@pytest.fixture(scope="module")
def pipeline(tiny_model, tmp_path_factory):  # type: ignore[no-untyped-def]
    """The README block run in a fresh folder; returns that folder."""
    cwd = tmp_path_factory.mktemp("readme_pipeline")
    _write_jsonl(cwd / "docs.jsonl", [{"id": f"d{i:02d}", "text": t} for i, t in enumerate(DOCS)])
    _write_jsonl(cwd / "queries.jsonl", [{"id": q, "text": t} for q, t in QUERIES])
    _cross_encoder(tiny_model, cwd / "cross-encoder")
    block = readme_block(MARKER)
    env = _embedcli_on_path(cwd.parent / f"{cwd.name}-bin")
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, f"README pipeline exited {done.returncode}\n{block}\nstderr:\n{done.stderr}"
    return cwd


def test_the_readme_names_the_files_the_test_builds() -> None:
    block = readme_block(MARKER)
    for name in ("docs.jsonl", "queries.jsonl", "./cross-encoder", "vectors.parquet", "ranked.parquet", f"--top-k {TOP_K}"):
        assert name in block, name


def test_search_stage_takes_semantic_search_top_k_of_the_stored_vectors(pipeline: Path) -> None:
    from sentence_transformers import SentenceTransformer, util

    from embedcli.io.writers import embedding_matrix
    from embedcli.models.checkpoint.resolve import resolve_model_path

    stored = embedding_matrix(pq.read_table(pipeline / "vectors.parquet").column("embedding"))
    ids = pq.read_table(pipeline / "vectors.parquet").column("id").to_pylist()
    assert ids == [f"d{i:02d}" for i in range(len(DOCS))]
    st = SentenceTransformer(str(resolve_model_path(None)), device="cpu")  # the default model embed used
    q = st.encode_query([t for _, t in QUERIES], convert_to_numpy=True)
    expected = util.semantic_search(q, stored, top_k=TOP_K + 1)
    ranked = pq.read_table(pipeline / "ranked.parquet").to_pylist()
    for (qid, _), hits in zip(QUERIES, expected, strict=True):
        # the 20th and 21st are apart by more than float noise, so the top-k set is well defined
        assert hits[TOP_K - 1]["score"] - hits[TOP_K]["score"] > 1e-4, qid
        assert sorted(r["id"] for r in ranked if r["query_id"] == qid) == sorted(ids[h["corpus_id"]] for h in hits[:TOP_K])


def test_rerank_stage_scores_each_candidate_with_cross_encoder_predict(pipeline: Path) -> None:
    from sentence_transformers import CrossEncoder

    ranked = pq.read_table(pipeline / "ranked.parquet").to_pylist()
    queries = dict(QUERIES)
    assert [r["query_id"] for r in ranked] == [q for q, _ in QUERIES for _ in range(TOP_K)]
    docs = {f"d{i:02d}": t for i, t in enumerate(DOCS)}
    assert all(r["text"] == docs[r["id"]] for r in ranked)  # --return-documents
    expected = CrossEncoder(str(pipeline / "cross-encoder"), device="cpu").predict(
        [(queries[r["query_id"]], docs[r["id"]]) for r in ranked])
    np.testing.assert_allclose([r["score"] for r in ranked], expected, rtol=0, atol=1e-5)
    for qid, _ in QUERIES:
        mine = [r for r in ranked if r["query_id"] == qid]
        assert [r["rank"] for r in mine] == list(range(1, TOP_K + 1))
        scores = [r["score"] for r in mine]
        assert scores == sorted(scores, reverse=True)
        assert len(set(scores)) == len(scores) > 1  # distinct: the order is the scores', not the input's
