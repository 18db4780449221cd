"""`Embedder.search` equals `embedcli search`: against the vectors file `embed` wrote (its provenance decides how
queries are embedded: model, prompt, precision), and against the same vectors held in memory with their ids."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.api.checks import assert_rows_equal, matrix, read_output, write_rows

DOCS = [
    "Labour won the general election with a big majority.",
    "The Tory party plans tax cuts before the election.",
    "Shares in the bank fell after the market report.",
    "Oil prices rise as the economy shows growth.",
    "The film won best picture at the awards show.",
    "The team won the match with a late goal.",
    "The striker scored two goals in the cup final.",
    "A new mobile phone with a digital camera.",
    "Internet users went online to play games.",
    "The court told the firm to pay the bank back.",
]
QUERIES = ["who won the election", "stock market and bank shares", "football match goals"]
QUERY_IDS = ["q1", "q2", "q3"]


def _corpus(tmp_path: Path, cli, folder: Path, *flags: str) -> Path:  # type: ignore[no-untyped-def]
    """`embedcli embed` of DOCS (integer ids, text kept) into vectors.parquet."""
    src = write_rows(tmp_path / "docs.jsonl", [{"id": 100 + i, "text": t} for i, t in enumerate(DOCS)])
    cli("embed", src, "-m", folder, "--keep-cols", "text", "-o", tmp_path / "vectors.parquet", "-q", *flags)
    return tmp_path / "vectors.parquet"


def _cli_search(tmp_path: Path, cli, vectors: Path, *flags: str):  # type: ignore[no-untyped-def]
    queries = write_rows(tmp_path / "q.jsonl", [{"id": q, "text": t} for q, t in zip(QUERY_IDS, QUERIES, strict=True)])
    out = tmp_path / "hits.parquet"
    cli("search", vectors, "--queries", queries, "-o", out, "-q", *flags)
    return read_output(out)


# (model, embed flags, search flags, search(...) arguments)
FILE_CASES: dict[str, tuple[str, tuple[str, ...], tuple[str, ...], dict[str, object]]] = {
    "minilm": ("minilm", (), ("--top-k", "3", "--keep-cols", "text"), {"top_k": 3, "keep_cols": ["text"]}),
    "minilm-int8": ("minilm", ("--precision", "int8"), ("--top-k", "4"), {"top_k": 4}),
    "minilm-binary-no-rescore": ("minilm", ("--precision", "binary"), ("--top-k", "2", "--rescore", "0"),
                                 {"top_k": 2, "rescore": 0}),
    "minilm-dimensions-blocks": ("minilm", ("--dimensions", "64"), ("--top-k", "20", "--block-rows", "3"),
                                 {"top_k": 20, "block_rows": 3}),
    "prompted": ("prompted", ("--prompt-name", "document"), ("--top-k", "3"), {"top_k": 3}),
    "static": ("static", (), ("--top-k", "3", "--keep-cols", "text"), {"top_k": 3, "keep_cols": ["text"]}),
}


@pytest.mark.parametrize("case", list(FILE_CASES))
def test_search_of_a_vectors_file_equals_cli(case: str, api_model: Callable[[str], Path], cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from embedcli import Embedder

    name, embed_flags, search_flags, kwargs = FILE_CASES[case]
    folder = api_model(name)
    vectors = _corpus(tmp_path, cli, folder, *embed_flags)
    want = _cli_search(tmp_path, cli, vectors, *search_flags)
    got = Embedder(str(folder), device="cpu", dtype="float32").search(QUERIES, vectors, query_ids=QUERY_IDS, **kwargs)
    assert_rows_equal(got, want)
    best = [i for i, r in zip(want.column("id").to_pylist(), want.column("rank").to_pylist(), strict=True) if r == 1]
    assert len(best) == 3 and len(set(best)) > 1  # the queries find different documents


@pytest.mark.parametrize("name", ["minilm", "prompted"])
def test_search_of_an_in_memory_matrix_equals_cli(name: str, api_model: Callable[[str], Path], cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The rows `embed` made, with their ids: queries embedded as `embed` embeds, with the model's query prompt
    (the prompted model's 'query: ', which the CLI takes from the vectors' provenance too)."""
    from embedcli import Embedder

    folder = api_model(name)
    want = _cli_search(tmp_path, cli, _corpus(tmp_path, cli, folder), "--top-k", "4")
    embedder = Embedder(str(folder), device="cpu", dtype="float32")
    rows = embedder.embed(DOCS)
    got = embedder.search(QUERIES, rows, ids=[100 + i for i in range(len(DOCS))], query_ids=QUERY_IDS, top_k=4)
    assert_rows_equal(got, want)
    if name == "prompted":  # the query prompt matters: without it the scores differ
        plain = embedder.embed(QUERIES, prompt="")
        unit = rows / np.linalg.norm(rows, axis=1, keepdims=True)
        assert np.abs((plain @ unit.T).max(axis=1) - got.column("score").to_numpy()[::4]).max() > 1e-4


def test_one_query_text_is_query_and_matrix_ids_default_to_positions(api_model: Callable[[str], Path], cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from embedcli import Embedder

    folder = api_model("minilm")
    vectors = _corpus(tmp_path, cli, folder)
    cli("search", vectors, "--query", QUERIES[2], "--top-k", "3", "-o", tmp_path / "one.parquet", "-q")
    want = read_output(tmp_path / "one.parquet")
    embedder = Embedder(str(folder), device="cpu", dtype="float32")
    assert_rows_equal(embedder.search(QUERIES[2], vectors, top_k=3), want)
    by_position = embedder.search(QUERIES[2], matrix(read_output(vectors).column("embedding")), top_k=3)
    assert by_position.column("id").to_pylist() == [i - 100 for i in want.column("id").to_pylist()]


def test_search_refuses_another_model(api_model: Callable[[str], Path], cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from embedcli import Embedder
    from embedcli.errors import UsageError

    vectors = _corpus(tmp_path, cli, api_model("minilm"))
    other = Embedder(str(api_model("prompted")), device="cpu", dtype="float32")
    with pytest.raises(UsageError, match=r"the Embedder's model .* is not the model that made .*vectors\.parquet"):
        other.search(QUERIES, vectors)
    with pytest.raises(UsageError, match="the matrix's vectors are 384 wide, this Embedder's queries 32"):
        other.search(QUERIES, matrix(read_output(vectors).column("embedding")))
