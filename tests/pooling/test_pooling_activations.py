"""Activations, `get_activation` and `resolve_classifier_activation` (vLLM `test_pooler_activations.py`)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from pooling_reference import (
    DTYPES,
    TOL,
    assert_matches,
    rand,
    ref_norm,
    ref_normalize,
    ref_sigmoid,
    ref_softmax,
    to_rows,
    to_vec,
)

from embedcli.pooling import (
    LambdaPoolerActivation,
    PoolerClassify,
    PoolerIdentity,
    PoolerMultiLabelClassify,
    PoolerNormalize,
    get_activation,
    resolve_classifier_activation,
)
from embedcli.pooling import activations as activations_module

ST_IDENTITY = "torch.nn.modules.linear.Identity"
ST_SIGMOID = "torch.nn.modules.activation.Sigmoid"
ST_SOFTMAX = "torch.nn.modules.activation.Softmax"
ST_TANH = "torch.nn.modules.activation.Tanh"


# ---------------------------------------------------------------- Identity


def test_identity_tensor_and_list() -> None:
    x = rand(3, 4)
    assert torch.equal(PoolerIdentity()(x), x)
    xs = [rand(2, 4), rand(5, 4)]
    out = PoolerIdentity()(xs)
    assert isinstance(out, list) and len(out) == 2
    assert all(torch.equal(a, b) for a, b in zip(out, xs, strict=True))


# ---------------------------------------------------------------- Normalize


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (3, 4), (5, 16), (2, 384)])
def test_normalize_matches_reference(dtype: torch.dtype, shape: tuple[int, int]) -> None:
    x = rand(*shape, dtype, scale=5.0)
    out = PoolerNormalize()(x)
    assert out.dtype == dtype
    assert_matches(out, [ref_normalize(r) for r in to_rows(x)], **TOL[dtype])
    for row in to_rows(out):
        assert abs(ref_norm(row) - 1.0) < TOL[dtype]["atol"] * 2


def test_normalize_one_dim_vector() -> None:
    x = torch.tensor([3.0, 4.0])
    assert_matches(PoolerNormalize()(x), [0.6, 0.8], atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_normalize_zero_vector_stays_zero_without_nan(dtype: torch.dtype) -> None:
    x = torch.tensor([[0.0, 0.0, 0.0], [1.0, 2.0, 2.0]], dtype=dtype)
    out = PoolerNormalize()(x)
    assert not torch.isnan(out).any()
    assert_matches(out, [[0.0, 0.0, 0.0], [1 / 3, 2 / 3, 2 / 3]], **TOL[dtype])


def test_normalize_tiny_vector_is_still_unit_norm() -> None:
    x = torch.tensor([[1e-8, -1e-8]], dtype=torch.float32)
    out = PoolerNormalize()(x)
    assert_matches(out, [ref_normalize(to_vec(x[0]))], atol=1e-5)


def test_normalize_list_input() -> None:
    xs = [rand(2, 4), rand(1, 7), torch.zeros(1, 3)]
    out = PoolerNormalize()(xs)
    assert isinstance(out, list) and len(out) == 3
    for o, x in zip(out, xs, strict=True):
        assert_matches(o, [ref_normalize(r) for r in to_rows(x)], atol=1e-6)


# ---------------------------------------------------------------- MultiLabelClassify


@pytest.mark.parametrize("dtype", DTYPES)
def test_multilabel_is_elementwise_sigmoid(dtype: torch.dtype) -> None:
    x = rand(4, 5, dtype, scale=3.0)
    out = PoolerMultiLabelClassify()(x)
    assert_matches(out, [ref_sigmoid(r) for r in to_rows(x)], **TOL[dtype])
    assert bool(((out >= 0) & (out <= 1)).all())


def test_multilabel_saturates() -> None:
    out = PoolerMultiLabelClassify()(torch.tensor([[100.0, -100.0, 0.0]]))
    assert_matches(out, [[1.0, 0.0, 0.5]], atol=1e-4)


def test_multilabel_list_input() -> None:
    xs = [rand(2, 3), rand(1, 1)]
    out = PoolerMultiLabelClassify()(xs)
    for o, x in zip(out, xs, strict=True):
        assert_matches(o, [ref_sigmoid(r) for r in to_rows(x)], atol=1e-6)


# ---------------------------------------------------------------- Classify


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "num_labels, cols, kind",
    [
        (None, 1, "sigmoid"),  # dynamic: one column → sigmoid
        (None, 2, "softmax"),
        (None, 4, "softmax"),
        (0, 3, "sigmoid"),  # vLLM takes sigmoid for 0 (not softmax)
        (0, 1, "sigmoid"),
        (1, 1, "sigmoid"),
        (1, 3, "sigmoid"),  # the static label count decides, not the tensor's width
        (2, 2, "softmax"),
        (5, 5, "softmax"),
    ],
)
def test_classify(dtype: torch.dtype, num_labels: int | None, cols: int, kind: str) -> None:
    x = rand(3, cols, dtype, scale=2.0)
    out = PoolerClassify(num_labels)(x)
    ref = ref_sigmoid if kind == "sigmoid" else ref_softmax
    assert_matches(out, [ref(r) for r in to_rows(x)], **TOL[dtype])
    if kind == "softmax":
        for row in to_rows(out):
            assert abs(sum(row) - 1.0) < TOL[dtype]["atol"] * 2


@pytest.mark.parametrize("num_labels", [0, 1])
def test_classify_sigmoid_of_zero_is_half(num_labels: int) -> None:
    out = PoolerClassify(num_labels)(torch.zeros(2, 1))
    assert_matches(out, [[0.5], [0.5]], atol=1e-7)


def test_classify_default_is_dynamic() -> None:
    assert PoolerClassify().num_labels is None


def test_classify_list_input_infers_labels_per_element() -> None:
    xs = [rand(2, 1), rand(2, 3)]
    out = PoolerClassify()(xs)
    assert_matches(out[0], [ref_sigmoid(r) for r in to_rows(xs[0])], atol=1e-6)
    assert_matches(out[1], [ref_softmax(r) for r in to_rows(xs[1])], atol=1e-6)


# ---------------------------------------------------------------- Lambda


def test_lambda_relu_tensor_and_list() -> None:
    act = LambdaPoolerActivation(torch.nn.ReLU())
    x = torch.tensor([[-1.0, 0.5], [2.0, -3.0]])
    assert_matches(act(x), [[0.0, 0.5], [2.0, 0.0]], atol=0.0)
    out = act([x, -x])
    assert_matches(out[1], [[1.0, 0.0], [0.0, 3.0]], atol=0.0)


def test_lambda_any_callable() -> None:
    act = LambdaPoolerActivation(lambda t: t * 2 + 1)
    assert_matches(act(torch.tensor([1.0, -1.0])), [3.0, -1.0], atol=0.0)


# ---------------------------------------------------------------- get_activation


@pytest.mark.parametrize(
    "name, ref",
    [
        ("softmax", ref_softmax),
        ("sigmoid", ref_sigmoid),
        ("none", lambda r: r),
        ("normalize", ref_normalize),
    ],
)
def test_get_activation(name: str, ref) -> None:
    x = rand(3, 4)
    out = get_activation(name)(x)
    assert_matches(out, [ref(r) for r in to_rows(x)], atol=1e-6)


@pytest.mark.parametrize(
    "num_labels, ref", [(None, ref_softmax), (1, ref_sigmoid), (0, ref_sigmoid), (4, ref_softmax)]
)
def test_get_activation_classify_passes_num_labels(num_labels, ref) -> None:
    act = get_activation("classify", num_labels=num_labels)
    assert isinstance(act, PoolerClassify) and act.num_labels == num_labels
    x = rand(2, 4)
    assert_matches(act(x), [ref(r) for r in to_rows(x)], atol=1e-6)


def test_get_activation_unknown() -> None:
    with pytest.raises(ValueError, match="'tanh'"):
        get_activation("tanh")


# ---------------------------------------------------------------- resolve_classifier_activation


def _configs(**fields):
    """The same config as a dict (sentence-transformers JSON) and as an attribute object (HF config)."""
    return [fields, SimpleNamespace(**fields)]


def _both(**fields):
    return pytest.mark.parametrize("config", _configs(**fields), ids=["dict", "object"])


@_both(problem_type="regression", num_labels=1, sentence_transformers={"activation_fn": ST_SIGMOID})
def test_resolve_regression_is_identity_and_beats_st(config) -> None:
    assert type(resolve_classifier_activation(config)) is PoolerIdentity


@_both(problem_type="single_label_classification", num_labels=3)
def test_resolve_single_label(config) -> None:
    act = resolve_classifier_activation(config)
    assert type(act) is PoolerClassify and act.num_labels == 3
    x = rand(2, 3)
    assert_matches(act(x), [ref_softmax(r) for r in to_rows(x)], atol=1e-6)


@_both(problem_type="multi_label_classification", num_labels=3)
def test_resolve_multi_label(config) -> None:
    act = resolve_classifier_activation(config)
    assert type(act) is PoolerMultiLabelClassify


@_both(num_labels=1, sentence_transformers={"activation_fn": ST_IDENTITY})
def test_resolve_st_identity(config) -> None:
    assert type(resolve_classifier_activation(config)) is PoolerIdentity


@pytest.mark.parametrize("name", [ST_SIGMOID, ST_SOFTMAX])
def test_resolve_st_sigmoid_and_softmax_map_to_classify(name: str) -> None:
    for config in _configs(num_labels=1, sentence_transformers={"activation_fn": name}):
        act = resolve_classifier_activation(config)
        assert type(act) is PoolerClassify and act.num_labels == 1


@_both(num_labels=1, sbert_ce_default_activation_function=ST_SIGMOID)
def test_resolve_legacy_sbert_key(config) -> None:
    act = resolve_classifier_activation(config)
    assert type(act) is PoolerClassify and act.num_labels == 1


@_both(
    num_labels=1,
    sentence_transformers={"activation_fn": ST_IDENTITY},
    sbert_ce_default_activation_function=ST_SIGMOID,
)
def test_resolve_st_key_wins_over_legacy(config) -> None:
    assert type(resolve_classifier_activation(config)) is PoolerIdentity


@_both(num_labels=1, sentence_transformers={"activation_fn": ST_TANH})
def test_resolve_other_st_module_is_wrapped(config) -> None:
    act = resolve_classifier_activation(config)
    assert type(act) is LambdaPoolerActivation
    x = torch.tensor([[0.5, -2.0]])
    assert_matches(act(x), [[math.tanh(0.5), math.tanh(-2.0)]], atol=1e-6)


@pytest.mark.parametrize(
    "name",
    [
        "os.system",
        "builtins.eval",
        "torch.sigmoid",
        "torch.nn.Sigmoid",  # right class, but not under torch.nn.modules.
        "xtorch.nn.modules.activation.Sigmoid",
        "torch.nn.modulesX.activation.Sigmoid",
    ],
)
@pytest.mark.parametrize("key", ["sentence_transformers", "sbert_ce_default_activation_function"])
def test_resolve_rejects_names_outside_torch_nn_modules(name: str, key: str, monkeypatch) -> None:
    def no_import(*_args, **_kwargs):
        raise AssertionError("a restricted name must be rejected before anything is imported")

    monkeypatch.setattr(activations_module.importlib, "import_module", no_import)
    config = {key: {"activation_fn": name} if key == "sentence_transformers" else name, "num_labels": 1}
    with pytest.raises(ValueError, match="restricted"):
        resolve_classifier_activation(config)


def test_resolve_rejects_non_module_under_the_prefix() -> None:
    # `torch.nn.modules.activation.F` is torch.nn.functional: under the prefix, but not an nn.Module class.
    config = {"sentence_transformers": {"activation_fn": "torch.nn.modules.activation.F"}}
    with pytest.raises(ValueError):
        resolve_classifier_activation(config)


@_both(num_labels=3)
def test_resolve_default_is_classify(config) -> None:
    act = resolve_classifier_activation(config)
    assert type(act) is PoolerClassify and act.num_labels == 3


def test_resolve_empty_problem_type_and_st_section_default_to_classify() -> None:
    act = resolve_classifier_activation({"num_labels": 2, "problem_type": "", "sentence_transformers": {}})
    assert type(act) is PoolerClassify and act.num_labels == 2


def test_resolve_dynamic_num_labels() -> None:
    act = resolve_classifier_activation({"num_labels": 3}, static_num_labels=False)
    assert type(act) is PoolerClassify and act.num_labels is None
    st_act = resolve_classifier_activation(
        {"num_labels": 3, "sentence_transformers": {"activation_fn": ST_SIGMOID}}, static_num_labels=False
    )
    assert type(st_act) is PoolerClassify and st_act.num_labels is None
