"""Parity-guarded `auto` dtype: bf16 only where the model's bf16 output stays within the bar on a probe set.

The decision is made once per model content and config hash, task, device kind and embedcli version, and
cached as a small JSON file in the user cache dir. Only the probe itself imports torch: `info` reads decisions without it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from embedcli.io.user_cache import read_json, user_cache_dir, write_json
from embedcli.models.probe_texts import PROBE_TEXTS, PROBE_VERSION
from embedcli.version import __version__

if TYPE_CHECKING:
    from embedcli.models.loader import LoadedModel
    from embedcli.models.options import ModelOptions
    from embedcli.models.spec import ModelSpec

# The probe's texts are cut here (and at the model's own max length): long enough to show accumulation over
# positions, short enough that a decoder with a 32k context probes in about a second.
PROBE_MAX_LENGTH = 512
PROBE_BATCH_TOKENS = 2048
# Sparse (SPLADE) vectors are compared as the dense vocabulary-sized vectors they stand for.
EMBEDDING_TASKS = frozenset({"embed", "token_embed", "sparse_embed"})
_HEAD_TASK = {
    "base": "embed",
    "sequence_classification": "classify",
    "token_classification": "token_classify",
    "lm_score": "classify",
    "sparse": "sparse_embed",
}
# The forward's maths the probe judged: bump when a kernel changes what bf16 computes, so decisions cached
# by the same version are made again (2: oneDNN linears, bf16 matmul attention on the CPU; 3: its scale
# and mask ride in the first matmul; 4: float biases stay float32, in SDPA; 5: the fused AVX-512 attention with
# float32 scores and softmax, MPNet's bias included, and the fused residual add + layer norm).
KERNELS_REVISION = 5

_DTYPE_NAMES = ("float32", "bfloat16", "float16")  # `embedcli.models.loader.DTYPES`' keys


@dataclass(frozen=True)
class ParityBar:
    """How close bf16 must stay to float32 on the probe set for `auto` to choose it."""

    min_cosine: float = 0.9999  # embeddings: every probe vector against its float32 twin
    max_abs_diff: float = 1e-3  # scores: every probe score; scores must also keep their order


@dataclass(frozen=True)
class DtypeDecision:
    """What `auto` resolved to for one model, task and device kind, and why."""

    dtype: str
    reason: str
    task: str
    device_kind: str
    metrics: dict[str, float] = field(default_factory=dict)
    bar: dict[str, float] = field(default_factory=dict)
    cached: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The cache file's content (without `cached`, which says where this copy came from)."""
        data = asdict(self)
        data.pop("cached")
        return data


def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (AVX-512 BF16 or AMX), where bf16 beats float32."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return False
    return any(flag in flags.split() for flag in ("avx512_bf16", "amx_bf16"))


def cpu_device_kind() -> str:
    """The CPU's device kind in decision keys: which bf16 instructions it has (no torch import)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = set(next((line for line in f if line.startswith("flags")), "").split())
    except OSError:
        flags = set()
    native = sorted(flags & {"avx512_bf16", "amx_bf16"})
    return "cpu:" + ("+".join(native) or "no-native-bf16")


def device_kind(device: Any) -> str:
    """`cpu:<bf16 instructions>` or `cuda:<device name>`: numerics differ across kinds, not across units of one."""
    if device.type == "cuda":
        import torch  # here: `info` and the run plan import this module without torch

        return "cuda:" + torch.cuda.get_device_name(device)
    return cpu_device_kind() if device.type == "cpu" else str(device.type)


def _no_accelerator() -> bool:
    """Whether `--device auto` surely means the CPU, decided without torch: no GPU device node on Linux, or macOS."""
    if sys.platform == "darwin":
        return True
    if not sys.platform.startswith("linux"):
        return False
    # CUDA (nvidia), ROCm (kfd) and WSL's GPU (dxg): any of them may make torch.cuda available.
    return not any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd", "/dev/dxg"))


def planned_dtype(spec: ModelSpec, options: ModelOptions) -> tuple[str, str] | None:
    """(dtype, reason) that `LoadedModel(spec, options)` will settle on, decided without torch or weights;
    None when only loading can tell (a GPU may be there, or `auto` has no cached parity decision yet).

    Mirrors `LoadedModel.__init__`; the task that builds the model checks its provenance against this plan.
    """
    if options.dtype != "auto":
        return (options.dtype, f"--dtype {options.dtype}") if options.dtype in _DTYPE_NAMES else None
    if options.quantize:
        return "float32", "auto: float32 under --quantize (int8 dynamic quantization runs on float32 weights)"
    if options.device not in ("auto", "cpu") or (options.device == "auto" and not _no_accelerator()):
        return None
    if not cpu_has_native_bf16():
        return "float32", "auto: float32 on this device (no native bf16 matmul)"
    if not spec.content_hash:
        return None
    task = options.task or task_for_head(spec.head)
    decision = load_decision(decision_path(spec, task, cpu_device_kind()), options.parity_bar or ParityBar())
    return None if decision is None else (decision.dtype, decision.reason)


def task_for_head(head: str) -> str:
    """The pooling task a model's head serves by default (what `auto` is probed on unless told otherwise)."""
    return _HEAD_TASK.get(head, "embed")


def probe_length(spec: ModelSpec) -> int:
    """How far the probe's texts are cut: bf16 drift grows with length, so a decision holds for this length only."""
    return min(spec.max_length, PROBE_MAX_LENGTH)


def _fused_kernels() -> list[str]:
    """["fused"] when the compiled CPU kernels are installed (they compute bf16 attention with other roundings than
    the torch paths), else nothing. Found without importing torch."""
    import importlib.util

    return ["fused"] if importlib.util.find_spec("embedcli.models.kernels._cpu") is not None else []


def decision_path(spec: ModelSpec, task: str, kind: str) -> Path:
    """Where the decision for (model content and config hashes, task, device kind, probe length, embedcli
    version) is cached."""
    # The content hash covers config.json, tokenizer.json and the weights only; the config hash adds what
    # sentence-transformers' own files decide (pooling, Normalize, Dense, max length), which the probe's
    # outputs depend on as much as the weights do.
    # What runs the model (own backbone or the fallback) is outside the config hash but not outside bf16's drift.
    key = json.dumps([spec.content_hash, spec.config_hash(), task, kind, probe_length(spec), __version__, PROBE_VERSION,
                      KERNELS_REVISION, spec.backbone, *_fused_kernels()])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    # The model hash leads the name so `info` can list every decision recorded for a model.
    return user_cache_dir("precision") / f"{spec.content_hash[:16]}-{digest}.json"


def load_decision(path: Path, bar: ParityBar) -> DtypeDecision | None:
    """A cached decision, or None when absent, unreadable or made under another bar."""
    data = read_json(path)
    if data is None or data.get("dtype") not in ("float32", "bfloat16") or data.get("bar") != asdict(bar):
        return None
    try:
        return DtypeDecision(**{**data, "cached": True})
    except TypeError:
        return None


def compare(task: str, reference: Sequence[np.ndarray], candidate: Sequence[np.ndarray], bar: ParityBar) -> tuple[bool, dict[str, float]]:
    """Whether `candidate` is within the bar of `reference` (per-text outputs of `task`), and the measured figures."""
    ref = np.concatenate([np.asarray(r, np.float64).reshape(-1, np.asarray(r).shape[-1]) for r in reference])
    cand = np.concatenate([np.asarray(c, np.float64).reshape(-1, np.asarray(c).shape[-1]) for c in candidate])
    if task in EMBEDDING_TASKS:
        cos = (ref * cand).sum(1) / (np.linalg.norm(ref, axis=1) * np.linalg.norm(cand, axis=1) + 1e-300)
        min_cos = float(cos.min())
        return min_cos >= bar.min_cosine, {"min_cosine": min_cos}
    max_abs = float(np.abs(ref - cand).max())
    inversions = sum(_inversions(ref[:, j], cand[:, j]) for j in range(ref.shape[1]))
    if ref.shape[1] > 1:  # the top label of each row must not change either
        inversions += int((ref.argmax(1) != cand.argmax(1)).sum())
    passed = max_abs <= bar.max_abs_diff and inversions == 0
    return passed, {"max_abs_diff": max_abs, "order_changes": float(inversions)}


def _inversions(ref: np.ndarray, cand: np.ndarray) -> int:
    """Breaks of `ref`'s order in `cand`: in `ref` order (ties by `cand`), each step where `cand` falls.

    Zero exactly when no pair ranked strictly apart by `ref` is ranked the other way by `cand`.
    """
    order = np.lexsort((cand, ref))
    return int((np.diff(cand[order]) < 0).sum())


def probe_outputs(model: LoadedModel, task: str, texts: Sequence[str] = PROBE_TEXTS) -> list[np.ndarray]:
    """The model's `task` output for each probe text, as it is configured now (dtype, autocast)."""
    # Here: `info` and the run plan import this module without torch (embedcli.pooling loads it).
    import torch

    from embedcli.pooling import EmbeddingShape, PoolingMetadata, PoolingParams

    spec = model.spec
    pooler = cast("Any", model.pooler).pooler_for(task)
    params = PoolingParams().verify(
        task, model.pooler_config, EmbeddingShape(spec.embedding_size, spec.is_matryoshka, spec.matryoshka_dimensions)
    )
    tok = model.tokenizer
    tok.enable_truncation(probe_length(spec))
    try:
        prepared = [t.strip() for t in texts]  # do_lower_case: inside the loaded tokenizer
        encodings = tok.encode_batch(prepared)
    finally:
        tok.no_truncation()  # the loader's state: the runner sets its own truncation per call
    out: list[np.ndarray] = [np.empty(0)] * len(texts)
    for members in _packs([len(e.ids) for e in encodings]):
        ids = torch.tensor([i for m in members for i in encodings[m].ids], dtype=torch.long)
        types = torch.tensor([i for m in members for i in encodings[m].type_ids], dtype=torch.long)
        lengths = [len(encodings[m].ids) for m in members]
        hidden = model.forward_packed(ids, lengths, types)
        cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.long)
        metadata = PoolingMetadata.from_cu_seqlens(
            cu, [params] * len(members), token_ids=ids if pooler.requires_token_ids() else None
        )
        with torch.inference_mode():
            pooled = pooler(hidden, metadata)
        for m, value in zip(members, pooled, strict=True):
            out[m] = _dense(value, spec.embedding_size)
    return out


def _dense(value: Any, width: int) -> np.ndarray:
    """A pooled output as a float32 array; a sparse (indices, values) pair as its dense `[width]` vector."""
    if isinstance(value, tuple):
        indices, values = value
        dense = np.zeros(width, np.float32)
        dense[indices.cpu().numpy()] = values.float().cpu().numpy()
        return dense
    return value.float().cpu().numpy()


def _packs(lengths: list[int]) -> list[list[int]]:
    packs: list[list[int]] = [[]]
    used = 0
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if packs[-1] and used + lengths[i] > PROBE_BATCH_TOKENS:
            packs.append([])
            used = 0
        packs[-1].append(i)
        used += lengths[i]
    return packs


def decide_auto_dtype(
    model: LoadedModel,
    task: str,
    bf16_candidate: Callable[[], contextlib.AbstractContextManager[object]],
    *,
    kind: str,
    bar: ParityBar | None = None,
    texts: Sequence[str] = PROBE_TEXTS,
) -> DtypeDecision:
    """bfloat16 when the model (loaded in float32) stays within `bar` under `bf16_candidate()`, else float32; cached.

    `bf16_candidate` is a context in which the model's forwards run the way `--dtype bfloat16` runs them.
    """
    bar = bar or ParityBar()
    spec = model.spec
    path = decision_path(spec, task, kind) if spec.content_hash else None
    if path is not None and (cached := load_decision(path, bar)) is not None:
        return cached
    start = time.perf_counter()
    reference = probe_outputs(model, task, texts)
    with bf16_candidate():
        candidate = probe_outputs(model, task, texts)
    passed, metrics = compare(task, reference, candidate, bar)
    metrics["probe_seconds"] = round(time.perf_counter() - start, 3)
    decision = DtypeDecision(
        dtype="bfloat16" if passed else "float32",
        reason=_reason(task, passed, metrics, bar, len(texts)),
        task=task, device_kind=kind, metrics=metrics, bar=asdict(bar),
    )
    if path is not None:
        write_json(path, decision.to_dict())
    return decision


def _reason(task: str, passed: bool, metrics: dict[str, float], bar: ParityBar, n: int) -> str:
    if task in EMBEDDING_TASKS:
        figure = f"bf16 min cosine {metrics['min_cosine']:.6f} {'>=' if passed else '<'} {bar.min_cosine} vs float32"
    else:
        order = "same order" if metrics["order_changes"] == 0 else f"{int(metrics['order_changes'])} order changes"
        figure = f"bf16 max |delta| {metrics['max_abs_diff']:.2e} (bar {bar.max_abs_diff:g}), {order} vs float32"
    verdict = "within the bar" if passed else "outside the bar, float32 kept"
    return f"auto: {figure} on {n} probe texts ({task}): {verdict}"


def recorded_decisions(spec: ModelSpec) -> list[DtypeDecision]:
    """Every cached `auto` decision for this model's content hash (this embedcli version), for `info`."""
    if not spec.content_hash:
        return []
    found = []
    for path in sorted(user_cache_dir("precision").glob(f"{spec.content_hash[:16]}-*.json")):
        data = read_json(path)
        if data is None:
            continue
        with contextlib.suppress(TypeError):
            decision = DtypeDecision(**{**data, "cached": True})
            if path == decision_path(spec, decision.task, decision.device_kind):
                found.append(decision)
    return found


def auto_dtype_summary(spec: ModelSpec) -> str:
    """What `--dtype auto` resolves to on this CPU for the model's default task, and why (no torch import)."""
    if spec.head == "static":
        return "float32: a static embedding table and a mean of rows (no forward)"
    task = task_for_head(spec.head)
    kind = cpu_device_kind()
    if not cpu_has_native_bf16():
        return "float32 on this CPU: no native bf16 matmul"
    for decision in recorded_decisions(spec):
        if decision.device_kind == kind and decision.task == task:
            return f"{decision.dtype} on this CPU ({decision.reason})"
    return "not probed yet on this CPU: bfloat16 if its parity probe passes on the first run, else float32"
