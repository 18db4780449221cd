"""Packed forwards of every supported backbone against transformers' own eager forward, on tiny random models."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from embedcli.compute.runner import Runner, RunnerOptions
from tests.fixtures.tiny_models import DECODERS, ENCODERS, LONG_TEXT, PAD_ID, SAMPLE_TEXTS

ARCHS = ENCODERS + DECODERS
ST_MODELS = ("bert-st", "mpnet-st", "bert-st-dense", "bert-st-cls", "bert-st6", "mpnet-st6", "bert-st6-dense")


def _tol(name: str) -> float:
    return 1e-4 if name in DECODERS else 1e-5


def _ids(loaded, texts=SAMPLE_TEXTS) -> list[list[int]]:  # type: ignore[no-untyped-def]
    return [loaded.tokenizer.encode(t.strip()).ids for t in texts]


def _packed(loaded, ids: list[list[int]]) -> list[torch.Tensor]:  # type: ignore[no-untyped-def]
    lengths = [len(x) for x in ids]
    hidden = loaded.forward_packed(torch.tensor([i for x in ids for i in x]), lengths)
    assert hidden.shape == (sum(lengths), loaded.spec.hidden_size)
    return list(torch.split(hidden, lengths))


@torch.inference_mode()
def _alone(reference, ids: list[int]) -> torch.Tensor:  # type: ignore[no-untyped-def]
    return reference(input_ids=torch.tensor([ids])).last_hidden_state[0]


@torch.inference_mode()
def _padded(reference, ids: list[list[int]], decoder: bool) -> list[torch.Tensor]:  # type: ignore[no-untyped-def]
    """One padded transformers forward: right padding for encoders, left padding + explicit positions for decoders."""
    width = max(len(x) for x in ids)
    input_ids = torch.full((len(ids), width), PAD_ID, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for row, seq in enumerate(ids):
        if decoder:
            input_ids[row, width - len(seq) :] = torch.tensor(seq)
            mask[row, width - len(seq) :] = 1
        else:
            input_ids[row, : len(seq)] = torch.tensor(seq)
            mask[row, : len(seq)] = 1
    kwargs: dict[str, torch.Tensor] = {"input_ids": input_ids, "attention_mask": mask}
    if decoder:
        kwargs["position_ids"] = (mask.cumsum(-1) - 1).clamp(min=0)
    hidden = reference(**kwargs).last_hidden_state
    if decoder:
        return [hidden[row, width - len(seq) :] for row, seq in enumerate(ids)]
    return [hidden[row, : len(seq)] for row, seq in enumerate(ids)]


# -- backbone parity ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ARCHS)
def test_packed_forward_matches_transformers_alone(name, tiny_loaded, tiny_reference) -> None:
    loaded, reference = tiny_loaded(name), tiny_reference(name)
    ids = _ids(loaded)
    lengths = [len(x) for x in ids]
    assert min(lengths) <= 5 and max(lengths) >= 50, lengths
    worst = 0.0
    for seq, packed in zip(ids, _packed(loaded, ids), strict=True):
        worst = max(worst, (packed - _alone(reference, seq)).abs().max().item())
    assert worst <= _tol(name), f"{name}: max abs {worst:.3g}"


@pytest.mark.parametrize("name", ARCHS)
def test_packed_forward_matches_transformers_padded_batch(name, tiny_loaded, tiny_reference) -> None:
    loaded, reference = tiny_loaded(name), tiny_reference(name)
    ids = _ids(loaded)
    padded = _padded(reference, ids, decoder=name in DECODERS)
    worst = max((p - r).abs().max().item() for p, r in zip(_packed(loaded, ids), padded, strict=True))
    assert worst <= _tol(name), f"{name}: max abs {worst:.3g}"


@pytest.mark.parametrize("name", ["bert", "roberta", "mpnet", "llama"])
def test_single_sequence_pack_matches_transformers(name, tiny_loaded, tiny_reference) -> None:
    """A pack of one sequence takes the no-padding path of the packed attention."""
    loaded, reference = tiny_loaded(name), tiny_reference(name)
    seq = _ids(loaded)[3]
    (packed,) = _packed(loaded, [seq])
    assert (packed - _alone(reference, seq)).abs().max().item() <= _tol(name)


@pytest.mark.parametrize("name", ["bert", "qwen3"])
def test_equal_length_pack_matches_transformers(name, tiny_loaded, tiny_reference) -> None:
    """Sequences of one length: the padded view has no padding and no key mask."""
    loaded, reference = tiny_loaded(name), tiny_reference(name)
    ids = _ids(loaded, ["fox dog", "bank deal", "the tv"])
    assert len({len(x) for x in ids}) == 1
    for seq, packed in zip(ids, _packed(loaded, ids), strict=True):
        assert (packed - _alone(reference, seq)).abs().max().item() <= _tol(name)


@pytest.mark.parametrize("name", ["roberta", "xlm-roberta", "mpnet"])
def test_fairseq_position_offset(name, tiny_loaded) -> None:
    loaded = tiny_loaded(name)
    assert loaded.position_ids([3, 2]).tolist() == [2, 3, 4, 2, 3]


@pytest.mark.parametrize("name", ["bert", "distilbert", "llama"])
def test_positions_restart_at_zero(name, tiny_loaded) -> None:
    assert tiny_loaded(name).position_ids([3, 2]).tolist() == [0, 1, 2, 0, 1]


# -- pooled outputs ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", DECODERS)
def test_last_pooling_matches_last_hidden_state(name, tiny_loaded, tiny_reference) -> None:
    loaded, reference = tiny_loaded(name), tiny_reference(name)
    assert loaded.spec.seq_pooling_type == "LAST"
    got = Runner(loaded, RunnerOptions(normalize=False)).embed(list(SAMPLE_TEXTS))
    want = np.stack([_alone(reference, seq)[-1].numpy() for seq in _ids(loaded)])
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-4


@pytest.mark.parametrize("name", DECODERS)
def test_last_pooling_normalized_by_default(name, tiny_loaded, tiny_reference) -> None:
    loaded, reference = tiny_loaded(name), tiny_reference(name)
    got = Runner(loaded).embed(list(SAMPLE_TEXTS))
    want = np.stack([_alone(reference, seq)[-1].numpy() for seq in _ids(loaded)])
    want /= np.linalg.norm(want, axis=1, keepdims=True)
    assert np.abs(got - want).max() <= 1e-5


@pytest.mark.parametrize("name", ENCODERS)
def test_cls_pooling_default_for_plain_encoders(name, tiny_loaded, tiny_reference) -> None:
    loaded, reference = tiny_loaded(name), tiny_reference(name)
    assert loaded.spec.seq_pooling_type == "CLS" and loaded.spec.normalize
    got = Runner(loaded).embed(list(SAMPLE_TEXTS))
    want = np.stack([_alone(reference, seq)[0].numpy() for seq in _ids(loaded)])
    want /= np.linalg.norm(want, axis=1, keepdims=True)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)
    assert np.abs(got - want).max() <= 1e-5


@pytest.mark.parametrize("name", ARCHS)
@pytest.mark.parametrize("max_batch_tokens", [16, 64, 4096])
def test_batch_invariance(name, max_batch_tokens, tiny_loaded) -> None:
    """A text embedded alone or packed among others (under any token budget) gives the same vector."""
    loaded = tiny_loaded(name)
    runner = Runner(loaded, RunnerOptions(max_batch_tokens=max_batch_tokens, normalize=False))
    texts = [*SAMPLE_TEXTS, "hello", SAMPLE_TEXTS[1]]  # duplicates pack next to each other
    together = runner.embed(texts)
    alone = np.concatenate([Runner(loaded, RunnerOptions(normalize=False)).embed([t]) for t in texts])
    assert np.abs(together - alone).max() <= 1e-5
    if max_batch_tokens == 16:
        assert runner.stats.forwards > 3  # really split into several packs


@pytest.mark.parametrize("name", ["bert", "mpnet", "qwen2", "mistral"])
def test_input_order_preserved(name, tiny_loaded) -> None:
    """Packs are built longest first; results still come back in input order."""
    loaded = tiny_loaded(name)
    rng = np.random.default_rng(7)
    words = "the of market bank film music game player minister court phone internet".split()
    texts = [" ".join(rng.choice(words, size=n)) for n in rng.permutation(np.arange(1, 31))]
    lengths = [len(loaded.tokenizer.encode(t).ids) for t in texts]
    assert lengths != sorted(lengths, reverse=True)
    together = Runner(loaded, RunnerOptions(max_batch_tokens=128)).embed(texts)
    alone = np.concatenate([Runner(loaded).embed([t]) for t in texts])
    assert np.abs(together - alone).max() <= 1e-5
    # Rows are distinct, so any permutation would have been caught.
    assert np.min(np.abs(together[1:] - together[:-1]).max(axis=1)) > 1e-3


# -- sentence-transformers parity ---------------------------------------------------------------------


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.mark.parametrize("name", ST_MODELS)
def test_sentence_transformers_parity(name, tiny_model, tiny_loaded) -> None:
    from sentence_transformers import SentenceTransformer

    texts = [*SAMPLE_TEXTS, LONG_TEXT, LONG_TEXT[:150]]
    loaded = tiny_loaded(name)
    assert loaded.spec.max_length == 64
    assert len(loaded.hf_tokenizer(LONG_TEXT).input_ids) > 64  # the long text is truncated on both sides
    st = SentenceTransformer(str(tiny_model(name)), device="cpu")
    want = st.encode(texts, normalize_embeddings=False, convert_to_numpy=True, batch_size=4)
    got = Runner(loaded).embed(texts)
    assert got.shape == want.shape == (len(texts), loaded.spec.embedding_size)
    assert _cosines(got, want).min() >= 0.99999
    assert np.abs(got - want).max() <= 1e-5


@pytest.mark.parametrize("name", ["bert-st-dense", "bert-st6-dense"])
def test_dense_projector_changes_the_width(name, tiny_loaded) -> None:
    loaded = tiny_loaded(name)
    assert loaded.spec.embedding_size == 16 and loaded.spec.hidden_size == 32
    assert Runner(loaded).embed(["hello"]).shape == (1, 16)


# -- fairseq positions numbered from the token ids, as transformers numbers them -------------------------------------
# A text may hold the padding token itself ("<pad>" on XLM-R): transformers gives it the padding position and does
# not count it, so every later token's position moves down by one. Texts pack with budget 8 and 4096.
PAD_TEXTS = ["hello [PAD] world the market", "[PAD]", "[PAD] [PAD] fox", "zzz ☃ market ☃", *SAMPLE_TEXTS[:3]]


@pytest.mark.parametrize(("kind", "pad"), [("xlm-roberta", None), ("mpnet", None), ("roberta", 0), ("roberta", 3)])
@pytest.mark.parametrize("budget", [8, 4096])
def test_fairseq_positions_follow_the_padding_id(kind, pad, budget, cli, tiny_model, tmp_path) -> None:
    import json

    from sentence_transformers import SentenceTransformer

    from tests.fixtures.tiny_models import build_legacy_st_model, copy_model, edit_json

    base = copy_model(tiny_model(kind), tmp_path / "base")
    if pad is not None:  # another padding index (3 is [UNK], which "☃" tokenizes to)
        edit_json(base / "config.json", lambda c: c.update(pad_token_id=pad))
    folder = build_legacy_st_model(base, tmp_path / "st")
    src = tmp_path / "t.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in PAD_TEXTS), encoding="utf-8")
    out = tmp_path / "v.jsonl"
    cli("embed", src, "-m", folder, "-o", out, "-q", "--max-batch-tokens", budget)
    got = np.array([json.loads(line)["embedding"] for line in out.read_text().splitlines()])
    ref = SentenceTransformer(str(folder), device="cpu").encode(PAD_TEXTS)
    assert np.abs(got - ref).max() <= 1e-5
    # The table holds max_position_embeddings rows, the first padding index + 1 of them never a real position.
    first = (1 if pad is None else pad) + 1
    assert json.loads(cli("info", base, "--json").stdout)["max_length"] == 128 - first
