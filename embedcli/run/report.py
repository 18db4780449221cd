"""What a run tells people and cron: notes, bad rows shown, the closing summary, `--stats` and `--errors-file`."""

from __future__ import annotations

import json
import resource
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from embedcli.errors import InputError, OutputError
from embedcli.io.objects import write_whole
from embedcli.run.progress import Progress

ERRORS_SHOWN = 5


def peak_rss_mb() -> float:
    """Peak resident memory of this process in MiB."""
    # Linux keeps ru_maxrss across exec: a run started by a big process (a benchmark or test that has loaded
    # torch) would report its parent's peak. /proc's VmHWM is this process's own.
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except (OSError, ValueError, IndexError):
        pass
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def write_stats(path: str | None, report: dict[str, Any]) -> None:
    """Write a `--stats` report (JSON) atomically; a failure is noted on stderr, never fatal."""
    if not path:
        return
    try:
        write_whole(path, json.dumps(report, indent=2).encode("utf-8"))
    except OSError as e:
        print(f"embedcli: cannot write --stats {path}: {e.strerror or e}", file=sys.stderr)
    except OutputError as e:  # a store that refused the object
        print(f"embedcli: cannot write --stats {path}: {e.reason}", file=sys.stderr)


@dataclass
class RunReport:
    """Counters of one run and the notes it prints (through the progress bar when there is one)."""

    quiet: bool = False
    started: float = field(default_factory=time.perf_counter)
    seconds: dict[str, float] = field(default_factory=lambda: {"read": 0.0, "write": 0.0, "finalize": 0.0})
    computed_rows: int = 0
    carried_rows: int = 0
    carried_unread: int = 0  # of carried_rows: taken over without reading their text (blocks, files, row groups)
    rows_read: int = 0  # rows parsed from the inputs' text (a resume reads none of the committed ones)
    new_errors: int = 0
    shown_errors: int = 0
    resumed_records: int = 0
    records_done: int = 0
    total: int | None = None
    rows: int | None = None  # rows in the output once it is final
    skipped: int | None = None  # bad rows of the whole output once it is final
    shards: int = 0
    exit_code: int | None = None
    error: str | None = None
    progress: Progress | None = None

    def note(self, message: str) -> None:
        """A one-line note on stderr; nothing when quiet."""
        if self.progress is not None:
            self.progress.note(message)
        elif not self.quiet:
            print(f"embedcli: {message}", file=sys.stderr, flush=True)

    def start_progress(self, initial: int, log_every: float) -> Progress:
        """The progress display of the loop, counting from `initial` records (resumed)."""
        self.progress = Progress(self.total, initial=initial, quiet=self.quiet, log_every=log_every)
        return self.progress

    def bad_rows(self, errors: list[InputError]) -> None:
        """Count skipped rows and show the first few."""
        self.new_errors += len(errors)
        for e in errors:
            if self.shown_errors < ERRORS_SHOWN:
                self.note(f"skipped: {e}")
            elif self.shown_errors == ERRORS_SHOWN:
                self.note("skipped more bad rows (not shown); see --errors-file / --stats")
            self.shown_errors += 1

    def summary(self, engine: Any, skipped: int, rows: int, errors_file: str | None) -> None:
        """The closing notes: truncated rows, skipped rows, and what was done."""
        stats = engine.stats
        if stats.truncated_rows:
            self.note(f"{stats.truncated_rows} of {stats.rows} rows were truncated to {engine.max_length} tokens")
        if skipped:
            where = f"see {errors_file}" if errors_file else "pass --errors-file FILE to list them"
            self.note(f"{skipped:,} bad input rows were skipped ({where}); exit code 3")
        elapsed = time.perf_counter() - self.started
        parts = [f"{rows:,} rows written", f"{self.computed_rows:,} computed"]
        if self.carried_rows:
            parts.append(f"{self.carried_rows:,} carried over")
        if self.resumed_records:
            parts.append(f"{self.resumed_records:,} resumed")
        self.note(f"done: {', '.join(parts)} in {elapsed:.1f}s")

    def write_errors_file(self, path: str | None, records: Iterable[dict[str, Any]]) -> None:
        """Every bad row of the output, one JSON line each, written atomically to `--errors-file`; with no bad
        row the file is not touched (an unrelated file of that name is never truncated)."""
        if not path:
            return
        data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
        if not data:
            return
        try:
            write_whole(path, data.encode("utf-8"))
        except OSError as e:
            self.note(f"cannot write --errors-file {path}: {e.strerror or e}")
        except OutputError as e:
            self.note(f"cannot write --errors-file {path}: {e.reason}")

    def to_stats(self, engine_stats: Any) -> dict[str, Any]:
        """The `--stats` report of this run."""
        stats = engine_stats
        return {
            "rows": self.rows or 0,
            "input_rows": self.records_done,
            "computed_rows": self.computed_rows,
            "carried_rows": self.carried_rows,
            "carried_unread_rows": self.carried_unread,
            "rows_read": self.rows_read,
            "skipped_rows": self.skipped if self.skipped is not None else self.new_errors,
            "resumed_rows": self.resumed_records,
            "tokens": stats.tokens,
            "forwards": stats.forwards,
            "batches": getattr(stats, "batches", 0),
            "truncated_rows": stats.truncated_rows,
            "chunked_rows": stats.chunked_rows,
            "sliced_rows": getattr(stats, "sliced_rows", 0),
            "solo_rows": getattr(stats, "solo_rows", 0),
            "shards": self.shards,
            "seconds": {
                "read": round(self.seconds["read"], 4),
                **stats.to_dict()["seconds"],
                "write": round(self.seconds["write"], 4),
                "finalize": round(self.seconds["finalize"], 4),
                "total": round(time.perf_counter() - self.started, 4),
            },
            "peak_rss_mb": peak_rss_mb(),
            "exit_code": self.exit_code,
            **({"error": self.error} if self.error else {}),
        }
