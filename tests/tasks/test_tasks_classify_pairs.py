"""`embedcli classify --pair-col`: NLI-style cross-encoders (three labels) on text pairs against
sentence-transformers 6.2's `CrossEncoder.predict`, with and without `apply_softmax`, on tiny random
checkpoints saved by `CrossEncoder.save_pretrained` (BERT with WordPiece and RoBERTa with byte-level BPE on
the own backbones; DeBERTa-v3 style, a DeBERTa-v2 model with a sentencepiece-Unigram tokenizer, on the
transformers fallback), packed at three token budgets, long pairs cut by `longest_first`."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from tests.fixtures.tiny_models import LONG_TEXT, write_tokenizer

MAX_LENGTH = 48  # CrossEncoder(max_length=48): the long pairs below are cut
BUDGETS = (16, 64, 4096)
NLI_LABELS = {0: "contradiction", 1: "entailment", 2: "neutral"}  # cross-encoder/nli-deberta-v3-base's id2label
PAIRS = [
    ("the quick brown fox jumps over the lazy dog", "a dog is sleeping"),
    ("market shares rise after bank talks", "the bank deal"),
    (LONG_TEXT, "the film won an award"),  # first side cut
    ("hello", LONG_TEXT),  # second side cut
    (LONG_TEXT, LONG_TEXT[:220]),  # both cut, the longer first
    ("  Kyrgyz elections use invisible ink!  ", "  police told the court  "),  # whitespace kept
    ("zzz", ""),  # an empty second text is a text
    ("phone sales fall", "mobile phone technology sales growth"),
]


def write_deberta_v3_tokenizer(folder: Path) -> int:
    """A DeBERTa-v3 style tokenizer (sentencepiece Unigram with Metaspace, cased; [PAD]=0 [CLS]=1 [SEP]=2 [UNK]=3;
    pairs `[CLS] A [SEP] B [SEP]` with types 0…0 1…1) saved by transformers' DebertaV2Tokenizer; returns its size."""
    import string

    import transformers as tf
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    from tests.fixtures.tiny_models import build_vocab

    pieces: dict[str, float] = dict.fromkeys(["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"], 0.0)
    words = [w for w in build_vocab() if not w.startswith(("[", "##"))]
    for i, w in enumerate(words):
        pieces.setdefault("▁" + w, -1.0 - i % 7)
    for c in string.ascii_letters + string.digits + string.punctuation:
        pieces.setdefault(c, -12.0)
    pieces.setdefault("▁", -6.0)
    tok = Tokenizer(models.Unigram(list(pieces.items()), unk_id=3, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1", special_tokens=[("[CLS]", 1), ("[SEP]", 2)]
    )
    tf.DebertaV2Tokenizer(
        tokenizer_object=tok, bos_token="[CLS]", eos_token="[SEP]", unk_token="[UNK]", sep_token="[SEP]",
        pad_token="[PAD]", cls_token="[CLS]", mask_token="[MASK]", do_lower_case=False,
    ).save_pretrained(str(folder))
    return len(pieces)


def write_roberta_tokenizer(folder: Path) -> int:
    """A RoBERTa style tokenizer (byte-level BPE, whitespace-sensitive; pairs `<s> A </s></s> B </s>`, no token
    types) trained on the shared words and saved by transformers' RobertaTokenizer; returns its size."""
    import transformers as tf
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from tests.fixtures.tiny_models import SAMPLE_TEXTS, build_vocab

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=700, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([" ".join(w for w in build_vocab() if not w.startswith(("[", "##"))), *SAMPLE_TEXTS,
                             LONG_TEXT], trainer)
    saved = tf.RobertaTokenizer(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", sep_token="</s>", cls_token="<s>", unk_token="<unk>",
        pad_token="<pad>", mask_token="<mask>",
    )
    saved.save_pretrained(str(folder))
    return len(saved)


def _build(root: Path, kind: str, num_labels: int, seed: int) -> Path:
    """A cross-encoder of `kind` saved as sentence-transformers 6 saves one (`CrossEncoder.save_pretrained`)."""
    import transformers as tf
    from sentence_transformers import CrossEncoder

    base = root / f"{kind}-{num_labels}-base"
    base.mkdir(parents=True)
    writers = {"bert": write_tokenizer, "roberta": write_roberta_tokenizer, "deberta": write_deberta_v3_tokenizer}
    vocab = writers[kind](base)
    labels = NLI_LABELS if num_labels == 3 else {0: "LABEL_0"}
    common: dict[str, Any] = {
        "vocab_size": vocab, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
        "intermediate_size": 64, "max_position_embeddings": 130, "pad_token_id": 0 if kind == "deberta" else 1,
        "initializer_range": 0.2,  # wide enough weights that the label changes from pair to pair
        "id2label": labels, "label2id": {v: k for k, v in labels.items()},
    }
    torch.manual_seed(seed)
    if kind == "bert":
        model: Any = tf.BertForSequenceClassification(tf.BertConfig(**common))
    elif kind == "roberta":  # nli-roberta-base / nli-distilroberta-base style: one token type, positions after pad
        model = tf.RobertaForSequenceClassification(tf.RobertaConfig(**common, type_vocab_size=1))
    else:  # DeBERTa-v3 style: relative attention, no token type embeddings
        model = tf.DebertaV2ForSequenceClassification(tf.DebertaV2Config(
            **common, relative_attention=True, position_buckets=16, pos_att_type=["p2c", "c2p"],
            position_biased_input=False, type_vocab_size=0,
        ))
    model.eval().save_pretrained(str(base))
    folder = root / f"{kind}-{num_labels}"
    CrossEncoder(str(base), device="cpu", max_length=MAX_LENGTH).save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="module")
def nli(tmp_path_factory):  # type: ignore[no-untyped-def]
    """`nli(kind, num_labels=3) -> folder` of a tiny CrossEncoder (kind: bert | deberta)."""
    root = tmp_path_factory.mktemp("nli")
    built: dict[tuple[str, int], Path] = {}

    def get(kind: str, num_labels: int = 3) -> Path:
        if (kind, num_labels) not in built:
            built[kind, num_labels] = _build(root, kind, num_labels, seed=11)
        return built[kind, num_labels]

    return get


def _oracle(folder: Path, softmax: bool) -> np.ndarray:
    from sentence_transformers import CrossEncoder

    ce = CrossEncoder(str(folder), device="cpu")
    assert isinstance(ce.activation_fn, torch.nn.Identity)  # what sentence-transformers 6 saves for 3 labels
    assert ce.max_seq_length == MAX_LENGTH
    return np.asarray(ce.predict(PAIRS, apply_softmax=softmax, batch_size=3), dtype=np.float64)


def _pairs_file(tmp_path: Path, fmt: str = "jsonl", rows: list[tuple[str, str | None]] | None = None) -> Path:
    rows = PAIRS if rows is None else rows  # type: ignore[assignment]
    records = [{"id": f"p{i}", "premise": a, "hypothesis": b, "tag": i, "note": f"note {i}"} for i, (a, b) in enumerate(rows)]
    path = tmp_path / f"pairs.{fmt}"
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    elif fmt == "csv":
        with open(path, "w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=list(records[0]))
            w.writeheader()
            w.writerows(records)
    else:
        pq.write_table(pa.Table.from_pylist(records), path)
    return path


def _classify(cli, folder: Path, src: Path, out: Path, *flags: object, code: int = 0):  # type: ignore[no-untyped-def]
    return cli("classify", src, "-m", folder, "--text-col", "premise", "--pair-col", "hypothesis", "--all-scores",
               "-o", out, "-q", *flags, code=code)


def _scores(table: pa.Table) -> np.ndarray:
    return np.stack(table.column("scores").to_numpy(zero_copy_only=False)).astype(np.float64)


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("kind", ["bert", "roberta", "deberta"])
def test_pairs_equal_cross_encoder_predict(cli, nli, tmp_path, kind, budget) -> None:  # type: ignore[no-untyped-def]
    folder = nli(kind)
    src = _pairs_file(tmp_path)
    for activation, softmax in (("auto", False), ("softmax", True)):
        out = tmp_path / f"{activation}.parquet"
        _classify(cli, folder, src, out, "--activation", activation, "--max-batch-tokens", budget, "--top-k", 3)
        table = pq.read_table(out)
        want = _oracle(folder, softmax)
        delta = np.abs(_scores(table) - want).max()
        print(f"{kind} budget {budget} --activation {activation}: max |delta| vs CrossEncoder.predict "
              f"(apply_softmax={softmax}) {delta:.2e}")
        assert delta <= 1e-5, delta
        best = want.argmax(axis=1)
        assert table.column("label").to_pylist() == [NLI_LABELS[int(i)] for i in best]
        assert np.abs(table.column("score").to_numpy() - want[np.arange(len(PAIRS)), best]).max() <= 1e-5
        assert table.column("top_labels").to_pylist() == [
            [NLI_LABELS[int(j)] for j in np.argsort(-row, kind="stable")] for row in want
        ]
        assert table.column("id").to_pylist() == [f"p{i}" for i in range(len(PAIRS))]
        config = json.loads(pq.read_schema(out).metadata[b"embedcli.config"])
        assert config["labels"] == list(NLI_LABELS.values()) and config["pair_col"] == "hypothesis"
    assert len(set(table.column("label").to_pylist())) > 1  # the labels are really told apart


def test_deberta_runs_on_the_fallback_and_bert_on_its_own_backbone(cli, nli) -> None:  # type: ignore[no-untyped-def]
    assert json.loads(cli("info", nli("deberta"), "--json").stdout)["runs_on"].startswith("transformers")
    assert json.loads(cli("info", nli("bert"), "--json").stdout)["runs_on"].startswith("own backbone")
    assert json.loads(cli("info", nli("roberta"), "--json").stdout)["runs_on"].startswith("own backbone")


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_csv_and_parquet_inputs_equal_jsonl(cli, nli, tmp_path, fmt) -> None:  # type: ignore[no-untyped-def]
    folder = nli("bert")
    _classify(cli, folder, _pairs_file(tmp_path, "jsonl"), tmp_path / "a.parquet", "--keep-cols", "hypothesis,tag")
    _classify(cli, folder, _pairs_file(tmp_path, fmt), tmp_path / "b.parquet", "--keep-cols", "hypothesis,tag")
    a, b = pq.read_table(tmp_path / "a.parquet"), pq.read_table(tmp_path / "b.parquet")
    assert np.abs(_scores(a) - _scores(b)).max() == 0.0
    assert a.column("label").to_pylist() == b.column("label").to_pylist()
    assert b.column("hypothesis").to_pylist() == [h for _, h in PAIRS]  # the pair column can be kept too
    assert np.abs(_scores(a) - _oracle(folder, False)).max() <= 1e-5


def test_strip_strips_both_texts_of_a_pair(cli, nli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Whitespace is kept by default (CrossEncoder keeps it); --strip strips the second text as the first."""
    from sentence_transformers import CrossEncoder

    folder = nli("roberta")  # byte-level BPE: outer whitespace changes the tokens
    out = tmp_path / "stripped.parquet"
    _classify(cli, folder, _pairs_file(tmp_path), out, "--strip")
    ce = CrossEncoder(str(folder), device="cpu")
    stripped = ce.predict([(a.strip(), b.strip()) for a, b in PAIRS])
    first_only = ce.predict([(a.strip(), b) for a, b in PAIRS])
    assert np.abs(first_only[5] - stripped[5]).max() > 1e-3  # the pair's second text has outer whitespace
    assert np.abs(_scores(pq.read_table(out)) - stripped).max() <= 1e-5


def test_one_label_cross_encoder_pairs_equal_score(cli, nli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """CrossEncoder.predict on one label is sigmoid(logit): classify --pair-col gives `score`'s numbers."""
    from sentence_transformers import CrossEncoder

    folder = nli("bert", num_labels=1)
    src = _pairs_file(tmp_path)
    _classify(cli, folder, src, tmp_path / "c.parquet")
    cli("score", src, "-m", folder, "--left-col", "premise", "--right-col", "hypothesis", "-o", tmp_path / "s.parquet",
        "-q")
    classified = pq.read_table(tmp_path / "c.parquet")
    scored = pq.read_table(tmp_path / "s.parquet").column("score").to_numpy()
    assert classified.column("label").to_pylist() == ["LABEL_0"] * len(PAIRS)
    assert np.abs(classified.column("score").to_numpy() - scored).max() <= 1e-6
    want = CrossEncoder(str(folder), device="cpu").predict(PAIRS)
    assert np.abs(scored - want).max() <= 1e-5


# -- errors -------------------------------------------------------------------------------------------
@pytest.fixture
def no_model_load(monkeypatch):  # type: ignore[no-untyped-def]
    import embedcli.tasks.common as common

    def refuse(*_a: object, **_k: object) -> None:
        raise AssertionError("the model was loaded before the input was checked")

    monkeypatch.setattr(common, "build_runner", refuse)


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_a_missing_pair_column_is_said_before_the_model_loads(cli, nli, tmp_path, no_model_load, fmt) -> None:  # type: ignore[no-untyped-def]
    src = _pairs_file(tmp_path, fmt)
    out = tmp_path / "out.parquet"
    result = cli("classify", src, "-m", nli("bert"), "--text-col", "premise", "--pair-col", "hyp", "-o", out, code=1)
    err = result.stderr
    assert "'hyp'" in err and src.name in err and "'hypothesis'" in err and "model was loaded" not in result.output
    assert not out.exists()


def test_a_null_second_text_is_a_bad_row(cli, nli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    rows: list[tuple[str, str | None]] = [("a dog", "a cat"), ("the bank", None), ("phone sales", "tv show")]
    src = _pairs_file(tmp_path, rows=rows)
    out = tmp_path / "out.parquet"
    failed = _classify(cli, nli("bert"), src, out, code=1)
    assert "line 2 (id 'p1'): text field 'hypothesis' is null" in failed.stderr and "--on-error skip" in failed.stderr
    assert not out.exists()
    errors = tmp_path / "errors.jsonl"
    _classify(cli, nli("bert"), src, out, "--on-error", "skip", "--errors-file", errors, code=3)
    assert pq.read_table(out).column("id").to_pylist() == ["p0", "p2"]
    bad = [json.loads(x) for x in errors.read_text().splitlines()]
    assert [(b["id"], b["location"]) for b in bad] == [("p1", "line 2")] and "hypothesis" in bad[0]["reason"]


def test_usage_errors(cli, nli, st_model, tmp_path) -> None:  # type: ignore[no-untyped-def]
    src = _pairs_file(tmp_path)
    out = tmp_path / "out.parquet"
    same = cli("classify", src, "-m", nli("bert"), "--text-col", "premise", "--pair-col", "premise", "-o", out, code=2)
    assert "--pair-col premise: it is --text-col too" in same.stderr
    embedder = cli("classify", src, "-m", st_model, "--text-col", "premise", "--pair-col", "hypothesis", "-o", out,
                   code=2)
    assert "cannot do 'classify'" in embedder.stderr
    from tests.fixtures.tiny_families import build_llm_reranker

    _, reranker = build_llm_reranker("qwen3", tmp_path / "llm")
    llm = cli("classify", src, "-m", reranker, "--text-col", "premise", "--pair-col", "hypothesis", "-o", out, code=2)
    assert "LLM reranker" in llm.stderr and "embedcli score --left-col premise --right-col hypothesis" in llm.stderr
    assert not out.exists()


# -- unattended guarantees ------------------------------------------------------------------------------
def test_incremental_recomputes_a_changed_second_text_and_a_new_pair_col_is_a_config_change(cli, nli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    folder = nli("bert")
    out = tmp_path / "out.parquet"
    _classify(cli, folder, _pairs_file(tmp_path), out)
    first = _scores(pq.read_table(out))
    changed = list(PAIRS)
    changed[1] = (PAIRS[1][0], "a different hypothesis")
    src = _pairs_file(tmp_path, rows=changed)  # type: ignore[arg-type]
    stats = tmp_path / "stats.json"
    _classify(cli, folder, src, out, "--incremental", "--stats", stats)
    report = json.loads(stats.read_text())
    assert (report["computed_rows"], report["carried_rows"]) == (1, len(PAIRS) - 1)  # only the changed pair ran
    fresh = tmp_path / "fresh.parquet"
    _classify(cli, folder, src, fresh)
    again = _scores(pq.read_table(out))
    carried = [i for i in range(len(PAIRS)) if i != 1]
    assert np.array_equal(again[carried], first[carried])  # carried over as they were
    assert np.abs(again - _scores(pq.read_table(fresh))).max() <= 1e-5  # the changed pair packed alone
    assert np.abs(again[1] - first[1]).max() > 1e-3  # and it was recomputed
    # the pair column is part of the config: another one (or none) does not mix into this output
    other = cli("classify", src, "-m", folder, "--text-col", "premise", "--pair-col", "note", "--all-scores", "-o", out,
                code=2)
    assert "--pair-col" in other.stderr
    single = cli("classify", src, "-m", folder, "--text-col", "premise", "--all-scores", "-o", out, code=2)
    assert "pair_col" in single.stderr or "--pair-col" in single.stderr


# -- run-batch ----------------------------------------------------------------------------------------------
def test_run_batch_classify_takes_no_pairs_as_vllm_and_its_texts_equal_classify(cli, nli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """vLLM's /classify input is texts or token ids (no text pairs) and its /score needs one label: a pair on
    /classify is a 400 line naming `classify --pair-col`; texts are classified as `classify` classifies them."""
    folder = nli("deberta")
    texts = [a for a, _ in PAIRS]
    lines = [
        json.dumps({"custom_id": "pairs", "method": "POST", "url": "/classify", "body": {"input": [list(PAIRS[0])]}}),
        json.dumps({"custom_id": "texts", "method": "POST", "url": "/classify", "body": {"input": texts}}),
        json.dumps({"custom_id": "score", "method": "POST", "url": "/score",
                    "body": {"text_1": PAIRS[0][0], "text_2": PAIRS[0][1]}}),
    ]
    src = tmp_path / "requests.jsonl"
    src.write_text("".join(x + "\n" for x in lines))
    out = tmp_path / "results.jsonl"
    cli("run-batch", src, "-m", folder, "-o", out, "-q", code=3)
    pairs, classified, scored = [json.loads(x) for x in out.read_text().splitlines()]
    assert pairs["response"]["status_code"] == 400
    assert pairs["error"]["param"] == "body.input[0]" and "embedcli classify --pair-col" in pairs["error"]["message"]
    assert scored["response"]["status_code"] == 400 and "does not support Score API" in scored["error"]["message"]
    single = tmp_path / "single.jsonl"
    single.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts)))
    cli("classify", single, "-m", folder, "--all-scores", "-o", tmp_path / "single.parquet", "-q")
    want = _scores(pq.read_table(tmp_path / "single.parquet"))
    got = np.asarray([d["probs"] for d in classified["response"]["body"]["data"]], dtype=np.float64)
    assert np.abs(got - want).max() <= 1e-5
