"""`embedcli token-classify` and `token-embed` against transformers, per token; step pooling; special tokens."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

TEXTS = ["Sarah Claxton joined Time Warner in London.", "hello", "The BBC said: shares rose 5%; the bank fell."]


def _write(tmp_path, texts=TEXTS):  # type: ignore[no-untyped-def]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": f"t{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    return src


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_token_classify_equals_transformers_logits_plus_softmax(cli, task_models, tmp_path, two_threads):
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    folder = task_models("token-classifier")
    tok = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForTokenClassification.from_pretrained(str(folder)).eval()
    out = tmp_path / "tags.parquet"
    cli("token-classify", _write(tmp_path), "-m", folder, "--all-scores", "--keep-special", "-o", out, "-q")
    table = pq.read_table(out)
    deltas = []
    for i, text in enumerate(TEXTS):
        enc = tok(text, return_tensors="pt")
        with torch.inference_mode():
            probs = _softmax(model(**enc).logits[0].double().numpy())
        got = np.asarray(table.column("probs")[i].as_py(), dtype=np.float64)
        assert table.column("token_ids")[i].as_py() == enc["input_ids"][0].tolist()
        assert got.shape == probs.shape
        deltas.append(np.abs(got - probs).max())
        assert table.column("labels")[i].as_py() == [model.config.id2label[int(j)] for j in probs.argmax(-1)]
        assert np.allclose(table.column("scores")[i].as_py(), probs.max(-1), atol=1e-5)
    print(f"token-classify vs transformers: max |delta| {max(deltas):.2e}")
    assert max(deltas) <= 1e-5, deltas

    # default: the tokens the template adds ([CLS], [SEP]) are dropped; --activation none gives the logits
    plain = tmp_path / "plain.parquet"
    cli("token-classify", _write(tmp_path), "-m", folder, "--activation", "none", "--all-scores", "-o", plain, "-q")
    enc = tok(TEXTS[0], return_tensors="pt")
    with torch.inference_mode():
        logits = model(**enc).logits[0].numpy()
    row = pq.read_table(plain).to_pylist()[0]
    assert row["token_ids"] == enc["input_ids"][0].tolist()[1:-1]
    assert np.abs(np.asarray(row["probs"]) - logits[1:-1]).max() <= 1e-5


def test_step_pooling_keeps_step_tag_tokens_and_columns(cli, task_models, tmp_path, two_threads):
    """Process-reward style: only the rows of the step-tag token, only the returned label columns."""
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    folder = task_models("token-classifier")
    tok = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForTokenClassification.from_pretrained(str(folder)).eval()
    step = tok.convert_tokens_to_ids(";")
    texts = ["step one ; step two ; done ;", "no tag here"]
    out = tmp_path / "steps.parquet"
    cli("token-classify", _write(tmp_path, texts), "-m", folder, "--step-tag-id", step, "--returned-token-ids", "0,3",
        "--all-scores", "-o", out, "-q")
    rows = pq.read_table(out).to_pylist()
    enc = tok(texts[0], return_tensors="pt")
    with torch.inference_mode():
        logits = model(**enc).logits[0].numpy()
    ids = enc["input_ids"][0].numpy()
    # vLLM's STEP pooling selects the rows and the label columns of the score head's output; the activation
    # (softmax) then runs over the kept columns only.
    kept = logits[ids == step][:, [0, 3]]
    assert rows[0]["token_ids"] == [step] * 3
    assert np.abs(np.asarray(rows[0]["probs"]) - _softmax(kept)).max() <= 1e-5
    assert rows[0]["labels"] == [["O", "B-ORG"][int(j)] for j in _softmax(kept).argmax(-1)]
    assert rows[1]["token_ids"] == [] and rows[1]["labels"] == [] and rows[1]["probs"] == []


def test_token_embed_equals_normalized_hidden_states(cli, minilm_path, tmp_path, two_threads):
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(minilm_path))
    model = AutoModel.from_pretrained(str(minilm_path)).eval()
    out = tmp_path / "tok.parquet"
    cli("token-embed", _write(tmp_path), "-o", out, "-q")
    table = pq.read_table(out)
    typ = table.schema.field("embeddings").type  # list<fixed_size_list<float32>[384]>
    assert pa.types.is_list(typ) and pa.types.is_fixed_size_list(typ.value_type)
    assert typ.value_type.list_size == 384 and typ.value_type.value_type == pa.float32()
    for i, text in enumerate(TEXTS):
        enc = tok(text, return_tensors="pt")
        with torch.inference_mode():
            h = torch.nn.functional.normalize(model(**enc).last_hidden_state[0], dim=-1).numpy()
        got = np.asarray(table.column("embeddings")[i].as_py())
        assert table.column("token_ids")[i].as_py() == enc["input_ids"][0].tolist()[1:-1]
        assert np.abs(got - h[1:-1]).max() <= 1e-5


def test_token_task_on_a_model_that_cannot_is_a_usage_error(cli, task_models, tmp_path):
    err = cli("token-classify", _write(tmp_path), "-o", tmp_path / "x.parquet", code=2)
    assert "cannot do 'token_classify'" in err.stderr and "token-embed" in err.stderr
    err = cli("token-embed", _write(tmp_path), "-m", task_models("token-classifier"), "-o", tmp_path / "x.parquet", code=2)
    assert "cannot do 'token_embed'" in err.stderr and "commands: token-classify" in err.stderr


LITERAL_SPECIALS = ["see [SEP] and [CLS] here", "[PAD] [SEP]", "a [MASK] b [UNK]"]


def test_token_classify_keeps_special_tokens_spelled_in_the_text_as_the_pipeline(cli, task_models, tmp_path, two_threads):
    # Only the tokens the template adds are special (transformers' special_tokens_mask); a "[SEP]" in the text
    # is a token of the text, labelled by the pipeline (it was dropped by id, so those rows went missing).
    from transformers import pipeline

    folder = task_models("token-classifier")
    pipe = pipeline("token-classification", model=str(folder), aggregation_strategy="none", device="cpu")
    out = tmp_path / "tags.parquet"
    cli("token-classify", _write(tmp_path, LITERAL_SPECIALS), "-m", folder, "-o", out, "-q")
    for text, row in zip(LITERAL_SPECIALS, pq.read_table(out).to_pylist(), strict=True):
        ref = pipe(text, ignore_labels=[])
        assert [e["word"] for e in ref] == pipe.tokenizer.convert_ids_to_tokens(row["token_ids"])
        assert row["labels"] == [e["entity"] for e in ref]
        np.testing.assert_allclose(row["scores"], [e["score"] for e in ref], rtol=0, atol=1e-5)


def test_token_embed_keeps_special_tokens_spelled_in_the_text(cli, minilm_path, tmp_path, two_threads):
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(minilm_path))
    model = AutoModel.from_pretrained(str(minilm_path)).eval()
    out = tmp_path / "tok.parquet"
    cli("token-embed", _write(tmp_path, LITERAL_SPECIALS), "-o", out, "-q")
    for text, row in zip(LITERAL_SPECIALS, pq.read_table(out).to_pylist(), strict=True):
        enc = tok(text, return_tensors="pt", return_special_tokens_mask=True)
        text_tokens = enc.pop("special_tokens_mask")[0] == 0
        with torch.inference_mode():
            h = torch.nn.functional.normalize(model(**enc).last_hidden_state[0], dim=-1)[text_tokens].numpy()
        assert row["token_ids"] == enc["input_ids"][0][text_tokens].tolist()
        np.testing.assert_allclose(np.asarray(row["embeddings"]), h, rtol=0, atol=1e-5)
