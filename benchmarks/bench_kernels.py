"""The fused CPU kernels (`embedcli/models/kernels/_cpu.cpp`) against torch's paths, in one process (issue 27).

    python benchmarks/bench_kernels.py                        # both parts, 1 and 2 threads
    python benchmarks/bench_kernels.py --part attention --threads 1
    python benchmarks/bench_kernels.py --avx2                 # on an AVX-512 CPU: its AVX2 code instead

Parts:

- **attention**: `fused_attention.attention` against `varlen_attention` with the kernel off (torch's padded groups
  and SDPA), 12 heads of 32 (all-MiniLM-L6-v2's), packs from 60 sequences of 10-40 tokens to 4 x 512; best of 15
  calls, 3 rounds taking turns, the best of each.
- **forwards**: all-MiniLM-L6-v2 `Runner.embed` over BBC articles and mixed texts, float32, kernels (attention and
  add + norm) on against off, 5 rounds taking turns; CPU-time and wall medians, and the largest |diff|.

Run it alone on the machine (nothing else busy), modules byte-compiled; OpenMP's wait policy is the CLI's (passive). Results: benchmarks/results/kernels-<isa>.json.
"""

from __future__ import annotations

import os

# As the console script runs (`embedcli.cli.PASSIVE_WAIT`): OpenMP's idle threads sleep rather than spin beside the
# kernels' own worker threads. Set before torch loads its OpenMP runtime.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from embedcli.bench import bbc_mixed_texts, bbc_texts
from embedcli.models.backbones.layers import varlen_attention
from embedcli.models.kernels import fused_attention, fused_norm, native
from embedcli.models.kernels.packing import PackInfo

HEADS, DIM = 12, 32
PACKS = {
    "60 x 10-40": [10 + (i * 7) % 31 for i in range(60)],
    "32 x 64": [64] * 32,
    "21 x 96": [96] * 21,
    "16 x 128": [128] * 16,
    "10 x 192": [192] * 10,
    "8 x 256": [256] * 8,
    "4 x 512": [512] * 4,
}


def _best(fn: Callable[[], object], reps: int = 15) -> float:
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def _kernels_off() -> Callable[[], None]:
    """Turn the fused kernels off (their callers take the torch paths); returns the undo."""
    attention, norm = fused_attention.applies, fused_norm.applies
    fused_attention.applies = lambda *a, **k: False  # type: ignore[assignment]
    fused_norm.applies = lambda *a, **k: False  # type: ignore[assignment]

    def undo() -> None:
        fused_attention.applies, fused_norm.applies = attention, norm  # type: ignore[assignment]

    return undo


def _time_pack(lengths: list[int]) -> dict[str, float]:
    """Milliseconds per call for one pack: torch's path and the kernel, best of 3 rounds taking turns."""
    total = sum(lengths)
    qkv = torch.randn(total, 3 * HEADS * DIM, generator=torch.Generator().manual_seed(0))
    pack = PackInfo.build(lengths)
    fused = qkv.view(total, 3 * HEADS, DIM)
    q, k, v = fused[:, :HEADS], fused[:, HEADS : 2 * HEADS], fused[:, 2 * HEADS :]
    kernel, torch_path = [], []
    with torch.inference_mode():
        for _ in range(3):
            kernel.append(_best(lambda: fused_attention.attention(q, k, v, pack)))
            undo = _kernels_off()
            try:
                torch_path.append(_best(lambda: varlen_attention(qkv, pack, HEADS, DIM)))
            finally:
                undo()
    return {"torch_ms": round(1e3 * min(torch_path), 3), "kernel_ms": round(1e3 * min(kernel), 3),
            "ratio": round(min(kernel) / min(torch_path), 3)}


def attention_part() -> dict[str, Any]:
    """Milliseconds per call, torch's path and the kernel, for each pack."""
    out: dict[str, Any] = {}
    for name, lengths in PACKS.items():
        out[name] = res = _time_pack(lengths)
        print(f"  attention {name:12s} torch {res['torch_ms']:7.2f} ms  kernel {res['kernel_ms']:7.2f} ms"
              f"  {res['ratio']:.3f}x", flush=True)
    return out


def forwards_part(texts: list[str], rounds: int = 5) -> dict[str, Any]:
    """MiniLM `Runner.embed` over `texts`, kernels on against off, rounds taking turns."""
    from embedcli.compute.build import build_runner, embed_recipe
    from embedcli.models.options import ModelOptions
    from embedcli.models.spec import load_model_spec

    runner = build_runner(embed_recipe(load_model_spec(None), ModelOptions(device="cpu", dtype="float32")))
    results: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    vectors: dict[bool, np.ndarray] = {}

    def run(on: bool) -> tuple[float, float]:
        undo = None if on else _kernels_off()
        try:
            cpu, wall = time.process_time(), time.perf_counter()
            vectors[on] = np.asarray(runner.embed(texts))
            return time.process_time() - cpu, time.perf_counter() - wall
        finally:
            if undo is not None:
                undo()

    run(True)
    run(False)
    for r in range(rounds):
        for on in (True, False) if r % 2 == 0 else (False, True):
            results[on].append(run(on))
    cpu = {on: statistics.median(c for c, _ in results[on]) for on in (True, False)}
    wall = {on: statistics.median(w for _, w in results[on]) for on in (True, False)}
    return {
        "texts": len(texts),
        "cpu_off_s": round(cpu[False], 3), "cpu_on_s": round(cpu[True], 3), "cpu_ratio": round(cpu[True] / cpu[False], 3),
        "wall_off_s": round(wall[False], 3), "wall_on_s": round(wall[True], 3),
        "wall_ratio": round(wall[True] / wall[False], 3),
        "max_abs_diff": float(np.abs(vectors[True] - vectors[False]).max()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=["all", "attention", "forwards"], default="all")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--avx2", action="store_true", help="on an AVX-512 CPU, time the kernels' AVX2 code")
    args = parser.parse_args()
    if not native.available(torch.float32):
        raise SystemExit("the fused kernels are not built, or this CPU has neither AVX-512 nor AVX2 + FMA")
    isa = native.use_avx2(args.avx2)
    report: dict[str, Any] = {"isa": isa, "load_before": list(os.getloadavg())}
    for threads in args.threads:
        torch.set_num_threads(threads)
        print(f"{isa}, {threads} thread(s)", flush=True)
        part: dict[str, Any] = {}
        if args.part in ("all", "attention"):
            part["attention"] = attention_part()
        if args.part in ("all", "forwards"):
            for name, texts in (("articles", bbc_texts(60)), ("mixed", bbc_mixed_texts(600))):
                part[f"forwards_{name}"] = res = forwards_part(texts)
                print(f"  forwards {name:9s} cpu {res['cpu_off_s']:.3f} -> {res['cpu_on_s']:.3f} s "
                      f"({res['cpu_ratio']:.3f}x), wall {res['wall_ratio']:.3f}x, max |diff| {res['max_abs_diff']:.1e}",
                      flush=True)
        report[f"{threads}t"] = part
    report["load_after"] = list(os.getloadavg())
    out = Path(__file__).parent / "results" / f"kernels-{isa}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
