"""`--threads N` / `EMBEDCLI_THREADS` (issue 24, item 4) through the CLI on tiny models: every compute command
takes it and sets torch's intra-op threads for its forward passes; the numbers agree to float32 rounding (not
bitwise) and the config hash does not change, so a rerun with another count finds its output complete; the console
entry makes OpenMP wait passively."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

COMMANDS = ("embed", "classify", "score", "rerank", "search", "token-embed", "token-classify", "sparse-embed",
            "run-batch")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory, st_model: Path, tiny_model: Callable[[str], Path]) -> dict[str, str]:
    """Rows, pairs, a run-batch request file, a vectors file, a tiny sequence and token classifier."""
    import torch
    import transformers
    from typer.testing import CliRunner

    from embedcli.cli import app

    root = tmp_path_factory.mktemp("threads")
    rows = root / "rows.jsonl"
    texts = ["hello world", "the bank raised rates", "a striker scored twice in the final", "x"]
    rows.write_text("".join(json.dumps({"id": f"r{i}", "text": t, "left": "rates", "right": t}) + "\n"
                            for i, t in enumerate(texts)), encoding="utf-8")
    requests = root / "requests.jsonl"
    body = {"model": st_model.name, "input": "hello"}  # the served name: the folder's
    requests.write_text(json.dumps({"custom_id": "r", "method": "POST", "url": "/v1/embeddings", "body": body}) + "\n")
    vectors = root / "vectors.parquet"
    made = CliRunner().invoke(app, ["embed", str(rows), "-o", str(vectors), "-m", str(st_model), "-q"],
                              env={"EMBEDCLI_DTYPE": "float32"})
    assert made.exit_code == 0, made.stderr
    bert = tiny_model("bert")
    out = {"rows": str(rows), "requests": str(requests), "vectors": str(vectors), "st": str(st_model)}
    for name, cls in (("classifier", "BertForSequenceClassification"), ("tagger", "BertForTokenClassification")):
        torch.manual_seed(0)
        getattr(transformers, cls).from_pretrained(str(bert), num_labels=3).save_pretrained(str(root / name))
        for f in ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
            if (bert / f).is_file():
                (root / name / f).write_bytes((bert / f).read_bytes())
        out[name] = str(root / name)
    return out


def _args(command: str, f: dict[str, str], out: Path) -> list[str]:
    return {
        "embed": ["embed", f["rows"], "-m", f["st"], "-o", str(out / "e.parquet")],
        "classify": ["classify", f["rows"], "-m", f["classifier"], "-o", str(out / "c.parquet")],
        "score": ["score", f["rows"], "-m", f["st"], "-o", str(out / "s.parquet")],
        "rerank": ["rerank", f["rows"], "--query", "rates", "-m", f["st"], "-o", str(out / "r.parquet")],
        "search": ["search", f["vectors"], "--query", "rates", "-m", f["st"], "-o", str(out / "h.parquet")],
        "token-embed": ["token-embed", f["rows"], "-m", f["st"], "-o", str(out / "t.parquet")],
        "token-classify": ["token-classify", f["rows"], "-m", f["tagger"], "-o", str(out / "tc.parquet")],
        "run-batch": ["run-batch", f["requests"], "-m", f["st"], "-o", str(out / "b.jsonl")],
    }[command]


@pytest.mark.parametrize("command", [c for c in COMMANDS if c != "sparse-embed"])  # sparse-embed: see the help test
@pytest.mark.parametrize(("flag", "env", "threads"), [(["--threads", "3"], {}, 3), ([], {"EMBEDCLI_THREADS": "2"}, 2)])
def test_threads_set_torch_intra_op_threads(cli, files, tmp_path, command, flag, env, threads):  # type: ignore[no-untyped-def]
    import torch

    torch.set_num_threads(1)
    cli(*_args(command, files, tmp_path), *flag, "-q", env=env)
    assert torch.get_num_threads() == threads


def test_outputs_and_config_do_not_depend_on_threads(cli, files, tmp_path):  # type: ignore[no-untyped-def]
    from embedcli.io.writers import embedding_matrix

    one, two = tmp_path / "one.parquet", tmp_path / "two.parquet"
    cli("embed", files["rows"], "-m", files["st"], "-o", one, "--threads", 1, "-q")
    cli("embed", files["rows"], "-m", files["st"], "-o", two, "--threads", 2, "-q")
    a, b = (pq.read_table(p) for p in (one, two))
    x, y = embedding_matrix(a.column("embedding")), embedding_matrix(b.column("embedding"))
    # not bitwise: oneDNN splits a matmul's sums by thread count (this model: last bits of a few values differ)
    print("max |1 thread - 2 threads|:", float(np.abs(x - y).max()), "bit-identical:", np.array_equal(x, y))
    np.testing.assert_allclose(x, y, rtol=0, atol=1e-6)
    meta = [pq.read_schema(p).metadata for p in (one, two)]
    assert meta[0][b"embedcli.config_hash"] == meta[1][b"embedcli.config_hash"]
    assert b"threads" not in meta[0][b"embedcli.config"]
    # the output made with 1 thread is this run's output with 2: a rerun finds it complete (exit 0, not 2)
    done = cli("embed", files["rows"], "-m", files["st"], "-o", one, "--threads", 2)
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("command", COMMANDS)
def test_help_shows_threads_and_zero_is_refused(cli, files, tmp_path, command):  # type: ignore[no-untyped-def]
    shown = cli(command, "--help", env={"COLUMNS": "200"}).stdout
    assert "--threads" in shown and "EMBEDCLI_THREADS=1" in shown and "--threads 1" in shown
    args = _args(command, files, tmp_path) if command != "sparse-embed" else ["sparse-embed", files["rows"], "-o",
                                                                            str(tmp_path / "sp.parquet")]
    refused = cli(*args, "--threads", "0", code=2)
    assert refused.stderr.strip().splitlines() == ["embedcli: usage error: --threads 0: must be 1 or more (CPU threads of the forward passes)"]


@pytest.mark.parametrize(("given", "seen"), [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_console_entry_makes_openmp_wait_passively(given: str | None, seen: str) -> None:
    code = ("import os, sys\nfrom embedcli.cli import main\nsys.argv = ['embedcli', '--version']\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print(os.environ['OMP_WAIT_POLICY'], 'torch' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if given:
        env["OMP_WAIT_POLICY"] = given
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.split()[-2:] == [seen, "False"]  # set before torch (and its OpenMP runtime) loads
