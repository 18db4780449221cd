"""sentence-transformers module stacks whose order or options change the numbers: each equals `encode` on a tiny
checkpoint saved by `SentenceTransformer(modules=[...]).save`, or is refused at load (exit 2, one line naming the
file), never run in embedcli's own order with exit 0."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from test_st_checkpoints import _one_error_line, _vectors

from tests.fixtures.tiny_models import LONG_TEXT, SAMPLE_TEXTS

TEXTS = [*SAMPLE_TEXTS, LONG_TEXT, "", "!!! ???"]


def _texts_file(tmp_path: Path, texts: list[str]) -> Path:
    path = tmp_path / "texts.jsonl"
    path.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts)), encoding="utf-8")
    return path


def _save(base: Path, folder: Path, stack: str, **st_kwargs: object) -> Path:
    """`SentenceTransformer(modules=...).save(folder)` of the stack named `stack` around `base`."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense, Normalize, Pooling, Transformer

    torch.manual_seed(3)
    transformer = Transformer(str(base), max_seq_length=64)
    hidden = transformer.get_embedding_dimension()
    stacks = {
        "normalize-then-dense": lambda: [Pooling(hidden, "mean"), Normalize(), Dense(hidden, 8)],
        "token-dense": lambda: [Dense(hidden, 16, module_input_name="token_embeddings"), Pooling(16, "mean"), Normalize()],
        "dense-elsewhere": lambda: [Pooling(hidden, "mean"), Dense(hidden, 16, module_output_name="projected")],
        "mean": lambda: [Pooling(hidden, "mean")],
        "mean-normalize": lambda: [Pooling(hidden, "mean"), Normalize()],
    }
    SentenceTransformer(modules=[transformer, *stacks[stack]()], device="cpu", **st_kwargs).save(str(folder))
    return folder


# -- module order: what embedcli would run as pool -> project -> normalize is refused --------------------------------------
@pytest.mark.parametrize(
    ("stack", "needle"),
    [
        ("normalize-then-dense", "follows Normalize"),
        ("token-dense", "Dense ('1_Dense') before Pooling"),
        ("dense-elsewhere", "module_output_name 'projected'"),
    ],
)
def test_stack_run_in_another_order_is_refused(stack, needle, cli, tiny_model, tmp_path) -> None:
    from sentence_transformers import SentenceTransformer

    folder = _save(tiny_model("bert"), tmp_path / stack, stack)
    SentenceTransformer(str(folder), device="cpu").encode(TEXTS[:2])  # a layout its own library runs
    out = tmp_path / "v.parquet"
    err = cli("embed", _texts_file(tmp_path, TEXTS), "-m", folder, "-o", out, code=2)
    _one_error_line(err.stderr, str(folder), needle)
    assert not out.exists()


# -- truncate_dim in config_sentence_transformers.json: encode's default size ------------------------------------------------
@pytest.mark.parametrize("stack", ["mean", "mean-normalize"])
def test_saved_truncate_dim_is_the_default_size(stack, cli, tiny_model, tmp_path) -> None:
    from sentence_transformers import SentenceTransformer

    folder = _save(tiny_model("bert"), tmp_path / stack, stack, truncate_dim=8)
    assert json.loads((folder / "config_sentence_transformers.json").read_text())["truncate_dim"] == 8
    st = SentenceTransformer(str(folder), device="cpu")
    # As `--dimensions`: slice, then normalize when the model normalizes (sentence-transformers' own Normalize
    # runs before its slice, so its vectors differ from these by one scale per row).
    expected = st.encode(TEXTS, normalize_embeddings=stack == "mean-normalize")
    assert expected.shape == (len(TEXTS), 8)
    src = _texts_file(tmp_path, TEXTS)
    out = tmp_path / "v.parquet"
    result = cli("embed", src, "-m", folder, "-o", out, "-q")
    assert "Matryoshka" not in result.stderr  # the checkpoint asks for it: no note
    assert np.abs(_vectors(out) - expected).max() <= 1e-5
    wide = tmp_path / "wide.parquet"
    cli("embed", src, "-m", folder, "--dimensions", 32, "-o", wide, "-q")
    assert np.abs(_vectors(wide) - st.encode(TEXTS, truncate_dim=32)).max() <= 1e-5
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"id": i, "left": TEXTS[i], "right": TEXTS[i + 1]}) + "\n" for i in range(4)))
    scores = tmp_path / "s.jsonl"
    cli("score", pairs, "-m", folder, "-o", scores, "-q")
    got = np.array([json.loads(line)["score"] for line in scores.read_text().splitlines()])
    want = st.similarity(st.encode(TEXTS[:4]), st.encode(TEXTS[1:5])).diagonal().numpy()
    assert np.abs(got - want).max() <= 1e-5
    info = json.loads(cli("info", folder, "--json").stdout)
    assert info["choices"]["dimensions"] == "8 by default (config_sentence_transformers.json: truncate_dim)"


# -- the Transformer config under its early names (sentence_roberta_config.json, ...) ----------------------------------------
@pytest.mark.parametrize(("kind", "name"), [("roberta", "sentence_roberta_config.json"),
                                            ("distilbert", "sentence_distilbert_config.json")])
def test_early_transformer_config_names_set_the_max_length(kind, name, cli, tiny_model, tmp_path) -> None:
    from sentence_transformers import SentenceTransformer

    from tests.fixtures.tiny_models import build_legacy_st_model

    folder = build_legacy_st_model(tiny_model(kind), tmp_path / kind, max_seq_length=16)
    (folder / "sentence_bert_config.json").rename(folder / name)
    expected = SentenceTransformer(str(folder), device="cpu").encode(TEXTS)
    out = tmp_path / "v.parquet"
    cli("embed", _texts_file(tmp_path, TEXTS), "-m", folder, "-o", out, "-q")
    assert np.abs(_vectors(out) - expected).max() <= 1e-5
    assert json.loads(cli("info", folder, "--json").stdout)["max_length"] == 16


def test_transformer_in_a_subfolder_is_refused_by_name(cli, tiny_model, tmp_path) -> None:
    """Early checkpoints kept the transformer in `0_Transformer/`: refused naming it, not as a missing config.json."""
    from tests.fixtures.tiny_models import build_legacy_st_model, edit_json

    folder = build_legacy_st_model(tiny_model("bert"), tmp_path / "early")
    sub = folder / "0_Transformer"
    sub.mkdir()
    for path in list(folder.iterdir()):
        if path.is_file() and path.name not in ("modules.json", "config_sentence_transformers.json"):
            path.rename(sub / path.name)
    edit_json(folder / "modules.json", lambda m: m[0].update(path="0_Transformer"))
    err = cli("embed", _texts_file(tmp_path, TEXTS), "-m", folder, "-o", tmp_path / "v.parquet", code=2)
    _one_error_line(err.stderr, str(folder / "modules.json"), "'0_Transformer'")
