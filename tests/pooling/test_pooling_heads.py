"""Embedding / classifier / token heads (vLLM `test_pooler_heads.py`: hidden 16, batch 3)."""

from __future__ import annotations

import pytest
import torch
from pooling_reference import (
    DTYPES,
    TOL,
    assert_matches,
    make_metadata,
    rand,
    ref_calibrate,
    ref_linear,
    ref_norm,
    ref_normalize,
    ref_sigmoid,
    ref_softmax,
    to_rows,
    to_vec,
)
from torch import nn

from embedcli.pooling import (
    ClassifierPoolerHead,
    EmbeddingPoolerHead,
    PoolerClassify,
    PoolerMultiLabelClassify,
    PoolingConfigError,
    PoolingParams,
    TokenClassifierPoolerHead,
    TokenEmbeddingPoolerHead,
)

HIDDEN = 16
BATCH = 3


def _meta(params: list[PoolingParams]):
    return make_metadata([1] * len(params), params)


def _params(n: int = BATCH, **kwargs) -> list[PoolingParams]:
    return [PoolingParams(**kwargs) for _ in range(n)]


def _linear(n_in: int, n_out: int, bias: bool = True) -> nn.Linear:
    layer = nn.Linear(n_in, n_out, bias=bias)
    nn.init.normal_(layer.weight)
    return layer


def _assert_list_of(out, expected_rows: list, **tol) -> None:
    assert isinstance(out, list) and len(out) == len(expected_rows)
    for o, e in zip(out, expected_rows, strict=True):
        assert_matches(o, e, **tol)


# ================================================================ EmbeddingPoolerHead


def test_embedding_head_supports_embed_only() -> None:
    assert EmbeddingPoolerHead().get_supported_tasks() == {"embed"}


@pytest.mark.parametrize("dtype", DTYPES)
def test_embedding_head_pass_through(dtype: torch.dtype) -> None:
    x = rand(BATCH, HIDDEN, dtype)
    out = EmbeddingPoolerHead()(x, _meta(_params(use_activation=False)))
    assert out.dtype == dtype
    assert torch.equal(out, x)


def test_embedding_head_stacks_a_list() -> None:
    rows = [rand(1, HIDDEN)[0] for _ in range(BATCH)]
    out = EmbeddingPoolerHead()(rows, _meta(_params(use_activation=False)))
    assert isinstance(out, torch.Tensor)
    assert_matches(out, [to_vec(r) for r in rows], atol=0.0)


@pytest.mark.parametrize(
    "in_dtype, head_dtype",
    [(torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16), (torch.float32, torch.float16)],
)
def test_embedding_head_dtype(in_dtype: torch.dtype, head_dtype: torch.dtype) -> None:
    x = rand(BATCH, HIDDEN, in_dtype)
    out = EmbeddingPoolerHead(head_dtype=head_dtype)(x, _meta(_params(use_activation=False)))
    assert out.dtype == head_dtype
    assert_matches(out, to_rows(x), **TOL[head_dtype])


def test_embedding_head_projector() -> None:
    x = rand(BATCH, HIDDEN)
    proj = _linear(HIDDEN, 8)
    out = EmbeddingPoolerHead(projector=proj)(x, _meta(_params(use_activation=False)))
    assert_matches(out, ref_linear(to_rows(x), proj.weight, proj.bias), atol=1e-4, rtol=1e-5)


def test_embedding_head_cast_happens_before_projector() -> None:
    # A float32 projector would fail on bf16 input unless the head casts first.
    x = rand(BATCH, HIDDEN, torch.bfloat16)
    proj = _linear(HIDDEN, 4)
    out = EmbeddingPoolerHead(projector=proj, head_dtype=torch.float32)(
        x, _meta(_params(use_activation=False))
    )
    assert out.dtype == torch.float32
    assert_matches(out, ref_linear(to_rows(x), proj.weight, proj.bias), atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("dims", [1, 4, HIDDEN, HIDDEN + 5])
def test_embedding_head_uniform_dimensions(dims: int) -> None:
    x = rand(BATCH, HIDDEN)
    out = EmbeddingPoolerHead()(x, _meta(_params(dimensions=dims, use_activation=False)))
    assert isinstance(out, torch.Tensor)
    assert_matches(out, [r[:dims] for r in to_rows(x)], atol=0.0)


def test_embedding_head_mixed_dimensions() -> None:
    x = rand(BATCH, HIDDEN)
    params = [
        PoolingParams(dimensions=4, use_activation=False),
        PoolingParams(dimensions=8, use_activation=False),
        PoolingParams(dimensions=4, use_activation=False),
    ]
    out = EmbeddingPoolerHead()(x, _meta(params))
    rows = to_rows(x)
    _assert_list_of(out, [rows[0][:4], rows[1][:8], rows[2][:4]], atol=0.0)


def test_embedding_head_dimensions_with_none_rows_untouched() -> None:
    x = rand(BATCH, HIDDEN)
    params = [
        PoolingParams(dimensions=4, use_activation=False),
        PoolingParams(dimensions=None, use_activation=False),
        PoolingParams(dimensions=None, use_activation=False),
    ]
    out = EmbeddingPoolerHead()(x, _meta(params))
    rows = to_rows(x)
    _assert_list_of(out, [rows[0][:4], rows[1], rows[2]], atol=0.0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_embedding_head_normalize_on(dtype: torch.dtype) -> None:
    x = rand(BATCH, HIDDEN, dtype, scale=4.0)
    out = EmbeddingPoolerHead()(x, _meta(_params(use_activation=True)))
    assert isinstance(out, torch.Tensor)
    assert_matches(out, [ref_normalize(r) for r in to_rows(x)], **TOL[dtype])


def test_embedding_head_normalize_off() -> None:
    x = rand(BATCH, HIDDEN, scale=4.0)
    out = EmbeddingPoolerHead()(x, _meta(_params(use_activation=False)))
    assert_matches(out, to_rows(x), atol=0.0)


@pytest.mark.parametrize("flags", [[True, False, True], [False, True, False], [False, False, True]])
def test_embedding_head_normalize_mixed_per_row(flags: list[bool]) -> None:
    x = rand(BATCH, HIDDEN, scale=4.0)
    out = EmbeddingPoolerHead()(x, _meta([PoolingParams(use_activation=f) for f in flags]))
    rows = to_rows(x)
    _assert_list_of(out, [ref_normalize(r) if f else r for r, f in zip(rows, flags, strict=True)], atol=1e-6)


def test_embedding_head_zero_vector_is_not_nan() -> None:
    x = torch.zeros(2, HIDDEN)
    out = EmbeddingPoolerHead()(x, _meta(_params(2, use_activation=True)))
    assert_matches(out, [[0.0] * HIDDEN] * 2, atol=0.0)


def test_embedding_head_projector_then_slice() -> None:
    x = rand(BATCH, HIDDEN)
    proj = _linear(HIDDEN, 8)
    out = EmbeddingPoolerHead(projector=proj)(x, _meta(_params(dimensions=4, use_activation=False)))
    projected = ref_linear(to_rows(x), proj.weight, proj.bias)
    assert_matches(out, [r[:4] for r in projected], atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_embedding_head_slice_then_normalize_gives_unit_norm(dtype: torch.dtype) -> None:
    x = rand(BATCH, HIDDEN, dtype, scale=4.0)
    out = EmbeddingPoolerHead()(x, _meta(_params(dimensions=4, use_activation=True)))
    assert tuple(out.shape) == (BATCH, 4)
    assert_matches(out, [ref_normalize(r[:4]) for r in to_rows(x)], **TOL[dtype])
    for row in to_rows(out):
        assert abs(ref_norm(row) - 1.0) < 2 * TOL[dtype]["atol"]


def test_embedding_head_mixed_dimensions_and_flags() -> None:
    x = rand(BATCH, HIDDEN, scale=4.0)
    params = [
        PoolingParams(dimensions=4, use_activation=True),
        PoolingParams(dimensions=None, use_activation=False),
        PoolingParams(dimensions=8, use_activation=True),
    ]
    out = EmbeddingPoolerHead()(x, _meta(params))
    rows = to_rows(x)
    _assert_list_of(out, [ref_normalize(rows[0][:4]), rows[1], ref_normalize(rows[2][:8])], atol=1e-6)


def test_embedding_head_empty_batch() -> None:
    out = EmbeddingPoolerHead()(torch.zeros(0, HIDDEN), _meta([]))
    assert isinstance(out, torch.Tensor) and tuple(out.shape) == (0, HIDDEN)
    assert EmbeddingPoolerHead()([], _meta([])) == []


# ================================================================ ClassifierPoolerHead


def test_classifier_head_supports_classify_only() -> None:
    assert ClassifierPoolerHead().get_supported_tasks() == {"classify"}


def test_classifier_head_pass_through() -> None:
    x = rand(BATCH, HIDDEN)
    out = ClassifierPoolerHead()(x, _meta(_params(use_activation=True)))
    assert torch.equal(out, x)


def test_classifier_head_stacks_a_list() -> None:
    rows = [rand(1, 3)[0] for _ in range(BATCH)]
    out = ClassifierPoolerHead()(rows, _meta(_params(use_activation=False)))
    assert_matches(out, [to_vec(r) for r in rows], atol=0.0)


def test_classifier_head_dtype() -> None:
    x = rand(BATCH, HIDDEN, torch.bfloat16)
    out = ClassifierPoolerHead(head_dtype=torch.float32)(x, _meta(_params()))
    assert out.dtype == torch.float32
    assert_matches(out, to_rows(x), atol=0.0)


def test_classifier_head_classifier() -> None:
    x = rand(BATCH, HIDDEN)
    clf = _linear(HIDDEN, 3)
    out = ClassifierPoolerHead(classifier=clf)(x, _meta(_params(use_activation=False)))
    assert_matches(out, ref_linear(to_rows(x), clf.weight, clf.bias), atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize(
    "mean, sigma",
    [(2.0, None), (None, 0.5), (1.0, 2.0), (-3.0, -0.25), (0.0, 1.0)],
)
def test_classifier_head_calibration(mean: float | None, sigma: float | None) -> None:
    x = rand(BATCH, HIDDEN, scale=3.0)
    out = ClassifierPoolerHead(logit_mean=mean, logit_sigma=sigma)(x, _meta(_params(use_activation=False)))
    assert_matches(out, [ref_calibrate(r, mean, sigma) for r in to_rows(x)], atol=1e-5, rtol=1e-6)


def test_classifier_head_both_is_minus_mean_then_divide_by_sigma() -> None:
    x = torch.tensor([[3.0, 5.0, -1.0]])
    out = ClassifierPoolerHead(logit_mean=1.0, logit_sigma=2.0)(x, _meta(_params(1, use_activation=False)))
    assert_matches(out, [[1.0, 2.0, -1.0]], atol=0.0)


@pytest.mark.parametrize("sigma", [0, 0.0, -0.0])
def test_classifier_head_rejects_sigma_zero(sigma: float) -> None:
    with pytest.raises(PoolingConfigError, match="logit_sigma"):
        ClassifierPoolerHead(logit_sigma=sigma)


def test_classifier_head_classifier_then_calibration_then_activation() -> None:
    x = rand(BATCH, HIDDEN)
    clf = _linear(HIDDEN, 3)
    head = ClassifierPoolerHead(classifier=clf, activation=PoolerClassify(3), logit_mean=0.5, logit_sigma=2.0)
    out = head(x, _meta(_params(use_activation=True)))
    logits = ref_linear(to_rows(x), clf.weight, clf.bias)
    assert_matches(out, [ref_softmax(ref_calibrate(r, 0.5, 2.0)) for r in logits], atol=1e-5)


@pytest.mark.parametrize("num_labels", [None, 0, 1, 2, 5])
@pytest.mark.parametrize("dtype", DTYPES)
def test_classifier_head_activation_uniform(num_labels: int | None, dtype: torch.dtype) -> None:
    cols = num_labels or 1
    x = rand(BATCH, cols, dtype, scale=2.0)
    head = ClassifierPoolerHead(activation=PoolerClassify(num_labels))
    out_on = head(x, _meta(_params(use_activation=True)))
    ref = ref_sigmoid if cols < 2 else ref_softmax
    assert isinstance(out_on, torch.Tensor)
    assert_matches(out_on, [ref(r) for r in to_rows(x)], **TOL[dtype])
    out_off = head(x, _meta(_params(use_activation=False)))
    assert torch.equal(out_off, x)


def test_classifier_head_activation_mixed() -> None:
    x = rand(BATCH, 4, scale=2.0)
    flags = [True, False, True]
    head = ClassifierPoolerHead(activation=PoolerMultiLabelClassify(), logit_mean=1.0)
    out = head(x, _meta([PoolingParams(use_activation=f) for f in flags]))
    rows = [ref_calibrate(r, 1.0, None) for r in to_rows(x)]
    _assert_list_of(out, [ref_sigmoid(r) if f else r for r, f in zip(rows, flags, strict=True)], atol=1e-6)


def test_classifier_head_empty_batch() -> None:
    head = ClassifierPoolerHead(classifier=_linear(HIDDEN, 3), activation=PoolerClassify(3))
    out = head(torch.zeros(0, HIDDEN), _meta([]))
    assert tuple(out.shape) == (0, 3)
    assert head([], _meta([])) == []


# ================================================================ token heads


def test_token_heads_supported_tasks() -> None:
    assert TokenEmbeddingPoolerHead().get_supported_tasks() == {"token_embed"}
    assert TokenClassifierPoolerHead().get_supported_tasks() == {"token_classify"}


@pytest.mark.parametrize(
    "head", [TokenEmbeddingPoolerHead(), TokenClassifierPoolerHead(activation=PoolerClassify())]
)
def test_token_heads_none_passes_through(head) -> None:
    assert head([None], _meta(_params(1, use_activation=True))) == [None]
    assert head([], _meta([])) == []


def test_token_embed_head_pass_through_and_dtype() -> None:
    x = rand(5, HIDDEN, torch.bfloat16)
    (same,) = TokenEmbeddingPoolerHead()([x], _meta(_params(1, use_activation=False)))
    assert torch.equal(same, x)
    (cast,) = TokenEmbeddingPoolerHead(head_dtype=torch.float32)([x], _meta(_params(1, use_activation=False)))
    assert cast.dtype == torch.float32
    assert_matches(cast, to_rows(x), atol=0.0)


def test_token_embed_head_projector() -> None:
    x = rand(5, HIDDEN)
    proj = _linear(HIDDEN, 8)
    (out,) = TokenEmbeddingPoolerHead(projector=proj)([x], _meta(_params(1, use_activation=False)))
    assert_matches(out, ref_linear(to_rows(x), proj.weight, proj.bias), atol=1e-4, rtol=1e-5)


def test_token_embed_head_slice() -> None:
    x = rand(5, HIDDEN)
    (out,) = TokenEmbeddingPoolerHead()([x], _meta(_params(1, dimensions=4, use_activation=False)))
    assert tuple(out.shape) == (5, 4)
    assert_matches(out, [r[:4] for r in to_rows(x)], atol=0.0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dims", [None, 4])
def test_token_embed_head_normalizes_each_row(dtype: torch.dtype, dims: int | None) -> None:
    x = rand(5, HIDDEN, dtype, scale=3.0)
    x[2] = 0  # a zero row stays zero
    (out,) = TokenEmbeddingPoolerHead()([x], _meta(_params(1, dimensions=dims, use_activation=True)))
    assert_matches(out, [ref_normalize(r[:dims] if dims else r) for r in to_rows(x)], **TOL[dtype])


def test_token_embed_head_mixed_batch() -> None:
    a, c = rand(3, HIDDEN), rand(2, HIDDEN)
    params = [
        PoolingParams(use_activation=True),
        PoolingParams(use_activation=True),
        PoolingParams(use_activation=False, dimensions=4),
    ]
    out = TokenEmbeddingPoolerHead()([a, None, c], _meta(params))
    assert out[1] is None
    assert_matches(out[0], [ref_normalize(r) for r in to_rows(a)], atol=1e-6)
    assert_matches(out[2], [r[:4] for r in to_rows(c)], atol=0.0)


def test_token_classify_head_classifier_calibration_activation() -> None:
    x = rand(5, HIDDEN)
    clf = _linear(HIDDEN, 3)
    head = TokenClassifierPoolerHead(
        classifier=clf, activation=PoolerClassify(), logit_mean=0.5, logit_sigma=0.25
    )
    logits = [ref_calibrate(r, 0.5, 0.25) for r in ref_linear(to_rows(x), clf.weight, clf.bias)]
    (on,) = head([x], _meta(_params(1, use_activation=True)))
    assert_matches(on, [ref_softmax(r) for r in logits], atol=1e-5)
    (off,) = head([x], _meta(_params(1, use_activation=False)))
    assert_matches(off, logits, atol=1e-4, rtol=1e-5)


def test_token_classify_head_without_activation_returns_calibrated_logits() -> None:
    x = rand(4, 3)
    (out,) = TokenClassifierPoolerHead(logit_mean=2.0)([x], _meta(_params(1, use_activation=True)))
    assert_matches(out, [ref_calibrate(r, 2.0, None) for r in to_rows(x)], atol=1e-6)


def test_token_classify_head_dtype() -> None:
    x = rand(4, 3, torch.bfloat16)
    (out,) = TokenClassifierPoolerHead(head_dtype=torch.float32)([x], _meta(_params(1, use_activation=False)))
    assert out.dtype == torch.float32


def test_token_classify_head_mixed_batch() -> None:
    a, c = rand(3, 1), rand(2, 4)
    head = TokenClassifierPoolerHead(activation=PoolerClassify())
    params = [
        PoolingParams(use_activation=True),
        PoolingParams(use_activation=True),
        PoolingParams(use_activation=True),
    ]
    out = head([a, None, c], _meta(params))
    assert out[1] is None
    assert_matches(out[0], [ref_sigmoid(r) for r in to_rows(a)], atol=1e-6)  # dynamic: 1 label → sigmoid
    assert_matches(out[2], [ref_softmax(r) for r in to_rows(c)], atol=1e-6)


def test_token_classify_head_rejects_sigma_zero() -> None:
    with pytest.raises(PoolingConfigError, match="logit_sigma"):
        TokenClassifierPoolerHead(logit_sigma=0.0)
