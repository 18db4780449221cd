"""`--precision`: embedding quantization with sentence-transformers' `quantize_embeddings` semantics.

- float32: unchanged; float16: a plain cast (not a sentence-transformers precision).
- int8 / uint8 (scalar quantization): per dimension, `ranges` = [min; max]; step = (max - min) / 255 (a step
  of 0 becomes 1); q = clip(floor((x - min) / step), 0, 255); uint8 = q, int8 = q - 128. All in float32,
  as sentence-transformers computes it. The ranges are, in order of preference: `--calibration FILE`, else
  the min/max over the *whole* output, as sentence-transformers computes them over one `encode` call.
  A streamed run cannot know the whole output's min/max before its first row is written, so without
  `--calibration` the float32 vectors are spooled to a temporary Parquet file beside the output and
  quantized in a second pass over that file (no second forward pass; the spool needs rows x dim x 4 bytes
  of disk and is removed afterwards). The ranges used are stored in the output's metadata
  (`embedcli.quantization`) so queries can be quantized the same way (`--calibration OUTPUT`).
- binary / ubinary: bit = (x > 0) (sentence-transformers' rule; vLLM's Cohere API uses x >= 0, so an exact
  0 differs), packed 8 per byte, most significant bit first, per row (`numpy.packbits(axis=-1)`; a dim
  that is not a multiple of 8 is zero-padded to whole bytes); ubinary = the packed byte as uint8,
  binary = packed byte - 128 as int8. Width = ceil(dim / 8).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pyarrow.parquet as pq

from embedcli.errors import UsageError
from embedcli.io.location import refuse_url
from embedcli.io.writers import embedding_array, embedding_matrix

Precision = Literal["float32", "float16", "int8", "uint8", "binary", "ubinary"]
PRECISIONS: tuple[str, ...] = ("float32", "float16", "int8", "uint8", "binary", "ubinary")
METADATA_KEY = "embedcli.quantization"


class CalibrationError(UsageError):
    """A `--calibration` file that cannot give int8/uint8 ranges (a usage error)."""


def output_width(precision: str, dim: int) -> int:
    """Width of a quantized vector: `dim`, or ceil(dim / 8) bytes for the binary precisions."""
    return (dim + 7) // 8 if precision in ("binary", "ubinary") else dim


def output_dtype(precision: str) -> np.dtype[Any]:
    """numpy dtype of a quantized vector."""
    return np.dtype(
        {"float32": np.float32, "float16": np.float16, "int8": np.int8, "uint8": np.uint8,
         "binary": np.int8, "ubinary": np.uint8}[precision]
    )


def ranges_of(embeddings: np.ndarray) -> np.ndarray:
    """Per-dimension `[min; max]` (shape `[2, dim]`, float32) of a `[rows, dim]` array."""
    x = np.asarray(embeddings, dtype=np.float32)
    return np.vstack((x.min(axis=0), x.max(axis=0))).astype(np.float32)


def merge_ranges(a: np.ndarray | None, b: np.ndarray) -> np.ndarray:
    """Ranges covering both `a` (or nothing) and `b`."""
    if a is None:
        return b
    return np.vstack((np.minimum(a[0], b[0]), np.maximum(a[1], b[1])))


def quantize(embeddings: np.ndarray, precision: str, ranges: np.ndarray | None = None) -> np.ndarray:
    """Quantize `[rows, dim]` float vectors; int8/uint8 need `ranges` (`[2, dim]`: min row, max row)."""
    x = np.asarray(embeddings)
    if x.dtype in (np.int8, np.uint8):
        raise ValueError("embeddings to quantize must be float, not int8/uint8")
    if precision == "float32":
        return x.astype(np.float32, copy=False)
    if precision == "float16":
        return x.astype(np.float16)
    if precision in ("int8", "uint8"):
        if ranges is None:
            raise ValueError(f"{precision} quantization needs ranges")
        r = np.asarray(ranges).astype(np.float32, copy=False)
        if r.shape != (2, x.shape[-1]):
            raise ValueError(f"ranges must have shape (2, {x.shape[-1]}), got {r.shape}")
        starts = r[0, :]
        steps = (r[1, :] - starts) / 255
        steps = np.where(steps == 0, 1, steps)
        q = np.clip(np.floor((x.astype(np.float32, copy=False) - starts) / steps), 0, 255)
        return q.astype(np.uint8) if precision == "uint8" else (q - 128).astype(np.int8)
    if precision == "binary":
        return (np.packbits(x > 0, axis=-1) - 128).astype(np.int8)
    if precision == "ubinary":
        return np.packbits(x > 0, axis=-1)
    raise ValueError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")


@dataclass
class Quantizer:
    """A precision and (for int8/uint8) its ranges, applied batch by batch."""

    precision: str = "float32"
    ranges: np.ndarray | None = None
    calibration: str | None = None  # where the ranges came from

    @property
    def needs_ranges(self) -> bool:
        """int8/uint8 without ranges yet: the output must be spooled and calibrated on all of it."""
        return self.precision in ("int8", "uint8") and self.ranges is None

    def __call__(self, vectors: np.ndarray) -> np.ndarray:
        return quantize(vectors, self.precision, self.ranges)

    def empty(self, dim: int) -> np.ndarray:
        """A `[0, width]` array of the output dtype."""
        return np.zeros((0, output_width(self.precision, dim)), dtype=output_dtype(self.precision))

    def table(self, table: Any, column: str = "embedding") -> Any:
        """`table` with its float vector column replaced by the quantized vectors."""

        i = table.schema.get_field_index(column)
        vectors = embedding_matrix(table.column(i))
        out = self(vectors) if len(vectors) else self.empty(vectors.shape[1])
        return table.set_column(i, column, embedding_array(out))

    def config(self) -> dict[str, Any]:
        """What of the quantization decides the numbers (for the output's config hash)."""
        if self.precision not in ("int8", "uint8"):
            return {"precision": self.precision}
        if self.ranges is None:
            return {"precision": self.precision, "ranges": "whole output"}
        digest = hashlib.sha256(np.ascontiguousarray(self.ranges, dtype=np.float32).tobytes()).hexdigest()[:16]
        return {"precision": self.precision, "ranges": digest}

    def metadata(self) -> dict[str, str]:
        """Output key-value metadata: the precision, bit rule and ranges used."""
        if self.precision == "float32":
            return {}
        info: dict[str, Any] = {"precision": self.precision}
        if self.precision in ("binary", "ubinary"):
            info["bit"] = "x > 0, packed MSB first" + ("; byte - 128 as int8" if self.precision == "binary" else "")
        if self.ranges is not None:
            info["ranges"] = np.asarray(self.ranges, dtype=np.float32).tolist()
            info["calibration"] = self.calibration or "output"
        return {METADATA_KEY: json.dumps(info)}


def make_quantizer(precision: str, calibration: str | None = None, dim: int | None = None) -> Quantizer:
    """The quantizer for `--precision` / `--calibration`; ranges from the calibration file when given."""
    if precision not in PRECISIONS:
        raise CalibrationError(f"--precision {precision!r}: choose one of {', '.join(PRECISIONS)}")
    if calibration and precision not in ("int8", "uint8"):
        raise CalibrationError(f"--calibration applies to --precision int8 or uint8, not {precision}")
    quant = Quantizer(precision)
    if calibration:
        quant.ranges = load_calibration(calibration)
        quant.calibration = os.path.basename(calibration)
        if dim is not None and quant.ranges.shape[1] != dim:
            raise CalibrationError(
                f"--calibration {calibration}: vectors have {quant.ranges.shape[1]} dims, the output has {dim}"
            )
    return quant


def load_calibration(path: str) -> np.ndarray:
    """Ranges from a calibration file.

    - an int8/uint8 embedcli output (Parquet metadata or JSONL/npy sidecar): its stored ranges, reused;
    - float vectors: `.npy` `[rows, dim]`, or the `embedding` column of a Parquet/JSONL file: their
      per-dimension min/max (a `[2, dim]` array of [min; max] rows is therefore taken as the ranges as-is).
    """
    refuse_url("--calibration", path, "a local file")
    if not os.path.isfile(path):
        raise CalibrationError(f"--calibration {path}: no such file")
    stored = _stored_ranges(path)
    if stored is not None:
        return stored
    lower = path.lower()
    try:
        if lower.endswith(".npy"):
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
            if arr.ndim != 2 or arr.dtype.kind != "f":
                raise CalibrationError(f"--calibration {path}: expected a 2-D float array, got {arr.dtype} {arr.shape}")
            return _checked(path, ranges_of(arr), len(arr))
        if lower.endswith((".parquet", ".pq")):
            return _parquet_ranges(path)
        if lower.endswith((".jsonl", ".ndjson", ".json")):
            return _jsonl_ranges(path)
    except CalibrationError:
        raise
    except Exception as e:  # a broken file: say which and why
        raise CalibrationError(f"--calibration {path}: cannot read vectors ({e})") from e
    raise CalibrationError(f"--calibration {path}: use a .npy, .parquet or .jsonl file of float vectors")


def _checked(path: str, ranges: np.ndarray, rows: int) -> np.ndarray:
    if rows < 2:
        raise CalibrationError(f"--calibration {path}: at least 2 vectors are needed to compute ranges")
    return ranges


def _stored_ranges(path: str) -> np.ndarray | None:
    meta: dict[str, Any] = {}
    lower = path.lower()
    if lower.endswith((".parquet", ".pq")):

        try:
            raw = pq.read_schema(path).metadata or {}
        except Exception:
            return None
        meta = {k.decode(): v.decode() for k, v in raw.items()}
    else:
        sidecar = path + ".meta.json"  # the JSONL / .npy writers' provenance sidecar
        if os.path.isfile(sidecar):
            try:
                with open(sidecar, encoding="utf-8") as f:
                    data = json.load(f)
            except (OSError, json.JSONDecodeError):
                data = {}
            meta = data.get("metadata", {}) if isinstance(data, dict) else {}
    value = meta.get(METADATA_KEY)
    if not value:
        return None
    info = json.loads(value) if isinstance(value, str) else value
    if "ranges" not in info:
        return None
    return np.asarray(info["ranges"], dtype=np.float32)


def _parquet_ranges(path: str) -> np.ndarray:


    pf = pq.ParquetFile(path)
    if "embedding" not in pf.schema_arrow.names:
        raise CalibrationError(f"--calibration {path}: no 'embedding' column")
    ranges = None
    rows = 0
    for batch in pf.iter_batches(columns=["embedding"], batch_size=8192):
        m = embedding_matrix(batch.column(0))
        if m.dtype.kind != "f":
            raise CalibrationError(f"--calibration {path}: the embedding column is {m.dtype}, not float")
        if len(m):
            ranges = merge_ranges(ranges, ranges_of(m))
            rows += len(m)
    if ranges is None:
        raise CalibrationError(f"--calibration {path}: no vectors")
    return _checked(path, ranges, rows)


def _jsonl_ranges(path: str) -> np.ndarray:
    ranges = None
    rows = 0
    block: list[list[float]] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            vec = json.loads(line).get("embedding")
            if vec is None:
                raise CalibrationError(f"--calibration {path}: a line has no 'embedding'")
            block.append(vec)
            if len(block) >= 8192:
                ranges = merge_ranges(ranges, ranges_of(np.asarray(block, dtype=np.float32)))
                rows += len(block)
                block = []
    if block:
        ranges = merge_ranges(ranges, ranges_of(np.asarray(block, dtype=np.float32)))
        rows += len(block)
    if ranges is None:
        raise CalibrationError(f"--calibration {path}: no vectors")
    return _checked(path, ranges, rows)
