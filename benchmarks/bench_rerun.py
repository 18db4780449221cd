"""Reruns that cost what changed, flat memory, many small files (issue 24), with a tiny random model.

    python benchmarks/bench_rerun.py                      # 1,000,000 rows (the issue's figures)
    python benchmarks/bench_rerun.py --rows 100000        # a smaller check
    python benchmarks/bench_rerun.py --part rerun --format parquet

Every figure is one `embedcli embed` process (wall time from outside, peak RSS by /usr/bin/time, `--stats`
inside) on short rows (4-14 words) through a tiny random BERT (2 layers, hidden 32, sentence-transformers
layout, built here as the test suite builds it): the overheads of reading, keying, carrying over and writing
show, not the model. Parts:

- **rerun** (`--format`, default jsonl): a full run; the same command again (a no-op); `--incremental` with 1% of
  rows appended, and with 1% changed at random positions (each against the full output as `--previous`), with
  their forwards; a run killed (SIGKILL) once half its rows are committed, then resumed: the resumed run's
  `rows_read` (rows parsed from the input's text) against the rows left.
- **memory**: peak RSS of a whole run on `--rows` against a tenth of them, for a Parquet input written with one
  row group and for JSONL.
- **files**: `--files` one-row files against the same rows in one file: forwards and wall time.

Bars (issue 24): no-op rerun <= 2 s; 1% changed <= 3% of the full run's wall time, its forwards within 1.2x
of 1% appended; the resume reads no committed row; peak RSS within +10% from a tenth of the rows to all of
them; many files' forwards within 1.2x of one file's. Results: benchmarks/results/rerun.json (and stdout).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
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


def texts(rows: int, seed: int) -> list[str]:
    """`rows` short texts (4-14 words), the same for the same seed."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 14))) for _ in range(rows)]


def write_corpus(path: Path, ids: list[str], rows: list[str], fmt: str) -> Path:
    """Rows as JSONL, or Parquet with one row group (pyarrow's default writer for this size)."""
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"id": ids, "text": rows}), path, row_group_size=len(rows) or 1)
        return path
    with path.open("w", encoding="utf-8") as f:
        for i, t in zip(ids, rows, strict=True):
            f.write(json.dumps({"id": i, "text": t}) + "\n")
    return path


def tiny_model(folder: Path) -> Path:
    """The tiny sentence-transformers BERT of the test suite, built into `folder`."""
    sys.path.insert(0, str(ROOT))
    from tests.fixtures.tiny_models import build_legacy_st_model, build_tiny_model

    if (folder / "bert-st").is_dir():
        return folder / "bert-st"
    base = build_tiny_model("bert", folder / "bert")
    return build_legacy_st_model(base, folder / "bert-st")


def env(threads: int) -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1",
                PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def command(args: list[str], stats: Path, threads: int) -> list[str]:
    return [sys.executable, "-m", "embedcli", "embed", *args, "-q", "--dtype", "float32", "--threads", str(threads),
            "--stats", str(stats)]


def run(args: list[str], stats: Path, threads: int) -> dict:
    """One `embedcli embed` process: wall time, /usr/bin/time peak RSS, and its --stats."""
    timer = ["/usr/bin/time", "-f", "%M"] if Path("/usr/bin/time").exists() else []
    started = time.perf_counter()
    done = subprocess.run(timer + command(args, stats, threads), env=env(threads), capture_output=True, text=True,
                          check=False)
    wall = time.perf_counter() - started
    if done.returncode not in (0, 3):
        raise SystemExit(f"failed ({done.returncode}): {' '.join(args)}\n{done.stderr}")
    report = json.loads(stats.read_text())
    rss = int(done.stderr.strip().splitlines()[-1]) / 1024 if timer else report["peak_rss_mb"]
    keep = ("rows", "computed_rows", "carried_rows", "carried_unread_rows", "rows_read", "resumed_rows", "forwards",
            "seconds")
    return {"wall_seconds": round(wall, 3), "peak_rss_mb": round(rss, 1), **{k: report.get(k) for k in keep}}


def committed(out: Path) -> int:
    try:
        manifest = json.loads((Path(f"{out}.embedcli-staging") / "_embedcli" / "manifest.json").read_text())
        return int(manifest["records_done"])
    except (OSError, ValueError, KeyError):
        return 0


def killed_at_half(args: list[str], out: Path, rows: int, stats: Path, threads: int) -> int:
    """Start a run, SIGKILL it once half the rows are committed; the records it had committed."""
    proc = subprocess.Popen(command(args, stats, threads), env=env(threads), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    while proc.poll() is None and committed(out) < rows // 2:
        time.sleep(0.05)
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait()
    return committed(out)


def rerun_part(work: Path, model: Path, rows: int, fmt: str, threads: int) -> dict:
    ext = "parquet" if fmt == "parquet" else "jsonl"
    ids = [f"r{i}" for i in range(rows)]
    base = texts(rows, seed=1)
    corpus = write_corpus(work / f"corpus.{ext}", ids, base, fmt)
    m = ["-m", str(model)]
    full = work / "full-out.parquet"
    out: dict = {"rows": rows, "format": fmt, "threads": threads}
    print(f"rerun: full run, {rows:,} rows ({fmt}) ...", flush=True)
    out["full"] = run([str(corpus), *m, "-o", str(full)], work / "full.json", threads)
    print("rerun: the same command again ...", flush=True)
    out["noop"] = run([str(corpus), *m, "-o", str(full)], work / "noop.json", threads)
    k = max(1, rows // 100)
    appended = write_corpus(work / f"appended.{ext}", [*ids, *[f"a{i}" for i in range(k)]],
                            [*base, *texts(k, seed=2)], fmt)
    print(f"rerun: --incremental, {k:,} rows appended ...", flush=True)
    out["appended_1pct"] = run([str(appended), *m, "-o", str(work / "appended-out.parquet"), "--incremental",
                                "--previous", str(full)], work / "appended.json", threads)
    # the same new texts as the appended rows, at random places instead of at the end
    new = iter(texts(k, seed=2))
    where = set(random.Random(3).sample(range(rows), k))
    changed_texts = [next(new) if i in where else t for i, t in enumerate(base)]
    changed = write_corpus(work / f"changed.{ext}", ids, changed_texts, fmt)
    print(f"rerun: --incremental, {k:,} rows changed at random positions ...", flush=True)
    out["changed_1pct"] = run([str(changed), *m, "-o", str(work / "changed-out.parquet"), "--incremental",
                               "--previous", str(full)], work / "changed.json", threads)
    resumed_out = work / "resumed-out.parquet"
    args = [str(corpus), *m, "-o", str(resumed_out), "--shard-rows", str(max(1000, rows // 50))]
    print("rerun: a run killed at 50%, then resumed ...", flush=True)
    done = killed_at_half(args, resumed_out, rows, work / "killed.json", threads)
    resumed = run(args, work / "resumed.json", threads)
    out["resume_after_kill"] = {"committed_before": done, **resumed,
                                "same_bytes": resumed_out.read_bytes() == full.read_bytes()}
    full_wall = out["full"]["wall_seconds"]
    out["bars"] = {
        "noop_wall_le_2s": out["noop"]["wall_seconds"] <= 2.0,
        "changed_wall_pct_of_full": round(100 * out["changed_1pct"]["wall_seconds"] / full_wall, 2),
        "changed_le_3pct": out["changed_1pct"]["wall_seconds"] <= 0.03 * full_wall,
        "forwards_changed_vs_appended": round(out["changed_1pct"]["forwards"] / max(1, out["appended_1pct"]["forwards"]), 3),
        "forwards_within_1_2x": out["changed_1pct"]["forwards"] <= 1.2 * out["appended_1pct"]["forwards"],
        "resume_reads_no_committed_row": resumed["rows_read"] == rows - done and 0 < done < rows,
    }
    return out


def memory_part(work: Path, model: Path, rows: int, threads: int) -> dict:
    out: dict = {"threads": threads}
    small = max(1, rows // 10)
    for fmt in ("parquet", "jsonl"):
        ext = "parquet" if fmt == "parquet" else "jsonl"
        res = {}
        for n in (small, rows):
            corpus = write_corpus(work / f"mem-{n}.{ext}", [f"r{i}" for i in range(n)], texts(n, seed=4), fmt)
            target = work / f"mem-{n}-out.parquet"
            print(f"memory: {n:,} rows ({fmt}) ...", flush=True)
            res[str(n)] = run([str(corpus), "-m", str(model), "-o", str(target)], work / f"mem-{n}.json", threads)
            for p in (corpus, target, Path(f"{target}.embedcli-index.parquet")):
                p.unlink(missing_ok=True)
        ratio = res[str(rows)]["peak_rss_mb"] / res[str(small)]["peak_rss_mb"]
        out[fmt] = {"rows": [small, rows], "runs": res, "rss_ratio": round(ratio, 4), "within_10pct": ratio <= 1.10}
    return out


def files_part(work: Path, model: Path, files: int, threads: int) -> dict:
    folder = work / "files"
    folder.mkdir(exist_ok=True)
    rows = texts(files, seed=5)
    for i, t in enumerate(rows):
        (folder / f"f{i:06d}.jsonl").write_text(json.dumps({"id": f"f{i}", "text": t}) + "\n", encoding="utf-8")
    one = write_corpus(work / "one.jsonl", [f"f{i}" for i in range(files)], rows, "jsonl")
    m = ["-m", str(model)]
    print(f"files: {files:,} one-row files ...", flush=True)
    many = run([str(folder / "*.jsonl"), *m, "-o", str(work / "many.parquet")], work / "many.json", threads)
    print("files: the same rows in one file ...", flush=True)
    single = run([str(one), *m, "-o", str(work / "one.parquet")], work / "one.json", threads)
    return {"files": files, "many_files": many, "one_file": single,
            "forwards_ratio": round(many["forwards"] / max(1, single["forwards"]), 3),
            "within_1_2x": many["forwards"] <= 1.2 * single["forwards"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=["all", "rerun", "memory", "files"], default="all")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--format", choices=["jsonl", "parquet"], default="jsonl")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--output", default=str(Path(__file__).parent / "results" / "rerun.json"))
    args = parser.parse_args()
    base = Path(args.workdir or tempfile.mkdtemp(prefix="embedcli-rerun-"))
    base.mkdir(parents=True, exist_ok=True)
    model = tiny_model(base / "models")  # kept in --workdir for the next run
    work = Path(tempfile.mkdtemp(prefix="run-", dir=base))
    report: dict = {"load_before": os.getloadavg()}
    if args.part in ("all", "rerun"):
        report[f"rerun_{args.format}"] = rerun_part(work, model, args.rows, args.format, args.threads)
    if args.part in ("all", "memory"):
        report["memory"] = memory_part(work, model, args.rows, args.threads)
    if args.part in ("all", "files"):
        report["files"] = files_part(work, model, args.files, args.threads)
    report["load_after"] = os.getloadavg()
    path = Path(args.output)
    path.parent.mkdir(exist_ok=True)
    previous = json.loads(path.read_text()) if path.is_file() else {}
    path.write_text(json.dumps({**previous, **report}, indent=2))  # one part run keeps the others' figures
    print(json.dumps(report, indent=2))
    shutil.rmtree(work if args.workdir else base, ignore_errors=True)


if __name__ == "__main__":
    main()
