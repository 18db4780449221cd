"""Requests flattened into one list of units (so many requests pack under one token budget) and back."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from embedcli.batchapi.requests import BatchRequest, Unit


@dataclass(frozen=True)
class UnitResult:
    """What the engine computed for one unit, and the prompt tokens it took (for `usage`).

    `value`: a `[dim]` float vector (embed), a `[labels]` vector of probabilities or logits (classify),
    a `[tokens, dim]` / `[tokens, labels]` matrix (token tasks), or a float (score: the pair's score).
    """

    value: Any
    tokens: int


@dataclass(frozen=True)
class FlatUnits:
    """All units of a run of requests, in request order, and where each request's units lie."""

    units: tuple[Unit, ...]
    spans: tuple[tuple[int, int], ...]  # per request: [start, stop) into `units`

    def __len__(self) -> int:
        return len(self.units)


def flatten(requests: Sequence[BatchRequest]) -> FlatUnits:
    """The units of `requests`, concatenated in order."""
    units: list[Unit] = []
    spans: list[tuple[int, int]] = []
    for request in requests:
        start = len(units)
        units.extend(request.units)
        spans.append((start, len(units)))
    return FlatUnits(tuple(units), tuple(spans))


def reassemble(flat: FlatUnits, results: Sequence[UnitResult]) -> list[list[UnitResult]]:
    """Per request, its units' results (`results` is in the order of `flat.units`)."""
    if len(results) != len(flat.units):
        raise ValueError(f"{len(results)} results for {len(flat.units)} units")
    return [list(results[start:stop]) for start, stop in flat.spans]
