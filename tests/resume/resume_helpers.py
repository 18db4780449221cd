"""Helpers of the unattended-run tests: corpora, real `embedcli` processes, stats and leftovers."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

WORDS = (
    "the of and to in is was for on that with as by at it from market shares rise after bank talks film won "
    "best album award uk chart quick brown fox jumps lazy dog hello short text word sentence packed batch token"
).split()


def corpus_rows(n: int, seed: int = 0, prefix: str = "d") -> list[dict]:
    """`n` rows {"id", "text"} of 3-30 words, the same for the same seed."""
    rng = random.Random(seed)
    return [
        {"id": f"{prefix}{i}", "text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 30)))}
        for i in range(n)
    ]


def write_jsonl(path: Path, rows: Sequence[dict]) -> Path:
    """Rows as JSON Lines."""
    with path.open("w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return path


def subprocess_env() -> dict[str, str]:
    """Environment of a real `embedcli` process: offline, one thread, float32."""
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        EMBEDCLI_DTYPE="float32",
        PYTHONUNBUFFERED="1",
    )
    return env


def embed_argv(*args: object) -> list[str]:
    """argv of `python -m embedcli embed ARGS`."""
    return [sys.executable, "-m", "embedcli", "embed", *map(str, args)]


def run_embed_process(*args: object, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run `embedcli embed` to the end in a real process."""
    return subprocess.run(
        embed_argv(*args), env=subprocess_env(), capture_output=True, text=True, timeout=timeout, check=False
    )


def read_stats(path: Path) -> dict:
    """A `--stats` report."""
    return json.loads(path.read_text(encoding="utf-8"))


def leftovers(directory: Path) -> list[str]:
    """Temp files and staging areas left in a directory."""
    return sorted(p.name for p in directory.iterdir() if ".tmp-" in p.name or p.name.endswith(".embedcli-staging"))
