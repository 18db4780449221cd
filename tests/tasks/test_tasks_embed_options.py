"""`embedcli embed` options against sentence-transformers: a CLS + Dense + Normalize stack, --dimensions, prompts,
every --precision, --calibration, and --long-inputs chunk / error."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

TEXTS = [
    "Labour won the general election with a reduced majority.",
    "The striker scored twice as United beat Chelsea.",
    "Shares in the bank fell 5% after profits dropped.",
    "hello",
    "Kyrgyz elections use invisible ink to stop people voting twice.",
    "The new phone runs software from the internet giant.",
    "Oil prices rose after the cartel cut output.",
    "The band's album topped the chart for a third week.",
]


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


@pytest.fixture
def corpus(tmp_path):  # type: ignore[no-untyped-def]
    src = tmp_path / "corpus.jsonl"
    src.write_text("".join(json.dumps({"id": f"r{i}", "text": t}) + "\n" for i, t in enumerate(TEXTS)))
    return src


def _embed(cli, src, tmp_path, *flags, name="out.parquet"):  # type: ignore[no-untyped-def]
    out = tmp_path / name
    cli("embed", src, "-o", out, "-q", *flags)
    return np.stack(pq.read_table(out).column("embedding").to_numpy(zero_copy_only=False)), out


@pytest.fixture(scope="module")
def st_stack(task_models, two_threads):  # type: ignore[no-untyped-def]
    from sentence_transformers import SentenceTransformer

    folder = task_models("st-cls-dense")
    return folder, SentenceTransformer(str(folder), device="cpu")


def test_cls_dense_normalize_stack_dimensions_and_prompts(cli, st_stack, corpus, tmp_path):
    folder, st = st_stack
    cases = [
        ((), {}),
        (("--dimensions", "64"), {"truncate_dim": 64, "normalize_embeddings": True}),
        (("--prompt-name", "query"), {"prompt_name": "query"}),
        (("--prompt", "search: ", "--dimensions", "32"), {"prompt": "search: ", "truncate_dim": 32,
                                                          "normalize_embeddings": True}),
    ]
    for i, (flags, st_kwargs) in enumerate(cases):
        ours, _ = _embed(cli, corpus, tmp_path, "-m", folder, *flags, name=f"o{i}.parquet")
        theirs = st.encode(TEXTS, **st_kwargs)
        assert ours.shape == theirs.shape, flags
        print(f"ST stack {' '.join(flags) or '(defaults)'}: min cosine {_cos(ours, theirs).min():.8f}")
        assert _cos(ours, theirs).min() >= 0.99999, (flags, _cos(ours, theirs).min())
        assert np.allclose(np.linalg.norm(ours, axis=1), 1, atol=1e-5)  # sliced vectors are re-normalized
    info = json.loads(cli("info", folder, "--json").stdout)
    assert info["seq_pooling_type"] == "CLS" and info["embedding_size"] == 128 and info["normalize"] is True
    assert info["matryoshka_dimensions"] == [128, 64, 32] and "embed" in info["commands"]


def test_dimensions_and_prompt_names_are_validated(cli, st_stack, corpus, tmp_path):
    folder, _ = st_stack
    err = cli("embed", corpus, "-m", folder, "--dimensions", "50", "-o", tmp_path / "x.parquet", code=2)
    assert "not one of the model's Matryoshka sizes: 128, 64, 32" in err.stderr
    # MiniLM declares no Matryoshka dims: truncated with a note (tests/models/test_st_parity.py), but never widened.
    err = cli("embed", corpus, "--dimensions", "385", "-o", tmp_path / "x.parquet", code=2)
    assert "dimensions 385 exceeds the embedding size 384" in err.stderr
    err = cli("embed", corpus, "-m", folder, "--prompt-name", "nope", "-o", tmp_path / "x.parquet", code=2)
    assert "'nope' is not one of the model's prompts (document, query)" in err.stderr
    err = cli("embed", corpus, "--precision", "int4", "-o", tmp_path / "x.parquet", code=2)
    assert not (tmp_path / "x.parquet").exists()


@pytest.fixture(scope="module")
def minilm_st(minilm_path, two_threads):  # type: ignore[no-untyped-def]
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_path), device="cpu")


def test_every_precision_equals_sentence_transformers(cli, minilm_st, corpus, tmp_path):
    from sentence_transformers.util.quantization import quantize_embeddings

    floats, _ = _embed(cli, corpus, tmp_path, name="f32.parquet")
    assert _cos(floats, minilm_st.encode(TEXTS)).min() >= 0.99999
    for precision, dtype, width in (
        ("float16", np.float16, 384), ("int8", np.int8, 384), ("uint8", np.uint8, 384),
        ("binary", np.int8, 48), ("ubinary", np.uint8, 48),
    ):
        got, out = _embed(cli, corpus, tmp_path, "--precision", precision, name=f"{precision}.parquet")
        assert got.dtype == dtype and got.shape == (len(TEXTS), width), precision
        if precision == "float16":
            assert np.array_equal(got, floats.astype(np.float16))
            continue
        # exactly sentence-transformers' quantize_embeddings of our float32 output (ranges over the whole output)
        assert np.array_equal(got, quantize_embeddings(floats, precision)), precision
        # end to end against SentenceTransformer.encode(precision=...): binary bits agree exactly; int8/uint8
        # agree except where a value sits on a bucket edge (float32 vectors differ by ~6e-8)
        theirs = minilm_st.encode(TEXTS, precision=precision)
        if precision.endswith("binary"):
            assert np.array_equal(got, theirs), precision
        else:
            diff = np.abs(got.astype(np.int64) - theirs.astype(np.int64))
            print(f"{precision} vs encode(precision=): {(diff != 0).sum()} of {diff.size} values off by {diff.max()}")
            assert diff.max() <= 1, (precision, diff.max())
            # each value that differs sits within 1e-6 of a bucket edge of their grid (their ranges)
            st_floats = minilm_st.encode(TEXTS)
            starts, steps = st_floats.min(0), (st_floats.max(0) - st_floats.min(0)) / 255
            position = (floats - starts) / steps
            edge_distance = np.abs(position - np.round(position)) * steps
            assert edge_distance[diff != 0].max(initial=0) <= 1e-6, (precision, edge_distance[diff != 0].max())
            meta = json.loads(pq.read_schema(out).metadata[b"embedcli.quantization"])
            assert np.allclose(meta["ranges"], [floats.min(0), floats.max(0)])
    assert not list(tmp_path.glob("*.embedcli-float32*"))  # the int8/uint8 float32 spool (and its index) is gone


def test_int8_output_is_resumable_idempotent_and_refuses_to_mix(cli, corpus, tmp_path, monkeypatch):
    _, out = _embed(cli, corpus, tmp_path, "--precision", "int8", name="q.parquet")
    before = out.read_bytes()
    again = cli("embed", corpus, "-o", out, "--precision", "int8")  # same job: nothing to do
    assert "already complete" in again.stderr and out.read_bytes() == before
    err = cli("embed", corpus, "-o", out, "-q", "--precision", "uint8", code=2)
    assert "different config" in err.stderr and out.read_bytes() == before
    cli("embed", corpus, "-o", out, "-q", "--precision", "uint8", "--overwrite")
    assert pq.read_table(out).schema.field("embedding").type.value_type == "uint8"
    # a run that dies after the float32 spool was committed resumes from it (no forward pass left to do)
    import embedcli.tasks.embed

    def die(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise OSError("disk full")

    monkeypatch.setattr(embedcli.tasks.embed, "_quantize_spool", die)
    cli("embed", corpus, "-o", tmp_path / "r.parquet", "-q", "--precision", "int8", code=1)
    monkeypatch.undo()
    spool = tmp_path / ("r.parquet" + ".embedcli-float32.parquet")
    assert spool.exists() and not (tmp_path / "r.parquet").exists()
    stats = tmp_path / "stats.json"
    resumed, _ = _embed(cli, corpus, tmp_path, "--precision", "int8", "--stats", stats, name="r.parquet")
    assert json.loads(stats.read_text())["computed_rows"] == 0 and not spool.exists()
    assert resumed.dtype == np.int8 and resumed.shape == (len(TEXTS), 384)


@pytest.mark.parametrize("precision", ["int8", "uint8"])
def test_one_row_int8_is_refused_leaving_no_spool(cli, st_model, tmp_path, precision):  # type: ignore[no-untyped-def]
    """sentence-transformers refuses ranges from a single embedding, so does embedcli (exit 2); the float32
    spool it computed first was left beside the output, where no later run (with --calibration) removed it."""
    src = tmp_path / "one.jsonl"
    src.write_text(json.dumps({"id": "a", "text": "a lone row"}) + "\n")
    out = tmp_path / "q.parquet"
    err = cli("embed", src, "-m", st_model, "-o", out, "-q", "--precision", precision, code=2)
    assert "ranges cannot be computed from a single embedding" in err.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one.jsonl"]


def test_calibration_file_and_reused_ranges(cli, corpus, tmp_path):
    from sentence_transformers.util.quantization import quantize_embeddings

    floats, _ = _embed(cli, corpus, tmp_path, name="f32.parquet")
    rng = np.random.default_rng(0)
    calibration = (rng.standard_normal((50, 384)) * 0.05).astype(np.float32)
    np.save(tmp_path / "cal.npy", calibration)
    got, out = _embed(cli, corpus, tmp_path, "--precision", "int8", "--calibration", tmp_path / "cal.npy",
                      name="cal.parquet")
    assert np.array_equal(got, quantize_embeddings(floats, "int8", calibration_embeddings=calibration))
    # an earlier int8 output's stored ranges are reused as they are (queries quantized like their corpus)
    queries = tmp_path / "q.txt"
    queries.write_text("interest rates\nfootball\n")
    q_out = tmp_path / "q.jsonl"
    cli("embed", queries, "-o", q_out, "-q", "--precision", "int8", "--calibration", out)
    q_float, _ = _embed(cli, queries, tmp_path, name="qf.parquet")
    q_int = np.asarray([json.loads(line)["embedding"] for line in q_out.read_text().splitlines()])
    ranges = np.vstack([calibration.min(0), calibration.max(0)])
    assert np.array_equal(q_int, quantize_embeddings(q_float, "int8", ranges=ranges))
    err = cli("embed", queries, "-o", tmp_path / "x.parquet", "--precision", "binary", "--calibration", out, code=2)
    assert "--calibration applies to --precision int8 or uint8" in err.stderr


def test_long_inputs_chunk_equals_token_weighted_mean_by_hand(cli, minilm_path, tmp_path, two_threads):
    """A text of ~5x the max length (256): non-overlapping 256-token slices, each mean-pooled, token-weighted
    mean, then normalized once (--no-normalize: the plain weighted mean, which is also vLLM's result)."""
    from transformers import AutoModel, AutoTokenizer

    long_text = " ".join(["The minister said the party would cut taxes and raise spending on schools."] * 92)
    src = tmp_path / "long.jsonl"
    src.write_text(json.dumps({"id": "long", "text": long_text}) + "\n" + json.dumps({"id": "s", "text": "hi"}) + "\n")
    tok = AutoTokenizer.from_pretrained(str(minilm_path))
    model = AutoModel.from_pretrained(str(minilm_path)).eval()
    ids = tok(long_text)["input_ids"]
    assert 5 * 256 - 64 <= len(ids) <= 5 * 256 + 64, len(ids)
    chunks = [ids[i : i + 256] for i in range(0, len(ids), 256)]
    with torch.inference_mode():
        pooled = np.stack([model(input_ids=torch.tensor([c])).last_hidden_state[0].double().mean(0).numpy() for c in chunks])
    weights = np.array([len(c) for c in chunks], dtype=np.float64)
    mean = (weights[:, None] * pooled).sum(0) / weights.sum()
    stats = tmp_path / "stats.json"
    got, _ = _embed(cli, src, tmp_path, "--long-inputs", "chunk", "--stats", stats, name="chunk.parquet")
    print(f"chunk ({len(ids)} tokens, {len(chunks)} chunks): max |delta| {np.abs(got[0] - mean / np.linalg.norm(mean)).max():.2e}")
    assert np.abs(got[0] - mean / np.linalg.norm(mean)).max() <= 1e-5
    raw, _ = _embed(cli, src, tmp_path, "--long-inputs", "chunk", "--no-normalize", name="raw.parquet")
    assert np.abs(raw[0] - mean).max() <= 1e-5
    report = json.loads(stats.read_text())
    assert report["chunked_rows"] == 1 and report["tokens"] == len(ids) + 3  # every token counted, + "hi"


def test_long_inputs_error_exits_1_naming_the_row_and_its_length(cli, tmp_path):
    long_text = " ".join(["word"] * 300)
    src = tmp_path / "docs.jsonl"
    src.write_text(json.dumps({"id": "ok", "text": "short"}) + "\n" + json.dumps({"id": "too-long", "text": long_text}) + "\n")
    err = cli("embed", src, "--long-inputs", "error", "-o", tmp_path / "x.parquet", code=1)
    assert "docs.jsonl line 2 (id 'too-long') has 302 tokens" in err.stderr and "max length 256" in err.stderr
    assert not (tmp_path / "x.parquet").exists()
