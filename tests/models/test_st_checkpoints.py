"""Checkpoints saved by sentence-transformers 6 itself score through the CLI as their own library scores them,
or are refused with exit 2 and one `embedcli: error:` line naming the file and key (issue 12)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from tests.fixtures.tiny_models import build_st_model, copy_model, edit_json

PAIRS = [
    ("hello", "the quick brown fox jumps over the lazy dog"),
    ("market shares rise", "bank talks after the election"),
    ("  spaced query ", "zzz"),
    ("the film", "the film won best album award in the uk chart"),
]
TEXTS = ["hello", "the quick brown fox jumps over the lazy dog", "market shares rise after bank talks"]
WHITESPACE_TEXTS = ["  the   market  ", "\tbank talks\n", "the film  won ", " hello", "zzz  \n\n"]


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _pairs_file(tmp_path: Path) -> Path:
    return _jsonl(tmp_path / "pairs.jsonl", [{"id": i, "left": a, "right": b} for i, (a, b) in enumerate(PAIRS)])


def _texts_file(tmp_path: Path, texts: list[str], name: str = "texts.jsonl") -> Path:
    return _jsonl(tmp_path / name, [{"id": i, "text": t} for i, t in enumerate(texts)])


def _scores(path: Path) -> np.ndarray:
    return np.array([json.loads(line)["score"] for line in path.read_text().splitlines()], dtype=np.float64)


def _vectors(path: Path) -> np.ndarray:
    return np.stack(pq.read_table(path).column("embedding").to_numpy(zero_copy_only=False))


def _one_error_line(stderr: str, *needles: str) -> None:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("embedcli: error: "), stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def _info(cli, folder: Path) -> dict:  # type: ignore[no-untyped-def]
    return json.loads(cli("info", folder, "--json").stdout)


@pytest.fixture(scope="module")
def cross_encoders(tiny_model, tmp_path_factory) -> Callable[[str], Path]:  # type: ignore[no-untyped-def]
    """`cross_encoders(name) -> folder` saved by `CrossEncoder.save_pretrained` (sentence-transformers 6)."""
    from sentence_transformers import CrossEncoder

    root = tmp_path_factory.mktemp("cross_encoders")
    kinds = {"identity": (1, torch.nn.Identity()), "tanh": (1, torch.nn.Tanh()), "sigmoid": (1, None), "three": (3, None)}
    built: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in built:
            num_labels, activation = kinds[name]
            torch.manual_seed(7)
            ce = CrossEncoder(str(tiny_model("bert")), num_labels=num_labels, activation_fn=activation, device="cpu")
            with torch.no_grad():  # a head wide enough that the activation matters
                ce.model.classifier.weight.normal_(0.0, 2.0)
                ce.model.classifier.bias.normal_(0.0, 1.0)
            ce.save_pretrained(str(root / name))
            built[name] = root / name
        return built[name]

    return get


# -- 1. CrossEncoder activation_fn from config_sentence_transformers.json -----------------------------------------
@pytest.mark.parametrize(("name", "activation"), [("identity", "Identity"), ("tanh", "Tanh"), ("sigmoid", "Sigmoid")])
def test_cross_encoder_score_equals_predict(name, activation, cli, cross_encoders, tmp_path) -> None:
    from sentence_transformers import CrossEncoder

    folder = cross_encoders(name)
    expected = CrossEncoder(str(folder), device="cpu").predict(PAIRS)
    out = tmp_path / "scores.jsonl"
    cli("score", _pairs_file(tmp_path), "-m", folder, "-o", out, "-q")
    delta = np.abs(_scores(out) - expected).max()
    print(f"{name}: score vs CrossEncoder.predict max |delta| {delta:.2e}")
    assert delta <= 1e-5, delta
    choices = _info(cli, folder)["choices"]
    source = "config_sentence_transformers.json: activation_fn"
    assert choices["activation"] == f"{activation} ({source})"


def test_three_label_cross_encoder_default_is_identity(cli, cross_encoders, tmp_path) -> None:
    """sentence-transformers 6 saves Identity for a 3-label CrossEncoder: classify gives the raw logits."""
    from sentence_transformers import CrossEncoder
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    folder = cross_encoders("three")
    assert isinstance(CrossEncoder(str(folder), device="cpu").activation_fn, torch.nn.Identity)
    model = AutoModelForSequenceClassification.from_pretrained(str(folder)).eval()
    batch = AutoTokenizer.from_pretrained(str(folder))(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**batch).logits.double().numpy()
    out = tmp_path / "labels.parquet"
    cli("classify", _texts_file(tmp_path, TEXTS), "-m", folder, "--all-scores", "-o", out, "-q")
    got = np.stack(pq.read_table(out).column("scores").to_numpy(zero_copy_only=False)).astype(np.float64)
    assert np.abs(got - logits).max() <= 1e-5
    assert _info(cli, folder)["choices"]["activation"] == "Identity (config_sentence_transformers.json: activation_fn)"


# -- 2. a CrossEncoder built from modules is refused, never scored as a bi-encoder -----------------------------------
def test_modular_cross_encoder_is_refused(cli, tiny_model, tmp_path) -> None:
    folder = build_st_model(tiny_model("bert"), tmp_path / "modular-ce", dense_out=1, normalize=False)
    edit_json(folder / "config_sentence_transformers.json", lambda c: c.update(model_type="CrossEncoder"))
    for command in ("score", "rerank"):
        extra = ("--query", "hello") if command == "rerank" else ()
        inputs = _pairs_file(tmp_path) if command == "score" else _texts_file(tmp_path, TEXTS)
        err = cli(command, inputs, "-m", folder, *extra, "-o", tmp_path / f"{command}.jsonl", code=2)
        _one_error_line(err.stderr, str(folder / "config_sentence_transformers.json"), "model_type 'CrossEncoder'")
        assert not (tmp_path / f"{command}.jsonl").exists()


# -- 3. a row with no tokens is a row, not the end of the run ---------------------------------------------------------
@pytest.mark.parametrize("strip", [False, True])
def test_empty_rows_on_a_tokenizer_without_special_tokens(strip, cli, tiny_model, tmp_path) -> None:
    from sentence_transformers import SentenceTransformer

    folder = tiny_model("qwen2-st6")
    texts = ["", "hello", "   ", "the quick brown fox", "\t\n"]
    out = tmp_path / "v.parquet"
    cli("embed", _texts_file(tmp_path, texts), "-m", folder, "-o", out, "-q", *(["--strip"] if strip else []))
    expected = SentenceTransformer(str(folder), device="cpu").encode([t.strip() if strip else t for t in texts])
    got = _vectors(out)
    assert np.abs(got - expected).max() <= 1e-5
    assert not got[[0, 2, 4]].any()  # sentence-transformers' masked mean: zeros, kept zero by Normalize


# -- 4. refused values: one line, exit 2, file and key ------------------------------------------------------------------
def test_cross_encoder_activation_outside_torch_is_refused(cli, cross_encoders, tmp_path) -> None:
    folder = copy_model(cross_encoders("identity"), tmp_path / "evil")
    edit_json(folder / "config_sentence_transformers.json", lambda c: c.update(activation_fn="os.system"))
    err = cli("score", _pairs_file(tmp_path), "-m", folder, "-o", tmp_path / "s.jsonl", code=2)
    _one_error_line(err.stderr, str(folder / "config_sentence_transformers.json"), "activation_fn 'os.system'")
    err = cli("info", folder, code=2)
    _one_error_line(err.stderr, "activation_fn 'os.system'")


def test_dense_activation_outside_torch_is_refused(cli, tiny_model, tmp_path) -> None:
    folder = copy_model(tiny_model("bert-st6-dense"), tmp_path / "evil")
    dense = next(p for p in folder.iterdir() if p.name.endswith("_Dense"))
    edit_json(dense / "config.json", lambda c: c.update(activation_function="os.system"))
    err = cli("embed", _texts_file(tmp_path, TEXTS), "-m", folder, "-o", tmp_path / "v.parquet", code=2)
    _one_error_line(err.stderr, str(dense / "config.json"), "activation_function 'os.system'")


def test_max_length_beyond_positions_is_refused(cli, tiny_model, tmp_path) -> None:
    folder = tiny_model("bert-st6")  # 128 positions
    err = cli("embed", _texts_file(tmp_path, TEXTS), "-m", folder, "--max-length", 129, "-o", tmp_path / "v.parquet", code=2)
    _one_error_line(err.stderr, "--max-length 129", str(folder / "config.json"), "max_position_embeddings")


# -- 5. a list pooling_mode is named as written ----------------------------------------------------------------------
def test_bad_list_pooling_mode_is_named_in_the_refusal(cli, tiny_model, tmp_path) -> None:
    folder = copy_model(tiny_model("bert-st6"), tmp_path / "m")
    pooling = folder / "1_Pooling" / "config.json"
    edit_json(pooling, lambda c: c.update(pooling_mode=["cls", "median"]))
    err = cli("embed", _texts_file(tmp_path, TEXTS), "-m", folder, "-o", tmp_path / "v.parquet", code=2)
    _one_error_line(err.stderr, str(pooling), 'pooling_mode ["cls", "median"]')


# -- 6. whitespace is kept by default, as sentence-transformers 6 -------------------------------------------------------
def test_bpe_whitespace_equals_sentence_transformers_6(cli, tiny_model, tmp_path) -> None:
    from sentence_transformers import SentenceTransformer

    folder = tiny_model("roberta-bpe-st6")
    src = _texts_file(tmp_path, WHITESPACE_TEXTS)
    expected = SentenceTransformer(str(folder), device="cpu").encode(WHITESPACE_TEXTS)
    out = tmp_path / "v.parquet"
    cli("embed", src, "-m", folder, "-o", out, "-q")
    assert np.abs(_vectors(out) - expected).max() <= 1e-5
    stripped = tmp_path / "stripped.parquet"
    cli("embed", src, "-m", folder, "-o", stripped, "-q", "--strip")
    assert np.abs(_vectors(stripped) - expected).max() > 1e-2  # the tokenizer sees the whitespace
    # An output made with the other whitespace rule is a different config: refused without --overwrite.
    err = cli("embed", src, "-m", folder, "-o", stripped, "-q", code=2)
    assert "--overwrite" in err.stderr


# -- 7. similarity_fn_name is the bi-encoder's score --------------------------------------------------------------------
@pytest.mark.parametrize("similarity", ["dot", "manhattan", "euclidean", None])
def test_score_and_rerank_use_model_similarity(similarity, cli, tiny_model, tmp_path) -> None:
    from sentence_transformers import SentenceTransformer

    folder = build_st_model(tiny_model("bert"), tmp_path / "bi", normalize=False, similarity_fn_name=similarity)
    st = SentenceTransformer(str(folder), device="cpu")
    lefts, rights = (list(side) for side in zip(*PAIRS, strict=True))
    expected = st.similarity(st.encode_query(lefts), st.encode_document(rights)).diagonal().numpy()
    out = tmp_path / "scores.jsonl"
    cli("score", _pairs_file(tmp_path), "-m", folder, "-o", out, "-q")
    assert np.abs(_scores(out) - expected).max() <= 1e-4 * max(1.0, np.abs(expected).max())
    docs = _texts_file(tmp_path, rights, "docs.jsonl")
    ranked = tmp_path / "ranked.jsonl"
    cli("rerank", docs, "-m", folder, "--query", lefts[0], "-o", ranked, "-q")
    want = st.similarity(st.encode_query([lefts[0]]), st.encode_document(rights))[0].numpy()
    got = {int(json.loads(line)["id"]): json.loads(line)["score"] for line in ranked.read_text().splitlines()}
    assert np.abs(np.array([got[i] for i in range(len(rights))]) - want).max() <= 1e-4 * max(1.0, np.abs(want).max())
    source = "config_sentence_transformers.json: similarity_fn_name"
    assert _info(cli, folder)["choices"]["similarity"] == f"{similarity or 'cosine'} ({source})"


# -- --dimensions on a model without Matryoshka sizes -------------------------------------------------------------------
def test_dimensions_truncate_any_model_with_one_note(cli, tiny_model, tmp_path) -> None:
    from sentence_transformers import SentenceTransformer

    folder = tiny_model("bert-st6")
    expected = SentenceTransformer(str(folder), device="cpu").encode(TEXTS, truncate_dim=8, normalize_embeddings=True)
    out = tmp_path / "v.parquet"
    result = cli("embed", _texts_file(tmp_path, TEXTS), "-m", folder, "--dimensions", 8, "-o", out, "-q")
    assert np.abs(_vectors(out) - expected).max() <= 1e-5
    notes = [line for line in result.stderr.splitlines() if "Matryoshka" in line]
    assert len(notes) == 1 and "not trained for truncation" in notes[0]
    err = cli("embed", _texts_file(tmp_path, TEXTS), "-m", folder, "--dimensions", 33, "-o", tmp_path / "w.parquet", code=2)
    assert "exceeds the embedding size 32" in err.stderr


# -- info: pooling modes and prompt handling with their sources ---------------------------------------------------------
def test_info_shows_pooling_and_prompt_handling(cli, tiny_model, tmp_path) -> None:
    folder = build_st_model(tiny_model("bert"), tmp_path / "instr", pooling=("cls", "mean"), include_prompt=False)
    info = _info(cli, folder)
    assert info["seq_pooling_type"] == "CLS+MEAN" and info["embedding_size"] == 64
    assert info["choices"]["pooling"] == "cls + mean (1_Pooling/config.json: pooling_mode)"
    assert info["choices"]["prompt tokens"] == "excluded from pooling (include_prompt=false) (1_Pooling/config.json)"
    table = cli("info", folder).stdout
    assert "excluded from pooling" in table and "cosine" in table


# -- where a mode is not defined, it is refused -------------------------------------------------------------------------
@pytest.mark.parametrize(("pooling", "include_prompt"), [("max", True), (("cls", "mean"), True), ("mean", False)])
def test_long_inputs_chunk_refused_where_undefined(pooling, include_prompt, cli, tiny_model, tmp_path) -> None:
    folder = build_st_model(tiny_model("bert"), tmp_path / "m", pooling=pooling, include_prompt=include_prompt)
    err = cli("embed", _texts_file(tmp_path, TEXTS), "-m", folder, "--long-inputs", "chunk", "-o", tmp_path / "v.parquet",
              code=2)
    assert "--long-inputs chunk is not defined" in err.stderr and "1_Pooling/config.json" in err.stderr


def test_score_refuses_prompts_it_cannot_exclude(cli, tiny_model, tmp_path) -> None:
    folder = build_st_model(tiny_model("bert"), tmp_path / "m", include_prompt=False, prompts={"query": "query: "})
    err = cli("score", _pairs_file(tmp_path), "-m", folder, "-o", tmp_path / "s.jsonl", code=2)
    assert "include_prompt=false" in err.stderr


def test_empty_row_in_token_embed(cli, tiny_model, tmp_path) -> None:
    out = tmp_path / "t.parquet"
    cli("token-embed", _texts_file(tmp_path, ["", "hello world"]), "-m", tiny_model("qwen2-st6"), "-o", out, "-q")
    rows = pq.read_table(out).column("embeddings").to_pylist()
    assert len(rows[0]) == 0 and len(rows[1]) > 0


def test_left_truncation_with_an_excluded_prompt_is_refused(cli, tiny_model, tmp_path) -> None:
    folder = build_st_model(tiny_model("bert"), tmp_path / "m", include_prompt=False, prompts={"query": "query: "})
    err = cli("embed", _texts_file(tmp_path, TEXTS), "-m", folder, "--prompt-name", "query", "--truncation-side", "left",
              "-o", tmp_path / "v.parquet", code=2)
    assert "truncation side left (--truncation-side) with include_prompt=false" in err.stderr
