"""Shared setup for the pooling-core unit tests (reference maths live in `pooling_reference.py`)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed() -> None:
    """Every test sees the same random tensors, whatever order the tests run in."""
    torch.manual_seed(0)
