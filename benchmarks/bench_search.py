"""Exact search over a 100k-vector Parquet file: peak memory follows the block size, not the file.

    python benchmarks/bench_search.py                      # 100,000 x 384 float32, 100 queries, top 10
    python benchmarks/bench_search.py --rows 1000000 --blocks 1024,8192

Writes a file of random unit vectors the way `embedcli embed` does (one row group per 1,024-row batch,
zstd) and searches it with `embedcli.retrieval` (the code behind `embedcli search`, minus the query
forward pass) for each block size, each in a fresh process; the figure is the process's peak RSS
(VmHWM) minus its RSS just before the search, beside what reading the whole vector column at once costs.
Results go to benchmarks/results/search.json and a table to stdout.

    python benchmarks/bench_search.py --bbc 60             # R@1: float32 vs int8 (default rescore 4, and off)

`--bbc N` instead runs the BBC headline -> article task of tests/search/test_search_bbc.py (the first N
articles of each topic, each stored as its first paragraph, the packaged all-MiniLM-L6-v2) through the
`embedcli embed` / `embedcli search` commands: R@1 and MRR@10 of float32, int8 with the default
rescoring (4 x top-k) and int8 with --rescore 0, to benchmarks/results/search_bbc.json.

    python benchmarks/bench_search.py --faiss --rows 1000000 --queries 1000 --threads 2

`--faiss` instead times exact float32 search against faiss's `IndexFlatIP` (faiss-cpu, a test dependency), each in
its own fresh process over the same Parquet file and queries: embedcli reads the file in blocks
(`parquet_vector_blocks`, the default block size) and keeps a running top-k; faiss reads the vector column whole,
adds it to the index and searches. Both clocks run from the first read to the last result (interpreter start
left out of both), best of `--rounds`, alternated; both must return the same top row for every query. To
benchmarks/results/search_faiss.json.
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


def _status_mb(key: str) -> float:
    with open("/proc/self/status", encoding="utf-8") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def make_file(path: str, rows: int, dim: int, precision: str) -> None:
    """Random unit vectors in `precision`, written in 1,024-row row groups like `embedcli embed`."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from embedcli.io.writers import embedding_array
    from embedcli.quantize import quantize

    rng = np.random.default_rng(0)
    writer = None
    ranges = np.vstack([np.full(dim, -0.2, np.float32), np.full(dim, 0.2, np.float32)])
    for start in range(0, rows, 1024):
        n = min(1024, rows - start)
        x = rng.standard_normal((n, dim)).astype(np.float32)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        table = pa.table({"id": pa.array([str(i) for i in range(start, start + n)]),
                          "embedding": embedding_array(quantize(x, precision, ranges))})
        if writer is None:
            writer = pq.ParquetWriter(path, table.schema, compression="zstd")
        writer.write_table(table)
    assert writer is not None
    writer.close()


def child(args: argparse.Namespace) -> None:
    """One measurement in this (fresh) process; prints a JSON line."""
    import numpy as np
    import pyarrow.parquet as pq

    from embedcli.io.writers import embedding_matrix
    from embedcli.retrieval import SearchSpace, parquet_vector_blocks, search_blocks

    rng = np.random.default_rng(1)
    queries = rng.standard_normal((args.queries, args.dim)).astype(np.float32)
    ranges = np.vstack([np.full(args.dim, -0.2, np.float32), np.full(args.dim, 0.2, np.float32)])
    space = SearchSpace(args.precision, args.dim, ranges if args.precision in ("int8", "uint8") else None)
    before = _status_mb("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:  # reset VmHWM to the current RSS
        f.write("5")
    start = time.perf_counter()
    if args.block == 0:  # the whole column at once, for contrast
        whole = embedding_matrix(pq.read_table(args.file, columns=["embedding"]).column(0))
        _, rows = search_blocks(queries, [whole], args.top_k, space)
    else:
        _, rows = search_blocks(queries, parquet_vector_blocks(args.file, args.block), args.top_k, space)
    seconds = time.perf_counter() - start
    peak = _status_mb("VmHWM")
    print(json.dumps({"block_rows": args.block or "whole file", "precision": args.precision,
                      "seconds": round(seconds, 3), "rss_before_mb": round(before, 1),
                      "peak_over_before_mb": round(peak - before, 1), "top_row": int(rows[0, 0])}))


def faiss_child(args: argparse.Namespace) -> None:
    """One timed search by `args.contender` (embedcli or faiss) in this (fresh) process; prints a JSON line."""
    import numpy as np

    rng = np.random.default_rng(1)
    queries = rng.standard_normal((args.queries, args.dim)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    if args.contender == "faiss":
        import faiss
        import pyarrow.parquet as pq

        from embedcli.io.writers import embedding_matrix

        faiss.omp_set_num_threads(args.threads)
        start = time.perf_counter()
        vectors = np.ascontiguousarray(embedding_matrix(pq.read_table(args.file, columns=["embedding"]).column(0)),
                                       dtype=np.float32)
        index = faiss.IndexFlatIP(vectors.shape[1])
        index.add(vectors)
        _, rows = index.search(queries, args.top_k)
    else:
        from embedcli.retrieval import SearchSpace, parquet_vector_blocks, search_blocks

        start = time.perf_counter()
        _, rows = search_blocks(queries, parquet_vector_blocks(args.file), args.top_k, SearchSpace("float32", args.dim))
    seconds = time.perf_counter() - start
    print(json.dumps({"contender": args.contender, "seconds": round(seconds, 3), "peak_rss_mb": round(_status_mb("VmHWM"), 1),
                      "top": [int(r) for r in rows[:, 0]]}))


def faiss_compare(args: argparse.Namespace, env: dict[str, str]) -> None:
    """embedcli's exact float32 search against a faiss IndexFlatIP process, alternated, best of `args.rounds`."""
    best: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "vectors-float32.parquet")
        make_file(path, args.rows, args.dim, "float32")
        for _ in range(args.rounds):
            for contender in ("embedcli", "faiss"):
                out = subprocess.run(
                    [sys.executable, __file__, "--child", "--contender", contender, "--file", path, "--dim", str(args.dim),
                     "--queries", str(args.queries), "--top-k", str(args.top_k), "--threads", str(args.threads)],
                    env=env, capture_output=True, text=True, check=True,
                )
                row = json.loads(out.stdout.strip().splitlines()[-1])
                print(f"{contender:8s}: {row['seconds']:7.2f} s, peak RSS {row['peak_rss_mb']:7.1f} MiB", flush=True)
                if contender not in best or row["seconds"] < best[contender]["seconds"]:  # type: ignore[operator]
                    best[contender] = row
    same = best["embedcli"]["top"] == best["faiss"]["top"]
    ratio = float(best["faiss"]["seconds"]) / float(best["embedcli"]["seconds"])  # type: ignore[arg-type]
    print(f"{args.rows:,} x {args.dim}, {args.queries:,} queries, top {args.top_k}, {args.threads} threads: "
          f"embedcli {best['embedcli']['seconds']} s, faiss IndexFlatIP {best['faiss']['seconds']} s -> "
          f"embedcli at {ratio:.2f}x faiss's speed; same top row for every query: {same}")
    summary = {"rows": args.rows, "dim": args.dim, "queries": args.queries, "top_k": args.top_k, "threads": args.threads,
               "rounds": args.rounds, "same_top_rows": same, "speed_vs_faiss": round(ratio, 3),
               "results": [{k: v for k, v in r.items() if k != "top"} for r in best.values()]}
    (ROOT / "benchmarks" / "results" / "search_faiss.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")


def bbc(per_topic: int, threads: int) -> None:
    """R@1 / MRR@10 of headline -> article search: float32 against int8 with and without rescoring."""
    import importlib.util

    import numpy as np
    import pyarrow.parquet as pq

    spec = importlib.util.spec_from_file_location("bbc", ROOT / "tests" / "search" / "test_search_bbc.py")
    assert spec is not None and spec.loader is not None
    task = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(task)
    task.PER_TOPIC = per_topic
    rows = task._articles()
    ids = [i for i, _, _ in rows]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "EMBEDCLI_DTYPE": "float32", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "embedcli"]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        articles, headlines = os.path.join(tmp, "articles.jsonl"), os.path.join(tmp, "headlines.jsonl")
        with open(articles, "w", encoding="utf-8") as f:
            f.writelines(json.dumps({"id": i, "text": body}) + "\n" for i, _, body in rows)
        with open(headlines, "w", encoding="utf-8") as f:
            f.writelines(json.dumps({"id": i, "text": h}) + "\n" for i, h, _ in rows)
        for precision, rescore in (("float32", 0), ("int8", 4), ("int8", 0)):
            vectors = os.path.join(tmp, f"{precision}.parquet")
            if not os.path.exists(vectors):
                subprocess.run([*cmd, "embed", articles, "--precision", precision, "-o", vectors, "-q"], env=env, check=True)
            hits = os.path.join(tmp, f"hits-{precision}-{rescore}.parquet")
            start = time.perf_counter()
            subprocess.run([*cmd, "search", vectors, "--queries", headlines, "--top-k", "10", "--rescore", str(rescore),
                            "-o", hits, "-q"], env=env, check=True)
            seconds = time.perf_counter() - start
            got = pq.read_table(hits).to_pylist()
            per_query: dict[str, list[str]] = {i: [] for i in ids}
            for h in got:  # best first per query; fewer than 10 when the corpus is smaller
                per_query[h["query_id"]].append(h["id"])
            ranked = [per_query[i] for i in ids]
            r1, mrr = task._metrics(ranked, ids)
            results.append({"precision": precision, "rescore": rescore, "r_at_1": round(r1, 4), "mrr_at_10": round(mrr, 4),
                            "queries": len(rows), "search_seconds": round(seconds, 2)})
            print(f"bbc {len(rows)} headlines: {precision:7s} rescore {rescore}: R@1 {r1:.4f}  MRR@10 {mrr:.4f}", flush=True)
    f32 = next(r["r_at_1"] for r in results if r["precision"] == "float32")
    summary = {"threads": threads, "per_topic": per_topic, "results": results,
               "int8_default_minus_float32_r_at_1": round(float(np.float64(results[1]["r_at_1"]) - f32), 4)}
    print(f"int8 (default rescore 4) R@1 - float32 R@1 = {summary['int8_default_minus_float32_r_at_1']:+.4f}")
    (ROOT / "benchmarks" / "results" / "search_bbc.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--top-k", type=int, default=10)
    parser.add_argument("--blocks", default="1024,8192,32768,0", help="Block sizes; 0 = the whole column at once.")
    parser.add_argument("--precisions", default="float32,int8")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--bbc", type=int, default=0, metavar="N",
                        help="Instead: the BBC headline -> article R@1 with N articles per topic (60: the test's set).")
    parser.add_argument("--faiss", action="store_true",
                        help="Instead: exact float32 search against a faiss IndexFlatIP process (see above).")
    parser.add_argument("--rounds", type=int, default=2, help="--faiss: rounds, alternated; best of them.")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--contender", help=argparse.SUPPRESS)
    parser.add_argument("--file", help=argparse.SUPPRESS)
    parser.add_argument("--block", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--precision", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return faiss_child(args) if args.contender else child(args)
    if args.bbc:
        return bbc(args.bbc, args.threads)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "OPENBLAS_NUM_THREADS": str(args.threads),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    if args.faiss:
        return faiss_compare(args, env)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for precision in args.precisions.split(","):
            path = os.path.join(tmp, f"vectors-{precision}.parquet")
            make_file(path, args.rows, args.dim, precision)
            size_mb = os.path.getsize(path) / 2**20
            for block in [int(b) for b in args.blocks.split(",")]:
                out = subprocess.run(
                    [sys.executable, __file__, "--child", "--file", path, "--block", str(block), "--precision", precision,
                     "--dim", str(args.dim), "--queries", str(args.queries), "--top-k", str(args.top_k)],
                    env=env, capture_output=True, text=True, check=True,
                )
                row = json.loads(out.stdout.strip().splitlines()[-1])
                row.update(rows=args.rows, dim=args.dim, queries=args.queries, file_mb=round(size_mb, 1))
                results.append(row)
                print(f"{precision:8s} block {row['block_rows']!s:>10}: {row['seconds']:7.2f} s, peak +{row['peak_over_before_mb']:7.1f} MiB "
                      f"(file {size_mb:.0f} MiB on disk, {args.rows:,} x {args.dim})", flush=True)
    out_path = ROOT / "benchmarks" / "results" / "search.json"
    out_path.write_text(json.dumps({"threads": args.threads, "results": results}, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
