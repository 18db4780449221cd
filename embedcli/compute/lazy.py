"""An engine built on first use: the run loop decides from the output's state whether there is work at all."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from embedcli.compute.options import RunStats


class LazyEngine:
    """Stands in for the engine `build()` makes (the model loads then) until the run loop `start`s it.

    Before that it reports no work done: a rerun that finds its output complete never builds it.
    """

    def __init__(self, build: Callable[[], Any], max_length: int, max_batch_tokens: int) -> None:
        self._build = build
        self._engine: Any = None
        self._idle_stats = RunStats()
        self._max_length = max_length
        self._max_batch_tokens = max_batch_tokens

    @property
    def stats(self) -> Any:
        """The engine's counters; zero before it is built."""
        return self._engine.stats if self._engine is not None else self._idle_stats

    @property
    def max_length(self) -> int:
        """The engine's token limit per sequence."""
        return self._engine.max_length if self._engine is not None else self._max_length

    @property
    def max_batch_tokens(self) -> int:
        """The token budget of one forward: it also sizes the run loop's batches, so it is known unbuilt."""
        return self._engine.max_batch_tokens if self._engine is not None else self._max_batch_tokens

    def start(self) -> None:
        """Build the engine (the model loads), once; the run loop calls it when the output needs work."""
        if self._engine is None:
            self._engine = self._build()

    def map(self, batches: Iterable[Sequence[Any]]) -> Iterator[Any]:
        """Map `batches` through the engine (built first if `start` was not called)."""
        self.start()
        return self._engine.map(batches)
