"""sentence-transformers' Pooling modes on a packed buffer against float64 loop references."""

from __future__ import annotations

import pytest
import torch

from embedcli.pooling import PoolerConfig, PoolingMetadata, PoolingParams, get_seq_pooling_method
from embedcli.pooling.metadata import PoolingCursor
from embedcli.pooling.st_pooling import SentenceTransformerPool, parse_pooling_type
from tests.pooling.pooling_reference import (
    DTYPES,
    TOL,
    assert_matches,
    cu_from_lens,
    rand,
    ref_st_pool,
    split_rows,
    to_rows,
)

LENS = [5, 1, 9, 3]
MODES = [
    ("max",),
    ("weightedmean",),
    ("mean_sqrt_len_tokens",),
    ("mean",),
    ("cls",),
    ("lasttoken",),
    ("cls", "mean"),
    ("lasttoken", "max", "weightedmean", "mean_sqrt_len_tokens"),
]


def _metadata(lens: list[int], skip: list[int] | None = None) -> PoolingMetadata:
    return PoolingMetadata.from_cu_seqlens(
        cu_from_lens(lens), [PoolingParams(task="embed") for _ in lens], prompt_token_lens=skip
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("modes", MODES, ids=["+".join(m) for m in MODES])
@pytest.mark.parametrize("skip", [None, [2, 0, 3, 3]], ids=["prompt-included", "prompt-excluded"])
def test_modes_match_float64_reference(modes, skip, dtype) -> None:
    hidden = rand(sum(LENS), 6, dtype)
    method = SentenceTransformerPool(modes, include_prompt=skip is None)
    out = method(hidden, _metadata(LENS, skip))
    seqs = split_rows(to_rows(hidden), LENS)
    expected = [ref_st_pool(rows, modes, (skip or [0] * len(LENS))[i]) for i, rows in enumerate(seqs)]
    assert out.dtype == torch.float32
    assert_matches(out, expected, **TOL[torch.float32 if dtype == torch.float32 else dtype])


def test_include_prompt_true_ignores_prompt_lengths() -> None:
    hidden = rand(sum(LENS), 4)
    method = SentenceTransformerPool(("mean",), include_prompt=True)
    assert torch.equal(method(hidden, _metadata(LENS, [2, 0, 3, 3])), method(hidden, _metadata(LENS)))


def test_small_chunks_give_the_same_result() -> None:
    hidden = rand(sum(LENS), 8)
    modes = ("max", "weightedmean", "mean", "cls", "lasttoken")
    whole = SentenceTransformerPool(modes)(hidden, _metadata(LENS))
    # chunk_bytes of one row at a time: every accumulator crosses chunk boundaries.
    tiny = SentenceTransformerPool(modes, chunk_bytes=8 * 4)(hidden, _metadata(LENS))
    torch.testing.assert_close(tiny, whole, atol=1e-6, rtol=0)


@pytest.mark.parametrize("modes", MODES, ids=["+".join(m) for m in MODES])
@pytest.mark.parametrize("skip", [0, 3])
def test_slices_of_a_chunked_prefill_merge_to_the_whole(modes, skip) -> None:
    """A 10-token sequence computed in slices 3 + 4 + 3 (cursor as a partial prefill) equals it whole."""
    n, h = 10, 5
    hidden = rand(n, h)
    method = SentenceTransformerPool(modes, include_prompt=skip == 0)
    skip_t = torch.tensor([skip])
    acc = None
    for start, end in ((0, 3), (3, 7), (7, 10)):
        cursor = PoolingCursor.from_cu_seqlens([0, end - start], prompt_lens=[n], seq_lens=[end])
        part = method.accumulate(hidden[start:end], cursor, skip_t)
        acc = part if acc is None else acc.merge(part)
    expected = ref_st_pool(to_rows(hidden), modes, skip)
    assert_matches(method.finish(acc)[0], expected, atol=1e-5, rtol=1e-5)


def test_empty_kept_set_is_finite() -> None:
    """A sequence that is all prompt: mean and weightedmean give 0 (as sentence-transformers), max 0 (not -inf)."""
    hidden = rand(3, 4)
    out = SentenceTransformerPool(("max", "mean", "weightedmean"), include_prompt=False)(hidden, _metadata([3], [3]))
    assert torch.equal(out, torch.zeros(1, 12))


@pytest.mark.parametrize(
    ("name", "include_prompt", "cls_name"),
    [("CLS", True, "CLSPool"), ("MEAN", True, "MeanPool"), ("LAST", True, "LastPool"), ("MEAN", False, "SentenceTransformerPool"),
     ("MAX", True, "SentenceTransformerPool"), ("CLS+MEAN", True, "SentenceTransformerPool")],
)
def test_get_seq_pooling_method_keeps_vllm_methods_for_their_types(name, include_prompt, cls_name) -> None:
    method = get_seq_pooling_method(name, include_prompt)
    assert type(method).__name__ == cls_name
    PoolerConfig(seq_pooling_type=name, include_prompt=include_prompt)  # validates


def test_parse_pooling_type_order() -> None:
    assert parse_pooling_type("WEIGHTEDMEAN+CLS+MEAN_SQRT_LEN") == ("weightedmean", "cls", "mean_sqrt_len_tokens")
