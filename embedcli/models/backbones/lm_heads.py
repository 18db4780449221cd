"""Heads taken from a language model's own LM head: the yes/no reranker rows and the SPLADE masked-LM head."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch
from torch import nn

from embedcli.errors import ConfigRefusedError
from embedcli.models.spec import ModelSpec
from embedcli.pooling import (
    DispatchPooler,
    Pooler,
    PoolerConfig,
    SpladePooler,
    TokenLogitScore,
    get_activation,
    pooler_for_classify,
)
from embedcli.pooling.activations import PoolerClassify


class CappedTokenLogitScore(TokenLogitScore):
    """`TokenLogitScore` over logits capped as Gemma's LM head caps them (`final_logit_softcapping`):
    `tanh(logit / cap) * cap` on each token's logit, before the difference."""

    def __init__(self, rows: torch.Tensor, bias: torch.Tensor | None, cap: float) -> None:
        super().__init__(rows, bias)
        self.cap = cap

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = hidden.to(torch.float32) @ self.rows.T
        if self.bias is not None:
            logits = logits + self.bias
        logits = torch.tanh(logits / self.cap) * self.cap
        if logits.shape[-1] == 2:
            return logits[..., 1:2] - logits[..., 0:1]
        return logits


def token_score_head(
    weight: torch.Tensor, bias: torch.Tensor | None, token_ids: tuple[int, ...], softcap: float | None
) -> TokenLogitScore:
    """The rows of `token_ids` of an LM head `weight` (and `bias`) as a score head; `softcap`: the config's
    `final_logit_softcapping` (None: the logits as they are)."""
    index = torch.tensor(token_ids, dtype=torch.long, device=weight.device)
    rows = weight.index_select(0, index)
    picked = None if bias is None else bias.index_select(0, index)
    return TokenLogitScore(rows, picked) if softcap is None else CappedTokenLogitScore(rows, picked, float(softcap))


def lm_score_head(model: nn.Module, spec: ModelSpec) -> nn.Module:
    """The score tokens' rows of a causal LM's `lm_head` (float32), as a `[n, hidden] -> [n, 1]` module."""
    lm_head = cast("Any", model).get_output_embeddings()  # a transformers PreTrainedModel: a Linear or a quantized one
    if lm_head is None:
        raise ConfigRefusedError(f"{spec.path}: the causal LM has no output embeddings (lm_head) to score with")
    weight = lm_head.weight
    if callable(weight):  # int8 dynamically quantized Linear
        weight = weight().dequantize()
    bias = getattr(lm_head, "bias", None)
    if callable(bias):
        bias = bias()
    softcap = getattr(getattr(model, "config", None), "final_logit_softcapping", None)
    return token_score_head(weight, bias, spec.score_token_ids, softcap)


def mlm_head(model: nn.Module, spec: ModelSpec) -> nn.Module:
    """The masked-LM head (transform + decoder) of a `*ForMaskedLM` model: `[n, hidden] -> [n, vocab]` logits."""
    kind = spec.model_type
    part = cast("Callable[[str], nn.Module]", model.get_submodule)
    if kind == "bert":
        return part("cls")
    if kind in ("roberta", "xlm-roberta", "camembert", "mpnet"):
        return part("lm_head")
    if kind == "distilbert":
        return nn.Sequential(*(part(n) for n in ("vocab_transform", "activation", "vocab_layer_norm", "vocab_projector")))
    raise ConfigRefusedError(f"{spec.path}: SPLADE on model_type {kind!r} is not supported (bert, roberta, "
                           "xlm-roberta, camembert, mpnet, distilbert)")


def lm_pooler(spec: ModelSpec, options: Any, head: nn.Module | None) -> Pooler:
    """LAST pooling + the token score head (sigmoid unless --raw-scores), or the SPLADE pooler."""
    assert head is not None
    if spec.head == "sparse":
        top_k = options.sparse_top_k if options.sparse_top_k is not None else spec.sparse_top_k
        return DispatchPooler(
            {
                "sparse_embed": SpladePooler(
                    head, reduce=spec.sparse_pooling or "max",  # type: ignore[arg-type]  # the spec holds the checked name as a str
                    activation=spec.sparse_activation or "relu", top_k=top_k,  # type: ignore[arg-type]  # the spec holds the checked name as a str
                )
            }
        )
    # sentence-transformers' CrossEncoder default for one score is Sigmoid (vLLM: sigmoid of the 1-label logit);
    # --raw-scores asks for "none".
    activation = get_activation(options.activation, 1) if options.activation else PoolerClassify(1)
    return DispatchPooler(
        {
            "classify": pooler_for_classify(
                PoolerConfig(seq_pooling_type="LAST", logit_mean=options.logit_mean, logit_sigma=options.logit_sigma),
                head, activation, torch.float32, num_labels=1,
            )
        }
    )
