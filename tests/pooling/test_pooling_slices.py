"""Chunked prefill through `Pooler.pool_slices`: each pooling method declares that it carries a sequence
across slices, a sliced sequence pools to its whole-sequence value, and a pooler that cannot carry refuses."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from embedcli.pooling import (
    PoolerConfig,
    PoolingConfigError,
    PoolingMetadata,
    PoolingParams,
    get_seq_pooling_method,
    get_tok_pooling_method,
)
from embedcli.pooling.metadata import PoolingState
from embedcli.pooling.poolers import pooler_for_embed
from embedcli.pooling.splade import SpladePooler
from tests.pooling.pooling_reference import assert_matches, ref_normalize, ref_st_pool, to_rows

HIDDEN = 6
SEQ = 10
SLICES = ((0, 3), (3, 7), (7, 10))
SHORT = 3  # a whole sequence sharing each forward, ahead of the slice
POOLINGS = {
    "CLS": ("cls",),
    "LAST": ("lasttoken",),
    "MEAN": ("mean",),
    "MAX": ("max",),
    "WEIGHTEDMEAN": ("weightedmean",),
    "CLS+MEAN": ("cls", "mean"),
}


@pytest.mark.parametrize("name", ["CLS", "LAST", "MEAN", "MAX", "MEAN_SQRT_LEN", "CLS+MEAN"])
def test_sequence_methods_declare_they_carry_slices(name: str) -> None:
    assert get_seq_pooling_method(name).carries_slices()
    assert get_seq_pooling_method(name, include_prompt=False).carries_slices()


@pytest.mark.parametrize("name", ["ALL", "STEP"])
def test_token_methods_declare_they_carry_slices(name: str) -> None:
    assert get_tok_pooling_method(name).carries_slices()


def test_a_pooler_that_cannot_carry_refuses_slices() -> None:
    pooler = SpladePooler(nn.Linear(HIDDEN, 8))
    assert not pooler.carries_slices()
    metadata = PoolingMetadata.from_cu_seqlens([0, 3], [PoolingParams(task="sparse_embed")], prompt_lens=[SEQ], seq_lens=[3])
    with pytest.raises(PoolingConfigError, match="prefill slices"):
        pooler.pool_slices(torch.zeros(3, HIDDEN), metadata, [PoolingState()])


@pytest.mark.parametrize("pooling", list(POOLINGS))
def test_sliced_sequence_pools_to_its_whole_value(pooling: str) -> None:
    """Slices 3 + 4 + 3 of a 10-token sequence, each after a whole 3-token sequence, against float64 references."""
    hidden = torch.randn(SEQ, HIDDEN)
    pooler = pooler_for_embed(PoolerConfig(seq_pooling_type=pooling))
    params = PoolingParams(task="embed", use_activation=True)
    state = PoolingState()
    for start, end in SLICES:
        short = torch.randn(SHORT, HIDDEN)
        metadata = PoolingMetadata.from_cu_seqlens(
            [0, SHORT, SHORT + end - start], [params, params], prompt_lens=[SHORT, SEQ], seq_lens=[SHORT, end]
        )
        whole, sliced = pooler.pool_slices(torch.cat([short, hidden[start:end]]), metadata, [None, state])
        assert whole is not None
        assert_matches(whole, ref_normalize(ref_st_pool(to_rows(short), POOLINGS[pooling])), atol=1e-5)
        if end < SEQ:
            assert sliced is None
    assert sliced is not None
    assert_matches(sliced, ref_normalize(ref_st_pool(to_rows(hidden), POOLINGS[pooling])), atol=1e-5)
    assert state.partial is not None
