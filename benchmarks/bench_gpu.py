"""GPU run of the same runner: embedcli vs sentence-transformers on CUDA, same process, same texts.

The device machine has no network and no room for the real weights, so the models are built there
from the real configurations (all-MiniLM-L6-v2, all-mpnet-base-v2 shapes) with seeded random weights
and the real MiniLM tokenizer: throughput depends only on shapes, and parity is checked against
sentence-transformers loading the very same folder.

    python benchmarks/bench_gpu.py --assets .gpu --out results.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch

MPNET_BASE = {
    "architectures": ["MPNetModel"], "model_type": "mpnet", "hidden_size": 768, "intermediate_size": 3072,
    "num_attention_heads": 12, "num_hidden_layers": 12, "max_position_embeddings": 514, "vocab_size": 30527,
    "relative_attention_num_buckets": 32, "layer_norm_eps": 1e-5, "hidden_act": "gelu", "pad_token_id": 1,
    "bos_token_id": 0, "eos_token_id": 2,
}


def build_model(assets: Path, kind: str, root: Path) -> Path:
    """A sentence-transformers folder with seeded random weights in the real model's shape."""
    from transformers import AutoConfig, AutoModel

    folder = root / kind
    shutil.copytree(assets / "minilm", folder, dirs_exist_ok=True)
    torch.manual_seed(0)
    if kind == "mpnet":
        from transformers import MPNetConfig

        config = MPNetConfig(**{k: v for k, v in MPNET_BASE.items() if k not in ("architectures", "model_type")})
        config.architectures = ["MPNetModel"]
        (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 384, "do_lower_case": False}))
        pool = json.loads((folder / "1_Pooling" / "config.json").read_text())
        pool["word_embedding_dimension"] = 768
        (folder / "1_Pooling" / "config.json").write_text(json.dumps(pool))
    else:
        config = AutoConfig.from_pretrained(folder)
    model = AutoModel.from_config(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.05)
    model.save_pretrained(folder)
    return folder


def sync() -> None:
    torch.cuda.synchronize()


def timed(fn):  # type: ignore[no-untyped-def]
    sync()
    start = time.perf_counter()
    out = fn()
    sync()
    return time.perf_counter() - start, out


def min_cos(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(((a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))).min())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--assets", type=Path, default=Path(".gpu"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeat", type=int, default=4)
    args = parser.parse_args()

    import transformers

    from embedcli.compute.runner import Runner, RunnerOptions
    from embedcli.models.kernels.packing import flash_attn_available
    from embedcli.models.loader import LoadedModel, ModelOptions
    from embedcli.models.spec import load_model_spec
    from embedcli.run.source import InputOptions
    from embedcli.tasks.common import ModelChoice, OutputOptions
    from embedcli.tasks.embed import EmbedOptions, run_embed

    report: dict = {
        "torch": torch.__version__, "transformers": transformers.__version__,
        "gpu": torch.cuda.get_device_name(0), "flash_attn": flash_attn_available(torch.device("cuda")),
        "python": sys.version.split()[0], "runs": [],
    }
    print(json.dumps(report), flush=True)
    rows = [json.loads(line) for line in (args.assets / "bbc.jsonl").open()]
    texts = [r["title"] + "\n" + r["text"] for r in rows] * args.repeat
    root = Path("/tmp/embedcli-gpu")
    root.mkdir(exist_ok=True)
    corpus = root / "corpus.jsonl"
    with corpus.open("w") as f:
        for i, t in enumerate(texts):
            f.write(json.dumps({"id": str(i), "text": t}) + "\n")

    from sentence_transformers import SentenceTransformer

    for kind in ("minilm", "mpnet"):
        path = build_model(args.assets, kind, root)
        st32 = SentenceTransformer(str(path), device="cuda", model_kwargs={"dtype": torch.float32})
        st32.encode(texts[:256], batch_size=32)
        secs, ref = timed(lambda st=st32: st.encode(texts, batch_size=32, normalize_embeddings=False))
        spec = load_model_spec(str(path))
        for dtype in ("float32", "bfloat16", "float16"):
            run: dict = {"model": kind, "dtype": dtype}
            loaded = LoadedModel(spec, ModelOptions(device="cuda", dtype=dtype))
            for budget in (16384, 65536):
                runner = Runner(loaded, RunnerOptions(max_batch_tokens=budget, normalize=False))
                runner.embed(texts[:512])
                runner.stats.tokens = 0
                secs_e, ours = timed(lambda r=runner: r.embed(texts))
                run[f"embedcli_tok_s_budget{budget}"] = runner.stats.tokens / secs_e
                run["tokens"] = runner.stats.tokens
                run["min_cos_vs_st_fp32"] = min_cos(ours, ref)
            out = root / f"{kind}-{dtype}.parquet"
            secs_file, _ = timed(
                lambda d=dtype, o=out, p=path: run_embed(
                    InputOptions([str(corpus)]), ModelChoice(model=str(p), device="cuda", dtype=d),
                    EmbedOptions(normalize=False, max_batch_tokens=65536), OutputOptions(str(o), quiet=True),
                )
            )
            run["embedcli_end_to_end_tok_s"] = run["tokens"] / secs_file
            st = SentenceTransformer(str(path), device="cuda", model_kwargs={"dtype": getattr(torch, dtype)})
            st.encode(texts[:256], batch_size=32)
            for bs in (32, 128, 512):
                s, _ = timed(lambda st=st, bs=bs: st.encode(texts, batch_size=bs, normalize_embeddings=False))
                run[f"st_tok_s_bs{bs}"] = run["tokens"] / s
            run["st_fp32_bs32_tok_s"] = run["tokens"] / secs
            print(json.dumps(run), flush=True)
            report["runs"].append(run)
            del st, loaded
            torch.cuda.empty_cache()
        args.out.write_text(json.dumps(report, indent=2))
    args.out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
