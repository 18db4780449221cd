"""A decoder's runner refuses, when it is built, a pooler that cannot carry a sequence across prefill slices."""

from __future__ import annotations

import pytest
import torch

from embedcli.compute.runner import Runner, RunnerOptions
from embedcli.pooling import DispatchPooler, PoolingConfigError
from embedcli.pooling.poolers import Pooler


class _WholeOnly(Pooler):
    """Serves embed on whole sequences only (declares no slice carrying, as SpladePooler)."""

    def get_supported_tasks(self) -> set[str]:
        return {"embed"}

    def forward(self, hidden_states: torch.Tensor, metadata):  # type: ignore[no-untyped-def]
        return hidden_states[metadata.cursor.last_token_indices]


def test_decoder_runner_refuses_a_pooler_that_cannot_carry_slices(tiny_loaded, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    model = tiny_loaded("llama")
    Runner(model, RunnerOptions(max_batch_tokens=64))  # the model's own pooler carries
    monkeypatch.setattr(model, "pooler", DispatchPooler({"embed": _WholeOnly()}))
    with pytest.raises(PoolingConfigError, match="chunked-prefill slices"):
        Runner(model, RunnerOptions(max_batch_tokens=64))
    # Without slicing, long sequences run whole (alone in a forward): nothing to carry.
    Runner(model, RunnerOptions(max_batch_tokens=64, chunked_prefill=False))


def test_encoder_runner_accepts_a_pooler_that_cannot_carry_slices(tiny_loaded, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    model = tiny_loaded("bert")
    monkeypatch.setattr(model, "pooler", DispatchPooler({"embed": _WholeOnly()}))
    Runner(model, RunnerOptions(max_batch_tokens=64))
