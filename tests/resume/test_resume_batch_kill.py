"""Acceptance: a real `embedcli run-batch` over a mixed request file of 2,000 lines (every route the embedding model serves,
and bad lines), killed with SIGKILL at three moments and rerun, writes the bytes of an uninterrupted run."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from resume_helpers import WORDS, leftovers, subprocess_env

REQUESTS = 2_000
SHARD_ROWS = 50
KILLS = 3


def _text(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 30)))


def mixed_lines(n: int, seed: int = 3) -> list[str]:
    """`n` request lines: mostly one-text embeddings, then every other route, and a bad line now and then."""
    rng = random.Random(seed)
    lines = []
    for i in range(n):
        kind = rng.random()
        cid = f"req-{i}"
        if i % 250 == 7:
            lines.append('{"custom_id": "broken", ')  # malformed JSON
            continue
        if i % 250 == 8:
            cid = "req-0"  # a duplicate custom_id
        if kind < 0.6:
            url, body = "/v1/embeddings", {"input": _text(rng)}
        elif kind < 0.7:
            url, body = "/v1/embeddings", {"input": [_text(rng), _text(rng)], "encoding_format": "base64"}
        elif kind < 0.78:
            url, body = "/v2/embed", {"texts": [_text(rng), _text(rng)], "embedding_types": ["float", "int8", "binary"]}
        elif kind < 0.86:
            url, body = "/v1/score", {"text_1": _text(rng), "text_2": [_text(rng), _text(rng)]}
        elif kind < 0.94:
            url, body = "/rerank", {"query": _text(rng), "documents": [_text(rng) for _ in range(3)], "top_n": 2}
        else:
            url, body = "/pooling", {"input": _text(rng), "task": "token_embed"}
        lines.append(json.dumps({"custom_id": cid, "method": "POST", "url": url, "body": body}))
    return lines


def _argv(src: Path, model: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "embedcli", "run-batch", str(src), "-m", str(model), "-o", str(out),
            "--shard-rows", str(SHARD_ROWS), "-q"]


def _committed(out: Path) -> int:
    manifest = Path(f"{out}.embedcli-staging") / "_embedcli" / "manifest.json"
    try:
        return int(json.loads(manifest.read_text())["records_done"])
    except (OSError, ValueError, KeyError):
        return -1 if not out.exists() else REQUESTS


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, st_model: Path) -> dict:
    root = tmp_path_factory.mktemp("batch-kill")
    src = root / "requests.jsonl"
    src.write_text("".join(x + "\n" for x in mixed_lines(REQUESTS)), encoding="utf-8")
    ref = root / "reference.jsonl"
    started = time.monotonic()
    done = subprocess.run(_argv(src, st_model, ref), env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 3, done.stderr  # the bad lines were answered with 400s
    return {"root": root, "src": src, "ref": ref, "wall": time.monotonic() - started}


def test_reference_answers_every_line_in_order(reference: dict) -> None:
    out = [json.loads(x) for x in reference["ref"].read_text(encoding="utf-8").splitlines()]
    assert len(out) == REQUESTS
    bad = [i for i, x in enumerate(out) if x["response"]["status_code"] == 400]
    assert bad and all(i % 250 in (7, 8) for i in bad)
    assert all(x["custom_id"] == f"req-{i}" for i, x in enumerate(out) if i not in bad)


def test_sigkill_three_times_resumes_to_the_same_bytes(reference: dict, st_model: Path) -> None:
    rng = random.Random(11)
    out = reference["root"] / "killed.jsonl"
    kills = []
    while len(kills) < KILLS:
        before = _committed(out)
        proc = subprocess.Popen(_argv(reference["src"], st_model, out), env=subprocess_env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while proc.poll() is None and _committed(out) <= before and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(rng.uniform(0, max(0.05, reference["wall"] / 20)))
        if proc.poll() is not None:
            break
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
        kills.append((before, _committed(out)))
    print(f"\nSIGKILL moments (committed before, committed after): {kills}")
    assert len(kills) == KILLS, f"the run finished after {len(kills)} kills: {kills}"
    assert any(0 < after < REQUESTS for _, after in kills), kills
    done = subprocess.run(_argv(reference["src"], st_model, out), env=subprocess_env(), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 3, done.stderr
    assert out.read_bytes() == reference["ref"].read_bytes(), "output differs from the uninterrupted run"
    assert leftovers(out.parent) == []
