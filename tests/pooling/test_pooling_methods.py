"""Pooling methods (CLS, LAST, MEAN, ALL, STEP), segment_sum_float32 and the method factories.

Mirrors vLLM `tests/model_executor/layers/test_pooler_methods.py`; expectations are float64 loops.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pooling_reference import (
    DTYPES,
    assert_matches,
    assert_rows_equal,
    make_metadata,
    rand,
    ref_mean,
    ref_sum,
    split_rows,
    to_rows,
)

from embedcli.pooling import (
    POOLING_TASKS,
    AllPool,
    CLSPool,
    LastPool,
    MeanPool,
    PoolingParams,
    PoolingState,
    StepPool,
    get_seq_pooling_method,
    get_tok_pooling_method,
    segment_sum_float32,
)

SHAPES = [  # (sequence lengths, hidden)
    ([2, 3], 4),
    ([1], 8),
    ([1, 1, 1], 3),  # single-token sequences
    ([5, 1, 7, 2], 16),
    ([33], 5),
]


def _first_indices(lens: list[int]) -> list[int]:
    out, offset = [], 0
    for n in lens:
        out.append(offset)
        offset += n
    return out


def _partial_metadata():
    # One sequence: 2 of its 3 prompt tokens scheduled in this forward.
    return make_metadata([2], prompt_lens=[3], seq_lens=[2])


# ---------------------------------------------------------------- CLS


def test_cls_picks_first_token_of_each_sequence() -> None:
    hidden = torch.arange(10, dtype=torch.float32).reshape(5, 2)
    out = CLSPool()(hidden, make_metadata([2, 3]))
    assert_rows_equal(out, hidden[[0, 2]])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lens, width", SHAPES)
def test_cls_matches_reference(dtype: torch.dtype, lens: list[int], width: int) -> None:
    hidden = rand(sum(lens), width, dtype)
    out = CLSPool()(hidden, make_metadata(lens))
    assert out.dtype == dtype
    assert_rows_equal(out, torch.stack([hidden[i] for i in _first_indices(lens)]))


def test_cls_accepts_a_bare_cursor() -> None:
    hidden = rand(5, 3)
    meta = make_metadata([2, 3])
    assert torch.equal(CLSPool()(hidden, meta.cursor), CLSPool()(hidden, meta))


def test_cls_rejects_partial_prefill() -> None:
    with pytest.raises(RuntimeError, match="partial prefill"):
        CLSPool()(rand(2, 4), _partial_metadata())


def test_cls_empty_batch() -> None:
    out = CLSPool()(torch.zeros(0, 8), make_metadata([]))
    assert tuple(out.shape) == (0, 8)


# ---------------------------------------------------------------- LAST


def test_last_picks_last_token_of_each_sequence() -> None:
    hidden = torch.arange(10, dtype=torch.float32).reshape(5, 2)
    out = LastPool()(hidden, make_metadata([2, 3]))
    assert_rows_equal(out, hidden[[1, 4]])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lens, width", SHAPES)
def test_last_matches_reference(dtype: torch.dtype, lens: list[int], width: int) -> None:
    hidden = rand(sum(lens), width, dtype)
    out = LastPool()(hidden, make_metadata(lens))
    last = [f + n - 1 for f, n in zip(_first_indices(lens), lens, strict=True)]
    assert_rows_equal(out, torch.stack([hidden[i] for i in last]))


def test_last_accepts_partial_prefill_and_returns_last_scheduled_token() -> None:
    hidden = torch.tensor([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0], [4.0, 4.0], [5.0, 5.0]])
    # Sequence 0: 2 of 4 prompt tokens; sequence 1: 3 of 3.
    meta = make_metadata([2, 3], prompt_lens=[4, 3], seq_lens=[2, 3])
    out = LastPool()(hidden, meta)
    assert_rows_equal(out, hidden[[1, 4]])


def test_last_empty_batch() -> None:
    out = LastPool()(torch.zeros(0, 8), make_metadata([]))
    assert tuple(out.shape) == (0, 8)


# ---------------------------------------------------------------- MEAN


def test_mean_small_known_values() -> None:
    hidden = torch.tensor([[1.0, 2.0], [3.0, 4.0], [10.0, 20.0]])
    out = MeanPool()(hidden, make_metadata([2, 1]))
    assert out.dtype == torch.float32
    assert_matches(out, [[2.0, 3.0], [10.0, 20.0]], atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lens, width", SHAPES)
def test_mean_matches_float64_reference(dtype: torch.dtype, lens: list[int], width: int) -> None:
    hidden = rand(sum(lens), width, dtype, scale=3.0)
    out = MeanPool()(hidden, make_metadata(lens))
    # Always float32, whatever the input dtype; accumulated in float32, so it matches the float64
    # mean of the values *as stored* (bf16-rounded for bf16 input) to float32 precision.
    assert out.dtype == torch.float32
    expected = [ref_mean(seq) for seq in split_rows(to_rows(hidden), lens)]
    assert_matches(out, expected, atol=1e-5, rtol=1e-5)


def test_mean_bf16_input_is_close_to_the_unrounded_mean() -> None:
    exact = torch.randn(12, 6, dtype=torch.float64)
    out = MeanPool()(exact.to(torch.bfloat16), make_metadata([5, 7]))
    assert out.dtype == torch.float32
    expected = [ref_mean(seq) for seq in split_rows(to_rows(exact), [5, 7])]
    assert_matches(out, expected, atol=1e-2, rtol=1e-2)


def test_mean_single_token_is_identity() -> None:
    hidden = rand(3, 5)
    out = MeanPool()(hidden, make_metadata([1, 1, 1]))
    assert_matches(out, to_rows(hidden), atol=0.0)


def test_mean_of_constant_rows_is_the_constant() -> None:
    hidden = torch.full((7, 4), 0.1)
    out = MeanPool()(hidden, make_metadata([3, 4]))
    assert_matches(out, [[0.1] * 4, [0.1] * 4], atol=1e-6)


def test_mean_three_and_one() -> None:
    hidden = torch.tensor([[1.0], [2.0], [6.0], [-4.0]])
    out = MeanPool()(hidden, make_metadata([3, 1]))
    assert_matches(out, [[3.0], [-4.0]], atol=1e-6)


def test_mean_empty_batch() -> None:
    out = MeanPool()(torch.zeros(0, 8), make_metadata([]))
    assert out.dtype == torch.float32
    assert tuple(out.shape) == (0, 8)


def test_mean_rejects_partial_prefill() -> None:
    with pytest.raises(RuntimeError, match="partial prefill"):
        MeanPool()(rand(2, 4), _partial_metadata())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("chunk_bytes", [1, 4, 16, 20, 40, 44, 1024, 16 * 1024 * 1024])
def test_mean_small_chunks_give_the_same_result(dtype: torch.dtype, chunk_bytes: int) -> None:
    lens, width = [3, 1, 6, 2], 5  # one token row is 20 bytes in float32
    hidden = rand(sum(lens), width, dtype)
    meta = make_metadata(lens)
    out = MeanPool(chunk_bytes=chunk_bytes)(hidden, meta)
    expected = [ref_mean(seq) for seq in split_rows(to_rows(hidden), lens)]
    assert_matches(out, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out, MeanPool()(hidden, meta), atol=1e-6, rtol=1e-6)


def test_mean_default_chunk_is_16_mib() -> None:
    assert MeanPool().chunk_bytes == 16 * 1024 * 1024


def test_mean_upcasts_at_most_one_chunk_at_a_time() -> None:
    """The float32 copy of the hidden states never exists whole: each upcast is at most one chunk."""
    seen: list[tuple[int, ...]] = []

    class Recorder(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            out = super().__torch_function__(func, types, args, kwargs or {})
            if isinstance(out, torch.Tensor) and out.dtype == torch.float32:
                seen.append(tuple(out.shape))
            return out

    lens, width = [17, 23], 5
    chunk_tokens = 4
    hidden = rand(sum(lens), width, torch.bfloat16)
    out = MeanPool(chunk_bytes=chunk_tokens * width * 4)(hidden.as_subclass(Recorder), make_metadata(lens))
    expected = [ref_mean(seq) for seq in split_rows(to_rows(hidden), lens)]
    assert_matches(out, expected, atol=1e-5, rtol=1e-5)
    assert seen, "no float32 upcast was observed"
    assert max(shape[0] for shape in seen) <= chunk_tokens, seen
    assert sum(1 for shape in seen if shape[0] == chunk_tokens) >= sum(lens) // chunk_tokens


def test_mean_rejects_non_positive_chunk_bytes() -> None:
    with pytest.raises(ValueError):
        MeanPool(chunk_bytes=0)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lens=st.lists(st.integers(min_value=1, max_value=12), min_size=1, max_size=6),
    width=st.integers(min_value=1, max_value=16),
    chunk_bytes=st.integers(min_value=1, max_value=4096),
    bf16=st.booleans(),
    seed=st.integers(min_value=0, max_value=2**31 - 1),
)
def test_mean_property_any_chunking_equals_float64_mean(
    lens: list[int], width: int, chunk_bytes: int, bf16: bool, seed: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    dtype = torch.bfloat16 if bf16 else torch.float32
    hidden = (torch.randn(sum(lens), width, generator=gen, dtype=torch.float64) * 4).to(dtype)
    out = MeanPool(chunk_bytes=chunk_bytes)(hidden, make_metadata(lens))
    assert out.dtype == torch.float32
    expected = [ref_mean(seq) for seq in split_rows(to_rows(hidden), lens)]
    assert_matches(out, expected, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- segment_sum_float32


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("chunk_bytes", [1, 12, 1 << 24])
def test_segment_sum_float32(dtype: torch.dtype, chunk_bytes: int) -> None:
    lens = [2, 0, 3, 1, 0]  # empty segments sum to zero rows
    hidden = rand(sum(lens), 3, dtype)
    out = segment_sum_float32(hidden, torch.tensor(lens), chunk_bytes)
    assert out.dtype == torch.float32
    expected = [ref_sum(seq, 3) for seq in split_rows(to_rows(hidden), lens)]
    assert_matches(out, expected, atol=1e-5, rtol=1e-5)


def test_segment_sum_empty() -> None:
    out = segment_sum_float32(torch.zeros(0, 4), torch.zeros(0, dtype=torch.long))
    assert out.dtype == torch.float32 and tuple(out.shape) == (0, 4)
    zeros = segment_sum_float32(torch.zeros(0, 4), torch.tensor([0, 0]))
    assert_matches(zeros, [[0.0] * 4, [0.0] * 4], atol=0.0)


def test_segment_sum_ignores_rows_past_the_segments() -> None:
    hidden = torch.tensor([[1.0], [2.0], [100.0]])
    out = segment_sum_float32(hidden, torch.tensor([2]), chunk_bytes=4)
    assert_matches(out, [[3.0]], atol=0.0)


# ---------------------------------------------------------------- factories and capabilities


@pytest.mark.parametrize("name, cls", [("CLS", CLSPool), ("LAST", LastPool), ("MEAN", MeanPool)])
def test_get_seq_pooling_method(name: str, cls: type) -> None:
    method = get_seq_pooling_method(name)
    assert type(method) is cls
    assert method.get_supported_tasks() == set(POOLING_TASKS)
    assert method.requires_token_ids() is False


@pytest.mark.parametrize("name", ["ALL", "STEP", "SPLADE", ""])
def test_get_seq_pooling_method_unknown(name: str) -> None:
    with pytest.raises(NotImplementedError, match=repr(name)):
        get_seq_pooling_method(name)


@pytest.mark.parametrize("name, cls, needs_ids", [("ALL", AllPool, False), ("STEP", StepPool, True)])
def test_get_tok_pooling_method(name: str, cls: type, needs_ids: bool) -> None:
    method = get_tok_pooling_method(name)
    assert type(method) is cls
    assert method.get_supported_tasks() == {"token_embed", "token_classify"}
    assert method.requires_token_ids() is needs_ids


@pytest.mark.parametrize("name", ["MEAN", "CLS", "BOGUS"])
def test_get_tok_pooling_method_unknown(name: str) -> None:
    with pytest.raises(NotImplementedError, match=repr(name)):
        get_tok_pooling_method(name)


# ---------------------------------------------------------------- ALL


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lens, width", SHAPES)
def test_all_splits_by_sequence(dtype: torch.dtype, lens: list[int], width: int) -> None:
    hidden = rand(sum(lens), width, dtype)
    out = AllPool()(hidden, make_metadata(lens))
    assert len(out) == len(lens)
    start = 0
    for piece, n in zip(out, lens, strict=True):
        assert piece is not None
        assert_rows_equal(piece, hidden[start : start + n])
        start += n


def test_all_empty_batch() -> None:
    assert AllPool()(torch.zeros(0, 4), make_metadata([])) == []


def test_all_chunked_prefill_unfinished_yields_none_then_concatenation() -> None:
    full = rand(4, 3)
    state = PoolingState()
    pool = AllPool()

    first = pool(full[:2], make_metadata([2], prompt_lens=[4], seq_lens=[2], pooling_states=[state]))
    assert first == [None]
    assert len(state.hidden_states_cache) == 1

    second = pool(full[2:], make_metadata([2], prompt_lens=[4], seq_lens=[4], pooling_states=[state]))
    assert second[0] is not None
    assert_rows_equal(second[0], full)
    assert state.hidden_states_cache == []  # cleared once pooled


def test_all_chunked_prefill_three_slices() -> None:
    full = rand(7, 2)
    state = PoolingState()
    pool = AllPool()
    bounds = [(0, 3, 3), (3, 5, 5), (5, 7, 7)]
    outs = [
        pool(full[lo:hi], make_metadata([hi - lo], prompt_lens=[7], seq_lens=[done], pooling_states=[state]))
        for lo, hi, done in bounds
    ]
    assert outs[0] == [None] and outs[1] == [None]
    assert_rows_equal(outs[2][0], full)


def test_all_single_shot_with_state_equals_plain() -> None:
    hidden = rand(5, 3)
    states = [PoolingState(), PoolingState()]
    with_state = AllPool()(hidden, make_metadata([2, 3], pooling_states=states))
    plain = AllPool()(hidden, make_metadata([2, 3]))
    for a, b in zip(with_state, plain, strict=True):
        assert_rows_equal(a, b)
    assert all(s.hidden_states_cache == [] for s in states)


def test_all_mixed_finished_and_unfinished() -> None:
    hidden = rand(5, 3)
    states = [PoolingState(), PoolingState()]
    meta = make_metadata([3, 2], prompt_lens=[3, 6], seq_lens=[3, 2], pooling_states=states)
    out = AllPool()(hidden, meta)
    assert out[1] is None
    assert_rows_equal(out[0], hidden[:3])
    assert states[0].hidden_states_cache == []
    assert len(states[1].hidden_states_cache) == 1


def test_all_partial_prefill_needs_states() -> None:
    with pytest.raises(RuntimeError, match="pooling_states"):
        AllPool()(rand(2, 4), _partial_metadata())


# ---------------------------------------------------------------- STEP


def _ref_step(rows, ids, step_tag_id, returned_token_ids):
    """Rows whose token id is the step tag (if set), columns in returned_token_ids (if non-empty)."""
    out = []
    for row, tok in zip(rows, ids, strict=True):
        if step_tag_id is not None and tok != step_tag_id:
            continue
        out.append([row[c] for c in returned_token_ids] if returned_token_ids else list(row))
    return out


def _step_meta(params: PoolingParams, ids: list[int], **kwargs):
    return make_metadata([len(ids)], [params], token_ids=torch.tensor(ids), **kwargs)


STEP_IDS = [10, 99, 10, 20]
STEP_CASES = [
    pytest.param(10, None, [0, 2], None, id="step_tag"),
    pytest.param(None, [0, 2], [0, 1, 2, 3], [0, 2], id="returned_token_ids"),
    pytest.param(None, None, [0, 1, 2, 3], None, id="no_params"),
    pytest.param(None, [], [0, 1, 2, 3], None, id="empty_returned_ids_is_no_filter"),
    pytest.param(10, [0, 2], [0, 2], [0, 2], id="both"),
    pytest.param(99, [1], [1], [1], id="both_single"),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("step_tag_id, returned, rows, cols", STEP_CASES)
def test_step_filters(dtype, step_tag_id, returned, rows, cols) -> None:
    hidden = rand(4, 3, dtype)
    params = PoolingParams(step_tag_id=step_tag_id, returned_token_ids=returned)
    (out,) = StepPool()(hidden, _step_meta(params, STEP_IDS))
    assert out is not None
    expected = hidden[rows]
    if cols is not None:
        expected = expected[:, cols]
    assert_rows_equal(out, expected)
    assert_matches(out, _ref_step(to_rows(hidden), STEP_IDS, step_tag_id, returned), atol=0.0)


@pytest.mark.parametrize("returned, cols", [(None, 3), ([0, 2], 2)])
def test_step_no_match_is_empty_not_error(returned, cols) -> None:
    params = PoolingParams(step_tag_id=12345, returned_token_ids=returned)
    (out,) = StepPool()(rand(4, 3), _step_meta(params, STEP_IDS))
    assert out is not None
    assert tuple(out.shape) == (0, cols)


def test_step_per_sequence_params() -> None:
    hidden = rand(7, 3)
    ids = [5, 6, 5, 7, 7, 8, 7]
    params = [PoolingParams(step_tag_id=5), PoolingParams(step_tag_id=7, returned_token_ids=[2])]
    out = StepPool()(hidden, make_metadata([3, 4], params, token_ids=torch.tensor(ids)))
    rows = to_rows(hidden)
    assert_matches(out[0], _ref_step(rows[:3], ids[:3], 5, None), atol=0.0)
    assert_matches(out[1], _ref_step(rows[3:], ids[3:], 7, [2]), atol=0.0)


def test_step_needs_token_ids() -> None:
    assert StepPool().requires_token_ids() is True
    meta = make_metadata([4], [PoolingParams(step_tag_id=10)])
    with pytest.raises(ValueError, match="token ids"):
        StepPool()(rand(4, 3), meta)


def test_step_chunked_prefill() -> None:
    hidden = rand(4, 3)
    params = PoolingParams(step_tag_id=10, returned_token_ids=[0, 2])
    state = PoolingState()
    pool = StepPool()
    first = pool(
        hidden[:2], _step_meta(params, STEP_IDS[:2], prompt_lens=[4], seq_lens=[2], pooling_states=[state])
    )
    assert first == [None]
    (second,) = pool(
        hidden[2:], _step_meta(params, STEP_IDS[2:], prompt_lens=[4], seq_lens=[4], pooling_states=[state])
    )
    assert second is not None
    assert_matches(second, _ref_step(to_rows(hidden), STEP_IDS, 10, [0, 2]), atol=0.0)
    assert state.hidden_states_cache == [] and state.token_ids_cache == []
