"""Tasks, PoolerConfig and PoolingParams.verify (vLLM `config/pooler.py`, `pooling_params.py`)."""

from __future__ import annotations

import dataclasses

import pytest

from embedcli.pooling import (
    POOLING_TASKS,
    EmbeddingShape,
    PoolerConfig,
    PoolingConfigError,
    PoolingParams,
)
from embedcli.pooling.params import check_task

EMBED_TASKS = ["embed", "token_embed"]
CLASSIFY_TASKS = ["classify", "token_classify"]
TOKEN_TASKS = ["token_embed", "token_classify"]


# ---------------------------------------------------------------- tasks


def test_pooling_tasks() -> None:
    assert set(POOLING_TASKS) == {"embed", "classify", "token_embed", "token_classify", "sparse_embed", "hybrid_embed"}


@pytest.mark.parametrize("task", list(POOLING_TASKS))
def test_check_task_accepts_pooling_tasks(task: str) -> None:
    assert check_task(task) == task


@pytest.mark.parametrize(
    "task, pointers",
    [("score", ["classify"]), ("encode", ["token_embed", "token_classify"])],
)
def test_check_task_removed_tasks_point_to_replacements(task: str, pointers: list[str]) -> None:
    with pytest.raises(PoolingConfigError, match="removed") as info:
        check_task(task)
    for name in pointers:
        assert name in str(info.value)


@pytest.mark.parametrize("task", ["generate", "Embed", "", "plugin"])
def test_check_task_unknown(task: str) -> None:
    with pytest.raises(ValueError, match="Unsupported task"):
        check_task(task)


# ---------------------------------------------------------------- PoolerConfig


@pytest.mark.parametrize("name", ["CLS", "LAST", "MEAN", "mean", "Cls"])
def test_pooler_config_pooling_type_maps_to_seq(name: str) -> None:
    config = PoolerConfig(pooling_type=name)
    assert config.seq_pooling_type == name.upper()
    assert config.tok_pooling_type is None
    assert config.pooling_type is None


@pytest.mark.parametrize("name", ["ALL", "STEP", "step"])
def test_pooler_config_pooling_type_maps_to_tok(name: str) -> None:
    config = PoolerConfig(pooling_type=name)
    assert config.tok_pooling_type == name.upper()
    assert config.seq_pooling_type is None


@pytest.mark.parametrize("other", [{"seq_pooling_type": "CLS"}, {"tok_pooling_type": "ALL"}])
def test_pooler_config_pooling_type_with_explicit_field_is_an_error(other: dict) -> None:
    with pytest.raises(PoolingConfigError):
        PoolerConfig(pooling_type="MEAN", **other)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"pooling_type": "SPLADE"}, "SPLADE"),
        ({"seq_pooling_type": "MAX+ALL"}, "MAX"),
        ({"seq_pooling_type": "ALL"}, "ALL"),
        ({"tok_pooling_type": "MEAN"}, "MEAN"),
    ],
)
def test_pooler_config_unknown_pooling_type(kwargs: dict, name: str) -> None:
    with pytest.raises(NotImplementedError, match=name):
        PoolerConfig(**kwargs)


@pytest.mark.parametrize("sigma", [0, 0.0, -0.0])
def test_pooler_config_rejects_logit_sigma_zero(sigma: float) -> None:
    with pytest.raises(PoolingConfigError, match="logit_sigma"):
        PoolerConfig(logit_sigma=sigma)


def test_pooler_config_accepts_calibration() -> None:
    config = PoolerConfig(logit_mean=1.5, logit_sigma=-2.0)
    assert (config.logit_mean, config.logit_sigma) == (1.5, -2.0)


@pytest.mark.parametrize("dims", [0, -1])
def test_pooler_config_rejects_non_positive_dimensions(dims: int) -> None:
    with pytest.raises(PoolingConfigError):
        PoolerConfig(dimensions=dims)


def test_pooler_config_returned_token_ids_become_a_tuple() -> None:
    config = PoolerConfig(returned_token_ids=[3, 1])  # type: ignore[arg-type]
    assert config.returned_token_ids == (3, 1)
    hash(config)  # frozen and hashable


@pytest.mark.parametrize("task", ["score", "encode", "bogus"])
def test_pooler_config_rejects_bad_task(task: str) -> None:
    with pytest.raises(ValueError):
        PoolerConfig(task=task)  # type: ignore[arg-type]


def test_pooler_config_replace_keeps_the_resolved_type() -> None:
    config = dataclasses.replace(PoolerConfig(pooling_type="CLS"), use_activation=False)
    assert config.seq_pooling_type == "CLS" and config.use_activation is False


# ---------------------------------------------------------------- PoolingParams.verify: defaults


@pytest.mark.parametrize("task", list(POOLING_TASKS))
def test_verify_use_activation_defaults_true(task: str) -> None:
    params = PoolingParams().verify(task)
    assert params.task == task
    assert params.use_activation is True
    assert params.dimensions is None


def test_verify_returns_self() -> None:
    params = PoolingParams()
    assert params.verify("embed") is params


@pytest.mark.parametrize("task", EMBED_TASKS)
def test_verify_merges_config_defaults(task: str) -> None:
    params = PoolingParams().verify(task, PoolerConfig(use_activation=False, dimensions=4))
    assert params.use_activation is False
    assert params.dimensions == 4


@pytest.mark.parametrize("task", EMBED_TASKS)
def test_verify_request_wins_over_config(task: str) -> None:
    params = PoolingParams(use_activation=True, dimensions=8).verify(
        task, PoolerConfig(use_activation=False, dimensions=4)
    )
    assert params.use_activation is True
    assert params.dimensions == 8


@pytest.mark.parametrize("task", CLASSIFY_TASKS)
def test_verify_classify_takes_use_activation_but_not_config_dimensions(task: str) -> None:
    params = PoolingParams().verify(task, PoolerConfig(use_activation=False, dimensions=4))
    assert params.use_activation is False
    assert params.dimensions is None


@pytest.mark.parametrize("task", CLASSIFY_TASKS)
def test_verify_rejects_dimensions_on_classify(task: str) -> None:
    with pytest.raises(PoolingConfigError, match="dimensions"):
        PoolingParams(dimensions=4).verify(task)


def test_verify_cannot_overwrite_task() -> None:
    with pytest.raises(PoolingConfigError, match="overwrite"):
        PoolingParams(task="embed").verify("classify")
    assert PoolingParams(task="embed").verify("embed").task == "embed"


@pytest.mark.parametrize("task, pointer", [("score", "classify"), ("encode", "token_embed")])
def test_verify_removed_task(task: str, pointer: str) -> None:
    with pytest.raises(PoolingConfigError, match=pointer):
        PoolingParams().verify(task)


def test_verify_unknown_task() -> None:
    with pytest.raises(ValueError, match="Unsupported task"):
        PoolingParams().verify("generate")


@pytest.mark.parametrize("dims", [0, -3])
def test_verify_rejects_non_positive_dimensions(dims: int) -> None:
    with pytest.raises(PoolingConfigError, match="dimensions"):
        PoolingParams(dimensions=dims).verify("embed")


# ---------------------------------------------------------------- step parameters


@pytest.mark.parametrize("step_kwargs", [{"step_tag_id": 5}, {"returned_token_ids": [1, 2]}])
@pytest.mark.parametrize(
    "task, config",
    [
        ("token_embed", PoolerConfig()),
        ("token_classify", PoolerConfig(pooling_type="ALL")),
        ("embed", PoolerConfig(pooling_type="STEP")),  # STEP applies to token tasks only
        ("classify", PoolerConfig(pooling_type="STEP")),
    ],
)
def test_verify_rejects_step_params_unless_step(step_kwargs: dict, task: str, config: PoolerConfig) -> None:
    with pytest.raises(PoolingConfigError, match="STEP"):
        PoolingParams(**step_kwargs).verify(task, config)


@pytest.mark.parametrize("task", TOKEN_TASKS)
def test_verify_step_merges_config_and_needs_token_ids(task: str) -> None:
    config = PoolerConfig(pooling_type="STEP", step_tag_id=7, returned_token_ids=(0, 2))
    params = PoolingParams().verify(task, config)
    assert params.step_tag_id == 7
    assert params.returned_token_ids == [0, 2]
    assert params.requires_token_ids is True


def test_verify_step_request_wins() -> None:
    config = PoolerConfig(pooling_type="STEP", step_tag_id=7, returned_token_ids=(0, 2))
    params = PoolingParams(step_tag_id=3, returned_token_ids=[1]).verify("token_classify", config)
    assert params.step_tag_id == 3
    assert params.returned_token_ids == [1]


def test_verify_step_without_config_values() -> None:
    params = PoolingParams().verify("token_embed", PoolerConfig(tok_pooling_type="STEP"))
    assert params.step_tag_id is None and params.returned_token_ids is None
    assert params.requires_token_ids is True


def test_verify_non_step_does_not_need_token_ids() -> None:
    assert PoolingParams().verify("token_embed").requires_token_ids is False


# ---------------------------------------------------------------- Matryoshka


@pytest.mark.parametrize("task", EMBED_TASKS)
def test_verify_dimensions_without_matryoshka_truncates(task: str) -> None:
    # sentence-transformers, TEI and infinity truncate any model; the runner notes it on stderr.
    shape = EmbeddingShape(embedding_size=16)
    assert PoolingParams(dimensions=4).verify(task, shape=shape).dimensions == 4
    with pytest.raises(PoolingConfigError, match="exceeds the embedding size 16"):
        PoolingParams(dimensions=17).verify(task, shape=shape)


@pytest.mark.parametrize("is_matryoshka", [False, True])
def test_verify_matryoshka_listed_dimensions(is_matryoshka: bool) -> None:
    shape = EmbeddingShape(embedding_size=64, is_matryoshka=is_matryoshka, matryoshka_dimensions=(16, 32, 64))
    assert PoolingParams(dimensions=32).verify("embed", shape=shape).dimensions == 32
    with pytest.raises(PoolingConfigError, match="16, 32, 64"):
        PoolingParams(dimensions=24).verify("embed", shape=shape)


@pytest.mark.parametrize("dims, ok", [(1, True), (16, True), (17, False), (1000, False)])
def test_verify_matryoshka_size_limit(dims: int, ok: bool) -> None:
    shape = EmbeddingShape(embedding_size=16, is_matryoshka=True)
    if ok:
        assert PoolingParams(dimensions=dims).verify("embed", shape=shape).dimensions == dims
    else:
        with pytest.raises(PoolingConfigError, match="exceeds"):
            PoolingParams(dimensions=dims).verify("embed", shape=shape)


def test_verify_without_shape_skips_matryoshka_checks() -> None:
    assert PoolingParams(dimensions=4096).verify("embed").dimensions == 4096


def test_verify_shape_ignored_without_dimensions() -> None:
    params = PoolingParams().verify("embed", shape=EmbeddingShape(embedding_size=16))
    assert params.dimensions is None
