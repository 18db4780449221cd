"""LLM yes/no rerankers: `score` / `rerank` / `classify` / `info` on tiny random causal LMs.

Oracles: a plain transformers forward in float64 (`sigmoid(logit_yes - logit_no)` at the last token of the
templated pair, or of the tokenizer's text pair) and sentence-transformers 6's CrossEncoder, which loads the
checkpoint it saved itself (Transformer + LogitScore).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

PAIRS = [
    ("who won the election", "labour won the election"),
    ("market shares", "the quick brown fox jumps over the lazy dog"),
    ("hello", "zzz"),
    ("bank talks", "shares rise after bank talks and the economy grows"),
    ("film award", " ".join(["the film won best album award"] * 4)),
]
TEMPLATE = "judge : {instruction} query : {query} document : {document} answer yes or no :"
INSTRUCTION = "find news"


@pytest.fixture(scope="module")
def rerankers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    from tests.fixtures.tiny_families import build_llm_reranker

    root = tmp_path_factory.mktemp("llm_rerankers")
    return {kind: build_llm_reranker(kind, root) for kind in ("qwen3", "llama")}


class Reference:
    """Plain transformers, float64: the yes/no score at the last token of each prompt."""

    def __init__(self, folder: Path) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(str(folder))
        model = AutoModelForCausalLM.from_pretrained(str(folder), attn_implementation="eager", dtype=torch.float32)
        self.model = model.double().eval()
        self.yes = self.tok.convert_tokens_to_ids("yes")
        self.no = self.tok.convert_tokens_to_ids("no")

    @torch.no_grad()
    def logits(self, ids: list[int]) -> torch.Tensor:
        return self.model(input_ids=torch.tensor([ids])).logits[0, -1]

    def score_ids(self, ids: list[int], tokens: tuple[str, ...] = ("no", "yes")) -> float:
        logits = self.logits(ids)
        if len(tokens) == 1:
            return float(torch.sigmoid(logits[self.tok.convert_tokens_to_ids(tokens[0])]))
        return float(torch.sigmoid(logits[self.yes] - logits[self.no]))

    def pair(self, query: str, document: str) -> float:
        return self.score_ids(self.tok(query, document)["input_ids"])

    def prompt(self, text: str, tokens: tuple[str, ...] = ("no", "yes")) -> float:
        return self.score_ids(self.tok(text)["input_ids"], tokens)


def _fill(query: str, document: str) -> str:
    return TEMPLATE.format(query=query, document=document, instruction=INSTRUCTION)


def _pairs_file(tmp_path: Path, pairs: list[tuple[str, str]] = PAIRS) -> Path:
    path = tmp_path / "pairs.jsonl"
    rows = [{"id": f"p{i}", "left": q, "right": d} for i, (q, d) in enumerate(pairs)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _scores(path: Path) -> np.ndarray:
    return np.asarray(pq.read_table(path).column("score").to_pylist(), dtype=np.float64)


TEMPLATE_FLAGS = ("--classifier-from-tokens", "no,yes", "--pair-template", TEMPLATE, "--instruction", INSTRUCTION)


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
def test_score_of_crossencoder_checkpoint_equals_transformers_and_crossencoder(cli, rerankers, tmp_path, kind) -> None:
    from sentence_transformers import CrossEncoder

    _, saved = rerankers[kind]
    cli("score", _pairs_file(tmp_path), "-m", saved, "-o", tmp_path / "s.parquet", "-q")
    got = _scores(tmp_path / "s.parquet")
    ref = Reference(saved)
    want = np.asarray([ref.pair(q, d) for q, d in PAIRS])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    oracle = CrossEncoder(str(saved), device="cpu").predict(PAIRS)
    np.testing.assert_allclose(got, oracle, rtol=0, atol=1e-5)
    assert np.ptp(got) > 1e-3  # the scores differ: a constant would pass a comparison of equal constants


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
def test_rerank_with_template_flags_equals_transformers(cli, rerankers, tmp_path, kind) -> None:
    plain, _ = rerankers[kind]
    query = "who won the election"
    docs = [d for _, d in PAIRS]
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"id": f"d{i}", "text": d}) + "\n" for i, d in enumerate(docs)), encoding="utf-8")
    cli("rerank", path, "-m", plain, "--query", query, *TEMPLATE_FLAGS, "-o", tmp_path / "r.parquet", "-q")
    table = pq.read_table(tmp_path / "r.parquet").to_pylist()
    ref = Reference(plain)
    want = {f"d{i}": ref.prompt(_fill(query, d)) for i, d in enumerate(docs)}
    assert [r["id"] for r in table] == sorted(want, key=lambda k: -want[k])
    for row in table:
        assert abs(row["score"] - want[row["id"]]) <= 1e-5


def test_one_token_scores_sigmoid_of_its_logit_and_raw_scores_the_difference(cli, rerankers, tmp_path) -> None:
    plain, _ = rerankers["qwen3"]
    pairs = _pairs_file(tmp_path)
    flags = ("--pair-template", TEMPLATE, "--instruction", INSTRUCTION)
    cli("score", pairs, "-m", plain, "--classifier-from-tokens", "yes", *flags, "-o", tmp_path / "one.parquet", "-q")
    cli("score", pairs, "-m", plain, *TEMPLATE_FLAGS, "--raw-scores", "-o", tmp_path / "raw.parquet", "-q")
    ref = Reference(plain)
    one = np.asarray([ref.prompt(_fill(q, d), ("yes",)) for q, d in PAIRS])
    np.testing.assert_allclose(_scores(tmp_path / "one.parquet"), one, rtol=0, atol=1e-5)
    raw = []
    for q, d in PAIRS:
        logits = ref.logits(ref.tok(_fill(q, d))["input_ids"])
        raw.append(float(logits[ref.yes] - logits[ref.no]))
    np.testing.assert_allclose(_scores(tmp_path / "raw.parquet"), raw, rtol=0, atol=1e-5)


def test_packed_at_three_token_budgets_gives_the_same_scores(cli, rerankers, tmp_path) -> None:
    plain, _ = rerankers["qwen3"]
    pairs = _pairs_file(tmp_path)
    runs = []
    # 24: most pairs are over the budget (sliced prefill); 96: a few per forward; 4096: all in one forward.
    for budget in (24, 96, 4096):
        out = tmp_path / f"b{budget}.parquet"
        cli("score", pairs, "-m", plain, *TEMPLATE_FLAGS, "--max-batch-tokens", budget, "-o", out, "-q")
        runs.append(_scores(out))
    ref = Reference(plain)
    want = np.asarray([ref.prompt(_fill(q, d)) for q, d in PAIRS])
    for got in runs:
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_long_document_is_cut_on_the_document_side_and_keeps_the_suffix(cli, rerankers, tmp_path) -> None:
    plain, _ = rerankers["qwen3"]
    max_length = 40
    query = "who won the election"
    document = " ".join(["labour won the general election with a reduced majority"] * 8)
    cli("score", _pairs_file(tmp_path, [(query, document)]), "-m", plain, *TEMPLATE_FLAGS,
        "--max-length", max_length, "-o", tmp_path / "long.parquet", "-q")
    ref = Reference(plain)
    # The expected prompt, found independently: the longest whole-word document prefix whose prompt fits.
    words = document.split(" ")
    expected = next(
        _fill(query, " ".join(words[:n]))
        for n in range(len(words), -1, -1)
        if len(ref.tok(_fill(query, " ".join(words[:n])))["input_ids"]) <= max_length
    )
    ids = ref.tok(expected)["input_ids"]
    suffix = ref.tok(" answer yes or no :", add_special_tokens=False)["input_ids"]
    assert ids[-len(suffix):] == suffix
    got = _scores(tmp_path / "long.parquet")[0]
    assert abs(got - ref.prompt(expected)) <= 1e-5
    # Cutting the prompt itself at max_length (what plain truncation would do) loses the suffix and the score.
    naive = ref.tok(_fill(query, document))["input_ids"][:max_length]
    assert abs(got - ref.score_ids(naive)) > 1e-4


def test_preset_and_info_show_tokens_template_and_formula(cli, rerankers, tmp_path) -> None:
    plain, saved = rerankers["qwen3"]
    data = json.loads(cli("info", plain, "--reranker-preset", "qwen3-reranker", "--json").stdout)
    assert data["head"] == "lm_score" and data["score_tokens"] == ["no", "yes"]
    assert "<Query>: {query}" in data["pair_format"] and "<|im_start|>assistant" in data["pair_format"]
    assert data["score_formula"] == "sigmoid(logit('yes') - logit('no')) at the last token"
    assert "rerank" in data["commands"] and "score" in data["commands"]
    data = json.loads(cli("info", saved, "--json").stdout)
    assert data["score_tokens"] == ["no", "yes"] and "text pair" in data["pair_format"]
    assert list(data["choices"]) == ["pooling", "truncation side"]  # no classifier-activation row: the score formula is its own
    # The preset's prompt is what gets scored.
    from embedcli.models.llm_reranker import QWEN3_RERANKER_INSTRUCTION, QWEN3_RERANKER_TEMPLATE

    # The preset's prompt is ~240 tokens under the tiny WordPiece vocabulary: a copy with room for it (rotary
    # positions, so a larger max_position_embeddings changes nothing else).
    from tests.fixtures.tiny_models import copy_model, edit_json

    roomy = copy_model(plain, tmp_path / "roomy")
    edit_json(roomy / "config.json", lambda c: c.update(max_position_embeddings=512))
    cli("score", _pairs_file(tmp_path, PAIRS[:2]), "-m", roomy, "--reranker-preset", "qwen3-reranker",
        "-o", tmp_path / "p.parquet", "-q")
    ref = Reference(roomy)
    want = [ref.prompt(QWEN3_RERANKER_TEMPLATE.format(query=q, document=d, instruction=QWEN3_RERANKER_INSTRUCTION))
            for q, d in PAIRS[:2]]
    np.testing.assert_allclose(_scores(tmp_path / "p.parquet"), want, rtol=0, atol=1e-5)


def test_classify_on_the_checkpoint_is_the_yes_probability(cli, rerankers, tmp_path) -> None:
    _, saved = rerankers["qwen3"]
    texts = [d for _, d in PAIRS]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"id": str(i), "text": t}) + "\n" for i, t in enumerate(texts)), encoding="utf-8")
    cli("classify", path, "-m", saved, "--no-strip", "-o", tmp_path / "c.parquet", "-q")
    table = pq.read_table(tmp_path / "c.parquet").to_pylist()
    ref = Reference(saved)
    assert [r["label"] for r in table] == ["yes"] * len(texts)
    np.testing.assert_allclose([r["score"] for r in table], [ref.prompt(t) for t in texts], rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "flags, code, message",
    [
        (("--pair-template", "{query} only"), 2, "lacks {document}"),
        (("--pair-template", "{query} {document} {title}"), 2, "unknown template fields"),
        (("--classifier-from-tokens", "no,yes,maybe"), 2, "one token or two"),
        (("--reranker-preset", "nope"), 2, "choose one of qwen3-reranker"),
        (("--instruction", "x"), 2, "--instruction fills a pair template"),
        (("--classifier-from-tokens", "no,absolutely"), 2, "'absolutely' is not a token"),
        (("--reranker-preset", "qwen3-reranker"), 2, "the pair template alone is"),
    ],
)
def test_bad_reranker_flags_are_one_line_errors(cli, rerankers, tmp_path, flags, code, message) -> None:
    plain, _ = rerankers["qwen3"]
    result = cli("score", _pairs_file(tmp_path), "-m", plain, *flags, "-o", tmp_path / "x.parquet", code=code)
    assert message in result.stderr and "Traceback" not in result.stderr


def test_reranker_flags_on_an_encoder_are_refused(cli, tiny_model, tmp_path) -> None:
    result = cli("score", _pairs_file(tmp_path), "-m", tiny_model("bert"), "--classifier-from-tokens", "no,yes",
                 "-o", tmp_path / "x.parquet", code=2)
    assert "causal LM" in result.stderr and "config.json" in result.stderr and "Traceback" not in result.stderr


CHAT_TEMPLATE = (
    "judge : {% for m in messages %}{% if m['role'] == 'query' %}query : {{ m['content'] }} "
    "{% elif m['role'] == 'document' %}document : {{ m['content'] }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %} answer yes or no :{% endif %}"
)


@pytest.fixture(scope="module")
def chat_reranker(rerankers, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CrossEncoder saved from a causal LM whose tokenizer has a chat template: sentence-transformers 6 then
    lists the "message" modality and renders each pair as messages [query, document]; here with
    add_generation_prompt on (its processing_kwargs), so the template has a suffix after the document."""
    import shutil

    from sentence_transformers import CrossEncoder

    from tests.fixtures.tiny_models import edit_json

    plain, _ = rerankers["qwen3"]
    root = tmp_path_factory.mktemp("chat_reranker")
    source = Path(shutil.copytree(plain, root / "plain"))
    (source / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
    saved = root / "saved"
    CrossEncoder(str(source), device="cpu").save_pretrained(str(saved))
    edit_json(saved / "sentence_bert_config.json",
              lambda c: c.update(processing_kwargs={"chat_template": {"add_generation_prompt": True}}))
    return saved


@pytest.mark.parametrize("max_length", [128, 40])  # 40: the long pairs are cut, the suffix kept
def test_chat_template_checkpoint_equals_crossencoder(cli, chat_reranker, tmp_path, max_length) -> None:
    from sentence_transformers import CrossEncoder

    cli("score", _pairs_file(tmp_path), "-m", chat_reranker, "--max-length", max_length, "-o", tmp_path / "c.parquet",
        "-q")
    got = _scores(tmp_path / "c.parquet")
    oracle = CrossEncoder(str(chat_reranker), device="cpu", max_length=max_length).predict(PAIRS)
    np.testing.assert_allclose(got, oracle, rtol=0, atol=1e-5)
    if max_length == 128:  # and the same as scoring the rendered chat by hand
        ref = Reference(chat_reranker)
        want = [ref.prompt(CHAT_TEMPLATE.replace("{% if add_generation_prompt %} answer yes or no :{% endif %}",
                                                 " answer yes or no :")
                           .replace("{% for m in messages %}{% if m['role'] == 'query' %}query : {{ m['content'] }} "
                                    "{% elif m['role'] == 'document' %}document : {{ m['content'] }}{% endif %}"
                                    "{% endfor %}", f"query : {q} document : {d}"))
                for q, d in PAIRS]
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    data = json.loads(cli("info", chat_reranker, "--json").stdout)
    assert "chat template" in data["pair_format"] and "add_generation_prompt" in data["pair_format"]
