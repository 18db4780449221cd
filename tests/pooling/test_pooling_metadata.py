"""PoolingCursor / PoolingMetadata / PoolingState: offsets, prefill progress, slicing with re-based indices."""

from __future__ import annotations

import itertools

import pytest
import torch
from pooling_reference import cu_from_lens, make_metadata

from embedcli.pooling import PoolingCursor, PoolingMetadata, PoolingParams, PoolingState


def _ints(t: torch.Tensor) -> list[int]:
    assert t.dtype == torch.long
    return [int(v) for v in t.tolist()]


# ---------------------------------------------------------------- PoolingCursor.from_cu_seqlens


@pytest.mark.parametrize("as_tensor", [False, True])
def test_cursor_from_cu_seqlens_whole_sequences(as_tensor: bool) -> None:
    cu = [0, 2, 5, 6]
    cursor = PoolingCursor.from_cu_seqlens(torch.tensor(cu) if as_tensor else cu)
    assert len(cursor) == 3
    assert cursor.num_tokens == 6
    assert _ints(cursor.first_token_indices) == [0, 2, 5]
    assert _ints(cursor.last_token_indices) == [1, 4, 5]
    assert _ints(cursor.num_scheduled_tokens) == [2, 3, 1]
    # Without prompt_lens / seq_lens every sequence is whole and finished in this forward.
    assert _ints(cursor.prompt_lens) == [2, 3, 1]
    assert _ints(cursor.seq_lens) == [2, 3, 1]
    assert cursor.is_partial_prefill() is False
    assert cursor.is_finished().tolist() == [True, True, True]
    assert _ints(cursor.cu_seqlens()) == cu


def test_cursor_empty_batch() -> None:
    cursor = PoolingCursor.from_cu_seqlens([0])
    assert len(cursor) == 0
    assert cursor.num_tokens == 0
    assert cursor.is_partial_prefill() is False
    assert cursor.is_finished().tolist() == []
    assert _ints(cursor.cu_seqlens()) == [0]


def test_cursor_first_slice_of_a_chunked_prefill() -> None:
    # Sequence 0: 2 of its 4 prompt tokens this forward; sequence 1 whole (3 tokens).
    cursor = PoolingCursor.from_cu_seqlens([0, 2, 5], prompt_lens=[4, 3], seq_lens=[2, 3])
    assert cursor.is_partial_prefill() is True
    assert cursor.is_finished().tolist() == [False, True]
    assert _ints(cursor.last_token_indices) == [1, 4]


def test_cursor_last_slice_is_partial_but_finished() -> None:
    # The second half of a 4-token prompt: still "partial" (scheduled != prompt) but the prompt is done.
    cursor = PoolingCursor.from_cu_seqlens([0, 2], prompt_lens=[4], seq_lens=[4])
    assert cursor.is_partial_prefill() is True
    assert cursor.is_finished().tolist() == [True]


def test_cursor_single_token_sequences() -> None:
    cursor = PoolingCursor.from_cu_seqlens([0, 1, 2, 3])
    assert _ints(cursor.first_token_indices) == [0, 1, 2]
    assert _ints(cursor.last_token_indices) == [0, 1, 2]
    assert cursor.is_partial_prefill() is False


@pytest.mark.parametrize(
    "cu, kwargs",
    [
        ([], {}),  # nothing at all
        ([1, 3], {}),  # does not start at 0
        ([[0, 1], [1, 2]], {}),  # 2-D
        ([0, 3, 2], {}),  # decreasing
        ([0, 2, 5], {"prompt_lens": [2]}),  # one prompt length for two sequences
        ([0, 2, 5], {"seq_lens": [2, 3, 4]}),  # three seq lengths for two sequences
    ],
)
def test_cursor_rejects_malformed_input(cu, kwargs) -> None:
    with pytest.raises(ValueError):
        PoolingCursor.from_cu_seqlens(cu, **kwargs)


# ---------------------------------------------------------------- slicing


LENS = [2, 3, 1, 4]


@pytest.mark.parametrize(
    "start, end", [(s, e) for s, e in itertools.combinations_with_replacement(range(len(LENS) + 1), 2)]
)
def test_cursor_slice_rebases_token_indices(start: int, end: int) -> None:
    prompt = [5, 3, 1, 4]  # sequence 0 is a partial slice of a 5-token prompt
    seq = [2, 3, 1, 4]
    cursor = PoolingCursor.from_cu_seqlens(cu_from_lens(LENS), prompt_lens=prompt, seq_lens=seq)
    sliced = cursor.slice(start, end)

    # Expected offsets, computed independently from the lengths of the kept sequences only.
    kept = LENS[start:end]
    exp_first, exp_last, offset = [], [], 0
    for n in kept:
        exp_first.append(offset)
        exp_last.append(offset + n - 1)
        offset += n
    assert len(sliced) == end - start
    assert _ints(sliced.first_token_indices) == exp_first
    assert _ints(sliced.last_token_indices) == exp_last
    assert _ints(sliced.num_scheduled_tokens) == kept
    assert _ints(sliced.prompt_lens) == prompt[start:end]
    assert _ints(sliced.seq_lens) == seq[start:end]
    assert sliced.num_tokens == sum(kept)
    assert _ints(sliced.cu_seqlens()) == cu_from_lens(kept)

    lo, hi = cursor.token_range(start, end)
    if start == end:
        assert (lo, hi) == (0, 0)
    else:
        assert (lo, hi) == (sum(LENS[:start]), sum(LENS[:end]))


def test_cursor_slice_keeps_prefill_flags_of_its_sequences() -> None:
    cursor = PoolingCursor.from_cu_seqlens([0, 2, 5], prompt_lens=[4, 3], seq_lens=[2, 3])
    assert cursor.slice(0, 1).is_partial_prefill() is True
    assert cursor.slice(1, 2).is_partial_prefill() is False
    assert cursor.slice(1, 2).is_finished().tolist() == [True]


# ---------------------------------------------------------------- PoolingMetadata


def test_metadata_requires_one_param_per_sequence() -> None:
    with pytest.raises(ValueError, match="pooling params"):
        PoolingMetadata.from_cu_seqlens([0, 2, 5], [PoolingParams()])


def test_metadata_requires_one_state_per_sequence() -> None:
    with pytest.raises(ValueError, match="pooling_states"):
        PoolingMetadata.from_cu_seqlens(
            [0, 2, 5], [PoolingParams(), PoolingParams()], pooling_states=[PoolingState()]
        )


def test_metadata_tasks_in_batch_order() -> None:
    params = [PoolingParams(task="embed"), PoolingParams(task="classify"), PoolingParams()]
    meta = make_metadata([1, 2, 3], params)
    assert len(meta) == 3
    assert meta.tasks == ["embed", "classify", None]


def test_metadata_slice_carries_params_token_ids_and_states() -> None:
    lens = [2, 3, 1]
    params = [PoolingParams(task="embed"), PoolingParams(task="classify"), PoolingParams(task="token_embed")]
    states = [PoolingState(), PoolingState(), PoolingState()]
    token_ids = torch.arange(100, 106)
    meta = make_metadata(lens, params, token_ids=token_ids, pooling_states=states)

    sliced = meta.slice(1, 3)
    assert sliced.pooling_params == params[1:3]
    assert sliced.pooling_params[0] is params[1]
    assert sliced.pooling_states is not None
    assert sliced.pooling_states[0] is states[1] and sliced.pooling_states[1] is states[2]
    assert sliced.token_ids is not None
    assert sliced.token_ids.tolist() == [102, 103, 104, 105]
    assert [t.tolist() for t in sliced.split_token_ids()] == [[102, 103, 104], [105]]
    assert _ints(sliced.cursor.first_token_indices) == [0, 3]

    empty = meta.slice(2, 2)
    assert len(empty) == 0
    assert empty.token_ids is not None and empty.token_ids.numel() == 0


def test_metadata_slice_without_token_ids_or_states() -> None:
    meta = make_metadata([2, 3])
    sliced = meta.slice(1, 2)
    assert sliced.token_ids is None
    assert sliced.pooling_states is None


def test_split_token_ids_per_sequence() -> None:
    meta = make_metadata([2, 1, 3], token_ids=torch.tensor([7, 8, 9, 10, 11, 12]))
    assert [t.tolist() for t in meta.split_token_ids()] == [[7, 8], [9], [10, 11, 12]]


def test_split_token_ids_needs_token_ids() -> None:
    with pytest.raises(ValueError, match="token ids"):
        make_metadata([2, 1]).split_token_ids()


def test_pooling_state_clear() -> None:
    state = PoolingState(hidden_states_cache=[torch.zeros(1, 2)], token_ids_cache=[torch.zeros(1)])
    state.clear()
    assert state.hidden_states_cache == [] and state.token_ids_cache == []
