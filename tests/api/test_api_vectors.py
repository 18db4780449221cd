"""`Embedder.embed`, `classify`, `token_embed` and `sparse_embed` equal their CLI commands run on a file of the
same texts: float32 within 1e-6, the same labels, token ids and indices, in input order."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.api.checks import assert_rows_equal, matrix, read_output, write_rows
from tests.fixtures.tiny_models import LONG_TEXT

TEXTS = [
    "The bank raised interest rates again.",
    "  the striker scored twice in the cup final  ",
    "",
    "Café owners said ünïcode prices rose 2%!",
    LONG_TEXT,
    "zzz",
]
PAIRS = [
    ("the quick brown fox jumps over the lazy dog", "a dog is sleeping"),
    ("market shares rise after bank talks", "the bank deal"),
    (LONG_TEXT, "the film won an award"),
    ("hello", LONG_TEXT),
    ("zzz", ""),
]


def _file(tmp_path: Path, texts: list[str] = TEXTS) -> Path:
    return write_rows(tmp_path / "in.jsonl", [{"id": i, "text": t} for i, t in enumerate(texts)])


# (model, Embedder(...) arguments, embed(...) arguments, the same as CLI flags)
EMBED_CASES: dict[str, tuple[str, dict[str, Any], dict[str, Any], tuple[str, ...]]] = {
    "minilm": ("minilm", {}, {}, ()),
    "minilm-options": ("minilm", {"max_length": 16}, {"normalize": False, "dimensions": 128, "truncation_side": "left",
                                                       "strip": True, "prompt": "passage: "},
                       ("--max-length", "16", "--no-normalize", "--dimensions", "128", "--truncation-side", "left",
                        "--strip", "--prompt", "passage: ")),
    "minilm-chunk": ("minilm", {"max_length": 16}, {"long_inputs": "chunk"}, ("--max-length", "16", "--long-inputs", "chunk")),
    "minilm-int8": ("minilm", {}, {"precision": "int8"}, ("--precision", "int8")),
    "minilm-ubinary": ("minilm", {}, {"precision": "ubinary"}, ("--precision", "ubinary")),
    "prompted-query": ("prompted", {}, {"prompt_name": "query"}, ("--prompt-name", "query")),
    "prompted-ctor": ("prompted", {"prompt_name": "document"}, {}, ("--prompt-name", "document")),
    "bge-m3-dense": ("bge-m3", {}, {}, ()),
    "static": ("static", {}, {}, ()),
    "static-dimensions": ("static", {}, {"dimensions": 8}, ("--dimensions", "8")),
}


@pytest.mark.parametrize("case", list(EMBED_CASES))
def test_embed_equals_cli(case: str, api_model: Callable[[str], Path], cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from embedcli import Embedder

    name, ctor, kwargs, flags = EMBED_CASES[case]
    folder = api_model(name)
    cli("embed", _file(tmp_path), "-m", folder, "-o", tmp_path / "out.parquet", "-q", *flags)
    table = read_output(tmp_path / "out.parquet")
    assert table.column("id").to_pylist() == list(range(len(TEXTS)))
    want = matrix(table.column("embedding"))
    got = Embedder(str(folder), device="cpu", dtype="float32", **ctor).embed(TEXTS, **kwargs)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.abs(got.astype(np.float64) - want).max() <= (0 if got.dtype != np.float32 else 1e-6)
    assert np.ptp(want.astype(np.float64), axis=0).max() > 1e-3  # the rows differ: equal constants would pass too


def test_embed_with_dtype_auto_equals_cli(api_model: Callable[[str], Path], cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The dtype policy `auto` (the parity probe, its decision cached) resolves as the CLI's does."""
    from embedcli import Embedder

    folder = api_model("prompted")
    cli("embed", _file(tmp_path), "-m", folder, "--dtype", "auto", "-o", tmp_path / "out.parquet", "-q")
    table = read_output(tmp_path / "out.parquet")
    got = Embedder(str(folder), device="cpu").embed(TEXTS)
    assert np.abs(got - matrix(table.column("embedding"))).max() <= 1e-6


def test_one_text_gives_one_vector(api_model: Callable[[str], Path]) -> None:
    from embedcli import Embedder

    embedder = Embedder(str(api_model("static")))
    one = embedder.embed("zzz")
    assert one.shape == (16,)
    assert np.array_equal(one, embedder.embed(["zzz"])[0])


# (model, classify(...) arguments, the same as CLI flags, pairs?)
CLASSIFY_CASES: dict[str, tuple[str, dict[str, Any], tuple[str, ...], bool]] = {
    "topics": ("topics", {}, (), False),
    "topics-top-k": ("topics", {"top_k": 3, "all_scores": True}, ("--top-k", "3", "--all-scores"), False),
    "topics-sigmoid": ("topics", {"activation": "sigmoid", "logit_mean": 0.5, "logit_sigma": 2.0, "strip": True},
                       ("--activation", "sigmoid", "--logit-mean", "0.5", "--logit-sigma", "2", "--strip"), False),
    "multi-label": ("multi-label", {"all_scores": True}, ("--all-scores",), False),
    "nli-pairs": ("nli", {"all_scores": True}, ("--all-scores",), True),
    "nli-pairs-softmax": ("nli", {"activation": "softmax", "top_k": 2}, ("--activation", "softmax", "--top-k", "2"),
                          True),
    "cross-encoder-one-label": ("cross-encoder", {}, (), False),
}


@pytest.mark.parametrize("case", list(CLASSIFY_CASES))
def test_classify_equals_cli(case: str, api_model: Callable[[str], Path], cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from embedcli import Embedder

    name, kwargs, flags, pairs = CLASSIFY_CASES[case]
    folder = api_model(name)
    if pairs:
        src = write_rows(tmp_path / "in.jsonl", [{"id": i, "text": a, "second": b} for i, (a, b) in enumerate(PAIRS)])
        flags = (*flags, "--pair-col", "second")
    else:
        src = _file(tmp_path)
    cli("classify", src, "-m", folder, "-o", tmp_path / "out.parquet", "-q", *flags)
    want = read_output(tmp_path / "out.parquet").drop_columns(["id"])
    got = Embedder(str(folder), device="cpu", dtype="float32").classify(PAIRS if pairs else TEXTS, **kwargs)
    assert_rows_equal(got, want, close=("score", "top_scores", "scores"))
    assert len(set(want.column("score").to_pylist())) > 1


# (model, token_embed(...) arguments, the same as CLI flags)
TOKEN_CASES: dict[str, tuple[str, dict[str, Any], tuple[str, ...]]] = {
    "colbert-document": ("colbert", {}, ()),
    "colbert-query": ("colbert", {"role": "query"}, ("--role", "query")),
    "colbert-document-raw": ("colbert", {"role": "document", "normalize": False}, ("--role", "document", "--no-normalize")),
    "bert": ("prompted", {}, ()),
    "bge-m3-colbert": ("bge-m3", {}, ()),
    "bert-keep-special": ("prompted", {"keep_special": True, "truncation_side": "left"},
                          ("--keep-special", "--truncation-side", "left")),
}


@pytest.mark.parametrize("case", list(TOKEN_CASES))
def test_token_embed_equals_cli(case: str, api_model: Callable[[str], Path], cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from embedcli import Embedder

    name, kwargs, flags = TOKEN_CASES[case]
    folder = api_model(name)
    cli("token-embed", _file(tmp_path), "-m", folder, "-o", tmp_path / "out.parquet", "-q", *flags)
    want = read_output(tmp_path / "out.parquet").drop_columns(["id"])
    got = Embedder(str(folder), device="cpu", dtype="float32").token_embed(TEXTS, **kwargs)
    assert_rows_equal(got, want, close=("embeddings",))


def _id_of(folder: Path, token: str) -> int:
    import json

    return int(json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"][token])


# token_classify(...) arguments and the same as CLI flags (`STEP`: the id of "the", a step tag here)
TOKEN_CLASSIFY_CASES: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "default": ({}, ()),
    "softmax-all-scores-special": ({"activation": "softmax", "all_scores": True, "keep_special": True},
                                   ("--activation", "softmax", "--all-scores", "--keep-special")),
    "step-tags-label-columns": ({"step_tag_id": "STEP", "returned_token_ids": [1, 3], "all_scores": True},
                                ("--step-tag-id", "STEP", "--returned-token-ids", "1,3", "--all-scores")),
}


@pytest.mark.parametrize("case", list(TOKEN_CLASSIFY_CASES))
def test_token_classify_equals_cli(case: str, api_model: Callable[[str], Path], cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from embedcli import Embedder

    folder = api_model("ner")
    step = _id_of(folder, "the")
    kwargs, flags = TOKEN_CLASSIFY_CASES[case]
    kwargs = {k: step if v == "STEP" else v for k, v in kwargs.items()}
    cli("token-classify", _file(tmp_path), "-m", folder, "-o", tmp_path / "out.parquet", "-q",
        *(str(step) if f == "STEP" else f for f in flags))
    want = read_output(tmp_path / "out.parquet").drop_columns(["id"])
    got = Embedder(str(folder), device="cpu", dtype="float32").token_classify(TEXTS, **kwargs)
    assert_rows_equal(got, want, close=("scores", "probs"))
    assert sum(len(v) for v in want.column("labels").to_pylist()) > 0


SPARSE_CASES: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "default": ({}, ()),
    "tokens-top-k": ({"with_tokens": True, "top_k": 5}, ("--with-tokens", "--sparse-top-k", "5")),
    "prompt": ({"prompt": "query: ", "strip": True}, ("--prompt", "query: ", "--strip")),
    "bge-m3": ({"with_tokens": True}, ("--with-tokens",)),
}


@pytest.mark.parametrize("outputs", [("dense", "sparse", "colbert"), ("colbert", "dense")])
def test_hybrid_embed_equals_embed_outputs(outputs: tuple[str, ...], api_model: Callable[[str], Path], cli,  # type: ignore[no-untyped-def]
                                           tmp_path: Path) -> None:
    from embedcli import Embedder

    folder = api_model("bge-m3")
    cli("embed", _file(tmp_path), "-m", folder, "--outputs", ",".join(outputs), "-o", tmp_path / "out.parquet", "-q")
    want = read_output(tmp_path / "out.parquet").drop_columns(["id"])
    got = Embedder(str(folder), device="cpu", dtype="float32").hybrid_embed(TEXTS, outputs=outputs)
    assert_rows_equal(got, want, close=("embedding", "values", "embeddings"))


@pytest.mark.parametrize("case", list(SPARSE_CASES))
def test_sparse_embed_equals_cli(case: str, api_model: Callable[[str], Path], cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from embedcli import Embedder

    kwargs, flags = SPARSE_CASES[case]
    folder = api_model("bge-m3" if case == "bge-m3" else "splade")
    cli("sparse-embed", _file(tmp_path), "-m", folder, "-o", tmp_path / "out.parquet", "-q", *flags)
    want = read_output(tmp_path / "out.parquet").drop_columns(["id"])
    got = Embedder(str(folder), device="cpu", dtype="float32").sparse_embed(TEXTS, **kwargs)
    assert_rows_equal(got, want, close=("values",))
    assert sum(len(v) for v in want.column("values").to_pylist()) > 0


def test_ragged_gives_each_rows_arrays(api_model: Callable[[str], Path]) -> None:
    from embedcli import Embedder
    from embedcli.api import ragged

    table = Embedder(str(api_model("colbert")), device="cpu", dtype="float32").token_embed(TEXTS[:3], role="query")
    vectors, ids = ragged(table.column("embeddings")), ragged(table.column("token_ids"))
    assert [v.shape for v in vectors] == [(len(i), 12) for i in ids]
    assert [v.tolist() for v in vectors] == [[list(map(float, t)) for t in row] for row in table.column("embeddings").to_pylist()]
    assert [i.tolist() for i in ids] == table.column("token_ids").to_pylist()
    sliced = ragged(table.column("embeddings").combine_chunks().slice(1, 2))
    assert [v.tolist() for v in sliced] == [v.tolist() for v in vectors[1:]]


def test_a_static_model_runs_without_torch(api_model: Callable[[str], Path]) -> None:
    """As `embedcli embed` on a static model: numpy only, torch never imported (embed and search)."""
    import subprocess
    import sys

    code = (
        "import sys\nfrom embedcli import Embedder\n"
        f"e = Embedder({str(api_model('static'))!r})\n"
        "v = e.embed(['hello world', 'zzz'])\nassert e.search('hello', v, top_k=1).num_rows == 1\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stderr


def test_runners_of_one_model_share_its_loaded_weights(api_model: Callable[[str], Path]) -> None:
    """A runner per recipe, built once; runners with the same load options share the loaded weights (cosine
    scoring embeds as `embed` does: the same runner). token_embed's load options name its task (the dtype probe
    is the task's), so it loads its own copy, as the CLI's token-embed does."""
    from embedcli import Embedder

    embedder = Embedder(str(api_model("prompted")), device="cpu", dtype="float32")
    embedder.embed(TEXTS)
    embedder.score("query", TEXTS)
    embedder.embed(TEXTS, prompt_name="query")
    embedder.embed(TEXTS[:2])
    runners = [r for _, r in embedder._runners._runners]
    assert len(runners) == 2 and runners[0].model is runners[1].model
    embedder.token_embed(TEXTS)
    assert len(embedder._runners._runners) == 3 and len(embedder._runners._models) == 2
