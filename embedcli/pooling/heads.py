"""Pooler heads: what runs after pooling (cast, projector or classifier, Matryoshka slice or calibration, activation)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from embedcli.pooling.activations import PoolerActivation, PoolerNormalize
from embedcli.pooling.metadata import PoolingMetadata
from embedcli.pooling.params import PoolingConfigError, PoolingParams

HeadInput = torch.Tensor | list[torch.Tensor]
HeadOutput = torch.Tensor | list[torch.Tensor]


def _stack(pooled: HeadInput) -> torch.Tensor:
    if isinstance(pooled, list):
        if not pooled:
            raise ValueError("Cannot stack an empty list without a hidden size")
        return torch.stack(pooled)
    return pooled


def _apply_per_row(
    x: torch.Tensor | list[torch.Tensor], flags: Sequence[bool], activation: PoolerActivation
) -> HeadOutput:
    """Activation on the rows whose flag is set: one call when all flags agree, per row otherwise."""
    if not flags:
        return x
    if all(flags):
        return activation(x)
    if not any(flags):
        return x
    rows = list(x) if isinstance(x, torch.Tensor) else x
    return [activation.forward_chunk(r) if f else r for r, f in zip(rows, flags, strict=True)]


def _calibrate(logits: torch.Tensor, logit_mean: float | None, logit_sigma: float | None) -> torch.Tensor:
    # Platt-style calibration, mean first then sigma, as vLLM's ClassifierPoolerHead.
    if logit_mean is not None:
        logits = logits - logit_mean
    if logit_sigma is not None:
        logits = logits / logit_sigma
    return logits


def _check_sigma(logit_sigma: float | None) -> None:
    if logit_sigma is not None and logit_sigma == 0:
        raise PoolingConfigError("logit_sigma must be non-zero (it divides the logits)")


class PoolerHead(nn.Module):
    """Base of every head; declares the tasks it serves."""

    supported_tasks: frozenset[str] = frozenset()

    def get_supported_tasks(self) -> set[str]:
        """Tasks this head can serve."""
        return set(self.supported_tasks)


class EmbeddingPoolerHead(PoolerHead):
    """Cast → projector → per-row Matryoshka slice → per-row normalize."""

    supported_tasks = frozenset({"embed"})

    def __init__(
        self,
        projector: nn.Module | None = None,
        head_dtype: torch.dtype | None = None,
        activation: PoolerActivation | None = None,
    ) -> None:
        super().__init__()
        self.projector = projector
        self.head_dtype = head_dtype
        self.activation = activation if activation is not None else PoolerNormalize()

    def forward(self, pooled: HeadInput, metadata: PoolingMetadata) -> HeadOutput:
        params = metadata.pooling_params
        if isinstance(pooled, list) and not pooled:
            return pooled
        x = _stack(pooled)
        if self.head_dtype is not None:
            x = x.to(self.head_dtype)
        if self.projector is not None:
            x = self.projector(x)
        sliced = self._slice(x, params)
        return _apply_per_row(sliced, [bool(p.use_activation) for p in params], self.activation)

    @staticmethod
    def _slice(x: torch.Tensor, params: Sequence[PoolingParams]) -> torch.Tensor | list[torch.Tensor]:
        dims = [p.dimensions for p in params]
        if not dims or all(d is None for d in dims):
            return x
        if all(d == dims[0] for d in dims):
            return x[..., : dims[0]]
        # Mixed sizes cannot share one tensor; rows without dimensions keep their full width.
        return [row if d is None else row[:d] for row, d in zip(x, dims, strict=True)]


class ClassifierPoolerHead(PoolerHead):
    """Cast → classifier → `(logits - logit_mean) / logit_sigma` → per-row activation."""

    supported_tasks = frozenset({"classify"})

    def __init__(
        self,
        classifier: nn.Module | None = None,
        activation: PoolerActivation | None = None,
        logit_mean: float | None = None,
        logit_sigma: float | None = None,
        head_dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        _check_sigma(logit_sigma)
        self.classifier = classifier
        self.activation = activation
        self.logit_mean = logit_mean
        self.logit_sigma = logit_sigma
        self.head_dtype = head_dtype

    def forward(self, pooled: HeadInput, metadata: PoolingMetadata) -> HeadOutput:
        if isinstance(pooled, list) and not pooled:
            return pooled
        x = _stack(pooled)
        if self.head_dtype is not None:
            x = x.to(self.head_dtype)
        if self.classifier is not None:
            x = self.classifier(x)
        x = _calibrate(x, self.logit_mean, self.logit_sigma)
        if self.activation is None:
            return x
        return _apply_per_row(x, [bool(p.use_activation) for p in metadata.pooling_params], self.activation)


TokenHeadInput = list[torch.Tensor | None]


class TokenEmbeddingPoolerHead(PoolerHead):
    """Per sequence `[n_tokens, hidden]`: cast → projector → slice → row normalize; `None` passes through."""

    supported_tasks = frozenset({"token_embed"})

    def __init__(
        self,
        projector: nn.Module | None = None,
        head_dtype: torch.dtype | None = None,
        activation: PoolerActivation | None = None,
    ) -> None:
        super().__init__()
        self.projector = projector
        self.head_dtype = head_dtype
        self.activation = activation if activation is not None else PoolerNormalize()

    def forward_chunk(self, x: torch.Tensor | None, params: PoolingParams) -> torch.Tensor | None:
        """The head applied to one sequence's token matrix."""
        if x is None:
            return None
        if self.head_dtype is not None:
            x = x.to(self.head_dtype)
        if self.projector is not None:
            x = self.projector(x)
        if params.dimensions is not None:
            x = x[..., : params.dimensions]
        if params.use_activation:
            x = self.activation.forward_chunk(x)
        return x

    def forward(self, pooled: TokenHeadInput, metadata: PoolingMetadata) -> TokenHeadInput:
        return [self.forward_chunk(x, p) for x, p in zip(pooled, metadata.pooling_params, strict=True)]


class TokenClassifierPoolerHead(PoolerHead):
    """Per sequence: cast → classifier → calibration → activation; `None` passes through."""

    supported_tasks = frozenset({"token_classify"})

    def __init__(
        self,
        classifier: nn.Module | None = None,
        activation: PoolerActivation | None = None,
        logit_mean: float | None = None,
        logit_sigma: float | None = None,
        head_dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        _check_sigma(logit_sigma)
        self.classifier = classifier
        self.activation = activation
        self.logit_mean = logit_mean
        self.logit_sigma = logit_sigma
        self.head_dtype = head_dtype

    def forward_chunk(self, x: torch.Tensor | None, params: PoolingParams) -> torch.Tensor | None:
        """The head applied to one sequence's token matrix."""
        if x is None:
            return None
        if self.head_dtype is not None:
            x = x.to(self.head_dtype)
        if self.classifier is not None:
            x = self.classifier(x)
        x = _calibrate(x, self.logit_mean, self.logit_sigma)
        if params.use_activation and self.activation is not None:
            x = self.activation.forward_chunk(x)
        return x

    def forward(self, pooled: TokenHeadInput, metadata: PoolingMetadata) -> TokenHeadInput:
        return [self.forward_chunk(x, p) for x, p in zip(pooled, metadata.pooling_params, strict=True)]
