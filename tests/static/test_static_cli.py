"""`embedcli embed` on static models through the real runner and files: vectors as the oracle's, the unattended
guarantees (no-op rerun, resume after SIGKILL, --incremental, --shard), exit codes, and no torch import."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.fixtures.static_models import build_m2v, build_st_static
from tests.resume.resume_helpers import corpus_rows, embed_argv, read_stats, subprocess_env, write_jsonl

_PROBE = """
import atexit, runpy, sys
sys.argv = ["embedcli", *sys.argv[1:]]
atexit.register(lambda: print("torch imported:", "torch" in sys.modules, file=sys.stderr))
runpy.run_module("embedcli", run_name="__main__")
"""


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One tiny checkpoint per layout."""
    root = tmp_path_factory.mktemp("static")
    return {"st": build_st_static(root / "st", truncate_dim=8), "m2v": build_m2v(root / "m2v", max_length=12)}


def _vectors(path: Path) -> np.ndarray:
    return np.asarray(pq.read_table(path).column("embedding").to_pylist(), dtype=np.float32)


def _oracle(kind: str, folder: Path, texts: list[str]) -> np.ndarray:
    if kind == "st":
        from sentence_transformers import SentenceTransformer

        return SentenceTransformer(str(folder), device="cpu").encode(texts, normalize_embeddings=True)
    from model2vec import StaticModel

    return StaticModel.from_pretrained(str(folder)).encode(texts)


@pytest.mark.parametrize("kind", ["st", "m2v"])
def test_embed_to_parquet_then_a_rerun_does_nothing(cli, models: dict[str, Path], tmp_path: Path, kind: str) -> None:  # type: ignore[no-untyped-def]
    rows = [*corpus_rows(40, seed=1), {"id": "empty", "text": ""}, {"id": "unk", "text": "zzq qqz ###"}]
    corpus = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.parquet"
    cli("embed", corpus, "-m", models[kind], "-o", out, "--stats", tmp_path / "s.json", "--max-batch-tokens", 64)
    assert pq.read_table(out, columns=["id"]).column("id").to_pylist() == [r["id"] for r in rows]
    want = _oracle(kind, models[kind], [r["text"] for r in rows])
    assert np.abs(_vectors(out) - want).max() <= 1e-6
    stats = read_stats(tmp_path / "s.json")
    assert stats["computed_rows"] == len(rows) and stats["exit_code"] == 0
    meta = pq.read_schema(out).metadata
    config = json.loads(meta[b"embedcli.config"])
    assert config["dtype"] == "float32" and config["dimensions"] == (8 if kind == "st" else None)
    again = cli("embed", corpus, "-m", models[kind], "-o", out, "--max-batch-tokens", 64)
    assert "already complete" in again.stderr


def test_incremental_computes_only_new_and_changed_rows(cli, models: dict[str, Path], tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    rows = corpus_rows(60, seed=2)
    out = tmp_path / "v.parquet"
    cli("embed", write_jsonl(tmp_path / "day1.jsonl", rows), "-m", models["m2v"], "-o", out)
    rows = [dict(r) for r in rows[10:]]
    rows[0]["text"] = "a changed text"
    rows += corpus_rows(5, seed=9, prefix="new")
    today = write_jsonl(tmp_path / "day2.jsonl", rows)
    cli("embed", today, "-m", models["m2v"], "-o", out, "--incremental", "--stats", tmp_path / "s.json")
    stats = read_stats(tmp_path / "s.json")
    assert stats["computed_rows"] == 6 and stats["carried_rows"] == len(rows) - 6
    full = tmp_path / "full.parquet"
    cli("embed", today, "-m", models["m2v"], "-o", full)
    assert np.array_equal(_vectors(out), _vectors(full))


def test_shards_concatenate_to_the_whole_run(cli, models: dict[str, Path], tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    rows = corpus_rows(50, seed=3)
    corpus = write_jsonl(tmp_path / "in.jsonl", rows)
    whole = tmp_path / "whole.parquet"
    cli("embed", corpus, "-m", models["st"], "-o", whole)
    (tmp_path / "parts").mkdir()
    parts = [tmp_path / "parts" / f"p{k}.parquet" for k in range(2)]
    for k, part in enumerate(parts):
        cli("embed", corpus, "-m", models["st"], "-o", part, "--shard", f"{k}/2")
    cli("inspect", tmp_path / "parts", "--check")
    merged = tmp_path / "merged.parquet"
    cli("merge", tmp_path / "parts", "-o", merged)
    assert np.array_equal(_vectors(merged), _vectors(whole))
    assert pq.read_table(merged, columns=["id"]).column("id").to_pylist() == [r["id"] for r in rows]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("classify",), "cannot do 'classify'"),
        (("token-embed",), "cannot do 'token_embed'"),
        (("sparse-embed",), "cannot do 'sparse_embed'"),
        (("embed", "--dtype", "bfloat16"), "computes in float32"),
        (("embed", "--quantize"), "no Linear layers"),
        (("embed", "--dimensions", "99"), "has 16 dims"),
        (("embed", "--engine", "ray"), "runs in this process"),
        (("embed", "--truncation-side", "left"), "--truncation-side left"),
    ],
)
def test_refusals_are_usage_errors(cli, models: dict[str, Path], tmp_path: Path, args: tuple[str, ...], words: str) -> None:  # type: ignore[no-untyped-def]
    corpus = write_jsonl(tmp_path / "in.jsonl", corpus_rows(3))
    result = cli(args[0], corpus, "-m", models["m2v"], "-o", tmp_path / "o.parquet", *args[1:], code=2,
                 env={"EMBEDCLI_DTYPE": ""} if "--dtype" not in args else None)
    assert words in result.stderr
    assert not (tmp_path / "o.parquet").exists()


def test_score_refuses_a_static_model(cli, models: dict[str, Path], tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    pairs = write_jsonl(tmp_path / "p.jsonl", [{"id": "1", "q": "a", "d": "b"}])
    result = cli("score", pairs, "-m", models["st"], "--left-col", "q", "--right-col", "d", "-o", tmp_path / "s.parquet",
                 code=2)
    assert "a static embedding model serves embed only" in result.stderr


def test_bad_rows_skipped_exit_3(cli, models: dict[str, Path], tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    corpus = tmp_path / "in.jsonl"
    corpus.write_text('{"id": "a", "text": "the cat"}\n{"id": "b", "text": null}\nnot json\n{"id": "c", "text": "dog"}\n')
    out = tmp_path / "o.parquet"
    cli("embed", corpus, "-m", models["st"], "-o", out, "--on-error", "skip", "--errors-file", tmp_path / "e.jsonl", code=3)
    assert pq.read_table(out, columns=["id"]).column("id").to_pylist() == ["a", "c"]


def test_long_inputs_error_names_the_row(cli, models: dict[str, Path], tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    corpus = write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "text": "the cat"}, {"id": "long", "text": "the " * 50}])
    result = cli("embed", corpus, "-m", models["m2v"], "-o", tmp_path / "o.parquet", "--long-inputs", "error", code=1)
    assert "'long'" in result.stderr


def test_info_says_what_a_static_model_computes(cli, models: dict[str, Path]) -> None:  # type: ignore[no-untyped-def]
    data = json.loads(cli("info", models["m2v"], "--json").stdout)
    assert data["head"] == "static" and data["tasks"] == ["embed"] and data["static_layout"] == "model2vec"
    assert "unknown token dropped" in data["choices"]["pooling"]
    assert data["choices"]["long texts"].startswith("first 12 tokens")
    assert data["runs_on"].startswith("embedcli's static engine")
    st = json.loads(cli("info", models["st"], "--json").stdout)
    assert st["truncate_dim"] == 8 and st["choices"]["long texts"] == "every token (no limit)"


def test_search_embeds_queries_with_the_static_model(cli, models: dict[str, Path], tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    rows = corpus_rows(20, seed=4)
    corpus = write_jsonl(tmp_path / "docs.jsonl", rows)
    vectors = tmp_path / "v.parquet"
    cli("embed", corpus, "-m", models["st"], "-o", vectors)
    queries = write_jsonl(tmp_path / "q.jsonl", [{"id": "q", "text": rows[7]["text"]}])
    hits = tmp_path / "hits.parquet"
    cli("search", vectors, "--queries", queries, "--top-k", 3, "-o", hits)
    table = pq.read_table(hits).to_pylist()
    assert table[0]["id"] == rows[7]["id"] and abs(table[0]["score"] - 1) <= 1e-5


def _fresh(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _PROBE, *map(str, args)], capture_output=True, text=True,
                          env=subprocess_env(), timeout=120)


def test_the_static_path_never_imports_torch(models: dict[str, Path], tmp_path: Path) -> None:
    corpus = write_jsonl(tmp_path / "in.jsonl", corpus_rows(30, seed=5))
    for kind in ("st", "m2v"):
        done = _fresh("embed", corpus, "-m", models[kind], "-o", tmp_path / f"{kind}.parquet")
        assert done.returncode == 0, done.stderr
        assert done.stderr.strip().splitlines()[-1] == "torch imported: False", done.stderr
    info = _fresh("info", models["st"])
    assert info.returncode == 0 and info.stderr.strip().splitlines()[-1] == "torch imported: False"


def _committed(out: Path) -> int:
    manifest = Path(f"{out}.embedcli-staging") / "_embedcli" / "manifest.json"
    try:
        return int(json.loads(manifest.read_text())["records_done"])
    except (OSError, ValueError, KeyError):
        return -1


def test_sigkill_mid_run_resumes_to_the_same_bytes(models: dict[str, Path], tmp_path: Path) -> None:
    rows = corpus_rows(30_000, seed=6)
    corpus = write_jsonl(tmp_path / "in.jsonl", rows)
    flags = ("-m", models["m2v"], "--shard-rows", 500, "--max-batch-tokens", 256, "-q")
    ref = tmp_path / "ref.parquet"
    done = subprocess.run(embed_argv(corpus, "-o", ref, *flags), env=subprocess_env(), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    out = tmp_path / "killed.parquet"
    proc = subprocess.Popen(embed_argv(corpus, "-o", out, *flags), env=subprocess_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while _committed(out) < 1000 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None, "the run finished before it could be killed; make the corpus bigger"
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    partial = _committed(out)
    assert 0 < partial < len(rows) and not out.exists()
    stats = tmp_path / "s.json"
    again = subprocess.run(embed_argv(corpus, "-o", out, *flags, "--stats", stats), env=subprocess_env(),
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert read_stats(stats)["resumed_rows"] >= partial
    assert out.read_bytes() == ref.read_bytes()
