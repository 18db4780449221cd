"""SIGINT/SIGTERM/SIGHUP handling for unattended runs: commit the batches written, exit 130, within seconds.

Two layers:

- `terminate_as_interrupt()` (for a whole command): SIGTERM raises KeyboardInterrupt like SIGINT does,
  so a run stopped by `kill` or a service manager before any work started still exits 130, not 143.
- `StopFlag` (for the compute loop): the first SIGINT/SIGTERM sets a flag that the loop checks between
  batches, or, while the loop waits for the engine's next result, stops the wait at once (`StopNow`); the
  loop then commits what is written and stops. A second signal interrupts at once.

Handlers can only be installed from the main thread; elsewhere both are no-ops.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

# SIGHUP (the terminal or ssh session went away) stops a run as SIGTERM does: commit, exit 130.
_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Within the block SIGTERM and SIGHUP behave like SIGINT (KeyboardInterrupt), so all map to exit 130."""
    if not _main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, _raise_interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class StopNow(KeyboardInterrupt):
    """A signal arrived while the loop was waiting for a result: the batch in hand is dropped, not committed."""


class StopFlag:
    """Context manager: SIGINT/SIGTERM set `requested` (checked between batches); a second one interrupts.

    Inside `waiting()` (the loop waiting for the engine's next result, which takes as long as a batch takes
    on the model, or as long as a pipe stays quiet) a signal raises `StopNow` at once instead: what was
    written is committed and the unfinished batch is recomputed by the rerun, so a stop takes seconds.
    """

    def __init__(self) -> None:
        self.requested = False
        self.signal_name: str | None = None
        self._previous: dict[int, Any] = {}
        self._waiting = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            raise KeyboardInterrupt(signal.Signals(signum).name)
        self.requested = True
        self.signal_name = signal.Signals(signum).name
        if self._waiting:
            self._waiting = False
            raise StopNow(self.signal_name)

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        """Within the block a first signal raises `StopNow` instead of waiting for the block to end."""
        if self.requested:
            raise StopNow(self.signal_name)
        self._waiting = True
        try:
            yield
        finally:
            self._waiting = False

    def request(self, name: str = "request") -> None:
        """Ask the loop to stop, as a signal would (for tests and callers without signals)."""
        self.requested = True
        self.signal_name = name

    def __enter__(self) -> StopFlag:
        if _main_thread():
            for sig in _SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
