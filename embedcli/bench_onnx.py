"""ONNX Runtime float32, the strongest exact CPU peer, as an `embedcli bench` contender.

The model is exported once with `torch.onnx.export` into the user cache (keyed by its content hash) and
run the way a careful ORT user runs it: `ORT_ENABLE_ALL`, the same fast tokenizer embedcli uses,
length-sorted padded batches of 32, then the model's own pooling and normalization in numpy.

Running an export needs only onnxruntime, tokenizers and numpy (no torch): `python -m embedcli.bench_onnx
EXPORT_DIR IN.jsonl OUT.npy` is the start-up figure of a one-row ORT process.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from embedcli.io.user_cache import user_cache_dir

ONNX_OPSET = 17
_TOKEN_TYPE_MODELS = frozenset({"bert", "xlm-roberta", "roberta", "camembert", "electra"})


class OnnxUnavailable(RuntimeError):
    """The ORT contender cannot run here: onnxruntime/onnx missing, or a model it does not cover."""


@dataclass(frozen=True)
class OnnxModelConfig:
    """What running an export needs beside the graph: pooling, normalization and the tokenizer's rules."""

    pooling: str
    normalize: bool
    max_length: int
    lower_case: bool
    token_types: bool
    pad_id: int


def export_dir(spec: Any) -> Path:
    """The cached export of `spec` (`model.onnx`, `tokenizer.json`, `embedcli-onnx.json`), made on first use."""
    try:
        import onnx  # noqa: F401  (torch.onnx.export needs it)
        import onnxruntime  # noqa: F401
    except ImportError as e:
        raise OnnxUnavailable(f"{e.name} is not installed (pip install 'embedcli[onnx]')") from e
    if spec.projector or spec.head != "base" or spec.seq_pooling_type not in ("MEAN", "CLS", "LAST"):
        raise OnnxUnavailable(f"{spec.name}: the ORT contender covers plain MEAN/CLS/LAST embedding models only")
    if not spec.content_hash:
        raise OnnxUnavailable(f"{spec.name}: no content hash to key the export by")
    root = user_cache_dir("onnx")
    # Keyed by the config hash too: the content hash does not cover sentence-transformers' pooling and
    # Normalize files, and the export's `embedcli-onnx.json` records both.
    final = root / f"{spec.content_hash[:16]}-{spec.config_hash()}"
    if (final / "embedcli-onnx.json").is_file():
        return final
    staging = Path(tempfile.mkdtemp(prefix=".export-", dir=root))
    try:
        _export(spec, staging)
        try:
            os.rename(staging, final)  # the whole folder appears at once; a concurrent export that won is kept
        except OSError:
            if not (final / "embedcli-onnx.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final


def _export(spec: Any, folder: Path) -> None:
    import warnings

    import torch
    import transformers
    from transformers import AutoModel, AutoTokenizer

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()

    hf = AutoTokenizer.from_pretrained(spec.path, local_files_only=True)
    # The tokenizer embedcli's loader builds (not necessarily the folder's file): the same ids in both contenders.
    (folder / "tokenizer.json").write_text(hf.backend_tokenizer.to_str(), encoding="utf-8")
    model = AutoModel.from_pretrained(spec.path, dtype=torch.float32, local_files_only=True).eval()
    token_types = spec.model_type in _TOKEN_TYPE_MODELS and getattr(model.config, "type_vocab_size", 0) > 0
    names = ["input_ids", "attention_mask", *(["token_type_ids"] if token_types else [])]

    class Keywords(torch.nn.Module):
        # transformers 5 models take `use_cache` positionally after the mask: pass inputs by keyword.
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
            return self.model(**dict(zip(names, inputs, strict=True))).last_hidden_state

    example = tuple(torch.ones(2, 8, dtype=torch.long) if n != "token_type_ids" else torch.zeros(2, 8, dtype=torch.long) for n in names)
    axes = {n: {0: "batch", 1: "sequence"} for n in names}
    axes["last_hidden_state"] = {0: "batch", 1: "sequence"}
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's notes on data-dependent Python branches (shapes are dynamic axes)
        torch.onnx.export(
            Keywords(), example, str(folder / "model.onnx"), input_names=names, output_names=["last_hidden_state"],
            dynamic_axes=axes, opset_version=ONNX_OPSET, dynamo=False,
        )
    config = OnnxModelConfig(
        pooling=spec.seq_pooling_type, normalize=bool(spec.normalize), max_length=int(spec.max_length),
        lower_case=bool(spec.do_lower_case), token_types=token_types, pad_id=int(hf.pad_token_id or 0),
    )
    (folder / "embedcli-onnx.json").write_text(json.dumps(asdict(config), indent=2), encoding="utf-8")


class OrtEmbedder:
    """An ORT float32 session over an export: texts in, pooled (and normalized, as the model says) vectors out."""

    def __init__(self, folder: Path | str, threads: int | None = None, max_length: int | None = None) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        from embedcli.models.tokenization.tokenizer import lowercase_inside

        folder = Path(folder)
        self.config = OnnxModelConfig(**json.loads((folder / "embedcli-onnx.json").read_text(encoding="utf-8")))
        self.max_length = max_length or self.config.max_length
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        if self.config.lower_case:
            lowercase_inside(self.tokenizer)
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(self.max_length)
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if threads:
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(str(folder / "model.onnx"), options, providers=["CPUExecutionProvider"])

    def embed(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        """Vectors of `texts` in input order; batches of `batch_size` sorted by token length, padded."""
        prepared = [t.strip() for t in texts]
        encodings = self.tokenizer.encode_batch(prepared)
        lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(encodings))
        order = np.argsort(lengths, kind="stable")
        out: np.ndarray | None = None
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            width = int(lengths[idx].max())
            ids = np.full((len(idx), width), self.config.pad_id, dtype=np.int64)
            mask = np.zeros((len(idx), width), dtype=np.int64)
            types = np.zeros((len(idx), width), dtype=np.int64)
            for row, i in enumerate(idx):
                enc = encodings[i]
                ids[row, : lengths[i]] = enc.ids
                mask[row, : lengths[i]] = 1
                types[row, : lengths[i]] = enc.type_ids
            feeds = {"input_ids": ids, "attention_mask": mask}
            if self.config.token_types:
                feeds["token_type_ids"] = types
            hidden = self.session.run(None, feeds)[0]
            pooled = self._pool(hidden, mask)
            if out is None:
                out = np.zeros((len(texts), pooled.shape[1]), dtype=np.float32)
            out[idx] = pooled
        return out if out is not None else np.zeros((0, 0), dtype=np.float32)

    def _pool(self, hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
        if self.config.pooling == "MEAN":
            m = mask[..., None].astype(np.float32)
            pooled = (hidden * m).sum(1) / np.maximum(m.sum(1), 1e-9)
        elif self.config.pooling == "CLS":
            pooled = hidden[:, 0]
        else:  # LAST: right padding, so the last real token sits at length - 1
            pooled = hidden[np.arange(len(hidden)), mask.sum(1) - 1]
        if self.config.normalize:
            pooled = pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        return pooled.astype(np.float32)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m embedcli.bench_onnx EXPORT_DIR IN.jsonl OUT.npy [THREADS]`: embed a JSONL `text` column with ORT."""
    args = list(sys.argv[1:] if argv is None else argv)
    folder, source, target = args[:3]
    threads = int(args[3]) if len(args) > 3 else None
    with open(source, encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f if line.strip()]
    np.save(target, OrtEmbedder(folder, threads).embed(texts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
