"""`embedcli rerank` and `embedcli score` against sentence-transformers' CrossEncoder and SentenceTransformer.

Cross-encoder: the real MiniLM body with a seeded one-label head (no real cross-encoder exists offline).
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

QUERY = "Who won the general election?"
DOCS = [
    "Labour won the general election with a reduced majority.",
    "The film won best album at the awards.",
    "  Shares rose   after the bank talks.  ",  # outer and inner whitespace: kept, not stripped
    "Labour won the general election with a reduced majority.",  # a tie with doc 0
    " ".join(["The minister said the party would cut taxes and raise spending on schools."] * 12),  # > 128 tokens
    "zzz",
    "The film won best album at the awards.",  # a tie with doc 1
    "Kyrgyz elections use invisible ink to stop people voting twice.",
]
MAX_LENGTH = 128  # pairs over it are cut (CrossEncoder(max_length=128) vs --max-length 128); keeps the test fast


@pytest.fixture(scope="module")
def cross_encoder(task_models, two_threads):  # type: ignore[no-untyped-def]
    from sentence_transformers import CrossEncoder

    return CrossEncoder(str(task_models("cross-encoder")), device="cpu", max_length=MAX_LENGTH)


@pytest.fixture(scope="module")
def docs_file(tmp_path_factory):  # type: ignore[no-untyped-def]
    path = tmp_path_factory.mktemp("rerank") / "docs.jsonl"
    rows = [{"id": f"d{i}", "text": t, "source": f"s{i % 3}"} for i, t in enumerate(DOCS)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_rerank_cross_encoder_equals_crossencoder_rank_including_ties(cli, task_models, cross_encoder, docs_file, tmp_path):
    out = tmp_path / "ranked.parquet"
    cli("rerank", docs_file, "-m", task_models("cross-encoder"), "--max-length", MAX_LENGTH, "--query", QUERY, "--return-documents",
        "--keep-cols", "source", "-o", out, "-q")
    got = pq.read_table(out).to_pylist()
    expected = cross_encoder.rank(QUERY, DOCS, return_documents=True)
    assert [r["id"] for r in got] == [f"d{e['corpus_id']}" for e in expected]
    assert [r["rank"] for r in got] == list(range(1, len(DOCS) + 1))
    assert {r["query_id"] for r in got} == {"query"}
    assert [r["text"] for r in got] == [e["text"] for e in expected]
    assert [r["source"] for r in got] == [f"s{e['corpus_id'] % 3}" for e in expected]
    delta = np.abs(np.array([r["score"] for r in got]) - np.array([e["score"] for e in expected])).max()
    print(f"rerank vs CrossEncoder.rank: max |delta| {delta:.2e}")
    assert delta <= 1e-5, delta
    # the duplicated documents tie exactly and keep their input order (stable sort), as CrossEncoder.rank
    by_id = {r["id"]: r for r in got}
    assert by_id["d0"]["score"] == by_id["d3"]["score"] and by_id["d0"]["rank"] < by_id["d3"]["rank"]
    assert by_id["d1"]["score"] == by_id["d6"]["score"] and by_id["d1"]["rank"] < by_id["d6"]["rank"]


def test_score_cross_encoder_equals_predict_on_long_and_whitespace_pairs(cli, task_models, cross_encoder, jsonl, tmp_path):
    """1:1 pairs, incl. ones over the max length (cut longest_first, as the CrossEncoder's tokenizer) and whitespace."""
    lefts = [QUERY, "  spaced query  ", DOCS[4], "short"]
    rights = [DOCS[0], DOCS[2], DOCS[4], DOCS[4]]  # the third pair: both sides long; the fourth: only the right
    src = jsonl("pairs.jsonl", [{"id": i, "left": a, "right": b} for i, (a, b) in enumerate(zip(lefts, rights, strict=True))])
    out = tmp_path / "scores.jsonl"
    cli("score", src, "-m", task_models("cross-encoder"), "--max-length", MAX_LENGTH, "-o", out, "-q",
        "--max-batch-tokens", 200)
    got = [json.loads(line) for line in out.read_text().splitlines()]
    expected = cross_encoder.predict(list(zip(lefts, rights, strict=True)))
    assert [r["id"] for r in got] == [0, 1, 2, 3]  # int ids in, int ids out (issue 15)
    delta = np.abs(np.array([r["score"] for r in got]) - expected).max()
    print(f"score vs CrossEncoder.predict (incl. truncated pairs): max |delta| {delta:.2e}")
    assert delta <= 1e-5, delta
    # --raw-scores: the logit, i.e. sigmoid^-1 of the score
    raw = tmp_path / "raw.parquet"
    cli("score", src, "-m", task_models("cross-encoder"), "--max-length", MAX_LENGTH, "-o", raw, "-q", "--raw-scores")
    logits = pq.read_table(raw).column("score").to_numpy()
    assert np.abs(1 / (1 + np.exp(-logits)) - expected).max() <= 1e-5


def test_pair_truncation_is_longest_first(task_models, two_threads):
    """A short query stays whole and the document is cut; two long sides are cut to about half each."""
    from embedcli.compute.runner import Runner, RunnerOptions
    from embedcli.models.loader import LoadedModel, ModelOptions
    from embedcli.models.spec import load_model_spec

    spec = load_model_spec(str(task_models("cross-encoder")), max_length=32)
    runner = Runner(LoadedModel(spec, ModelOptions(device="cpu")), RunnerOptions(task="classify", strip=False))
    long_text = " ".join(["word"] * 100)
    enc = runner.tokenize([("short query", long_text), (long_text, long_text)])
    ids, types = enc.ids[0], enc.type_ids[0]  # type: ignore[index]
    assert len(ids) == 32 and (types == 0).sum() == 4 and (types == 1).sum() == 28  # [CLS] short query [SEP]
    assert len(enc.ids[1]) == 32 and abs(int((enc.type_ids[1] == 0).sum()) - int((enc.type_ids[1] == 1).sum())) <= 1  # type: ignore[index]
    assert runner.stats.truncated_rows == 2


def test_pairs_are_not_stripped(task_models, two_threads):
    """CrossEncoder passes pairs to the tokenizer as they are; so do rerank and score (for every method)."""
    from embedcli.tasks.common import ModelChoice
    from embedcli.tasks.pairs import PairOptions, pair_scorer

    for model in (str(task_models("cross-encoder")), None):
        runner, scorer = pair_scorer(ModelChoice(model, device="cpu", dtype="float32"), PairOptions(), "score")
        assert runner.options.strip is False
        assert runner._prepare("  a  ") == "  a  "
        assert scorer.pair_inputs(["  q "], [" d  "])[0] in (("  q ", " d  "), "  q ")


def test_rerank_many_queries_top_n_and_one_left_score(cli, task_models, cross_encoder, docs_file, jsonl, tmp_path):
    queries = jsonl("queries.jsonl", [{"qid": "q1", "text": QUERY}, {"qid": "q2", "text": "film awards"}])
    out = tmp_path / "top.parquet"
    cli("rerank", docs_file, "-m", task_models("cross-encoder"), "--max-length", MAX_LENGTH, "--queries", queries,
        "--query-id-col", "qid",
        "--top-n", 3, "-o", out, "-q")
    got = pq.read_table(out).to_pylist()
    assert [r["query_id"] for r in got] == ["q1"] * 3 + ["q2"] * 3
    for qid, q in (("q1", QUERY), ("q2", "film awards")):
        expected = cross_encoder.rank(q, DOCS, top_k=3)
        rows = [r for r in got if r["query_id"] == qid]
        assert [r["id"] for r in rows] == [f"d{e['corpus_id']}" for e in expected]
        assert np.abs(np.array([r["score"] for r in rows]) - [e["score"] for e in expected]).max() <= 1e-5
    # score --left: one text against every row's right column, in input order
    scored = tmp_path / "one.parquet"
    cli("score", docs_file, "-m", task_models("cross-encoder"), "--max-length", MAX_LENGTH, "--left", "film awards",
        "--right-col", "text", "-o", scored, "-q")
    scores = pq.read_table(scored).column("score").to_numpy()
    assert np.abs(scores - cross_encoder.predict([("film awards", d) for d in DOCS])).max() <= 1e-5


def test_rerank_and_score_bi_encoder_cosine(cli, minilm_path, docs_file, jsonl, tmp_path, two_threads):
    """The default (embedding) model ranks by cosine, equal to sentence-transformers' cosine similarity."""
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(minilm_path), device="cpu")
    q, d = st.encode([QUERY]), st.encode(DOCS)
    expected = (q @ d.T)[0] / (np.linalg.norm(q) * np.linalg.norm(d, axis=1))
    out = tmp_path / "cos.parquet"
    cli("rerank", docs_file, "--query", QUERY, "-o", out, "-q")
    got = pq.read_table(out).to_pylist()
    assert [r["id"] for r in got] == [f"d{i}" for i in np.lexsort((np.arange(len(DOCS)), -expected))]
    assert np.abs(np.array([r["score"] for r in got]) - np.sort(expected)[::-1]).max() <= 1e-5
    pairs = jsonl("p.jsonl", [{"left": QUERY, "right": t} for t in DOCS])
    scored = tmp_path / "s.parquet"
    cli("score", pairs, "-o", scored, "-q")
    assert np.abs(pq.read_table(scored).column("score").to_numpy() - expected).max() <= 1e-5


def test_maxsim_equals_late_interaction_by_hand(cli, minilm_path, jsonl, tmp_path, two_threads):
    import torch
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(minilm_path))
    model = AutoModel.from_pretrained(str(minilm_path)).eval()

    def tokens(text: str) -> np.ndarray:
        with torch.inference_mode():
            h = model(**tok(text, return_tensors="pt", truncation=True, max_length=256)).last_hidden_state[0]
        return torch.nn.functional.normalize(h, dim=-1).numpy()

    docs = DOCS[:3] + DOCS[5:]
    q = tokens(QUERY)
    expected = np.array([(q @ tokens(d).T).max(axis=1).sum() for d in docs])
    src = jsonl("docs.jsonl", [{"id": i, "text": t} for i, t in enumerate(docs)])
    out = tmp_path / "maxsim.parquet"
    cli("rerank", src, "--query", QUERY, "--method", "maxsim", "-o", out, "-q")
    got = pq.read_table(out).to_pylist()
    assert [int(r["id"]) for r in got] == np.lexsort((np.arange(len(docs)), -expected)).tolist()
    assert np.abs(np.array([r["score"] for r in got]) - np.sort(expected)[::-1]).max() <= 1e-4  # sums of ~10 dots


def test_scoring_with_a_model_that_cannot_is_a_usage_error(cli, task_models, docs_file, tmp_path):
    result = cli("rerank", docs_file, "-m", task_models("multi-class"), "--query", "x", "-o", tmp_path / "o.parquet",
                 code=2)
    assert "cannot score pairs" in result.stderr and "commands: classify" in result.stderr
    result = cli("score", docs_file, "--method", "cross-encoder", "--left", "x", "--right-col", "text",
                 "-o", tmp_path / "o.parquet", code=2)
    assert "cannot score pairs" in result.stderr
    result = cli("rerank", docs_file, "-o", tmp_path / "o.parquet", code=2)
    assert "exactly one of --query" in result.stderr
    assert not (tmp_path / "o.parquet").exists()


@pytest.mark.parametrize(
    ("cols", "null", "said"),
    [
        (("--left-col", "question", "--right-col", "answer"), "question", "text field 'question' is null"),
        (("--left-col", "question", "--right-col", "answer"), "answer", "text field 'answer' is null"),
        (("--left", "q", "--right-col", "answer"), "answer", "text field 'answer' is null"),
        (("--left-col", "text", "--right-col", "answer"), "text", "text is null"),
    ],
    ids=["left-col", "right-col", "one-left", "column-named-text"],
)
def test_score_names_the_column_of_a_null_text(cli, jsonl, tmp_path, cols, null, said):  # type: ignore[no-untyped-def]
    """A null --left-col value was reported as "text is null", naming no column the input has."""
    left = cols[1] if cols[0] == "--left-col" else "question"
    rows = [{"id": f"p{i}", left: f"who won {i}", "answer": f"the team won {i}"} for i in range(3)]
    rows[1][null] = None
    src = jsonl("pairs.jsonl", rows)
    out = tmp_path / "scores.parquet"
    failed = cli("score", src, *cols, "-o", out, code=1)
    assert f"line 2 (id 'p1'): {said}" in failed.stderr, failed.stderr
    assert not out.exists()
    errors = tmp_path / "errors.jsonl"
    cli("score", src, *cols, "-o", out, "--on-error", "skip", "--errors-file", errors, "-q", code=3)
    assert pq.read_table(out).column("id").to_pylist() == ["p0", "p2"]
    assert [json.loads(x)["reason"] for x in errors.read_text().splitlines()] == [said]


def test_rerank_bad_rows_fail_or_skip_as_every_command(cli, task_models, cross_encoder, tmp_path):  # type: ignore[no-untyped-def]
    """rerank had no --on-error: a null document or a malformed line stopped it, with no way to rank the rest;
    the contract's bad-row flags (fail/skip, --errors-file, --max-errors, exit 3) now apply to it too."""
    good = {"a": DOCS[0], "c": DOCS[1], "d": DOCS[7]}
    src = tmp_path / "docs.jsonl"
    src.write_text(json.dumps({"id": "a", "text": good["a"]}) + "\n" + json.dumps({"id": "b", "text": None}) + "\n"
                   + '{"id": "x", "text": \n' + json.dumps({"id": "c", "text": good["c"]}) + "\n"
                   + json.dumps({"id": "d", "text": good["d"]}) + "\n")
    out, errors = tmp_path / "ranked.parquet", tmp_path / "errors.jsonl"
    args = ("rerank", src, "-m", task_models("cross-encoder"), "--max-length", MAX_LENGTH, "--query", QUERY, "-o", out)
    failed = cli(*args, "--errors-file", errors, code=1)
    assert "line 2 (id 'b'): text is null" in failed.stderr and not out.exists()  # the first, not line 3
    assert [json.loads(x)["location"] for x in errors.read_text().splitlines()] == ["line 2"]
    errors.unlink()
    too_many = cli(*args, "--on-error", "skip", "--max-errors", 1, code=1)
    assert "more than 1 bad rows" in too_many.stderr and not out.exists()
    skipped = cli(*args, "--on-error", "skip", "--errors-file", errors, code=3)
    assert "2 bad input rows were skipped" in skipped.stderr
    bad = [(b["location"], b["id"]) for b in map(json.loads, errors.read_text().splitlines())]
    assert bad == [("line 2", "b"), ("line 3", "x")]
    got = pq.read_table(out).to_pylist()
    expected = cross_encoder.rank(QUERY, list(good.values()))
    assert [r["id"] for r in got] == [list(good)[e["corpus_id"]] for e in expected]
    assert np.abs(np.array([r["score"] for r in got]) - [e["score"] for e in expected]).max() <= 1e-5
    again = cli(*args, "--on-error", "skip", code=3)  # complete: nothing to do, and its skipped rows still count
    assert "nothing to do" in again.stderr
    src.write_text(json.dumps({"id": "b", "text": None}) + "\n")  # bad rows only: an empty ranking, exit 3
    cli(*args, "--on-error", "skip", "--overwrite", "-q", code=3)
    assert pq.read_table(out).num_rows == 0


def test_score_refuses_left_with_left_col(cli, jsonl, tmp_path):  # type: ignore[no-untyped-def]
    """`--left TEXT --left-col question` silently dropped the column and scored TEXT against every answer."""
    src = jsonl("pairs.jsonl", [{"id": "p0", "question": "who won", "answer": "the team won"}])
    out = tmp_path / "scores.parquet"
    err = cli("score", src, "--left", "film", "--left-col", "question", "--right-col", "answer", "-o", out, code=2)
    assert "--left and --left-col question: give one" in err.stderr and not out.exists()


@pytest.mark.parametrize(
    ("command", "flags", "limit", "said"),
    [
        ("embed", (), 1, "--max-length 1 is below the 2 special tokens the tokenizer adds to every text"),
        ("score", ("--left-col", "text", "--right-col", "other"), 2, "below the 3 special tokens"),
        ("rerank", ("--query", "q"), 2, "below the 3 special tokens the tokenizer adds to every text pair"),
        ("classify", ("--pair-col", "other"), 2, "below the 3 special tokens"),
    ],
)
def test_a_max_length_below_the_special_tokens_is_refused(cli, task_models, minilm_path, tmp_path, command, flags,
                                                          limit, said):  # type: ignore[no-untyped-def]
    """The tokenizer cannot cut into the special tokens it adds, so it left every input whole: --max-length 1
    gave each row the uncut text's vector (and a cross-encoder's --max-length 2 the uncut pair's score) at exit 0."""
    model = minilm_path if command == "embed" else task_models("cross-encoder")
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": f"r{i}", "text": t, "other": DOCS[1]}) + "\n" for i, t in enumerate(DOCS[:3])))
    out = tmp_path / "out.parquet"
    err = cli(command, src, "-m", model, "--max-length", limit, *flags, "-o", out, code=2)
    assert said in err.stderr and "Traceback" not in err.stderr and not out.exists()
    cli(command, src, "-m", model, "--max-length", limit + 1, *flags, "-o", out, "-q")  # at the count: cut to it
    assert pq.read_table(out).num_rows == 3
