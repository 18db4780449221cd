"""`run-batch --engine ray --workers 2` answers a mixed request file with the local engine's lines."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray")

WORDS = "the of and to in market shares rise bank film album award quick brown fox jumps lazy dog".split()


@pytest.fixture(scope="module", autouse=True)
def driver(ray_driver):  # type: ignore[no-untyped-def]
    """The in-process CLI runs of this module drive the session's two-node cluster."""
    return ray_driver


def _requests(path: Path, n: int = 120) -> Path:
    rng = random.Random(4)

    def text() -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 20)))

    routes = [
        lambda: ("/v1/embeddings", {"input": text()}),
        lambda: ("/v1/score", {"text_1": text(), "text_2": [text(), text()]}),
        lambda: ("/rerank", {"query": text(), "documents": [text(), text(), text()]}),
        lambda: ("/pooling", {"input": text(), "task": "token_embed"}),
    ]
    lines = []
    for i in range(n):
        url, body = routes[i % len(routes)]()
        lines.append(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": url, "body": body}))
    lines.insert(50, "{not json")
    path.write_text("".join(x + "\n" for x in lines))
    return path


def _numbers(value):  # type: ignore[no-untyped-def]
    """Every float in a response, in order (ids and shapes aside)."""
    if isinstance(value, float):
        return [value]
    if isinstance(value, list):
        return [x for v in value for x in _numbers(v)]
    if isinstance(value, dict):
        return [x for k, v in value.items() if k not in ("id", "created") for x in _numbers(v)]
    return []


def test_run_batch_under_ray_equals_the_local_engine(cli, st_model, tmp_path):  # type: ignore[no-untyped-def]
    src = _requests(tmp_path / "requests.jsonl")
    local, remote = tmp_path / "local.jsonl", tmp_path / "ray.jsonl"
    cli("run-batch", src, "-m", st_model, "-o", local, "-q", code=3)
    cli("run-batch", src, "-m", st_model, "-o", remote, "-q", "--engine", "ray", "--workers", 2, code=3)
    a = [json.loads(x) for x in local.read_text().splitlines()]
    b = [json.loads(x) for x in remote.read_text().splitlines()]
    assert len(a) == len(b) == 121
    for x, y in zip(a, b, strict=True):
        assert (x["custom_id"], x["response"]["status_code"]) == (y["custom_id"], y["response"]["status_code"])
        assert x["error"] == y["error"]
        # packing differs per piece, so vectors agree to float rounding (as the other commands under Ray)
        assert np.allclose(_numbers(x["response"]["body"]), _numbers(y["response"]["body"]), atol=1e-5)
