"""End to end on the registry's new families: ModernBERT-base and EmbeddingGemma-300m (issue 21).

Both are built once at their real configurations with random weights, in the layout the real checkpoints
ship (sentence-transformers `save` of gte-modernbert-base: Transformer + CLS Pooling + Normalize;
embeddinggemma-300m: Transformer + mean Pooling + Dense 768->3072 -> Dense 3072->768 + Normalize, its
prompts), cached under the user cache dir, not timed. No real tokenizer is at hand offline, so both carry
all-MiniLM-L6-v2's WordPiece tokenizer (token counts close to a real BPE's on English news).

Each contender is a fresh process reading a JSONL file of 300 BBC articles and writing vectors, timed on the
wall clock, process start included; contenders alternate within each round and keep their best of
`--rounds`. Min cosine of every contender against sentence-transformers float32.

    python benchmarks/bench_families.py --threads 2 --rounds 1
    python benchmarks/bench_families.py --models modernbert --articles 100

Writes benchmarks/results/families-<threads>t.json and prints a table.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

import embedcli
from embedcli.bench import bbc_texts

ST_SCRIPT = """
import json, sys, numpy as np, torch
torch.set_num_threads(int(sys.argv[3]))
from sentence_transformers import SentenceTransformer
texts = [json.loads(l)["text"] for l in open(sys.argv[1], encoding="utf-8") if l.strip()]
model = SentenceTransformer(sys.argv[4], device="cpu")
np.save(sys.argv[2], model.encode(texts, batch_size=32, convert_to_numpy=True))
"""

GEMMA_LAYERS = 24
MODERNBERT_KW = dict(
    hidden_size=768, num_hidden_layers=22, num_attention_heads=12, intermediate_size=1152, vocab_size=50368,
    max_position_embeddings=8192, global_attn_every_n_layers=3, local_attention=128, global_rope_theta=160000.0,
    local_rope_theta=10000.0, hidden_activation="gelu", norm_eps=1e-5, norm_bias=False, attention_bias=False,
    mlp_bias=False, pad_token_id=0, bos_token_id=101, eos_token_id=102, cls_token_id=101, sep_token_id=102,
)
GEMMA_KW = dict(
    hidden_size=768, num_hidden_layers=GEMMA_LAYERS, num_attention_heads=3, num_key_value_heads=1, head_dim=256,
    intermediate_size=1152, vocab_size=262144, max_position_embeddings=2048, sliding_window=512,
    layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(GEMMA_LAYERS)],
    query_pre_attn_scalar=256, rms_norm_eps=1e-6, rope_theta=1000000.0, rope_local_base_freq=10000.0,
    hidden_activation="gelu_pytorch_tanh", use_bidirectional_attention=True, pad_token_id=0, bos_token_id=101,
    eos_token_id=102, attn_logit_softcapping=None, final_logit_softcapping=None,
)
GEMMA_PROMPTS = {"query": "task: search result | query: ", "document": "title: none | text: "}


def _minilm_tokenizer(folder: Path) -> None:
    from embedcli.models.checkpoint.resolve import resolve_model_path

    src = resolve_model_path(None)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (src / name).is_file():
            shutil.copy(src / name, folder / name)


def build(name: str, root: Path) -> Path:
    """The cached ST folder of `name` (modernbert | embeddinggemma), built once."""
    import torch
    import transformers as tf
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense, Normalize, Pooling, Transformer

    folder = root / name
    if (folder / "modules.json").is_file():
        return folder
    base = root / f"{name}-base"
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    torch.manual_seed(0)
    if name == "modernbert":
        model = tf.ModernBertModel(tf.ModernBertConfig(**MODERNBERT_KW))
        max_seq, pooling, dense = 8192, "cls", []
    else:
        model = tf.Gemma3TextModel(tf.Gemma3TextConfig(**GEMMA_KW))
        max_seq, pooling = 2048, "mean"
        act = torch.nn.Identity()
        dense = [Dense(768, 3072, bias=False, activation_function=act), Dense(3072, 768, bias=False, activation_function=act)]
    model.eval().save_pretrained(str(base))
    _minilm_tokenizer(base)
    transformer = Transformer(str(base), max_seq_length=max_seq)
    modules = [transformer, Pooling(768, pooling), *dense, Normalize()]
    prompts = GEMMA_PROMPTS if name == "embeddinggemma" else None
    tmp = root / f"{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    SentenceTransformer(modules=modules, device="cpu", prompts=prompts).save(str(tmp))
    tmp.rename(folder)
    shutil.rmtree(base)
    return folder


def _vectors(path: Path) -> np.ndarray:
    col = pq.read_table(path, columns=["embedding"]).column("embedding").combine_chunks()
    return col.flatten().to_numpy().reshape(len(col), -1)


def _min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return float((a * b).sum(1).min())


def run_model(name: str, folder: Path, texts: list[str], threads: int, rounds: int) -> dict:
    """Best-of-`rounds` wall seconds and min cosine vs sentence-transformers for each contender."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    py = sys.executable
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        corpus = tmp / "articles.jsonl"
        with corpus.open("w", encoding="utf-8") as f:
            for i, t in enumerate(texts):
                f.write(json.dumps({"id": str(i), "text": t}) + "\n")
        st_out = lambda i: tmp / f"st-{i}.npy"  # noqa: E731
        ours = lambda dtype, i: tmp / f"{dtype}-{i}.parquet"  # noqa: E731
        contenders = {
            "sentence-transformers fp32": (
                lambda i: [py, "-c", ST_SCRIPT, str(corpus), str(st_out(i)), str(threads), str(folder)],
                lambda i: np.load(st_out(i)),
            ),
            **{
                f"embedcli --dtype {dtype}": (
                    lambda i, dtype=dtype: [py, "-m", "embedcli", "embed", str(corpus), "-m", str(folder), "-o",
                                            str(ours(dtype, i)), "--dtype", dtype, "--quiet", "--overwrite"],
                    lambda i, dtype=dtype: _vectors(ours(dtype, i)),
                )
                for dtype in ("float32", "auto")
            },
        }
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
        info = subprocess.run([py, "-m", "embedcli", "info", str(folder), "--json"], check=True, capture_output=True,
                              text=True, env=env)
    st = best["sentence-transformers fp32"]
    return {
        "texts": len(texts),
        "runs_on": json.loads(info.stdout).get("runs_on"),
        "contenders": {c: {"seconds": round(s, 2), "vs_st": round(st / s, 3), "min_cosine_vs_st": round(cos[c], 6)}
                       for c, s in best.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--articles", type=int, default=300)
    parser.add_argument("--models", default="modernbert,embeddinggemma")
    args = parser.parse_args()
    compileall.compile_dir(Path(embedcli.__file__).parent, quiet=1)
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "embedcli-bench"
    texts = bbc_texts(args.articles)
    report = {"threads": args.threads, "rounds": args.rounds, "models": {}}
    for name in args.models.split(","):
        report["models"][name] = run_model(name, build(name, root), texts, args.threads, args.rounds)
    for name, res in report["models"].items():
        print(f"\n{name} ({res['texts']} articles), best of {args.rounds}, {args.threads} threads: {res['runs_on']}")
        for c, r in res["contenders"].items():
            print(f"  {c:28s} {r['seconds']:8.2f} s  {r['vs_st']:.2f}x ST  min cos {r['min_cosine_vs_st']:.6f}")
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / f"families-{args.threads}t.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
