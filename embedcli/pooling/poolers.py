"""Poolers (method + head) and the `DispatchPooler` that routes each sequence to the pooler of its task."""

from __future__ import annotations

from collections.abc import Mapping
from itertools import groupby
from typing import cast

import torch
from torch import nn

from embedcli.pooling.activations import PoolerActivation, PoolerClassify, PoolerNormalize
from embedcli.pooling.heads import (
    ClassifierPoolerHead,
    EmbeddingPoolerHead,
    PoolerHead,
    TokenClassifierPoolerHead,
    TokenEmbeddingPoolerHead,
)
from embedcli.pooling.metadata import PoolingMetadata, PoolingState
from embedcli.pooling.methods import (
    PoolingMethod,
    SequencePoolingMethod,
    TokenPoolingMethod,
    get_tok_pooling_method,
)
from embedcli.pooling.params import POOLING_TASKS, PoolerConfig, PoolingConfigError, PoolingParams, check_task
from embedcli.pooling.st_pooling import get_seq_pooling_method

PoolerOutput = torch.Tensor | list[torch.Tensor | None]


class Pooler(nn.Module):
    """Hidden states of a packed forward in, one result per sequence out."""

    def get_supported_tasks(self) -> set[str]:
        """Tasks this pooler can serve."""
        raise NotImplementedError

    def requires_token_ids(self) -> bool:
        """Whether the metadata must carry the buffer's token ids."""
        return False

    def carries_slices(self) -> bool:
        """Whether `pool_slices` can pool sequences split over the slices of a chunked prefill."""
        return False

    def drops_first_token(self) -> bool:
        """Whether a token task's rows leave out each sequence's first token (BGE-M3's colbert vectors)."""
        return False

    def forward(self, hidden_states: torch.Tensor, metadata: PoolingMetadata) -> PoolerOutput:
        raise NotImplementedError

    def pool_slices(
        self, hidden_states: torch.Tensor, metadata: PoolingMetadata, states: list[PoolingState | None]
    ) -> list[torch.Tensor | None]:
        """Results of a forward that holds slices; `None` for a sequence whose last slice is still to come.

        `states[i]` is what sliced sequence i carries from its earlier slices (None: sequence i is whole).
        """
        raise PoolingConfigError(f"{type(self).__name__} cannot pool a sequence split over prefill slices")


class _MethodHeadPooler(Pooler):
    def __init__(self, method: PoolingMethod, head: PoolerHead) -> None:
        super().__init__()
        self.method = method
        self.head = head
        # Fail at load, not mid-corpus: a method and head that share no task can serve nothing.
        if not self.get_supported_tasks():
            raise PoolingConfigError(
                f"{type(method).__name__} and {type(head).__name__} support no common task"
            )

    def get_supported_tasks(self) -> set[str]:
        return set[str](POOLING_TASKS) & self.method.get_supported_tasks() & self.head.get_supported_tasks()

    def requires_token_ids(self) -> bool:
        return self.method.requires_token_ids()

    def carries_slices(self) -> bool:
        return self.method.carries_slices()

    def forward(self, hidden_states: torch.Tensor, metadata: PoolingMetadata) -> PoolerOutput:
        return self.head(self.method(hidden_states, metadata), metadata)


class SequencePooler(_MethodHeadPooler):
    """A sequence pooling method (CLS/LAST/MEAN) followed by an embedding or classifier head."""

    method: SequencePoolingMethod

    def __init__(self, method: SequencePoolingMethod, head: PoolerHead) -> None:
        super().__init__(method, head)

    def pool_slices(
        self, hidden_states: torch.Tensor, metadata: PoolingMetadata, states: list[PoolingState | None]
    ) -> list[torch.Tensor | None]:
        cursor = metadata.cursor
        partial = self.method.accumulate(hidden_states, metadata)
        for i, state in enumerate(states):
            if state is not None:
                state.partial = partial.row(i) if state.partial is None else state.partial.merge(partial.row(i))
                partial.put(i, state.partial)
        pooled = self.method.finish(partial, cursor)
        # The head runs once per sequence, on its finished vector only.
        idx = torch.nonzero(cursor.is_finished()).flatten()
        results: list[torch.Tensor | None] = [None] * len(cursor)
        if idx.numel() == 0:
            return results
        sub = PoolingMetadata(cursor.select(idx), [metadata.pooling_params[i] for i in idx.tolist()])
        for i, r in zip(idx.tolist(), list(self.head(pooled[idx.to(pooled.device)], sub)), strict=True):
            results[i] = r
        return results


class TokenPooler(_MethodHeadPooler):
    """A token pooling method (ALL/STEP) followed by a token head."""

    def __init__(self, method: TokenPoolingMethod, head: PoolerHead) -> None:
        super().__init__(method, head)

    def pool_slices(
        self, hidden_states: torch.Tensor, metadata: PoolingMetadata, states: list[PoolingState | None]
    ) -> list[torch.Tensor | None]:
        # The token methods keep their own per-sequence caches of the slices (vLLM's pooling_states).
        metadata.pooling_states = [s if s is not None else PoolingState() for s in states]
        return list(self(hidden_states, metadata))


class DispatchPooler(Pooler):
    """Routes runs of consecutive same-task sequences to each task's pooler, keeping batch order."""

    def __init__(self, poolers_by_task: Mapping[str, Pooler]) -> None:
        super().__init__()
        for task, pooler in poolers_by_task.items():
            check_task(task)
            if task not in pooler.get_supported_tasks():
                raise PoolingConfigError(
                    f"{type(pooler).__name__} registered for task {task!r} does not support it "
                    f"(it supports {', '.join(sorted(pooler.get_supported_tasks())) or 'nothing'})"
                )
        self.poolers_by_task: nn.ModuleDict = nn.ModuleDict(dict(poolers_by_task))

    def get_supported_tasks(self) -> set[str]:
        return set(self.poolers_by_task.keys())

    def requires_token_ids(self) -> bool:
        return any(cast(Pooler, p).requires_token_ids() for p in self.poolers_by_task.values())

    def pooler_for(self, task: str | None) -> Pooler:
        """The pooler that serves `task`, or a ValueError naming the tasks there are."""
        if task is None or task not in self.poolers_by_task:
            supported = ", ".join(sorted(self.poolers_by_task))
            raise ValueError(f"Unsupported task: {task!r}; this model supports {supported}")
        return cast(Pooler, self.poolers_by_task[task])

    def forward(self, hidden_states: torch.Tensor, metadata: PoolingMetadata) -> PoolerOutput:
        tasks = metadata.tasks
        if not tasks:
            return []
        if all(t == tasks[0] for t in tasks):
            return self.pooler_for(tasks[0])(hidden_states, metadata)
        outputs: list[torch.Tensor | None] = []
        start = 0
        # Run-length grouping, not a sort: each run is pooled together and outputs keep batch order.
        for task, run in groupby(tasks):
            end = start + sum(1 for _ in run)
            lo, hi = metadata.cursor.token_range(start, end)
            result = self.pooler_for(task)(hidden_states[lo:hi], metadata.slice(start, end))
            outputs.extend(list(result))
            start = end
        return outputs


def pooler_for_embed(
    pooler_config: PoolerConfig,
    projector: nn.Module | None = None,
    head_dtype: torch.dtype | None = None,
    default_pooling_type: str = "MEAN",
) -> SequencePooler:
    """Sequence pooling + embedding head (projector, Matryoshka slice, normalize)."""
    method = get_seq_pooling_method(
        pooler_config.seq_pooling_type or default_pooling_type, pooler_config.include_prompt
    )
    head = EmbeddingPoolerHead(projector=projector, head_dtype=head_dtype, activation=PoolerNormalize())
    return SequencePooler(method, head)


def pooler_for_classify(
    pooler_config: PoolerConfig,
    classifier: nn.Module | None,
    activation: PoolerActivation | None = None,
    head_dtype: torch.dtype | None = None,
    default_pooling_type: str = "CLS",
    num_labels: int | None = None,
) -> SequencePooler:
    """Sequence pooling + classifier head (calibration from the config, activation given or Classify)."""
    method = get_seq_pooling_method(pooler_config.seq_pooling_type or default_pooling_type)
    head = ClassifierPoolerHead(
        classifier=classifier,
        activation=activation if activation is not None else PoolerClassify(num_labels),
        logit_mean=pooler_config.logit_mean,
        logit_sigma=pooler_config.logit_sigma,
        head_dtype=head_dtype,
    )
    return SequencePooler(method, head)


def pooler_for_token_embed(
    pooler_config: PoolerConfig, projector: nn.Module | None = None, head_dtype: torch.dtype | None = None
) -> TokenPooler:
    """Token pooling (ALL/STEP) + token embedding head."""
    method = get_tok_pooling_method(pooler_config.tok_pooling_type or "ALL")
    return TokenPooler(method, TokenEmbeddingPoolerHead(projector=projector, head_dtype=head_dtype))


def pooler_for_token_classify(
    pooler_config: PoolerConfig,
    classifier: nn.Module | None,
    activation: PoolerActivation | None = None,
    head_dtype: torch.dtype | None = None,
) -> TokenPooler:
    """Token pooling (ALL/STEP) + token classifier head; the label count comes from the logits (dynamic)."""
    method = get_tok_pooling_method(pooler_config.tok_pooling_type or "ALL")
    head = TokenClassifierPoolerHead(
        classifier=classifier,
        activation=activation if activation is not None else PoolerClassify(None),
        logit_mean=pooler_config.logit_mean,
        logit_sigma=pooler_config.logit_sigma,
        head_dtype=head_dtype,
    )
    return TokenPooler(method, head)


def pool_empty(pooler: Pooler, params: PoolingParams, pooled_size: int, device: torch.device) -> torch.Tensor:
    """The result of a sequence with no tokens: a zero pooled vector through the pooler's head.

    sentence-transformers' masked mean (and weightedmean, mean_sqrt_len, lasttoken) of a row with no tokens is
    the zero vector, which its later modules (Dense, Normalize) then see; token tasks get an empty matrix.
    """
    head = getattr(pooler, "head", None)
    if head is None:
        raise RuntimeError(f"{type(pooler).__name__} cannot pool an empty sequence (no head)")
    metadata = PoolingMetadata.from_cu_seqlens([0, 0], [params])
    if isinstance(pooler, TokenPooler):
        return head.forward_chunk(torch.zeros(0, pooled_size, device=device), params)
    return next(iter(head(torch.zeros(1, pooled_size, device=device), metadata)))
