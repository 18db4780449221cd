"""A process's start without the cyclic garbage collector: off while modules import and the run plans, back on
(the start's objects frozen) once the work starts.

A start allocates a few million objects (typer and pydantic, numpy, pyarrow; torch alone ~2 M) and frees almost
none: the collector, run every 700 allocations and in full each time the heap grows by a quarter, found little
to free and cost 0.13-0.25 s of a static one-row run and ~1 s of a MiniLM one (its `gc.callbacks`, a loaded
2-core machine). Only the console script pauses it (`embedcli.cli.main`); the library leaves it as it is.
"""

from __future__ import annotations

import gc

_paused = False


def pause() -> None:
    """Turn the collector off for the start, if it is on."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def resume() -> None:
    """Once the work starts (a model built, a loop begun): the start's objects frozen, so that later collections
    never scan them again, and the collector back on; nothing when `pause` did not turn it off."""
    global _paused
    if _paused:
        _paused = False
        gc.freeze()
        gc.enable()
