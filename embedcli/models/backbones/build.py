"""Building an own packed backbone (with its head) from a folder, as the registry's plan names it.

Which model types have one, and for which config values, is the registry's (`embedcli.models.registry`);
everything here reads config.json and safetensors directly.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import cast

import torch
from torch import nn

from embedcli.models.backbones.layers import (
    JsonConfig,
    StateDict,
    UnsupportedCheckpoint,
    Weights,
    load_state_dict,
    skip_init_weights,
)
from embedcli.models.backbones.lm_heads import token_score_head
from embedcli.models.spec import ModelSpec


def _linear(weights: Weights, name: str, *, bias: bool = True) -> nn.Linear:
    """An `nn.Linear` holding the checkpoint's `name.weight` (and `name.bias`)."""
    weight = weights.head(f"{name}.weight")
    if weight is None:
        raise UnsupportedCheckpoint(f"classifier tensor {name}.weight is missing")
    b = weights.head(f"{name}.bias") if bias else None
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=b is not None)
    linear.weight.data.copy_(weight)
    if b is not None:
        linear.bias.data.copy_(b)
    return linear


def _classifier(spec: ModelSpec, weights: Weights, model: nn.Module, config: JsonConfig) -> nn.Module:
    """The head of a `*ForSequenceClassification` / `*ForTokenClassification` checkpoint, on pooled vectors,
    or an LLM reranker's score rows of the LM head (families whose backbone gives `lm_head_weight`)."""
    if spec.head == "lm_score":
        lm_head_weight = getattr(model, "lm_head_weight", None)
        if lm_head_weight is None:
            raise UnsupportedCheckpoint(f"the LM-head score of {spec.model_type} runs on transformers")
        softcap = getattr(model, "final_logit_softcap", config.get("final_logit_softcapping"))
        return token_score_head(lm_head_weight(weights), None, spec.score_token_ids, softcap)
    if spec.model_type == "modernbert":
        from embedcli.models.backbones.modernbert import classifier_head

        return classifier_head(config, weights)
    if spec.head == "token_classification":
        return _linear(weights, "classifier")
    if spec.is_decoder:
        return _linear(weights, "score", bias=False)
    p = weights.prefix
    if spec.model_type in ("bert", "new"):
        # BERT's pooler (dense + tanh over the CLS state) belongs to the classification head.
        return nn.Sequential(_linear(weights, f"{p}pooler.dense"), nn.Tanh(), _linear(weights, "classifier"))
    if spec.model_type == "distilbert":
        return nn.Sequential(_linear(weights, "pre_classifier"), nn.ReLU(), _linear(weights, "classifier"))
    # RoBERTa / XLM-R / CamemBERT / MPNet classification heads: dense + tanh + out_proj on the first token.
    return nn.Sequential(_linear(weights, "classifier.dense"), nn.Tanh(), _linear(weights, "classifier.out_proj"))


def backbone_class(backbone: str) -> type[nn.Module]:
    """The class a registry entry names as `module:Class`."""
    module_name, _, class_name = backbone.partition(":")
    cls: type[nn.Module] = getattr(importlib.import_module(module_name), class_name)
    return cls


def load_own_backbone(
    spec: ModelSpec, backbone: str, dtype: torch.dtype, device: torch.device
) -> tuple[nn.Module, nn.Module | None]:
    """The own backbone `backbone` ("module:Class") of `spec` (eval, no grad) and its float32 classifier head
    (None for base models)."""
    cls = backbone_class(backbone)
    config = JsonConfig.read(spec.path)
    state = load_state_dict(Path(spec.path), spec.weights)
    with skip_init_weights():
        model = cls(config)
    weights: Weights = cast("Callable[[StateDict], Weights]", model.load)(state)
    classifier = None if spec.head == "base" else _classifier(spec, weights, model, config).to(device=device, dtype=torch.float32)
    model = model.to(device=device, dtype=dtype).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    if classifier is not None:
        classifier.eval()
        for p in classifier.parameters():
            p.requires_grad_(False)
    return model, classifier
