"""`encoding_format: base64`: a vector's raw bytes in `embed_dtype` and `endianness`, base64-encoded.

As vLLM's `encode_pooling_output_base64` (vllm/utils/serial_utils.py) with the defaults the OpenAI client
expects: float32, native byte order — little-endian on every machine embedcli runs on, and written as
little-endian here whatever the host so that outputs are byte-identical across machines. A token task's
`[tokens, dim]` matrix is encoded row-major as one buffer.
"""

from __future__ import annotations

import base64

import numpy as np

_ORDER = {"native": "<", "little": "<", "big": ">"}
_DTYPES = {"float32": "f4", "float16": "f2"}


def wire_dtype(embed_dtype: str = "float32", endianness: str = "native") -> np.dtype:
    """The numpy dtype of the encoded bytes."""
    return np.dtype(_ORDER[endianness] + _DTYPES[embed_dtype])


def encode_base64(values: np.ndarray, embed_dtype: str = "float32", endianness: str = "native") -> str:
    """A vector (or matrix, row-major) as base64 text of its `embed_dtype` bytes."""
    array = np.ascontiguousarray(np.asarray(values, dtype=np.float32).astype(wire_dtype(embed_dtype, endianness)))
    return base64.b64encode(array.tobytes()).decode("ascii")


def decode_base64(text: str, embed_dtype: str = "float32", endianness: str = "native") -> np.ndarray:
    """The vector back from `encode_base64` text, as a flat float32 array."""
    return np.frombuffer(base64.b64decode(text), dtype=wire_dtype(embed_dtype, endianness)).astype(np.float32)
