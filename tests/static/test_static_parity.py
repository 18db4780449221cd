"""Static embeddings against their own libraries, float32 <= 1e-6: sentence-transformers' StaticEmbedding and
model2vec's StaticModel, on tiny random checkpoints each saved by its library, through `embedcli.Embedder`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.fixtures.static_models import build_m2v, build_st_static, edit_json

SHORT = [
    "the cat sat on the mat",
    "",
    "   ",
    "zzq unknownword ### 42",  # pieces the vocabulary lacks: [UNK] (kept by StaticEmbedding, dropped by model2vec)
    "Bank rates rising; the market's news!",
    "hello",
    "dogs sat, cats sat. markets rise",
]
# Longer rows (~80 tokens), short enough that torch's float32 EmbeddingBag sum stays well within 1e-6 of the
# exact mean (model2vec's 512-token cut gets a 3,000-token text below).
LONG = ["hello world the cat " * 20, "bank rates rise on news " * 15 + "zzq " * 5]
TEXTS = SHORT + LONG


def _embedcli(folder: Path, texts: list[str], **kw: object) -> np.ndarray:
    from embedcli import Embedder

    got = Embedder(str(folder), **kw).embed(texts)  # type: ignore[arg-type]
    assert got.dtype == np.float32
    return got


def _st(folder: Path, texts: list[str], **kw: object) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(folder), device="cpu").encode(texts, convert_to_numpy=True, **kw)


def _m2v(folder: Path, texts: list[str], **load: object) -> np.ndarray:
    from model2vec import StaticModel

    return StaticModel.from_pretrained(str(folder), **load).encode(texts)  # type: ignore[arg-type]


@pytest.mark.parametrize("normalize", [True, False])
def test_sentence_transformers_static_embedding(tmp_path: Path, normalize: bool) -> None:
    folder = build_st_static(tmp_path / "st", normalize=normalize)
    got, want = _embedcli(folder, TEXTS), _st(folder, TEXTS)
    assert np.abs(got - want).max() <= 1e-6
    assert not got[1].any() and not got[2].any()  # no tokens: the zero vector, as EmbeddingBag gives
    if normalize:
        assert np.allclose(np.linalg.norm(got[[0, 3]], axis=1), 1, atol=1e-6)


@pytest.mark.parametrize(
    "build",
    [
        {"normalize": True},
        {"normalize": False},
        {"unigram": True},  # the unknown token found by Unigram's unk_id
        {"weights": True},  # per-token weights (vocabulary-quantized models)
        {"max_length": 6},  # model2vec's cut: max_length x median token length characters, then 6 tokens
        {"max_length": None},  # no cut at all
        {"float16": True, "normalize": False},  # a float16 export: model2vec averages into float16
        {"float16": True, "weights": True},
    ],
    ids=lambda b: "-".join(f"{k}={v}" for k, v in b.items()),
)
def test_model2vec_static_model(tmp_path: Path, build: dict[str, object]) -> None:
    folder = build_m2v(tmp_path / "m2v", **build)  # type: ignore[arg-type]
    texts = [*TEXTS, "the " * 3000]  # model2vec cuts even this to max_length tokens
    got, want = _embedcli(folder, texts), _m2v(folder, texts)
    assert np.abs(got - want).max() <= 1e-6


def test_a_multiword_token_matches_across_a_tab_or_line_break_as_in_model2vec(tmp_path: Path) -> None:
    """model2vec's distill adds multi-word vocabulary as normalized added tokens: they are matched on the normalized
    text, where BERT's normalizer has made a tab or a line break a space."""
    folder = build_m2v(tmp_path / "m2v", multiword=("the cat", "bank rates"))
    texts = ["the\tcat sat", "The\nCat", "BANK\rrates rise", "the cat", "the  cat", "the\r\ncat"]
    got, want = _embedcli(folder, texts), _m2v(folder, texts)
    assert np.abs(got - want).max() <= 1e-6


def test_long_text_without_a_limit_is_the_exact_mean(tmp_path: Path) -> None:
    """StaticEmbedding takes every token: the mean of 3,000 rows, exact (float64 sum) beside torch's float32 one."""
    from tokenizers import Tokenizer

    folder = build_st_static(tmp_path / "st", normalize=False)
    text = "bank rates rise on the market news zzq " * 400
    got = _embedcli(folder, [text])[0]
    from safetensors.numpy import load_file

    table = load_file(str(folder / "model.safetensors"))["embedding.weight"].astype(np.float64)
    ids = Tokenizer.from_file(str(folder / "tokenizer.json")).encode(text, add_special_tokens=False).ids
    assert len(ids) > 3000
    assert np.abs(got - table[ids].mean(axis=0)).max() <= 1e-6
    assert np.abs(got - _st(folder, [text])[0]).max() <= 1e-5  # torch sums 3,000 float32 rows in float32


@pytest.mark.parametrize("dims", [4, 8])
def test_matryoshka_sizes(tmp_path: Path, dims: int) -> None:
    st = build_st_static(tmp_path / "st")
    want = _st(st, TEXTS, truncate_dim=dims, normalize_embeddings=True)
    assert np.abs(_embedcli(st, TEXTS, dimensions=dims) - want).max() <= 1e-6
    m2v = build_m2v(tmp_path / "m2v", pca=True)
    got = _embedcli(m2v, TEXTS, dimensions=dims)
    assert got.shape == (len(TEXTS), dims)
    assert np.abs(got - _m2v(m2v, TEXTS, dimensionality=dims)).max() <= 1e-6


def test_checkpoint_truncate_dim_and_prompts_apply_by_default(tmp_path: Path) -> None:
    folder = build_st_static(tmp_path / "st", truncate_dim=8, prompts={"query": "query: ", "document": ""})
    got = _embedcli(folder, TEXTS)
    assert got.shape == (len(TEXTS), 8)
    assert np.abs(got - _st(folder, TEXTS, normalize_embeddings=True)).max() <= 1e-6
    query = _embedcli(folder, TEXTS, prompt_name="query")
    assert np.abs(query - _st(folder, TEXTS, prompt_name="query", normalize_embeddings=True)).max() <= 1e-6
    assert np.abs(query - got).max() > 1e-3


def test_a_zipped_legacy_layout_reads_the_module_folder(tmp_path: Path) -> None:
    """sentence-transformers 3 saved the StaticEmbedding in 0_StaticEmbedding/ (static-retrieval-mrl-en-v1)."""
    import json
    import shutil

    folder = build_st_static(tmp_path / "st")
    sub = folder / "0_StaticEmbedding"
    sub.mkdir()
    for name in ("model.safetensors", "tokenizer.json"):
        shutil.move(str(folder / name), sub / name)
    modules = json.loads((folder / "modules.json").read_text())
    modules[0].update(path="0_StaticEmbedding", type="sentence_transformers.models.StaticEmbedding")
    modules[1]["type"] = "sentence_transformers.models.Normalize"
    (folder / "modules.json").write_text(json.dumps(modules))
    edit_json(folder / "config_sentence_transformers.json", truncate_dim=None)
    assert np.abs(_embedcli(folder, TEXTS) - _st(folder, TEXTS)).max() <= 1e-6


def test_model2vec_config_without_model_type_is_still_model2vec(tmp_path: Path) -> None:
    """`StaticModel(...).save_pretrained` with no config writes no model_type: the `embeddings` tensor tells."""
    import json

    folder = build_m2v(tmp_path / "m2v", max_length=6)
    config = json.loads((folder / "config.json").read_text())
    for key in ("model_type", "architectures"):
        config.pop(key)
    (folder / "config.json").write_text(json.dumps(config))
    assert np.abs(_embedcli(folder, TEXTS) - _m2v(folder, TEXTS)).max() <= 1e-6


def test_max_length_and_chunk_follow_model2vec(tmp_path: Path) -> None:
    """`--max-length N` is model2vec's `encode(max_length=N)`; `--long-inputs chunk` is every token (no cut)."""
    from embedcli.compute.build import build_engine, embed_recipe
    from embedcli.models.options import ModelOptions
    from embedcli.models.spec import load_model_spec

    folder = build_m2v(tmp_path / "m2v", normalize=False)
    texts = [*TEXTS, "the cat " * 700]
    got = _embedcli(folder, texts, max_length=5)
    assert np.abs(got - _m2v(folder, texts, max_length=5)).max() <= 1e-6
    recipe = embed_recipe(load_model_spec(str(folder)), ModelOptions(device="cpu"), long_inputs="chunk")
    whole = build_engine(recipe).embed(texts)
    assert np.abs(whole - _m2v(folder, texts, max_length=None)).max() <= 1e-6


def test_a_static_model_has_no_torch_runner(tmp_path: Path) -> None:
    from embedcli.compute.build import build_runner, embed_recipe
    from embedcli.errors import UsageError
    from embedcli.models.options import ModelOptions
    from embedcli.models.spec import load_model_spec

    recipe = embed_recipe(load_model_spec(str(build_m2v(tmp_path / "m2v"))), ModelOptions(device="cpu"))
    with pytest.raises(UsageError, match="serves `embed` and `search` only"):
        build_runner(recipe)


@pytest.mark.parametrize("values", [1, 40, 1 << 18])
@pytest.mark.parametrize("kind", ["st", "m2v"])
def test_table_rows_gathered_in_blocks_give_the_same_bits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, values: int, kind: str
) -> None:
    """`mean_rows` gathers a block of rows at a time: every block size gives the one-gather result, bit for bit."""
    import embedcli.models.static as static
    from embedcli.models.spec import load_model_spec

    folder = build_st_static(tmp_path / "st") if kind == "st" else build_m2v(tmp_path / "m2v")
    model = static.StaticModel(load_model_spec(str(folder)))
    batch = model.token_ids(TEXTS * 3, None)
    rows = np.split(batch.ids, np.cumsum(batch.lengths)[:-1])
    table = model.table
    if kind == "st":  # one float64 sum per row, as reduceat does
        want = np.stack([table[r].astype(np.float64).sum(0) / len(r) if len(r) else np.zeros(model.dim) for r in rows])
    else:  # model2vec: `embedding[ids].mean(0)` per row, in float32
        want = np.stack([table[r].mean(0) if len(r) else np.zeros(model.dim, np.float32) for r in rows])
    monkeypatch.setattr(static, "_GATHER_VALUES", values)
    got = model.mean_rows(batch)
    assert np.array_equal(got, want.astype(model.out_dtype))
