"""Progress for people and for cron: a tqdm bar on a terminal, throttled plain lines otherwise, all on stderr."""

from __future__ import annotations

import sys
import time
from typing import IO, Any


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    if h:
        return f"{h}h{m:02d}m"
    if m:
        return f"{m}m{s:02d}s"
    return f"{s}s"


def _rate(n: float) -> str:
    return f"{n:,.0f}" if n >= 10 else f"{n:.1f}"


class Progress:
    """Rows done (with tokens/s and an ETA when the total is known) on stderr.

    On a terminal: a tqdm bar. Otherwise: one plain line every `log_every` seconds (cron logs stay
    readable) and a last line at the end. `quiet` shows nothing. `initial` counts rows done by an
    earlier, interrupted run (they are not part of the rates).
    """

    def __init__(
        self,
        total: int | None = None,
        *,
        initial: int = 0,
        quiet: bool = False,
        log_every: float = 30.0,
        stream: IO[str] | None = None,
        tty: bool | None = None,
        label: str = "rows",
    ) -> None:
        self.stream = stream or sys.stderr
        self.total = total
        self.initial = initial
        self.done = initial
        self.tokens = 0
        self.quiet = quiet
        self.log_every = max(0.0, float(log_every))
        self.label = label
        self.tty = self.stream.isatty() if tty is None else tty
        self.started = time.monotonic()
        self._last_line = self.started
        self._bar: Any = None
        if not quiet and self.tty:
            from tqdm import tqdm  # a terminal's bar only (~15 ms to import)

            self._bar = tqdm(
                total=total,
                initial=initial,
                unit=label,
                file=self.stream,
                mininterval=0.2,
                dynamic_ncols=True,
                smoothing=0.1,
            )

    def note(self, message: str) -> None:
        """A one-line note on stderr (kept clear of the bar); nothing when quiet."""
        if self.quiet:
            return
        if self._bar is not None:
            self._bar.write(f"embedcli: {message}", file=self.stream)
        else:
            print(f"embedcli: {message}", file=self.stream, flush=True)

    def update(self, rows: int, tokens: int = 0) -> None:
        """Count `rows` more rows and the running token total `tokens` of this run."""
        self.done += rows
        self.tokens = tokens
        if self.quiet:
            return
        if self._bar is not None:
            self._bar.update(rows)
            elapsed = time.monotonic() - self.started
            if elapsed > 0 and tokens:
                self._bar.set_postfix_str(f"{_rate(tokens / elapsed)} tok/s", refresh=False)
            return
        now = time.monotonic()
        if now - self._last_line >= self.log_every:
            self._last_line = now
            print(f"embedcli: {self.line(now)}", file=self.stream, flush=True)

    def line(self, now: float | None = None) -> str:
        """The plain progress line: rows done[/total (pct)], rows/s, tokens/s, ETA."""
        now = time.monotonic() if now is None else now
        elapsed = max(now - self.started, 1e-9)
        rate = (self.done - self.initial) / elapsed
        parts = []
        if self.total:
            pct = 100.0 * self.done / self.total
            parts.append(f"{self.done:,}/{self.total:,} {self.label} ({pct:.1f}%)")
        else:
            parts.append(f"{self.done:,} {self.label}")
        parts.append(f"{_rate(rate)} {self.label}/s")
        if self.tokens:
            parts.append(f"{_rate(self.tokens / elapsed)} tok/s")
        if self.total and rate > 0 and self.done < self.total:
            parts.append(f"ETA {_duration((self.total - self.done) / rate)}")
        parts.append(f"elapsed {_duration(elapsed)}")
        return " · ".join(parts)

    def close(self, summary: str | None = None) -> None:
        """Close the bar (or print the last plain line) and an optional summary note."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if summary:
            self.note(summary)
