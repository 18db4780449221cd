"""End to end, process start included: embedcli vs ONNX Runtime float32 vs sentence-transformers (issue 14).

Each contender is a fresh process that reads a JSONL file and writes vectors, timed on the wall clock;
contenders alternate within each round and each keeps its best of `--rounds`. Min cosine of every contender
against sentence-transformers float32 on the same texts.

    python benchmarks/bench_e2e.py --threads 2                 # 300 BBC articles and 2,000 mixed texts
    python benchmarks/bench_e2e.py --threads 2 --rounds 1 --corpora articles

embedcli's own modules are byte-compiled first, as `pip install` leaves them (an editable checkout under
PYTHONDONTWRITEBYTECODE=1 would compile them at every start). The ORT model is exported once (cached in the
user cache dir, not timed), as `embedcli bench` does; ORT runs
`ORT_ENABLE_ALL`, the same fast tokenizer, length-sorted padded batches of 32 and mean pooling + normalize.
Writes benchmarks/results/e2e-<threads>t.json and prints a table.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

import embedcli
from embedcli.bench import bbc_mixed_texts, bbc_texts

ST_SCRIPT = """
import json, sys, numpy as np, torch
torch.set_num_threads(int(sys.argv[3]))
from sentence_transformers import SentenceTransformer
from embedcli.models.checkpoint.resolve import resolve_model_path
texts = [json.loads(l)["text"] for l in open(sys.argv[1], encoding="utf-8") if l.strip()]
model = SentenceTransformer(str(resolve_model_path(None)), device="cpu")
np.save(sys.argv[2], model.encode(texts, batch_size=32, convert_to_numpy=True))
"""


def _write_corpus(path: Path, texts: list[str]) -> None:
    with path.open("w", encoding="utf-8") as f:
        for i, t in enumerate(texts):
            f.write(json.dumps({"id": str(i), "text": t}) + "\n")


def _embedcli_vectors(path: Path) -> np.ndarray:
    col = pq.read_table(path, columns=["embedding"]).column("embedding").combine_chunks()
    return col.flatten().to_numpy().reshape(len(col), -1)


def _min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return float((a * b).sum(1).min())


def _contenders(tmp: Path, corpus: Path, threads: int, onnx_dir: Path) -> dict[str, tuple[Callable[[int], list[str]], Callable[[int], np.ndarray]]]:
    """name -> (command for round i, reader of round i's vectors)."""
    py = sys.executable
    cli = [py, "-m", "embedcli"]

    def embedcli(dtype: str) -> tuple[Callable[[int], list[str]], Callable[[int], np.ndarray]]:
        out = lambda i: tmp / f"{corpus.stem}-{dtype}-{i}.parquet"  # noqa: E731
        cmd = lambda i: [*cli, "embed", str(corpus), "-o", str(out(i)), "--dtype", dtype, "--quiet", "--overwrite"]  # noqa: E731
        return cmd, lambda i: _embedcli_vectors(out(i))

    npy = lambda name: lambda i: tmp / f"{corpus.stem}-{name}-{i}.npy"  # noqa: E731
    return {
        "sentence-transformers fp32": (
            lambda i: [py, "-c", ST_SCRIPT, str(corpus), str(npy("st")(i)), str(threads)],
            lambda i: np.load(npy("st")(i)),
        ),
        "ONNX Runtime fp32": (
            lambda i: [py, "-m", "embedcli.bench_onnx", str(onnx_dir), str(corpus), str(npy("ort")(i)), str(threads)],
            lambda i: np.load(npy("ort")(i)),
        ),
        "embedcli --dtype float32": embedcli("float32"),
        "embedcli default (auto)": embedcli("auto"),
    }


def run_corpus(name: str, texts: list[str], threads: int, rounds: int, onnx_dir: Path) -> dict:
    """Best-of-`rounds` wall seconds and min cosine vs sentence-transformers for each contender."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        corpus = tmp / f"{name}.jsonl"
        _write_corpus(corpus, texts)
        contenders = _contenders(tmp, corpus, threads, onnx_dir)
        best: dict[str, float] = {}
        for i in range(rounds):
            for cname, (cmd, _) in contenders.items():
                t0 = time.perf_counter()
                subprocess.run(cmd(i), check=True, env=env, stdout=subprocess.DEVNULL)
                wall = time.perf_counter() - t0
                best[cname] = min(best.get(cname, wall), wall)
                print(f"bench: {name} round {i + 1} {cname}: {wall:.2f}s", flush=True)
        ref = contenders["sentence-transformers fp32"][1](0)
        cos = {cname: _min_cosine(read(0), ref) for cname, (_, read) in contenders.items()}
    ort = best["ONNX Runtime fp32"]
    return {
        "texts": len(texts),
        "contenders": {c: {"seconds": round(s, 2), "vs_ort": round(ort / s, 3), "min_cosine_vs_st": round(cos[c], 6)}
                       for c, s in best.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--corpora", default="articles,mixed")
    args = parser.parse_args()
    import torch

    from embedcli.bench_onnx import export_dir
    from embedcli.models.spec import load_model_spec

    torch.set_num_threads(args.threads)
    compileall.compile_dir(Path(embedcli.__file__).parent, quiet=1)
    onnx_dir = export_dir(load_model_spec(None))  # exported once, cached; not timed
    corpora = {"articles": lambda: bbc_texts(300), "mixed": lambda: bbc_mixed_texts(2000)}
    report = {"threads": args.threads, "rounds": args.rounds, "corpora": {}}
    for name in args.corpora.split(","):
        report["corpora"][name] = run_corpus(name, corpora[name](), args.threads, args.rounds, onnx_dir)
    for name, res in report["corpora"].items():
        print(f"\n{name} ({res['texts']} texts), best of {args.rounds}, {args.threads} threads")
        for c, r in res["contenders"].items():
            print(f"  {c:28s} {r['seconds']:7.2f} s  {r['vs_ort']:.2f}x ORT  min cos {r['min_cosine_vs_st']:.6f}")
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / f"e2e-{args.threads}t.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
