"""Runner: tokenize -> pack -> forward -> pool over streamed batches, on tiny random models."""

from __future__ import annotations

import itertools
import re
from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from embedcli.compute.options import DEFAULT_MAX_BATCH_TOKENS
from embedcli.compute.runner import LongInputError, Runner, RunnerOptions, prefetch
from embedcli.pooling import PoolingConfigError
from tests.fixtures.tiny_models import LONG_TEXT, SAMPLE_TEXTS

pytestmark = pytest.mark.usefixtures("torch_single_thread")

TEXTS = list(SAMPLE_TEXTS)


def _normalize(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _mean_pooled(loaded, ids) -> np.ndarray:  # type: ignore[no-untyped-def]
    """Mean of the last hidden states of one sequence run alone."""
    return loaded.forward_packed(torch.as_tensor(ids), [len(ids)]).mean(0).numpy()


# -- options and validation ---------------------------------------------------------------------------


def test_defaults(tiny_loaded) -> None:
    runner = Runner(tiny_loaded("bert-st"))
    assert runner.max_batch_tokens == DEFAULT_MAX_BATCH_TOKENS["cpu"]
    assert runner.max_length == 64
    assert runner.params.task == "embed" and runner.params.use_activation is True


def test_runners_are_engines_of_the_run_loop(tiny_loaded) -> None:
    from embedcli.engines.ray_engine import RayRunner
    from embedcli.run import Engine

    runner = Runner(tiny_loaded("bert-st"))
    assert isinstance(runner, Engine) and isinstance(RayRunner(runner, workers=2), Engine)


def test_max_length_option_overrides_model(tiny_loaded) -> None:
    runner = Runner(tiny_loaded("bert-st"), RunnerOptions(max_length=16))
    enc = runner.tokenize([LONG_TEXT])
    assert runner.max_length == 16 and enc.lengths.tolist() == [16]


def test_unsupported_task(tiny_loaded) -> None:
    with pytest.raises(ValueError, match=r"cannot do 'classify'; it supports embed, token_embed"):
        Runner(tiny_loaded("bert"), RunnerOptions(task="classify"))


def test_dimensions_without_matryoshka_truncate_with_a_note(tiny_loaded, capsys) -> None:
    Runner(tiny_loaded("bert-st"), RunnerOptions(dimensions=8))
    assert "declares no Matryoshka dimensions" in capsys.readouterr().err
    with pytest.raises(PoolingConfigError, match="exceeds the embedding size 32"):
        Runner(tiny_loaded("bert-st"), RunnerOptions(dimensions=33))


def test_matryoshka_dimensions_slice_then_normalize(tiny_loaded) -> None:
    loaded = tiny_loaded("bert-st")
    full = Runner(loaded, RunnerOptions(normalize=False)).embed(TEXTS)
    matryoshka = replace(loaded.spec, is_matryoshka=True, matryoshka_dimensions=(8, 16, 32))
    original = loaded.spec
    loaded.spec = matryoshka
    try:
        sliced = Runner(loaded, RunnerOptions(dimensions=16)).embed(TEXTS)
        with pytest.raises(PoolingConfigError, match="not one of the model's Matryoshka sizes"):
            Runner(loaded, RunnerOptions(dimensions=12))
    finally:
        loaded.spec = original
    assert sliced.shape == (len(TEXTS), 16)
    assert np.abs(sliced - _normalize(full[:, :16])).max() <= 1e-6


def test_prepare_strips_and_prompts(tiny_loaded) -> None:
    loaded = tiny_loaded("bert-st")
    # Whitespace is kept by default (sentence-transformers >= 5.4, vLLM, TEI); --strip opts in.
    assert Runner(loaded)._prepare("  Hello  ") == "  Hello  "
    assert Runner(loaded, RunnerOptions(strip=True))._prepare(" Hi ") == "Hi"
    assert Runner(loaded, RunnerOptions(prompt="query: ", strip=True))._prepare(" Hi ") == "query: Hi"
    original = loaded.spec
    loaded.spec = replace(original, do_lower_case=True)
    try:  # do_lower_case lowercases inside the tokenizer, where special tokens are spared, not here
        assert Runner(loaded, RunnerOptions(strip=True))._prepare(" Hi [SEP] ") == "Hi [SEP]"
    finally:
        loaded.spec = original


def test_prompt_is_prepended(tiny_loaded) -> None:
    loaded = tiny_loaded("bert-st")
    with_prompt = Runner(loaded, RunnerOptions(prompt="query: ")).embed(TEXTS)
    by_hand = Runner(loaded).embed(["query: " + t.strip() for t in TEXTS])
    assert np.abs(with_prompt - by_hand).max() <= 1e-6
    assert np.abs(with_prompt - Runner(loaded).embed(TEXTS)).max() > 1e-3


# -- long inputs --------------------------------------------------------------------------------------


def test_truncate_keeps_the_start(tiny_loaded) -> None:
    loaded = tiny_loaded("bert-st")
    runner = Runner(loaded)
    enc = runner.tokenize([LONG_TEXT, "hello"])
    loaded.tokenizer.no_truncation()  # the runner left truncation on the shared tokenizer: undo it
    full = loaded.tokenizer.encode(LONG_TEXT).ids
    assert len(full) > 64
    assert enc.lengths.tolist()[0] == 64
    assert enc.ids[0].tolist() == [*full[:63], full[-1]]  # [CLS] + first 62 pieces + [SEP]
    assert runner.stats.truncated_rows == 1


def test_truncate_left_keeps_the_end(tiny_loaded) -> None:
    loaded = tiny_loaded("bert-st")
    enc = Runner(loaded, RunnerOptions(truncation_side="left")).tokenize([LONG_TEXT])
    loaded.tokenizer.no_truncation()
    full = loaded.tokenizer.encode(LONG_TEXT).ids
    assert enc.ids[0].tolist() == [full[0], *full[-63:]]


def test_truncated_embedding_equals_embedding_of_the_kept_tokens(tiny_loaded) -> None:
    loaded = tiny_loaded("bert-st")
    runner = Runner(loaded, RunnerOptions(normalize=False))
    got = runner.embed([LONG_TEXT])[0]
    ids = runner.tokenize([LONG_TEXT]).ids[0]
    assert np.abs(got - _mean_pooled(loaded, ids)).max() <= 1e-5


def test_long_input_error_counts_rows_across_batches(tiny_loaded) -> None:
    runner = Runner(tiny_loaded("bert-st"), RunnerOptions(long_inputs="error"))
    batches = [["hello", "the dog"], ["fox", LONG_TEXT]]
    results = runner.map(batches)
    assert next(results).shape == (2, 32)
    with pytest.raises(LongInputError) as err:
        next(results)
    assert (err.value.index, err.value.max_length) == (3, 64)
    assert err.value.length > 64
    assert re.search(r"\b3\b.* has \d+ tokens, more than the model's max length 64", str(err.value))


def test_error_mode_accepts_inputs_at_the_limit(tiny_loaded) -> None:
    runner = Runner(tiny_loaded("bert-st"), RunnerOptions(long_inputs="error", max_length=128))
    assert runner.embed([LONG_TEXT]).shape == (1, 32)


def _chunks(loaded, text: str, size: int) -> list[list[int]]:  # type: ignore[no-untyped-def]
    loaded.tokenizer.no_truncation()  # the runner leaves truncation set on the shared tokenizer
    ids = loaded.tokenizer.encode(text).ids
    return [ids[i : i + size] for i in range(0, len(ids), size)]


def test_chunked_input_is_token_weighted_mean_of_chunks(tiny_loaded) -> None:
    """Without normalization: chunks of max_length ids, each pooled, token-weighted mean (as vLLM)."""
    loaded = tiny_loaded("bert-st")
    runner = Runner(loaded, RunnerOptions(long_inputs="chunk", normalize=False))
    got = runner.embed(["hello", LONG_TEXT, "the dog"])
    chunks = _chunks(loaded, LONG_TEXT, 64)
    assert len(chunks) == 2 and len(chunks[-1]) < 64
    weights = np.array([len(c) for c in chunks], dtype=np.float64)
    pooled = np.stack([_mean_pooled(loaded, c) for c in chunks])
    want = (weights[:, None] * pooled).sum(0) / weights.sum()
    assert np.abs(got[1] - want).max() <= 1e-5
    assert runner.stats.chunked_rows == 1 and runner.stats.rows == 3
    short = Runner(loaded, RunnerOptions(normalize=False)).embed(["hello", "the dog"])
    assert np.abs(got[[0, 2]] - short).max() <= 1e-6


def test_chunked_input_normalized_once_after_the_mean(tiny_loaded) -> None:
    """With normalization on, the row is normalized after the token-weighted mean of raw chunk vectors
    (for MEAN pooling: exactly the mean over all of its tokens), not averaged from normalized chunks."""
    loaded = tiny_loaded("bert-st")
    got = Runner(loaded, RunnerOptions(long_inputs="chunk")).embed([LONG_TEXT, "hello"])
    chunks = _chunks(loaded, LONG_TEXT, 64)
    weights = np.array([len(c) for c in chunks], dtype=np.float64)
    raw = (weights[:, None] * np.stack([_mean_pooled(loaded, c) for c in chunks])).sum(0) / weights.sum()
    assert np.abs(got[0] - _normalize(raw)).max() <= 1e-5
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)
    assert np.abs(got[1] - Runner(loaded).embed(["hello"])[0]).max() <= 1e-6


# -- text pairs ---------------------------------------------------------------------------------------


def test_text_pair_uses_token_types(tiny_loaded, tiny_reference) -> None:
    loaded, reference = tiny_loaded("bert"), tiny_reference("bert")
    runner = Runner(loaded, RunnerOptions(normalize=False))
    pair = ("the quick brown fox", "jumps over the lazy dog")
    enc = runner.tokenize([pair])
    types = enc.type_ids[0]
    assert types[0] == 0 and types[-1] == 1 and 0 < types.sum() < len(types)
    with torch.inference_mode():
        ref = reference(input_ids=torch.as_tensor(enc.ids[0])[None], token_type_ids=torch.as_tensor(types)[None])
    got = runner.embed([pair, "hello"])
    assert np.abs(got[0] - ref.last_hidden_state[0, 0].numpy()).max() <= 1e-5
    # Without its token types the same ids embed differently: the types really reach the model.
    joined = loaded.forward_packed(torch.as_tensor(enc.ids[0]), [len(types)])[0].numpy()
    assert np.abs(got[0] - joined).max() > 1e-3


# -- results, order, streaming ------------------------------------------------------------------------


def test_embed_empty(tiny_loaded) -> None:
    runner = Runner(tiny_loaded("bert-st-dense"))
    out = runner.embed([])
    assert out.shape == (0, 16) and out.dtype == np.float32
    assert list(runner.map([])) == []
    (empty,) = list(runner.map([[]]))
    assert empty.shape == (0, 16)


def test_batch_rows_do_not_change_results(tiny_loaded) -> None:
    loaded = tiny_loaded("mpnet-st")
    texts = TEXTS * 3
    whole = Runner(loaded).embed(texts)
    split = Runner(loaded).embed(texts, batch_rows=4)
    assert whole.shape == (len(texts), 32) and np.abs(whole - split).max() <= 1e-6


def test_map_yields_one_result_per_batch_in_order(tiny_loaded) -> None:
    loaded = tiny_loaded("bert-st")
    batches = [TEXTS[:2], TEXTS[2:3], TEXTS[3:]]
    results = list(Runner(loaded).map(iter(batches)))
    assert [r.shape[0] for r in results] == [2, 1, len(TEXTS) - 3]
    assert np.abs(np.concatenate(results) - Runner(loaded).embed(TEXTS)).max() <= 1e-6


def test_map_is_lazy_on_an_endless_stream(tiny_loaded) -> None:
    pulled = 0

    def endless():  # type: ignore[no-untyped-def]
        nonlocal pulled
        for i in itertools.count():
            pulled += 1
            yield [f"text {i}"]

    first = list(itertools.islice(Runner(tiny_loaded("bert-st")).map(endless()), 3))
    assert len(first) == 3
    assert pulled <= 3 + 4  # prefetched a few batches ahead, not the whole stream


def test_stream_failure_reaches_the_consumer(tiny_loaded) -> None:
    def failing():  # type: ignore[no-untyped-def]
        yield ["hello"]
        raise OSError("disk gone")

    results = Runner(tiny_loaded("bert-st")).map(failing())
    assert next(results).shape == (1, 32)
    with pytest.raises(OSError, match="disk gone"):
        next(results)


def test_prefetch_preserves_order_and_errors() -> None:
    assert list(prefetch(iter(range(50)), depth=2)) == list(range(50))

    def broken():  # type: ignore[no-untyped-def]
        yield 1
        raise KeyError("x")

    out = prefetch(broken())
    assert next(out) == 1
    with pytest.raises(KeyError):
        next(out)


def test_prefetch_joins_its_thread_when_closed_mid_item() -> None:
    import threading
    import time

    def slow():  # type: ignore[no-untyped-def]
        for i in range(10):
            time.sleep(0.3)  # a tokenizer call in progress when the consumer stops
            yield i

    before = set(threading.enumerate())
    out = prefetch(slow(), depth=1)
    assert next(out) == 0
    out.close()
    # A daemon thread left inside a native call when the interpreter exits aborts the process (exit -6).
    assert [t for t in threading.enumerate() if t not in before and t.name == "embedcli-tokenize"] == []


def test_stats(tiny_loaded) -> None:
    loaded = tiny_loaded("bert-st")
    runner = Runner(loaded, RunnerOptions(max_batch_tokens=32))
    runner.embed(TEXTS)
    lengths = runner.tokenize(TEXTS).lengths
    stats = runner.stats.to_dict()
    assert stats["rows"] == len(TEXTS) and stats["tokens"] == int(lengths.sum())
    assert stats["forwards"] == len(runner._packs(lengths)) >= 2
    assert stats["seconds"]["compute"] > 0


def test_token_embed_gives_per_token_rows(tiny_loaded) -> None:
    loaded = tiny_loaded("bert-st")
    runner = Runner(loaded, RunnerOptions(task="token_embed", max_batch_tokens=24))
    (out,) = list(runner.map([TEXTS]))
    assert isinstance(out, list) and len(out) == len(TEXTS)
    for text, rows in zip(TEXTS, out, strict=True):
        ids = loaded.tokenizer.encode(text.strip()).ids
        hidden = loaded.forward_packed(torch.as_tensor(ids), [len(ids)]).numpy()
        assert rows.shape == (len(ids), 32)
        assert np.abs(rows - _normalize(hidden)).max() <= 1e-5


# -- packing ------------------------------------------------------------------------------------------


@given(
    lengths=st.lists(st.integers(min_value=1, max_value=80), min_size=0, max_size=40),
    budget=st.integers(min_value=1, max_value=200),
)
@settings(max_examples=100, deadline=None)
def test_packs_partition_under_budget(tiny_loaded, lengths: list[int], budget: int) -> None:
    runner = Runner(tiny_loaded("bert"), RunnerOptions(max_batch_tokens=budget))
    packs = runner._packs(np.asarray(lengths, dtype=np.int64))
    members = [i for p in packs for i in p.tolist()]
    assert sorted(members) == list(range(len(lengths)))  # every sequence exactly once
    for p in packs:
        sizes = [lengths[i] for i in p.tolist()]
        assert len(p) >= 1
        assert sum(sizes) <= budget or len(p) == 1  # only a lone over-long sequence may exceed it
    ordered = [lengths[i] for i in members]
    assert ordered == sorted(lengths, reverse=True)  # longest first
