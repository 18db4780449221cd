"""Model tests run single-threaded (see `torch_single_thread`); the real-model module picks its own count."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _single_thread(torch_single_thread) -> None:  # type: ignore[no-untyped-def]
    """Every test here runs with one torch thread unless it sets its own."""
