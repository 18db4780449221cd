"""A run into a store that SIGKILLs itself at a named step: `store_child.py URL SCENARIO WHEN:MODULE:ATTR:N`.

WHEN is before or after; MODULE:ATTR names a method (`embedcli.io.stores.postgres:PostgresStore._upsert`); the
process kills itself (SIGKILL: no cleanup, no exception handlers) before or after its Nth call."""

from __future__ import annotations

import importlib
import os
import signal
import sys
from typing import Any

from tests.stores.store_helpers import sync
from tests.stores.test_store_kill import scenario_corpus


def arm(spec: str) -> None:
    when, module, attr, nth = spec.split(":")
    owner_name, _, method = attr.rpartition(".")
    owner: Any = importlib.import_module(module)
    for part in owner_name.split("."):
        owner = getattr(owner, part)
    original = getattr(owner, method)
    calls = [0]

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if when == "before" and calls[0] == int(nth):
            os.kill(os.getpid(), signal.SIGKILL)
        result = original(*args, **kwargs)
        if when == "after" and calls[0] == int(nth):
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    setattr(owner, method, wrapped)


if __name__ == "__main__":
    url, scenario, spec = sys.argv[1:4]
    arm(spec)
    sync(url, scenario_corpus(scenario), batch=10, commit_every=2)
    sys.exit(0)
