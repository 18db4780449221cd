"""SequencePooler / TokenPooler (method + head), the pooler factories and DispatchPooler routing."""

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
    ref_mean,
    ref_normalize,
    ref_sigmoid,
    ref_softmax,
    split_rows,
    to_rows,
)
from torch import nn

from embedcli.pooling import (
    AllPool,
    ClassifierPoolerHead,
    CLSPool,
    DispatchPooler,
    EmbeddingPoolerHead,
    LastPool,
    MeanPool,
    PoolerClassify,
    PoolerConfig,
    PoolingConfigError,
    PoolingParams,
    PoolingState,
    SequencePooler,
    StepPool,
    TokenClassifierPoolerHead,
    TokenEmbeddingPoolerHead,
    TokenPooler,
    pooler_for_classify,
    pooler_for_embed,
    pooler_for_token_classify,
    pooler_for_token_embed,
)
from embedcli.pooling.heads import PoolerHead

HIDDEN = 8


class _PluginHead(PoolerHead):
    """A head for a task no pooling method serves."""

    supported_tasks = frozenset({"plugin"})

    def forward(self, pooled, metadata):  # pragma: no cover - never reached
        return pooled


def _linear(n_in: int, n_out: int) -> nn.Linear:
    layer = nn.Linear(n_in, n_out)
    nn.init.normal_(layer.weight)
    return layer


# ---------------------------------------------------------------- SequencePooler / TokenPooler


@pytest.mark.parametrize(
    "pooler, tasks",
    [
        (lambda: SequencePooler(MeanPool(), EmbeddingPoolerHead()), {"embed"}),
        (lambda: SequencePooler(CLSPool(), ClassifierPoolerHead()), {"classify"}),
        (lambda: SequencePooler(LastPool(), TokenEmbeddingPoolerHead()), {"token_embed"}),
        (lambda: TokenPooler(AllPool(), TokenEmbeddingPoolerHead()), {"token_embed"}),
        (lambda: TokenPooler(StepPool(), TokenClassifierPoolerHead()), {"token_classify"}),
    ],
)
def test_pooler_supported_tasks_are_the_intersection(pooler, tasks) -> None:
    assert pooler().get_supported_tasks() == tasks


@pytest.mark.parametrize(
    "build",
    [
        lambda: TokenPooler(AllPool(), EmbeddingPoolerHead()),
        lambda: TokenPooler(StepPool(), ClassifierPoolerHead()),
        lambda: SequencePooler(MeanPool(), _PluginHead()),
    ],
)
def test_pooler_construction_fails_without_a_common_task(build) -> None:
    with pytest.raises(PoolingConfigError, match="no common task"):
        build()


def test_pooler_requires_token_ids_follows_the_method() -> None:
    assert TokenPooler(StepPool(), TokenEmbeddingPoolerHead()).requires_token_ids() is True
    assert TokenPooler(AllPool(), TokenEmbeddingPoolerHead()).requires_token_ids() is False
    assert SequencePooler(MeanPool(), EmbeddingPoolerHead()).requires_token_ids() is False


@pytest.mark.parametrize("dtype", DTYPES)
def test_sequence_pooler_mean_then_normalize(dtype: torch.dtype) -> None:
    lens = [3, 1, 4]
    hidden = rand(sum(lens), HIDDEN, dtype, scale=2.0)
    pooler = SequencePooler(MeanPool(), EmbeddingPoolerHead())
    out = pooler(hidden, make_metadata(lens, _params(len(lens), use_activation=True)))
    expected = [ref_normalize(ref_mean(seq)) for seq in split_rows(to_rows(hidden), lens)]
    assert out.dtype == torch.float32  # MEAN always yields float32
    assert_matches(out, expected, atol=1e-5, rtol=1e-5)


def test_token_pooler_all_then_token_head() -> None:
    lens = [2, 3]
    hidden = rand(5, HIDDEN)
    pooler = TokenPooler(AllPool(), TokenEmbeddingPoolerHead())
    out = pooler(hidden, make_metadata(lens, _params(2, use_activation=True)))
    for o, seq in zip(out, split_rows(to_rows(hidden), lens), strict=True):
        assert_matches(o, [ref_normalize(r) for r in seq], atol=1e-6)


def _params(n: int, **kwargs) -> list[PoolingParams]:
    return [PoolingParams(**kwargs) for _ in range(n)]


# ---------------------------------------------------------------- factories


@pytest.mark.parametrize(
    "config, cls",
    [
        (PoolerConfig(), MeanPool),
        (PoolerConfig(pooling_type="CLS"), CLSPool),
        (PoolerConfig(seq_pooling_type="LAST"), LastPool),
    ],
)
def test_pooler_for_embed(config: PoolerConfig, cls: type) -> None:
    pooler = pooler_for_embed(config)
    assert type(pooler.method) is cls
    assert pooler.get_supported_tasks() == {"embed"}


def test_pooler_for_embed_with_projector_end_to_end() -> None:
    lens = [2, 3]
    hidden = rand(5, HIDDEN)
    proj = _linear(HIDDEN, 4)
    pooler = pooler_for_embed(PoolerConfig(), projector=proj)
    out = pooler(hidden, make_metadata(lens, _params(2, use_activation=True)))
    means = [ref_mean(seq) for seq in split_rows(to_rows(hidden), lens)]
    expected = [ref_normalize(r) for r in ref_linear(means, proj.weight, proj.bias)]
    assert_matches(out, expected, atol=1e-5, rtol=1e-5)


def test_pooler_for_classify_uses_config_calibration() -> None:
    clf = _linear(HIDDEN, 3)
    pooler = pooler_for_classify(PoolerConfig(logit_mean=1.0, logit_sigma=2.0), clf, num_labels=3)
    assert type(pooler.method) is CLSPool  # default
    head = pooler.head
    assert isinstance(head, ClassifierPoolerHead)
    assert (head.logit_mean, head.logit_sigma) == (1.0, 2.0)
    assert isinstance(head.activation, PoolerClassify) and head.activation.num_labels == 3

    lens = [2, 3]
    hidden = rand(5, HIDDEN)
    out = pooler(hidden, make_metadata(lens, _params(2, use_activation=True)))
    rows = to_rows(hidden)
    logits = ref_linear([rows[0], rows[2]], clf.weight, clf.bias)
    assert_matches(out, [ref_softmax(ref_calibrate(r, 1.0, 2.0)) for r in logits], atol=1e-5)


def test_pooler_for_classify_explicit_pooling_type() -> None:
    assert type(pooler_for_classify(PoolerConfig(pooling_type="MEAN"), None).method) is MeanPool
    assert type(pooler_for_classify(PoolerConfig(), None, default_pooling_type="LAST").method) is LastPool


@pytest.mark.parametrize("factory", [pooler_for_token_embed, lambda c: pooler_for_token_classify(c, None)])
def test_token_pooler_factories(factory) -> None:
    plain = factory(PoolerConfig())
    assert type(plain.method) is AllPool and plain.requires_token_ids() is False
    step = factory(PoolerConfig(pooling_type="STEP"))
    assert type(step.method) is StepPool and step.requires_token_ids() is True


def test_pooler_for_token_classify_is_dynamic() -> None:
    pooler = pooler_for_token_classify(PoolerConfig(), _linear(HIDDEN, 1))
    assert isinstance(pooler.head.activation, PoolerClassify)
    assert pooler.head.activation.num_labels is None
    hidden = rand(3, HIDDEN)
    (out,) = pooler(hidden, make_metadata([3], _params(1, use_activation=True)))
    clf = pooler.head.classifier
    assert_matches(
        out, [ref_sigmoid(r) for r in ref_linear(to_rows(hidden), clf.weight, clf.bias)], atol=1e-5
    )


# ---------------------------------------------------------------- DispatchPooler


@pytest.fixture
def dispatch():
    """embed → MEAN + normalize; classify → CLS + float32 linear 8→3 + softmax; token_embed → ALL + row normalize."""
    clf = _linear(HIDDEN, 3)
    pooler = DispatchPooler(
        {
            "embed": SequencePooler(MeanPool(), EmbeddingPoolerHead()),
            "classify": SequencePooler(
                CLSPool(),
                ClassifierPoolerHead(classifier=clf, activation=PoolerClassify(3), head_dtype=torch.float32),
            ),
            "token_embed": TokenPooler(AllPool(), TokenEmbeddingPoolerHead()),
        }
    )
    return pooler, clf


def _expected(task: str, seq: list[list[float]], clf: nn.Linear, params: PoolingParams):
    """The reference output of one sequence for `task`, built from float64 loops."""
    if task == "embed":
        vec = ref_mean(seq)
        if params.dimensions is not None:
            vec = vec[: params.dimensions]
        return ref_normalize(vec) if params.use_activation else vec
    if task == "classify":
        (logits,) = ref_linear([seq[0]], clf.weight, clf.bias)
        return ref_softmax(logits) if params.use_activation else logits
    if task == "token_embed":
        return [ref_normalize(r) for r in seq]
    raise AssertionError(task)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "tasks, lens",
    [
        (["embed", "classify", "embed", "token_embed"], [3, 2, 4, 3]),
        (["token_embed", "embed", "embed", "classify", "classify", "token_embed"], [2, 1, 5, 3, 1, 4]),
        (["classify", "embed"], [1, 1]),
        (["embed", "token_embed", "embed"], [1, 6, 2]),
    ],
)
def test_dispatch_routes_mixed_tasks_in_batch_order(dispatch, dtype, tasks, lens) -> None:
    pooler, clf = dispatch
    hidden = rand(sum(lens), HIDDEN, dtype, scale=2.0)
    params = [PoolingParams(task=t, use_activation=True) for t in tasks]
    out = pooler(hidden, make_metadata(lens, params))
    assert isinstance(out, list) and len(out) == len(tasks)
    # MEAN and the float32 classifier head yield float32 (tight tolerance); ALL keeps the input dtype.
    for o, task, seq, p in zip(out, tasks, split_rows(to_rows(hidden), lens), params, strict=True):
        tol = TOL[dtype] if task == "token_embed" else TOL[torch.float32]
        assert_matches(o, _expected(task, seq, clf, p), **tol)


def test_dispatch_single_task_batch(dispatch) -> None:
    pooler, clf = dispatch
    lens = [2, 3, 1]
    hidden = rand(6, HIDDEN)
    params = PoolingParams(task="embed", use_activation=True)
    out = pooler(hidden, make_metadata(lens, [params] * len(lens)))
    assert isinstance(out, torch.Tensor) and tuple(out.shape) == (3, HIDDEN)
    assert_matches(
        out, [_expected("embed", s, clf, params) for s in split_rows(to_rows(hidden), lens)], atol=1e-5
    )


def test_dispatch_mixed_per_request_params(dispatch) -> None:
    pooler, clf = dispatch
    lens = [2, 3, 2, 1]
    hidden = rand(sum(lens), HIDDEN)
    params = [
        PoolingParams(task="embed", dimensions=4, use_activation=True),
        PoolingParams(task="embed", use_activation=False),
        PoolingParams(task="classify", use_activation=False),
        PoolingParams(task="embed", dimensions=2, use_activation=True),
    ]
    out = pooler(hidden, make_metadata(lens, params))
    for o, seq, p in zip(out, split_rows(to_rows(hidden), lens), params, strict=True):
        assert_matches(o, _expected(p.task, seq, clf, p), atol=1e-5)


def test_dispatch_chunked_prefill_mixed_with_finished_embed(dispatch) -> None:
    pooler, clf = dispatch
    states = [PoolingState(), PoolingState()]
    token_seq = rand(4, HIDDEN)
    embed_seq = rand(3, HIDDEN)
    params = [
        PoolingParams(task="embed", use_activation=True),
        PoolingParams(task="token_embed", use_activation=True),
    ]

    # Forward 1: the embed request whole, the token_embed request's first 2 of 4 tokens.
    meta = make_metadata([3, 2], params, prompt_lens=[3, 4], seq_lens=[3, 2], pooling_states=states)
    out = pooler(torch.cat([embed_seq, token_seq[:2]]), meta)
    assert_matches(out[0], _expected("embed", to_rows(embed_seq), clf, params[0]), atol=1e-5)
    assert out[1] is None

    # Forward 2: the rest of the token_embed request.
    meta2 = make_metadata([2], [params[1]], prompt_lens=[4], seq_lens=[4], pooling_states=[states[1]])
    (done,) = pooler(token_seq[2:], meta2)
    assert_matches(done, _expected("token_embed", to_rows(token_seq), clf, params[1]), atol=1e-6)


def test_dispatch_slices_token_ids_for_step_pooling() -> None:
    pooler = DispatchPooler(
        {
            "embed": SequencePooler(MeanPool(), EmbeddingPoolerHead()),
            "token_classify": TokenPooler(StepPool(), TokenClassifierPoolerHead()),
        }
    )
    assert pooler.requires_token_ids() is True
    lens = [3, 4]
    hidden = rand(7, HIDDEN)
    token_ids = torch.tensor([10, 10, 10, 10, 99, 10, 20])
    params = [
        PoolingParams(task="embed", use_activation=False),
        PoolingParams(task="token_classify", step_tag_id=10, use_activation=False),
    ]
    out = pooler(hidden, make_metadata(lens, params, token_ids=token_ids))
    rows = to_rows(hidden)
    assert_matches(out[0], ref_mean(rows[:3]), atol=1e-6)
    assert_matches(out[1], [rows[3], rows[5]], atol=0.0)  # token ids of sequence 1 only


def test_dispatch_empty_batch(dispatch) -> None:
    pooler, _ = dispatch
    assert pooler(torch.zeros(0, HIDDEN), make_metadata([])) == []


def test_dispatch_supported_tasks(dispatch) -> None:
    pooler, _ = dispatch
    assert pooler.get_supported_tasks() == {"embed", "classify", "token_embed"}
    assert pooler.requires_token_ids() is False


@pytest.mark.parametrize(
    "task, build",
    [
        ("classify", lambda: SequencePooler(MeanPool(), EmbeddingPoolerHead())),
        ("embed", lambda: SequencePooler(CLSPool(), ClassifierPoolerHead())),
        ("token_classify", lambda: TokenPooler(AllPool(), TokenEmbeddingPoolerHead())),
    ],
)
def test_dispatch_rejects_pooler_registered_for_unsupported_task(task, build) -> None:
    with pytest.raises(PoolingConfigError, match=repr(task)):
        DispatchPooler({task: build()})


@pytest.mark.parametrize("task", ["score", "encode", "plugin", "nonsense"])
def test_dispatch_rejects_non_pooling_task_keys(task) -> None:
    with pytest.raises(ValueError):
        DispatchPooler({task: SequencePooler(MeanPool(), EmbeddingPoolerHead())})


@pytest.mark.parametrize(
    "tasks",
    [
        ["token_classify"],  # whole batch, task not registered
        ["embed", "token_classify"],  # mixed batch
        ["embed", None],  # params never verified
        [None],
    ],
)
def test_dispatch_unknown_task_in_batch(dispatch, tasks) -> None:
    pooler, _ = dispatch
    params = [PoolingParams(task=t) for t in tasks]
    with pytest.raises(ValueError, match="Unsupported task"):
        pooler(rand(len(tasks), HIDDEN), make_metadata([1] * len(tasks), params))
