"""Unattended-run benchmark (issue 5): memory does not grow with the corpus, and --incremental is cheap.

    python benchmarks/bench_memory.py                       # both parts, defaults below
    python benchmarks/bench_memory.py --part memory --big 1000000 --small 10000
    python benchmarks/bench_memory.py --part incremental --incremental-rows 100000 --model default

1. Memory: peak RSS of `embedcli embed` (a separate process each, measured by /usr/bin/time and by the
   run's own --stats) on N short rows vs 10,000 short rows. This uses a *tiny* random BERT (2 layers,
   hidden 32, sentence-transformers layout, built from tests/fixtures/tiny_models.py): a million rows
   through the real all-MiniLM-L6-v2 would take hours on two cores. What could grow with the corpus
   (duplicate-id set, manifest, shard index, readers, assembly) is the same whatever the model.
2. Incremental: a full run on a 100k-row corpus vs `--incremental --previous FULL` on an unchanged copy
   of that corpus (another file, so nothing short-circuits: every row is read, keyed, looked up and
   carried over), and the in-place rerun of the identical command (complete: nothing to do). With the
   real all-MiniLM-L6-v2 by default (`--model default`), or `--model tiny`.

Every process runs with OMP_NUM_THREADS=--threads and --dtype float32. The JSON report goes to
benchmarks/results/memory.json and the table to stdout.
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


def write_corpus(path: Path, rows: int, seed: int = 0) -> Path:
    """`rows` short rows (4-14 words) as JSONL."""
    rng = random.Random(seed)
    with path.open("w", encoding="utf-8") as f:
        for i in range(rows):
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 14)))
            f.write(json.dumps({"id": f"r{i}", "text": text}) + "\n")
    return path


def tiny_model(folder: Path) -> Path:
    """The tiny sentence-transformers BERT of the test suite, built into `folder`."""
    sys.path.insert(0, str(ROOT))
    from tests.fixtures.tiny_models import build_legacy_st_model, build_tiny_model

    base = build_tiny_model("bert", folder / "bert")
    return build_legacy_st_model(base, folder / "bert-st")


def run(args: list[str], threads: int, stats: Path) -> dict:
    """One `embedcli embed` process; returns its wall time, /usr/bin/time peak RSS and --stats."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    cmd = [sys.executable, "-m", "embedcli", "embed", *args, "-q", "--dtype", "float32", "--stats", str(stats)]
    timer = ["/usr/bin/time", "-f", "%M"] if Path("/usr/bin/time").exists() else []
    started = time.perf_counter()
    done = subprocess.run(timer + cmd, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}): {' '.join(cmd)}\n{done.stderr}")
    rss_kb = int(done.stderr.strip().splitlines()[-1]) if timer else None
    report = json.loads(stats.read_text())
    return {
        "wall_seconds": round(wall, 2),
        "peak_rss_mb": round(rss_kb / 1024, 1) if rss_kb else report["peak_rss_mb"],
        "self_reported_peak_rss_mb": report["peak_rss_mb"],
        "rows": report["rows"],
        "computed_rows": report["computed_rows"],
        "carried_rows": report["carried_rows"],
        "seconds": report["seconds"],
    }


def memory_part(work: Path, model: Path, small: int, big: int, threads: int) -> dict:
    out: dict = {"model": "tiny random BERT (2 layers, hidden 32, ST layout)", "threads": threads}
    for name, rows in (("small", small), ("big", big)):
        corpus = write_corpus(work / f"mem-{rows}.jsonl", rows, seed=1)
        print(f"memory: embedding {rows:,} rows ...", flush=True)
        out[name] = {"rows_in": rows, **run([str(corpus), "-m", str(model), "-o", str(work / f"mem-{rows}.parquet")],
                                            threads, work / f"mem-{rows}.json")}
        (work / f"mem-{rows}.parquet").unlink()
        corpus.unlink()
    out["rss_ratio_big_vs_small"] = round(out["big"]["peak_rss_mb"] / out["small"]["peak_rss_mb"], 4)
    out["within_15_percent"] = out["rss_ratio_big_vs_small"] <= 1.15
    return out


def incremental_part(work: Path, model: str | None, rows: int, threads: int) -> dict:
    corpus = write_corpus(work / "inc.jsonl", rows, seed=2)
    copy = work / "inc-copy.jsonl"
    shutil.copyfile(corpus, copy)
    model_args = ["-m", model] if model else []
    full = work / "inc-full.parquet"
    print(f"incremental: full run on {rows:,} rows ({model or 'all-MiniLM-L6-v2'}) ...", flush=True)
    r_full = run([str(corpus), *model_args, "-o", str(full)], threads, work / "inc-full.json")
    print("incremental: --incremental on an unchanged copy ...", flush=True)
    r_inc = run([str(copy), *model_args, "-o", str(work / "inc-new.parquet"), "--incremental", "--previous", str(full)],
                threads, work / "inc-new.json")
    print("incremental: the same command again (in place, complete) ...", flush=True)
    r_same = run([str(corpus), *model_args, "-o", str(full), "--incremental"], threads, work / "inc-same.json")
    return {
        "model": model or "sentence-transformers/all-MiniLM-L6-v2",
        "rows": rows,
        "threads": threads,
        "full": r_full,
        "incremental_unchanged_copy": r_inc,
        "rerun_in_place": r_same,
        "incremental_vs_full_wall": round(r_inc["wall_seconds"] / r_full["wall_seconds"], 4),
        "rerun_vs_full_wall": round(r_same["wall_seconds"] / r_full["wall_seconds"], 4),
        "under_5_percent": r_inc["wall_seconds"] < 0.05 * r_full["wall_seconds"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=["all", "memory", "incremental"], default="all")
    parser.add_argument("--small", type=int, default=10_000)
    parser.add_argument("--big", type=int, default=1_000_000)
    parser.add_argument("--incremental-rows", type=int, default=100_000)
    parser.add_argument("--model", default="default", help="incremental part: default (all-MiniLM-L6-v2), tiny, or a path")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="embedcli-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    report: dict = {}
    tiny = None
    if args.part in ("all", "memory") or args.model == "tiny":
        tiny = tiny_model(work / "models")
    if args.part in ("all", "memory"):
        assert tiny is not None
        report["memory"] = memory_part(work, tiny, args.small, args.big, args.threads)
        m = report["memory"]
        print(f"memory: peak RSS {m['small']['peak_rss_mb']} MB for {args.small:,} rows, {m['big']['peak_rss_mb']} MB "
              f"for {args.big:,} rows: x{m['rss_ratio_big_vs_small']}", flush=True)
    if args.part in ("all", "incremental"):
        model = None if args.model == "default" else str(tiny) if args.model == "tiny" else args.model
        report["incremental"] = incremental_part(work, model, args.incremental_rows, args.threads)
        i = report["incremental"]
        print(f"incremental: full {i['full']['wall_seconds']}s, --incremental on an unchanged copy "
              f"{i['incremental_unchanged_copy']['wall_seconds']}s ({100 * i['incremental_vs_full_wall']:.1f}%), "
              f"rerun in place {i['rerun_in_place']['wall_seconds']}s", flush=True)
    results = Path(__file__).parent / "results"
    results.mkdir(exist_ok=True)
    path = results / "memory.json"
    previous = json.loads(path.read_text()) if path.is_file() else {}
    path.write_text(json.dumps({**previous, **report}, indent=2))  # one part run keeps the other's figures
    print(json.dumps(report, indent=2))
    if args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
