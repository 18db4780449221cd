"""What a checkpoint's tokenizer files say about cutting and casing texts: each equals sentence-transformers' `encode`
on a tiny checkpoint written as real ones ship, or is refused at load with one line, never run another way with exit 0."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.fixtures.tiny_models import LONG_TEXT, SAMPLE_TEXTS, build_legacy_st_model, edit_json

TEXTS = [*SAMPLE_TEXTS, LONG_TEXT, "market " + LONG_TEXT + " oil", ""]


def _texts_file(tmp_path: Path, texts: list[str]) -> Path:
    path = tmp_path / "texts.jsonl"
    path.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts)), encoding="utf-8")
    return path


def _vectors(path: Path) -> np.ndarray:
    return np.stack(pq.read_table(path).column("embedding").to_numpy(zero_copy_only=False))


def _run_config(path: Path) -> dict[str, object]:
    return json.loads(pq.read_schema(path).metadata[b"embedcli.config"])


# -- the tokenizer's own truncation side ------------------------------------------------------------------------------
def _left_side(folder: Path, where: str) -> None:
    """Make `folder`'s tokenizer cut on the left, written where `where` says checkpoints write it."""
    if where == "tokenizer_config.json":
        edit_json(folder / "tokenizer_config.json", lambda c: c.update(truncation_side="left"))
    elif where in ("tokenizer_args", "processor_kwargs"):
        edit_json(folder / "sentence_bert_config.json", lambda c: c.update({where: {"truncation_side": "left"}}))
    else:  # tokenizer.json's truncation block, which transformers falls back to
        edit_json(folder / "tokenizer.json", lambda c: c.update(
            truncation={"direction": "Left", "max_length": 512, "strategy": "LongestFirst", "stride": 0}))


@pytest.mark.parametrize("where", ["tokenizer_config.json", "tokenizer_args", "processor_kwargs", "tokenizer.json"])
def test_model_truncation_side_is_the_default(where, cli, tiny_model, tmp_path) -> None:
    from sentence_transformers import SentenceTransformer

    folder = build_legacy_st_model(tiny_model("bert"), tmp_path / "m")  # max_seq_length 64: LONG_TEXT is cut
    _left_side(folder, where)
    st = SentenceTransformer(str(folder), device="cpu")
    assert st.tokenizer.truncation_side == "left"
    src = _texts_file(tmp_path, TEXTS)
    out = tmp_path / "v.parquet"
    cli("embed", src, "-m", folder, "-o", out, "-q")
    assert np.abs(_vectors(out) - st.encode(TEXTS)).max() <= 1e-6
    assert _run_config(out)["truncation_side"] == "left"  # what a resume or --incremental run compares
    choices = json.loads(cli("info", folder, "--json").stdout)["choices"]
    assert choices["truncation side"].startswith("left (") and where in choices["truncation side"]
    # The flag still wins.
    right = tmp_path / "r.parquet"
    cli("embed", src, "-m", folder, "--truncation-side", "right", "-o", right, "-q")
    st.tokenizer.truncation_side = "right"
    assert np.abs(_vectors(right) - st.encode(TEXTS)).max() <= 1e-6
    assert _run_config(right)["truncation_side"] == "right"
    assert np.abs(_vectors(right) - _vectors(out)).max() > 1e-3  # the long rows differ: the test can tell


def test_model_truncation_side_in_the_python_api(tiny_model, tmp_path) -> None:
    from sentence_transformers import SentenceTransformer

    from embedcli.api import Embedder

    folder = build_legacy_st_model(tiny_model("bert"), tmp_path / "m")
    _left_side(folder, "tokenizer_config.json")
    st = SentenceTransformer(str(folder), device="cpu")
    model = Embedder(str(folder), device="cpu", dtype="float32")
    assert np.abs(model.embed(TEXTS) - st.encode(TEXTS)).max() <= 1e-6
    st.tokenizer.truncation_side = "right"
    assert np.abs(model.embed(TEXTS, truncation_side="right") - st.encode(TEXTS)).max() <= 1e-6


# -- do_lower_case: lowercased inside the tokenizer, special tokens spared ----------------------------------------------
LOWER_TEXTS = ["Hello [SEP] World", "[CLS] The Bank [MASK] Rates", "Café PRICES rose [SEP][SEP]", "[sep] [Mask] Zzz"]


@pytest.mark.parametrize(("cased", "prompt"), [(False, None), (True, None), (True, "Query [SEP] ")])
def test_do_lower_case_spares_special_tokens(cased, prompt, cli, tiny_model, tmp_path) -> None:
    from sentence_transformers import SentenceTransformer

    folder = build_legacy_st_model(tiny_model("bert"), tmp_path / "m")
    edit_json(folder / "sentence_bert_config.json", lambda c: c.update(do_lower_case=True))
    if cased:  # a cased tokenizer: only do_lower_case lowercases
        edit_json(folder / "tokenizer_config.json", lambda c: c.update(do_lower_case=False))
    st = SentenceTransformer(str(folder), device="cpu")
    ids = st.tokenizer(LOWER_TEXTS[0])["input_ids"]
    assert ids.count(st.tokenizer.sep_token_id) == 2  # the text's [SEP] is the special token to sentence-transformers
    src = _texts_file(tmp_path, LOWER_TEXTS)
    out = tmp_path / "v.parquet"
    cli("embed", src, "-m", folder, "-o", out, "-q", *(("--prompt", prompt) if prompt else ()))
    assert np.abs(_vectors(out) - st.encode(LOWER_TEXTS, prompt=prompt)).max() <= 1e-6


# -- max_seq_length past a learned absolute position table: refused at load ---------------------------------------------
LONGER_TEXTS = ["hello", LONG_TEXT * 2]  # past the tiny models' 128 positions, within 1000 tokens


def _one_error_line(stderr: str, *needles: str) -> None:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("embedcli: error: "), stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


@pytest.mark.parametrize(("kind", "positions"), [("bert", 128), ("roberta", 126), ("distilbert", 128), ("mpnet", 126)])
def test_max_seq_length_past_absolute_positions_is_refused(kind, positions, cli, tiny_model, tmp_path) -> None:
    from sentence_transformers import SentenceTransformer

    folder = build_legacy_st_model(tiny_model(kind), tmp_path / kind, max_seq_length=1000)
    src = _texts_file(tmp_path, LONGER_TEXTS)
    out = tmp_path / "v.parquet"
    err = cli("embed", src, "-m", folder, "-o", out, code=1)  # a model config embedcli cannot serve
    _one_error_line(err.stderr, str(folder / "sentence_bert_config.json"), "max_seq_length 1000",
                    f"--max-length {positions}")
    assert not out.exists()
    # The way out the message names: the table's length, as sentence-transformers runs it.
    cli("embed", src, "-m", folder, "--max-length", positions, "-o", out, "-q")
    st = SentenceTransformer(str(folder), device="cpu")
    st.max_seq_length = positions
    assert np.abs(_vectors(out) - st.encode(LONGER_TEXTS)).max() <= 1e-5


@pytest.mark.parametrize("kind", ["qwen2", "nomic"])
def test_rotary_positions_may_run_past_max_position_embeddings(kind, cli, tiny_model, tmp_path) -> None:
    from tests.fixtures.nomic_gte import build_nomic

    if kind == "nomic":
        folder = build_nomic(tmp_path / kind, n_positions=128)
        edit_json(folder / "sentence_bert_config.json", lambda c: c.update(max_seq_length=1000))
    else:
        folder = build_legacy_st_model(tiny_model(kind), tmp_path / kind, max_seq_length=1000)
    out = tmp_path / "v.parquet"
    stats = tmp_path / "stats.json"
    cli("embed", _texts_file(tmp_path, LONGER_TEXTS), "-m", folder, "-o", out, "-q", "--stats", stats)
    assert json.loads(stats.read_text())["truncated_rows"] == 0  # the long row ran whole, past 128 positions
    assert json.loads(cli("info", folder, "--json").stdout)["max_length"] == 1000


def _deberta(folder: Path, biased: bool | None) -> Path:
    """A DeBERTa (v2 classes) base of 128 positions; `position_biased_input` as given, or left out of config.json
    (transformers then adds the absolute table, as for DeBERTa v1/v2 checkpoints)."""
    import torch
    import transformers as tf

    from tests.fixtures.tiny_models import ENCODER_KW, write_tokenizer

    vocab = write_tokenizer(folder)
    torch.manual_seed(8)
    config = tf.DebertaV2Config(
        vocab_size=vocab, relative_attention=True, pos_att_type=["p2c", "c2p"], position_buckets=16, type_vocab_size=0,
        position_biased_input=biased is not False, **ENCODER_KW,
    )
    tf.DebertaV2Model(config).eval().save_pretrained(str(folder))
    if biased is None:
        edit_json(folder / "config.json", lambda c: c.pop("position_biased_input"))
    return folder


@pytest.mark.parametrize("biased", [True, None])
def test_deberta_absolute_table_bounds_max_seq_length(biased, cli, tmp_path) -> None:
    from sentence_transformers import SentenceTransformer

    folder = build_legacy_st_model(_deberta(tmp_path / "base", biased), tmp_path / "st", max_seq_length=1000)
    src = _texts_file(tmp_path, LONGER_TEXTS)
    out = tmp_path / "v.parquet"
    err = cli("embed", src, "-m", folder, "-o", out, code=1)
    _one_error_line(err.stderr, "max_seq_length 1000", "--max-length 128")
    cli("embed", src, "-m", folder, "--max-length", 128, "-o", out, "-q")
    st = SentenceTransformer(str(folder), device="cpu")
    st.max_seq_length = 128
    assert np.abs(_vectors(out) - st.encode(LONGER_TEXTS)).max() <= 1e-5


def test_deberta_v3_relative_positions_run_past_max_position_embeddings(cli, tmp_path) -> None:
    from sentence_transformers import SentenceTransformer

    folder = build_legacy_st_model(_deberta(tmp_path / "base", False), tmp_path / "st", max_seq_length=1000)
    src = _texts_file(tmp_path, LONGER_TEXTS)
    out = tmp_path / "v.parquet"
    stats = tmp_path / "stats.json"
    cli("embed", src, "-m", folder, "-o", out, "-q", "--stats", stats)
    assert json.loads(stats.read_text())["truncated_rows"] == 0
    assert np.abs(_vectors(out) - SentenceTransformer(str(folder), device="cpu").encode(LONGER_TEXTS)).max() <= 1e-5
