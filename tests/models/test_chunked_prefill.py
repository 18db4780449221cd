"""Chunked prefill (issue 7): long decoder sequences in slices with a KV cache equal one unsliced forward."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import numpy as np
import pytest
import torch

from embedcli.compute.prefill import plan_forwards, slice_bounds
from embedcli.compute.runner import Encoded, Runner, RunnerOptions
from embedcli.models.kernels.kv_cache import PrefixSlice, SequenceKVCache, prefix_causal_mask
from embedcli.models.kernels.packing import PackInfo, packed_attention
from embedcli.models.loader import LoadedModel, ModelOptions
from embedcli.models.spec import load_model_spec

DOC_TOKENS = 4000
SHORTS = [37, 5, 120, 250, 64, 1, 90]
TOL = 1e-4


def _build_long_decoder(kind: str, folder: Path) -> Path:
    import transformers as tf

    from tests.fixtures.tiny_models import DECODER_KW, write_tokenizer

    torch.manual_seed(7)
    vocab = write_tokenizer(folder, decoder=True)
    config_cls, model_cls = {"llama": (tf.LlamaConfig, tf.LlamaForCausalLM), "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM)}[
        kind
    ]
    kw = {**DECODER_KW, "max_position_embeddings": 4096}
    model_cls(config_cls(vocab_size=vocab, **kw)).eval().save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="module")
def long_decoders(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """`get(kind, pooling) -> LoadedModel`: tiny random decoders with 4,096 positions, float32 on CPU."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    root = tmp_path_factory.mktemp("long_decoders")
    folders: dict[str, Path] = {}
    loaded: dict[tuple[str, str], LoadedModel] = {}

    def get(kind: str, pooling: str) -> LoadedModel:
        if kind not in folders:
            folders[kind] = _build_long_decoder(kind, root / kind)
        if (kind, pooling) not in loaded:
            spec = dataclasses.replace(load_model_spec(str(folders[kind])), seq_pooling_type=pooling)
            loaded[kind, pooling] = LoadedModel(spec, ModelOptions(device="cpu", dtype="float32"))
        return loaded[kind, pooling]

    return get


def _encoded(seqs: list[np.ndarray]) -> Encoded:
    return Encoded(
        ids=seqs, type_ids=None, owner=np.arange(len(seqs), dtype=np.int64), num_rows=len(seqs)
    )


def _sequences(vocab: int, lengths: list[int], seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(5, vocab, size=n, dtype=np.int64) for n in lengths]


def _run(model: LoadedModel, seqs: list[np.ndarray], budget: int) -> tuple[np.ndarray, Runner]:
    runner = Runner(model, RunnerOptions(max_batch_tokens=budget, normalize=False))
    return np.asarray(runner.run_encoded(_encoded(seqs))), runner


# -- scheduling ----------------------------------------------------------------------------------------


def test_slice_bounds_cover_the_sequence_once() -> None:
    assert slice_bounds(4000, 1000) == [(0, 1000), (1000, 2000), (2000, 3000), (3000, 4000)]
    assert slice_bounds(4000, 512)[0] == (0, 4000 % 512)
    for budget in (256, 512, 1000, 3999):
        bounds = slice_bounds(4000, budget)
        assert bounds[0][0] == 0 and bounds[-1][1] == 4000
        assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
        assert all(0 < e - s <= budget for s, e in bounds)


def test_plan_fills_the_first_slice_and_keeps_the_budget() -> None:
    lengths = np.asarray([DOC_TOKENS, *SHORTS, 3000])
    forwards, sliced, solo = plan_forwards(lengths, 512, sliceable=True)
    assert (sliced, solo) == (2, 0)
    assert all(f.tokens(lengths) <= 512 for f in forwards)
    # Every short sequence once, every token of each long one once, slices in order.
    members = sorted(i for f in forwards for i in f.members)
    assert members == list(range(1, 1 + len(SHORTS)))
    for seq in (0, len(lengths) - 1):
        pieces = [f.slice for f in forwards if f.slice is not None and f.slice.seq == seq]
        assert pieces[0].start == 0 and pieces[-1].end == lengths[seq]
        assert all(a.end == b.start for a, b in itertools.pairwise(pieces))
    first = next(f for f in forwards if f.slice is not None and f.slice.seq == 0)
    assert first.members, "the first slice's room is filled with short sequences"


def test_plan_runs_encoder_long_sequences_alone() -> None:
    lengths = np.asarray([5, 700, 30, 900])
    forwards, sliced, solo = plan_forwards(lengths, 512, sliceable=False)
    assert (sliced, solo) == (0, 2)
    assert [f.members for f in forwards if f.tokens(lengths) > 512] == [[3], [1]]
    assert all(f.slice is None for f in forwards)


# -- attention against the KV cache ----------------------------------------------------------------


def test_prefix_mask_is_bottom_right_causal() -> None:
    mask = prefix_causal_mask(3, 2, torch.device("cpu"))
    assert mask.tolist() == [
        [True, True, True, False, False],
        [True, True, True, True, False],
        [True, True, True, True, True],
    ]


def test_sliced_attention_equals_whole_causal_attention() -> None:
    torch.manual_seed(0)
    n, heads, kv_heads, dim = 300, 4, 2, 8
    q, k, v = torch.randn(n, heads, dim), torch.randn(n, kv_heads, dim), torch.randn(n, kv_heads, dim)
    whole = packed_attention(q, k, v, PackInfo.build([n]), causal=True)
    others = [torch.randn(m, h, dim) for m, h in ((17, heads), (17, kv_heads), (17, kv_heads))]

    class _Layer(torch.nn.Module):
        layer_idx = 0
        is_causal = True

    cache = SequenceKVCache(capacity=n)
    outs = []
    for start, end in ((0, 70), (70, 71), (71, 200), (200, 300)):
        piece = PrefixSlice(cache, end - start)
        qq, kk, vv = (torch.cat([o, t[start:end]]).transpose(0, 1)[None] for o, t in zip(others, (q, k, v), strict=True))
        out, _ = piece.attention(_Layer(), qq, kk, vv, PackInfo.build([17]), None)
        cache.advance(end - start)
        outs.append(out[0, 17:])
    assert torch.allclose(torch.cat(outs), whole, atol=1e-5)


# -- end to end: a 4,000-token document -------------------------------------------------------------


@pytest.fixture(scope="module")
def reference(long_decoders):  # type: ignore[no-untyped-def]
    """Unsliced results (one forward per sequence) per (kind, pooling), cached."""
    cache: dict[tuple[str, str], tuple[list[np.ndarray], np.ndarray]] = {}

    def get(kind: str, pooling: str) -> tuple[list[np.ndarray], np.ndarray]:
        if (kind, pooling) not in cache:
            model = long_decoders(kind, pooling)
            seqs = _sequences(model.backbone.config.vocab_size, [DOC_TOKENS, *SHORTS], seed=1)
            rows = [_run(model, [s], budget=DOC_TOKENS)[0][0] for s in seqs]
            cache[kind, pooling] = (seqs, np.stack(rows))
        return cache[kind, pooling]

    return get


MAX_ABS: dict[tuple[str, str, int, str], float] = {}


@pytest.mark.parametrize("pooling", ["LAST", "MEAN", "CLS"])
@pytest.mark.parametrize("budget", [256, 512, 1000])
def test_sliced_document_equals_unsliced_llama(long_decoders, reference, pooling: str, budget: int) -> None:  # type: ignore[no-untyped-def]
    _check_sliced("llama", pooling, budget, long_decoders, reference)


@pytest.mark.parametrize("pooling", ["LAST", "MEAN"])
def test_sliced_document_equals_unsliced_qwen3(long_decoders, reference, pooling: str) -> None:  # type: ignore[no-untyped-def]
    _check_sliced("qwen3", pooling, 512, long_decoders, reference)


def _check_sliced(kind: str, pooling: str, budget: int, long_decoders, reference) -> None:  # type: ignore[no-untyped-def]
    model = long_decoders(kind, pooling)
    seqs, expected = reference(kind, pooling)
    doc, shorts = seqs[0], seqs[1:]
    alone, runner = _run(model, [doc], budget)
    assert runner.stats.sliced_rows == 1 and runner.stats.solo_rows == 0
    assert runner.stats.forwards == len(slice_bounds(DOC_TOKENS, budget))
    assert runner.stats.tokens == DOC_TOKENS
    worst = float(np.abs(alone[0] - expected[0]).max())
    # The same document among other sequences (in two orders) and beside a second long one.
    for batch in ([doc, *shorts], [*shorts[::-1], doc], [shorts[2], doc[:1500], doc, shorts[0]]):
        got, runner = _run(model, batch, budget)
        at = next(i for i, s in enumerate(batch) if s is doc)
        worst = max(worst, float(np.abs(got[at] - expected[0]).max()))
        for i, s in enumerate(batch):
            if len(s) <= budget and i != at:
                j = next(j for j, t in enumerate(shorts) if t is s)
                assert np.abs(got[i] - expected[1 + j]).max() <= TOL
    MAX_ABS[kind, pooling, budget, "doc"] = worst
    print(f"\n{kind} {pooling} slices of {budget}: max abs {worst:.2e}")
    assert worst <= TOL, f"{kind} {pooling} budget {budget}: max abs {worst}"


def test_results_independent_of_forward_neighbours(long_decoders) -> None:  # type: ignore[no-untyped-def]
    """The sliced document's vector is bitwise-close whatever shares its first slice."""
    model = long_decoders("llama", "MEAN")
    seqs = _sequences(model.backbone.config.vocab_size, [DOC_TOKENS, *SHORTS], seed=2)
    a, _ = _run(model, [seqs[0]], 512)
    b, _ = _run(model, seqs, 512)
    c, _ = _run(model, [seqs[0], *seqs[4:]], 512)
    assert np.abs(a[0] - b[0]).max() <= TOL and np.abs(a[0] - c[0]).max() <= TOL


def test_normalized_sliced_embedding_is_unit_norm(long_decoders) -> None:  # type: ignore[no-untyped-def]
    model = long_decoders("llama", "MEAN")
    seqs = _sequences(model.backbone.config.vocab_size, [1200, 30], seed=3)
    runner = Runner(model, RunnerOptions(max_batch_tokens=256, normalize=True))
    out = np.asarray(runner.run_encoded(_encoded(seqs)))
    assert np.allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)


def test_slicing_can_be_turned_off(long_decoders) -> None:  # type: ignore[no-untyped-def]
    model = long_decoders("llama", "LAST")
    seqs = _sequences(model.backbone.config.vocab_size, [1200, 30], seed=4)
    runner = Runner(model, RunnerOptions(max_batch_tokens=256, normalize=False, chunked_prefill=False))
    runner.run_encoded(_encoded(seqs))
    assert (runner.stats.sliced_rows, runner.stats.solo_rows, runner.stats.forwards) == (0, 1, 2)


def test_encoder_over_budget_runs_alone(tiny_loaded) -> None:  # type: ignore[no-untyped-def]
    """An encoder sequence over the budget but under the max length: one forward of its own, counted."""
    model = tiny_loaded("bert")
    vocab = model.backbone.config.vocab_size
    seqs = _sequences(vocab, [100, 20, 30, 10], seed=5)
    runner = Runner(model, RunnerOptions(max_batch_tokens=64, normalize=False))
    got = np.asarray(runner.run_encoded(_encoded(seqs)))
    assert runner.stats.solo_rows == 1 and runner.stats.sliced_rows == 0
    assert runner.stats.forwards == 2  # [100] alone, then 30 + 20 + 10
    single = np.stack([np.asarray(Runner(model, RunnerOptions(normalize=False)).run_encoded(_encoded([s])))[0] for s in seqs])
    assert np.abs(got - single).max() <= 1e-5
    assert runner.stats.to_dict()["solo_rows"] == 1


def test_token_embed_concatenates_the_slices(long_decoders) -> None:  # type: ignore[no-untyped-def]
    """ALL pooling (token_embed): the per-token rows of the slices, concatenated, equal the unsliced rows."""
    model = long_decoders("llama", "LAST")
    seqs = _sequences(model.backbone.config.vocab_size, [1100, 40, 7], seed=6)
    whole = Runner(model, RunnerOptions(task="token_embed", max_batch_tokens=2048, normalize=False))
    sliced = Runner(model, RunnerOptions(task="token_embed", max_batch_tokens=256, normalize=False))
    a = whole.run_encoded(_encoded(seqs))
    b = sliced.run_encoded(_encoded(seqs))
    assert sliced.stats.sliced_rows == 1
    for x, y in zip(a, b, strict=True):
        assert x.shape == y.shape
        assert np.abs(x - y).max() <= TOL
