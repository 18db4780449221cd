"""`Embedder.score` and `Embedder.rerank` equal `embedcli score` / `embedcli rerank` on a file of the same pairs,
for every way a model scores pairs: a cross-encoder (its activation), an LLM reranker (its pair prompt, or the
template flags), ColBERT MaxSim (query and document roles), SPLADE's sparse dot product, a bi-encoder's cosine
with its query/document prompts."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.api.checks import assert_rows_equal, read_output, write_rows
from tests.fixtures.tiny_models import LONG_TEXT

LEFTS = ["who won the election", "stock market and bank shares", "football match goals", "zzz", "the film award"]
RIGHTS = [
    "Labour won the general election with a big majority.",
    "Shares in the bank fell after the market report.",
    "The striker scored two goals in the cup final.",
    "",
    LONG_TEXT,
]
TEMPLATE = "Judge: {instruction}\nQ: {query}\nD: {document}\nAnswer:"
# (model, Embedder(...) arguments, the same as CLI flags)
MODELS: dict[str, tuple[str, dict[str, Any], tuple[str, ...]]] = {
    "cross-encoder": ("cross-encoder", {}, ()),
    "llm-reranker": ("llm-reranker", {}, ()),
    "llm-template-flags": ("qwen3", {"classifier_from_tokens": ["no", "yes"], "pair_template": TEMPLATE,
                                     "instruction": "is it relevant?"},
                           ("--classifier-from-tokens", "no,yes", "--pair-template", TEMPLATE, "--instruction",
                            "is it relevant?")),
    "colbert": ("colbert", {}, ()),
    "splade": ("splade", {}, ()),
    "bi-encoder": ("prompted", {}, ()),
    "bge-m3": ("bge-m3", {}, ()),
}


def _embedder(api_model: Callable[[str], Path], case: str) -> tuple[Any, Path, tuple[str, ...]]:
    from embedcli import Embedder

    name, ctor, flags = MODELS[case]
    folder = api_model(name)
    return Embedder(str(folder), device="cpu", dtype="float32", **ctor), folder, flags


@pytest.mark.parametrize("form", ["pairs", "left"])
@pytest.mark.parametrize("case", list(MODELS))
def test_score_equals_cli(case: str, form: str, api_model: Callable[[str], Path], cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    embedder, folder, flags = _embedder(api_model, case)
    src = write_rows(tmp_path / "pairs.jsonl", [{"id": f"p{i}", "left": a, "right": b}
                                                for i, (a, b) in enumerate(zip(LEFTS, RIGHTS, strict=True))])
    left = ("--left", LEFTS[0]) if form == "left" else ()
    cli("score", src, "-m", folder, "-o", tmp_path / "out.parquet", "-q", *flags, *left)
    table = read_output(tmp_path / "out.parquet")
    assert table.column("id").to_pylist() == [f"p{i}" for i in range(len(LEFTS))]
    want = table.column("score").to_numpy()
    got = embedder.score(LEFTS[0] if form == "left" else LEFTS, RIGHTS)
    assert got.dtype == np.float32 and got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-6
    assert np.ptp(want) > 1e-4  # the scores differ: equal constants would pass too


def test_score_options_equal_cli(api_model: Callable[[str], Path], cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Raw scores, left truncation and `--long-inputs error`'s refusal, as the CLI."""
    from embedcli.errors import LongInputError

    embedder, folder, _ = _embedder(api_model, "cross-encoder")
    src = write_rows(tmp_path / "pairs.jsonl", [{"id": i, "left": a, "right": b} for i, (a, b) in enumerate(zip(LEFTS, RIGHTS, strict=True))])
    cli("score", src, "-m", folder, "--raw-scores", "--truncation-side", "left", "-o", tmp_path / "out.parquet", "-q")
    want = read_output(tmp_path / "out.parquet").column("score").to_numpy()
    got = embedder.score(LEFTS, RIGHTS, raw_scores=True, truncation_side="left")
    assert np.abs(got - want).max() <= 1e-6
    assert (want < 0).any() or (want > 1).any()  # raw logits, not probabilities
    with pytest.raises(LongInputError, match=r"texts row 2 \(id '2'\) has \d+ tokens, more than the model's max length 128"):
        embedder.score(LEFTS, [*RIGHTS[:2], LONG_TEXT * 2, *RIGHTS[3:]], long_inputs="error")


def test_m3_weights_equal_cli(api_model: Callable[[str], Path], cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    embedder, folder, _ = _embedder(api_model, "bge-m3")
    src = write_rows(tmp_path / "pairs.jsonl", [{"id": i, "left": a, "right": b} for i, (a, b) in enumerate(zip(LEFTS, RIGHTS, strict=True))])
    cli("score", src, "-m", folder, "--method", "m3", "--weights", "0.4,0.2,0.4", "-o", tmp_path / "out.parquet", "-q")
    want = read_output(tmp_path / "out.parquet").column("score").to_numpy()
    got = embedder.score(LEFTS, RIGHTS, method="m3", weights=[0.4, 0.2, 0.4])
    assert np.abs(got - want).max() <= 1e-6
    assert np.abs(got - embedder.score(LEFTS, RIGHTS, method="m3")).max() > 1e-4  # the weights count


def test_every_left_against_one_right(api_model: Callable[[str], Path]) -> None:
    embedder, _, _ = _embedder(api_model, "cross-encoder")
    assert np.array_equal(embedder.score(LEFTS, RIGHTS[1]), embedder.score(LEFTS, [RIGHTS[1]] * len(LEFTS)))


@pytest.mark.parametrize("case", ["cross-encoder", "llm-reranker", "colbert", "splade", "bi-encoder"])
def test_rerank_equals_cli(case: str, api_model: Callable[[str], Path], cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    embedder, folder, flags = _embedder(api_model, case)
    docs = write_rows(tmp_path / "docs.jsonl", [{"id": f"d{i}", "text": t} for i, t in enumerate(RIGHTS)])
    queries = write_rows(tmp_path / "q.jsonl", [{"id": f"q{i}", "text": t} for i, t in enumerate(LEFTS[:3])])
    cli("rerank", docs, "-m", folder, "--queries", queries, "--top-n", "3", "--return-documents",
        "-o", tmp_path / "out.parquet", "-q", *flags)
    want = read_output(tmp_path / "out.parquet")
    got = embedder.rerank(LEFTS[:3], RIGHTS, top_n=3, return_documents=True, ids=[f"d{i}" for i in range(5)],
                          query_ids=["q0", "q1", "q2"])
    assert_rows_equal(got, want)
    assert want.num_rows == 9


def test_rerank_of_one_query_equals_cli_with_integer_ids(api_model: Callable[[str], Path], cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """One query is `--query` (its id 'query'); documents without ids are numbered by position, as integer ids."""
    embedder, folder, _ = _embedder(api_model, "cross-encoder")
    docs = write_rows(tmp_path / "docs.jsonl", [{"id": i, "text": t} for i, t in enumerate(RIGHTS)])
    cli("rerank", docs, "-m", folder, "--query", LEFTS[1], "--raw-scores", "-o", tmp_path / "out.parquet", "-q")
    want = read_output(tmp_path / "out.parquet")
    got = embedder.rerank(LEFTS[1], RIGHTS, raw_scores=True)
    assert_rows_equal(got, want)
    assert got.column("id").to_pylist() != list(range(len(RIGHTS)))  # ranked by score, not left in input order
