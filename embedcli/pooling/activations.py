"""Pooler activations (identity, L2 normalize, sigmoid, classify) and the resolver that picks one from a model config."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

ActivationInput = torch.Tensor | list[torch.Tensor]


class PoolerActivation(nn.Module):
    """An activation applied to a tensor, or to each tensor of a list."""

    def forward_chunk(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the activation to one tensor."""
        raise NotImplementedError

    def forward(self, x: ActivationInput) -> ActivationInput:
        if isinstance(x, list):
            return [self.forward_chunk(t) for t in x]
        return self.forward_chunk(x)


class PoolerIdentity(PoolerActivation):
    """Leaves its input unchanged."""

    def forward_chunk(self, x: torch.Tensor) -> torch.Tensor:
        return x


class PoolerNormalize(PoolerActivation):
    """L2 normalization along the last dim; a zero vector stays zero (eps 1e-12, as torch and vLLM)."""

    def forward_chunk(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(x, p=2, dim=-1)


class PoolerMultiLabelClassify(PoolerActivation):
    """Element-wise sigmoid: each label is an independent yes/no."""

    def forward_chunk(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(x)


class PoolerClassify(PoolerActivation):
    """Sigmoid for fewer than two labels, softmax over the last dim otherwise.

    `num_labels=None` reads the label count from the tensor's last dim (vLLM's dynamic mode).
    """

    def __init__(self, num_labels: int | None = None) -> None:
        super().__init__()
        self.num_labels = num_labels

    def forward_chunk(self, x: torch.Tensor) -> torch.Tensor:
        num_labels = x.shape[-1] if self.num_labels is None else self.num_labels
        # vLLM takes sigmoid for num_labels == 0 too (its old warning text claims softmax; the code does not).
        if num_labels < 2:
            return torch.sigmoid(x)
        return torch.softmax(x, dim=-1)


class LambdaPoolerActivation(PoolerActivation):
    """Wraps any tensor -> tensor callable."""

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.fn = fn

    def forward_chunk(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


_ALLOWED_PREFIX = "torch.nn.modules."


def _get(config: Any, key: str) -> Any:
    if isinstance(config, Mapping):
        return config.get(key)
    return getattr(config, key, None)


def load_st_activation(name: str) -> nn.Module:
    """Instantiate a sentence-transformers activation by import path, restricted to `torch.nn.modules.*`."""
    # A ValueError, not an assert: `python -O` strips asserts (vLLM's CVE-2026-41523).
    if not name.startswith(_ALLOWED_PREFIX):
        raise ValueError(
            f"Activation function {name!r} is restricted: only classes under {_ALLOWED_PREFIX}* may be loaded"
        )
    module_name, _, class_name = name.rpartition(".")
    cls = getattr(importlib.import_module(module_name), class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise ValueError(f"Activation function {name!r} is not a torch.nn module class")
    return cls()


def _from_st_module(module: nn.Module, num_labels: int | None) -> PoolerActivation:
    if isinstance(module, nn.Identity):
        return PoolerIdentity()
    # vLLM maps both Sigmoid and Softmax to Classify (sigmoid for one label, softmax otherwise).
    if isinstance(module, (nn.Sigmoid, nn.Softmax)):
        return PoolerClassify(num_labels)
    return LambdaPoolerActivation(module)


def st_classifier_activation(module: nn.Module) -> PoolerActivation:
    """A sentence-transformers CrossEncoder activation as `predict` applies it (Sigmoid stays element-wise)."""
    if isinstance(module, nn.Identity):
        return PoolerIdentity()
    if isinstance(module, nn.Sigmoid):
        return PoolerMultiLabelClassify()
    return LambdaPoolerActivation(module)


def resolve_classifier_activation(config: Any, *, static_num_labels: bool = True) -> PoolerActivation:
    """Pick the classification activation from a model config, as vLLM does.

    1. `problem_type` (regression / single-label / multi-label), aligned with transformers' loss;
    2. else sentence-transformers' `activation_fn` (or legacy `sbert_ce_default_activation_function`);
    3. else Classify.
    """
    num_labels = _get(config, "num_labels") if static_num_labels else None
    problem_type = _get(config, "problem_type")
    if problem_type == "regression":
        return PoolerIdentity()
    if problem_type == "single_label_classification":
        return PoolerClassify(num_labels)
    if problem_type == "multi_label_classification":
        return PoolerMultiLabelClassify()

    st_config = _get(config, "sentence_transformers") or {}
    name = _get(st_config, "activation_fn") or _get(config, "sbert_ce_default_activation_function")
    if name:
        return _from_st_module(load_st_activation(str(name)), num_labels)
    return PoolerClassify(num_labels)


def get_activation(name: str, num_labels: int | None = None) -> PoolerActivation:
    """An activation by user-facing name: `softmax`, `sigmoid`, `none`, `classify` or `normalize`."""
    table: dict[str, Callable[[], PoolerActivation]] = {
        "softmax": lambda: LambdaPoolerActivation(lambda x: torch.softmax(x, dim=-1)),
        "sigmoid": PoolerMultiLabelClassify,
        "none": PoolerIdentity,
        "classify": lambda: PoolerClassify(num_labels),
        "normalize": PoolerNormalize,
    }
    try:
        return table[name]()
    except KeyError:
        raise ValueError(f"Unknown activation {name!r}; choose one of {', '.join(table)}") from None
