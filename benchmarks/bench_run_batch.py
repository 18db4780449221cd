"""`run-batch` over N single-text /v1/embeddings requests vs `embed` over the same N texts, same machine, same run.

    python benchmarks/bench_run_batch.py                 # 2,000 BBC sentences, all-MiniLM-L6-v2, 2 threads
    python benchmarks/bench_run_batch.py --requests 10000 --threads 4 --rounds 3

Each command runs as a real `embedcli` process (float32, `--threads`-many torch threads), alternating
embed / run-batch for `--rounds` rounds; the best of each is compared: the loop's own seconds (`--stats`
total: read, tokenize, compute, write, finalize) and the process wall time (plus start-up and model load).
Both write JSON lines (`embed -o out.jsonl`, with its vectors in shortest float form) so the comparison is
of the same work. Prints the table and the ratio run-batch / embed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from embedcli.bench import bbc_texts


def sentences(n: int) -> list[str]:
    """`n` distinct sentences of 5+ words from the BBC articles (short texts, as one-text requests are)."""
    out: list[str] = []
    seen: set[str] = set()
    for article in bbc_texts():
        for s in re.split(r"(?<=[.!?])\s+", article.replace("\n", " ")):
            s = s.strip()
            if len(s.split()) >= 5 and s not in seen:
                seen.add(s)
                out.append(s)
                if len(out) == n:
                    return out
    return out


def run(argv: list[str], env: dict[str, str], stats: Path) -> tuple[float, float]:
    """(wall seconds, the loop's --stats total seconds) of one embedcli process."""
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "embedcli", *argv, "-q", "--overwrite", "--stats", str(stats)],
                          env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"embedcli {argv[0]} exited {done.returncode}: {done.stderr}")
    return wall, json.loads(stats.read_text())["seconds"]["total"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--model", default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    texts = sentences(args.requests)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "EMBEDCLI_DTYPE": "float32",
           "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    model = ["-m", args.model] if args.model else []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        corpus, requests = root / "texts.jsonl", root / "requests.jsonl"
        corpus.write_text("".join(json.dumps({"id": f"r{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
        requests.write_text("".join(
            json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/embeddings", "body": {"input": t}}) + "\n"
            for i, t in enumerate(texts)
        ))
        commands = {
            "embed": ["embed", str(corpus), *model, "--prompt", "", "--no-strip", "-o", str(root / "embed.jsonl")],
            "run-batch": ["run-batch", str(requests), *model, "-o", str(root / "batch.jsonl")],
        }
        best: dict[str, tuple[float, float]] = {}
        for _ in range(args.rounds):
            for name, argv in commands.items():
                wall, loop = run(argv, env, root / f"{name}.stats.json")
                old = best.get(name)
                best[name] = (min(wall, old[0]), min(loop, old[1])) if old else (wall, loop)
    print(f"{len(texts)} texts / single-text requests, {args.threads} threads, best of {args.rounds} rounds")
    print(f"{'command':<10} {'loop s':>8} {'wall s':>8}")
    for name, (wall, loop) in best.items():
        print(f"{name:<10} {loop:8.2f} {wall:8.2f}")
    print(f"run-batch / embed: loop {best['run-batch'][1] / best['embed'][1]:.3f}, "
          f"wall {best['run-batch'][0] / best['embed'][0]:.3f}")


if __name__ == "__main__":
    main()
