"""A block of request lines in, its units out, and after compute its output lines in input order."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from embedcli.batchapi.requests import BadLine, BatchRequest, SeenIds, parse_line
from embedcli.batchapi.responses import ResponseContext, dumps, error_line, response_line
from embedcli.batchapi.served import ServedModel
from embedcli.batchapi.units import FlatUnits, UnitResult, flatten, reassemble


@dataclass(frozen=True)
class Chunk:
    """Parsed lines of one block (valid and bad, in input order) and the units of the valid ones."""

    items: tuple[BatchRequest | BadLine, ...]
    flat: FlatUnits

    @property
    def requests(self) -> tuple[BatchRequest, ...]:
        """The valid requests, in input order (the order of `flat.spans`)."""
        return tuple(x for x in self.items if isinstance(x, BatchRequest))

    @property
    def bad(self) -> tuple[BadLine, ...]:
        """The bad lines, in input order."""
        return tuple(x for x in self.items if isinstance(x, BadLine))


def read_chunk(lines: Iterable[tuple[int, str]], model: ServedModel, seen: SeenIds | None = None) -> Chunk:
    """Parse `(line number, text)` pairs (blank lines skipped) and flatten the valid requests' units.

    `seen`: custom_ids already claimed (from `scan_custom_ids` over the whole file); by default only this
    chunk's lines are compared with each other.
    """
    seen = seen if seen is not None else SeenIds()
    items = tuple(parse_line(text, number, model, seen) for number, text in lines if text.strip())
    return Chunk(items, flatten([x for x in items if isinstance(x, BatchRequest)]))


def write_chunk(chunk: Chunk, results: Sequence[UnitResult], ctx: ResponseContext) -> list[str]:
    """Output lines (no newlines), one per item in input order, from the results of `chunk.flat.units`."""
    per_request = iter(reassemble(chunk.flat, results))
    return [
        dumps(response_line(x, next(per_request), ctx) if isinstance(x, BatchRequest) else error_line(x, ctx))
        for x in chunk.items
    ]
