"""BGE-M3: dense, lexical weights and colbert vectors (`embed`, `sparse-embed`, `token-embed`, and all three as
columns of one `embed --outputs` run from one forward per pack), and `score` / `rerank --method m3`.

Oracle: FlagEmbedding 1.4.2's `M3Embedder` (`BGEM3FlagModel`) on a tiny random XLM-R saved the way BAAI/bge-m3
ships (sentence-transformers layout + `colbert_linear.pt` + `sparse_linear.pt`), in float32.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

TEXTS = [
    "hello",
    "the quick brown fox jumps over the lazy dog",
    "market shares rise after bank talks",
    " ".join(["the film won best album award in the uk chart"] * 14),  # over the 128-token max length: cut
    "zzz",
    "  outer whitespace kept  ",
    "the of and to in is was for on that with as by at it from he she they",
]
PAIRS = [(TEXTS[i], TEXTS[(i + 2) % len(TEXTS)]) for i in range(len(TEXTS))] + [("fox", "the quick brown fox")]
BUDGETS = [1, 40, 4096]  # 1: a forward per row; 40: a few rows per forward; 4096: every row in one forward


@pytest.fixture(scope="module")
def m3_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.fixtures.bge_m3 import build_bge_m3

    return build_bge_m3(tmp_path_factory.mktemp("bge_m3") / "bge-m3")


@pytest.fixture(scope="module")
def oracle(m3_model: Path) -> Any:
    from tests.fixtures.bge_m3 import m3_embedder_class

    return m3_embedder_class()(str(m3_model), use_fp16=False, devices="cpu", passage_max_length=128,
                               query_max_length=128)


@pytest.fixture(scope="module")
def reference(oracle: Any) -> dict[str, Any]:
    return oracle.encode(TEXTS, return_dense=True, return_sparse=True, return_colbert_vecs=True, batch_size=3)


@pytest.fixture(scope="module")
def texts_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("m3_in") / "texts.jsonl"
    path.write_text("".join(json.dumps({"id": f"t{i}", "text": t}) + "\n" for i, t in enumerate(TEXTS)), encoding="utf-8")
    return path


def _rows(path: Path) -> list[dict[str, Any]]:
    return pq.read_table(path).to_pylist()


def _check_dense(rows: list[dict[str, Any]], reference: dict[str, Any]) -> None:
    got = np.asarray([r["embedding"] for r in rows], dtype=np.float32)
    np.testing.assert_allclose(got, reference["dense_vecs"], rtol=0, atol=1e-5)


def _check_sparse(rows: list[dict[str, Any]], reference: dict[str, Any]) -> None:
    for row, weights in zip(rows, reference["lexical_weights"], strict=True):
        assert row["indices"] == sorted(int(k) for k in weights)  # the same token set, sorted by id
        np.testing.assert_allclose(row["values"], [weights[str(i)] for i in row["indices"]], rtol=0, atol=1e-5)


def _check_colbert(rows: list[dict[str, Any]], reference: dict[str, Any], oracle: Any) -> None:
    for text, row, vectors in zip(TEXTS, rows, reference["colbert_vecs"], strict=True):
        ids = oracle.tokenizer(text, truncation=True, max_length=128)["input_ids"]
        assert row["token_ids"] == ids[1:]  # every token after <s>, the final </s> kept
        np.testing.assert_allclose(np.asarray(row["embeddings"], np.float32), vectors, rtol=0, atol=1e-5)


def test_the_oracle_sees_what_a_real_m3_has(reference: dict[str, Any]) -> None:
    # Guards the fixture: relu leaves some tokens out and keeps others, and the long text is cut.
    sizes = [len(w) for w in reference["lexical_weights"]]
    assert min(sizes) >= 1 and max(sizes) > 10
    assert len(reference["colbert_vecs"][3]) == 127


@pytest.mark.parametrize("budget", BUDGETS)
def test_hybrid_run_equals_flagembedding(cli, m3_model, texts_file, reference, oracle, tmp_path, budget) -> None:
    out = tmp_path / "h.parquet"
    cli("embed", texts_file, "-m", m3_model, "--outputs", "dense,sparse,colbert", "--max-batch-tokens", budget,
        "-o", out, "-q")
    rows = _rows(out)
    assert [r["id"] for r in rows] == [f"t{i}" for i in range(len(TEXTS))]
    _check_dense(rows, reference)
    _check_sparse(rows, reference)
    _check_colbert(rows, reference, oracle)


@pytest.mark.parametrize("budget", BUDGETS)
def test_each_command_gives_flagembedding_numbers(cli, m3_model, texts_file, reference, oracle, tmp_path, budget) -> None:
    common = ("-m", m3_model, "--max-batch-tokens", budget, "-q")
    cli("embed", texts_file, *common, "-o", tmp_path / "d.parquet")
    cli("sparse-embed", texts_file, *common, "-o", tmp_path / "s.parquet")
    cli("token-embed", texts_file, *common, "-o", tmp_path / "c.parquet")
    _check_dense(_rows(tmp_path / "d.parquet"), reference)
    _check_sparse(_rows(tmp_path / "s.parquet"), reference)
    _check_colbert(_rows(tmp_path / "c.parquet"), reference, oracle)


@pytest.mark.parametrize("budget", [40, 4096])
def test_one_forward_per_pack_and_equal_to_three_runs(cli, m3_model, texts_file, tmp_path, budget) -> None:
    common = ("-m", m3_model, "--max-batch-tokens", budget, "-q")
    cli("embed", texts_file, *common, "--outputs", "dense,sparse,colbert", "-o", tmp_path / "h.parquet",
        "--stats", tmp_path / "h.json")
    cli("embed", texts_file, *common, "-o", tmp_path / "d.parquet", "--stats", tmp_path / "d.json")
    cli("sparse-embed", texts_file, *common, "-o", tmp_path / "s.parquet")
    cli("token-embed", texts_file, *common, "-o", tmp_path / "c.parquet")
    hybrid = pq.read_table(tmp_path / "h.parquet")
    assert hybrid.column_names == ["id", "embedding", "indices", "values", "token_ids", "embeddings"]
    for name, columns in (("d", ["id", "embedding"]), ("s", ["indices", "values"]), ("c", ["token_ids", "embeddings"])):
        single = pq.read_table(tmp_path / f"{name}.parquet")
        for column in columns:
            assert single.column(column).equals(hybrid.column(column)), column
    stats = json.loads((tmp_path / "h.json").read_text())
    dense_only = json.loads((tmp_path / "d.json").read_text())
    # Three outputs cost the forwards of one: the same packs, each run once.
    assert stats["forwards"] == dense_only["forwards"] and stats["batches"] == dense_only["batches"]
    if budget == 4096:
        assert stats["forwards"] == stats["batches"] == 1


def test_outputs_subset_and_order(cli, m3_model, texts_file, tmp_path) -> None:
    out = tmp_path / "sc.parquet"
    cli("embed", texts_file, "-m", m3_model, "--outputs", "colbert,sparse", "-o", out, "-q")
    assert pq.read_schema(out).names == ["id", "token_ids", "embeddings", "indices", "values"]


def test_rerun_is_complete_and_another_outputs_set_is_refused(cli, m3_model, texts_file, tmp_path) -> None:
    out = tmp_path / "h.parquet"
    cli("embed", texts_file, "-m", m3_model, "--outputs", "dense,sparse", "-o", out, "-q")
    again = cli("embed", texts_file, "-m", m3_model, "--outputs", "dense,sparse", "-o", out)
    assert "already complete" in again.stderr
    other = cli("embed", texts_file, "-m", m3_model, "--outputs", "dense,colbert", "-o", out, code=2)
    assert "different config" in other.stderr


def _pairs_file(tmp_path: Path) -> Path:
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps({"id": f"p{i}", "left": a, "right": b}) + "\n" for i, (a, b) in enumerate(PAIRS)),
                    encoding="utf-8")
    return path


@pytest.mark.parametrize("weights", [None, (0.4, 0.2, 0.4), (1.0, 0.0, 0.0), (0.0, 0.0, 1.0)])
def test_score_m3_equals_compute_score(cli, m3_model, oracle, tmp_path, weights) -> None:
    flags = () if weights is None else ("--weights", ",".join(map(str, weights)))
    cli("score", _pairs_file(tmp_path), "-m", m3_model, "--method", "m3", *flags, "-o", tmp_path / "s.parquet", "-q")
    # batch_size=1: FlagEmbedding pads a batch's passages with zero colbert vectors that enter its max.
    want = oracle.compute_score(PAIRS, batch_size=1, weights_for_different_modes=list(weights) if weights else None,
                                max_query_length=128, max_passage_length=128)["colbert+sparse+dense"]
    got = [r["score"] for r in _rows(tmp_path / "s.parquet")]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_rerank_m3_orders_as_compute_score(cli, m3_model, oracle, texts_file, tmp_path) -> None:
    query = "the lazy fox"
    cli("rerank", texts_file, "-m", m3_model, "--method", "m3", "--weights", "0.4,0.2,0.4", "--query", query,
        "-o", tmp_path / "r.parquet", "-q")
    want = np.asarray(oracle.compute_score([(query, t) for t in TEXTS], batch_size=1, max_query_length=128,
                                           max_passage_length=128,
                                           weights_for_different_modes=[0.4, 0.2, 0.4])["colbert+sparse+dense"])
    rows = _rows(tmp_path / "r.parquet")
    assert [r["id"] for r in rows] == [f"t{i}" for i in np.argsort(-want, kind="stable")]
    np.testing.assert_allclose([r["score"] for r in rows], np.sort(want)[::-1], rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("embed", "--outputs", "dense,sparse", "--precision", "int8"), "--precision"),
        (("embed", "--outputs", "dense,bogus"), "--outputs"),
        (("token-embed", "--dimensions", "8"), "--dimensions"),
        (("sparse-embed", "--sparse-top-k", "3"), "--sparse-top-k"),
        (("score", "--weights", "1,1,1"), "--method m3"),
        (("score", "--method", "m3", "--weights", "1,1"), "three numbers"),
    ],
)
def test_refusals_on_m3(cli, m3_model, texts_file, tmp_path, args, needle) -> None:
    command, *rest = args
    source = _pairs_file(tmp_path) if command == "score" else texts_file
    result = cli(command, source, "-m", m3_model, *rest, "-o", tmp_path / "x.parquet", code=2)
    assert needle in result.stderr


def test_outputs_need_an_m3_model(cli, st_model, texts_file, tmp_path) -> None:
    result = cli("embed", texts_file, "-m", st_model, "--outputs", "dense,sparse", "-o", tmp_path / "x.parquet", code=2)
    assert "no BGE-M3 heads" in result.stderr
    result = cli("score", _pairs_file(tmp_path), "-m", st_model, "--method", "m3", "-o", tmp_path / "y.parquet", code=2)
    assert "--method m3" in result.stderr


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_safetensors_heads_give_the_same_vectors(cli, m3_model, texts_file, tmp_path) -> None:
    from safetensors.torch import save_file

    folder = _copy(m3_model, tmp_path / "st-heads")
    for stem in ("colbert_linear", "sparse_linear"):
        save_file(torch.load(folder / f"{stem}.pt", weights_only=True), str(folder / f"{stem}.safetensors"))
        (folder / f"{stem}.pt").unlink()
    cli("embed", texts_file, "-m", m3_model, "--outputs", "sparse,colbert", "-o", tmp_path / "a.parquet", "-q")
    cli("embed", texts_file, "-m", folder, "--outputs", "sparse,colbert", "-o", tmp_path / "b.parquet", "-q")
    assert pq.read_table(tmp_path / "a.parquet").equals(pq.read_table(tmp_path / "b.parquet").replace_schema_metadata(
        pq.read_table(tmp_path / "a.parquet").schema.metadata))


class _NotATensor:
    """An object a full unpickler would build (and run code for); the tensors-only loader must refuse it."""

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (print, ("pickled code ran",))


def test_a_head_that_is_not_tensors_only_is_refused(cli, m3_model, texts_file, tmp_path) -> None:
    folder = _copy(m3_model, tmp_path / "bad-head")
    torch.save({"weight": _NotATensor(), "bias": torch.zeros(1)}, folder / "sparse_linear.pt")
    result = cli("sparse-embed", texts_file, "-m", folder, "-o", tmp_path / "x.parquet", code=1)
    assert "tensors-only" in result.stderr and "pickled code ran" not in result.stdout + result.stderr


def test_one_head_alone_is_refused(cli, m3_model, texts_file, tmp_path) -> None:
    folder = _copy(m3_model, tmp_path / "one-head")
    (folder / "colbert_linear.pt").unlink()
    result = cli("embed", texts_file, "-m", folder, "-o", tmp_path / "x.parquet", code=1)
    assert "colbert_linear.pt is missing" in result.stderr


def test_info_and_hub_download_know_the_heads(cli, m3_model) -> None:
    from embedcli.models.checkpoint.download import select_files

    info = json.loads(cli("info", m3_model, "--json").stdout)
    assert {"embed", "sparse-embed", "token-embed", "score", "rerank"} <= set(info["commands"])
    listing = ["config.json", "model.safetensors", "pytorch_model.bin", "colbert_linear.pt", "sparse_linear.pt",
               "onnx/model.onnx", "tokenizer.json"]
    assert set(select_files(listing)) == {"config.json", "model.safetensors", "colbert_linear.pt", "sparse_linear.pt",
                                          "tokenizer.json"}


def test_incremental_hybrid_recomputes_only_new_and_changed_rows(cli, m3_model, texts_file, tmp_path) -> None:
    out = tmp_path / "inc.parquet"
    cli("embed", texts_file, "-m", m3_model, "--outputs", "dense,sparse,colbert", "-o", out, "-q")
    rows = [json.loads(line) for line in texts_file.read_text().splitlines()]
    rows[1]["text"] = "a changed text"
    rows.append({"id": "new", "text": "a brand new row"})
    changed = tmp_path / "changed.jsonl"
    changed.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    cli("embed", changed, "-m", m3_model, "--outputs", "dense,sparse,colbert", "-o", out, "--incremental", "-q",
        "--stats", tmp_path / "inc.json")
    stats = json.loads((tmp_path / "inc.json").read_text())
    assert (stats["computed_rows"], stats["carried_rows"]) == (2, len(TEXTS) - 1)
    cli("embed", changed, "-m", m3_model, "--outputs", "dense,sparse,colbert", "-o", tmp_path / "full.parquet", "-q")
    got, want = _rows(out), _rows(tmp_path / "full.parquet")
    assert [r["id"] for r in got] == [r["id"] for r in want]
    for a, b in zip(got, want, strict=True):
        assert a["indices"] == b["indices"] and a["token_ids"] == b["token_ids"]
        np.testing.assert_allclose(a["embedding"], b["embedding"], atol=1e-5)
        np.testing.assert_allclose(a["values"], b["values"], atol=1e-5)
        np.testing.assert_allclose(np.asarray(a["embeddings"]), np.asarray(b["embeddings"]), atol=1e-5)


def test_the_exact_fallback_gives_the_same_outputs(cli, m3_model, texts_file, reference, oracle, tmp_path) -> None:
    out = tmp_path / "fallback.parquet"
    cli("embed", texts_file, "-m", m3_model, "--outputs", "dense,sparse,colbert", "-o", out, "-q",
        env={"EMBEDCLI_BACKBONE": "transformers"})
    rows = _rows(out)
    _check_dense(rows, reference)
    _check_sparse(rows, reference)
    _check_colbert(rows, reference, oracle)
